//! `natguard install --watch` repairs natguard's tables when someone else flushes them, within
//! milliseconds, and does not react to anyone's changes of their own tables.
//!
//! The standard world (`common::World`: a bridge pod network, the REAL metadata server in the
//! "cloud" namespace, the node-local proxy) with a default pod; the watcher runs as the real
//! binary in the node namespace, in a private mount namespace with a directory of the test
//! bind-mounted over `/run/natguard` (its lock and its repair record), with the test's
//! netconf dir, bin dir and CNI cache. Three cases:
//!
//! - **The window.** `nft flush ruleset` in the node namespace, then the pod's metadata
//!   request is repeated until it is answered by the proxy again; several runs, median and
//!   worst printed. While the policy is gone the request reaches the real metadata server:
//!   that is the window this feature closes. Only a deadline bounds it; nothing is asserted
//!   about its length.
//! - **Someone else's storm.** Another component rewrites a table of its own in a loop: the
//!   watcher repairs nothing, and its CPU time (from `/proc/<pid>/stat`) stays a small part of
//!   the wall time, so it does not spin.
//! - **A storm on natguard's table.** `nft flush table inet natguard` back to back: at most one
//!   repair per burst bound (`BURST_MAX`), and the policy is back at the end.
//! - **Two watchers.** A rollout's second `install --watch` (given the CNI cache root, which
//!   it reads as `results/`) waits for the first; the record's repairs never go down, its pid
//!   is the live watcher's, and once both are gone `status` says the record's watcher is not
//!   running.
//! - **The DaemonSet's capabilities.** A watcher with `CAP_NET_ADMIN` alone restores, after a
//!   flush, the pods that predate it and those started after it (whose namespaces reach its
//!   mount namespace by propagation), the exempt one still answered by the real server; what
//!   it cannot see is logged with the reason and counted in its record, `status` and `metrics`.
//! - **Lost notifications.** A receive buffer too small for them (`NATGUARD_MONITOR_RCVBUF`):
//!   `ENOBUFS` leads to a full check, which repairs the flush; the watcher lives on.
//!
//! Needs root (network namespaces, nf_tables, mount namespaces); never skips.

mod common;

use common::run::{Access, Natguard};
use common::watcher::Watcher;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

/// `BURST_MAX` of `src/tools/install/self_repair.rs`: a burst never delays a repair longer.
const BURST_MAX: Duration = Duration::from_millis(200);
/// How long the policy may take to come back before the test fails (a deadline, not a bound
/// on the window that is measured).
const RESTORE_DEADLINE: Duration = Duration::from_secs(10);
const RUNS: usize = 7;

/// The watcher of these tests: over the chain's list, with natguard's entry from it.
impl Watcher {
    fn start(w: &World, chain: &Chain) -> Watcher {
        Watcher::start_with(w, chain, &[])
    }

    fn start_with(w: &World, chain: &Chain, env: &[(&str, &str)]) -> Watcher {
        Watcher::start_as(w, chain, env, false)
    }

    fn start_as(w: &World, chain: &Chain, env: &[(&str, &str)], net_admin_only: bool) -> Watcher {
        let results = w.cache_dir().join("results");
        let me = Watcher::spawn_over_as(w, chain, env, &results, "watcher.log", net_admin_only);
        // Its first check runs at start (what it skips is told from the start): the tests
        // count repairs and checks from after it.
        me.wait_until(
            "the watcher to subscribe to nf_tables notifications and run its first check",
            || me.checks() >= 1,
        );
        me
    }

    /// Starts a watcher over the chain's list with `cache_dir`, logging to `log_name`, without
    /// waiting for it.
    fn spawn_over(
        w: &World,
        chain: &Chain,
        env: &[(&str, &str)],
        cache_dir: &Path,
        log_name: &str,
    ) -> Watcher {
        Watcher::spawn_over_as(w, chain, env, cache_dir, log_name, false)
    }

