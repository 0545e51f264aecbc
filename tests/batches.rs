//! Root tests of large nf_tables batches and of the netlink exchange itself: what the kernel
//! answers, how long natguard waits for it, and what it does when replies are missing.
//!
//! Each test runs in network namespaces of its own (`common::Harness`). Large states (thousands
//! of pods, thousands of interval elements) are set up in-process with the library, on a thread
//! that joined the test's namespace; the verbs under test run as the real binary
//! (`common::run`), with a CNI environment and a synthetic dual-stack prevResult
//! (`common::synthetic`), the way a runtime runs them. Every invocation has a bound (a bound for
//! failure reports, not a speed assertion): a verb that never returns fails the test instead of
//! hanging it. Needs root; never skips.

mod common;

use common::run::Invocation;
use common::synthetic::{
    add, fixed_proxy_cfg, gc_invocation, gc_without_list, synthetic_node, SynPod,
};
use common::*;
use natguard::config::{MAX_METADATA_PORTS, MAX_NON_MASQUERADE_CIDRS};
use natguard::kernel::netlink::{BatchError, MsgBuf, NfSocket, NFNL_SUBSYS_CTNETLINK};
use natguard::kernel::{lower as encode, nft};
use natguard::plan::{Family, Key, NetNames, OwnerKey, SetKind, TableFamily};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The network of every test here.
const NET: &str = "bnet";

/// Pod `i` of the test `tag`: every fifth one in the exempt namespace, so the allow sets are
/// used too; one /10 and one /64 pod network for all of them.
fn pod(tag: &str, i: u32) -> SynPod {
    let v4 = IpAddr::V4(Ipv4Addr::new(
        10,
        64 + (i >> 16) as u8,
        (i >> 8) as u8,
        i as u8,
    ));
    let v6 = IpAddr::V6(Ipv6Addr::new(
        0xfd00,
        7,
        0,
        0,
        0,
        0,
        (i >> 16) as u16,
        i as u16,
    ));
    let cid = format!("{tag}{i:05}");
    let k8s_ns = if i.is_multiple_of(5) {
        "kube-system"
    } else {
        "default"
    };
    SynPod::new(NET, &cid, v4, v6)
        .in_namespace(k8s_ns)
        .named(&format!("p-{cid}"))
        .prefixes(10, 64)
        .without_host_iface()
}

/// natguard's entry with fixed proxy addresses (no route lookups), `patch` merged in.
fn cfg(patch: Value) -> Value {
    let mut c = fixed_proxy_cfg(json!({ "metadata": { "exemptNamespaces": ["kube-system"] } }));
    merge(&mut c, &patch);
    c
}

fn gc(ns: &Netns, cfg: &Value, keep: &[&SynPod]) -> Invocation {
    gc_invocation(NET, cfg, keep).run_in(ns)
}

fn set(kind: SetKind) -> String {
    NetNames::new(NET).set(kind)
}

/// Every key of set `kind` in `ns`, read with the library.
fn elements(ns: &Netns, kind: SetKind) -> Vec<Key> {
    let name = set(kind);
    in_netns(ns, move || {
        let mut sock = NfSocket::open().expect("open netfilter socket");
        nft::dump_set(&mut sock, kind.table(), &name)
            .expect("dump set")
            .iter()
            .filter_map(|e| encode::key_of(kind, &e.key))
            .collect()
    })
}

/// The addresses a set's keys hold (`iifname . addr` keys count by their address).
fn addrs_of(ns: &Netns, kind: SetKind) -> BTreeSet<IpAddr> {
    elements(ns, kind)
        .iter()
        .filter_map(|k| match k {
            Key::Addr(a) | Key::IfAddr(_, a) => Some(*a),
            _ => None,
        })
        .collect()
}

/// ADDs `pods`, 16 invocations at a time.
fn add_all(ns: &Netns, cfg: &Value, pods: Vec<SynPod>) {
    for chunk in pods.chunks(16) {
        std::thread::scope(|sc| {
            for p in chunk {
                sc.spawn(move || add(ns, cfg, p).succeeded());
            }
        });
    }
}

