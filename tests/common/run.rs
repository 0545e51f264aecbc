//! Running the natguard binary the way a container runtime does, inside a test's namespace.
//! The chain driver ([`super::Chain`]) runs the other plugins of a conflist through it too.
//!
//! [`Natguard`] describes one invocation: arguments, exactly this environment (nothing is
//! inherited, except by the other plugins, as libcni passes the runtime's own on), exactly this
//! stdin (or none at all), and optionally a seccomp filter (fault
//! injection), one more directory bind-mounted over a path, a cgroup to join, and the
//! capabilities a DaemonSet's container has (`CAP_NET_ADMIN` alone: the bounding set cut to it
//! before exec, as a container runtime does, so root's exec gets no other). The child
//! joins the network namespace between fork and exec (`setns(2)` in `pre_exec`), so the test
//! process never moves and no `nsenter` or `ip netns exec` sits between the test and natguard.
//!
//! Every invocation runs in a private mount namespace that gives the test's network namespace
//! a node's state of its own, kept per network namespace ([`node_dir`]) so that the invocations
//! of one test's node share it: `/run` (the node lock; the host's `/run/netns` stays visible
//! in it), `/var/lib` (the runtimes' result cache, `/var/lib/cni/results`, which
//! [`super::World`]'s chains write there) and `/etc/cni` where the host has one. The host's
//! `/run/natguard`, `/var/lib/cni` and `/etc/cni` are never read or written, so a test passes
//! the same on a machine where natguard was installed before.
//!
//! Every invocation has a deadline. One that has not exited by then is killed and fails the test
//! with what it was running: a bound for failure reports, never an assertion on speed. What it
//! did comes back as an [`Invocation`].

use super::{natguard_bin, Netns};
use serde_json::Value;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, Barrier};
use std::time::Duration;

/// The default deadline of one invocation; far above what any of them needs.
pub const INVOCATION_BOUND: Duration = Duration::from_secs(120);

/// How a bind mount is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    ReadOnly,
}

/// A directory bind-mounted over `target` in a mount namespace of the child's own.
#[derive(Clone, Debug)]
struct BindMount {
    source: PathBuf,
    target: String,
    access: Access,
}

/// A seccomp filter applied to natguard right before exec (fault injection).
#[derive(Clone)]
pub struct Seccomp(Vec<libc::sock_filter>);

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

impl Seccomp {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;

    fn stmt(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: Self::JEQ_K,
            jt,
            jf,
            k,
        }
    }

    /// A filter program written by the test itself (classic BPF over `seccomp_data`).
    pub fn program(filter: Vec<libc::sock_filter>) -> Seccomp {
        Seccomp(filter)
    }

    /// `socket(AF_NETLINK, *, NETLINK_NETFILTER)` fails with `errno`: a kernel without
    /// nfnetlink (or a runtime whose seccomp profile forbids it).
    pub fn no_netfilter_socket(errno: i32) -> Seccomp {
        // seccomp_data: nr @0, arch @4, args[0] @16, args[2] @32 (low words, little endian).
        Seccomp(vec![
            Self::stmt(Self::LD_W_ABS, 4),
            Self::jeq(AUDIT_ARCH, 0, 6),
            Self::stmt(Self::LD_W_ABS, 0),
            Self::jeq(libc::SYS_socket as u32, 0, 4),
            Self::stmt(Self::LD_W_ABS, 16),
            Self::jeq(libc::AF_NETLINK as u32, 0, 2),
            Self::stmt(Self::LD_W_ABS, 32),
            Self::jeq(libc::NETLINK_NETFILTER as u32, 1, 0),
            Self::stmt(Self::RET_K, Self::RET_ALLOW),
            Self::stmt(Self::RET_K, Self::RET_ERRNO | errno as u32),
        ])
    }

    /// Every `sendto`/`sendmsg` fails with `errno` (natguard sends only netlink messages): a
    /// kernel that keeps answering "try again".
    pub fn sends_fail(errno: i32) -> Seccomp {
        Seccomp(vec![
            Self::stmt(Self::LD_W_ABS, 4),
            Self::jeq(AUDIT_ARCH, 0, 4),
            Self::stmt(Self::LD_W_ABS, 0),
            Self::jeq(libc::SYS_sendto as u32, 3, 0),
            Self::jeq(libc::SYS_sendmsg as u32, 2, 0),
            Self::stmt(Self::RET_K, Self::RET_ALLOW),
            Self::stmt(Self::RET_K, Self::RET_ALLOW),
            Self::stmt(Self::RET_K, Self::RET_ERRNO | errno as u32),
        ])
    }
}

