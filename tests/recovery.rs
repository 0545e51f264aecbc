//! Recovery from state someone else changed: a flushed ruleset, a deleted or flushed table, an
//! emptied shared set, a table set dormant. CHECK must report it, the next ADD must restore the
//! shared objects, and `natguard reconcile` every pod from the CNI cache. Also GC: without
//! `cni.dev/valid-attachments` it removes nothing.
//!
//! natguard runs as the real binary (`common::run`) with a CNI environment and a synthetic
//! dual-stack prevResult (`common::synthetic`), in a network namespace of each test's own:
//! natguard never looks at the pod's interface, so kernel-state assertions need no real pods.
//! Kernel state is read with `nft -j list table inet natguard` and compared with the model of
//! the live pods: every live pod's entries are there, nothing else is, and the shared rules are
//! exactly those of one config.
//!
//! Needs root (network namespaces, nf_tables); never skips.

mod common;

use common::synthetic::*;

/// Someone else removes natguard's state (`nft flush ruleset`, `nft delete table`, `nft flush
/// table`): CHECK of an existing pod reports it (code 101, naming the pod's key or the missing
/// object), the next ADD restores the shared objects, CHECK then names the missing pod entry,
/// and `natguard reconcile` restores every pod from the CNI cache.
#[test]
fn flushed_table_add_restores_check_reports_reconcile_restores() {
    let (h, ns) = synthetic_node("fault-flush");
    let cfg = cfg_a();
    let reference = reference_shared(&h, "ref", &cfg);
    let pods: Vec<SynPod> = (1..=12).map(|i| SynPod::numbered("f", i, 0)).collect();
    for p in &pods {
        add(&ns, &cfg, p).succeeded();
    }
    let full = must_state(&ns);
    assert_pods_exactly(&full, &pods, "before the fault");
    // A pod whose netns is gone is skipped by reconcile; the others' sandbox exists.
    let gone = SynPod::numbered("f", 99, 0).vanished();
    let mut cached: Vec<(SynPod, String)> =
        pods.iter().map(|p| (p.clone(), p.netns_path())).collect();
    cached.push((gone.clone(), gone.netns_path()));
    let (cache, netconf) = write_cni_cache(h.dir(), &cfg, &cached);

    let faults: [&[&str]; 3] = [
        &["nft", "flush", "ruleset"],
        &["nft", "delete", "table", "inet", "natguard"],
        &["nft", "flush", "table", "inet", "natguard"],
    ];
    for (n, fault) in faults.iter().enumerate() {
        let what = fault.join(" ");
        ns.run(fault);
        // CHECK reports the damage.
        let old = &pods[n];
        let inv = check(&ns, &cfg, old);
        let owner = old.owner();
        let chain = format!("{NET}-dnat");
        let needle: &str = if n == 2 { &chain } else { "hnet-" };
        inv.fails_with(101, &[needle]);
        // The next ADD restores the shared objects.
        let newcomer = SynPod::numbered("fn", n as u32 + 1, 5);
        add(&ns, &cfg, &newcomer).succeeded();
        let st = must_state(&ns);
        assert_eq!(shared_of(&st), reference, "after {what} and one ADD");
        check(&ns, &cfg, &newcomer).succeeded();
        if n < 2 {
            // The older pods' entries are gone; CHECK names the pod and the set.
            check(&ns, &cfg, old).fails_with(101, &[&owner, &set_name("pods")]);
        }
        // reconcile restores every cached pod.
        let inv = reconcile(&ns, &cache, &netconf).succeeded();
        assert!(
            inv.stdout
                .contains("12 attachment(s) brought under policy, 1 skipped, 0 failed"),
            "reconcile report after {what}: {inv}"
        );
        assert!(
            inv.stdout.contains("no longer exists"),
            "the pod whose netns is gone is reported: {inv}"
        );
        let mut want = pods.clone();
        want.push(newcomer.clone());
        let st = must_state(&ns);
        assert_pods_exactly(&st, &want, &format!("after {what}, ADD, reconcile"));
        assert_eq!(shared_of(&st), reference);
        for p in &want {
            check(&ns, &cfg, p).succeeded();
        }
        // reconcile is idempotent.
        reconcile(&ns, &cache, &netconf).succeeded();
        assert_eq!(must_state(&ns), st, "a second reconcile changed the state");
        del(&ns, &cfg, &newcomer).succeeded();
    }
}

