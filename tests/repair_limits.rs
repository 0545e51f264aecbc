//! Self-repair on a node with many pods, with the watcher under the CPU resources natguard's
//! DaemonSet ships with (`deploy/base/daemonset.yaml`): a CPU limit throttles a burst of work
//! such as a repair to its quota per 100 ms period, so a repair that takes 50 ms of CPU could
//! take several periods.
//!
//! The standard world (`common::World`) with `NATGUARD_REPAIR_PODS` pods (default 100) on one
//! bridge network; the watcher (the real binary) runs in the node namespace inside a cgroup made
//! for the test (cgroup v2 with the cpu controller, else the v1 `cpu` hierarchy) and removed
//! after: `cpu.max` (v2) or `cpu.cfs_quota_us` (v1) from the container's `limits.cpu` (none
//! without one), and `cpu.weight` / `cpu.shares` from `requests.cpu` as the kubelet sets them.
//! `NATGUARD_REPAIR_CPU` (`100m/5m,none/5m,none/50m`: limit/request pairs, measured one
//! after the other on the same node) overrides them, to compare. The watcher joins the cgroup
//! once its start (an adopt of every pod) is over: the repair is what is measured. Then
//! `NATGUARD_REPAIR_FLUSHES` (default 15) times: `nft flush ruleset`, and a pod's metadata
//! request repeated until it is proxied again. Printed: the watcher's own clock (first
//! notification → batch committed) and the test's (start of the flush → proxied), median and
//! worst. Each flush has a deadline; nothing is asserted about the figures
//! (docs/self-repair.md records them; benches/repair-limits.sh runs this with the release
//! binary). Needs root; never skips.

mod common;

use common::watcher::Watcher;
use common::*;
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);
/// The watcher's start adopts every pod before self-repair subscribes; throttled, on a busy
/// machine, that takes a while.
const START_DEADLINE: Duration = Duration::from_secs(300);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `cpu: X` under `section:` of the natguard container's `resources` in the DaemonSet, in
/// millicores.
fn daemonset_cpu(section: &str) -> Option<u64> {
    let text = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/daemonset.yaml"),
    )
    .unwrap();
    let mut lines = text.lines().skip_while(|l| l.trim() != "resources:");
    lines.next()?;
    let mut in_section = false;
    for l in lines {
        let t = l.trim();
        if !l.starts_with("              ") && !l.starts_with("            ") {
            break;
        }
        if t.ends_with(':') {
            in_section = t == format!("{section}:");
        } else if in_section {
            if let Some(v) = t.strip_prefix("cpu:") {
                return Some(millicores(v.trim().trim_matches('"')));
            }
        }
    }
    None
}

fn millicores(v: &str) -> u64 {
    match v.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => (v.parse::<f64>().unwrap() * 1000.0) as u64,
    }
}

/// A cpu cgroup made for the test, removed when dropped.
struct CpuCgroup {
    dir: PathBuf,
    v2: bool,
}

impl CpuCgroup {
    /// `limit` and `request` in millicores, as the kubelet turns them into a cgroup: a quota
    /// of `limit` per 100 ms period, and a weight from the request's shares.
    fn new() -> CpuCgroup {
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .find(|r| {
                fs::read_to_string(format!("{r}/cgroup.subtree_control"))
                    .is_ok_and(|s| s.split_whitespace().any(|c| c == "cpu"))
            });
        let name = format!("ng-test-repair-limits-{}", std::process::id());
        let (dir, v2) = match v2 {
            Some(root) => (Path::new(root).join(name), true),
            None => {
                let v1 = Path::new("/sys/fs/cgroup/cpu");
                assert!(
                    v1.join("cpu.cfs_quota_us").exists(),
                    "no cpu controller: neither a cgroup v2 root delegating cpu nor a v1 cpu hierarchy"
                );
                (v1.join(name), false)
            }
        };
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        CpuCgroup { dir, v2 }
    }

    /// `limit` and `request` in millicores, as the kubelet turns them into a cgroup: a quota
    /// of `limit` per 100 ms period, and a weight from the request's shares.
    fn set(&self, limit: Option<u64>, request: u64) {
        let shares = (request * 1024 / 1000).max(2);
        let w = |f: &str, v: String| {
            fs::write(self.dir.join(f), &v)
                .unwrap_or_else(|e| panic!("{f} = {v} in {}: {e}", self.dir.display()))
        };
        if self.v2 {
            w(
                "cpu.max",
                limit.map_or("max 100000".to_string(), |m| format!("{} 100000", m * 100)),
            );
            // The kubelet's conversion of shares into a weight.
            w(
                "cpu.weight",
                (1 + ((shares - 2) * 9999) / 262142).to_string(),
            );
        } else {
            w("cpu.cfs_period_us", "100000".into());
            w(
                "cpu.cfs_quota_us",
                limit.map_or("-1".to_string(), |m| (m * 100).to_string()),
            );
            w("cpu.shares", shares.to_string());
        }
    }

    fn join(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.dir.display()));
    }

    /// Periods in which the cgroup was throttled, and for how long in all (ms).
    fn throttled(&self) -> (u64, f64) {
        let stat = fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let get = |k: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let ms = if stat.contains("throttled_usec") {
            get("throttled_usec ") as f64 / 1000.0
        } else {
            get("throttled_time ") as f64 / 1e6
        };
        (get("nr_throttled "), ms)
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        // Its processes have exited (or are moved back): then it can go.
        let parent = self.dir.parent().unwrap().join("cgroup.procs");
        if let Ok(procs) = fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = fs::write(&parent, p);
            }
        }
        for _ in 0..200 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// utime + stime of process `pid` (all its threads), in ms.
