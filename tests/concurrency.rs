//! Concurrency: many invocations of natguard at once on one node. 64 ADDs and DELs of distinct
//! pods in random order over several rounds, ADDs racing a config change, and two attachments
//! of the same address added and deleted one after the other or at the same time.
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

use common::run::*;
use common::synthetic::*;
use std::collections::BTreeSet;

/// 64 ADDs/DELs of distinct pods at once, in random order, over several rounds (re-ADDs with
/// new addresses, DELs with and without prevResult): afterwards the kernel holds exactly the
/// live pods' entries for both families, and the shared rules exactly once.
#[test]
fn concurrent_add_del_of_64_pods_matches_live_set() {
    let (h, ns) = synthetic_node("conc-64");
    let mut rng = Rng::new("concurrent_add_del_of_64_pods_matches_live_set");
    let cfg = cfg_a();
    let reference = reference_shared(&h, "ref", &cfg);
    const POOL: u32 = 96;
    // live[i] = Some(generation) when pod i is attached.
    let mut live: Vec<Option<u32>> = vec![None; POOL as usize];
    let mut gens: Vec<u32> = vec![0; POOL as usize];
    let rounds = 6;
    let mut invocations = 0;
    for round in 0..rounds {
        let mut idx: Vec<u32> = (0..POOL).collect();
        rng.shuffle(&mut idx);
        let last = round == rounds - 1;
        let mut ops = Vec::new();
        for &i in idx.iter().take(64) {
            let u = i as usize;
            match live[u] {
                Some(g) if last || rng.below(10) < 6 => {
                    let p = SynPod::numbered("c", i, g);
                    ops.push(if rng.below(3) == 0 {
                        Op::DelBare(p)
                    } else {
                        Op::Del(p)
                    });
                    live[u] = None;
                }
                Some(_) => {
                    // Re-ADD of a live attachment with new addresses.
                    gens[u] += 1;
                    live[u] = Some(gens[u]);
                    ops.push(Op::Add(SynPod::numbered("c", i, gens[u])));
                }
                None if last => {}
                None => {
                    gens[u] += 1;
                    live[u] = Some(gens[u]);
                    ops.push(Op::Add(SynPod::numbered("c", i, gens[u])));
                }
            }
        }
        if last {
            // Whatever is still live goes too.
            for (i, l) in live.iter_mut().enumerate() {
                if let Some(g) = l.take() {
                    ops.push(Op::Del(SynPod::numbered("c", i as u32, g)));
                }
            }
        }
        invocations += ops.len();
        run_ops(&ns, &cfg, ops);
        let pods: Vec<SynPod> = live
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.map(|g| SynPod::numbered("c", i as u32, g)))
            .collect();
        let st = must_state(&ns);
        assert_pods_exactly(&st, &pods, &format!("after round {round}"));
        assert_eq!(
            shared_of(&st),
            reference,
            "after round {round}: the shared rules and sets differ from one sequential ADD's"
        );
        // Every live pod passes CHECK.
        for p in pods.iter().take(8) {
            check(&ns, &cfg, p).succeeded();
        }
    }
    eprintln!("{rounds} rounds, {invocations} parallel invocations");
}

/// Half of 64 parallel ADDs carry config A, half config B (a conflist rewritten while pods
/// start): the shared objects end up entirely one config's (uniform fingerprint, that config's
/// rule count and sets), and every pod is present.
#[test]
fn adds_racing_a_config_change_converge_to_one_config() {
    let (h, ns) = synthetic_node("conc-cfg");
    let mut rng = Rng::new("adds_racing_a_config_change_converge_to_one_config");
    let (a, b) = (cfg_a(), cfg_b());
    let ref_a = reference_shared(&h, "ref-a", &a);
    let ref_b = reference_shared(&h, "ref-b", &b);
    assert_ne!(ref_a, ref_b, "the two configs must differ in the kernel");
    let count = |s: &Shared| s.rules.values().map(Vec::len).sum::<usize>();
    assert_ne!(count(&ref_a), count(&ref_b), "rule counts must differ");
    let mut seen = BTreeSet::new();
    for round in 0..4u32 {
        let pods: Vec<SynPod> = (0..64)
            .map(|i| SynPod::numbered("r", i, round).denied(i % 2 == 1))
            .collect();
        let mut jobs: Vec<Box<dyn FnOnce() -> Invocation + Send + '_>> = Vec::new();
        let mut order: Vec<usize> = (0..pods.len()).collect();
        rng.shuffle(&mut order);
        for &i in &order {
            let p = pods[i].clone();
            let cfg = if i.is_multiple_of(2) {
                a.clone()
            } else {
                b.clone()
            };
            let ns = &ns;
            jobs.push(Box::new(move || add(ns, &cfg, &p)));
        }
        for inv in parallel(jobs) {
            inv.succeeded();
        }
        let st = must_state(&ns);
        let fps = fingerprints(&st);
        assert_eq!(
            fps.len(),
            1,
            "round {round}: rules of more than one config: {fps:?}\n{st:#?}"
        );
        let sh = shared_of(&st);
        let which = if sh == ref_a {
            "A"
        } else if sh == ref_b {
            "B"
        } else {
            panic!("round {round}: shared objects are neither config A's nor B's:\n{sh:#?}\nA: {ref_a:#?}\nB: {ref_b:#?}")
        };
        seen.insert(which);
        assert_pods_exactly(&st, &pods, &format!("round {round} (config {which} won)"));
        // The network converges back on the next ADD of the other config.
        let extra = SynPod::numbered("x", 1, 50 + round);
        let (cfg, want) = if which == "A" {
            (&b, &ref_b)
        } else {
            (&a, &ref_a)
        };
        add(&ns, cfg, &extra).succeeded();
        assert_eq!(&shared_of(&must_state(&ns)), want, "round {round}");
        // Clean up for the next round, all at once.
        let mut all = pods.clone();
        all.push(extra);
        run_ops(&ns, &a, all.into_iter().map(Op::Del).collect());
        assert_pods_exactly(&must_state(&ns), &[], &format!("round {round} after DEL"));
    }
    eprintln!("configs that won a round: {seen:?}");
}