/// A GC of many stale dual-stack attachments is one batch of thousands of messages, which asks
/// for one ACK (an ACK per message would overflow the receive buffer from about 60
/// attachments) and grows the send buffer to the batch (else EMSGSIZE). It must return, and
/// leave exactly the pods it was told to keep.
fn gc_of_stale_attachments(test: &str, stale: u32) {
    let h = Harness::new(test);
    let ns = h.netns("node");
    let c = cfg(json!({}));
    let pods: Vec<SynPod> = (0..stale + 2).map(|i| pod("gc", i)).collect();
    add_all(&ns, &c, pods.clone());
    assert_eq!(elements(&ns, SetKind::Pods).len(), pods.len());

    let keep = [&pods[1], &pods[2]];
    gc(&ns, &c, &keep).succeeded();

    let owners: BTreeSet<OwnerKey> = elements(&ns, SetKind::Pods)
        .iter()
        .filter_map(|k| match k {
            Key::Owner(o) => Some(*o),
            _ => None,
        })
        .collect();
    let want: BTreeSet<OwnerKey> = keep.iter().map(|p| p.owner_key()).collect();
    assert_eq!(owners, want, "pods left after GC");
    let kept_addrs = |f: &dyn Fn(&SynPod) -> bool, fam: Family| -> BTreeSet<IpAddr> {
        keep.iter()
            .filter(|p| f(p))
            .map(|p| if fam == Family::V4 { p.v4 } else { p.v6 })
            .collect()
    };
    for fam in Family::ALL {
        assert_eq!(
            addrs_of(&ns, SetKind::Masq(fam)),
            kept_addrs(&|_| true, fam),
            "masq {fam:?}"
        );
        assert_eq!(
            addrs_of(&ns, SetKind::Exempt(fam)),
            kept_addrs(&|p| p.exempt(), fam),
            "allow {fam:?}"
        );
    }
    // And a second GC with nothing stale is a no-op that succeeds.
    gc(&ns, &c, &keep).succeeded();
}

/// A GC names every valid attachment of the node: with 20,000 of them (64-hex container IDs,
/// nearly 2 MiB of stdin, over the 1 MiB cap natguard once had) it succeeds, keeps the valid pods and
/// removes the stale one.
#[test]
fn gc_with_20000_valid_attachments_succeeds() {
    let h = Harness::new("batch-gcvalid");
    let ns = h.netns("node");
    let c = cfg(json!({}));
    let pods: Vec<SynPod> = (0..3).map(|i| pod("gv", i)).collect();
    add_all(&ns, &c, pods.clone());
    let mut valid: Vec<Value> = (0..20_000u32)
        .map(|i| json!({ "containerID": format!("{i:064x}"), "ifname": "eth0" }))
        .collect();
    valid.extend(
        pods[1..]
            .iter()
            .map(|p| json!({ "containerID": p.cid, "ifname": p.ifname })),
    );
    let mut conf = c.clone();
    conf["cni.dev/valid-attachments"] = Value::Array(valid);
    let stdin_len = serde_json::to_vec(&conf).unwrap().len();
    assert!(stdin_len > 1 << 20, "{stdin_len} bytes");
    gc_without_list(NET, &conf).run_in(&ns).succeeded();
    let owners: BTreeSet<OwnerKey> = elements(&ns, SetKind::Pods)
        .iter()
        .filter_map(|k| match k {
            Key::Owner(o) => Some(*o),
            _ => None,
        })
        .collect();
    let want: BTreeSet<OwnerKey> = pods[1..].iter().map(|p| p.owner_key()).collect();
    assert_eq!(owners, want, "pods left after GC");
}

#[test]
fn gc_of_300_stale_dual_stack_attachments_returns_and_leaves_none() {
    gc_of_stale_attachments("batch-gc300", 300);
}

#[test]
fn gc_of_5000_stale_dual_stack_attachments_returns_and_leaves_none() {
    gc_of_stale_attachments("batch-gc5000", 5000);
}

/// `count` non-adjacent IPv4 /25 prefixes, as config strings and as ranges.
fn cidrs(count: usize) -> (Vec<String>, Vec<(u128, u128)>) {
    let mut text = Vec::new();
    let mut ranges = Vec::new();
    for i in 0..count {
        let (b, c) = (16 + i / 256, i % 256);
        text.push(format!("172.{b}.{c}.0/25"));
        let start = u32::from(Ipv4Addr::new(172, b as u8, c as u8, 0)) as u128;
        ranges.push((start, start + 127));
    }
    (text, ranges)
}

