//! Shared harness for the root integration tests.
//!
//! Everything happens in network namespaces created here (names `ng-<test>-<pid>-<role>`), never in
//! the root namespace. A [`Harness`] owns every namespace, process and temporary directory it
//! created and removes them when dropped, also when a test panics.
//!
//! Pieces:
//! - [`Harness`] / [`Netns`]: namespaces, `ip` topology helpers, processes inside namespaces.
//! - servers: an HTTP responder with a fixed body (busybox httpd) and a TCP/UDP "who am I" echo
//!   that answers with the client's source address as the server saw it (socat).
//! - clients ([`http_get`], [`tcp_whoami`], [`udp_whoami`]) that run in a thread moved into a
//!   namespace with `setns(2)`, so the test process itself never leaves the root namespace.
//! - [`Chain`]: drives a conflist the way libcni does (ADD in order with prevResult threading,
//!   DEL in reverse with the cached result, CHECK, GC, STATUS, VERSION), running every plugin in
//!   the node namespace through `nsenter --net`.
//! - [`World`]: the standard topology (node, cloud metadata server, node-local proxy, a remote host
//!   inside and one outside `nonMasqueradeCIDRs`), both address families.
//! - [`run`]: the one way to run the natguard binary directly in a namespace (exact environment
//!   and stdin, optional seccomp filter, private mount or cgroup, a deadline) and its result.
//! - [`synthetic`]: pods that exist only as a CNI environment and a prevResult, and a model of
//!   the kernel state they must leave.
#![allow(dead_code)]

pub mod attack;
pub mod run;
pub mod synthetic;

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
// Namespaces and the RAII harness
// ---------------------------------------------------------------------------------------------

/// A named network namespace (`/run/netns/<name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `program` to be run inside this namespace (`nsenter --net`, which switches only the
    /// network namespace and keeps mounts, cgroups and /sys as they are).
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path()))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs `args` inside this namespace; panics on failure.
    pub fn run(&self, args: &[&str]) -> String {
        run(self.cmd(args[0]).args(&args[1..]))
    }

    /// Runs `args` inside this namespace.
    pub fn try_run(&self, args: &[&str]) -> Result<String, String> {
        try_run(self.cmd(args[0]).args(&args[1..]))
    }

    /// `ip -n <ns> <args>`; `args` is split on whitespace. Panics on failure.
    pub fn ip(&self, args: &str) -> String {
        let mut c = Command::new("ip");
        c.arg("-n").arg(&self.name).args(args.split_whitespace());
        run(&mut c)
    }

    /// `ip -n <ns> <args>` without panicking.
    pub fn try_ip(&self, args: &str) -> Result<String, String> {
        let mut c = Command::new("ip");
        c.arg("-n").arg(&self.name).args(args.split_whitespace());
        try_run(&mut c)
    }

    /// Sets a sysctl of this namespace (net.* keys are per namespace).
    pub fn sysctl(&self, key: &str, value: &str) {
        self.run(&["sysctl", "-qw", &format!("{key}={value}")]);
    }

    /// Adds an address; IPv6 addresses skip duplicate address detection.
    pub fn addr(&self, dev: &str, cidr: &str) {
        let nodad = if cidr.contains(':') { " nodad" } else { "" };
        self.ip(&format!("addr add {cidr} dev {dev}{nodad}"));
    }

    /// Adds a route `dst` via `gw` (`dst` may be `default`).
    pub fn route(&self, dst: &str, gw: &str) {
        let fam = if gw.contains(':') { "-6 " } else { "" };
        self.ip(&format!("{fam}route add {dst} via {gw}"));
    }

    /// Creates a Linux bridge and brings it up.
    pub fn bridge(&self, name: &str) {
        self.ip(&format!("link add {name} type bridge"));
        self.ip(&format!("link set {name} up"));
    }

    /// Enslaves `dev` to `bridge`.
    pub fn enslave(&self, dev: &str, bridge: &str) {
        self.ip(&format!("link set {dev} master {bridge}"));
    }
}

/// Creates a veth pair `a_if` (in `a`) <-> `b_if` (in `b`) and brings both ends up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) {
    a.ip(&format!(
        "link add {a_if} type veth peer name {b_if} netns {}",
        b.name
    ));
    a.ip(&format!("link set {a_if} up"));
    b.ip(&format!("link set {b_if} up"));
}

/// A process started by a [`Harness`] (killed with its whole process group).
#[derive(Clone, Debug)]
pub struct Server {
    pub label: String,
    pub pids: Vec<u32>,
}

/// Owns the namespaces, processes and temporary directory of one test. Dropping it (also while
/// panicking) kills every process it started and deletes every namespace it created.
pub struct Harness {
    prefix: String,
    dir: PathBuf,
    netns: Mutex<Vec<String>>,
    procs: Mutex<Vec<Child>>,
}

impl Harness {
    /// `test` is the test's name; the pid is added so that runs of several binaries and parallel
    /// tests never collide.
    pub fn new(test: &str) -> Harness {
        require_root();
        require_tools(&["ip", "nsenter", "sysctl", "ss"]);
        let clean: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let prefix = format!("ng-{clean}-{}", std::process::id());
        let dir = std::env::temp_dir().join(&prefix);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create test dir");
        Harness {
            prefix,
            dir,
            netns: Mutex::new(Vec::new()),
            procs: Mutex::new(Vec::new()),
        }
    }

    /// The test's private directory (IPAM state, CNI cache, logs, web roots).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Creates namespace `<prefix>-<role>` with `lo` up and IPv6 DAD off.
    pub fn netns(&self, role: &str) -> Netns {
        let name = format!("{}-{role}", self.prefix);
        run(&mut cmd("ip", &["netns", "add", &name]));
        lock(&self.netns).push(name.clone());
        let ns = Netns { name };
        ns.ip("link set lo up");
        ns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0");
        ns
    }

    /// Deletes a namespace this harness created (before the end of the test).
    pub fn delete_netns(&self, ns: &Netns) {
        let mut list = lock(&self.netns);
        if let Some(i) = list.iter().position(|n| *n == ns.name) {
            list.remove(i);
            run(&mut cmd("ip", &["netns", "del", &ns.name]));
        }
    }

