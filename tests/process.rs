//! Root tests of natguard as a process, seen from the runtime that started it: nothing it
//! started outlives it, no descriptor it inherited stays open after it exits, and a pid limit
//! does not make it skip work.
//!
//! * A subreaper that reaps only its own children (conmon's model) is a small Python helper:
//!   `prctl(PR_SET_CHILD_SUBREAPER)`, run natguard, wait for that pid only, then list its own
//!   children in /proc. Anything natguard left behind would be reparented to it.
//! * An inherited pipe (fd 6, no CLOEXEC) must read end-of-file as soon as natguard is reaped
//!   (checked from a Python helper too, a process with no other thread that could hold a copy).
//! * A pids cgroup at its limit (created for the test and removed after; cgroup v2 when the
//!   pids controller is there, else the v1 pids hierarchy) must not cost the pod its IPv6
//!   conntrack cleanup.
//!
//! Each test runs natguard in a network namespace of its own. Needs root; never skips.

mod common;

use common::run::Seccomp;
use common::synthetic::{fixed_proxy_cfg, stdin_of, SynPod};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const NET: &str = "pnet";

/// Pod `cid` with these addresses, on eth0, no CNI_ARGS, a prevResult with the pod's interface
/// only.
fn pod(cid: &str, v4: &str, v6: &str) -> SynPod {
    SynPod::new(NET, cid, v4.parse().unwrap(), v6.parse().unwrap())
        .without_k8s_args()
        .without_host_iface()
}

fn cfg() -> Value {
    fixed_proxy_cfg(json!({}))
}

/// The subreaper: sets PR_SET_CHILD_SUBREAPER, joins the namespace, runs each invocation
/// (argv JSON: [[env, stdin], ...]), waiting for natguard's own pid only, and prints the exit
/// codes and then its own children (pid, state) once any leftover had time to exit.
const SUBREAPER: &str = r#"
import ctypes, json, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl: errno %d" % ctypes.get_errno())
fd = os.open(sys.argv[2], os.O_RDONLY)
if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
    sys.exit("setns: errno %d" % ctypes.get_errno())