/// One invocation of natguard (or, for the chain driver, of another CNI plugin), to be run with
/// [`Natguard::run_in`].
#[derive(Clone)]
pub struct Natguard {
    /// `None`: the natguard binary under test.
    program: Option<PathBuf>,
    /// Whether the test process's environment is passed on under [`Natguard::env`]'s variables.
    inherit_env: bool,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// `None`: stdin is /dev/null.
    stdin: Option<Vec<u8>>,
    seccomp: Option<Seccomp>,
    mount: Option<BindMount>,
    cgroup: Option<PathBuf>,
    net_admin_only: bool,
    bound: Duration,
}

impl Default for Natguard {
    fn default() -> Natguard {
        Natguard::new()
    }
}

impl Natguard {
    /// No arguments, an empty environment, an empty stdin pipe, [`INVOCATION_BOUND`].
    pub fn new() -> Natguard {
        Natguard {
            program: None,
            inherit_env: false,
            args: Vec::new(),
            env: Vec::new(),
            stdin: Some(Vec::new()),
            seccomp: None,
            mount: None,
            cgroup: None,
            net_admin_only: false,
            bound: INVOCATION_BOUND,
        }
    }

    /// A CNI invocation: `env` and `stdin`.
    pub fn cni<K: AsRef<OsStr>, V: AsRef<OsStr>>(env: &[(K, V)], stdin: &[u8]) -> Natguard {
        Natguard::new().env(env).stdin(stdin)
    }

    /// Runs the CNI plugin `program` instead of natguard, as libcni does: with the runtime's own
    /// environment under the `CNI_*` variables (see [`super::Chain`]).
    pub fn plugin(mut self, program: &Path) -> Natguard {
        self.program = Some(program.to_path_buf());
        self.inherit_env = true;
        self
    }

