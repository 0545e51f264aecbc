//! The store's rules against the recording fake kernel: owner lists, the strictest-wins rule,
//! pruning, interface counts, what CHECK compares and what GC removes, with no root and no
//! kernel.

use super::check::NFT_TABLE_F_DORMANT;
use super::*;
use crate::config::Config;
use crate::kernel::fake::Fake;
use crate::plan::{Family, HostSide, NodeFacts, PodRef};
use std::net::{Ipv4Addr, Ipv6Addr};

const NET: &str = "net1";
const GONE: &str = "/run/netns/gone";
/// A veth that no longer exists (its pod is leaving).
const GONE_VETH: &str = "veth-gone";

fn store() -> Store<Fake> {
    let mut k = Fake::default();
    k.gone_links.insert(GONE_VETH.to_string());
    Store::new(k, Locking::Unlocked).with_netns_check(|p| p != GONE)
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

fn ifn(s: &str) -> IfName {
    IfName::new(s).unwrap()
}

/// A pod on bridge `cni0` through port `veth-<cid>`.
fn pod(cfg: &Config, cid: &str, ns: &str, addrs: &[&str]) -> PodPlan {
    pod_in(cfg, cid, ns, addrs, "/run/netns/live")
}

fn pod_in(cfg: &Config, cid: &str, ns: &str, addrs: &[&str], netns: &str) -> PodPlan {
    let addrs: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
    let r = PodRef {
        network: NET,
        container_id: cid,
        ifname: "eth0",
        namespace: Some(ns),
        pod_name: Some(cid),
        netns,
        annotations: Default::default(),
        host: Some(HostSide {
            iface: ifn("cni0"),
            port: Some(ifn(&format!("veth-{cid}"))),
            mac: None,
            bridge: None,
        }),
    };
    plan::plan_pod(cfg, &r, &addrs)
}

fn names() -> NetNames {
    NetNames::new(NET)
}

fn addr(s: &str) -> Key {
    Key::Addr(s.parse().unwrap())
}

/// The identity of address `s` behind bridge `cni0`: how the redirected set keys it.
fn on_cni0(s: &str) -> Key {
    Key::IfAddr(ifn("cni0"), s.parse().unwrap())
}

/// The owners the fake kernel records for `key` in `kind`.
fn owners(s: &mut Store<Fake>, kind: SetKind, key: Key) -> Vec<OwnerKey> {
    s.kernel()
        .elems(&names().set(kind))
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, c)| plan::owners_from_comment(&c.unwrap_or_default()))
        .unwrap_or_default()
}

fn keys(s: &mut Store<Fake>, kind: SetKind) -> Vec<Key> {
    s.kernel()
        .elems(&names().set(kind))
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// The pod count of `cni0` in `NET-ifs` (0: no element).
fn cni0_pods(s: &mut Store<Fake>) -> u32 {
    s.kernel()
        .elems(&names().set(SetKind::Ifs))
        .into_iter()
        .find(|(k, _)| *k == Key::Iface(ifn("cni0")))
        .map(|(_, c)| plan::iface_pods(&c.unwrap_or_default()))
        .unwrap_or(0)
}

/// Every per-pod set is empty: the table holds only the network's shared objects.
fn assert_no_pod_state(s: &mut Store<Fake>) {
    for kind in SetKind::ALL.into_iter().filter(|k| k.is_per_pod()) {
        assert!(
            keys(s, kind).is_empty(),
            "{kind:?} still holds {:?}",
            keys(s, kind)
        );
    }
}

const META4: SetKind = SetKind::Redir(Family::V4);
const ALLOW4: SetKind = SetKind::Exempt(Family::V4);
const MASQ4: SetKind = SetKind::Masq(Family::V4);
const XARP: SetKind = SetKind::XArp;

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
        assert_eq!(
            owners(&mut s, META4, on_cni0("10.1.0.5")),
            vec![b.owner, a.owner]
        );
        assert_eq!(cni0_pods(&mut s), 2);
        let (gone, kept) = if del_first { (&a, &b) } else { (&b, &a) };
        let mut addrs = Vec::new();
        s.remove_pod(&names(), gone.owner, &mut addrs).unwrap();
        assert_eq!(owners(&mut s, META4, on_cni0("10.1.0.5")), vec![kept.owner]);
        assert_eq!(owners(&mut s, MASQ4, addr("10.1.0.5")), vec![kept.owner]);
        assert_eq!(keys(&mut s, SetKind::Pods), vec![Key::Owner(kept.owner)]);
        assert_eq!(cni0_pods(&mut s), 1);
        s.check_pod(&names(), kept).unwrap();
        // The addresses DEL flushes come from the record, not from a prevResult.
        assert_eq!(addrs.len(), 2);
        s.remove_pod(&names(), kept.owner, &mut Vec::new()).unwrap();
        assert_no_pod_state(&mut s);
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
    assert_eq!(cni0_pods(&mut s), 1, "a repeated ADD counted the pod twice");
    let b = pod(&cfg, "b", "default", &["10.1.0.6"]);
    s.apply_pod(&sh, &b).unwrap();
    let last = s.kernel().commits.last().unwrap();
    assert!(
        !last.ops.iter().any(|o| matches!(o, Op::Converge(_))),
        "the shared objects were rewritten for a second pod: {last:?}"
    );
    s.check_shared(&sh).unwrap();
}