/// Long config lists are installed whole up to their documented limit and refused with code 7
/// above it, never with a kernel error (code 100) for their size.
#[test]
fn long_config_lists_work_up_to_the_limit_and_are_refused_above_it() {
    let h = Harness::new("batch-lists");
    let ns = h.netns("node");
    let nomasq4 = set(SetKind::NoMasq(Family::V4));
    let ranges_in = |ns: &Netns| {
        let name = nomasq4.clone();
        in_netns(ns, move || {
            let mut sock = NfSocket::open().expect("open netfilter socket");
            nft::ranges_of(&nft::dump_set(&mut sock, TableFamily::Inet, &name).expect("dump"))
        })
    };
    for (i, count) in [1700, MAX_NON_MASQUERADE_CIDRS].into_iter().enumerate() {
        let (text, ranges) = cidrs(count);
        let c = cfg(json!({ "masquerade": { "nonMasqueradeCIDRs": text, "masqLinkLocal": true } }));
        add(&ns, &c, &pod("cidr", i as u32 + 1)).succeeded();
        let have = ranges_in(&ns);
        assert_eq!(have, ranges, "{count} nonMasqueradeCIDRs in the kernel");
    }
    let (text, _) = cidrs(MAX_NON_MASQUERADE_CIDRS + 1);
    let c = cfg(json!({ "masquerade": { "nonMasqueradeCIDRs": text } }));
    add(&ns, &c, &pod("cidr", 9)).fails_with(
        7,
        &[
            "masquerade.nonMasqueradeCIDRs",
            &MAX_NON_MASQUERADE_CIDRS.to_string(),
        ],
    );

    let ports: Vec<u16> = (1..=MAX_METADATA_PORTS as u16).collect();
    let c = cfg(json!({ "metadata": { "ports": ports } }));
    add(&ns, &c, &pod("port", 1)).succeeded();
    // Each port is one pair with each address: 1024 of the IPv4 metadata address's.
    let have: BTreeSet<u16> = elements(&ns, SetKind::MProxy(Family::V4))
        .iter()
        .filter_map(|k| match k {
            Key::AddrPort(_, p) => Some(*p),
            _ => None,
        })
        .collect();
    assert_eq!(have, ports.iter().copied().collect(), "ports in the kernel");
    let many: Vec<u32> = (1..=5000).collect();
    let c = cfg(json!({ "metadata": { "ports": many } }));
    add(&ns, &c, &pod("port", 2))
        .fails_with(7, &["metadata.ports", &MAX_METADATA_PORTS.to_string()]);
}

/// What nfnetlink answers, as `netlink`'s module documentation states it: a batch message
/// without NLM_F_ACK gets a reply only if it fails; any failure aborts the whole batch; the
/// ACK of the last message ends a successful one.
#[test]
fn nfnetlink_reports_errors_without_ack_and_aborts_the_whole_batch() {
    let h = Harness::new("batch-acks");
    let ns = h.netns("node");
    in_netns(&ns, || {
        let mut sock = NfSocket::open().unwrap();
        // A batch whose middle message fails: reported without asking, nothing applied.
        let mut b = sock.msgbuf();
        encode::begin_batch(&mut b);
        encode::new_table(&mut b, TableFamily::Inet, Some(0));
        let bad = encode::flush_set(&mut b, TableFamily::Inet, "no-such-set");
        encode::new_set(
            &mut b,
            TableFamily::Inet,
            "bnet-pods",
            SetKind::Pods,
            1,
            false,
        );
        b.ack_last();
        encode::end_batch(&mut b);
        assert_eq!(b.acked_seqs().count(), 1);
        let what = |seq: u32| {
            if seq == bad {
                "flush the missing set".to_string()
            } else {
                format!("message {seq}")
            }
        };
        match sock.transact_batch(&b, &what) {
            Err(BatchError::Rejected(e, _)) => {
                assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
                assert!(e.to_string().contains("flush the missing set"), "{e}");
            }
            other => panic!("expected the batch to be rejected: {other:?}"),
        }
        assert!(
            nft::table_flags(&mut sock, TableFamily::Inet)
                .unwrap()
                .is_none(),
            "nothing applied"
        );
        // The same batch without the failing message: one ACK, committed.
        let mut b = sock.msgbuf();
        encode::begin_batch(&mut b);
        encode::new_table(&mut b, TableFamily::Inet, Some(0));
        encode::new_set(
            &mut b,
            TableFamily::Inet,
            "bnet-pods",
            SetKind::Pods,
            1,
            false,
        );
        b.ack_last();
        encode::end_batch(&mut b);
        sock.transact_batch(&b, &|s| format!("message {s}"))
            .expect("commit");
        assert!(nft::table_flags(&mut sock, TableFamily::Inet)
            .unwrap()
            .is_some());
    });
}

