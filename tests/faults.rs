//! Faults of the environment natguard runs in: no nf_tables netlink (a seccomp filter makes the
//! socket fail), a kernel that keeps answering EBUSY, a pod netns that vanished before ADD, DELs
//! that lost their prevResult or netns, come twice, come for pods natguard never saw, or carry
//! malformed CNI_ARGS. Each must end with a clear error or cleanly, touching nothing else.
//!
//! natguard runs as the real binary (`common::run`) with a CNI environment and a synthetic
//! dual-stack prevResult (`common::synthetic`), in a network namespace of each test's own:
//! natguard never looks at the pod's interface, so kernel-state assertions need no real pods.
//! Kernel state is read with `nft -j list table inet natguard` and compared with the model of
//! the live pods: every live pod's entries are there, nothing else is, and the shared rules are
//! exactly those of one config.
//!
//! Needs root (network namespaces, nf_tables, seccomp); never skips.

mod common;

use common::run::*;
use common::synthetic::*;
use std::path::Path;

/// DEL for a pod natguard never saw (with and without a table), DEL with CNI_NETNS="" and no
/// prevResult, DEL whose prevResult names another pod's address, and ADD whose pod netns no
/// longer exists: all end cleanly and touch nothing else.
#[test]
fn del_and_add_edge_cases_end_cleanly() {
    let (_h, ns) = synthetic_node("fault-del");
    let cfg = cfg_a();
    let stranger = SynPod::numbered("never", 1, 0);
    // No table at all.
    del(&ns, &cfg, &stranger).succeeded();
    del_bare(&ns, &cfg, &stranger).succeeded();
    assert!(state(&ns).is_none(), "DEL must not create the table");
    // GC with no table.
    gc(&ns, &cfg, &[]).succeeded();

    // ADD with a CNI_NETNS that does not exist (the pod netns vanished mid-ADD).
    let p = SynPod::numbered("e", 1, 0).vanished();
    assert!(!Path::new(&p.netns_path()).exists());
    add(&ns, &cfg, &p).succeeded();
    let q = SynPod::numbered("e", 2, 0);
    add(&ns, &cfg, &q).succeeded();
    let st = must_state(&ns);
    assert_pods_exactly(&st, &[p.clone(), q.clone()], "after ADD");

    // DEL of a stranger with the table present: nothing changes.
    del(&ns, &cfg, &stranger).succeeded();
    del_bare(&ns, &cfg, &stranger).succeeded();
    assert_eq!(
        must_state(&ns),
        st,
        "DEL of an unknown pod changed the state"
    );

    // DEL of a stranger whose prevResult claims q's addresses: q keeps them.
    let liar = SynPod::numbered("never", 2, 0).with_addrs(&q.v4.to_string(), &q.v6.to_string());
    del(&ns, &cfg, &liar).succeeded();
    assert_eq!(
        must_state(&ns),
        st,
        "DEL with another pod's addresses removed them"
    );

    // DEL with CNI_NETNS="" and no prevResult removes everything of p.
    del_bare(&ns, &cfg, &p).succeeded();
    assert_pods_exactly(
        &must_state(&ns),
        std::slice::from_ref(&q),
        "DEL without netns/prevResult",
    );
    // Again: still fine.
    del_bare(&ns, &cfg, &p).succeeded();
    // DEL with malformed CNI_ARGS still works (DEL only needs the IDs).
    let mut env = q.env_with_netns("DEL", "");
    for (k, v) in env.iter_mut() {
        if k == "CNI_ARGS" {
            *v = "K8S_POD_NAMESPACE=Bad Name;junk".into();
        }
    }
    Natguard::cni(&env, &stdin_of(&cfg, NET, None))
        .run_in(&ns)
        .succeeded();
    assert_pods_exactly(&must_state(&ns), &[], "all deleted");
}

/// A kernel without nf_tables netlink (simulated with a seccomp filter that makes
/// `socket(AF_NETLINK, .., NETLINK_NETFILTER)` fail): ADD fails with a clear error, STATUS says
/// not ready (code 50), DEL and GC succeed (there is nothing to remove). A kernel that keeps
/// answering EBUSY: ADD retries a bounded number of times, then reports code 11.
///
/// Conntrack netlink cannot be removed on its own this way: it shares the NETLINK_NETFILTER
/// socket with nf_tables, and the filter cannot see which subsystem a message addresses.
#[test]
fn netfilter_netlink_missing_or_busy_gives_clear_errors() {
    let (_h, ns) = synthetic_node("fault-nonft");
    let cfg = cfg_a();
    let p = SynPod::numbered("k", 1, 0);
    // The filter works: a plain STATUS succeeds, a filtered one does not.
    status(&ns, &cfg, None).succeeded();
    for errno in [libc::EPROTONOSUPPORT, libc::EAFNOSUPPORT] {
        let f = Seccomp::no_netfilter_socket(errno);
        let inv = p.invocation("ADD", &cfg).seccomp(&f).run_in(&ns);
        assert_eq!(inv.exit, Some(1), "{inv}");
        let r = inv.reply();
        let text = format!("{} {}", r["msg"], r["details"]);
        assert!(
            text.contains("netfilter netlink"),
            "ADD without nf_tables should say netfilter netlink is unavailable: {inv}"
        );
        assert_ne!(r["code"].as_u64(), Some(0));
        status(&ns, &cfg, Some(&f)).fails_with(50, &["nf_tables"]);
        let inv = p.invocation("DEL", &cfg).seccomp(&f).run_in(&ns);
        inv.succeeded();
        gc_invocation(NET, &cfg, &[])
            .seccomp(&f)
            .run_in(&ns)
            .succeeded();
    }
    assert!(state(&ns).is_none(), "nothing may have been installed");
    // Busy kernel: bounded retries, then code 11 ("try again").
    let f = Seccomp::sends_fail(libc::EBUSY);
    let inv = p.invocation("ADD", &cfg).seccomp(&f).run_in(&ns);
    inv.fails_with(11, &["EBUSY"]);
    status(&ns, &cfg, Some(&f)).fails_with(50, &["nf_tables"]);
    assert!(state(&ns).is_none());
    // And without the filter everything works.
    add(&ns, &cfg, &p).succeeded();
    status(&ns, &cfg, None).succeeded();
}
