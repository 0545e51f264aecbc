//! Shared harness for the root integration tests.
//!
//! Everything happens in network namespaces created here (names `ng-<test>-<pid>-<role>`), never in
//! the root namespace. A [`Harness`] owns every namespace, process and temporary directory it
//! created and removes them when dropped, also when a test panics.
//!
//! Pieces (everything but `run`, `synthetic`, `attack`, `exposition`, `watcher` and `fake` is
//! re-exported here):
//! - `netns`: [`Harness`] / [`Netns`]: namespaces, `ip` topology helpers, processes inside
//!   namespaces, and the servers: an HTTP responder with a fixed body (busybox httpd) and a
//!   TCP/UDP "who am I" echo that answers with the client's source address as it saw it (socat).
//! - `clients`: [`http_get`], [`tcp_whoami`], [`udp_whoami`], run on a thread moved into a
//!   namespace with `setns(2)` ([`in_netns`]), so the test process never leaves the root one.
//! - `chain`: [`Chain`] drives a conflist the way libcni does (ADD in order with prevResult
//!   threading, DEL in reverse with the cached result, CHECK, GC, STATUS, VERSION), running every
//!   plugin in the node namespace through [`run`].
//! - `world`: [`World`], the standard topology (node, cloud metadata server, node-local proxy, a
//!   remote host inside and one outside `nonMasqueradeCIDRs`), both address families.
//! - [`run`]: the one way to run the natguard binary directly in a namespace (exact environment
//!   and stdin, optional seccomp filter, private mount or cgroup, a deadline) and its result.
//! - [`synthetic`]: pods that exist only as a CNI environment and a prevResult, and a model of
//!   the kernel state they must leave.
//! - [`attack`]: pieces of the attack tests (`tests/security.rs`).
//! - [`exposition`]: the tests' one Prometheus text parser (strict), also included by the
//!   report's unit tests in `src/`.
//! - [`watcher`]: a running `natguard install --watch` in the node namespace.
//! - [`fake`]: the fake cloud metadata upstreams (`tests/proxy/`) and their request records.
//! - here: running commands, requiring root and tools, reading nft and conntrack state.
#![allow(dead_code)]

pub mod attack;
mod chain;
mod clients;
pub mod exposition;
pub mod fake;
mod netns;
pub mod run;
pub mod synthetic;
pub mod watcher;
mod world;

pub use chain::*;
pub use clients::*;
pub use netns::*;
pub use world::*;

use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where Debian's containernetworking-plugins live.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Upper bound for any single network operation of a client. A bound for failure reports, never
/// an assertion on speed: an operation that hits it is reported as [`Outcome::TimedOut`].
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait for a server to start listening before the test fails.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that stretches the tests' deadlines: a factor (an integer from 1 to
/// 100, default 1) for [`deadline`]. The kernel test layer (scripts/kernels.sh) sets it inside
/// its emulated VMs, which run 10 to 20 times slower than the host. It scales bounds that only
/// keep a failing test from hanging (an invocation, a server that must start); never a check
/// of how fast anything is, and not [`IO_TIMEOUT`], which is also how long a test waits for an
/// answer that must not come.
pub const TIME_FACTOR_ENV: &str = "NATGUARD_TEST_TIME_FACTOR";

/// `base` times `$NATGUARD_TEST_TIME_FACTOR` ([`TIME_FACTOR_ENV`]); a value that is not an
/// integer from 1 to 100 fails the test.
pub fn deadline(base: Duration) -> Duration {
    match std::env::var(TIME_FACTOR_ENV) {
        Err(_) => base,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(f @ 1..=100) => base * f,
            _ => panic!("{TIME_FACTOR_ENV}={v:?}: expected an integer from 1 to 100"),
        },
    }
}

