//! A node is guarded from its first pod: the node-wide metadata guard exists from `natguard
//! install` on, before any pod's ADD, on a node with no pod and no natguard network, and the
//! watcher keeps it there.
//!
//! The standard world with the REAL metadata server (it answers only on 169.254.169.254 and
//! fd00:ec2::254, and SYNs reaching it are counted in the cloud namespace). The watcher runs as
//! the real binary in the node namespace, in a private mount namespace with a directory of the
//! test over `/run/natguard`, with the test's netconf dir, bin dir and CNI cache, as in
//! `tests/repair.rs`. Cases:
//!
//! - **No pod, no natguard network.** The netconf dir is empty (the primary plugin has not
//!   written its list): `install --watch` puts the guard in place alone, a pod of a network
//!   natguard is not in is reset, and after `nft flush ruleset` the watcher restores the guard
//!   although it knows no pod, saying so in its log.
//! - **The boot order.** The watcher starts first (a node-bootstrap install); then the primary
//!   plugin writes its conflist and pods start at once, each through the list as it is at its
//!   start (a runtime reads it per pod), asking for metadata all along. No SYN ever reaches the
//!   real server; every pod ends up answered by the proxy once natguard's entry is in the list
//!   (ADD for the pods after it, adopt for the ones before). The window from the conflist write
//!   to natguard's entry is measured and printed; only a deadline bounds it.
//!
//! Needs root (network namespaces, nf_tables, mount namespaces); never skips.

mod common;

use common::attack::{is_real, real_world, Counters, SYN};
use common::watcher::Watcher;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long anything may take before the test fails (a deadline, not a timing claim). The
/// watcher adopts again 10 s after it wrote the list, for pods whose ADD was under way.
const DEADLINE: Duration = Duration::from_secs(40);

/// SYNs to the real metadata server, counted where they arrive.
fn syn_counters(w: &World) -> Counters {
    Counters::install(
        &w.h,
        &w.cloud,
        &[
            ("syn4", format!("ip daddr {META4} {SYN}")),
            ("syn6", format!("ip6 daddr {META6} {SYN}")),
        ],
    )
}

fn syns(c: &Counters) -> u64 {
    c.packets("syn4") + c.packets("syn6")
}

/// The watcher of these tests: over an initially empty netconf dir, waited for until its
/// self-repair watches.
impl Watcher {
    fn start(w: &World) -> Watcher {
        Watcher::start_with(w, &[])
    }

    fn start_with(w: &World, env: &[(&str, &str)]) -> Watcher {
        let results = w.cache_dir().join("results");
        let me = Watcher::spawn(w, &w.natguard(json!({})), &results, env, "watcher.log");
        me.wait_until("the watcher's self-repair", || {
            me.log_text().contains("self-repair: watching")
        });
        me
    }

    fn wait_until(&self, what: &str, f: impl FnMut() -> bool) {
        self.wait_for(what, deadline(DEADLINE), f)
    }
}

fn has_guard(w: &World) -> bool {
    w.table().is_some_and(|t| {
        [
            "chain guard_fwd",
            "chain guard_in",
            "chain judge4",
            "chain judge6",
        ]
        .iter()
        .all(|c| t.contains(c))
            && t.contains("reject with tcp reset")
    })
}

/// Both of the pod's metadata requests; each must not be answered by the real server.
fn assert_not_real(pod: &Pod, when: &str) {
    for dst in [sa(META4, HTTP_PORT), sa(META6, HTTP_PORT)] {
        let got = http_get(&pod.ns, dst);
        assert!(!is_real(&got), "{when}: {dst} answered by the REAL server");
        assert_eq!(got, Outcome::Refused, "{when}: {dst}");
    }
}

#[test]
fn the_guard_exists_from_install_on_a_node_with_no_pod_and_no_natguard_network() {
    let w = real_world("first-guard");
    let counters = syn_counters(&w);
    assert!(w.table().is_none(), "no natguard table before install");
    // As a systemd unit of Type=notify runs it: the runtime and the kubelet start once the
    // watcher says READY=1.
    let notify = w.dir().join("notify.sock");
    let sd = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    sd.set_read_timeout(Some(deadline(DEADLINE))).unwrap();
    let watcher = Watcher::start_with(&w, &[("NOTIFY_SOCKET", notify.to_str().unwrap())]);
    let mut buf = [0u8; 64];
    let n = sd.recv(&mut buf).expect("READY=1 from the watcher");
    assert_eq!(&buf[..n], b"READY=1");
    // Nothing lists natguard: the guard alone, from natguard's entry, before READY=1.
    assert!(has_guard(&w), "no guard after install: {:?}", w.table());
    assert!(
        watcher
            .log_text()
            .contains("the node-wide metadata guard is in place"),
        "{}",
        watcher.log_text()
    );
    let table = w.table().unwrap();
    assert!(
        !table.contains("-dnat") && !table.contains("-redir4"),
        "no network's objects without a network:\n{table}"
    );

    // A pod of a network natguard is not in (its list was written by another agent, without
    // natguard, and the watcher's entry is not in it yet: here the list is not even in the
    // watched dir).
    let plain = w.chain(w.list("plain", "1.0.0", 0, None));
    let pod = w.add_pod(&plain, "early", "default");
    assert_not_real(&pod, "a pod natguard never saw, after install");

    // Someone flushes the ruleset: the watcher knows no pod and no natguard network, and
    // restores the guard all the same.
    w.node.run(&["nft", "flush", "ruleset"]);
    watcher.wait_until("the guard restored after the flush", || has_guard(&w));
    watcher.wait_until("the repair logged", || {
        watcher
            .log_text()
            .contains("restored the node-wide metadata guard (no conflist lists natguard yet)")
    });
    assert_not_real(
        &pod,
        "a pod natguard never saw, after the flush was repaired",
    );
    assert_eq!(
        syns(&counters),
        0,
        "SYNs reached the REAL metadata server; watcher log:\n{}",
        watcher.log_text()
    );
}

