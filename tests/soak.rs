//! A node that lives for months: tens of thousands of distinct pod addresses pass through it,
//! Calico/AWS-VPC-style (/32 and /128, a routed host interface per pod) and bridge-style (/24
//! and /64 behind one bridge), 16 invocations at a time, while one pod stays alive throughout.
//! The cycles vary as a runtime's do: DELs with and without prevResult (0.3.x lists, a lost
//! cache) and without a netns (CRI's second DEL), an ADD repeated before its DEL, a DEL that
//! comes twice (CRI retries, kubelet GC), and some attachments are a pod's second interface.
//! Nothing natguard keeps may grow with that history, only with what is alive, and no call may
//! hang.
//!
//! Checked: every ADD and DEL exits 0 within its deadline and every ADD passes the prevResult
//! on; while the churn runs, the per-pod elements never exceed what the live pods need;
//! afterwards natguard's table is byte-identical to what it was with the long-lived pod alone,
//! conntrack is unchanged, and the per-pod sets hold exactly that pod's entries (the model of
//! `common::synthetic`); once it is deleted too, only the network's shared objects are left;
//! no process natguard started is left (no zombie of ours); nothing but the lock and fixed-name
//! records is left in natguard's runtime directory; and a GC of thousands of stale attachments
//! returns and removes them all.
//!
//! natguard's runtime directory is the test's own: every invocation runs in the private node
//! state `common::run` gives the test's network namespace, so the machine's /run/natguard is
//! never read or written, and a readiness file that `natguard install` left there on this
//! machine changes nothing.
//!
//! CI runs 2,000 ADD/DEL cycles; `NATGUARD_SOAK_CYCLES=20000 cargo test --release --test soak`
//! is the full run (scripts/bench.sh documents it). Needs root; never skips.

mod common;

use common::run::{node_dir, Natguard};
use common::synthetic::{
    add, assert_pods_exactly, cfg_a, del, gc_invocation, must_state, stdin_of, SynPod, NET,
};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PARALLEL: usize = 16;
/// A bound for one call to return: far above what a call takes, only there to catch a hang.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