    /// Starts `args` inside `ns` in a process group of its own; output goes to
    /// `<dir>/<label>.log`. Returns the pid.
    pub fn spawn(&self, ns: &Netns, label: &str, args: &[&str]) -> u32 {
        let log = self.dir.join(format!("{label}.log"));
        let out = File::create(&log).expect("create server log");
        let err = out.try_clone().expect("dup log");
        let mut c = ns.cmd(args[0]);
        c.args(&args[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{}`: {e}", describe(&c)));
        let pid = child.id();
        lock(&self.procs).push(child);
        pid
    }

    /// Kills a process started by [`Harness::spawn`] (and its process group) and reaps it.
    pub fn kill(&self, pid: u32) {
        let mut procs = lock(&self.procs);
        if let Some(i) = procs.iter().position(|c| c.id() == pid) {
            let mut child = procs.remove(i);
            kill_group(&mut child);
        }
    }

    /// Stops every process of a server.
    pub fn stop(&self, server: &Server) {
        for pid in &server.pids {
            self.kill(*pid);
        }
    }

    /// HTTP responder answering every GET with `body` (busybox httpd, both address families).
    pub fn http_server(&self, ns: &Netns, port: u16, body: &str) -> Server {
        require_tools(&["busybox"]);
        let label = format!("http-{}-{port}", role_of(ns));
        let root = self.dir.join(&label);
        fs::create_dir_all(&root).expect("create web root");
        fs::write(root.join("index.html"), format!("{body}\n")).expect("write index.html");
        let pid = self.spawn(
            ns,
            &label,
            &[
                "busybox",
                "httpd",
                "-f",
                "-p",
                &port.to_string(),
                "-h",
                root.to_str().expect("utf-8 path"),
            ],
        );
        wait_listening(ns, "tcp", port, 1);
        Server {
            label,
            pids: vec![pid],
        }
    }

    /// HTTP/1.1 responder answering every request with `body`, keeping the connection open
    /// between requests like a cloud metadata API (`tests/common/http_keepalive.py`; IPv4 and
    /// IPv6). One-shot clients ([`http_get`]) get their answer and a close, as from
    /// [`Harness::http_server`].
    pub fn keepalive_http_server(&self, ns: &Netns, port: u16, body: &str) -> Server {
        require_tools(&["python3"]);
        let label = format!("keepalive-{}-{port}", role_of(ns));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/http_keepalive.py");
        let pid = self.spawn(
            ns,
            &label,
            &[
                "python3",
                "-u",
                script.to_str().expect("utf-8 path"),
                &port.to_string(),
                body,
            ],
        );
        wait_listening(ns, "tcp", port, 1);
        Server {
            label,
            pids: vec![pid],
        }
    }

    /// "Who am I" server on `port`: TCP and UDP, IPv4 and IPv6. The client sends one line; the
    /// reply is the client's
    /// source address as this server sees it, e.g. `10.244.0.2` or
    /// `[fd00:0010:0244:0000:0000:0000:0000:0002]` (see [`parse_peer`]).
    pub fn whoami_server(&self, ns: &Netns, port: u16) -> Server {
        require_tools(&["socat"]);
        // The shell reads the client's request line before answering: if it answered without
        // reading, socat could fail writing the request to the exited shell (EPIPE) and drop
        // the answer.
        let reply = "SYSTEM:read -r request; echo $SOCAT_PEERADDR";
        let specs = [
            ("tcp4", format!("TCP4-LISTEN:{port},reuseaddr,fork")),
            (
                "tcp6",
                format!("TCP6-LISTEN:{port},reuseaddr,fork,ipv6only=1"),
            ),
            ("udp4", format!("UDP4-RECVFROM:{port},reuseaddr,fork")),
            (
                "udp6",
                format!("UDP6-RECVFROM:{port},reuseaddr,fork,ipv6only=1"),
            ),
        ];
        let mut pids = Vec::new();
        for (proto, listen) in &specs {
            let label = format!("whoami-{}-{proto}-{port}", role_of(ns));
            pids.push(self.spawn(ns, &label, &["socat", listen, reply]));
        }
        wait_listening(ns, "tcp", port, 2);
        wait_listening(ns, "udp", port, 2);
        Server {
            label: format!("whoami-{}-{port}", role_of(ns)),
            pids,
        }
    }
}

fn role_of(ns: &Netns) -> &str {
    ns.name.rsplit('-').next().unwrap_or(&ns.name)
}

fn kill_group(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        // SAFETY: plain syscall; the group id is the child's pid (it was started with
        // process_group(0)), so only processes this harness started are signalled.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

impl Drop for Harness {
    fn drop(&mut self) {
        for mut child in lock(&self.procs).drain(..).rev() {
            kill_group(&mut child);
        }
        for ns in lock(&self.netns).drain(..).rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!("test files kept for inspection in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Waits until at least `count` sockets listen on `port` (`proto` = "tcp" or "udp") in `ns`.
pub fn wait_listening(ns: &Netns, proto: &str, port: u16, count: usize) {
    let flag = if proto == "udp" { "-Hlun" } else { "-Hltn" };
    let filter = format!("sport = :{port}");
    let start = Instant::now();
    loop {
        let out = ns.run(&["ss", flag, &filter]);
        if out.lines().filter(|l| !l.trim().is_empty()).count() >= count {
            return;
        }
        assert!(
            start.elapsed() < READY_TIMEOUT,
            "{proto} port {port} in {} never got {count} listener(s); ss says:\n{out}",
            ns.name
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// Clients (run in a thread that moved into the namespace)
// ---------------------------------------------------------------------------------------------

/// Moves the calling thread into `ns` (setns affects only that thread), and makes sure it got
/// there: code meant for a test's namespace never runs against the root namespace.
pub fn join_netns(ns: &Netns) {
    let path = ns.path();
    let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: fd is a valid namespace file; CLONE_NEWNET moves only this thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", io::Error::last_os_error());
    let here = fs::metadata("/proc/thread-self/ns/net")
        .expect("stat /proc/thread-self/ns/net")
        .ino();
    let want = file.metadata().expect("stat the namespace file").ino();
    assert_eq!(here, want, "the thread is not in {path} after setns");
}

/// Runs `f` on a fresh thread that has joined `ns` ([`join_netns`]); the caller never moves.
pub fn in_netns<T, F>(ns: &Netns, f: F) -> T
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|s| {
        let handle = s.spawn(|| {
            join_netns(ns);
            f()
        });
        match handle.join() {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e),
        }
    })
}

/// What a client saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered with this body (HTTP) or this text.
    Body(String),
    /// The connection was refused: a TCP reset (or an ICMP port unreachable) came back.
    Refused,
    /// Nothing came back within [`IO_TIMEOUT`].
    TimedOut,
    /// Any other error.
    Error(String),
}

impl Outcome {
    fn from_io(e: io::Error) -> Outcome {
        match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => Outcome::Refused,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::TimedOut,
            _ => Outcome::Error(e.to_string()),
        }
    }
}

/// `Outcome::Body(s)` for short assertions.
pub fn body(s: &str) -> Outcome {
    Outcome::Body(s.to_string())
}

/// HTTP GET `/` from inside `ns`; the body is trimmed.
pub fn http_get(ns: &Netns, addr: SocketAddr) -> Outcome {
    in_netns(ns, move || {
        let go = || -> io::Result<Outcome> {
            let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
            write!(
                s,
                "GET / HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: natguard-test\r\n\r\n"
            )?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf)?;
            let text = String::from_utf8_lossy(&buf).into_owned();
            Ok(match text.split_once("\r\n\r\n") {
                Some((head, body)) if head.starts_with("HTTP/1.") => {
                    Outcome::Body(body.trim().to_string())
                }
                _ => Outcome::Error(format!("not an HTTP response: {text:?}")),
            })
        };
        go().unwrap_or_else(Outcome::from_io)
    })
}

/// Parses a peer address as printed by socat (`1.2.3.4` or `[0000:...:0001]`).
pub fn parse_peer(text: &str) -> Result<IpAddr, String> {
    let t = text.trim().trim_start_matches('[').trim_end_matches(']');
    t.parse::<IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|e| format!("not an address: {text:?} ({e})"))
}

/// Asks the TCP who-am-i server at `addr` which source address it sees, from inside `ns`.
pub fn tcp_whoami(ns: &Netns, addr: SocketAddr) -> Result<IpAddr, Outcome> {
    in_netns(ns, move || {
        let go = || -> io::Result<String> {
            let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
            s.write_all(b"who\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        };
        match go() {
            Ok(text) => parse_peer(&text).map_err(Outcome::Error),
            Err(e) => Err(Outcome::from_io(e)),
        }
    })
}

/// Asks the UDP who-am-i server at `addr` which source address it sees, from inside `ns`.
/// The datagram is sent up to three times (the first one may wait for neighbour resolution).
pub fn udp_whoami(ns: &Netns, addr: SocketAddr) -> Result<IpAddr, Outcome> {
    in_netns(ns, move || {
        let go = || -> io::Result<String> {
            let bind: SocketAddr = if addr.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let s = UdpSocket::bind(bind)?;
            s.connect(addr)?;
            s.set_read_timeout(Some(IO_TIMEOUT / 3))?;
            let mut last = io::Error::from(io::ErrorKind::TimedOut);
            for _ in 0..3 {
                s.send(b"who\n")?;
                let mut buf = [0u8; 512];
                match s.recv(&mut buf) {
                    Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        };
        match go() {
            Ok(text) => parse_peer(&text).map_err(Outcome::Error),
            Err(e) => Err(Outcome::from_io(e)),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Kernel state readers (the nft and conntrack CLIs are fine in tests)
// ---------------------------------------------------------------------------------------------

/// `nft list table inet natguard` in `ns`; `None` when the table does not exist.
pub fn nft_table(ns: &Netns) -> Option<String> {
    let out = output(ns.cmd("nft").args(["list", "table", "inet", "natguard"]));
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

/// `nft list ruleset` in `ns`.
pub fn nft_ruleset(ns: &Netns) -> String {
    ns.run(&["nft", "-s", "list", "ruleset"])
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

// ---------------------------------------------------------------------------------------------
// The chain driver (libcni list semantics)
// ---------------------------------------------------------------------------------------------

/// One attachment of a network to a container (libcni's RuntimeConf).
#[derive(Clone, Debug)]
pub struct Attachment {
    pub container_id: String,
    /// `CNI_NETNS` (a path, or empty).
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` pairs in the order they are sent.
    pub args: Vec<(String, String)>,
    /// Capability arguments; each plugin gets the ones it declares in `capabilities` as
    /// `runtimeConfig`.
    pub cap_args: Map<String, Value>,
}

impl Attachment {
    pub fn new(container_id: &str, pod: &Netns) -> Attachment {
        Attachment {
            container_id: container_id.to_string(),
            netns: pod.path(),
            ifname: "eth0".to_string(),
            args: Vec::new(),
            cap_args: Map::new(),
        }
    }

    /// The CNI_ARGS a kubelet/CRI runtime sends, deliberately not in alphabetical order and with
    /// `IgnoreUnknown=1` in the middle (CRI sends them in random order).
    pub fn k8s(mut self, namespace: &str, pod: &str) -> Attachment {
        let cid = self.container_id.clone();
        self.args = vec![
            ("K8S_POD_NAME".into(), pod.into()),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), cid.clone()),
            ("IgnoreUnknown".into(), "1".into()),
            ("K8S_POD_NAMESPACE".into(), namespace.into()),
            ("K8S_POD_UID".into(), format!("uid-{cid}")),
        ];
        self
    }

    pub fn cni_args(&self) -> String {
        self.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }
}

/// A CNI error from one plugin of the chain.
#[derive(Clone, Debug)]
pub struct CniError {
    pub plugin: String,
    pub command: String,
    /// Exit code of the plugin (`None` if killed by a signal or if it never ran).
    pub exit: Option<i32>,
    /// `code` of the error JSON on stdout, if any.
    pub code: Option<u64>,
    pub msg: String,
    pub details: String,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} failed (exit {:?}, code {:?}): {} {}\nstdout: {}\nstderr: {}",
            self.plugin,
            self.command,
            self.exit,
            self.code,
            self.msg,
            self.details,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

/// Results of the chain driver (the error is boxed: it carries the plugin's whole output).
pub type CniResult<T> = Result<T, Box<CniError>>;

/// One plugin invocation, as recorded by the driver.
#[derive(Clone, Debug)]
pub struct Call {
    pub plugin: String,
    pub command: String,
    pub env: Vec<(String, String)>,
    pub stdin: Value,
    pub stdout: String,
    pub stderr: String,
    pub exit: Option<i32>,
}

/// prevResult handling for DEL.
#[derive(Clone, Debug, Default)]
pub enum PrevResult {
    /// libcni: the cached result for cniVersion >= 0.4.0, none for 0.3.x.
    #[default]
    Libcni,
    /// No prevResult at all (what 0.3.x lists and lost caches give).
    Omit,
    /// This value.
    Given(Value),
}

/// Options for [`Chain::del_with`].
#[derive(Clone, Debug, Default)]
pub struct DelOpts {
    pub prev_result: PrevResult,
    /// Overrides `CNI_NETNS` (e.g. `Some(String::new())`: CRI's second DEL, ctr's DEL).
    pub netns: Option<String>,
}

/// Compares dotted CNI versions.
pub fn version_at_least(v: &str, min: &str) -> bool {
    let parse = |s: &str| -> Vec<u32> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(v) >= parse(min)
}

/// Drives one conflist like libcni 1.2 does, with every plugin run inside the node namespace.
///
/// Differences from libcni, all deliberate:
/// - The result cache lives in `<cache_dir>/results/<net>-<cid>-<ifname>` in libcni's
///   `cniCacheV1` format, under the test's directory instead of /var/lib/cni.
/// - Debian 12's reference plugins (1.1.1) stop at spec 1.0.0. For a 1.1.0 list, a plugin that
///   does not support 1.1.0 but supports 1.0.0 gets cniVersion 1.0.0 (the 1.1.0 result format is
///   the 1.0.0 one) and its result is relabelled 1.1.0 before it is passed on; GC and STATUS,
///   which such a plugin does not know, are sent only to plugins that support the list's
///   version. natguard always gets the list's version.
/// - Prior results are threaded as raw JSON, so unknown fields reach the next plugin unchanged.
pub struct Chain {
    pub list: Value,
    node: Netns,
    cache_dir: PathBuf,
    versions: Mutex<HashMap<String, Vec<String>>>,
    calls: Mutex<Vec<Call>>,
}

impl Chain {
    pub fn new(node: &Netns, list: Value, cache_dir: &Path) -> Chain {
        assert!(
            list["plugins"].is_array(),
            "conflist without plugins: {list}"
        );
        Chain {
            list,
            node: node.clone(),
            cache_dir: cache_dir.to_path_buf(),
            versions: Mutex::new(HashMap::new()),
            calls: Mutex::new(Vec::new()),
        }
    }