/// A new pod's elements are added, never replaced: a replace deletes, and a deletion leaves
/// the kernel destroy work that the next release of any netfilter socket waits for while it
/// holds the commit mutex. Elements that exist keep being replaced (here the bridge's pod
/// count and a shared address's owner list), and an element that appeared behind the view's
/// back makes the add fail instead of being overwritten.
#[test]
fn a_new_pods_elements_are_added_and_existing_ones_replaced() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    s.apply_pod(&sh, &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    let b = pod(&cfg, "b", "default", &["10.1.0.6"]);
    s.apply_pod(&sh, &b).unwrap();
    let last = s.kernel().commits.last().unwrap().clone();
    // Everything is added but the bridge's pod count, which exists and changes.
    for o in &last.ops {
        match o {
            Op::Add { .. } => {}
            Op::Put { set, .. } if set.kind == SetKind::Ifs => {}
            o => panic!("a new pod on a converged network should only add: {o:?} in {last:?}"),
        }
    }
    assert!(
        last.ops
            .iter()
            .filter(|o| matches!(o, Op::Add { .. }))
            .count()
            >= 4
    );
    // A second attachment of the same address: the element exists, its owner list changes.
    let c = pod(&cfg, "c", "default", &["10.1.0.6"]);
    s.apply_pod(&sh, &c).unwrap();
    let last = s.kernel().commits.last().unwrap().clone();
    assert!(
        last.ops
            .iter()
            .any(|o| matches!(o, Op::Put { key, .. } if *key == addr("10.1.0.6"))),
        "an existing element's new owner list should replace it: {last:?}"
    );
    assert_eq!(
        owners(&mut s, META4, on_cni0("10.1.0.6")),
        vec![c.owner, b.owner]
    );
    // The fake refuses an add of an element that exists, as the kernel does with NLM_F_EXCL.
    let set = last
        .ops
        .iter()
        .find_map(|o| match o {
            Op::Put { set, .. } => Some(set.clone()),
            _ => None,
        })
        .unwrap();
    let err = s
        .kernel()
        .apply(&Op::Add {
            set,
            key: addr("10.1.0.6"),
            comment: String::new(),
        })
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST));
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
    assert!(owners(&mut s, META4, on_cni0("10.1.0.5")).is_empty());
    assert_eq!(
        owners(&mut s, META4, on_cni0("10.1.0.9")),
        vec![again.owner]
    );
    s.check_pod(&names(), &again).unwrap();
}

#[test]
fn exemption_is_bound_to_the_pods_interface_and_port() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let creds = pod(&cfg, "creds", "kube-system", &["10.1.0.7"]);
    s.apply_pod(&sh, &creds).unwrap();
    let ip: IpAddr = "10.1.0.7".parse().unwrap();
    assert_eq!(keys(&mut s, ALLOW4), vec![Key::IfAddr(ifn("cni0"), ip)]);
    assert_eq!(keys(&mut s, XARP), vec![Key::IfAddr(ifn("cni0"), ip)]);
    assert_eq!(
        keys(&mut s, SetKind::XVeths),
        vec![Key::Iface(ifn("veth-creds"))]
    );
    // Its veth marks what claims its own address, keyed by the veth, not by the bridge.
    assert_eq!(
        keys(&mut s, SetKind::XSrc(Family::V4)),
        vec![Key::IfAddr(ifn("veth-creds"), ip)]
    );
    assert!(keys(&mut s, SetKind::NArp).is_empty());
    assert!(owners(&mut s, META4, on_cni0("10.1.0.7")).is_empty());
    assert_eq!(owners(&mut s, MASQ4, addr("10.1.0.7")), vec![creds.owner]);
    s.remove_pod(&names(), creds.owner, &mut Vec::new())
        .unwrap();
    assert_no_pod_state(&mut s);
}

#[test]
fn strictest_owner_wins_an_address() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let creds = pod(&cfg, "creds", "kube-system", &["10.1.0.7"]);
    let web = pod(&cfg, "web", "default", &["10.1.0.7"]);
    s.apply_pod(&sh, &creds).unwrap();
    s.apply_pod(&sh, &web).unwrap();
    // The address is intercepted for as long as one owner is not exempt: the datapath resets
    // metadata traffic from an intercepted source whatever the allow set says.
    assert_eq!(owners(&mut s, META4, on_cni0("10.1.0.7")), vec![web.owner]);
    s.remove_pod(&names(), web.owner, &mut Vec::new()).unwrap();
    assert!(owners(&mut s, META4, on_cni0("10.1.0.7")).is_empty());
    s.check_pod(&names(), &creds).unwrap();
}

#[test]
fn add_prunes_owners_whose_netns_is_gone() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let dead = pod_in(&cfg, "dead", "kube-system", &["10.1.0.7"], GONE);
    s.apply_pod(&sh, &dead).unwrap();
    let web = pod(&cfg, "web", "default", &["10.1.0.7"]);
    s.apply_pod(&sh, &web).unwrap();
    assert_eq!(keys(&mut s, SetKind::Pods), vec![Key::Owner(web.owner)]);
    assert!(
        keys(&mut s, ALLOW4).is_empty(),
        "the dead pod's exemption survived"
    );
    assert!(keys(&mut s, XARP).is_empty());
    assert!(keys(&mut s, SetKind::XVeths).is_empty());
    assert_eq!(cni0_pods(&mut s), 1);
    s.check_pod(&names(), &web).unwrap();
}