codes = []
for env, stdin in json.loads(sys.argv[3]):
    p = subprocess.Popen([sys.argv[1]], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(stdin.encode())  # waitpid(p.pid) only
    codes.append([p.returncode, out.decode(), err.decode()])
time.sleep(0.3)  # a leftover child would have exited by now: a zombie nobody reaps
me = str(os.getpid())
children = []
for d in os.listdir("/proc"):
    if not d.isdigit():
        continue
    try:
        stat = open("/proc/%s/stat" % d).read()
    except OSError:
        continue
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[1] == me:
        children.append([int(d), fields[0]])
print(json.dumps({"codes": codes, "children": children}))
"#;

#[test]
fn under_a_subreaper_that_reaps_only_its_children_nothing_is_left() {
    let h = Harness::new("proc-reaper");
    let ns = h.netns("node");
    let mut all = Vec::new();
    for i in 0..10 {
        let p = pod(
            &format!("reap{i}"),
            &format!("10.64.0.{}", i + 2),
            &format!("fd00:7::{}", i + 2),
        );
        if let Value::Array(c) = calls(&["ADD", "DEL"], &p) {
            all.extend(c);
        }
    }
    let out = output(
        run::in_node_state(&mut Command::new("python3"), &ns)
            .arg("-c")
            .arg(SUBREAPER)
            .arg(natguard_bin())
            .arg(ns.path())
            .arg(Value::from(all).to_string()),
    );
    assert!(
        out.status.success(),
        "subreaper helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("helper output");
    for c in r["codes"].as_array().unwrap() {
        assert_eq!(c[0], 0, "natguard failed under the subreaper: {c}");
    }
    assert_eq!(
        r["children"],
        json!([]),
        "processes natguard left behind (reparented to the subreaper, never reaped)"
    );
}

/// The runtime's side of an inherited descriptor, in a process of its own (no other thread
/// can fork a copy of the pipe): a pipe's write end as fd 6 without CLOEXEC, natguard started
/// and waited for, the parent's copy closed, then one non-blocking read of the read end.
/// Prints, per invocation, natguard's exit code and what that read returned.
const FD_HELPER: &str = r#"
import ctypes, errno, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[2], os.O_RDONLY)
if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
    sys.exit("setns: errno %d" % ctypes.get_errno())
os.close(fd)
out = []
for env, stdin in json.loads(sys.argv[3]):
    r, w = os.pipe()
    os.dup2(w, 6)  # inheritable, unlike os.pipe()'s own descriptors
    os.close(w)
    p = subprocess.Popen([sys.argv[1]], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(6,))
    os.close(6)
    so, se = p.communicate(stdin.encode())  # natguard has exited and been reaped
    os.set_blocking(r, False)
    try:
        seen = "eof" if os.read(r, 16) == b"" else "data"
    except BlockingIOError:
        seen = "still open"
    os.close(r)
    out.append([p.returncode, seen, so.decode(), se.decode()])
print(json.dumps(out))
"#;

/// The invocations of `verbs` for one pod, as the helpers' JSON argument.
fn calls(verbs: &[&str], p: &SynPod) -> Value {
    let stdin = String::from_utf8(stdin_of(&cfg(), NET, Some(p.result()))).unwrap();
    verbs
        .iter()
        .map(|verb| {
            let env: serde_json::Map<String, Value> = p
                .env(verb)
                .into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect();
            json!([env, stdin])
        })
        .collect()
}

#[test]
fn an_inherited_descriptor_reaches_eof_when_natguard_exits() {
    let h = Harness::new("proc-fds");
    let ns = h.netns("node");
    let p = pod("fds", "10.64.0.9", "fd00:7::9");
    let out = output(
        run::in_node_state(&mut Command::new("python3"), &ns)
            .arg("-c")
            .arg(FD_HELPER)
            .arg(natguard_bin())
            .arg(ns.path())
            .arg(calls(&["ADD", "DEL", "ADD", "DEL"], &p).to_string()),
    );
    assert!(
        out.status.success(),
        "fd helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("helper output");
    for (i, c) in r.as_array().unwrap().iter().enumerate() {
        assert_eq!(c[0], 0, "invocation {i} failed: {c}");
        assert_eq!(
            c[1], "eof",
            "invocation {i}: fd 6 was still open after natguard exited and was reaped: {c}"
        );
    }
}

/// A pids cgroup made for one test, removed when dropped.
struct PidsCgroup {
    dir: PathBuf,
}

impl PidsCgroup {
    /// A child of the first hierarchy with the pids controller: the cgroup v2 root (when the
    /// controller is enabled for its children), else the v1 `pids` hierarchy.
    fn new(name: &str, max: u32) -> PidsCgroup {
        let v2_roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
        let v2 = v2_roots.iter().find(|r| {
            fs::read_to_string(format!("{r}/cgroup.subtree_control"))
                .is_ok_and(|s| s.split_whitespace().any(|c| c == "pids"))
        });
        let parent = match v2 {
            Some(r) => PathBuf::from(r),
            None => {
                let v1 = Path::new("/sys/fs/cgroup/pids");
                assert!(
                    v1.join("cgroup.procs").exists(),
                    "no pids controller: neither a cgroup v2 root delegating pids nor a v1 pids hierarchy"
                );
                v1.to_path_buf()
            }
        };
        let dir = parent.join(format!("ng-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        fs::write(dir.join("pids.max"), max.to_string()).expect("set pids.max");
        PidsCgroup { dir }
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// How many forks the limit refused (`max` in `pids.events`).
    fn refusals(&self) -> u64 {
        let ev = fs::read_to_string(self.dir.join("pids.events")).expect("read pids.events");
        ev.lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|n| n.trim().parse().ok())
            .expect("pids.events has a max line")
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        // The processes in it have exited; wait briefly for the kernel to let go of them.
        for _ in 0..200 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// With the pids limit reached natguard can start no thread, so the IPv6 conntrack walk, which
/// normally runs on a thread of its own, runs inline: ADD succeeds (conntrack failures never
/// fail a verb, and here nothing fails) and the pod's entries of both families are gone.
#[test]
fn at_the_pids_limit_a_dual_stack_add_still_deletes_the_ipv6_entries() {
    require_tools(&["conntrack"]);
    let h = Harness::new("proc-pids");
    let ns = h.netns("node");
    let (pod4, pod6) = ("10.64.0.33", "fd00:7::33");
    // The pod's flows, both directions and families, and unrelated ones that must stay.
    let pod_flows: [&[&str]; 4] = [
        &[
            "-p",
            "tcp",
            "-s",
            pod6,
            "-d",
            "fd00:99::1",
            "--sport",
            "40000",
            "--dport",
            "443",
            "--state",
            "ESTABLISHED",
        ],
        &[
            "-p",
            "tcp",
            "-s",
            "fd00:99::1",
            "-d",
            pod6,
            "--sport",
            "40001",
            "--dport",
            "22",
            "--state",
            "ESTABLISHED",
        ],
        &[
            "-p", "udp", "-s", pod4, "-d", "11.0.0.1", "--sport", "40000", "--dport", "53",
        ],
        &[
            "-p", "udp", "-s", "11.0.0.1", "-d", pod4, "--sport", "40001", "--dport", "53",
        ],
    ];
    let others: [&[&str]; 2] = [
        &[
            "-p",
            "tcp",
            "-s",
            "fd00:7::34",
            "-d",
            "fd00:99::1",
            "--sport",
            "40000",
            "--dport",
            "443",
            "--state",
            "ESTABLISHED",
        ],
        &[
            "-p",
            "udp",
            "-s",
            "10.64.0.34",
            "-d",
            "11.0.0.1",
            "--sport",
            "40000",
            "--dport",
            "53",
        ],
    ];
    for f in pod_flows.iter().chain(others.iter()) {
        conntrack_insert(&ns, f);
    }
    assert_eq!(conntrack_count(&ns, &[]), 6);

    let cg = PidsCgroup::new("pids", 1);
    let ran = pod("pids", pod4, pod6)
        .invocation("ADD", &cfg())
        .join_cgroup(&cg.procs())
        .run_in(&ns);
    // The limit did bite: natguard tried to start a thread (the IPv6 walk) and was refused.
    let refused = cg.refusals();
    drop(cg);
    assert!(
        refused > 0,
        "the pids limit refused nothing; the test did not test anything (stderr: {})",
        ran.stderr
    );
    // README, "CNI contract": conntrack failures never fail a verb. So the ADD succeeds, and
    // the walk that could not get a thread ran inline: the pod's entries of both families are
    // gone and the unrelated ones stay.
    assert_eq!(
        ran.exit,
        Some(0),
        "ADD at the pids limit must succeed: {ran}"
    );
    let left = conntrack_list(&ns, &[]);
    assert_eq!(
        left.len(),
        2,
        "ADD left pod entries or deleted others: {left:#?}\nstderr: {}",
        ran.stderr
    );
    for l in &left {
        assert!(
            !mentions(l, pod4) && !mentions(l, pod6),
            "pod entry left: {l}\nstderr: {}",
            ran.stderr
        );
    }
}

/// A seccomp program that lets every system call through except `io_uring_setup`, which gets
/// `action` (classic BPF over `seccomp_data`: `nr` at offset 0, `arch` at 4).
fn io_uring_setup_filter(action: u32) -> Seccomp {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000;
    let f = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    Seccomp::program(vec![
        f(LD_W_ABS, 0, 0, 4),
        f(JEQ_K, 0, 3, AUDIT_ARCH),
        f(LD_W_ABS, 0, 0, 0),
        f(JEQ_K, 0, 1, libc::SYS_io_uring_setup as u32),
        f(RET_K, 0, 0, action),
        f(RET_K, 0, 0, RET_ALLOW),
    ])
}

/// SECCOMP_RET_KILL_PROCESS: what systemd's `SystemCallFilter=` does to a forbidden call by
/// default, and some node images' runtime profiles.
const KILL_PROCESS: u32 = 0x8000_0000;
/// SECCOMP_RET_ERRNO with EPERM: a profile that refuses the call.
const ERRNO_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;

/// ADD then DEL of one pod under `filter` (or none), with a debug log; returns both
/// invocations and the log. natguard's lock directory is private (a directory of the test
/// mounted over /run/natguard).
fn add_del_logged(
    h: &Harness,
    ns: &Netns,
    tag: &str,
    filter: Option<&Seccomp>,
) -> (run::Invocation, run::Invocation, String) {
    let run_dir = h.dir().join(format!("run-{tag}"));
    fs::create_dir_all(&run_dir).unwrap();
    let log = h.dir().join(format!("{tag}.log"));
    let mut cfg = cfg();
    cfg["logFile"] = json!(log.to_str().unwrap());
    cfg["logLevel"] = json!("debug");
    let p = pod(tag, "10.64.1.2", "fd00:7::1:2");
    let verb = |v: &str| {
        let mut inv = p
            .invocation(v, &cfg)
            .bind_mount(&run_dir, "/run/natguard", run::Access::ReadWrite)
            .bound(Duration::from_secs(60));
        if let Some(f) = filter {
            inv = inv.seccomp(f);
        }
        inv.run_in(ns)
    };
    let add = verb("ADD");
    let table_after_add = nft_table(ns).unwrap_or_default();
    let del = verb("DEL");
    assert!(
        mentions(&table_after_add, "10.64.1.2"),
        "ADD installed nothing for the pod: {table_after_add}\n{add}"
    );
    let table_after_del = nft_table(ns).unwrap_or_default();
    assert!(
        !mentions(&table_after_del, "10.64.1.2"),
        "DEL left the pod's elements: {table_after_del}\n{del}"
    );
    (add, del, fs::read_to_string(&log).unwrap_or_default())
}

/// The plugin must never die after its reply because of how its sockets are released. Under
/// a seccomp filter that kills on `io_uring_setup` (systemd's `SystemCallFilter=`), and under
/// one that refuses it with EPERM, ADD and DEL exit 0 with the right reply and close their
/// netfilter sockets themselves, which the debug log says. Without a filter, the same ADD
/// and DEL hand the sockets over through io_uring (the positive control: the filters above
/// would be hit if natguard did not stay away from io_uring under seccomp).
#[test]
fn under_a_seccomp_filter_add_and_del_never_touch_io_uring_and_exit_0() {
    let h = Harness::new("proc-seccomp");
    require_tools(&["nft"]);
    let ns = h.netns("node");
    let (add, del, log) = add_del_logged(&h, &ns, "plain", None);
    let add = add.succeeded();
    del.succeeded();
    assert_eq!(
        add.reply()["ips"],
        pod("plain", "10.64.1.2", "fd00:7::1:2").result()["ips"]
    );
    let handed = log
        .lines()
        .filter(|l| l.contains("handed to the kernel through io_uring"))
        .count();
    assert_eq!(
        handed, 2,
        "ADD and DEL without a filter use io_uring: {log}"
    );

    for (tag, action) in [("kill", KILL_PROCESS), ("eperm", ERRNO_EPERM)] {
        let filter = io_uring_setup_filter(action);
        let (add, del, log) = add_del_logged(&h, &ns, tag, Some(&filter));
        assert_eq!(add.signal(), None, "ADD was killed ({tag}): {add}");
        assert_eq!(del.signal(), None, "DEL was killed ({tag}): {del}");
        let add = add.succeeded();
        del.succeeded();
        assert_eq!(
            add.reply()["ips"],
            pod(tag, "10.64.1.2", "fd00:7::1:2").result()["ips"],
            "{add}"
        );
        let closed = log
            .lines()
            .filter(|l| l.contains("closed here (the process runs under a seccomp filter)"))
            .count();
        assert_eq!(closed, 2, "ADD and DEL under {tag}: {log}");
        assert!(!log.contains("io_uring_setup"), "{log}");
    }
}