/// The runtime's view of the netconf dir at one pod's start: the first list by name, as
/// libcni picks it.
fn active_list(netd: &Path) -> Value {
    let mut names: Vec<PathBuf> = fs::read_dir(netd)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
        .collect();
    names.sort();
    let path = names.first().expect("a conflist");
    // The watcher replaces the file atomically: a read sees the old list or the new one.
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn lists_natguard(list: &Value) -> bool {
    list["plugins"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["type"] == "natguard"))
}

#[test]
fn boot_order_no_pod_reaches_the_real_api_and_every_pod_gets_its_policy() {
    const PODS: usize = 6;
    let w = real_world("first-boot");
    let counters = syn_counters(&w);
    let watcher = Watcher::start(&w);
    assert!(has_guard(&w), "no guard before the primary's list");

    // The primary plugin's agent writes its list (bridge + host-local, no natguard), and the
    // kubelet starts pods at once.
    let primary = w.list("boot", "1.0.0", 0, None);
    let list_path = watcher.netd.join("10-boot.conflist");
    let tmp = watcher.netd.join(".10-boot.conflist.tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(&primary).unwrap()).unwrap();
    let written = Instant::now();
    fs::rename(&tmp, &list_path).unwrap();

    let mut window: Option<Duration> = None;
    let outcomes = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let deadline = Instant::now() + deadline(DEADLINE);
            loop {
                if lists_natguard(&active_list(&watcher.netd)) {
                    return Some(written.elapsed());
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let pods: Vec<_> = (0..PODS)
            .map(|i| {
                let (w, netd) = (&w, &watcher.netd);
                s.spawn(move || {
                    // Pods start spread over the first second after the list appeared: some
                    // before natguard's entry is in it, some after.
                    std::thread::sleep(Duration::from_millis(200 * i as u64));
                    let list = active_list(netd);
                    let with_natguard = lists_natguard(&list);
                    let chain = w.chain(list);
                    let pod = w.add_pod(&chain, &format!("boot{i}"), "default");
                    // The pod asks for metadata until the proxy answers, twice in a row.
                    let deadline = Instant::now() + deadline(DEADLINE);
                    let mut seen: Vec<Outcome> = Vec::new();
                    let mut proxied = 0;
                    while proxied < 2 {
                        assert!(
                            Instant::now() < deadline,
                            "pod boot{i} never got its policy: {seen:?}"
                        );
                        let got = http_get(&pod.ns, sa(META4, HTTP_PORT));
                        proxied = if got == body("proxy") { proxied + 1 } else { 0 };
                        if seen.last() != Some(&got) {
                            seen.push(got);
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    let got6 = http_get(&pod.ns, sa(META6, HTTP_PORT));
                    (i, with_natguard, seen, got6)
                })
            })
            .collect();
        window = watch.join().unwrap();
        pods.into_iter()
            .map(|p| p.join().unwrap())
            .collect::<Vec<_>>()
    });
    let window = window.unwrap_or_else(|| {
        panic!(
            "natguard's entry never appeared in the list; watcher log:\n{}",
            watcher.log_text()
        )
    });
    eprintln!(
        "window from the primary's conflist write to natguard's entry in it: {:.1} ms",
        window.as_secs_f64() * 1e3
    );
    for (i, with_natguard, seen, got6) in &outcomes {
        eprintln!(
            "pod boot{i}: started with natguard in its list: {with_natguard}; answers: {seen:?}"
        );
        assert!(
            !seen.iter().any(is_real),
            "pod boot{i} reached the REAL server: {seen:?}"
        );
        assert_eq!(got6, &body("proxy"), "pod boot{i} over IPv6");
    }
    // The first pod reads the list at once; the watcher waits for the dir to settle (100 ms
    // of quiet) before it writes: so the case this test is about happened.
    assert!(
        outcomes.iter().any(|o| !o.1),
        "every pod started with natguard in its list; no pod ran in the window"
    );
    assert_eq!(
        syns(&counters),
        0,
        "SYNs reached the REAL metadata server; watcher log:\n{}",
        watcher.log_text()
    );
}

/// The node-bootstrap unit: valid for systemd (`systemd-analyze verify` prints nothing), of
/// `Type=notify` (the watcher's READY=1 above), ordered before the runtimes and the kubelet,
/// running the watcher.
#[test]
fn the_node_unit_is_valid_and_ordered_before_the_runtime_and_the_kubelet() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = fs::read_to_string(repo.join("deploy/node/natguard.service")).unwrap();
    let key = |k: &str| -> String {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{k}=")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(key("Type"), "notify");
    for before in ["containerd.service", "crio.service", "kubelet.service"] {
        assert!(
            key("Before").split(' ').any(|b| b == before),
            "Before= lacks {before}"
        );
    }
    assert!(
        key("ExecStart").starts_with("/usr/local/bin/natguard install --watch"),
        "{}",
        key("ExecStart")
    );
    // Verified with the binary under test in place of /usr/local/bin/natguard.
    let dir = std::env::temp_dir().join(format!("ng-unit-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("natguard.service");
    fs::write(
        &copy,
        unit.replace("/usr/local/bin/natguard", natguard_bin().to_str().unwrap()),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze (package systemd)");
    let _ = fs::remove_dir_all(&dir);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}