    pub fn name(&self) -> &str {
        self.list["name"].as_str().expect("conflist name")
    }

    pub fn version(&self) -> &str {
        self.list["cniVersion"].as_str().unwrap_or("0.1.0")
    }

    pub fn plugins(&self) -> Vec<Value> {
        self.list["plugins"].as_array().cloned().unwrap_or_default()
    }

    /// Every call made so far.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// Calls made so far to plugins of type `plugin`.
    pub fn calls_to(&self, plugin: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.plugin == plugin)
            .collect()
    }

    /// Binary of a plugin type.
    pub fn plugin_bin(plugin: &str) -> PathBuf {
        if plugin == "natguard" {
            return natguard_bin();
        }
        let p = Path::new(CNI_BIN_DIR).join(plugin);
        assert!(
            p.exists(),
            "CNI plugin {} is missing (apt-get install containernetworking-plugins)",
            p.display()
        );
        p
    }

    fn cni_path() -> String {
        let ng = natguard_bin();
        let ng_dir = ng.parent().expect("natguard dir");
        format!("{CNI_BIN_DIR}:{}", ng_dir.display())
    }

    /// The `CNI_*` environment libcni sets (all variables, empty when not applicable).
    pub fn env(
        command: &str,
        att: Option<&Attachment>,
        netns_override: Option<&str>,
    ) -> Vec<(String, String)> {
        vec![
            ("CNI_COMMAND".into(), command.into()),
            (
                "CNI_CONTAINERID".into(),
                att.map(|a| a.container_id.clone()).unwrap_or_default(),
            ),
            (
                "CNI_NETNS".into(),
                netns_override
                    .map(str::to_string)
                    .or_else(|| att.map(|a| a.netns.clone()))
                    .unwrap_or_default(),
            ),
            (
                "CNI_IFNAME".into(),
                att.map(|a| a.ifname.clone()).unwrap_or_default(),
            ),
            (
                "CNI_ARGS".into(),
                att.map(Attachment::cni_args).unwrap_or_default(),
            ),
            ("CNI_PATH".into(), Self::cni_path()),
        ]
    }