    fn spawn_over_as(
        w: &World,
        chain: &Chain,
        env: &[(&str, &str)],
        cache_dir: &Path,
        log_name: &str,
        net_admin_only: bool,
    ) -> Watcher {
        let netd = w.dir().join("net.d");
        fs::create_dir_all(&netd).unwrap();
        fs::write(
            netd.join("10-repair.conflist"),
            serde_json::to_vec_pretty(&chain.list).unwrap(),
        )
        .unwrap();
        let entry = chain.list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "natguard")
            .unwrap()
            .clone();
        Watcher::spawn_as(w, &entry, cache_dir, env, log_name, net_admin_only)
    }

    fn repairs(&self) -> u64 {
        self.state()
            .and_then(|s| s["repairs"].as_u64())
            .unwrap_or(0)
    }

    fn checks(&self) -> u64 {
        self.state().and_then(|s| s["checks"].as_u64()).unwrap_or(0)
    }

    /// utime + stime of the watcher (all its threads), in seconds.
    fn cpu_seconds(&self) -> f64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command name (which may contain spaces) in parentheses.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // state is field 3; utime and stime are fields 14 and 15 (1-based, whole line).
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        ticks as f64 / hz
    }

    fn wait_until(&self, what: &str, f: impl FnMut() -> bool) {
        self.wait_for(what, RESTORE_DEADLINE, f)
    }

    /// `natguard status` / `metrics` as an operator on the node runs them.
    fn tool(&self, w: &World, args: &[&str]) -> String {
        node_tool(w, &self.run_dir, args)
    }
}

/// `natguard status` / `metrics` as an operator on the node runs them, with `run_dir` as its
/// `/run/natguard`.
fn node_tool(w: &World, run_dir: &Path, args: &[&str]) -> String {
    let inv = Natguard::new()
        .args(args)
        .bind_mount(run_dir, "/run/natguard", Access::ReadOnly)
        .run_in(&w.node);
    inv.stdout
}

/// A world with one default pod under natguard, and a watcher over it.
fn setup(test: &str) -> (World, Chain, Pod, Watcher) {
    let w = World::new(test);
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    assert_eq!(
        http_get(&pod.ns, sa(META4, HTTP_PORT)),
        body("proxy"),
        "before the watcher"
    );
    let watcher = Watcher::start(&w, &chain);
    (w, chain, pod, watcher)
}

/// Whether the pod's metadata request is under natguard's policy (answered by the proxy).
/// While the policy is gone it is answered by the real metadata server.
fn metadata_of(pod: &Pod) -> Outcome {
    http_get(&pod.ns, sa(META4, HTTP_PORT))
}

fn median_and_worst(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], *v.last().unwrap())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `nft flush ruleset`, then the time until the pod's metadata connection is proxied again.
#[test]
fn a_flushed_ruleset_is_repaired_within_milliseconds() {
    let (w, chain, pod, watcher) = setup("repair-window");
    let mut windows = Vec::new();
    let mut from_start = Vec::new();
    let mut reported = Vec::new();
    let mut leaked = 0usize;
    for run in 0..RUNS {
        let before = watcher.repairs();
        let started = Instant::now();
        w.node.run(&["nft", "flush", "ruleset"]);
        let flushed = Instant::now();
        let deadline = flushed + RESTORE_DEADLINE;
        loop {
            match metadata_of(&pod) {
                o if o == body("proxy") => break,
                // The window: the real metadata server answers a pod.
                o if o == body("cloud") => leaked += 1,
                // A request that began in the window and was cut by the restored fail-closed
                // rule: the policy is back.
                Outcome::Refused => break,
                o => panic!("run {run}: unexpected outcome {o:?} after the flush"),
            }
            assert!(
                Instant::now() < deadline,
                "run {run}: the policy did not come back within {RESTORE_DEADLINE:?}; watcher log:\n{}",
                watcher.log_text()
            );
        }
        windows.push(flushed.elapsed());
        from_start.push(started.elapsed());
        watcher.wait_until("the repair to be recorded", || watcher.repairs() > before);
        assert_eq!(
            watcher.repairs(),
            before + 1,
            "run {run}: one flush, one repair"
        );
        reported.push(Duration::from_secs_f64(
            watcher.state().unwrap()["lastRepairMs"].as_f64().unwrap() / 1000.0,
        ));
        // The repaired state is exactly what ADD installs: CHECK of the pod passes.
        chain
            .check(&pod.att)
            .unwrap_or_else(|e| panic!("run {run}: CHECK after the repair: {e}"));
        // Independent flushes: further apart than the spacing of two repairs.
        std::thread::sleep(BURST_MAX + Duration::from_millis(50));
    }
    let (med, worst) = median_and_worst(windows);
    let (smed, sworst) = median_and_worst(from_start);
    let (rmed, rworst) = median_and_worst(reported);
    // nft returns only after its socket's release, which waits for the kernel's cleanup of
    // the flush (an RCU grace period): "after it returned" is a lower bound of the window,
    // "from its start" an upper one (it includes nft's own start).
    println!(
        "repair window over {RUNS} runs, until the pod's metadata request is proxied or reset again: from the start of `nft flush ruleset` median {:.1} ms, worst {:.1} ms; after it returned median {:.1} ms, worst {:.1} ms",
        ms(smed),
        ms(sworst),
        ms(med),
        ms(worst)
    );
    println!(
        "watcher's own figure (first notification -> repair committed): median {:.1} ms, worst {:.1} ms; requests answered by the real metadata server meanwhile: {leaked}",
        ms(rmed),
        ms(rworst)
    );
    let status = watcher.tool(&w, &["status"]);
    assert!(
        status.contains(&format!(
            "self-repair (install --watch, pid {}): {RUNS} repair(s)",
            watcher.pid()
        )),
        "status: {status}"
    );
    assert!(status.contains("nft (pid"), "the cause is named: {status}");
    let metrics = watcher.tool(&w, &["metrics"]);
    assert!(
        metrics
            .lines()
            .any(|l| l == format!("natguard_repairs_total {RUNS}")),
        "metrics: {metrics}"
    );
    assert!(
        metrics.contains("natguard_last_repair_timestamp_seconds "),
        "metrics: {metrics}"
    );
    let log = watcher.log_text();
    assert!(
        log.contains("self-repair: nft (pid") && log.contains("and 1 cached pod(s) with one batch"),
        "every repair is logged: {log}"
    );
}

