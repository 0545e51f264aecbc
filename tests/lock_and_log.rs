//! Root tests of the node-wide lock and of the log: a held lock fails a verb with code 11 after
//! a bounded wait, an unusable lock lets DEL go on and fails ADD with code 5, a log file that
//! is not a regular file never blocks a verb, `logLevel` filters the file, and rotation at
//! `logFileMaxSize` loses no line and keeps both files within the cap under parallel
//! invocations.
//!
//! The lock is node-wide and other tests run in parallel on the same machine, so no test here
//! touches the real `/run/natguard`. Every natguard invocation runs in a mount namespace of its
//! own (unshared between fork and exec, with private propagation) in which a directory of the
//! test is bind-mounted on `/run/natguard`, read-only for the read-only cases. The test holds
//! that directory's lock, or turns it into a directory, a symlink or a FIFO, without anyone
//! else seeing it. Each invocation also runs in the test's network namespace, with the CNI
//! environment and a synthetic prevResult (`common::synthetic`).
//!
//! No assertion is on time: the bounds below only keep a hanging invocation from hanging the
//! test. Needs root; never skips.

mod common;

use common::run::{parallel, Access, Invocation, Natguard};
use common::synthetic::{fixed_proxy_cfg, gc_invocation, SynPod};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The network every test here uses.
const NET: &str = "lknet";
/// Where natguard keeps its lock; replaced by a private bind mount in every invocation.
const RUN_DIR: &str = "/run/natguard";
/// Upper bound for one invocation: natguard's lock wait (10 s) and then some. A bound against a
/// hang (a blocking open of a FIFO or a lock wait without a deadline), not a speed assertion.
const INVOCATION_BOUND: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Running natguard in the test's netns with a private /run/natguard
// ---------------------------------------------------------------------------------------------

/// The directory bind-mounted on /run/natguard for an invocation.
#[derive(Clone)]
struct RunDir {
    dir: PathBuf,
    access: Access,
}

impl RunDir {
    /// A fresh, empty, writable directory `<test dir>/<name>`.
    fn new(h: &Harness, name: &str) -> RunDir {
        let dir = h.dir().join(name);
        fs::create_dir_all(&dir).unwrap();
        RunDir {
            dir,
            access: Access::ReadWrite,
        }
    }

    fn read_only(mut self) -> RunDir {
        self.access = Access::ReadOnly;
        self
    }

    /// The file natguard sees as /run/natguard/lock.
    fn lock_path(&self) -> PathBuf {
        self.dir.join("lock")
    }
}

/// Runs `inv` in `ns` with `run` mounted on /run/natguard in a mount namespace of the child's
/// own (the test process never moves).
fn exec(ns: &Netns, run: &RunDir, inv: Natguard) -> Invocation {
    inv.bind_mount(&run.dir, RUN_DIR, run.access)
        .bound(INVOCATION_BOUND)
        .run_in(ns)
}

// ---------------------------------------------------------------------------------------------
// Synthetic pods and configs
// ---------------------------------------------------------------------------------------------

/// Pod `i` of the test `tag`: a container ID short enough to appear whole in log lines, eth0 and
/// a dual-stack address.
fn pod(tag: &str, i: u32) -> SynPod {
    let v4 = format!("10.77.{}.{}", i / 200, i % 200 + 10);
    let v6 = format!("fd00:77::{:x}", i + 16);
    SynPod::new(
        NET,
        &format!("{tag}{i:04}"),
        v4.parse().unwrap(),
        v6.parse().unwrap(),
    )
}

/// Proxy mode with fixed proxy addresses (no route lookups, so no warning).
fn cfg() -> Value {
    fixed_proxy_cfg(json!({
        "metadata": { "mode": "proxy" },
        "masquerade": { "nonMasqueradeCIDRs": non_masq() }
    }))
}

fn with(mut c: Value, key: &str, v: Value) -> Value {
    c[key] = v;
    c
}

fn add(ns: &Netns, run: &RunDir, cfg: &Value, p: &SynPod) -> Invocation {
    exec(ns, run, p.invocation("ADD", cfg))
}