    /// Invocation of plugin `plugin` with `command`, stdin `conf` and libcni's `CNI_*` values,
    /// inside the node namespace. Returns the parsed stdout (if any) or the error.
    pub fn invoke(
        &self,
        plugin: &str,
        command: &str,
        conf: &Value,
        att: Option<&Attachment>,
        netns_override: Option<&str>,
    ) -> CniResult<Option<Value>> {
        self.exec(plugin, conf, Self::env(command, att, netns_override))
    }

    /// Runs a recorded call again, with the same stdin and environment (e.g. a second ADD of
    /// natguard with the prevResult it got the first time).
    pub fn replay(&self, call: &Call) -> CniResult<Option<Value>> {
        self.exec(&call.plugin, &call.stdin, call.env.clone())
    }

    /// The last recorded call of `command` to `plugin` for container `cid`.
    pub fn last_call(&self, plugin: &str, command: &str, cid: &str) -> Option<Call> {
        self.calls().into_iter().rev().find(|c| {
            c.plugin == plugin
                && c.command == command
                && c.env
                    .iter()
                    .any(|(k, v)| k == "CNI_CONTAINERID" && v == cid)
        })
    }

    /// Lowest level: run `plugin` with exactly this stdin and `CNI_*` environment (the rest of
    /// the environment is inherited) inside the node namespace.
    pub fn exec(
        &self,
        plugin: &str,
        conf: &Value,
        env: Vec<(String, String)>,
    ) -> CniResult<Option<Value>> {
        let bin = Self::plugin_bin(plugin);
        let command = env
            .iter()
            .find(|(k, _)| k == "CNI_COMMAND")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let stdin = serde_json::to_vec(conf).expect("serialize conf");
        let path = std::env::var("PATH").unwrap_or_default();
        let mut c = self.node.cmd(bin.to_str().expect("utf-8 path"));
        c.envs(env.iter().map(|(k, v)| (k, v)))
            // The reference plugins run iptables; make sure sbin is on PATH.
            .env("PATH", format!("{path}:/usr/sbin:/sbin:/usr/bin:/bin"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        {
            let mut input = child.stdin.take().expect("stdin");
            // A plugin may exit without reading stdin; a broken pipe is not the driver's error.
            let _ = input.write_all(&stdin);
        }
        let out = child.wait_with_output().expect("wait for plugin");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        lock(&self.calls).push(Call {
            plugin: plugin.to_string(),
            command: command.clone(),
            env,
            stdin: conf.clone(),
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            exit: out.status.code(),
        });
        let parsed: Option<Value> = if stdout.trim().is_empty() {
            None
        } else {
            serde_json::from_str(&stdout).ok()
        };
        let err = |msg: String, code: Option<u64>, details: String| -> Box<CniError> {
            Box::new(CniError {
                plugin: plugin.to_string(),
                command: command.clone(),
                exit: out.status.code(),
                code,
                msg,
                details,
                stdout: stdout.clone(),
                stderr: stderr.clone(),
            })
        };
        if !out.status.success() {
            let (code, msg, details) = match &parsed {
                Some(v) => (
                    v["code"].as_u64(),
                    v["msg"].as_str().unwrap_or("").to_string(),
                    v["details"].as_str().unwrap_or("").to_string(),
                ),
                None => (None, "no error JSON on stdout".to_string(), String::new()),
            };
            return Err(err(msg, code, details));
        }
        if !stdout.trim().is_empty() && parsed.is_none() {
            return Err(err("stdout is not JSON".to_string(), None, String::new()));
        }
        Ok(parsed)
    }

    /// The versions a plugin supports (CNI VERSION, asked once per plugin type).
    pub fn supported_versions(&self, plugin: &str) -> Vec<String> {
        if let Some(v) = lock(&self.versions).get(plugin) {
            return v.clone();
        }
        let conf = json!({ "cniVersion": self.version() });
        let reply = self
            .invoke(plugin, "VERSION", &conf, None, None)
            .unwrap_or_else(|e| panic!("VERSION of {plugin}: {e}"))
            .unwrap_or_else(|| panic!("VERSION of {plugin} printed nothing"));
        let v: Vec<String> = reply["supportedVersions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        lock(&self.versions).insert(plugin.to_string(), v.clone());
        v
    }

    /// The cniVersion a plugin of the list is given (see the type's documentation).
    fn version_for(&self, plugin: &str) -> String {
        let list_v = self.version().to_string();
        if plugin == "natguard" || list_v != "1.1.0" {
            return list_v;
        }
        let sup = self.supported_versions(plugin);
        if !sup.contains(&list_v) && sup.iter().any(|v| v == "1.0.0") {
            "1.0.0".to_string()
        } else {
            list_v
        }
    }

    fn plugin_type(plugin: &Value) -> String {
        plugin["type"]
            .as_str()
            .unwrap_or_else(|| panic!("plugin without type: {plugin}"))
            .to_string()
    }

    /// libcni's buildOneConfig: inject name, cniVersion, prevResult and runtimeConfig.
    fn build(
        &self,
        plugin: &Value,
        prev: Option<&Value>,
        att: Option<&Attachment>,
        extra: &[(&str, Value)],
    ) -> Value {
        let ty = Self::plugin_type(plugin);
        let version = self.version_for(&ty);
        let mut conf = plugin.as_object().cloned().expect("plugin object");
        conf.insert("name".into(), json!(self.name()));
        conf.insert("cniVersion".into(), json!(version));
        if let Some(prev) = prev {
            let mut prev = prev.clone();
            if prev.get("cniVersion").is_some() {
                prev["cniVersion"] = json!(version);
            }
            conf.insert("prevResult".into(), prev);
        }
        if let (Some(att), Some(caps)) = (att, plugin["capabilities"].as_object()) {
            let mut rc = Map::new();
            for (k, on) in caps {
                if on.as_bool() == Some(true) {
                    if let Some(v) = att.cap_args.get(k) {
                        rc.insert(k.clone(), v.clone());
                    }
                }
            }
            if !rc.is_empty() {
                conf.insert("runtimeConfig".into(), Value::Object(rc));
            }
        }
        for (k, v) in extra {
            conf.insert((*k).to_string(), v.clone());
        }
        Value::Object(conf)
    }

    fn relabel(&self, mut result: Value) -> Value {
        if result.get("cniVersion").is_some() {
            result["cniVersion"] = json!(self.version());
        }
        result
    }

    /// ADD every plugin in order, threading each result into the next plugin's prevResult;
    /// caches and returns the final result. Stops at the first error (libcni does not DEL
    /// on failure; the runtime does).
    pub fn add(&self, att: &Attachment) -> CniResult<Value> {
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            let conf = self.build(&plugin, prev.as_ref(), Some(att), &[]);
            let result = self.invoke(&ty, "ADD", &conf, Some(att), None)?;
            let result = result.ok_or_else(|| {
                Box::new(CniError {
                    plugin: ty.clone(),
                    command: "ADD".into(),
                    exit: Some(0),
                    code: None,
                    msg: "ADD printed no result".into(),
                    details: String::new(),
                    stdout: String::new(),
                    stderr: String::new(),
                })
            })?;
            prev = Some(self.relabel(result));
        }
        let result = prev.unwrap_or_else(|| json!({ "cniVersion": self.version() }));
        self.write_cache(att, &result);
        Ok(result)
    }

    /// DEL with libcni's defaults.
    pub fn del(&self, att: &Attachment) -> CniResult<()> {
        self.del_with(att, &DelOpts::default())
    }

    /// DEL every plugin in reverse order; removes the cached result when every plugin succeeded.
    pub fn del_with(&self, att: &Attachment, opts: &DelOpts) -> CniResult<()> {
        let prev = match &opts.prev_result {
            PrevResult::Libcni if version_at_least(self.version(), "0.4.0") => {
                self.cached_result(att)
            }
            PrevResult::Libcni | PrevResult::Omit => None,
            PrevResult::Given(v) => Some(v.clone()),
        };
        for plugin in self.plugins().iter().rev() {
            let ty = Self::plugin_type(plugin);
            let conf = self.build(plugin, prev.as_ref(), Some(att), &[]);
            self.invoke(&ty, "DEL", &conf, Some(att), opts.netns.as_deref())?;
        }
        let _ = fs::remove_file(self.cache_path(att));
        Ok(())
    }

    /// CHECK every plugin in order with the cached result (libcni: cniVersion >= 0.4.0 and a
    /// cached result are required; `disableCheck` skips it).
    pub fn check(&self, att: &Attachment) -> CniResult<()> {
        let fail = |msg: String| {
            Box::new(CniError {
                plugin: "libcni".into(),
                command: "CHECK".into(),
                exit: None,
                code: None,
                msg,
                details: String::new(),
                stdout: String::new(),
                stderr: String::new(),
            })
        };
        if !version_at_least(self.version(), "0.4.0") {
            return Err(fail(format!(
                "configuration version {:?} does not support the CHECK command",
                self.version()
            )));
        }
        if self.list["disableCheck"].as_bool() == Some(true) {
            return Ok(());
        }
        let prev = self
            .cached_result(att)
            .ok_or_else(|| fail("no cached result for this attachment".into()))?;
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            let conf = self.build(&plugin, Some(&prev), Some(att), &[]);
            self.invoke(&ty, "CHECK", &conf, Some(att), None)?;
        }
        Ok(())
    }

    fn gc_stale_dels(&self, valid: &[&Attachment]) -> Vec<CniError> {
        let mut errors = Vec::new();
        for cached in self.cached_attachments() {
            let keep = valid
                .iter()
                .any(|v| v.container_id == cached.container_id && v.ifname == cached.ifname);
            if !keep {
                if let Err(e) = self.del(&cached) {
                    errors.push(*e);
                }
            }
        }
        errors
    }

    /// libcni's GCNetworkList: DEL every cached attachment of this network that is not in
    /// `valid`, then (cniVersion >= 1.1.0) GC every plugin with `cni.dev/valid-attachments`.
    pub fn gc(&self, valid: &[&Attachment]) -> Result<(), Vec<CniError>> {
        let mut errors = self.gc_stale_dels(valid);
        if let Err(mut e) = self.gc_plugins(valid) {
            errors.append(&mut e);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Only the plugin GC step of [`Chain::gc`] (no DEL of stale cached attachments), so that a
    /// test sees what the plugins' own GC does.
    pub fn gc_plugins(&self, valid: &[&Attachment]) -> Result<(), Vec<CniError>> {
        if !version_at_least(self.version(), "1.1.0") {
            return Ok(());
        }
        let attachments: Vec<Value> = valid
            .iter()
            .map(|a| json!({ "containerID": a.container_id, "ifname": a.ifname }))
            .collect();
        let mut errors = Vec::new();
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            if !self.speaks_list_version(&ty) {
                continue;
            }
            let conf = self.build(
                &plugin,
                None,
                None,
                &[(
                    "cni.dev/valid-attachments",
                    Value::Array(attachments.clone()),
                )],
            );
            if let Err(e) = self.invoke(&ty, "GC", &conf, None, None) {
                errors.push(*e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// libcni's GetStatusNetworkList (cniVersion >= 1.1.0; stops at the first error).
    pub fn status(&self) -> CniResult<()> {
        if !version_at_least(self.version(), "1.1.0") {
            return Ok(());
        }
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            if !self.speaks_list_version(&ty) {
                continue;
            }
            let conf = self.build(&plugin, None, None, &[]);
            self.invoke(&ty, "STATUS", &conf, None, None)?;
        }
        Ok(())
    }

    fn speaks_list_version(&self, plugin: &str) -> bool {
        plugin == "natguard"
            || self
                .supported_versions(plugin)
                .iter()
                .any(|v| v == self.version())
    }

    /// VERSION of a plugin with an arbitrary stdin (podman sends `{"cniVersion":"1.0.0"}` with
    /// dummy `CNI_*` values).
    pub fn version_call(&self, plugin: &str, stdin: &Value) -> CniResult<Option<Value>> {
        self.invoke(plugin, "VERSION", stdin, None, None)
    }

    // --- the result cache (libcni cniCacheV1) ---

    pub fn cache_path(&self, att: &Attachment) -> PathBuf {
        self.cache_dir.join("results").join(format!(
            "{}-{}-{}",
            self.name(),
            att.container_id,
            att.ifname
        ))
    }

    fn write_cache(&self, att: &Attachment, result: &Value) {
        let path = self.cache_path(att);
        fs::create_dir_all(path.parent().expect("cache dir")).expect("create cache dir");
        let list_bytes = serde_json::to_vec(&self.list).expect("serialize list");
        let mut entry = json!({
            "kind": "cniCacheV1",
            "containerId": att.container_id,
            "config": base64(&list_bytes),
            "ifName": att.ifname,
            "networkName": self.name(),
            "result": result,
        });
        if !att.netns.is_empty() {
            entry["netns"] = json!(att.netns);
        }
        if !att.args.is_empty() {
            entry["cniArgs"] = json!(att
                .args
                .iter()
                .map(|(k, v)| [k.clone(), v.clone()])
                .collect::<Vec<_>>());
        }
        if !att.cap_args.is_empty() {
            entry["capabilityArgs"] = Value::Object(att.cap_args.clone());
        }
        fs::write(&path, serde_json::to_vec(&entry).expect("serialize cache"))
            .expect("write cache");
    }

    /// The cached result of an attachment, if any.
    pub fn cached_result(&self, att: &Attachment) -> Option<Value> {
        let text = fs::read(self.cache_path(att)).ok()?;
        let entry: Value = serde_json::from_slice(&text).ok()?;
        entry.get("result").cloned()
    }

    /// Removes the cached result of an attachment (simulates a lost cache).
    pub fn forget(&self, att: &Attachment) {
        let _ = fs::remove_file(self.cache_path(att));
    }

    /// The attachments of this network found in the cache.
    pub fn cached_attachments(&self) -> Vec<Attachment> {
        let dir = self.cache_dir.join("results");
        let mut out = Vec::new();
        let Ok(entries) = fs::read_dir(&dir) else {
            return out;
        };
        for e in entries.flatten() {
            let Ok(bytes) = fs::read(e.path()) else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if v["networkName"].as_str() != Some(self.name()) {
                continue;
            }
            let args = v["cniArgs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| {
                            Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Attachment {
                container_id: v["containerId"].as_str().unwrap_or("").to_string(),
                netns: v["netns"].as_str().unwrap_or("").to_string(),
                ifname: v["ifName"].as_str().unwrap_or("").to_string(),
                args,
                cap_args: v["capabilityArgs"].as_object().cloned().unwrap_or_default(),
            });
        }
        out
    }
}

/// Standard base64 (what Go's encoding/json does with []byte).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The addresses of interface `ifname` in a CNI result (any version >= 0.3.0).
pub fn result_ips(result: &Value, ifname: &str) -> Vec<IpAddr> {
    let ifaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    let mut ips = Vec::new();
    for ip in result["ips"].as_array().cloned().unwrap_or_default() {
        if let Some(idx) = ip["interface"].as_u64() {
            let name = ifaces
                .get(idx as usize)
                .and_then(|i| i["name"].as_str())
                .unwrap_or("");
            if name != ifname {
                continue;
            }
        }
        if let Some(addr) = ip["address"].as_str() {
            let a = addr.split('/').next().unwrap_or(addr);
            ips.push(
                a.parse()
                    .unwrap_or_else(|e| panic!("bad address {addr}: {e}")),
            );
        }
    }
    ips
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

// ---------------------------------------------------------------------------------------------
// The standard topology
// ---------------------------------------------------------------------------------------------

pub const META4: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254));
pub const META6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254));
/// A remote host inside the test's nonMasqueradeCIDRs, and the node's address towards it.
pub const REMOTE_IN4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 2));
pub const NODE_IN4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 1));
pub const REMOTE_IN6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0xaa, 0, 0, 0, 0, 0, 2));
pub const NODE_IN6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0xaa, 0, 0, 0, 0, 0, 1));
/// A remote host outside the nonMasqueradeCIDRs, and the node's address towards it (also the
/// node's primary address: the node's default routes point there).
pub const REMOTE_OUT4: IpAddr = IpAddr::V4(Ipv4Addr::new(11, 0, 0, 2));
pub const NODE_OUT4: IpAddr = IpAddr::V4(Ipv4Addr::new(11, 0, 0, 1));
pub const REMOTE_OUT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xbb, 0, 0, 0, 0, 2));
pub const NODE_OUT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xbb, 0, 0, 0, 0, 1));

