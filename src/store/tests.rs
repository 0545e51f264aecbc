//! The store's rules against the recording fake kernel: owner lists, pruning, what CHECK
//! compares and what GC removes, with no root and no kernel.

use super::*;
use crate::cni::CniArgs;
use crate::config::Config;
use crate::kernel::fake::Fake;
use crate::plan::{NodeFacts, PodRef};
use std::net::{Ipv4Addr, Ipv6Addr};

const NET: &str = "net1";

fn store() -> Store<Fake> {
    Store::new(Fake::default(), Locking::Unlocked)
}

fn facts() -> NodeFacts {
    NodeFacts {
        proxy_v4: Some(Ipv4Addr::new(10, 0, 0, 1)),
        proxy_v6: Some("fd00::1".parse::<Ipv6Addr>().unwrap()),
    }
}

fn exempt_cfg() -> Config {
    let mut c = Config::default();
    c.metadata.exempt_namespaces = vec!["kube-system".into()];
    c
}

fn shared(cfg: &Config) -> SharedPlan {
    plan::plan_shared(NET, cfg, &facts())
}

fn pod(cfg: &Config, cid: &str, ns: &str, addrs: &[&str]) -> PodPlan {
    let addrs: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
    let args = CniArgs {
        pod_namespace: Some(ns.into()),
        pod_name: Some(cid.into()),
    };
    let r = PodRef {
        network: NET,
        container_id: cid,
        ifname: "eth0",
        namespace: args.pod_namespace.as_deref(),
        pod_name: args.pod_name.as_deref(),
    };
    let cidrs: Vec<(IpAddr, u8)> = addrs
        .iter()
        .map(|a| (*a, if a.is_ipv4() { 24 } else { 64 }))
        .collect();
    plan::plan_pod(cfg, &r, &addrs).with_networks(&cidrs)
}

fn names() -> NetNames {
    NetNames::new(NET)
}

/// The owners the fake kernel records for `ip` in `kind`.
fn owners(s: &mut Store<Fake>, kind: SetKind, ip: &str) -> Vec<OwnerKey> {
    let set = names().set(kind);
    let key = Key::Addr(ip.parse().unwrap());
    s.kernel()
        .elems(&set)
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, c)| plan::owners_from_comment(&c.unwrap_or_default()))
        .unwrap_or_default()
}

fn pods_recorded(s: &mut Store<Fake>) -> Vec<Key> {
    s.kernel()
        .elems(&names().set(SetKind::Pods))
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

const META4: SetKind = SetKind::Meta(Family::V4);
const ALLOW4: SetKind = SetKind::Allow(Family::V4);
const MASQ4: SetKind = SetKind::Masq(Family::V4);

#[test]
fn add_a_add_b_del_a_keeps_b_in_either_order() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    for del_first in [true, false] {
        let mut s = store();
        let a = pod(&cfg, "a", "default", &["10.1.0.5", "fd00:1::5"]);
        let b = pod(&cfg, "b", "default", &["10.1.0.5", "fd00:1::5"]);
        s.apply_pod(&sh, &a).unwrap();
        s.apply_pod(&sh, &b).unwrap();
        assert_eq!(owners(&mut s, META4, "10.1.0.5"), vec![b.owner, a.owner]);
        let (gone, kept) = if del_first { (&a, &b) } else { (&b, &a) };
        let mut addrs = Vec::new();
        s.remove_pod(&names(), gone.owner, &mut addrs).unwrap();
        assert_eq!(owners(&mut s, META4, "10.1.0.5"), vec![kept.owner]);
        assert_eq!(owners(&mut s, MASQ4, "10.1.0.5"), vec![kept.owner]);
        assert_eq!(pods_recorded(&mut s), vec![Key::Owner(kept.owner)]);
        s.check_pod(&names(), kept).unwrap();
        // The addresses DEL flushes come from the record, not from a prevResult.
        assert_eq!(addrs.len(), 2);
        s.remove_pod(&names(), kept.owner, &mut Vec::new()).unwrap();
        assert!(owners(&mut s, META4, "10.1.0.5").is_empty());
        assert!(pods_recorded(&mut s).is_empty());
    }
}