fn cycles() -> usize {
    std::env::var("NATGUARD_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Pod `i`: even ones Calico-style (/32, own routed interface), odd ones bridge-style (/24
/// behind `cni0`); every seventh in an exempt namespace, and another seventh attached as a
/// second interface. Addresses are distinct for every `i`.
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
    /// Some pods' attachment is a second interface (Multus).
    fn ifname(&self) -> &'static str {
        if self.i % 7 == 3 {
            "net1"
        } else {
            "eth0"
        }
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
        interfaces.push(json!({ "name": self.ifname(), "sandbox": self.netns }));
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

/// What a DEL is sent with.
#[derive(Clone, Copy, PartialEq)]
enum Del {
    /// The pod's prevResult, as a runtime with a result cache sends it.
    Cached,
    /// No prevResult (a 0.3.x list, a lost cache).
    NoPrev,
    /// No prevResult and no netns (CRI's second DEL).
    Bare,
}

/// Pod `i`'s calls after its ADD: one DEL each, of every kind, and now and then a second ADD
/// before the DEL or a second DEL after it.
fn cycle(i: usize) -> Vec<(&'static str, Del)> {
    // Now and then a DEL without prevResult.
    let del = if i.is_multiple_of(5) {
        Del::NoPrev
    } else {
        Del::Cached
    };
    match i % 4 {
        0 => vec![("DEL", del)],
        1 => vec![("DEL", Del::Bare)],
        2 => vec![("ADD", Del::Cached), ("DEL", del)],
        _ if i % 8 == 3 => vec![("DEL", del), ("DEL", Del::Cached)],
        _ => vec![("DEL", del)],
    }
}

/// Runs natguard `verb` for `pod` in `ns` under `cfg` (an ADD always with the prevResult);
/// panics unless it exits 0 within [`CALL_DEADLINE`], and unless an ADD's reply passes the
/// prevResult on.
fn call(
    ns: &Netns,
    cfg: &Value,
    verb: &str,
    pod: &SoakPod,
    shape: Del,
    durations: &Mutex<Vec<u128>>,
) {
    let prev = (verb == "ADD" || shape == Del::Cached).then(|| pod.prev());
    let netns = if verb == "DEL" && shape == Del::Bare {
        String::new()
    } else {
        pod.netns.clone()
    };
    let env = [
        ("CNI_COMMAND", verb.to_string()),
        ("CNI_CONTAINERID", pod.cid()),
        ("CNI_IFNAME", pod.ifname().into()),
        ("CNI_NETNS", netns),
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
    let inv = Natguard::cni(&env, &stdin_of(cfg, NET, prev.clone()))
        .bound(CALL_DEADLINE)
        .run_in(ns)
        .succeeded();
    durations
        .lock()
        .unwrap()
        .push(started.elapsed().as_micros());
    if verb == "ADD" {
        let (reply, prev) = (inv.reply(), prev.unwrap());
        assert_eq!(
            reply["ips"], prev["ips"],
            "ADD must pass the result on: {inv}"
        );
        assert_eq!(reply["interfaces"], prev["interfaces"], "{inv}");
    }
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
    require_tools(&["nft", "conntrack"]);
    let ns = h.netns("node");
    let cfg = cfg_a();
    let netns_dir = h.dir().join("netns");
    std::fs::create_dir_all(&netns_dir).unwrap();
    // natguard's /run/natguard in the node state of `ns`.
    let run = node_dir(&ns).join("run").join("natguard");
    let run = run.as_path();
    // The long-lived pod: its ADD also creates the network's shared objects.
    let anchor = SynPod::numbered("anchor", 0, 9);
    add(&ns, &cfg, &anchor).succeeded();
    let table_before = nft_table(&ns).expect("table after the first ADD");
    let counts_before = element_counts(&ns);
    let ct_before = conntrack_list(&ns, &[]);
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
    // family; PARALLEL pods and the long-lived one are alive at most at once, plus the shared
    // bridge's element.
    let bound = (PARALLEL + 1) * (3 + 2 * 6) + 1;
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
                    call(&ns, &cfg, "ADD", &p, Del::Cached, &durations);
                    for (verb, shape) in cycle(i) {
                        call(&ns, &cfg, verb, &p, shape, &durations);
                    }
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
    let want_calls: usize = (0..total).map(|i| 1 + cycle(i).len()).sum();
    assert_eq!(calls, want_calls, "every ADD and DEL returned");
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= bound,
        "per-pod elements peaked at {peak} with at most {PARALLEL} pods and the long-lived one \
         alive (bound {bound})"
    );
    assert_eq!(
        nft_table(&ns).expect("table after churn"),
        table_before,
        "{total} ADD/DEL cycles changed natguard's table"
    );
    assert_eq!(
        element_counts(&ns),
        counts_before,
        "{total} ADD/DEL cycles changed the number of elements of natguard's sets"
    );
    assert_eq!(
        conntrack_list(&ns, &[]),
        ct_before,
        "churn changed conntrack"
    );
    assert_pods_exactly(
        &must_state(&ns),
        std::slice::from_ref(&anchor),
        "after churn",
    );
    del(&ns, &cfg, &anchor).succeeded();
    let counts = element_counts(&ns);
    assert_eq!(
        per_pod_elements(&counts),
        0,
        "after {total} ADD/DEL cycles with no pod left, per-pod state remains: {counts:?}"
    );
    assert!(our_zombies().is_empty(), "zombies: {:?}", our_zombies());
    let run_dir: Vec<String> = std::fs::read_dir(run)
        .unwrap_or_else(|e| panic!("natguard's runtime directory {}: {e}", run.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // The lock, the per-boot verdict of the conntrack IPv6 filter probe and the one
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
        "natguard never used its runtime directory {}",
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
                call(&ns, &cfg, "ADD", &pod(base + k), Del::Cached, &durations);
            });
        }
    });
    assert!(per_pod_elements(&element_counts(&ns)) >= stale);
    let started = Instant::now();
    gc_invocation(NET, &cfg, &[])
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