fn del(ns: &Netns, run: &RunDir, cfg: &Value, p: &SynPod) -> Invocation {
    exec(ns, run, p.invocation("DEL", cfg))
}

fn check(ns: &Netns, run: &RunDir, cfg: &Value, p: &SynPod) -> Invocation {
    exec(ns, run, p.invocation("CHECK", cfg))
}

fn gc(ns: &Netns, run: &RunDir, cfg: &Value) -> Invocation {
    exec(ns, run, gc_invocation(NET, cfg, &[]))
}

/// Whether the kernel has any of the pod's entries (`nft list table inet natguard`).
fn has_entries(ns: &Netns, p: &SynPod) -> bool {
    let t = nft_table(ns).unwrap_or_default();
    mentions(&t, &p.v4.to_string()) || mentions(&t, &p.v6.to_string()) || t.contains(&p.owner())
}

fn assert_installed(ns: &Netns, p: &SynPod, when: &str) {
    let t = nft_table(ns).unwrap_or_default();
    assert!(
        mentions(&t, &p.v4.to_string())
            && mentions(&t, &p.v6.to_string())
            && t.contains(&p.owner()),
        "{when}: {}'s entries are missing:\n{t}",
        p.cid
    );
}

fn assert_removed(ns: &Netns, p: &SynPod, when: &str) {
    assert!(
        !has_entries(ns, p),
        "{when}: {}'s entries are still there:\n{}",
        p.cid,
        nft_table(ns).unwrap_or_default()
    );
}

/// A harness and its netns (every invocation sees a `/run` of the netns's own, where the
/// private bind mounts go; the host's /run/natguard is never touched).
fn setup(test: &str) -> (Harness, Netns) {
    let h = Harness::new(test);
    require_tools(&["nft"]);
    let ns = h.netns("node");
    (h, ns)
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        io::Error::last_os_error()
    );
}

// ---------------------------------------------------------------------------------------------
// The node-wide lock
// ---------------------------------------------------------------------------------------------

/// A lock held by another process: ADD and DEL both give up after natguard's bounded wait
/// with code 11 and a message naming the lock and saying it is busy, change nothing, and both
/// work once the holder lets go.
#[test]
fn held_lock_fails_add_and_del_with_code_11_until_released() {
    let (h, ns) = setup("lk-busy");
    let run = RunDir::new(&h, "run");
    let cfg = cfg();
    let p = pod("busy", 1);

    let holder = File::create(run.lock_path()).unwrap();
    holder.lock().expect("the test takes the private lock");
    let needles = ["/run/natguard/lock", "busy", "10 s"];
    add(&ns, &run, &cfg, &p).fails_with(11, &needles);
    assert_removed(&ns, &p, "ADD under a held lock");
    del(&ns, &run, &cfg, &p).fails_with(11, &needles);
    drop(holder);

    add(&ns, &run, &cfg, &p).succeeded();
    assert_installed(&ns, &p, "ADD after the release");
    del(&ns, &run, &cfg, &p).succeeded();
    assert_removed(&ns, &p, "DEL after the release");
}

/// What can be at /run/natguard/lock that cannot be locked.
#[derive(Clone, Copy, Debug)]
enum Unusable {
    Directory,
    Symlink,
    Fifo,
    /// /run/natguard is read-only and has no lock file.
    ReadOnly,
}

