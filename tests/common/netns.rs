//! Network namespaces and the RAII [`Harness`] that owns them.
//!
//! A [`Harness`] creates namespaces named `ng-<test>-<pid>-<role>`, starts processes inside them
//! (each in a process group of its own) and removes all of it when dropped, also when the test
//! panics. [`Netns`] has the `ip` helpers that build topologies. The servers are an HTTP
//! responder with a fixed body (busybox httpd, or a keep-alive one in Python) and a TCP/UDP
//! "who am I" echo that answers with the client's source address as it saw it (socat).

use super::*;

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

    /// The namespaces this harness created and has not deleted yet (a failing test's dump).
    pub fn netns_list(&self) -> Vec<Netns> {
        lock(&self.netns)
            .iter()
            .map(|name| Netns { name: name.clone() })
            .collect()
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
            start.elapsed() < deadline(READY_TIMEOUT),
            "{proto} port {port} in {} never got {count} listener(s); ss says:\n{out}",
            ns.name
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