pub const HTTP_PORT: u16 = 80;
pub const PROXY_PORT: u16 = 8181;
pub const WHOAMI_PORT: u16 = 7777;

/// The nonMasqueradeCIDRs the tests configure: natguard's IPv4 defaults plus fd00::/8 (covers
/// the IPv6 remote-in host and the pods' IPv6 range, not the remote-out host).
pub fn non_masq() -> Vec<&'static str> {
    let mut v = natguard::config::DEFAULT_NON_MASQUERADE_CIDRS.to_vec();
    v.push("fd00::/8");
    v
}

pub fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Pod IPv4 subnet of network number `index`.
pub fn pod_subnet4(index: u8) -> String {
    format!("10.244.{index}.0/24")
}

/// Pod IPv6 subnet of network number `index`.
pub fn pod_subnet6(index: u8) -> String {
    format!("fd00:10:244:{index}::/64")
}

/// A pod attached through a [`Chain`].
#[derive(Clone, Debug)]
pub struct Pod {
    pub ns: Netns,
    pub att: Attachment,
    pub result: Value,
    pub v4: IpAddr,
    pub v6: IpAddr,
}

impl Pod {
    pub fn ips(&self) -> [IpAddr; 2] {
        [self.v4, self.v6]
    }
}

/// The standard topology:
///
/// ```text
///  pods ── cni0 ┐                        ┌── cloud      169.254.169.254, fd00:ec2::254 ("cloud" on :80)
///  (bridge+     │ node  (proxy "proxy"   ├── remote-in  10.10.0.2, fd00:aa::2   (who-am-i :7777)
///   host-local) │        on :8181)       └── remote-out 11.0.0.2, 2001:db8:bb::2 (who-am-i :7777)
/// ```
/// The node's default routes point at remote-out, so its primary addresses are 11.0.0.1 and
/// 2001:db8:bb::1. Every host routes back through the node.
pub struct World {
    pub h: Harness,
    pub node: Netns,
    pub cloud: Netns,
    pub remote_in: Netns,
    pub remote_out: Netns,
    pub proxy: Server,
    pub cloud_http: Server,
}