/// A lock path that cannot be used at all: DEL warns, goes on without the lock and removes the
/// pod's entries (so the runtime goes on to the primary plugin's DEL); ADD and GC fail with a
/// clear code-5 error and change nothing.
#[test]
fn unusable_lock_lets_del_remove_the_pod_and_fails_add_with_code_5() {
    let (h, ns) = setup("lk-unusable");
    let good = RunDir::new(&h, "run-good");
    let cfg = cfg();
    let cases = [
        Unusable::Directory,
        Unusable::Symlink,
        Unusable::Fifo,
        Unusable::ReadOnly,
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let p = pod("unus", i as u32 + 1);
        add(&ns, &good, &cfg, &p).succeeded();
        assert_installed(&ns, &p, "ADD with a working lock");

        let mut bad = RunDir::new(&h, &format!("run-{case:?}"));
        let target = h.dir().join(format!("symlink-target-{case:?}"));
        let lock = bad.lock_path();
        let needle = match case {
            Unusable::Directory => {
                fs::create_dir(&lock).unwrap();
                fs::write(lock.join("keep"), "keep\n").unwrap();
                "directory"
            }
            Unusable::Symlink => {
                fs::write(&target, "").unwrap();
                std::os::unix::fs::symlink(&target, &lock).unwrap();
                "symbolic link"
            }
            Unusable::Fifo => {
                mkfifo(&lock);
                "FIFO"
            }
            Unusable::ReadOnly => {
                bad = bad.read_only();
                "Read-only"
            }
        };

        let d = del(&ns, &bad, &cfg, &p).succeeded();
        assert!(
            d.stderr.contains("/run/natguard/lock") && d.stderr.contains("without"),
            "{case:?}: DEL should warn that it goes on without the lock: {d}"
        );
        assert_removed(&ns, &p, &format!("DEL with the lock path a {case:?}"));

        let a = add(&ns, &bad, &cfg, &p);
        a.fails_with(5, &["/run/natguard/lock", "cannot be used", needle]);
        assert_removed(&ns, &p, &format!("ADD with the lock path a {case:?}"));
        // GC, which would remove every entry here (no valid attachment), refuses as well.
        add(&ns, &good, &cfg, &p).succeeded();
        gc(&ns, &bad, &cfg).fails_with(5, &["/run/natguard/lock", "cannot be used", needle]);
        assert_installed(&ns, &p, &format!("GC with the lock path a {case:?}"));
        del(&ns, &good, &cfg, &p).succeeded();

        // Nothing at the lock path was replaced or followed.
        let kind = fs::symlink_metadata(&lock).map(|m| m.file_type());
        match case {
            Unusable::Directory => assert!(kind.unwrap().is_dir()),
            Unusable::Symlink => {
                assert!(kind.unwrap().is_symlink());
                let f = File::open(&target).unwrap();
                f.try_lock()
                    .expect("the symlink's target is not locked by anyone");
            }
            Unusable::Fifo => assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind.unwrap())),
            Unusable::ReadOnly => assert!(kind.is_err(), "nothing was created: {kind:?}"),
        }
    }
}

/// flock needs no write access: in a read-only /run/natguard that already holds the lock file,
/// the lock still works (ADD and DEL succeed, and a holder still makes them wait and fail).
#[test]
fn read_only_run_dir_with_an_existing_lock_file_still_locks() {
    let (h, ns) = setup("lk-ro");
    let run = RunDir::new(&h, "run");
    File::create(run.lock_path()).unwrap();
    let ro = run.clone().read_only();
    let cfg = cfg();
    let p = pod("ro", 1);

    add(&ns, &ro, &cfg, &p).succeeded();
    assert_installed(&ns, &p, "ADD in a read-only /run/natguard");
    let holder = File::open(run.lock_path()).unwrap();
    holder.lock().unwrap();
    del(&ns, &ro, &cfg, &p).fails_with(11, &["/run/natguard/lock", "busy"]);
    drop(holder);
    del(&ns, &ro, &cfg, &p).succeeded();
    assert_removed(&ns, &p, "DEL in a read-only /run/natguard");
}

// ---------------------------------------------------------------------------------------------
// The log file
// ---------------------------------------------------------------------------------------------