/// ADD A (IP X), ADD B (IP X), DEL A: B keeps its entries; and DEL A racing ADD B.
#[test]
fn same_ip_add_a_add_b_del_a_keeps_b_also_when_racing() {
    let (_h, ns) = synthetic_node("same-ip");
    let cfg = cfg_a();
    for round in 0..10u32 {
        let x4 = format!("10.99.{round}.7");
        let x6 = format!("fd00:99::{round}:7");
        let a = SynPod::numbered("sa", round * 10 + 1, 0).with_addrs(&x4, &x6);
        let b = SynPod::numbered("sb", round * 10 + 1, 0).with_addrs(&x4, &x6);
        // Sequential.
        add(&ns, &cfg, &a).succeeded();
        add(&ns, &cfg, &b).succeeded();
        del(&ns, &cfg, &a).succeeded();
        assert_owns(&ns, &b, "ADD A, ADD B, DEL A");
        check(&ns, &cfg, &b).succeeded();
        assert_pods_exactly(&must_state(&ns), std::slice::from_ref(&b), "after DEL A");
        // A's stale DEL again, without prevResult, changes nothing.
        del_bare(&ns, &cfg, &a).succeeded();
        assert_pods_exactly(&must_state(&ns), std::slice::from_ref(&b), "second DEL A");
        del(&ns, &cfg, &b).succeeded();
        assert_pods_exactly(&must_state(&ns), &[], "after DEL B");

        // DEL A racing ADD B (A was added before): whichever runs first, B ends up owning X.
        add(&ns, &cfg, &a).succeeded();
        let r = parallel::<Invocation>(vec![
            Box::new(|| del(&ns, &cfg, &a)),
            Box::new(|| add(&ns, &cfg, &b)),
        ]);
        for inv in r {
            inv.succeeded();
        }
        assert_owns(&ns, &b, "DEL A racing ADD B");
        assert_pods_exactly(&must_state(&ns), std::slice::from_ref(&b), "DEL A || ADD B");
        del(&ns, &cfg, &b).succeeded();
        assert_pods_exactly(&must_state(&ns), &[], "round end");
    }
}

/// Two live attachments with the same address: deleting either one must leave the other
/// protected: each address element lists all its owners, so "ADD B X, ADD A X, DEL A" leaves X
/// in the meta/masq sets while B is alive and recorded with X, and B's metadata traffic stays
/// intercepted. The racing form (ADD A || ADD B, then DEL A) is checked too.
#[test]
fn same_ip_deleting_either_attachment_keeps_the_other() {
    let (_h, ns) = synthetic_node("same-ip-either");
    let cfg = cfg_a();
    let x4 = "10.98.0.7";
    let x6 = "fd00:98::7";
    let a = SynPod::numbered("ea", 1, 0).with_addrs(x4, x6);
    let b = SynPod::numbered("eb", 1, 0).with_addrs(x4, x6);
    // Sequential, the newer attachment deleted first.
    add(&ns, &cfg, &b).succeeded();
    add(&ns, &cfg, &a).succeeded();
    del(&ns, &cfg, &a).succeeded();
    let st = must_state(&ns);
    let chk = check(&ns, &cfg, &b);
    assert!(
        chk.exit == Some(0),
        "ADD B X, ADD A X, DEL A: live pod B lost its entries (CHECK B: {chk})\nstate: {:#?}",
        st.sets
    );
    del(&ns, &cfg, &b).succeeded();
    // Racing ADDs, then DEL of either one.
    for round in 0..20u32 {
        let (gone, stays) = if round.is_multiple_of(2) {
            (&a, &b)
        } else {
            (&b, &a)
        };
        for inv in parallel::<Invocation>(vec![
            Box::new(|| add(&ns, &cfg, &a)),
            Box::new(|| add(&ns, &cfg, &b)),
        ]) {
            inv.succeeded();
        }
        del(&ns, &cfg, gone).succeeded();
        let chk = check(&ns, &cfg, stays);
        assert!(
            chk.exit == Some(0),
            "round {round}: ADD {} || ADD {}, DEL {}: live pod {} lost its entries: {chk}",
            a.cid,
            b.cid,
            gone.cid,
            stays.cid
        );
        del(&ns, &cfg, stays).succeeded();
        assert_pods_exactly(&must_state(&ns), &[], "round end");
    }
}