#[test]
fn a_second_add_writes_nothing_and_shared_objects_are_written_once() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let a = pod(&cfg, "a", "default", &["10.1.0.5"]);
    s.apply_pod(&sh, &a).unwrap();
    assert!(matches!(s.kernel().commits[0].ops[0], Op::Converge(_)));
    let commits = s.kernel().commits.len();
    s.apply_pod(&sh, &a).unwrap();
    assert_eq!(
        s.kernel().commits.len(),
        commits,
        "a repeated ADD committed something"
    );
    let b = pod(&cfg, "b", "default", &["10.1.0.6"]);
    s.apply_pod(&sh, &b).unwrap();
    let last = s.kernel().commits.last().unwrap();
    assert!(
        !last.ops.iter().any(|o| matches!(o, Op::Converge(_))),
        "the shared objects were rewritten for a second pod: {last:?}"
    );
    s.check_shared(&sh).unwrap();
}

#[test]
fn readd_with_other_addresses_releases_the_old_ones() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    s.apply_pod(&sh, &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    let again = pod(&cfg, "a", "default", &["10.1.0.9"]);
    s.apply_pod(&sh, &again).unwrap();
    assert!(owners(&mut s, META4, "10.1.0.5").is_empty());
    assert_eq!(owners(&mut s, META4, "10.1.0.9"), vec![again.owner]);
    s.check_pod(&names(), &again).unwrap();
}

#[test]
fn exempt_pods_are_allowed_and_not_intercepted() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let creds = pod(&cfg, "creds", "kube-system", &["10.1.0.7"]);
    s.apply_pod(&sh, &creds).unwrap();
    assert_eq!(owners(&mut s, ALLOW4, "10.1.0.7"), vec![creds.owner]);
    assert!(owners(&mut s, META4, "10.1.0.7").is_empty());
    assert_eq!(owners(&mut s, MASQ4, "10.1.0.7"), vec![creds.owner]);
}

#[test]
fn gc_removes_exactly_the_stale_owners() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let live = pod(&cfg, "live", "default", &["10.1.0.5"]);
    let stale = pod(&cfg, "stale", "default", &["10.1.0.5", "10.1.0.6"]);
    s.apply_pod(&sh, &live).unwrap();
    s.apply_pod(&sh, &stale).unwrap();
    let valid: HashSet<OwnerKey> = [live.owner].into_iter().collect();
    let changed = s.gc(&names(), &valid).unwrap();
    assert!(changed > 0);
    assert_eq!(owners(&mut s, META4, "10.1.0.5"), vec![live.owner]);
    assert!(owners(&mut s, META4, "10.1.0.6").is_empty());
    assert_eq!(pods_recorded(&mut s), vec![Key::Owner(live.owner)]);
    // A second GC has nothing left to do.
    let commits = s.kernel().commits.len();
    assert_eq!(s.gc(&names(), &valid).unwrap(), 0);
    assert_eq!(s.kernel().commits.len(), commits);
}

#[test]
fn check_names_what_differs() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let e = s.check_shared(&sh).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    s.apply_pod(&sh, &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    s.check_shared(&sh).unwrap();

    s.kernel().table = Some(NFT_TABLE_F_DORMANT);
    let e = s.check_shared(&sh).unwrap_err();
    assert!(e.to_string().contains("dormant"), "{e}");
    s.kernel().table = Some(0);

    let mdst = names().set(SetKind::MetaDst(Family::V4));
    s.kernel().sets.get_mut(&mdst).unwrap().elems.clear();
    let e = s.check_shared(&sh).unwrap_err();
    assert_eq!(e.code(), crate::error::code::CHECK_FAILED);
    assert!(e.to_string().contains(&mdst), "{e}");
    // The next ADD restores it.
    s.apply_pod(&sh, &pod(&cfg, "b", "default", &["10.1.0.6"]))
        .unwrap();
    s.check_shared(&sh).unwrap();
}

#[test]
fn a_failed_commit_changes_nothing() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let a = pod(&cfg, "a", "default", &["10.1.0.5"]);
    s.apply_pod(&sh, &a).unwrap();
    let before = s.kernel().sets.clone();
    s.kernel().fail_next_commit = Some(libc::EPERM);
    let e = s
        .apply_pod(&sh, &pod(&cfg, "b", "default", &["10.1.0.6"]))
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::EPERM));
    assert_eq!(s.kernel().sets, before);
}

#[test]
fn delete_all_removes_the_table_once() {
    let cfg = Config::default();
    let mut s = store();
    s.apply_pod(&shared(&cfg), &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    s.delete_all().unwrap();
    assert_eq!(s.kernel().table, None);
    assert!(s.kernel().sets.is_empty());
    s.delete_all().unwrap();
}