#[test]
fn a_full_owner_list_refuses_the_add_and_drops_no_live_owner() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let pods: Vec<PodPlan> = (0..=plan::MAX_OWNERS)
        .map(|i| pod(&cfg, &format!("p{i}"), "default", &["10.1.0.5"]))
        .collect();
    for p in &pods[..plan::MAX_OWNERS] {
        s.apply_pod(&sh, p).unwrap();
    }
    let before = s.kernel().sets.clone();
    let e = s.apply_pod(&sh, &pods[plan::MAX_OWNERS]).unwrap_err();
    assert_eq!(e.code(), crate::error::code::TRY_AGAIN, "{e}");
    assert!(e.to_string().contains("10.1.0.5"), "{e}");
    assert_eq!(s.kernel().sets, before, "a refused ADD changed the kernel");
    // Deleting the newest leaves the oldest with everything it owns.
    for p in pods[1..plan::MAX_OWNERS].iter().rev() {
        s.remove_pod(&names(), p.owner, &mut Vec::new()).unwrap();
    }
    s.check_pod(&names(), &pods[0]).unwrap();
    assert_eq!(
        owners(&mut s, META4, on_cni0("10.1.0.5")),
        vec![pods[0].owner]
    );
}

#[test]
fn gc_removes_exactly_the_stale_owners_and_recounts_interfaces() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let live = pod(&cfg, "live", "default", &["10.1.0.5"]);
    let stale = pod(&cfg, "stale", "default", &["10.1.0.5", "10.1.0.6"]);
    s.apply_pod(&sh, &live).unwrap();
    s.apply_pod(&sh, &stale).unwrap();
    assert_eq!(cni0_pods(&mut s), 2);
    let valid: HashSet<OwnerKey> = [live.owner].into_iter().collect();
    let changed = s.gc(&names(), &valid).unwrap();
    assert!(changed > 0);
    assert_eq!(owners(&mut s, META4, on_cni0("10.1.0.5")), vec![live.owner]);
    assert!(owners(&mut s, META4, on_cni0("10.1.0.6")).is_empty());
    assert_eq!(keys(&mut s, SetKind::Pods), vec![Key::Owner(live.owner)]);
    assert_eq!(cni0_pods(&mut s), 1);
    // A second GC has nothing left to do; a GC with no valid attachment empties everything.
    let commits = s.kernel().commits.len();
    assert_eq!(s.gc(&names(), &valid).unwrap(), 0);
    assert_eq!(s.kernel().commits.len(), commits);
    s.gc(&names(), &HashSet::new()).unwrap();
    assert_no_pod_state(&mut s);
}

#[test]
fn churn_leaves_only_the_shared_objects() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    for i in 0..300u32 {
        let ns = if i % 4 == 0 { "kube-system" } else { "default" };
        let a = format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256);
        let p = pod(&cfg, &format!("c{i}"), ns, &[&a, &format!("fd00:{i:x}::1")]);
        s.apply_pod(&sh, &p).unwrap();
        if i % 3 != 0 {
            s.remove_pod(&names(), p.owner, &mut Vec::new()).unwrap();
        }
    }
    s.gc(&names(), &HashSet::new()).unwrap();
    assert_no_pod_state(&mut s);
    s.check_shared(&sh).unwrap();
}

#[test]
fn another_networks_objects_are_never_overwritten() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    s.apply_pod(&sh, &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    // Objects with this network's names whose rules say they belong to another network: what a
    // name collision would look like.
    for (_, comments) in s.kernel().chains.values_mut() {
        for c in comments.iter_mut() {
            *c = "natguard other-network 0123456789abcdef".into();
        }
    }
    let before = s.kernel().chains.clone();
    let e = s
        .apply_pod(&sh, &pod(&cfg, "b", "default", &["10.1.0.6"]))
        .unwrap_err();
    assert_eq!(e.code(), crate::error::code::INVALID_CONFIG);
    assert!(
        e.to_string().contains(NET) && e.to_string().contains("other-network"),
        "{e}"
    );
    assert_eq!(s.kernel().chains, before);
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

    s.kernel()
        .tables
        .insert(TableFamily::Inet, NFT_TABLE_F_DORMANT);
    let e = s.check_shared(&sh).unwrap_err();
    assert!(e.to_string().contains("dormant"), "{e}");
    s.kernel().tables.insert(TableFamily::Inet, 0);

    let mdst = names().set(SetKind::MProxy(Family::V4));
    s.kernel().sets.get_mut(&mdst).unwrap().elems.clear();
    let e = s.check_shared(&sh).unwrap_err();
    assert_eq!(e.code(), crate::error::code::CHECK_FAILED);
    assert!(e.to_string().contains(&mdst), "{e}");
    // The next ADD restores it.
    s.apply_pod(&sh, &pod(&cfg, "b", "default", &["10.1.0.6"]))
        .unwrap();
    s.check_shared(&sh).unwrap();

    s.kernel().tables.remove(&TableFamily::Arp);
    let e = s.check_shared(&sh).unwrap_err();
    assert!(
        e.to_string().contains("table arp natguard is missing"),
        "{e}"
    );
    s.apply_pod(&sh, &pod(&cfg, "c", "default", &["10.1.0.7"]))
        .unwrap();
    s.kernel()
        .tables
        .insert(TableFamily::Netdev, NFT_TABLE_F_DORMANT);
    let e = s.check_shared(&sh).unwrap_err();
    assert!(
        e.to_string().contains("table netdev natguard is dormant"),
        "{e}"
    );
}