    /// Appends command-line arguments (a subcommand such as `reconcile` and its options).
    pub fn args<S: AsRef<OsStr>>(mut self, args: &[S]) -> Natguard {
        self.args
            .extend(args.iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Appends environment variables (values may be any bytes).
    pub fn env<K: AsRef<OsStr>, V: AsRef<OsStr>>(mut self, env: &[(K, V)]) -> Natguard {
        self.env.extend(
            env.iter()
                .map(|(k, v)| (k.as_ref().to_os_string(), v.as_ref().to_os_string())),
        );
        self
    }

    /// What natguard reads on stdin (written from a thread: it may exceed a pipe buffer).
    pub fn stdin(mut self, data: &[u8]) -> Natguard {
        self.stdin = Some(data.to_vec());
        self
    }

    /// No stdin at all (/dev/null), as a runtime that forgot it would give.
    pub fn no_stdin(mut self) -> Natguard {
        self.stdin = None;
        self
    }

    pub fn seccomp(mut self, filter: &Seccomp) -> Natguard {
        self.seccomp = Some(filter.clone());
        self
    }

    /// Runs natguard in a mount namespace of its own (private propagation, so nothing reaches
    /// the host) with `source` bind-mounted on `target`.
    pub fn bind_mount(mut self, source: &Path, target: &str, access: Access) -> Natguard {
        self.mount = Some(BindMount {
            source: source.to_path_buf(),
            target: target.to_string(),
            access,
        });
        self
    }

    /// Moves natguard into the cgroup whose `cgroup.procs` is `procs` before exec.
    pub fn join_cgroup(mut self, procs: &Path) -> Natguard {
        self.cgroup = Some(procs.to_path_buf());
        self
    }

    /// Runs with `CAP_NET_ADMIN` as its only capability, as the shipped DaemonSet's container
    /// does (after the mounts, which need more).
    pub fn net_admin_only(mut self) -> Natguard {
        self.net_admin_only = true;
        self
    }

    /// Another deadline than [`INVOCATION_BOUND`].
    pub fn bound(mut self, bound: Duration) -> Natguard {
        self.bound = bound;
        self
    }

    /// How the invocation reads in failure reports (`CNI_PATH` left out, stdin cut short).
    fn describe(&self, ns: &Netns) -> String {
        let mut s = match &self.program {
            Some(p) => p.display().to_string(),
            None => String::from("natguard"),
        };
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        let env: Vec<String> = self
            .env
            .iter()
            .filter(|(k, _)| k != "CNI_PATH")
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
            .collect();
        s.push_str(&format!(" [{}] in {}", env.join(" "), ns.name));
        if self.seccomp.is_some() {
            s.push_str(" under a seccomp filter");
        }
        if let Some(m) = &self.mount {
            let ro = if m.access == Access::ReadOnly {
                " (read-only)"
            } else {
                ""
            };
            s.push_str(&format!(" with {} on {}{ro}", m.source.display(), m.target));
        }
        if let Some(c) = &self.cgroup {
            s.push_str(&format!(" in cgroup {}", c.display()));
        }
        if self.net_admin_only {
            s.push_str(" with CAP_NET_ADMIN only");
        }
        match &self.stdin {
            Some(data) => {
                let shown: String = String::from_utf8_lossy(data).chars().take(400).collect();
                s.push_str(&format!(" <<< {shown}"));
            }
            None => s.push_str(" (no stdin)"),
        }
        s
    }

    /// Starts the invocation in `ns` without waiting (a long-running `install --watch`), with
    /// stdin from /dev/null and stdout and stderr appended to `log`. The caller stops it.
    pub fn spawn_in(&self, ns: &Netns, log: &Path) -> std::process::Child {
        let what = self.describe(ns);
        let nsfile = File::open(ns.path()).unwrap_or_else(|e| panic!("open {}: {e}", ns.path()));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let mut cmd = Command::new(self.program.clone().unwrap_or_else(natguard_bin));
        if !self.inherit_env {
            cmd.env_clear();
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out);
        let setup = ChildSetup::new(nsfile.as_raw_fd(), NodeState::for_netns(ns), self);
        // SAFETY: as in run_in.
        unsafe {
            cmd.pre_exec(move || setup.apply());
        }
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
    }

    /// Runs the invocation in `ns` and waits for it, at most for its deadline.
    pub fn run_in(&self, ns: &Netns) -> Invocation {
        let what = self.describe(ns);
        let nsfile = File::open(ns.path()).unwrap_or_else(|e| panic!("open {}: {e}", ns.path()));
        let mut cmd = Command::new(self.program.clone().unwrap_or_else(natguard_bin));
        if !self.inherit_env {
            cmd.env_clear();
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let setup = ChildSetup::new(nsfile.as_raw_fd(), NodeState::for_netns(ns), self);
        // SAFETY: only async-signal-safe syscalls (setns, unshare, mount, open, write, close,
        // prctl) run between fork and exec, on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || setup.apply());
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        drop(nsfile);
        let writer = match (child.stdin.take(), &self.stdin) {
            (Some(mut pipe), Some(data)) => {
                let data = data.clone();
                // natguard may exit before it has read everything: EPIPE is not an error here.
                Some(std::thread::spawn(move || {
                    let _ = pipe.write_all(&data);
                }))
            }
            _ => None,
        };
        let pid = child.id() as libc::pid_t;
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let out = child.wait_with_output();
            let _ = tx.send(());
            out
        });
        if rx.recv_timeout(super::deadline(self.bound)).is_err() {
            let name = self
                .program
                .as_ref()
                .map_or("natguard".to_string(), |p| p.display().to_string());
            // SAFETY: plain syscall; the child is not reaped until the waiter returns, so the
            // pid is still natguard's.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            let _ = waiter.join();
            panic!(
                "{name} did not exit within {:?} (it hangs): {what}",
                self.bound
            );
        }
        let out = waiter
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
            .expect("wait for the plugin");
        if let Some(w) = writer {
            let _ = w.join();
        }
        Invocation {
            what,
            status: out.status,
            exit: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            raw_stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The private node state of one network namespace (see the module doc), prepared before the
/// fork: `run` goes on `/run`, `keep` holds the host's `/run/netns` meanwhile, `covers` are
/// (directory of the node's, host path it goes on).
struct NodeState {
    netns_dir: CString,
    run: CString,
    keep: CString,
    covers: Vec<(CString, CString)>,
}

/// The directory that holds the node state of the invocations in `ns`: `run/` is their `/run`
/// (`run/natguard` their `/run/natguard`), `var-lib/` their `/var/lib`, `etc-cni/` their
/// `/etc/cni`.
pub fn node_dir(ns: &Netns) -> PathBuf {
    std::env::temp_dir().join(format!("ng-node-{}", ns.name))
}

impl NodeState {
    fn for_netns(ns: &Netns) -> NodeState {
        let base = node_dir(ns);
        for d in ["run", "keep", "var-lib", "etc-cni"] {
            std::fs::create_dir_all(base.join(d))
                .unwrap_or_else(|e| panic!("create {}: {e}", base.join(d).display()));
        }
        let c = |d: &str| c_path(base.join(d).as_os_str());
        NodeState {
            netns_dir: CString::from(c"/run/netns"),
            run: c("run"),
            keep: c("keep"),
            covers: [("var-lib", "/var/lib"), ("etc-cni", "/etc/cni")]
                .into_iter()
                .filter(|(_, host)| Path::new(host).is_dir())
                .map(|(mine, host)| (c(mine), c_path(OsStr::new(host))))
                .collect(),
        }
    }

    /// Enters a mount namespace of the calling process's own in which `/run` (with the host's
    /// `/run/netns` still visible), `/var/lib` and `/etc/cni` are this node's. Between fork and
    /// exec, or in a helper process before it execs.
    fn enter(&self) -> io::Result<()> {
        // SAFETY: plain syscalls on C strings owned by `self`.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Slave propagation first: the bind mounts below must not reach the host, and the
            // host's later mounts (the network namespaces of pods started after this process,
            // under /run/netns) reach this process, as a DaemonSet's `HostToContainer` mount
            // of /run/netns gives its container.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ))?;
            let bind = |source: &CString, target: &CStr| {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))
            };
            let n = self;
            bind(&n.netns_dir, &n.keep)?;
            bind(&n.run, c"/run")?;
            let rc = libc::mkdir(c"/run/netns".as_ptr(), 0o755);
            if rc != 0 && *libc::__errno_location() != libc::EEXIST {
                return Err(io::Error::last_os_error());
            }
            bind(&n.keep, c"/run/netns")?;
            for (mine, host) in &n.covers {
                bind(mine, host)?;
            }
        }
        Ok(())
    }
}

/// Makes `cmd` run in the node state of `ns` (its `/run`, `/var/lib` and `/etc/cni`, in a
/// mount namespace of its own), as every natguard invocation of that node does: for helpers
/// that start natguard themselves (a subreaper, an inherited descriptor), so that they never
/// use the host's `/run/natguard`. The network namespace stays the helper's to enter.
pub fn in_node_state<'a>(cmd: &'a mut Command, ns: &Netns) -> &'a mut Command {
    let node = NodeState::for_netns(ns);
    // SAFETY: only async-signal-safe syscalls (unshare, mount, mkdir) run between fork and
    // exec, on data prepared before the fork.
    unsafe { cmd.pre_exec(move || node.enter()) }
}