impl World {
    pub fn new(test: &str) -> World {
        let h = Harness::new(test);
        require_tools(&[
            "nft",
            "conntrack",
            "busybox",
            "socat",
            "iptables-nft",
            "iptables-legacy",
        ]);
        let node = h.netns("node");
        node.sysctl("net.ipv4.ip_forward", "1");
        node.sysctl("net.ipv6.conf.all.forwarding", "1");

        let cloud = h.netns("cloud");
        veth(&node, "to-cloud", &cloud, "eth0");
        node.addr("to-cloud", "10.20.0.1/30");
        node.addr("to-cloud", "fd00:c1::1/64");
        cloud.addr("eth0", "10.20.0.2/30");
        cloud.addr("eth0", "fd00:c1::2/64");
        cloud.addr("lo", &format!("{META4}/32"));
        cloud.addr("lo", &format!("{META6}/128"));
        cloud.route("default", "10.20.0.1");
        cloud.route("default", "fd00:c1::1");
        node.route(&format!("{META4}/32"), "10.20.0.2");
        node.route(&format!("{META6}/128"), "fd00:c1::2");

        let remote_in = h.netns("rin");
        veth(&node, "to-rin", &remote_in, "eth0");
        node.addr("to-rin", &format!("{NODE_IN4}/24"));
        node.addr("to-rin", &format!("{NODE_IN6}/64"));
        remote_in.addr("eth0", &format!("{REMOTE_IN4}/24"));
        remote_in.addr("eth0", &format!("{REMOTE_IN6}/64"));
        remote_in.route("default", &NODE_IN4.to_string());
        remote_in.route("default", &NODE_IN6.to_string());

        let remote_out = h.netns("rout");
        veth(&node, "to-rout", &remote_out, "eth0");
        node.addr("to-rout", &format!("{NODE_OUT4}/24"));
        node.addr("to-rout", &format!("{NODE_OUT6}/64"));
        remote_out.addr("eth0", &format!("{REMOTE_OUT4}/24"));
        remote_out.addr("eth0", &format!("{REMOTE_OUT6}/64"));
        remote_out.route("default", &NODE_OUT4.to_string());
        remote_out.route("default", &NODE_OUT6.to_string());
        node.route("default", &REMOTE_OUT4.to_string());
        node.route("default", &REMOTE_OUT6.to_string());

        let cloud_http = h.http_server(&cloud, HTTP_PORT, "cloud");
        let proxy = h.http_server(&node, PROXY_PORT, "proxy");
        h.whoami_server(&remote_in, WHOAMI_PORT);
        h.whoami_server(&remote_out, WHOAMI_PORT);
        World {
            h,
            node,
            cloud,
            remote_in,
            remote_out,
            proxy,
            cloud_http,
        }
    }

