//! Churn: thousands of ADD/DEL cycles on one node, from several workers at once, with DELs
//! with and without prevResult, repeated ADDs and DELs, and a second interface. Nothing may
//! accumulate: the table is byte-identical afterwards and conntrack unchanged.
//!
//! natguard runs as the real binary (`common::run`) with a CNI environment and a synthetic
//! dual-stack prevResult (`common::synthetic`), in a network namespace of each test's own:
//! natguard never looks at the pod's interface, so kernel-state assertions need no real pods.
//! Kernel state is read with `nft -j list table inet natguard` and compared with the model of
//! the live pods: every live pod's entries are there, nothing else is, and the shared rules are
//! exactly those of one config.
//!
//! Needs root (network namespaces, nf_tables, conntrack); never skips.

mod common;

use common::run::Invocation;
use common::synthetic::*;
use common::*;
use std::sync::Mutex;

/// 2,000 ADD/DEL cycles (in parallel batches; DELs with and without prevResult, repeated ADDs,
/// a second interface) leave natguard's table byte-identical and conntrack unchanged, and every
/// invocation exits 0.
#[test]
fn churn_2000_cycles_leave_table_and_conntrack_unchanged() {
    let (_h, ns) = synthetic_node("churn");
    let cfg = cfg_a();
    // An initial ADD creates the shared objects; this pod stays.
    let anchor = SynPod::numbered("anchor", 0, 9);
    add(&ns, &cfg, &anchor).succeeded();
    let before = nft_table(&ns).expect("table after the first ADD");
    let ct_before = conntrack_list(&ns, &[]);
    const CYCLES: u32 = 2000;
    const WORKERS: u32 = 8;
    let invocations = Mutex::new(0usize);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (ns, cfg, invocations, failures) = (&ns, &cfg, &invocations, &failures);
            s.spawn(move || {
                let mut n = 0;
                let mut record = |inv: Invocation| {
                    n += 1;
                    if inv.exit != Some(0) {
                        failures.lock().unwrap().push(inv.to_string());
                    }
                };
                for k in (w..CYCLES).step_by(WORKERS as usize) {
                    // The node's pod network, as in real churn: the anchor's generation.
                    let p = SynPod::numbered("ch", k + 1, 9);
                    record(add(ns, cfg, &p));
                    match k % 4 {
                        0 => record(del(ns, cfg, &p)),
                        1 => record(del_bare(ns, cfg, &p)),
                        2 => {
                            record(add(ns, cfg, &p));
                            record(del(ns, cfg, &p));
                        }
                        // A DEL that comes twice (CRI retries, kubelet GC).
                        _ if k % 8 == 3 => {
                            record(del(ns, cfg, &p));
                            record(del(ns, cfg, &p));
                        }
                        _ => record(del(ns, cfg, &p)),
                    }
                }
                *invocations.lock().unwrap() += n;
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} invocations failed, first: {}",
        failures.len(),
        failures[0]
    );
    let after = nft_table(&ns).expect("table after churn");
    assert_eq!(
        before, after,
        "{CYCLES} ADD/DEL cycles changed natguard's table"
    );
    assert_eq!(
        conntrack_list(&ns, &[]),
        ct_before,
        "churn changed conntrack"
    );
    assert_pods_exactly(&must_state(&ns), &[anchor], "after churn");
    eprintln!(
        "{CYCLES} cycles, {} invocations, all exited 0",
        invocations.into_inner().unwrap()
    );
}
