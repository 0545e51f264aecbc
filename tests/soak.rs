//! A node that lives for months: tens of thousands of distinct pod addresses pass through it,
//! Calico/AWS-VPC-style (/32 and /128, a routed host interface per pod) and bridge-style (/24
//! and /64 behind one bridge), 16 invocations at a time. Nothing natguard keeps may grow with
//! that history, only with what is alive, and no call may hang.
//!
//! Checked: every ADD and DEL exits 0 within its deadline; while the churn runs, the per-pod
//! elements never exceed what the live pods need; afterwards natguard's tables hold only the
//! network's shared objects; no process natguard started is left (no zombie of ours); nothing
//! but the lock and the conntrack IPv6 filter probe's per-boot verdict is left in natguard's
//! runtime directory; and a GC of thousands of stale attachments returns and removes them all.
//!
//! natguard's runtime directory is the test's own: every invocation runs in a private mount
//! namespace with a directory of the test mounted over /run/natguard, so the machine's
//! /run/natguard is never read, and a readiness file that `natguard install` left there on
//! this machine changes nothing.
//!
//! CI runs 2,000 ADD/DEL cycles; `NATGUARD_SOAK_CYCLES=20000 cargo test --release --test soak`
//! is the full run (scripts/bench.sh documents it). Needs root; never skips.

mod common;

use common::run::Natguard;
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const NET: &str = "soak";
const PARALLEL: usize = 16;
/// A bound for one call to return: far above what a call takes, only there to catch a hang.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

fn cycles() -> usize {
    std::env::var("NATGUARD_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn cfg() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "natguard",
        "metadata": {
            "proxyIPv4": "192.0.2.10",
            "proxyIPv6": "2001:db8::10",
            "exemptNamespaces": ["kube-system"]
        }
    })
}

/// Pod `i`: even ones Calico-style (/32, own routed interface), odd ones bridge-style (/24
/// behind `cni0`); every seventh in an exempt namespace. Addresses are distinct for every `i`.
struct SoakPod {
    i: usize,
    netns: String,
}

impl SoakPod {
    fn calico(&self) -> bool {
        self.i.is_multiple_of(2)
    }
    fn cid(&self) -> String {
        format!("soak{:08x}", self.i)
    }
    fn namespace(&self) -> &'static str {
        if self.i.is_multiple_of(7) {
            "kube-system"
        } else {
            "default"
        }
    }
    fn prev(&self) -> Value {
        let i = self.i;
        let (v4, v6, host) = if self.calico() {
            (
                format!("10.{}.{}.{}/32", 200 + (i >> 16), (i >> 8) & 255, i & 255),
                format!("fd00:5::{:x}/128", i + 1),
                vec![json!({ "name": format!("cali{:08x}", i) })],
            )
        } else {
            (
                format!("10.{}.{}.{}/24", 100 + (i >> 16), (i >> 8) & 255, i & 255),
                format!("fd00:6::{:x}/64", i + 1),
                vec![
                    json!({ "name": "cni0" }),
                    json!({ "name": format!("veth{:08x}", i) }),
                ],
            )
        };
        let mut interfaces = host;
        interfaces.push(json!({ "name": "eth0", "sandbox": self.netns }));
        let idx = interfaces.len() - 1;
        json!({
            "cniVersion": "1.1.0",
            "interfaces": interfaces,
            "ips": [
                { "address": v4, "interface": idx },
                { "address": v6, "interface": idx }
            ]
        })
    }
}

/// natguard's runtime directory as invocations see it.
const RUN_DIR: &str = "/run/natguard";

/// Runs natguard `verb` for `pod` in `ns`, with `run` as its runtime directory; panics unless
/// it exits 0 within [`CALL_DEADLINE`].
fn call(
    ns: &Netns,
    run: &std::path::Path,
    verb: &str,
    pod: &SoakPod,
    with_prev: bool,
    durations: &Mutex<Vec<u128>>,
) {
    let mut conf = cfg();
    if with_prev {
        conf["prevResult"] = pod.prev();
    }
    let env = [
        ("CNI_COMMAND", verb.to_string()),
        ("CNI_CONTAINERID", pod.cid()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_NETNS", pod.netns.clone()),
        ("CNI_PATH", "/opt/cni/bin".into()),
        (
            "CNI_ARGS",
            format!(
                "K8S_POD_NAMESPACE={};K8S_POD_NAME=p{}",
                pod.namespace(),
                pod.i
            ),
        ),
    ];
    let started = Instant::now();
    Natguard::cni(&env, &serde_json::to_vec(&conf).unwrap())
        .bind_mount(run, RUN_DIR, common::run::Access::ReadWrite)
        .bound(CALL_DEADLINE)
        .run_in(ns)
        .succeeded();
    durations
        .lock()
        .unwrap()
        .push(started.elapsed().as_micros());
}

/// The number of elements of each natguard set in `ns`, both tables.
fn element_counts(ns: &Netns) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for family in ["inet", "bridge"] {
        let Ok(text) = ns.try_run(&["nft", "-j", "list", "table", family, "natguard"]) else {
            continue;
        };
        let v: Value = serde_json::from_str(&text).expect("nft -j output");
        for item in v["nftables"].as_array().unwrap() {
            if let Some(s) = item.get("set") {
                let n = s["elem"].as_array().map_or(0, Vec::len);
                out.insert(s["name"].as_str().unwrap().to_string(), n);
            }
        }
    }
    out
}