/// Every wait for a reply has a deadline. A batch the kernel drops without a word (a second
/// BATCH_BEGIN makes nfnetlink discard it silently) and a request that succeeds without a
/// reply (a ctnetlink flush of an empty table, no NLM_F_ACK) both end with "try again" (code
/// 11) and a message saying no reply came, instead of blocking.
#[test]
fn a_missing_reply_ends_with_try_again_instead_of_blocking() {
    let h = Harness::new("batch-deadline");
    let ns = h.netns("node");
    in_netns(&ns, || {
        let mut sock = NfSocket::open().unwrap();
        sock.set_reply_timeout(Duration::from_millis(300));
        let mut b = sock.msgbuf();
        encode::begin_batch(&mut b);
        encode::begin_batch(&mut b);
        encode::new_table(&mut b, TableFamily::Inet, Some(0));
        b.ack_last();
        encode::end_batch(&mut b);
        match sock.transact_batch(&b, &|s| format!("message {s}")) {
            Err(BatchError::Unknown(e)) => {
                assert_eq!(e.code(), 11, "{e}");
                assert!(e.to_string().contains("no reply"), "{e}");
                assert!(e.to_string().contains("not resent"), "{e}");
            }
            other => panic!("expected an unknown outcome: {other:?}"),
        }
        assert!(nft::table_flags(&mut sock, TableFamily::Inet)
            .unwrap()
            .is_none());

        let mut b: MsgBuf = sock.msgbuf();
        b.begin(
            ((NFNL_SUBSYS_CTNETLINK as u16) << 8) | 2, // IPCTNL_MSG_CT_DELETE
            0,
            libc::AF_INET as u8,
            0,
        );
        b.end();
        let e = sock.request(&b, "flush an empty table").unwrap_err();
        assert_eq!(e.code(), 11, "{e}");
        assert!(e.to_string().contains("no reply"), "{e}");
        // The socket still works afterwards.
        nft::probe(&mut sock).expect("a GETGEN after the timeout");
    });
}