/// Another component rewrites its own table in a loop: no repair, no spinning.
#[test]
fn another_components_own_table_storm_costs_no_repair_and_no_spin() {
    let (w, _chain, pod, watcher) = setup("repair-storm");
    let rules: String = (0..50)
        .map(|i| format!("    ip saddr 192.0.2.{i} counter accept\n"))
        .collect();
    let file = w.dir().join("other.nft");
    fs::write(
        &file,
        format!(
            "table inet other\nflush table inet other\ntable inet other {{\n  chain c {{\n    type filter hook forward priority 0; policy accept;\n{rules}  }}\n}}\n"
        ),
    )
    .unwrap();
    let script = format!(
        // One line appended per rewrite: a count rewritten in place can be read empty when
        // the kill lands between its truncation and its write.
        "while :; do nft -f {} || exit 1; echo >> {}; done",
        file.display(),
        w.dir().join("other.count").display()
    );
    let (repairs0, checks0) = (watcher.repairs(), watcher.checks());
    let cpu0 = watcher.cpu_seconds();
    let t0 = Instant::now();
    let other = w.h.spawn(&w.node, "other", &["sh", "-c", &script]);
    std::thread::sleep(Duration::from_secs(3));
    w.h.kill(other);
    let wall = t0.elapsed().as_secs_f64();
    let cpu = watcher.cpu_seconds() - cpu0;
    let rewrites = fs::read_to_string(w.dir().join("other.count"))
        .unwrap_or_default()
        .lines()
        .count();
    println!(
        "storm: {rewrites} rewrites of another table in {wall:.2} s; watcher: {} repair(s), {} check(s), {:.3} s CPU ({:.1}% of wall time)",
        watcher.repairs() - repairs0,
        watcher.checks() - checks0,
        cpu,
        100.0 * cpu / wall
    );
    assert!(
        rewrites > 20,
        "the other component barely ran: {rewrites}; its output: {}",
        fs::read_to_string(w.dir().join("other.log")).unwrap_or_default()
    );
    assert_eq!(
        watcher.repairs(),
        repairs0,
        "a repair for someone else's table"
    );
    assert_eq!(
        watcher.checks(),
        checks0,
        "a check for someone else's table"
    );
    assert!(
        cpu < 0.2 * wall,
        "the watcher spins: {cpu:.3} s of CPU in {wall:.2} s"
    );
    assert_eq!(metadata_of(&pod), body("proxy"));
}