fn cpu_ms(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 * 1000.0 / hz
}

fn median_and_worst(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], *v.last().unwrap())
}

/// The (limit, request) pairs to measure, in millicores: `NATGUARD_REPAIR_CPU`
/// (`100m/5m,none/5m,none/50m`: limit/request, `none` for no limit), else the DaemonSet's.
fn phases() -> Vec<(Option<u64>, u64)> {
    let shipped = (
        daemonset_cpu("limits"),
        daemonset_cpu("requests").unwrap_or(0),
    );
    match std::env::var("NATGUARD_REPAIR_CPU")
        .ok()
        .filter(|v| !v.is_empty())
    {
        None => vec![shipped],
        Some(v) => v
            .split(',')
            .map(|p| {
                let (l, r) = p
                    .split_once('/')
                    .unwrap_or_else(|| panic!("NATGUARD_REPAIR_CPU: {p:?} is not LIMIT/REQUEST"));
                let limit = (l != "none").then(|| millicores(l));
                (limit, millicores(r))
            })
            .collect(),
    }
}

#[test]
fn repair_of_a_busy_node_under_the_daemonset_s_cpu_resources() {
    let pods = env_or("NATGUARD_REPAIR_PODS", 100);
    let flushes = env_or("NATGUARD_REPAIR_FLUSHES", 15);
    let w = World::new("repair-limits");
    let list = w.list("repair", "1.0.0", 0, Some(w.natguard(json!({}))));
    let chain = w.chain(list.clone());
    let mut all = Vec::new();
    for i in 0..pods {
        all.push(w.add_pod(&chain, &format!("p{i}"), "default"));
    }
    let probe = &all[all.len() / 2];
    assert_eq!(http_get(&probe.ns, sa(META4, HTTP_PORT)), body("proxy"));
    let netd = w.dir().join("net.d");
    fs::create_dir_all(&netd).unwrap();
    fs::write(
        netd.join("10-repair.conflist"),
        serde_json::to_vec_pretty(&list).unwrap(),
    )
    .unwrap();
    let entry = list["plugins"][1].clone();
    let cg = CpuCgroup::new();
    let watcher = Watcher::spawn(
        &w,
        &entry,
        &w.cache_dir().join("results"),
        &[],
        "watcher.log",
    );
    // The start (its adopt of every pod) is not what is measured: the watcher joins the cgroup
    // once self-repair runs, with all its threads.
    watcher.wait_for("self-repair to subscribe", START_DEADLINE, || {
        watcher.state().is_some()
    });
    watcher.wait_for("the first adopt", START_DEADLINE, || {
        watcher.log_text().contains("natguard adopt: done")
    });
    let repairs = || {
        watcher
            .state()
            .and_then(|s| s["repairs"].as_u64())
            .unwrap_or(0)
    };
    let mut report = String::new();
    for (limit, request) in phases() {
        cg.set(limit, request);
        cg.join(watcher.pid());
        let (mut own, mut seen) = (Vec::new(), Vec::new());
        let throttled_before = cg.throttled();
        let cpu_before = cpu_ms(watcher.pid());
        for run in 0..flushes {
            // Apart by more than the burst bound, so each flush is a burst of its own.
            std::thread::sleep(Duration::from_millis(400));
            let before = repairs();
            let started = Instant::now();
            w.node.run(&["nft", "flush", "ruleset"]);
            loop {
                match http_get(&probe.ns, sa(META4, HTTP_PORT)) {
                    o if o == body("proxy") => break,
                    // The window (the real server), or a request cut by the repair's commit.
                    o if o == body("cloud") || o == Outcome::Refused => {}
                    o => panic!("run {run}: unexpected outcome {o:?}"),
                }
                assert!(
                    started.elapsed() < DEADLINE,
                    "run {run}: not repaired within {DEADLINE:?}; log:\n{}",
                    watcher.log_text()
                );
            }
            seen.push(started.elapsed().as_secs_f64() * 1000.0);
            watcher.wait_for("the repair's record", DEADLINE, || repairs() > before);
            own.push(watcher.state().unwrap()["lastRepairMs"].as_f64().unwrap());
        }
        let throttled = cg.throttled();
        // The CPU a repair costs, whatever the machine's load: what a quota is spent on.
        let cpu = (cpu_ms(watcher.pid()) - cpu_before) / flushes as f64;
        let (om, ow) = median_and_worst(own);
        let (sm, sw) = median_and_worst(seen);
        let limit_text = limit.map_or("no CPU limit".to_string(), |m| format!("limits.cpu {m}m"));
        let line = format!(
            "repair of {pods} pods, {flushes} flushes, watcher in a cgroup with {limit_text}, \
             requests.cpu {request}m ({}):\n  \
             first notification -> committed (watcher's clock): median {om:.1} ms, worst {ow:.1} ms\n  \
             start of the flush -> pod proxied again: median {sm:.1} ms, worst {sw:.1} ms\n  \
             throttled: {} period(s), {:.1} ms; the watcher's CPU per repair: {cpu:.1} ms\n",
            cg.dir.display(),
            throttled.0 - throttled_before.0,
            throttled.1 - throttled_before.1
        );
        eprint!("{line}");
        report.push_str(&line);
    }
    let log = watcher.log_text();
    assert!(!log.contains("repair failed"), "{log}");
    println!("{report}");
    drop(watcher);
}