/// An earlier version's bridge guard (its table, chain and pin sets) is deleted whole by the
/// first converge, in the same batch that writes this version's objects.
#[test]
fn an_earlier_versions_bridge_table_goes_with_the_first_converge() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    s.kernel().tables.insert(TableFamily::Bridge, 0);
    s.kernel().chains.insert(
        "guard".into(),
        (TableFamily::Bridge, vec!["natguard ~node x".into()]),
    );
    s.apply_pod(&sh, &pod(&cfg, "creds", "kube-system", &["10.1.0.6"]))
        .unwrap();
    let first = &s.kernel().commits[0];
    assert_eq!(
        first.ops[0],
        Op::DeleteTable(TableFamily::Bridge),
        "{first:?}"
    );
    assert!(matches!(first.ops[1], Op::Converge(_)));
    assert!(!s.kernel().tables.contains_key(&TableFamily::Bridge));
    // The only chain of that name is this version's ARP guard.
    assert_eq!(s.kernel().chains["guard"].0, TableFamily::Arp);
    s.check_shared(&sh).unwrap();
}

fn veth_chains(s: &mut Store<Fake>) -> Vec<String> {
    s.kernel().chain_names(TableFamily::Netdev).unwrap()
}

fn veth_ops(b: &Batch) -> Vec<&Op> {
    b.ops
        .iter()
        .filter(|o| {
            matches!(
                o,
                Op::VethChain(_) | Op::DeleteChain(TableFamily::Netdev, _)
            )
        })
        .collect()
}

/// An exempt pod's own veth has a chain that marks its frames exactly while the pod lives: the
/// batch that adds its elements creates the chain, its DEL or GC deletes it, a pod that is not
/// exempt never has one, someone else's deletion of a chain is a failed CHECK that the next
/// converge (a repair) puts back, and a pod whose veth is gone gets no chain.
#[test]
fn an_exempt_pods_veth_chain_lives_and_goes_with_the_pod() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let web = pod(&cfg, "web", "default", &["10.1.0.5"]);
    s.apply_pod(&sh, &web).unwrap();
    assert!(veth_chains(&mut s).is_empty());
    let creds = pod(&cfg, "creds", "kube-system", &["10.1.0.6", "fd00:1::6"]);
    s.apply_pod(&sh, &creds).unwrap();
    let last = s.kernel().commits.last().unwrap().clone();
    assert_eq!(
        veth_ops(&last),
        vec![&Op::VethChain(ifn("veth-creds"))],
        "created in the batch that adds the exemption: {last:?}"
    );
    assert!(last
        .ops
        .iter()
        .any(|o| matches!(o, Op::Add { set, .. } if set.kind == SetKind::Exempt(Family::V4))));
    assert_eq!(veth_chains(&mut s), vec!["veth-creds"]);
    s.check_shared(&sh).unwrap();
    s.check_pod(&names(), &creds).unwrap();
    // A second ADD of the same pod writes nothing.
    let n = s.kernel().commits.len();
    s.apply_pod(&sh, &creds).unwrap();
    assert_eq!(
        s.kernel().commits.len(),
        n,
        "{:?}",
        s.kernel().commits.last()
    );

    // Someone deletes the chain: CHECK names it, a repair puts it back.
    s.kernel().chains.remove("veth-creds");
    let e = s.check_pod(&names(), &creds).unwrap_err();
    assert!(e.to_string().contains("veth-creds"), "{e}");
    let e = s.check_shared(&sh).unwrap_err();
    assert!(e.to_string().contains("veth-creds"), "{e}");
    s.apply(&[], &[(&sh, &web), (&sh, &creds)]).unwrap();
    assert_eq!(veth_chains(&mut s), vec!["veth-creds"]);
    s.check_shared(&sh).unwrap();
    // A chain for a veth no exempt pod has is a failed CHECK, and a converge deletes it.
    s.kernel().apply(&Op::VethChain(ifn("veth-stray"))).unwrap();
    let e = s.check_shared(&sh).unwrap_err();
    assert!(e.to_string().contains("veth-stray"), "{e}");
    s.apply(&[], &[(&sh, &web), (&sh, &creds)]).unwrap();
    assert_eq!(veth_chains(&mut s), vec!["veth-creds"]);

    s.remove_pod(&names(), creds.owner, &mut Vec::new())
        .unwrap();
    let last = s.kernel().commits.last().unwrap().clone();
    assert_eq!(
        veth_ops(&last),
        vec![&Op::DeleteChain(TableFamily::Netdev, "veth-creds".into())]
    );
    assert!(veth_chains(&mut s).is_empty());
    s.check_shared(&sh).unwrap();

    // GC takes it too.
    s.apply_pod(&sh, &creds).unwrap();
    let valid: HashSet<OwnerKey> = [web.owner].into_iter().collect();
    s.gc(&names(), &valid).unwrap();
    assert!(veth_chains(&mut s).is_empty());

    // A flushed ruleset restored while one exempt pod's veth is already gone: the others'
    // chains come back, its chain is not asked for, and CHECK holds it no fault.
    let gone = pod(&cfg, "gone", "kube-system", &["10.1.0.9"]);
    s.apply_pod(&sh, &creds).unwrap();
    let links = std::mem::take(&mut s.kernel().gone_links);
    *s.kernel() = Fake {
        gone_links: links,
        ..Fake::default()
    };
    s.apply(&[], &[(&sh, &creds), (&sh, &gone)]).unwrap();
    assert_eq!(veth_chains(&mut s), vec!["veth-creds"]);
    s.check_shared(&sh).unwrap();
    // A kernel that keeps a netdev chain without its device: the next converge deletes it.
    s.kernel().apply(&Op::VethChain(ifn(GONE_VETH))).unwrap();
    s.kernel().tables.remove(&TableFamily::Arp);
    s.kernel().links_asked.clear();
    s.apply(&[], &[(&sh, &creds), (&sh, &gone)]).unwrap();
    assert_eq!(veth_chains(&mut s), vec!["veth-creds"]);
    // One question to the kernel per veth: the converge asked about each once.
    let mut asked = s.kernel().links_asked.clone();
    asked.sort();
    assert_eq!(asked, vec!["veth-creds", GONE_VETH]);
    s.check_shared(&sh).unwrap();
}