/// natguard's own table flushed again and again: at most one repair per burst bound.
#[test]
fn a_storm_of_flushes_of_natguards_table_costs_one_repair_per_burst() {
    let (w, _chain, pod, watcher) = setup("repair-burst");
    const FLUSHES: usize = 20;
    let script =
        format!("for i in $(seq {FLUSHES}); do nft flush table inet natguard || exit 1; done");
    for round in 0..3 {
        let before = watcher.repairs();
        let t0 = Instant::now();
        w.node.run(&["sh", "-c", &script]);
        let burst = t0.elapsed();
        watcher.wait_until("the repair after the burst", || {
            metadata_of(&pod) == body("proxy") && watcher.repairs() > before
        });
        // Let any repair still due run, then count.
        std::thread::sleep(BURST_MAX * 2);
        let repairs = watcher.repairs() - before;
        let bound = 1 + (burst.as_secs_f64() / BURST_MAX.as_secs_f64()).ceil() as u64;
        println!(
            "round {round}: {FLUSHES} flushes of natguard's table in {:.1} ms -> {repairs} repair(s) (bound {bound})",
            ms(burst)
        );
        assert!(
            (1..=bound).contains(&repairs),
            "round {round}: {repairs} repairs for one burst of {:.1} ms (at most {bound}); log:\n{}",
            ms(burst),
            watcher.log_text()
        );
        assert_eq!(metadata_of(&pod), body("proxy"), "round {round}");
    }
}

/// An exempt pod's veth chain (what marks its frames as its own) is natguard's: its own ADD
/// creating it costs no repair, and someone else deleting it, or putting the netdev table to
/// sleep, is repaired at once, so the exempt pod keeps its exemption.
#[test]
fn an_exempt_pods_veth_chain_deleted_by_someone_else_is_put_back() {
    let w = World::new("repair-veth");
    let cfg = attack::exempt_cfg(&w, json!({}));
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(cfg)));
    let _web = w.add_pod(&chain, "web", "default");
    let watcher = Watcher::start(&w, &chain);
    let chains = || attack::veth_chains(&w);
    let awake = || {
        !w.node
            .run(&["nft", "list", "table", "netdev", "natguard"])
            .lines()
            .any(|l| l.trim() == "flags dormant")
    };
    assert!(
        chains().is_empty(),
        "no exempt pod, yet veth chains: {:?}",
        chains()
    );
    let before = watcher.repairs();
    let _creds = w.add_pod(&chain, "creds", attack::EXEMPT_NS);
    let veth = match chains().as_slice() {
        [one] => one.clone(),
        other => panic!("one exempt pod, veth chains {other:?}"),
    };
    std::thread::sleep(BURST_MAX * 2);
    assert_eq!(
        watcher.repairs(),
        before,
        "natguard's own veth chain was repaired; log:\n{}",
        watcher.log_text()
    );
    w.node
        .run(&["nft", "delete", "chain", "netdev", "natguard", &veth]);
    watcher.wait_until("the veth chain put back", || {
        chains() == [veth.clone()] && watcher.repairs() > before
    });
    let before = watcher.repairs();
    w.node.run(&[
        "nft",
        "add",
        "table",
        "netdev",
        "natguard",
        "{ flags dormant ; }",
    ]);
    watcher.wait_until("the netdev table woken again", || {
        awake() && watcher.repairs() > before
    });
}

