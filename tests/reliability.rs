//! The node's protection survives what other components and tenants do to it:
//!
//! - **A bad list costs only its own network.** A second list whose natguard entry has a typo
//!   (or a list that is not JSON) leaves every other network and the node-wide guard repaired,
//!   adopted and reconciled; a new watcher starts, inserts its entry and reports ready; adopt
//!   and reconcile exit 0 and name the list, as `status` and `metrics` do.
//! - **What natguard deleted stays deleted.** libcni runs natguard's DEL, then the primary's,
//!   then removes its cache entry: a flush (self-repair) or an adopt in that gap must not bring
//!   the pod back, and under churn natguard's state ends exactly the live pods.
//! - **A ConfigMap change converges running pods**, both ways, and CHECK passes after it.
//! - **`status` tells the truth about self-repair**: the watcher that holds the lock, with its
//!   own options.
//!
//! The standard world (`common::World`: bridge networks, the REAL metadata server in the
//! "cloud" namespace, the node-local proxy); the watcher is the real binary in the node
//! namespace (`common::watcher`). Needs root; never skips.

mod common;

use common::run::{Access, Natguard};
use common::watcher::{RunDir, Watcher};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long anything asynchronous may take before the test fails (a deadline, never a bound
/// that is asserted).
const DEADLINE: Duration = Duration::from_secs(15);

fn metadata_of(pod: &Pod) -> Outcome {
    http_get(&pod.ns, sa(META4, HTTP_PORT))
}

/// Polls `f` until it holds; fails with `what` and `log` after [`DEADLINE`].
fn wait_for(what: &str, log: &dyn Fn() -> String, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !f() {
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}; log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// natguard's node tools (`adopt`, `reconcile`, `status`, `metrics`) as an operator on the
/// node runs them, with `run_dir` as `/run/natguard` when given.
fn node_tool(w: &World, args: &[&str], run_dir: Option<&Path>) -> common::run::Invocation {
    let mut inv = Natguard::new().args(args);
    if let Some(d) = run_dir {
        inv = inv.bind_mount(d, "/run/natguard", Access::ReadOnly);
    }
    inv.run_in(&w.node)
}

fn natguard_entry(list: &Value) -> Value {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "natguard")
        .unwrap()
        .clone()
}

fn without_natguard(list: &Value) -> Value {
    let mut l = list.clone();
    l["plugins"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["type"] != "natguard");
    l
}

/// Rules of natguard's node-wide guard in the node namespace (`guard` chains of its table).
fn guard_rules(w: &World) -> usize {
    let t = w.table().unwrap_or_default();
    let mut n = 0;
    let mut in_guard = false;
    for line in t.lines() {
        let l = line.trim();
        if l.starts_with("chain ") {
            in_guard = l.contains("guard");
        } else if in_guard && !l.is_empty() && l != "}" && !l.starts_with("type ") {
            n += 1;
        }
    }
    n
}

/// One tenant's typo in `20-storage.conflist` (`metadata.exemptNamespace`): after `nft flush
/// ruleset` the other network's pod is proxied again and the guard is back; a watcher started
/// with the list there inserts its own entry and reports ready; adopt and reconcile exit 0 and
/// name the list; `status` and `metrics` name and count it. The same for a half-written list.
#[test]
fn a_bad_list_costs_only_its_own_network() {
    let w = World::new("rel-badlist");
    let good = w.list("repair", "1.0.0", 0, Some(w.natguard(json!({}))));
    let chain = w.chain(good.clone());
    let pod = w.add_pod(&chain, "web", "default");
    // The storage network's pod was added while its entry was good.
    let storage_good = w.list("storage", "1.0.0", 1, Some(w.natguard(json!({}))));
    let storage = w.chain(storage_good.clone());
    let db = w.add_pod(&storage, "db", "default");
    assert_eq!(metadata_of(&pod), body("proxy"));
    assert_eq!(metadata_of(&db), body("proxy"));

    let netd = w.dir().join("net.d");
    fs::create_dir_all(&netd).unwrap();
    // The active list without natguard: the watcher must insert its entry.
    fs::write(
        netd.join("10-repair.conflist"),
        serde_json::to_vec_pretty(&without_natguard(&good)).unwrap(),
    )
    .unwrap();
    let mut broken = storage_good.clone();
    broken["plugins"][1]["metadata"] = json!({ "exemptNamespace": ["kube-system"] });
    fs::write(
        netd.join("20-storage.conflist"),
        serde_json::to_vec_pretty(&broken).unwrap(),
    )
    .unwrap();
    // A list that is not JSON (an agent's write cut short).
    fs::write(
        netd.join("30-half.conflist"),
        b"{\"cniVersion\":\"1.0.0\",\"na",
    )
    .unwrap();

    let results = w.cache_dir().join("results");
    let watcher = Watcher::spawn(&w, &natguard_entry(&good), &results, &[], "watcher.log");
    let log = || watcher.log_text();
    wait_for("the watcher to report ready", &log, || {
        watcher.run_dir.join("ready").exists()
    });
    wait_for("self-repair to subscribe", &log, || {
        watcher.state().is_some()
    });
    let active: Value =
        serde_json::from_slice(&fs::read(netd.join("10-repair.conflist")).unwrap()).unwrap();
    assert_eq!(
        natguard_entry(&active)["type"],
        "natguard",
        "the watcher inserted its entry"
    );

    w.node.run(&["nft", "flush", "ruleset"]);
    wait_for(
        "the other network's pod to be proxied again",
        &log,
        || match metadata_of(&pod) {
            o if o == body("proxy") => true,
            // The window after the flush; it must close.
            o if o == body("cloud") => false,
            Outcome::Refused => false,
            o => panic!("unexpected outcome after the flush: {o:?}"),
        },
    );
    // Once repaired, the REAL server never answers the good network's pod again.
    for _ in 0..5 {
        assert_eq!(metadata_of(&pod), body("proxy"));
    }
    assert!(guard_rules(&w) > 0, "the node-wide guard is back");
    // The broken network is left as it is: natguard cannot read its config, so it restores
    // nothing of it; the node-wide guard still keeps its pod from the real server.
    assert_ne!(
        metadata_of(&db),
        body("cloud"),
        "the guard covers every pod"
    );
    let text = log();
    assert!(
        text.contains("20-storage.conflist") && text.contains("metadata.exemptNamespace"),
        "the watcher logs the list and the field:\n{text}"
    );
    assert!(text.contains("30-half.conflist"), "{text}");
    assert!(!text.contains("repair failed"), "{text}");

    let netd_s = netd.to_str().unwrap();
    let results_s = results.to_str().unwrap();
    for verb in ["adopt", "reconcile"] {
        let out = node_tool(
            &w,
            &[verb, "--netconf-dir", netd_s, "--cache-dir", results_s],
            None,
        );
        assert_eq!(out.exit, Some(0), "{out}");
        assert!(
            out.stdout.contains("20-storage.conflist")
                && out.stdout.contains("metadata.exemptNamespace")
                && out.stdout.contains("30-half.conflist"),
            "{verb} names the broken lists: {out}"
        );
        assert!(
            out.stdout.contains("adopted  repair"),
            "{verb} served the good network: {out}"
        );
        assert!(
            out.stdout.contains("skipped  storage") && out.stdout.contains("left as it is"),
            "{verb} left the broken network alone: {out}"
        );
    }

    let status = node_tool(&w, &["status", "--json"], Some(&watcher.run_dir)).reply();
    let files: Vec<String> = status["brokenLists"]
        .as_array()
        .unwrap_or_else(|| panic!("brokenLists in {status}"))
        .iter()
        .map(|b| b["file"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(files.len(), 2, "{status}");
    assert!(files[0].ends_with("20-storage.conflist"), "{files:?}");
    assert!(files[1].ends_with("30-half.conflist"), "{files:?}");
    assert!(status["brokenLists"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("metadata.exemptNamespace"));
    let text = node_tool(&w, &["status"], Some(&watcher.run_dir)).stdout;
    assert!(
        text.contains("BROKEN LIST") && text.contains("20-storage.conflist"),
        "{text}"
    );
    let metrics = node_tool(&w, &["metrics"], Some(&watcher.run_dir)).stdout;
    assert!(
        metrics.lines().any(|l| l == "natguard_broken_lists 2"),
        "{metrics}"
    );
    // The readiness probe: ready (the node is protected), and it names the list.
    let probe = node_tool(&w, &["install", "--check"], Some(&watcher.run_dir));
    assert_eq!(probe.exit, Some(0), "{probe}");
    assert!(
        probe.stdout.starts_with("ready:") && probe.stdout.contains("20-storage.conflist"),
        "{probe}"
    );

    // Fixed, the list's network is served again.
    fs::write(
        netd.join("20-storage.conflist"),
        serde_json::to_vec_pretty(&storage_good).unwrap(),
    )
    .unwrap();
    fs::remove_file(netd.join("30-half.conflist")).unwrap();
    w.node.run(&["nft", "flush", "ruleset"]);
    wait_for("both pods to be proxied again", &log, || {
        metadata_of(&pod) == body("proxy") && metadata_of(&db) == body("proxy")
    });
    drop(watcher);
}

/// The container IDs natguard has pods for in network `net` (`status --json`, as an operator
/// on the node sees it).
fn pods_of(w: &World, net: &str) -> Vec<String> {
    let status = node_tool(w, &["status", "--json"], None).reply();
    let mut ids: Vec<String> = status["networks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["name"] == net)
        .flat_map(|n| n["pods"].as_array().unwrap().clone())
        .map(|p| p["containerId"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// natguard's tombstones of deleted attachments on the node.
fn tombstones(w: &World) -> usize {
    let dir = common::run::node_dir(&w.node).join("run/natguard/deleted");
    fs::read_dir(dir).map_or(0, |rd| rd.count())
}

fn repairs(watcher: &Watcher) -> u64 {
    watcher
        .state()
        .and_then(|s| s["repairs"].as_u64())
        .unwrap_or(0)
}

/// `nft flush ruleset` on the node, then waits for the watcher's check after it (a repair,
/// or nothing to write when an ADD's converge or an adopt restored everything first).
fn flush_and_wait(w: &World, watcher: &Watcher) {
    let checks = || {
        watcher
            .state()
            .and_then(|s| s["checks"].as_u64())
            .unwrap_or(0)
    };
    let before = checks();
    w.node.run(&["nft", "flush", "ruleset"]);
    wait_for("the watcher's repair", &|| watcher.log_text(), || {
        checks() > before
    });
}

/// A watcher over `chain`'s list that shares the node's `/run/natguard` with the CNI
/// invocations, as the DaemonSet's hostPath mount gives it.
fn node_watcher(w: &World, chain: &Chain, log: &str) -> Watcher {
    let netd = w.dir().join("net.d");
    fs::create_dir_all(&netd).unwrap();
    fs::write(
        netd.join("10-repair.conflist"),
        serde_json::to_vec_pretty(&chain.list).unwrap(),
    )
    .unwrap();
    let watcher = Watcher::spawn_with(
        w,
        &natguard_entry(&chain.list),
        &w.cache_dir().join("results"),
        &[],
        log,
        &[],
        RunDir::Node,
    );
    wait_for("self-repair to subscribe", &|| watcher.log_text(), || {
        watcher.state().is_some()
    });
    watcher
}

/// `adopt` or `reconcile` over the test's netconf dir and the node's cache; must exit 0.
fn restore_tool(w: &World, verb: &str) -> String {
    let netd = w.dir().join("net.d");
    let results = w.cache_dir().join("results");
    let out = node_tool(
        w,
        &[
            verb,
            "--netconf-dir",
            netd.to_str().unwrap(),
            "--cache-dir",
            results.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.exit, Some(0), "{out}");
    out.stdout
}

/// libcni's order: natguard's DEL, then the primary's, then the cache entry is removed. A
/// flush (self-repair), an adopt and a reconcile in that gap leave the pod deleted, and once
/// the cache entry is gone natguard's record of the deletion goes too.
#[test]
fn a_pod_deleted_in_the_gap_before_the_primary_s_del_stays_deleted() {
    let w = World::new("rel-gap");
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(w.natguard(json!({})))));
    let web = w.add_pod(&chain, "web", "default");
    let gone = w.add_pod(&chain, "gone", "default");
    let watcher = node_watcher(&w, &chain, "watcher.log");
    assert_eq!(pods_of(&w, "repair"), ["cid-gone", "cid-web"]);
    let mut in_gap = Vec::new();
    chain
        .del_pausing(&gone.att, &mut |plugin| {
            if plugin != "natguard" {
                return;
            }
            in_gap.push(("after natguard's DEL", pods_of(&w, "repair")));
            flush_and_wait(&w, &watcher);
            in_gap.push(("after a flush's repair", pods_of(&w, "repair")));
            let out = restore_tool(&w, "adopt");
            assert!(out.contains("natguard's DEL has run for it"), "{out}");
            in_gap.push(("after adopt", pods_of(&w, "repair")));
            restore_tool(&w, "reconcile");
            in_gap.push(("after reconcile", pods_of(&w, "repair")));
        })
        .unwrap();
    for (when, pods) in &in_gap {
        assert_eq!(pods, &["cid-web"], "{when}");
    }
    assert_eq!(metadata_of(&web), body("proxy"));
    // The cache entry is gone: the next restore forgets the deletion.
    assert_eq!(tombstones(&w), 1);
    flush_and_wait(&w, &watcher);
    assert_eq!(pods_of(&w, "repair"), ["cid-web"]);
    assert_eq!(tombstones(&w), 0, "the record of the deletion is pruned");
    // The same attachment added again is restored like any other.
    w.try_attach(&chain, gone.ns.clone(), gone.att.clone())
        .unwrap_or_else(|e| panic!("ADD again: {e}"));
    flush_and_wait(&w, &watcher);
    assert_eq!(pods_of(&w, "repair"), ["cid-gone", "cid-web"]);
}

/// CRI-O and podman DEL with the list as it is now, not the cached one: a pod that started
/// before natguard was in its list, adopted, then deleted with the current list (natguard's
/// DEL first), stays deleted through a flush and an adopt in the gap.
#[test]
fn a_pod_adopted_then_deleted_with_the_current_list_stays_deleted() {
    let w = World::new("rel-crio");
    let list = w.list("repair", "1.0.0", 0, Some(w.natguard(json!({}))));
    let before = w.chain(without_natguard(&list));
    let web = w.add_pod(&before, "web", "default");
    let old = w.add_pod(&before, "old", "default");
    let chain = w.chain(list);
    let watcher = node_watcher(&w, &chain, "watcher.log");
    restore_tool(&w, "adopt");
    assert_eq!(pods_of(&w, "repair"), ["cid-old", "cid-web"]);
    let mut in_gap = Vec::new();
    chain
        .del_pausing(&old.att, &mut |plugin| {
            if plugin != "natguard" {
                return;
            }
            flush_and_wait(&w, &watcher);
            in_gap.push(("after a flush's repair", pods_of(&w, "repair")));
            restore_tool(&w, "adopt");
            in_gap.push(("after adopt", pods_of(&w, "repair")));
        })
        .unwrap();
    for (when, pods) in &in_gap {
        assert_eq!(pods, &["cid-web"], "{when}");
    }
    assert_eq!(metadata_of(&web), body("proxy"));
}

/// `status` and `natguard_self_repair_running` describe the watcher that holds the lock: 1
/// while a repairing watcher runs, 0 once it has exited, and 0 (with the record's counts kept
/// and "OFF" said) while the running watcher was started with `--no-repair`, whose flush
/// stays unrepaired.
#[test]
fn status_tells_whether_self_repair_runs() {
    let w = World::new("rel-status");
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    let netd = w.dir().join("net.d");
    fs::create_dir_all(&netd).unwrap();
    fs::write(
        netd.join("10-repair.conflist"),
        serde_json::to_vec_pretty(&chain.list).unwrap(),
    )
    .unwrap();
    let entry = natguard_entry(&chain.list);
    let results = w.cache_dir().join("results");
    let said = |run_dir: &Path| {
        let status = node_tool(&w, &["status", "--json"], Some(run_dir)).reply();
        let metrics = node_tool(&w, &["metrics"], Some(run_dir)).stdout;
        let metric = metrics
            .lines()
            .find_map(|l| l.strip_prefix("natguard_self_repair_running "))
            .map(str::to_string);
        let text = node_tool(&w, &["status"], Some(run_dir)).stdout;
        (status["selfRepair"].clone(), metric, text)
    };

    let first = Watcher::spawn(&w, &entry, &results, &[], "first.log");
    wait_for("self-repair to subscribe", &|| first.log_text(), || {
        first.state().is_some()
    });
    let run_dir = first.run_dir.clone();
    let (sr, metric, _) = said(&run_dir);
    assert_eq!(sr["running"], true, "{sr}");
    assert_eq!(metric.as_deref(), Some("1"));
    flush_and_wait(&w, &first);
    assert!(repairs(&first) >= 1, "the flush was repaired");
    drop(first);

    let (sr, metric, text) = said(&run_dir);
    assert_eq!(sr["running"], false, "an exited watcher: {sr}");
    // Its count as it exited (a repair may still have been counted after the check the
    // flush's wait saw).
    let repairs = sr["repairs"].as_u64().expect("a repair count");
    assert!(repairs >= 1, "{sr}");
    assert_eq!(metric.as_deref(), Some("0"));
    assert!(text.contains("is not running"), "{text}");

    let second = Watcher::spawn_with(
        &w,
        &entry,
        &results,
        &[],
        "second.log",
        &["--no-repair"],
        RunDir::Own,
    );
    // It holds the lock once it adopts (it took the lock before anything else).
    wait_for(
        "the --no-repair watcher to run",
        &|| second.log_text(),
        || second.log_text().contains("natguard adopt: done"),
    );
    let (sr, metric, text) = said(&run_dir);
    assert_eq!(sr["running"], false, "a --no-repair watcher: {sr}");
    assert_eq!(sr["repairing"], false, "{sr}");
    assert_eq!(sr["pid"], second.pid(), "{sr}");
    assert_eq!(sr["repairs"], repairs, "the counts stay: {sr}");
    assert_eq!(metric.as_deref(), Some("0"));
    assert!(text.contains("self-repair: OFF"), "{text}");
    // And indeed nothing repairs.
    w.node.run(&["nft", "flush", "ruleset"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(metadata_of(&pod), body("cloud"), "no self-repair runs");
    assert_eq!(said(&run_dir).0["running"], false);
    drop(second);

    // A repairing watcher again: running once more, counts continued.
    let third = Watcher::spawn(&w, &entry, &results, &[], "third.log");
    wait_for(
        "self-repair to take the record",
        &|| third.log_text(),
        || {
            third
                .state()
                .is_some_and(|s| s["repairing"] == true && s["pid"] == third.pid())
        },
    );
    let (sr, metric, _) = said(&run_dir);
    assert_eq!(sr["running"], true, "{sr}");
    assert_eq!(metric.as_deref(), Some("1"));
    assert!(sr["repairs"].as_u64().unwrap() >= repairs);
}

/// Replaces the watcher's `--config` file as a ConfigMap update does (a new file renamed over
/// it).
fn set_config(w: &World, entry: &Value) {
    let file = w.dir().join("natguard-entry.json");
    let tmp = w.dir().join(".natguard-entry.json.new");
    fs::write(&tmp, serde_json::to_vec(entry).unwrap()).unwrap();
    fs::rename(&tmp, &file).unwrap();
}

/// A ConfigMap change converges running pods, both ways: tightened to `deny`, a running
/// proxy-mode pod's metadata connections are reset (never answered by the real server) and
/// its CHECK passes, with the list as it now is and with the list of its ADD (a runtime that
/// CHECKs with the cached config); loosened back to `proxy`, the pod is proxied again and
/// CHECK passes again with either list.
#[test]
fn a_configmap_change_converges_running_pods_both_ways_and_check_passes() {
    let w = World::new("rel-configmap");
    let proxy = w.list("repair", "1.0.0", 0, Some(w.natguard(json!({}))));
    let deny = w.list(
        "repair",
        "1.0.0",
        0,
        Some(w.natguard(json!({ "metadata": { "mode": "deny" } }))),
    );
    let chain = w.chain(proxy.clone());
    let web = w.add_pod(&chain, "web", "default");
    let watcher = node_watcher(&w, &chain, "watcher.log");
    let log = || watcher.log_text();
    wait_for("the first adopt", &log, || {
        log().contains("natguard adopt: done")
    });
    chain.check(&web.att).unwrap();

    // Tighten. A request whose answer the proxy sends after the change's adopt has deleted its
    // flow reaches the pod from the proxy's address, which the pod ignores: that request waits
    // out its own timeout (docs/operations.md), and the next one is reset.
    set_config(&w, &natguard_entry(&deny));
    wait_for("the running pod to be reset", &log, || {
        match metadata_of(&web) {
            Outcome::Refused => true,
            o if o == body("proxy") || o == Outcome::TimedOut => false,
            o => panic!("tightening: unexpected outcome {o:?}"),
        }
    });
    // The list in the netconf dir is what runtimes CHECK with from now on.
    let active = || -> Value {
        serde_json::from_slice(&fs::read(w.dir().join("net.d/10-repair.conflist")).unwrap())
            .unwrap()
    };
    assert_eq!(natguard_entry(&active())["metadata"]["mode"], "deny");
    let deny_chain = w.chain(active());
    wait_for("CHECK to pass with the tightened list", &log, || {
        deny_chain.check(&web.att).is_ok()
    });
    deny_chain.check(&web.att).unwrap();
    // A runtime that CHECKs with the list of the pod's ADD: the pod follows the node's list.
    chain.check(&web.att).unwrap();

    // Loosen.
    set_config(&w, &natguard_entry(&proxy));
    wait_for(
        "the running pod to be proxied again",
        &log,
        || match metadata_of(&web) {
            o if o == body("proxy") => true,
            Outcome::Refused => false,
            o => panic!("loosening: unexpected outcome {o:?}"),
        },
    );
    assert!(natguard_entry(&active())["metadata"].get("mode").is_none());
    let chain = w.chain(active());
    wait_for("CHECK to pass with the loosened list", &log, || {
        chain.check(&web.att).is_ok()
    });
    chain.check(&web.att).unwrap();
    deny_chain.check(&web.att).unwrap();
    // A pod added after the change has the same policy as the running one.
    let late = w.add_pod(&chain, "late", "default");
    assert_eq!(metadata_of(&late), body("proxy"));
}

/// A proxied connection that a pod keeps open across a ConfigMap change to `deny` is reset at
/// its next request: never answered by the real server, and never left waiting. The guard
/// judges such a flow after its DNAT to the proxy, and where the bridge hands frames to
/// netfilter (`br_netfilter`, on every Kubernetes node, and on this test's node) the kernel
/// sends that reset out of the pod's port from the proxy's address, which the pod never dialled
/// and ignores: its request would wait out its timeout. The change's adopt deletes the flow, so
/// the next request is judged as the pod sent it and reset from the address it dialled.
#[test]
fn a_proxied_connection_kept_open_across_a_change_to_deny_is_reset_at_its_next_request() {
    let mut w = World::new("rel-keptconn");
    w.use_keepalive_servers();
    let proxy = w.list("repair", "1.0.0", 0, Some(w.natguard(json!({}))));
    let deny = w.list(
        "repair",
        "1.0.0",
        0,
        Some(w.natguard(json!({ "metadata": { "mode": "deny" } }))),
    );
    let chain = w.chain(proxy);
    let web = w.add_pod(&chain, "web", "default");
    let watcher = node_watcher(&w, &chain, "watcher.log");
    let log = || watcher.log_text();
    let adopts = || log().matches("natguard adopt: done").count();
    wait_for("the first adopt", &log, || adopts() >= 1);
    let mut kept = common::attack::KeepAlive::open(&web.ns, sa(META4, HTTP_PORT))
        .unwrap_or_else(|e| panic!("control: connect to the metadata address: {e}"));
    // Control: the kept connection is proxied, and stays open between requests.
    assert_eq!(kept.get(), body("proxy"));
    assert_eq!(kept.get(), body("proxy"));

    set_config(&w, &natguard_entry(&deny));
    wait_for("the change's adopt", &log, || adopts() >= 2);
    // A new connection is reset: the change is in place.
    assert_eq!(
        metadata_of(&web),
        Outcome::Refused,
        "a new connection after the change"
    );
    let got = kept.get();
    assert_eq!(
        got,
        Outcome::Refused,
        "the kept connection's next request after the change to deny (it must be reset, not \
         answered and not left waiting); watcher log:\n{}",
        log()
    );
}

/// Churn in libcni's order with the primary's DEL 100 ms slow, while the ConfigMap changes
/// every second and the ruleset is flushed every 700 ms: natguard's pods stay within what is
/// alive or being deleted, and end exactly the live pods, with no tombstone left.
/// `NATGUARD_CHURN_PODS` (default 60) pods pass through, six at a time.
#[test]
fn churn_with_a_slow_primary_del_configmap_changes_and_flushes_ends_with_the_live_pods() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const WORKERS: usize = 6;
    let total: usize = std::env::var("NATGUARD_CHURN_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let per_worker = total.div_ceil(WORKERS);
    let w = World::new("rel-churn");
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(w.natguard(json!({})))));
    let steady = w.add_pod(&chain, "steady", "default");
    let watcher = node_watcher(&w, &chain, "watcher.log");
    let entry = natguard_entry(&chain.list);
    let done = AtomicBool::new(false);
    let flushes = AtomicUsize::new(0);
    let changes = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    // The pods whose natguard DEL has returned, and those of them a repair brought back.
    let deleted = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let back = std::sync::Mutex::new(Vec::<String>::new());
    let live: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|t| {
                let (w, chain, deleted) = (&w, &chain, &deleted);
                s.spawn(move || {
                    let mut last: Option<(String, Pod)> = None;
                    for k in 0..per_worker {
                        let role = format!("c{t}x{k}");
                        let ns = w.h.netns(&role);
                        let att =
                            Attachment::new(&format!("cid-{role}"), &ns).k8s("default", &role);
                        let pod = w
                            .try_attach(chain, ns, att)
                            .unwrap_or_else(|e| panic!("ADD {role}: {e}"));
                        if let Some((gone, pod)) = last.replace((role, pod)) {
                            chain
                                .del_pausing(&pod.att, &mut |plugin| {
                                    if plugin == "natguard" {
                                        deleted.lock().unwrap().insert(format!("cid-{gone}"));
                                        // The primary's DEL is slow.
                                        std::thread::sleep(Duration::from_millis(100));
                                    }
                                })
                                .unwrap_or_else(|e| panic!("DEL {gone}: {e}"));
                        }
                    }
                    format!("cid-{}", last.unwrap().0)
                })
            })
            .collect();
        let (w, done, flushes, changes, most) = (&w, &done, &flushes, &changes, &most);
        let (deleted, back, watcher) = (&deleted, &back, &watcher);
        let entry = entry.clone();
        s.spawn(move || {
            let mut on = false;
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1000));
                on = !on;
                let mut e = entry.clone();
                e["conntrack"] = json!({ "flushOnAdd": on });
                set_config(w, &e);
                changes.fetch_add(1, Ordering::SeqCst);
            }
        });
        s.spawn(move || {
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(700));
                most.fetch_max(pods_of(w, "repair").len(), Ordering::SeqCst);
                let gone = deleted.lock().unwrap().clone();
                flush_and_wait(w, watcher);
                flushes.fetch_add(1, Ordering::SeqCst);
                let again: Vec<String> = pods_of(w, "repair")
                    .into_iter()
                    .filter(|p| gone.contains(p))
                    .collect();
                back.lock().unwrap().extend(again);
            }
        });
        let live = workers.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Ordering::SeqCst);
        live
    });
    let mut want: Vec<String> = live;
    want.push("cid-steady".into());
    want.sort();
    // Settled: the last adopt after a change, then one more repair.
    set_config(&w, &entry);
    wait_for(
        "the last ConfigMap change to be adopted",
        &|| watcher.log_text(),
        || {
            natguard_entry(
                &serde_json::from_slice::<Value>(
                    &fs::read(w.dir().join("net.d/10-repair.conflist")).unwrap(),
                )
                .unwrap(),
            )
            .get("conntrack")
            .is_none()
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    flush_and_wait(&w, &watcher);
    let got = pods_of(&w, "repair");
    println!(
        "churn: {} pods through {WORKERS} workers, {} flushes, {} ConfigMap changes; at most {} pods recorded before a flush; at the end {} recorded, {} live, {} tombstone(s)",
        per_worker * WORKERS,
        flushes.load(Ordering::SeqCst),
        changes.load(Ordering::SeqCst),
        most.load(Ordering::SeqCst),
        got.len(),
        want.len(),
        tombstones(&w)
    );
    assert_eq!(
        back.lock().unwrap().as_slice(),
        &[] as &[String],
        "a repair brought back pods whose DEL natguard had run"
    );
    assert_eq!(got, want, "natguard's pods are exactly the live ones");
    assert!(
        most.load(Ordering::SeqCst) <= 2 * WORKERS + 1,
        "never more than what is alive or being deleted"
    );
    assert_eq!(tombstones(&w), 0, "no record of deleted pods is left");
    assert_eq!(metadata_of(&steady), body("proxy"));
    assert!(flushes.load(Ordering::SeqCst) > 0 && changes.load(Ordering::SeqCst) > 0);
}