/// A shared set emptied by someone else (here `nft flush set` of the metadata endpoints
/// or non-masquerade CIDRs) turns the policy off for every pod of the network. CHECK must report
/// it and the next ADD must restore the set, as it does for rules: CHECK compares the shared
/// sets' contents, not only their names and the rule comments.
#[test]
fn flushed_shared_set_is_reported_and_restored() {
    let (h, ns) = synthetic_node("fault-set");
    let cfg = cfg_a();
    let reference = reference_shared(&h, "ref", &cfg);
    let p = SynPod::numbered("s", 1, 0);
    add(&ns, &cfg, &p).succeeded();
    for (i, set) in ["mproxy4", "mproxy6", "mguard4", "mguard6", "nomasq4"]
        .iter()
        .enumerate()
    {
        let name = set_name(set);
        ns.run(&["nft", "flush", "set", "inet", "natguard", &name]);
        let inv = check(&ns, &cfg, &p);
        assert_eq!(
            inv.exit,
            Some(1),
            "CHECK passes although set {name} was emptied: {inv}"
        );
        inv.fails_with(101, &[&name]);
        let q = SynPod::numbered("s", 10 + i as u32, 0);
        add(&ns, &cfg, &q).succeeded();
        assert_eq!(
            shared_of(&must_state(&ns)),
            reference,
            "the ADD after `nft flush set {name}` did not restore it"
        );
    }
}

/// A table made dormant by someone else (`nft add table inet natguard { flags dormant; }`)
/// enforces nothing. CHECK must report it, and the next ADD must wake it up (converging the
/// shared objects does: NEWTABLE with flags 0).
#[test]
fn dormant_table_is_reported_and_woken_up() {
    let (_h, ns) = synthetic_node("fault-dormant");
    let cfg = cfg_a();
    let p = SynPod::numbered("d", 1, 0);
    add(&ns, &cfg, &p).succeeded();
    assert_eq!(must_state(&ns).flags, "", "fresh table has no flags");
    ns.run(&[
        "nft",
        "add",
        "table",
        "inet",
        "natguard",
        "{ flags dormant; }",
    ]);
    assert!(must_state(&ns).flags.contains("dormant"));
    let inv = check(&ns, &cfg, &p);
    assert_eq!(
        inv.exit,
        Some(1),
        "CHECK passes although natguard's table is dormant: {inv}"
    );
    inv.fails_with(101, &["dormant"]);
    add(&ns, &cfg, &SynPod::numbered("d", 2, 0)).succeeded();
    let st = must_state(&ns);
    assert!(
        !st.flags.contains("dormant"),
        "the next ADD left natguard's table dormant"
    );
}

/// A GC without `cni.dev/valid-attachments` must not read as "keep nothing": it removes nothing.
/// With the list, it removes exactly what is not listed.
#[test]
fn gc_without_the_attachment_list_removes_nothing() {
    let (_h, ns) = synthetic_node("gc-nolist");
    let cfg = cfg_a();
    let pods: Vec<SynPod> = (1..=3).map(|i| SynPod::numbered("gcn", i, 0)).collect();
    for p in &pods {
        let inv = add(&ns, &cfg, p);
        assert_eq!(inv.exit, Some(0), "{inv}");
    }
    let before = must_state(&ns);
    assert_pods_exactly(&before, &pods, "after ADD");
    let inv = gc_without_list(NET, &cfg).run_in(&ns);
    assert_eq!(inv.exit, Some(0), "{inv}");
    assert_pods_exactly(&must_state(&ns), &pods, "after a GC without the list");
    let inv = gc(&ns, &cfg, &[&pods[1]]);
    assert_eq!(inv.exit, Some(0), "{inv}");
    assert_pods_exactly(&must_state(&ns), &pods[1..2], "after a GC keeping one pod");
}