/// Waits until every thread of process `pid` is stopped: kill(2) returns before a SIGSTOP
/// takes effect, and a thread woken from its read by the signal still takes what has arrived
/// before it stops.
fn wait_stopped(pid: u32) {
    let stopped = |stat: &str| stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)) == Some("T");
    let end = Instant::now() + RESTORE_DEADLINE;
    loop {
        let tasks: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .map(|t| fs::read_to_string(t.path().join("stat")).unwrap_or_default())
            .collect();
        if !tasks.is_empty() && tasks.iter().all(|t| stopped(t)) {
            return;
        }
        assert!(
            Instant::now() < end,
            "the watcher (pid {pid}) did not stop within {RESTORE_DEADLINE:?}: {tasks:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A receive buffer too small for a flush's notifications: the kernel drops them and the next
/// read fails with ENOBUFS. The watcher cannot know what it missed, so it checks everything:
/// the flush is repaired, the watcher lives on, and someone else's storm (which overflows the
/// buffer too) costs checks that write nothing, never a repair.
#[test]
fn lost_notifications_lead_to_a_full_check_not_a_crash() {
    let w = World::new("repair-lost");
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    let mut watcher = Watcher::start_with(&w, &chain, &[("NATGUARD_MONITOR_RCVBUF", "1")]);
    // Another component's table of 200 rules, which the flush deletes too: its notifications
    // overflow the smallest buffer whatever the size of natguard's own tables.
    let big = w.dir().join("big.nft");
    let rules: String = (0..200)
        .map(|i| format!("    ip saddr 198.51.100.{i} counter accept\n"))
        .collect();
    fs::write(
        &big,
        format!("table inet big {{\n  chain c {{\n{rules}  }}\n}}\n"),
    )
    .unwrap();
    w.node.run(&["nft", "-f", &big.display().to_string()]);
    let before = watcher.repairs();
    // The watcher is stopped while the flush's notifications arrive, so they overflow its
    // buffer whatever the machine's timing (a running watcher may read them as they come).
    let signal = |sig: &str| {
        let st = std::process::Command::new("kill")
            .args([sig, &watcher.pid().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig} {}", watcher.pid());
    };
    signal("-STOP");
    wait_stopped(watcher.pid());
    w.node.run(&["nft", "flush", "ruleset"]);
    signal("-CONT");
    watcher.wait_until("the repair after lost notifications", || {
        metadata_of(&pod) == body("proxy") && watcher.repairs() > before
    });
    let log = watcher.log_text();
    assert!(
        log.contains("nf_tables notifications were lost (receive buffer overflow)")
            && log.contains("and 1 cached pod(s) with one batch"),
        "the overflow was not handled as a full check: {log}"
    );
    // Someone else's storm overflows the small buffer too: checks, no repair.
    let repairs = watcher.repairs();
    let checks = watcher.checks();
    let file = w.dir().join("other.nft");
    let rules: String = (0..50)
        .map(|i| format!("    ip saddr 192.0.2.{i} counter accept\n"))
        .collect();
    fs::write(
        &file,
        format!("table inet other\nflush table inet other\ntable inet other {{\n  chain c {{\n{rules}  }}\n}}\n"),
    )
    .unwrap();
    for _ in 0..20 {
        w.node.run(&["nft", "-f", &file.display().to_string()]);
    }
    std::thread::sleep(BURST_MAX * 2);
    println!(
        "small receive buffer: a flush repaired after lost notifications; 20 rewrites of another table cost {} check(s) and {} repair(s)",
        watcher.checks() - checks,
        watcher.repairs() - repairs
    );
    assert_eq!(
        watcher.repairs(),
        repairs,
        "a repair for someone else's table"
    );
    assert!(
        watcher.child.try_wait().unwrap().is_none(),
        "the watcher died: {}",
        watcher.log_text()
    );
    assert_eq!(metadata_of(&pod), body("proxy"));
}

/// The shipped DaemonSet's container: `CAP_NET_ADMIN` alone, the node's netns directory
/// visible with propagation from the node. A pod that predates the watcher and pods started
/// after it (an exempt one among them) are all restored after `nft flush ruleset`; the exempt
/// pod is answered by the REAL metadata server, the others by the proxy. An attachment whose
/// namespace it cannot see (an empty file where one was mounted) is logged once with that
/// reason and counted by reason in the record, `status` and `metrics`.
#[test]
fn a_watcher_with_net_admin_only_restores_pods_started_before_and_after_it() {
    let w = World::new("repair-netadmin");
    let chain = w.chain(w.list(
        "repair",
        "1.0.0",
        0,
        Some(w.natguard(json!({ "metadata": { "exemptNamespaces": ["kube-system"] } }))),
    ));
    let early = w.add_pod(&chain, "early", "default");
    let watcher = Watcher::start_as(&w, &chain, &[], true);
    // Started after the watcher: their namespaces are mounted after its mount namespace was made.
    let late = w.add_pod(&chain, "late", "default");
    let creds = w.add_pod(&chain, "creds", "kube-system");
    // An attachment whose namespace is an empty file: what a mount without propagation shows.
    let results = w.cache_dir().join("results");
    let src = fs::read_dir(&results)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| read(p).contains(&late.att.container_id))
        .unwrap();
    let mut copy: Value = serde_json::from_slice(&fs::read(&src).unwrap()).unwrap();
    let empty = w.dir().join("netns-unpropagated");
    fs::write(&empty, b"").unwrap();
    copy["containerId"] = json!("cid-noprop");
    for i in copy["result"]["interfaces"].as_array_mut().unwrap() {
        if i.get("sandbox").is_some() {
            i["sandbox"] = json!(empty.to_str().unwrap());
        }
    }
    fs::write(
        results.join("copy-noprop"),
        serde_json::to_vec(&copy).unwrap(),
    )
    .unwrap();

    let expect = |when: &str| {
        for (p, who) in [(&early, "proxy"), (&late, "proxy"), (&creds, "cloud")] {
            for meta in [META4, META6] {
                assert_eq!(
                    http_get(&p.ns, sa(meta, HTTP_PORT)),
                    body(who),
                    "{} -> {meta} {when}; watcher log:\n{}",
                    p.att.container_id,
                    watcher.log_text()
                );
            }
        }
    };
    expect("before the flush");
    for run in 0..2 {
        let before = watcher.repairs();
        w.node.run(&["nft", "flush", "ruleset"]);
        watcher.wait_until("the repair", || watcher.repairs() > before);
        expect(&format!(
            "after flush {run} and the repair with CAP_NET_ADMIN only"
        ));
    }
    let log = watcher.log_text();
    assert!(
        log.contains("and 3 cached pod(s) (1 skipped: 1 netns_not_visible)"),
        "the repair says what it restored and what it skipped:\n{log}"
    );
    let skip_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cid-noprop") && l.contains("not visible"))
        .collect();
    assert_eq!(
        skip_lines.len(),
        1,
        "the skip is logged with its reason, once while it lasts:\n{log}"
    );
    assert!(
        skip_lines[0].contains("HostToContainer"),
        "{}",
        skip_lines[0]
    );
    assert!(!log.contains("no longer exists"), "{log}");
    assert_eq!(
        watcher.state().unwrap()["skipped"],
        json!({ "netns_not_visible": 1 })
    );
    let status = watcher.tool(&w, &["status"]);
    assert!(
        status.contains("1 cached attachment(s) skipped at the last check (1 netns_not_visible)"),
        "{status}"
    );
    let metrics = watcher.tool(&w, &["metrics"]);
    for (reason, n) in [
        ("netns_not_visible", 1),
        ("netns_gone", 0),
        ("not_permitted", 0),
    ] {
        let line = format!("natguard_repair_skipped_attachments{{reason=\"{reason}\"}} {n}");
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
}

/// Without `--watch` (or with `--no-repair`) nothing repairs: the flushed policy stays gone
/// until the next ADD.
#[test]
fn no_repair_without_the_watcher_s_repair() {
    let w = World::new("repair-off");
    let chain = w.chain(w.list("repair", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    let run_dir = w.dir().join("run-natguard");
    fs::create_dir_all(&run_dir).unwrap();
    let netd = w.dir().join("net.d");
    let bin = w.dir().join("bin");
    fs::create_dir_all(&netd).unwrap();
    fs::create_dir_all(&bin).unwrap();
    fs::write(
        netd.join("10-repair.conflist"),
        serde_json::to_vec(&chain.list).unwrap(),
    )
    .unwrap();
    let log = w.dir().join("watcher.log");
    let mut child = Natguard::new()
        .args(&[
            "install".as_ref(),
            "--watch".as_ref(),
            "--no-repair".as_ref(),
            "--cni-bin-dir".as_ref(),
            bin.as_os_str(),
            "--netconf-dir".as_ref(),
            netd.as_os_str(),
            "--cache-dir".as_ref(),
            w.cache_dir().join("results").as_os_str(),
        ])
        .bind_mount(&run_dir, "/run/natguard", Access::ReadWrite)
        .spawn_in(&w.node, &log);
    let deadline = Instant::now() + RESTORE_DEADLINE;
    while !read(&log).contains("natguard adopt: done") {
        assert!(
            Instant::now() < deadline,
            "watcher not ready: {}",
            read(&log)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    w.node.run(&["nft", "flush", "ruleset"]);
    std::thread::sleep(Duration::from_millis(500));
    let open = metadata_of(&pod);
    // SAFETY: plain syscall on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = child.wait();
    assert_eq!(
        open,
        body("cloud"),
        "nothing repaired: the window stays open"
    );
    assert!(
        !run_dir.join("repair.json").exists(),
        "no repair record without repair"
    );
}

/// Two `install --watch` at once, as during a DaemonSet rollout: the second waits for the
/// first's lock; the record has one writer at a time, its counters continue across the
/// handover and never go down, and its pid is the live watcher's. The second is given the CNI
/// cache root, which it reads as `results/` (else it would find no pod and repair nothing).
#[test]
fn a_second_watcher_waits_and_the_record_never_goes_back() {
    let (w, chain, pod, first) = setup("repair-two");
    let mut seen: Vec<u64> = Vec::new();
    let mut sample = |who: &Watcher| -> Value {
        let st = who.state().expect("the record");
        let n = st["repairs"].as_u64().unwrap();
        if let Some(&last) = seen.last() {
            assert!(n >= last, "repairs went down from {last} to {n}: {st}");
        }
        seen.push(n);
        st
    };
    let flush_and_wait = |who: &Watcher, pid: u32| {
        let before = who.repairs();
        w.node.run(&["nft", "flush", "table", "inet", "natguard"]);
        who.wait_until("the repair to be recorded", || {
            who.state()
                .is_some_and(|s| s["pid"] == pid && s["repairs"].as_u64().unwrap() > before)
        });
        assert_eq!(metadata_of(&pod), body("proxy"));
        std::thread::sleep(BURST_MAX + Duration::from_millis(50));
    };
    flush_and_wait(&first, first.pid());
    assert_eq!(sample(&first)["pid"], first.pid());

    let second = Watcher::spawn_over(&w, &chain, &[], &w.cache_dir(), "second.log");
    second.wait_until("the second watcher to wait for the first", || {
        second
            .log_text()
            .contains(&format!("(pid {}); waiting for it to exit", first.pid()))
    });
    for _ in 0..3 {
        flush_and_wait(&first, first.pid());
        let st = sample(&first);
        assert_eq!(
            st["pid"],
            first.pid(),
            "the waiting watcher wrote the record"
        );
    }
    let status: Value = serde_json::from_str(&second.tool(&w, &["status", "--json"])).unwrap();
    assert_eq!(status["selfRepair"]["pid"], first.pid());
    assert_eq!(status["selfRepair"]["running"], true);
    assert_eq!(
        (&status["installed"], &status["guarding"]),
        (&json!(true), &json!(true))
    );

    let handed_over = first.repairs();
    let first_pid = first.pid();
    drop(first);
    second.wait_until("the second watcher to take the record over", || {
        second.state().is_some_and(|s| s["pid"] == second.pid())
    });
    let st = sample(&second);
    assert!(
        st["repairs"].as_u64().unwrap() >= handed_over,
        "the second watcher started its count over: {st}"
    );
    assert!(second.log_text().contains(&format!(
        "continuing the record of pid {first_pid} ({handed_over} repair(s)"
    )));
    for _ in 0..3 {
        flush_and_wait(&second, second.pid());
        sample(&second);
    }
    chain.check(&pod.att).expect("CHECK after the repairs");
    let text = second.tool(&w, &["status"]);
    assert!(
        text.contains(&format!(
            "self-repair (install --watch, pid {}): ",
            second.pid()
        )),
        "{text}"
    );

    // Both gone: the record stays, shown as a watcher that is not running.
    let (run_dir, second_pid) = (second.run_dir.clone(), second.pid());
    drop(second);
    let text = node_tool(&w, &run_dir, &["status"]);
    assert!(
        text.contains(&format!(
            "self-repair: watcher pid {second_pid} is not running (record from "
        )),
        "{text}"
    );
    let metrics = node_tool(&w, &run_dir, &["metrics"]);
    assert!(
        metrics
            .lines()
            .any(|l| l == "natguard_self_repair_running 0"),
        "{metrics}"
    );
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_default()
}