/// Another nf_tables writer (here `nft`, as kube-proxy or firewalld would be) commits between
/// natguard's read and its commit. natguard's batch carries the generation it read, so the
/// kernel refuses it with ERESTART; natguard reads again and builds the batch from what the
/// other writer left. The other writer flushed natguard's DNAT chain: B's first read found the
/// shared objects current (a batch of elements only), the second finds the flush and converges,
/// so the rules are back. Without the generation the first batch would commit and leave the
/// chain empty. The writer also plants B's own element, which B read as absent: B's exclusive
/// add would fail on it, so it must be the restart that finds it and replaces it. The pause
/// between read and commit is the debug build's test hook (`NATGUARD_TEST_PAUSE_BEFORE_COMMIT`),
/// so the interleaving is exact, not a race.
#[test]
fn a_commit_by_another_writer_between_read_and_commit_makes_natguard_read_again() {
    let (h, ns) = synthetic_node("genid");
    // natguard's lock directory is private: a directory of the test mounted over
    // /run/natguard inside the invocation's own /run (the harness makes the mount point there).
    let run_dir = h.dir().join("run-natguard");
    std::fs::create_dir_all(&run_dir).unwrap();
    let log = h.dir().join("natguard.log");
    let cfg = cfg(json!({ "logFile": log.to_str().unwrap(), "logLevel": "info" }));
    let a = pod("gen", 1);
    let b = pod("gen", 2);
    let private = |p: &SynPod, pause: Option<&std::path::Path>| {
        let mut inv = p
            .invocation("ADD", &cfg)
            .bind_mount(&run_dir, "/run/natguard", common::run::Access::ReadWrite)
            .bound(Duration::from_secs(60));
        if let Some(pause) = pause {
            inv = inv.env(&[("NATGUARD_TEST_PAUSE_BEFORE_COMMIT", pause)]);
        }
        inv
    };
    private(&a, None).run_in(&ns).succeeded();
    let dnat = NetNames::new(NET).chain(natguard::plan::ChainKind::Dnat);
    let rules_of = |ns: &Netns| ns.run(&["nft", "list", "chain", "inet", "natguard", &dnat]);
    assert!(rules_of(&ns).contains("dnat ip to"), "{}", rules_of(&ns));
    let masq4 = set(SetKind::Masq(Family::V4));

    let pause = h.dir().join("pause");
    let read = h.dir().join("pause.read");
    let go = h.dir().join("pause.go");
    let inv = std::thread::scope(|sc| {
        let adding = sc.spawn(|| private(&b, Some(&pause)).run_in(&ns));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !read.exists() {
            assert!(
                std::time::Instant::now() < deadline && !adding.is_finished(),
                "natguard never paused between its read and its commit (the hook exists in debug builds only)"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        ns.run(&["nft", "flush", "chain", "inet", "natguard", &dnat]);
        assert!(
            !rules_of(&ns).contains("dnat ip to"),
            "the other writer's flush"
        );
        // The same writer also plants B's own masquerade element, which B read as absent and
        // will add with NLM_F_EXCL: after the restart B must find it and take it over.
        let planted = format!("{{ {} comment \"planted\" }}", b.addrs()[0]);
        ns.run(&[
            "nft", "add", "element", "inet", "natguard", &masq4, &planted,
        ]);
        std::fs::write(&go, b"").unwrap();
        adding.join().unwrap()
    });
    let inv = inv.succeeded();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("another nf_tables writer committed between natguard's read and its commit; reading again (restart 1 of"),
        "no restart in the log: {logged}\n{inv}"
    );
    let rules = rules_of(&ns);
    assert!(
        rules.contains("dnat ip to"),
        "the flushed DNAT rules must be back: {rules}"
    );
    let masq = addrs_of(&ns, SetKind::Masq(Family::V4));
    for p in [&a, &b] {
        assert!(
            masq.contains(&p.addrs()[0]),
            "{masq:?} lacks {:?}",
            p.addrs()
        );
    }
    let listed = ns.run(&["nft", "list", "set", "inet", "natguard", &masq4]);
    assert!(
        listed.contains(&b.owner()) && !listed.contains("planted"),
        "B's element must carry B as its owner, not the planted comment: {listed}"
    );
}

/// An ADD of a new pod adds elements and deletes none, as the kernel reports it to `nft
/// monitor`: a deletion (a replace is a delete and an add) leaves nf_tables destroy work, and
/// the release of any netfilter socket in the namespace then waits for it while holding the
/// commit mutex, so other writers' commits wait a grace period
/// (docs/kernel-bug-nftables-release-stall.md). A pod that shares an address with a pod
/// already there changes that element's owner list: that one is replaced, which also shows
/// that the monitor sees the deletes this test looks for.
#[test]
fn an_add_of_a_new_pod_deletes_no_element() {
    let (h, ns) = synthetic_node("adds-only");
    let cfg = cfg(json!({}));
    add(&ns, &cfg, &pod("ao", 1)).succeeded();
    let monitor = h.spawn(&ns, "monitor", &["nft", "monitor"]);
    let log = h.dir().join("monitor.log");
    // Markers: a table added and deleted, until the monitor has printed it.
    let mark = |name: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            ns.run(&["nft", "add", "table", "inet", name]);
            ns.run(&["nft", "delete", "table", "inet", name]);
            std::thread::sleep(Duration::from_millis(50));
            let seen = std::fs::read_to_string(&log).unwrap_or_default();
            if seen.contains(&format!("delete table inet {name}")) {
                return seen.len();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nft monitor never reported table {name}: {seen}"
            );
        }
    };
    let events_of = |start: usize, end: usize| -> Vec<String> {
        let text = std::fs::read_to_string(&log).unwrap();
        text[start..end]
            .lines()
            .filter(|l| l.contains(" element inet natguard "))
            .map(str::to_string)
            .collect()
    };

    let start = mark("ngmark1");
    let b = pod("ao", 2);
    add(&ns, &cfg, &b).succeeded();
    let end = mark("ngmark2");
    let new_pod = events_of(start, end);
    assert!(
        new_pod
            .iter()
            .any(|l| l.starts_with("add element") || l.starts_with("create element")),
        "the ADD added nothing the monitor saw: {new_pod:#?}"
    );
    assert!(
        !new_pod.iter().any(|l| l.starts_with("delete element")),
        "an ADD of a new pod deleted elements: {new_pod:#?}"
    );

    let twin = SynPod::new(NET, "ao-twin", b.addrs()[0], b.addrs()[1])
        .prefixes(10, 64)
        .without_host_iface();
    add(&ns, &cfg, &twin).succeeded();
    let shared = events_of(end, mark("ngmark3"));
    h.kill(monitor);
    assert!(
        shared.iter().any(|l| l.starts_with("delete element")),
        "a changed owner list must replace its element: {shared:#?}"
    );
}