/// What the child does between fork and exec, prepared before the fork.
struct ChildSetup {
    netns_fd: libc::c_int,
    node: NodeState,
    /// (source, target, read-only)
    mount: Option<(CString, CString, bool)>,
    cgroup_procs: Option<CString>,
    net_admin_only: bool,
    seccomp: Option<Vec<libc::sock_filter>>,
}

/// `CAP_NET_ADMIN` (linux/capability.h).
const CAP_NET_ADMIN: libc::c_ulong = 12;
/// Above every capability a kernel has; `PR_CAPBSET_DROP` of an unknown one fails with EINVAL.
const CAP_BEYOND: libc::c_ulong = 64;

/// `struct __user_cap_header_struct` and `__user_cap_data_struct` (version 3: two of them).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Leaves `CAP_NET_ADMIN` as the only capability the next exec can give: the bounding set cut
/// to it, the inheritable and ambient sets emptied. Between fork and exec.
///
/// # Safety
/// Plain syscalls on stack data.
unsafe fn keep_only_net_admin() -> io::Result<()> {
    for cap in 0..CAP_BEYOND {
        if cap != CAP_NET_ADMIN
            && libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
            && *libc::__errno_location() != libc::EINVAL
        {
            return Err(io::Error::last_os_error());
        }
    }
    if libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0,
        0,
        0,
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    if libc::syscall(
        libc::SYS_capget,
        &mut hdr as *mut CapHeader,
        data.as_mut_ptr(),
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    for d in &mut data {
        d.inheritable = 0;
    }
    if libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn c_path(p: &OsStr) -> CString {
    CString::new(p.as_bytes()).expect("a path without NUL bytes")
}

impl ChildSetup {
    fn new(netns_fd: libc::c_int, node: NodeState, inv: &Natguard) -> ChildSetup {
        ChildSetup {
            netns_fd,
            node,
            mount: inv.mount.as_ref().map(|m| {
                (
                    c_path(m.source.as_os_str()),
                    c_path(OsStr::new(&m.target)),
                    m.access == Access::ReadOnly,
                )
            }),
            cgroup_procs: inv.cgroup.as_ref().map(|p| c_path(p.as_os_str())),
            net_admin_only: inv.net_admin_only,
            seccomp: inv.seccomp.as_ref().map(|s| s.0.clone()),
        }
    }

    /// Runs in the child. The seccomp filter comes last: it may forbid what the rest needs.
    fn apply(&self) -> io::Result<()> {
        // SAFETY: plain syscalls on descriptors and C strings owned by `self`.
        unsafe {
            check(libc::setns(self.netns_fd, libc::CLONE_NEWNET))?;
            self.node.enter()?;
            if let Some((source, target, read_only)) = &self.mount {
                let rc = libc::mkdir(target.as_ptr(), 0o755);
                if rc != 0 && *libc::__errno_location() != libc::EEXIST {
                    return Err(io::Error::last_os_error());
                }
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
                if *read_only {
                    check(libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
            }
            if let Some(procs) = &self.cgroup_procs {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1) == 1;
                let err = io::Error::last_os_error();
                libc::close(fd);
                if !written {
                    return Err(err);
                }
            }
            if self.net_admin_only {
                keep_only_net_admin()?;
            }
            if let Some(p) = &self.seccomp {
                let fprog = libc::sock_fprog {
                    len: p.len() as u16,
                    filter: p.as_ptr() as *mut libc::sock_filter,
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &fprog as *const libc::sock_fprog,
                    ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// What one invocation of natguard did.
pub struct Invocation {
    /// The invocation as [`Natguard`] describes it, for failure reports.
    pub what: String,
    pub status: ExitStatus,
    /// The exit code; `None` when a signal ended it.
    pub exit: Option<i32>,
    /// stdout as text (invalid UTF-8 replaced); [`Invocation::raw_stdout`] has the bytes.
    pub stdout: String,
    pub raw_stdout: Vec<u8>,
    pub stderr: String,
}

impl fmt::Display for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> exit {:?}\nstdout: {}\nstderr: {}",
            self.what,
            self.exit,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

impl Invocation {
    /// The signal that ended natguard, if one did.
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }

    /// Panics unless the invocation exited 0.
    #[track_caller]
    pub fn succeeded(self) -> Invocation {
        assert_eq!(self.exit, Some(0), "expected success: {self}");
        self
    }

    /// The JSON on stdout.
    #[track_caller]
    pub fn reply(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"))
    }

    /// Asserts a CNI error with `code` whose msg/details mention every one of `needles`.
    #[track_caller]
    pub fn fails_with(&self, code: u64, needles: &[&str]) {
        assert_eq!(self.exit, Some(1), "expected exit 1 (a CNI error): {self}");
        let r = self.reply();
        assert_eq!(
            r["code"].as_u64(),
            Some(code),
            "wrong CNI error code: {self}"
        );
        let text = format!(
            "{} {}",
            r["msg"].as_str().unwrap_or(""),
            r["details"].as_str().unwrap_or("")
        );
        for n in needles {
            assert!(
                text.contains(n),
                "the error message should name {n:?}: {self}"
            );
        }
    }
}

/// Runs every job on its own thread, all released at once behind a barrier; results in job
/// order.
pub fn parallel<T: Send>(jobs: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    let barrier = Barrier::new(jobs.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let b = &barrier;
                s.spawn(move || {
                    b.wait();
                    job()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}