    pub fn dir(&self) -> &Path {
        self.h.dir()
    }

    /// natguard's entry as the tests use it: `logFile` in the test dir, nonMasqueradeCIDRs
    /// [`non_masq`], everything else default, then `patch` merged in.
    pub fn natguard(&self, patch: Value) -> Value {
        let mut conf = json!({
            "type": "natguard",
            "masquerade": { "nonMasqueradeCIDRs": non_masq() },
            "logFile": self.dir().join("natguard.log"),
        });
        merge(&mut conf, &patch);
        conf
    }

    /// A bridge + host-local (dual stack) entry for network number `index` (bridge
    /// `cni<index>`, subnets [`pod_subnet4`]/[`pod_subnet6`]); IPAM state in the test dir.
    pub fn bridge(&self, name: &str, index: u8) -> Value {
        json!({
            "type": "bridge",
            "bridge": format!("cni{index}"),
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir().join(format!("ipam-{name}")),
                "ranges": [
                    [{ "subnet": pod_subnet4(index) }],
                    [{ "subnet": pod_subnet6(index) }]
                ],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
            }
        })
    }

    /// A conflist: the bridge entry of network `index`, then natguard (if given).
    pub fn list(&self, name: &str, version: &str, index: u8, natguard: Option<Value>) -> Value {
        let mut plugins = vec![self.bridge(name, index)];
        plugins.extend(natguard);
        json!({ "cniVersion": version, "name": name, "plugins": plugins })
    }

    /// A chain driver for `list`, run in the node namespace, cache in the test dir.
    pub fn chain(&self, list: Value) -> Chain {
        Chain::new(&self.node, list, &self.dir().join("cache"))
    }

    /// Creates pod namespace `role` and ADDs it (container ID `cid-<role>`, CNI_ARGS of a
    /// Kubernetes pod in `k8s_namespace`).
    pub fn try_add_pod(&self, chain: &Chain, role: &str, k8s_namespace: &str) -> CniResult<Pod> {
        let ns = self.h.netns(role);
        let att = Attachment::new(&format!("cid-{role}"), &ns).k8s(k8s_namespace, role);
        self.try_attach(chain, ns, att)
    }

    /// ADDs an existing namespace with a given attachment.
    pub fn try_attach(&self, chain: &Chain, ns: Netns, att: Attachment) -> CniResult<Pod> {
        let result = chain.add(&att)?;
        let ips = result_ips(&result, &att.ifname);
        let v4 = *ips
            .iter()
            .find(|i| i.is_ipv4())
            .unwrap_or_else(|| panic!("no IPv4 address in result {result}"));
        let v6 = *ips
            .iter()
            .find(|i| i.is_ipv6())
            .unwrap_or_else(|| panic!("no IPv6 address in result {result}"));
        Ok(Pod {
            ns,
            att,
            result,
            v4,
            v6,
        })
    }

    /// Like [`World::try_add_pod`]; panics with the plugin's error.
    pub fn add_pod(&self, chain: &Chain, role: &str, k8s_namespace: &str) -> Pod {
        self.try_add_pod(chain, role, k8s_namespace)
            .unwrap_or_else(|e| panic!("ADD of pod {role} failed: {e}"))
    }

    /// `nft list table inet natguard` in the node namespace.
    pub fn table(&self) -> Option<String> {
        nft_table(&self.node)
    }

    /// Runs a command line (split on whitespace) in the node namespace, e.g. an iptables rule
    /// of another component.
    pub fn on_node(&self, cmdline: &str) -> String {
        let args: Vec<&str> = cmdline.split_whitespace().collect();
        self.node.run(&args)
    }

    /// Stops the node-local proxy.
    pub fn stop_proxy(&self) {
        self.h.stop(&self.proxy);
    }

    /// Replaces the cloud metadata server and the node-local proxy with keep-alive servers
    /// ([`Harness::keepalive_http_server`]; same bodies "cloud" and "proxy", same ports), for
    /// tests whose clients reuse one connection.
    pub fn use_keepalive_servers(&mut self) {
        self.h.stop(&self.cloud_http);
        self.h.stop(&self.proxy);
        self.cloud_http = self
            .h
            .keepalive_http_server(&self.cloud, HTTP_PORT, "cloud");
        self.proxy = self
            .h
            .keepalive_http_server(&self.node, PROXY_PORT, "proxy");
    }

    fn dump(&self) {
        let sh = |ns: &Netns, args: &[&str]| -> String {
            match ns.try_run(args) {
                Ok(s) => s,
                Err(e) => e,
            }
        };
        eprintln!(
            "==== node: nft list ruleset ====\n{}",
            sh(&self.node, &["nft", "list", "ruleset"])
        );
        eprintln!(
            "==== node: iptables-legacy-save ====\n{}",
            sh(&self.node, &["iptables-legacy-save"])
        );
        eprintln!(
            "==== node: ip addr ====\n{}",
            sh(&self.node, &["ip", "-br", "addr"])
        );
        eprintln!(
            "==== node: ip route ====\n{}",
            sh(&self.node, &["ip", "route"])
        );
        eprintln!(
            "==== node: ip -6 route ====\n{}",
            sh(&self.node, &["ip", "-6", "route"])
        );
        if let Ok(entries) = fs::read_dir(self.dir()) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = fs::read_to_string(&p).unwrap_or_default();
                    if !text.trim().is_empty() {
                        eprintln!("==== {} ====\n{text}", p.display());
                    }
                }
            }
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
    }
}