/// An exempt pod on a bridge whose MAC is known has it pinned to its port (a static, sticky
/// forwarding entry) before its exemption is committed, and unpinned by its DEL; a pod that
/// is not exempt pins nothing, and CHECK fails while an exempt pod's pin is missing.
#[test]
fn an_exempt_pods_mac_is_pinned_to_its_port_while_it_lives() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let mac = [2, 0, 0, 0, 0, 7];
    let with_mac = |mut p: PodPlan| {
        let mut h = p.host.unwrap();
        h.mac = Some(mac);
        p.host = Some(h);
        p
    };
    let web = with_mac(pod(&cfg, "web", "default", &["10.1.0.5"]));
    s.apply_pod(&sh, &web).unwrap();
    assert!(s.kernel().pinned.is_empty());
    let creds = with_mac(pod(&cfg, "creds", "kube-system", &["10.1.0.6"]));
    let creds = plan::plan_pod(
        &cfg,
        &PodRef {
            network: NET,
            container_id: "creds",
            ifname: "eth0",
            namespace: Some("kube-system"),
            pod_name: Some("creds"),
            netns: "/run/netns/live",
            annotations: Default::default(),
            host: creds.host,
        },
        &creds.addrs,
    );
    s.apply_pod(&sh, &creds).unwrap();
    let pin = (ifn("veth-creds"), mac);
    assert!(s.kernel().pinned.contains(&pin));
    s.check_pod(&names(), &creds).unwrap();
    s.kernel().pinned.clear();
    let e = s.check_pod(&names(), &creds).unwrap_err();
    assert!(e.to_string().contains("not pinned"), "{e}");
    s.apply_pod(&sh, &creds).unwrap();
    assert!(s.kernel().pinned.contains(&pin));
    s.remove_pod(&names(), creds.owner, &mut Vec::new())
        .unwrap();
    assert!(s.kernel().pinned.is_empty());
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
fn delete_all_removes_both_tables_once() {
    let cfg = Config::default();
    let mut s = store();
    s.apply_pod(&shared(&cfg), &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    s.delete_all().unwrap();
    assert!(s.kernel().tables.is_empty());
    assert!(s.kernel().sets.is_empty());
    s.delete_all().unwrap();
}

#[test]
fn an_upgrade_deletes_the_sets_earlier_versions_left() {
    let cfg = Config::default();
    let mut s = store();
    s.kernel().tables.insert(TableFamily::Inet, 0);
    let gone = [
        "net1-nets4",
        "net1-allow4",
        // The metadata addresses and ports as two sets, per network and node-wide.
        "net1-mdst4",
        "net1-mdst6",
        "net1-mports",
        "metadata4",
        "metadata6",
        "metaports",
    ];
    for legacy in gone.iter().copied().chain(["other-nets4"]) {
        s.kernel().sets.insert(
            legacy.into(),
            crate::kernel::fake::FakeSet {
                kind: Some(SetKind::Redir(Family::V4)),
                ..Default::default()
            },
        );
    }
    s.apply_pod(&shared(&cfg), &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    let names: Vec<String> = s.kernel().sets.keys().cloned().collect();
    assert!(
        !names.iter().any(|n| gone.contains(&n.as_str())),
        "{names:?}"
    );
    // Each node-wide one is deleted once in the batch.
    let deletes = s
        .kernel()
        .commits
        .last()
        .unwrap()
        .ops
        .iter()
        .filter(|o| matches!(o, Op::DeleteSet(_, n) if n == "metadata4"));
    assert_eq!(deletes.count(), 1);
    assert!(
        names.iter().any(|n| *n == "other-nets4"),
        "another network's set is not ours"
    );
    // A converge with nothing left over deletes nothing.
    s.kernel().tables.insert(TableFamily::Inet, 1);
    s.apply_pod(&shared(&cfg), &pod(&cfg, "b", "default", &["10.1.0.6"]))
        .unwrap();
    let last = s.kernel().commits.last().unwrap();
    assert!(!last.ops.iter().any(|o| matches!(o, Op::DeleteSet(..))));
}

#[test]
fn a_repair_restores_every_pod_in_one_batch_and_then_writes_nothing() {
    let cfg = exempt_cfg();
    let sh = shared(&cfg);
    let mut s = store();
    let a = pod(&cfg, "a", "default", &["10.1.0.5", "fd00:1::5"]);
    let b = pod(&cfg, "b", "kube-system", &["10.1.0.6"]);
    s.apply_pod(&sh, &a).unwrap();
    s.apply_pod(&sh, &b).unwrap();
    // Someone flushes the ruleset.
    *s.kernel() = Fake::default();
    let n = s.apply(&[], &[(&sh, &a), (&sh, &b)]).unwrap();
    assert!(n > 0);
    let commits = &s.kernel().commits;
    assert_eq!(commits.len(), 1, "one batch: {commits:?}");
    assert!(matches!(commits[0].ops[0], Op::Converge(_)));
    s.check_shared(&sh).unwrap();
    s.check_pod(&names(), &a).unwrap();
    s.check_pod(&names(), &b).unwrap();
    // Everything in place: a check that writes nothing.
    assert_eq!(s.apply(&[], &[(&sh, &a), (&sh, &b)]).unwrap(), 0);
    assert_eq!(s.kernel().commits.len(), 1);
}

#[test]
fn the_guard_alone_is_put_in_place_and_then_a_network_converges_over_it() {
    let cfg = exempt_cfg();
    let guard = crate::plan::plan_node_guard(&cfg, &NodeFacts::default());
    assert!(guard.is_node_only());
    let mut s = store();
    // A node with no pod and no natguard network: the guard alone, in one batch.
    assert!(s.apply(&[&guard], &[]).unwrap() > 0);
    s.check_shared(&guard).unwrap();
    for chain in [
        "guard_fwd",
        "guard_in",
        "guard_out",
        "judge4",
        "judge6",
        "guard",
    ] {
        assert!(s.kernel().chains.contains_key(chain), "{chain} missing");
    }
    assert!(
        !s.kernel().chains.keys().any(|c| c.contains('-')),
        "no network's chain: {:?}",
        s.kernel().chains.keys()
    );
    assert!(!s.kernel().sets.keys().any(|c| c.contains('-')));
    let dests: Vec<Key> = s
        .kernel()
        .elems("guarded4")
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(
        dests,
        vec![Key::AddrPort("169.254.169.254".parse().unwrap(), 80)]
    );
    // Intact: nothing written.
    assert_eq!(s.apply(&[&guard], &[]).unwrap(), 0);
    assert_eq!(s.kernel().commits.len(), 1);
    // The network's first converge takes the guard over.
    let sh = shared(&cfg);
    let a = pod(&cfg, "a", "default", &["10.1.0.5"]);
    assert!(s.apply(&[&sh], &[(&sh, &a)]).unwrap() > 0);
    s.check_shared(&sh).unwrap();
    s.check_pod(&names(), &a).unwrap();
    s.check_shared(&guard).unwrap();
}

/// With a verified record, the second ADD of an unchanged network is not converged again, while
/// a change that only alters a shared set's declared elements
/// (`allowInterfaces`), and another writer's commit, are compared and converged again.
#[test]
fn a_verified_network_is_trusted_only_while_its_whole_plan_and_the_generation_hold() {
    let dir = std::env::temp_dir().join(format!("ng-store-verified-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = store().with_verified_in(&dir);
    let cfg = Config::default();
    let sh = shared(&cfg);
    assert_eq!(
        s.apply_pod(&sh, &pod(&cfg, "a", "default", &["10.1.0.2"]))
            .unwrap(),
        Converged::Yes
    );
    assert_eq!(
        s.apply_pod(&sh, &pod(&cfg, "b", "default", &["10.1.0.3"]))
            .unwrap(),
        Converged::No
    );
    let mut allowing = Config::default();
    allowing.metadata.allow_interfaces = vec![ifn("dock0")];
    let sh2 = shared(&allowing);
    // allowInterfaces is in the network's own record (`NET-allowifs`) and the node-wide union:
    // both the fingerprint and the whole plan's digest follow it.
    assert_ne!(sh2.fingerprint, sh.fingerprint);
    assert_ne!(verified_entry(&sh2), verified_entry(&sh));
    assert_eq!(
        s.apply_pod(&sh2, &pod(&allowing, "c", "default", &["10.1.0.4"]))
            .unwrap(),
        Converged::Yes,
        "a changed allowInterfaces must be converged, not trusted from the record"
    );
    // Another writer's commit: the generation moves on, and the emptied chain is noticed.
    let chain = s.kernel().chains.keys().next().unwrap().clone();
    s.kernel().chains.get_mut(&chain).unwrap().1.clear();
    s.kernel().generation += 1;
    assert_eq!(
        s.apply_pod(&sh2, &pod(&allowing, "d", "default", &["10.1.0.5"]))
            .unwrap(),
        Converged::Yes
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two networks whose names give the same conntrack label bit could not be told apart by their
/// masquerade rules: the second one's converge is refused (code 7, naming both), while a
/// network with another bit, or one that masquerades nothing, converges.
#[test]
fn networks_that_share_a_label_bit_are_refused() {
    let cfg = Config::default();
    let bit = |n: &str| plan::NetNames::new(n).label_bit();
    let twin = (0..10_000)
        .map(|i| format!("net{i}"))
        .find(|n| bit(n) == bit("first"))
        .expect("a name with the same bit");
    let other = (0..10_000)
        .map(|i| format!("net{i}"))
        .find(|n| bit(n) != bit("first"))
        .unwrap();
    let mut s = store();
    let first = plan::plan_shared("first", &cfg, &facts());
    s.apply(&[&first], &[]).unwrap();
    let second = plan::plan_shared(&twin, &cfg, &facts());
    let e = s.apply(&[&second], &[]).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, Error::InvalidConfig(_)) && text.contains("first") && text.contains(&twin),
        "{text}"
    );
    s.apply(&[&plan::plan_shared(&other, &cfg, &facts())], &[])
        .unwrap();
    let mut plain = cfg.clone();
    plain.masquerade.enabled = false;
    s.apply(&[&plan::plan_shared(&twin, &plain, &facts())], &[])
        .unwrap();
}

/// The node-wide `allowedifs` is the union of every network's `allowInterfaces`: another
/// network's converge keeps what this one allows (each network records its own part in
/// `NET-allowifs`, from which the union is derived).
#[test]
fn another_networks_converge_keeps_this_networks_allowed_interfaces() {
    let mut allowing = Config::default();
    allowing.metadata.allow_interfaces = vec![ifn("dock0")];
    let mut s = store();
    let a = plan::plan_shared("alpha", &allowing, &facts());
    s.apply(&[&a], &[]).unwrap();
    let b = plan::plan_shared("beta", &Config::default(), &facts());
    s.apply(&[&b], &[]).unwrap();
    let allowed: Vec<Key> = s
        .kernel()
        .elems("allowedifs")
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(
        allowed,
        vec![Key::Iface(ifn("dock0"))],
        "after beta's converge"
    );
    let own: Vec<Key> = s
        .kernel()
        .elems("alpha-allowifs")
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(own, vec![Key::Iface(ifn("dock0"))], "alpha's own record");
}

/// What DEL removes of a pod (`plan::owned_keys`) covers every set the catalogue says pods
/// own, and every element any policy's ADD would own or give up: a new owned set missed there
/// would leak at DEL.
#[test]
fn del_finds_an_element_in_every_owned_set() {
    let host = HostSide {
        iface: ifn("cni0"),
        port: Some(ifn("veth-x")),
        mac: Some([2, 0, 0, 0, 0, 1]),
        bridge: None,
    };
    let addrs: Vec<IpAddr> = vec!["10.1.0.5".parse().unwrap(), "fd00:1::5".parse().unwrap()];
    let keys = plan::owned_keys(&addrs, Some(host));
    for kind in SetKind::ALL.into_iter().filter(|k| k.is_owned()) {
        assert!(
            keys.iter().any(|(k, _)| *k == kind),
            "DEL would leave set {} behind",
            kind.suffix()
        );
    }
    for (kind, _) in &keys {
        assert!(kind.is_owned(), "{} is not an owned set", kind.suffix());
    }
    // Whatever the policy, an ADD's elements (wanted or given up) are exactly what DEL finds.
    let mut cfgs = vec![Config::default(), exempt_cfg()];
    let mut c = Config::default();
    c.metadata.mode = crate::config::MetadataMode::Off;
    cfgs.push(c);
    let mut c = Config::default();
    c.metadata.mode = crate::config::MetadataMode::Deny;
    cfgs.push(c);
    let mut c = Config::default();
    c.masquerade.enabled = false;
    c.metadata.log_denied = true;
    cfgs.push(c);
    let mut c = exempt_cfg();
    c.metadata.log_denied = true;
    cfgs.push(c);
    let want: HashSet<(SetKind, Key)> = keys.iter().copied().collect();
    for (i, cfg) in cfgs.iter().enumerate() {
        for ns in ["default", "kube-system"] {
            let r = PodRef {
                network: NET,
                container_id: "x",
                ifname: "eth0",
                namespace: Some(ns),
                pod_name: Some("x"),
                netns: "/run/netns/live",
                annotations: Default::default(),
                host: Some(host),
            };
            let p = plan::plan_pod(cfg, &r, &addrs);
            let got: HashSet<(SetKind, Key)> = p.present.iter().chain(&p.absent).copied().collect();
            assert_eq!(got, want, "config {i}, namespace {ns}");
            assert!(
                p.present.iter().all(|e| !p.absent.contains(e)),
                "config {i}, namespace {ns}: an element both wanted and given up"
            );
        }
    }
}

/// An ADD keeps only the flows of another masquerading network whose live attachment holds
/// the address: the holders are that network's label bit when one of its pods with the address
/// has a network namespace that exists, and nothing for a pod whose sandbox is gone, an
/// address nobody else holds, the asking network itself, or a network that labels nothing.
#[test]
fn label_holders_are_the_other_labelling_networks_with_a_live_pod_of_the_address() {
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    for masquerades in [true, false] {
        let mut cfg = Config::default();
        cfg.masquerade.enabled = masquerades;
        let mut s = store();
        s.apply_pod(
            &shared(&cfg),
            &pod(&cfg, "a", "default", &["10.1.0.5", "fd00::5"]),
        )
        .unwrap();
        s.apply_pod(
            &shared(&cfg),
            &pod_in(&cfg, "g", "default", &["10.1.0.6"], GONE),
        )
        .unwrap();
        let other = NetNames::new("other");
        let want = |v: &[u8]| if masquerades { v.to_vec() } else { Vec::new() };
        let bit = names().label_bit();
        assert_eq!(
            s.label_holders(&other, &[ip("10.1.0.5")]).unwrap(),
            want(&[bit])
        );
        assert_eq!(
            s.label_holders(&other, &[ip("10.1.0.9"), ip("fd00::5")])
                .unwrap(),
            want(&[bit])
        );
        assert_eq!(
            s.label_holders(&other, &[ip("10.1.0.6")]).unwrap(),
            Vec::<u8>::new(),
            "a pod whose sandbox is gone keeps nothing"
        );
        assert_eq!(
            s.label_holders(&other, &[ip("10.1.0.7")]).unwrap(),
            Vec::<u8>::new()
        );
        assert_eq!(
            s.label_holders(&names(), &[ip("10.1.0.5")]).unwrap(),
            Vec::<u8>::new(),
            "the asking network is not another"
        );
    }
}

/// A downgrade and an upgrade again: the earlier release's converge brought its address-keyed
/// sets back, and its DEL of a pod of this release could not reach the set it does not know,
/// which still holds that pod's element. The next converge deletes the stale set before it
/// creates it again: it holds the live pods' elements, and the gone pod's no more.
#[test]
fn a_renamed_set_found_beside_its_earlier_name_is_emptied_and_its_live_pods_restored() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    let live = pod(&cfg, "live", "default", &["10.1.0.5"]);
    s.apply_pod(&sh, &live).unwrap();
    let redir = names().set(META4);
    let earlier = format!("{}meta4", names().prefix_of_sets());
    let stale = on_cni0("10.1.0.9");
    {
        let k = s.kernel();
        let set = crate::kernel::fake::FakeSet {
            kind: Some(MASQ4),
            ..Default::default()
        };
        k.sets.insert(earlier.clone(), set);
        k.sets
            .get_mut(&redir)
            .unwrap()
            .elems
            .insert(stale, Some("0123456789abcdef".into()));
        // The earlier release's rules, not this one's.
        for (_, rules) in k.chains.values_mut() {
            rules.clear();
        }
    }
    assert!(s.apply(&[&sh], &[(&sh, &live)]).unwrap() > 0);
    let k = s.kernel();
    let batch = k.commits.last().unwrap();
    let del = batch
        .ops
        .iter()
        .position(|o| *o == Op::DeleteSet(TableFamily::Inet, redir.clone()));
    let converge = batch.ops.iter().position(|o| matches!(o, Op::Converge(_)));
    assert!(
        del.is_some() && del < converge,
        "the stale set is deleted before the converge creates it: {batch:?}"
    );
    assert!(!k.sets.contains_key(&earlier), "the earlier set is gone");
    assert_eq!(
        keys(&mut s, META4),
        vec![on_cni0("10.1.0.5")],
        "only the live pod's element"
    );
    s.check_pod(&names(), &live).unwrap();
    // With nothing stale, a converge deletes nothing of this release's.
    s.kernel().commits.clear();
    for (_, rules) in s.kernel().chains.values_mut() {
        rules.clear();
    }
    s.apply(&[&sh], &[(&sh, &live)]).unwrap();
    let batch = s.kernel().commits.last().unwrap().clone();
    assert!(
        !batch.ops.iter().any(|o| matches!(o, Op::DeleteSet(..))),
        "{batch:?}"
    );
    assert_eq!(keys(&mut s, META4), vec![on_cni0("10.1.0.5")]);
}

#[test]
fn the_proxys_view_is_read_again_only_after_a_commit() {
    let cfg = Config::default();
    let sh = shared(&cfg);
    let mut s = store();
    s.apply_pod(&sh, &pod(&cfg, "a", "default", &["10.1.0.5"]))
        .unwrap();
    let pods =
        |v: &[crate::store::ProxiedNetwork]| -> usize { v.iter().map(|n| n.pods.len()).sum() };
    let (seen, view) = s.proxy_view_since(None).unwrap();
    assert!(seen.is_some());
    assert_eq!(pods(&view.expect("a first read reads")), 1);
    let (again, view) = s.proxy_view_since(seen).unwrap();
    assert_eq!(
        (again, view),
        (seen, None),
        "nothing committed: nothing read"
    );
    s.apply_pod(&sh, &pod(&cfg, "b", "default", &["10.1.0.6"]))
        .unwrap();
    let (after, view) = s.proxy_view_since(seen).unwrap();
    assert_ne!(after, seen);
    assert_eq!(pods(&view.expect("a commit since: read again")), 2);
}