/// Elements of the sets that hold per-pod state (everything but the config's own sets).
fn per_pod_elements(counts: &BTreeMap<String, usize>) -> usize {
    const SHARED: [&str; 9] = [
        "-mproxy4",
        "-mproxy6",
        "-mguard4",
        "-mguard6",
        "-nomasq4",
        "-nomasq6",
        "-pxy4",
        "-pxy6",
        "-allowifs",
    ];
    // The node-wide sets derived from the networks' configs.
    const NODE_SHARED: [&str; 5] = ["guarded4", "guarded6", "proxies4", "proxies6", "allowedifs"];
    counts
        .iter()
        .filter(|(name, _)| {
            !SHARED.iter().any(|s| name.ends_with(s)) && !NODE_SHARED.contains(&name.as_str())
        })
        .map(|(_, n)| n)
        .sum()
}

/// Children of this test process that are zombies.
fn our_zombies() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        if field("PPid:").as_deref() == Some(&me)
            && field("State:").is_some_and(|s| s.starts_with('Z'))
        {
            out.push(field("Name:").unwrap_or_default());
        }
    }
    out
}

#[test]
fn months_of_churn_leave_only_what_is_alive() {
    let h = Harness::new("soak");
    require_tools(&["nft"]);
    let ns = h.netns("node");
    let netns_dir = h.dir().join("netns");
    std::fs::create_dir_all(&netns_dir).unwrap();
    let run = h.dir().join("run-natguard");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::create_dir_all(RUN_DIR).unwrap();
    let run = run.as_path();
    let total = cycles();
    let next = AtomicUsize::new(0);
    let durations = Mutex::new(Vec::new());
    let peak = AtomicUsize::new(0);
    let pod = |i: usize| {
        // A network namespace at the path, as a runtime's sandbox is (natguard's own: no
        // interface of the pod's is in it).
        let path = netns_dir.join(format!("p{i}"));
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink("/proc/self/ns/net", &path).unwrap();
        SoakPod {
            i,
            netns: path.display().to_string(),
        }
    };
    // Per live pod: its record, attachment and interface, and up to 6 address elements per
    // family; PARALLEL pods are alive at most at once, plus the shared bridge's element.
    let bound = PARALLEL * (3 + 2 * 6) + 1;
    // Workers still running: the sampler stops when they are all gone, panicked ones included,
    // so a failing worker fails the test instead of hanging it.
    let working = AtomicUsize::new(PARALLEL);
    struct Gone<'a>(&'a AtomicUsize);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| {
                let _gone = Gone(&working);
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= total {
                        return;
                    }
                    let p = pod(i);
                    call(&ns, run, "ADD", &p, true, &durations);
                    // Now and then a DEL without prevResult (0.3.x lists, a lost cache).
                    call(&ns, run, "DEL", &p, !i.is_multiple_of(5), &durations);
                    let _ = std::fs::remove_file(&p.netns);
                }
            });
        }
        s.spawn(|| {
            while working.load(Ordering::SeqCst) > 0 {
                let n = per_pod_elements(&element_counts(&ns));
                peak.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    });
    let calls = durations.lock().unwrap().len();
    assert_eq!(calls, 2 * total, "every ADD and DEL returned");
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= bound,
        "per-pod elements peaked at {peak} with at most {PARALLEL} pods alive (bound {bound})"
    );
    let counts = element_counts(&ns);
    assert_eq!(
        per_pod_elements(&counts),
        0,
        "after {total} ADD/DEL cycles with no pod left, per-pod state remains: {counts:?}"
    );
    assert!(our_zombies().is_empty(), "zombies: {:?}", our_zombies());
    let run_dir: Vec<String> = std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // The lock, the per-boot verdict of the conntrack IPv6 filter probe, and the one
        // record of the networks last found intact: files of fixed names, none per pod.
        .filter(|n| {
            n != "lock"
                && n != natguard::kernel::conntrack::ipv6_probe::CACHE_FILE
                && n != natguard::lock::VERIFIED_FILE
                && n != "ct.lock"
                // The conntrack pass's requests: one per invocation still running, so none.
                && !(n == "ct"
                    && std::fs::read_dir(run.join("ct")).is_ok_and(|mut d| d.next().is_none()))
        })
        .collect();
    assert!(
        run.join("lock").exists(),
        "natguard never used its runtime directory {}: the mount did not take",
        run.display()
    );
    assert!(
        run_dir.is_empty(),
        "left in natguard's runtime directory: {run_dir:?}"
    );
    let mut d = durations.lock().unwrap().clone();
    d.sort_unstable();
    eprintln!(
        "soak: {total} cycles, {calls} calls, median {} us, p99 {} us, max {} us, peak per-pod elements {peak}",
        d[d.len() / 2],
        d[d.len() * 99 / 100],
        d[d.len() - 1]
    );

    // A node whose runtime lost track of thousands of pods: GC removes them all, in one call.
    let stale = (cycles() / 2).max(1000);
    let base = total + 10;
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= stale {
                    return;
                }
                call(&ns, run, "ADD", &pod(base + k), true, &durations);
            });
        }
    });
    assert!(per_pod_elements(&element_counts(&ns)) >= stale);
    let mut gc = cfg();
    gc["cni.dev/valid-attachments"] = json!([]);
    let started = Instant::now();
    Natguard::cni(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
        &serde_json::to_vec(&gc).unwrap(),
    )
    .bind_mount(run, RUN_DIR, common::run::Access::ReadWrite)
    .bound(CALL_DEADLINE)
    .run_in(&ns)
    .succeeded();
    let counts = element_counts(&ns);
    assert_eq!(
        per_pod_elements(&counts),
        0,
        "GC of {stale} stale attachments left: {counts:?}"
    );
    eprintln!(
        "soak: GC of {stale} stale attachments took {} ms",
        started.elapsed().as_millis()
    );
}