/// What the kernel test layer (scripts/kernels.sh) promises about the running kernel, from
/// `$NATGUARD_KERNEL_EXPECT` (`key=value` words, e.g. `ct_delete=dump`): the value of `key`, or
/// `None` outside that layer (the host's own kernel). See docs/kernels.md.
pub fn kernel_expects(key: &str) -> Option<String> {
    let all = std::env::var("NATGUARD_KERNEL_EXPECT").ok()?;
    all.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

/// Every CNI spec version that real conflists use and natguard supports.
pub const CNI_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The natguard binary under test: `$NATGUARD_BIN` if set (e.g. the static release build),
/// else the binary cargo built for this test run.
pub fn natguard_bin() -> PathBuf {
    match std::env::var_os("NATGUARD_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_natguard")),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Running commands
// ---------------------------------------------------------------------------------------------

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; panics if it cannot be started.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null());
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", describe(cmd)))
}

/// Runs `cmd`; returns stdout, or a message with status, stdout and stderr.
pub fn try_run(cmd: &mut Command) -> Result<String, String> {
    let out = output(cmd);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{}` failed ({})\nstdout: {}\nstderr: {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `cmd`; panics with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `program args...` in the current (root) namespace. Only for commands that do not change
/// the root namespace (`ip netns add/del`, `ip -n NS ...`).
pub fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Fails the test unless it runs as root. Root tests never skip silently.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "root integration tests need root (they create network namespaces); run `sudo scripts/test.sh`"
    );
}

/// Fails the test if any of the tools is missing. Root tests never skip silently.
pub fn require_tools(tools: &[&str]) {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for t in tools {
        let found = if t.starts_with('/') {
            Path::new(t).exists()
        } else {
            dirs.iter().any(|d| d.join(t).exists())
        };
        assert!(
            found,
            "required tool `{t}` is missing; scripts/test.sh installs the packages the root tests need"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel state readers (the nft and conntrack CLIs are fine in tests), text and JSON helpers
// ---------------------------------------------------------------------------------------------

/// `nft -s list table inet natguard` in `ns` (the policy, without the counters' values, which
/// traffic changes); `None` when the table does not exist.
pub fn nft_table(ns: &Netns) -> Option<String> {
    let out = output(
        ns.cmd("nft")
            .args(["-s", "list", "table", "inet", "natguard"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    } else if stderr.contains("No such file or directory") {
        None
    } else {
        panic!(
            "nft list table inet natguard in {} failed: {stderr}",
            ns.name
        )
    }
}

/// `nft -s list ruleset` in `ns` (without counter values).
pub fn nft_ruleset(ns: &Netns) -> String {
    ns.run(&["nft", "-s", "list", "ruleset"])
}

/// `conntrack -I -t 3600 <args...>` in `ns`: an entry that outlives the test, as the CLI
/// builds it.
pub fn conntrack_insert(ns: &Netns, args: &[&str]) {
    let out = output(ns.cmd("conntrack").args(["-I", "-t", "3600"]).args(args));
    assert!(
        out.status.success(),
        "conntrack -I {args:?} in {}: {}",
        ns.name,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `conntrack -L <filter...>` in `ns`: the entry lines.
pub fn conntrack_list(ns: &Netns, filter: &[&str]) -> Vec<String> {
    let out = output(ns.cmd("conntrack").arg("-L").args(filter));
    assert!(
        out.status.success(),
        "conntrack -L {filter:?} in {} failed: {}",
        ns.name,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Number of conntrack entries in `ns` matching `filter` (e.g. `["-d", "169.254.169.254"]`).
pub fn conntrack_count(ns: &Netns, filter: &[&str]) -> usize {
    conntrack_list(ns, filter).len()
}

/// True if `token` occurs in `text` as a whole word (not as part of a longer address or
/// identifier): `mentions("10.0.0.20", "10.0.0.2")` is false.
pub fn mentions(text: &str, token: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '_' || c == '-';
    let mut from = 0;
    while let Some(i) = text[from..].find(token) {
        let start = from + i;
        let end = start + token.len();
        let before = text[..start].chars().next_back();
        let after = text[end..].chars().next();
        if !before.is_some_and(word) && !after.is_some_and(word) {
            return true;
        }
        from = start + 1;
    }
    false
}

/// Merges `patch` into `base` (objects recursively; anything else replaces).
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}