/// A `logFile` that is not a regular file never blocks and is never written through: a FIFO
/// nobody reads (which a blocking open(2) would wait on forever), a FIFO with a reader, a
/// symlink, a directory, a socket and a character device each give a warning on stderr, and
/// ADD, CHECK and DEL go on and succeed.
#[test]
fn log_file_that_is_not_a_regular_file_warns_and_never_blocks() {
    let (h, ns) = setup("log-kinds");
    let run = RunDir::new(&h, "run");
    let dir = h.dir();
    let fifo = dir.join("fifo.log");
    mkfifo(&fifo);
    let read_fifo = dir.join("read-fifo.log");
    mkfifo(&read_fifo);
    // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
    let reader = unsafe {
        let c = CString::new(read_fifo.as_os_str().as_bytes()).unwrap();
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    assert!(reader >= 0, "open the FIFO's read end");
    // SAFETY: `reader` is a descriptor this test just opened and owns.
    let mut reader = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(reader) };
    let target = dir.join("precious");
    fs::write(&target, "precious\n").unwrap();
    let link = dir.join("link.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let directory = dir.join("dir.log");
    fs::create_dir(&directory).unwrap();
    let socket = dir.join("socket.log");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let device = PathBuf::from("/dev/null");

    for (i, path) in [&fifo, &read_fifo, &link, &directory, &socket, &device]
        .into_iter()
        .enumerate()
    {
        let c = with(cfg(), "logFile", json!(path));
        let c = with(c, "logLevel", json!("debug"));
        let p = pod("kind", i as u32 + 1);
        for verb in ["ADD", "CHECK", "DEL"] {
            let inv = exec(&ns, &run, p.invocation(verb, &c)).succeeded();
            let warning = format!("logFile {} is not used", path.display());
            assert!(
                inv.stderr.contains(&warning),
                "{verb} with logFile {}: no warning on stderr: {inv}",
                path.display()
            );
        }
        assert_removed(&ns, &p, "DEL");
    }
    let mut got = Vec::new();
    let _ = reader.read_to_end(&mut got);
    assert!(
        got.is_empty(),
        "natguard wrote to a FIFO: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(fs::read_to_string(&target).unwrap(), "precious\n");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_dir(&directory).unwrap().count(), 0);
}

/// The level of each line in a log file (the third field: "TIME natguard[PID] LEVEL ...").
fn levels_in(text: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let level = l.split_whitespace().nth(2).unwrap_or("").to_string();
        *m.entry(level).or_insert(0) += 1;
    }
    m
}

/// `logLevel` decides what reaches the file: error and warn by default, info lines only at
/// "info" and "debug", debug lines only at "debug". stderr gets warnings and errors whatever
/// the level, and never info or debug lines; stdout only the CNI reply.
#[test]
fn log_level_filters_the_file_and_stderr_keeps_warnings() {
    let (h, ns) = setup("log-level");
    let run = RunDir::new(&h, "run");
    let cases: [(Option<&str>, &[&str]); 5] = [
        (None, &["error", "warn"]),
        (Some("error"), &["error"]),
        (Some("warn"), &["error", "warn"]),
        (Some("info"), &["error", "warn", "info"]),
        (Some("debug"), &["error", "warn", "info", "debug"]),
    ];
    for (i, (level, expected)) in cases.into_iter().enumerate() {
        let log = h
            .dir()
            .join(format!("level-{}.log", level.unwrap_or("default")));
        // "auto" with no route in the namespace: a warning at every ADD.
        let mut c = with(cfg(), "logFile", json!(log));
        c["metadata"]["proxyIPv6"] = json!("auto");
        if let Some(l) = level {
            c = with(c, "logLevel", json!(l));
        }
        let p = pod("lvl", 2 * i as u32 + 1);
        let absent = pod("lvl", 2 * i as u32 + 2);
        let a = add(&ns, &run, &c, &p).succeeded();
        // CHECK of a pod that was never added: an error line.
        let k = check(&ns, &run, &c, &absent);
        assert_eq!(k.exit, Some(1), "{k}");
        let d = del(&ns, &run, &c, &p).succeeded();
        for inv in [&a, &k, &d] {
            let stderr_levels = levels_in(&inv.stderr);
            assert!(
                !stderr_levels.contains_key("info") && !stderr_levels.contains_key("debug"),
                "stderr got lines below warn: {inv}"
            );
            assert!(
                inv.stdout.is_empty() || serde_json::from_str::<Value>(inv.stdout.trim()).is_ok(),
                "stdout carries more than the reply: {inv}"
            );
        }
        assert!(
            a.stderr.contains(" warn "),
            "ADD's warning is on stderr: {a}"
        );
        assert!(
            k.stderr.contains(" error "),
            "CHECK's error is on stderr: {k}"
        );
        let text = fs::read_to_string(&log).unwrap_or_default();
        let got: Vec<String> = levels_in(&text).into_keys().collect();
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(got, want, "logLevel {level:?}: levels in the file\n{text}");
    }
}

/// Checks one JSON log line: an object with an RFC 3339 UTC `time` (milliseconds, `Z`), a
/// known `level`, the `component`, a `pid` and a `msg`; returns it.
pub fn json_log_line(line: &str) -> serde_json::Map<String, Value> {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {line}"))
        .clone();
    let time = o["time"]
        .as_str()
        .unwrap_or_else(|| panic!("no time: {line}"));
    let b = time.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    assert!(
        b.len() == 24
            && digits(0..4)
            && b[4] == b'-'
            && digits(5..7)
            && b[7] == b'-'
            && digits(8..10)
            && b[10] == b'T'
            && digits(11..13)
            && b[13] == b':'
            && digits(14..16)
            && b[16] == b':'
            && digits(17..19)
            && b[19] == b'.'
            && digits(20..23)
            && b[23] == b'Z',
        "time is not RFC 3339 UTC with milliseconds: {line}"
    );
    // The date itself, read by date(1): the same second as natguard wrote.
    let epoch = run(Command::new("date").args(["-u", "-d", time, "+%s"]));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let then: u64 = epoch.trim().parse().unwrap();
    assert!(
        then <= now && now - then < 600,
        "{time} is not about now: {line}"
    );
    assert!(
        ["error", "warn", "info", "debug"].contains(&o["level"].as_str().unwrap_or("")),
        "{line}"
    );
    assert!(
        o["component"].is_string() && o["pid"].is_u64() && o["msg"].is_string(),
        "{line}"
    );
    o
}

/// `logFormat: "json"`: every line of the file and of stderr is one JSON object, with the
/// verb, the network, the container, the interface and the pod; the text format stays the
/// default.
#[test]
fn log_format_json_writes_one_object_per_line_with_the_attachment() {
    let (h, ns) = setup("log-json");
    let run = RunDir::new(&h, "run");
    let log = h.dir().join("json.log");
    let mut c = with(
        with(cfg(), "logFile", json!(log)),
        "logLevel",
        json!("debug"),
    );
    c = with(c, "logFormat", json!("json"));
    // "auto" with no route in the namespace: a warning at every ADD, on stderr too.
    c["metadata"]["proxyIPv6"] = json!("auto");
    let p = pod("json", 1);
    let a = add(&ns, &run, &c, &p).succeeded();
    let k = check(&ns, &run, &c, &pod("json", 2));
    assert_eq!(k.exit, Some(1), "{k}");
    let d = del(&ns, &run, &c, &p).succeeded();
    let text = fs::read_to_string(&log).unwrap();
    let mut components = BTreeMap::new();
    for line in text.lines() {
        let o = json_log_line(line);
        let component = o["component"].as_str().unwrap().to_string();
        assert_eq!(o["network"], NET, "{line}");
        assert_eq!(o["ifname"], "eth0", "{line}");
        let cid = o["container"].as_str().unwrap();
        assert!(cid.starts_with("json000"), "{line}");
        assert_eq!(o["pod"], format!("default/pod-{cid}"), "{line}");
        *components.entry(component).or_insert(0) += 1;
    }
    for verb in ["ADD", "CHECK", "DEL"] {
        assert!(components.contains_key(verb), "no {verb} line in\n{text}");
    }
    for inv in [&a, &k] {
        assert!(
            !inv.stderr.trim().is_empty(),
            "no warning or error on stderr: {inv}"
        );
    }
    for inv in [&a, &k, &d] {
        for line in inv.stderr.lines() {
            json_log_line(line);
        }
    }
    assert!(k.stderr.contains(r#""level":"error""#), "{k}");

    // Without logFormat the lines are text, as before.
    let text_log = h.dir().join("text.log");
    let mut c = with(cfg(), "logFile", json!(text_log));
    c["metadata"]["proxyIPv6"] = json!("auto");
    let p = pod("json", 3);
    add(&ns, &run, &c, &p).succeeded();
    del(&ns, &run, &c, &p).succeeded();
    let text = fs::read_to_string(&text_log).unwrap();
    assert!(!text.is_empty());
    for line in text.lines() {
        assert!(
            line.contains(" natguard[") && line.contains(&format!(" {NET} json0003 eth0: ")),
            "{line}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Rotation
// ---------------------------------------------------------------------------------------------

/// The largest sizes PATH and PATH.1 ever had while a run went on, and the smallest PATH.1.
#[derive(Debug, Default, Clone, Copy)]
struct Sizes {
    max_log: u64,
    max_rotated: u64,
    min_rotated: Option<u64>,
}

/// Polls the sizes of `log` and `rotated` until `stop`.
fn sample_sizes(log: &Path, rotated: &Path, stop: &AtomicBool) -> Sizes {
    let mut s = Sizes::default();
    loop {
        let done = stop.load(Ordering::SeqCst);
        if let Ok(m) = fs::symlink_metadata(log) {
            s.max_log = s.max_log.max(m.len());
        }
        if let Ok(m) = fs::symlink_metadata(rotated) {
            s.max_rotated = s.max_rotated.max(m.len());
            s.min_rotated = Some(s.min_rotated.map_or(m.len(), |x| x.min(m.len())));
        }
        if done {
            return s;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// What one ADD writes at "debug" level in steady state (shared objects in place), from a
/// sequential ADD with a log of its own.
struct Reference {
    /// The kind of each line, in order (see [`kind`]).
    kinds: Vec<String>,
    /// Bytes of all its lines.
    bytes: usize,
    /// Bytes of its longest line.
    longest: usize,
}

/// A line's level and the first word of its message: "debug lock", "info installed", ...
fn kind(line: &str) -> String {
    let level = line.split_whitespace().nth(2).unwrap_or("");
    let first = line
        .split_once(": ")
        .and_then(|(_, m)| m.split(' ').next())
        .unwrap_or("");
    format!("{level} {first}")
}

fn reference(ns: &Netns, run: &RunDir, h: &Harness, c: &Value) -> Reference {
    let log = h.dir().join("reference.log");
    let c = with(c.clone(), "logFile", json!(log));
    add(ns, run, &c, &pod("refr", 1)).succeeded();
    let before = fs::read_to_string(&log).unwrap_or_default().lines().count();
    add(ns, run, &c, &pod("refr", 2)).succeeded();
    let text = fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().skip(before).collect();
    assert!(
        lines.iter().any(|l| kind(l).starts_with("debug ")),
        "a debug-level ADD writes debug lines:\n{text}"
    );
    Reference {
        kinds: lines.iter().map(|l| kind(l)).collect(),
        bytes: lines.iter().map(|l| l.len() + 1).sum(),
        longest: lines.iter().map(|l| l.len() + 1).max().unwrap(),
    }
}

/// Runs 32 ADDs at once with `c` (which names the log), sampling both files' sizes meanwhile.
fn parallel_adds(
    ns: &Netns,
    run: &RunDir,
    c: &Value,
    log: &Path,
    tag: &str,
) -> (Vec<SynPod>, Sizes) {
    let pods: Vec<SynPod> = (1..=32).map(|i| pod(tag, i)).collect();
    let rotated = PathBuf::from(format!("{}.1", log.display()));
    let stop = AtomicBool::new(false);
    let sizes = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample_sizes(log, &rotated, &stop));
        let jobs: Vec<Box<dyn FnOnce() -> Invocation + Send + '_>> = pods
            .iter()
            .map(|p| Box::new(move || add(ns, run, c, p)) as Box<dyn FnOnce() -> Invocation + Send>)
            .collect();
        for inv in parallel(jobs) {
            inv.succeeded();
        }
        stop.store(true, Ordering::SeqCst);
        sampler.join().unwrap()
    });
    (pods, sizes)
}

/// The lines of `text` that invocation `p` wrote (its container ID is in each line's context).
fn lines_of<'a>(text: &'a str, p: &SynPod) -> Vec<&'a str> {
    let token = format!(" {NET} {} eth0: ", p.cid);
    text.lines().filter(|l| l.contains(&token)).collect()
}

fn assert_whole_lines(text: &str, what: &str) {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "{what} ends in a partial line"
    );
    for l in text.lines() {
        let ok =
            l.split(' ').next().is_some_and(|t| {
                !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            }) && l.contains(" natguard[")
                && l.matches(" natguard[").count() == 1;
        assert!(ok, "{what} has a torn or interleaved line: {l:?}");
    }
}

/// 32 ADDs at once meet the cap together: exactly one of them rotates. PATH.1 then holds the
/// file as it was at the cap, nothing else, and PATH every line of every ADD; neither file is
/// ever more than one line over the cap.
#[test]
fn log_rotation_at_the_cap_keeps_every_line_of_32_parallel_adds() {
    let (h, ns) = setup("log-rot-cap");
    let run = RunDir::new(&h, "run");
    let c = with(cfg(), "logLevel", json!("debug"));
    let r = reference(&ns, &run, &h, &c);
    let (per_add, longest) = (r.kinds.len(), r.longest);
    // Room for all 32 ADDs in one file, whatever the pids' lengths.
    let cap = (32 * (r.bytes + 8 * per_add)).max(4096) as u64;
    let log = h.dir().join("cap.log");
    let rotated = PathBuf::from(format!("{}.1", log.display()));
    // A file 10 bytes short of the cap: the first line of any ADD takes it over.
    let mut filler = String::new();
    let mut n = 0;
    while filler.len() as u64 + 128 <= cap - 10 {
        filler.push_str(&format!(
            "{:<63}\n",
            format!("0.000 natguard[0] info filler {n}")
        ));
        n += 1;
    }
    let width = (cap - 10) as usize - filler.len() - 1;
    filler.push_str(&format!("{:<width$}\n", "0.000 natguard[0] info last"));
    assert_eq!(filler.len() as u64, cap - 10);
    fs::write(&log, &filler).unwrap();

    let c = with(with(c, "logFile", json!(log)), "logFileMaxSize", json!(cap));
    let (pods, sizes) = parallel_adds(&ns, &run, &c, &log, "rcap");

    let old = fs::read_to_string(&rotated).unwrap_or_default();
    let new = fs::read_to_string(&log).unwrap();
    eprintln!(
        "cap {cap}, {per_add} lines per ADD (longest {longest} bytes), PATH {} bytes, PATH.1 {} bytes, sampled {sizes:?}",
        new.len(),
        old.len()
    );
    assert_eq!(
        old, filler,
        "PATH.1 is not exactly the file as it was at the cap"
    );
    assert_whole_lines(&new, "PATH");
    for p in &pods {
        assert_eq!(
            lines_of(&new, p).len(),
            per_add,
            "{} wrote {per_add} lines; PATH has these:\n{}",
            p.cid,
            lines_of(&new, p).join("\n")
        );
    }
    assert_eq!(
        new.lines().count(),
        32 * per_add,
        "PATH holds more than the 32 ADDs:\n{new}"
    );
    let bound = cap + longest as u64;
    assert!(
        sizes.max_log <= bound && sizes.max_rotated <= bound,
        "a file went more than one line over the cap of {cap}: {sizes:?}"
    );
}

/// With a 4096-byte cap, 32 ADDs at once rotate several times. Both files stay within one line
/// of the cap at every moment; PATH.1, whenever it exists, is a file that was full (a rotation
/// of a file that was not full would have thrown lines away); every line is whole; and what
/// is left of each ADD is the end of what it wrote (rotation only ever drops the oldest
/// lines).
#[test]
fn log_rotation_under_32_parallel_adds_keeps_both_files_within_the_cap() {
    let (h, ns) = setup("log-rot-4k");
    let run = RunDir::new(&h, "run");
    let c = with(cfg(), "logLevel", json!("debug"));
    let r = reference(&ns, &run, &h, &c);
    let (per_add, longest) = (r.kinds.len(), r.longest);
    let cap: u64 = 4096;
    assert!(
        32 * r.bytes > 2 * cap as usize,
        "32 ADDs of {} bytes would not rotate several times",
        r.bytes
    );
    let log = h.dir().join("4k.log");
    let rotated = PathBuf::from(format!("{}.1", log.display()));
    let c = with(with(c, "logFile", json!(log)), "logFileMaxSize", json!(cap));
    let (pods, sizes) = parallel_adds(&ns, &run, &c, &log, "r4k");

    let old = fs::read_to_string(&rotated).expect("PATH.1 exists after rotations");
    let new = fs::read_to_string(&log).unwrap();
    eprintln!(
        "cap {cap}, {per_add} lines per ADD (longest {longest} bytes), PATH {} bytes, PATH.1 {} bytes, sampled {sizes:?}",
        new.len(),
        old.len()
    );
    let bound = cap + longest as u64;
    assert!(
        sizes.max_log <= bound && sizes.max_rotated <= bound,
        "a file went more than one line over the cap of {cap}: {sizes:?}"
    );
    let full = cap - longest as u64;
    assert!(
        sizes.min_rotated.is_some_and(|m| m > full) && old.len() as u64 > full,
        "PATH.1 was once a file that had not reached the cap ({} bytes at the end): {sizes:?}",
        old.len()
    );
    assert_whole_lines(&old, "PATH.1");
    assert_whole_lines(&new, "PATH");
    let both = format!("{old}{new}");
    let mut kept_total = 0;
    for p in &pods {
        let kept: Vec<String> = lines_of(&both, p).into_iter().map(kind).collect();
        kept_total += kept.len();
        assert!(
            kept.len() <= per_add && kept[..] == r.kinds[per_add - kept.len()..],
            "{}: the lines left are not the end of what an ADD writes ({:?}): {kept:?}\nPATH.1:\n{old}\nPATH:\n{new}",
            p.cid,
            r.kinds
        );
    }
    assert_eq!(
        kept_total,
        both.lines().count(),
        "lines of no ADD in the files"
    );
}

// ---------------------------------------------------------------------------------------------
// Config errors
// ---------------------------------------------------------------------------------------------

/// Unknown `logLevel` and `logFileMaxSize` values are refused with code 7, naming the field and
/// the value, by ADD, CHECK and GC, before anything is installed. DEL goes on (as with any
/// config error in natguard's fields) and removes the pod.
#[test]
fn bad_log_level_and_max_size_are_refused_with_code_7() {
    let (h, ns) = setup("log-badcfg");
    let run = RunDir::new(&h, "run");
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "logLevel",
            json!("verbose"),
            r#"logLevel: "verbose" is not one of error, warn, info, debug"#,
        ),
        ("logLevel", json!("WARN"), r#""WARN""#),
        ("logLevel", json!(""), r#""""#),
        ("logLevel", json!(3), "3"),
        ("logLevel", json!(null), "null"),
        (
            "logFileMaxSize",
            json!(0),
            "logFileMaxSize: 0 is not a valid size",
        ),
        ("logFileMaxSize", json!(-1), "-1"),
        ("logFileMaxSize", json!("4096"), r#""4096""#),
        ("logFileMaxSize", json!(4096.5), "4096.5"),
        ("logFileMaxSize", json!(1), "1 is not"),
        ("logFileMaxSize", json!(1u64 << 40), "1099511627776"),
    ];
    for (i, (field, value, needle)) in cases.into_iter().enumerate() {
        let c = with(cfg(), field, value.clone());
        let p = pod("bad", i as u32 + 1);
        add(&ns, &run, &c, &p).fails_with(7, &[field, needle]);
        assert_removed(&ns, &p, &format!("ADD with {field}: {value}"));
        check(&ns, &run, &c, &p).fails_with(7, &[field, needle]);
        gc(&ns, &run, &c).fails_with(7, &[field, needle]);

        add(&ns, &run, &cfg(), &p).succeeded();
        del(&ns, &run, &c, &p).succeeded();
        assert_removed(&ns, &p, &format!("DEL with {field}: {value}"));
    }
}
