//! Hardening root tests: concurrency, churn, faults and security.
//!
//! Most tests run the real binary directly (CNI environment + a synthetic dual-stack prevResult
//! on stdin) in a network namespace of their own: natguard never looks at the pod's interface,
//! so kernel-state assertions need no real pods, and thousands of invocations stay fast. The
//! security tests that need real traffic use the standard topology of `common::World`.
//!
//! Kernel state is read with `nft -j list table inet natguard` and compared with a model of the
//! live pods: every live pod's entries are there, nothing else is, and the shared rules are
//! exactly those of one config. Needs root; never skips.

mod common;

use common::*;
use natguard::plan::{self, OwnerKey, PodRef};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// The network every synthetic test uses.
const NET: &str = "hnet";
/// Upper bound for one natguard invocation (a bound for failure reports, not a speed assertion).
const INVOCATION_BOUND: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Running the binary inside a namespace
// ---------------------------------------------------------------------------------------------

/// What one invocation of natguard did.
struct Inv {
    what: String,
    exit: Option<i32>,
    stdout: String,
    stderr: String,
}

impl fmt::Display for Inv {
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

impl Inv {
    /// Panics unless the invocation exited 0.
    fn succeeded(self) -> Inv {
        assert_eq!(self.exit, Some(0), "expected success: {self}");
        self
    }

    /// The JSON on stdout.
    fn reply(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"))
    }

    /// Asserts a CNI error with `code` whose msg/details mention every one of `needles`.
    fn fails_with(&self, code: u64, needles: &[&str]) {
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

/// A seccomp filter applied to natguard before it starts (fault injection).
#[derive(Clone)]
struct Filter(Vec<libc::sock_filter>);

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

impl Filter {
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

    /// `socket(AF_NETLINK, *, NETLINK_NETFILTER)` fails with `errno`: a kernel without
    /// nfnetlink (or a runtime whose seccomp profile forbids it).
    fn no_netfilter_socket(errno: i32) -> Filter {
        // seccomp_data: nr @0, arch @4, args[0] @16, args[2] @32 (low words, little endian).
        Filter(vec![
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
    fn sends_fail(errno: i32) -> Filter {
        Filter(vec![
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

/// Runs natguard with `args`, exactly `env` (nothing inherited) and `stdin`, inside `ns`
/// (the child joins the namespace between fork and exec; the test process never moves).
fn exec(
    ns: &Netns,
    args: &[&str],
    env: &[(String, String)],
    stdin: &[u8],
    filter: Option<&Filter>,
) -> Inv {
    let nsfile = File::open(ns.path()).unwrap_or_else(|e| panic!("open {}: {e}", ns.path()));
    let fd = nsfile.as_raw_fd();
    let prog = filter.cloned();
    let mut cmd = Command::new(natguard_bin());
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe syscalls (setns, prctl) run between fork and exec; the
    // filter was built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(Filter(p)) = &prog {
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
            Ok(())
        });
    }
    let what = format!(
        "natguard {} [{}] in {} <<< {}",
        args.join(" "),
        env.iter()
            .filter(|(k, _)| k != "CNI_PATH")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        ns.name,
        String::from_utf8_lossy(stdin)
            .chars()
            .take(400)
            .collect::<String>()
    );
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    drop(nsfile);
    {
        let mut input = child.stdin.take().expect("stdin");
        let _ = input.write_all(stdin);
    }
    // Replies are far smaller than a pipe buffer: wait, then read.
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for natguard") {
            break s;
        }
        if start.elapsed() > INVOCATION_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("natguard did not exit within {INVOCATION_BOUND:?}: {what}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    let _ = child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout);
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    Inv {
        what,
        exit: status.code(),
        stdout,
        stderr,
    }
}

// ---------------------------------------------------------------------------------------------
// Synthetic pods and configs
// ---------------------------------------------------------------------------------------------

/// A pod as natguard sees it: IDs, CNI_ARGS and a dual-stack prevResult.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SynPod {
    cid: String,
    ifname: String,
    k8s_ns: String,
    name: String,
    v4: IpAddr,
    v6: IpAddr,
    /// Its network namespace no longer exists (the pod vanished without a DEL).
    vanished: bool,
    /// ADDed under a config in `proxy` mode ([`cfg_a`]); `false` for `deny` ([`cfg_b`]).
    proxied: bool,
}

impl SynPod {
    /// Pod `i` of the test `tag`, addresses of generation `gen` (a re-ADD with another
    /// generation changes the pod's addresses).
    fn new(tag: &str, i: u32, gen: u32) -> SynPod {
        let k8s_ns = if i.is_multiple_of(5) {
            "kube-system"
        } else {
            "default"
        };
        SynPod {
            cid: format!("{tag}{i:05}"),
            ifname: if i % 7 == 3 { "net1" } else { "eth0" }.into(),
            k8s_ns: k8s_ns.into(),
            name: format!("pod-{i}"),
            v4: IpAddr::V4(Ipv4Addr::new(
                10,
                (64 + gen) as u8,
                (i >> 8) as u8,
                (i & 0xff) as u8,
            )),
            v6: IpAddr::V6(Ipv6Addr::new(0xfd00, 1, gen as u16, 0, 0, 0, 0, i as u16)),
            vanished: false,
            proxied: true,
        }
    }

    /// Marks the pod as ADDed under [`cfg_b`] (`deny` mode) rather than [`cfg_a`].
    fn denied(mut self, deny: bool) -> SynPod {
        self.proxied = !deny;
        self
    }

    fn vanished(mut self) -> SynPod {
        self.vanished = true;
        self
    }

    fn with_addrs(mut self, v4: &str, v6: &str) -> SynPod {
        self.v4 = v4.parse().unwrap();
        self.v6 = v6.parse().unwrap();
        self
    }

    fn exempt(&self) -> bool {
        self.k8s_ns == "kube-system"
    }

    fn addrs(&self) -> Vec<IpAddr> {
        vec![self.v4, self.v6]
    }

    fn owner(&self) -> String {
        OwnerKey::new(NET, &self.cid, &self.ifname).hex()
    }

    fn comment(&self) -> String {
        plan::pod_comment(
            &PodRef {
                network: NET,
                container_id: &self.cid,
                ifname: &self.ifname,
                namespace: Some(&self.k8s_ns),
                pod_name: Some(&self.name),
                netns: "",
                host: None,
            },
            &self.addrs(),
        )
    }

    /// The host-side interface of [`SynPod::result`]; no such link exists in the test's
    /// namespace, so natguard takes it as a routed interface, as reported.
    fn host_iface(&self) -> String {
        format!("veth{}", &self.cid[self.cid.len().saturating_sub(8)..])
    }

    /// The `NET-att` record natguard keeps for this pod.
    fn attach_comment(&self) -> String {
        format!("if={} port=- netns={}", self.host_iface(), pod_netns(self))
    }

    fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.k8s_ns, self.name, self.cid
        )
    }

    /// A bridge-style 1.1.0 result: host veth, then the pod interface in `sandbox`.
    fn result(&self, sandbox: &str) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                { "name": self.host_iface() },
                { "name": self.ifname, "sandbox": sandbox }
            ],
            "ips": [
                { "address": format!("{}/16", self.v4), "interface": 1 },
                { "address": format!("{}/64", self.v6), "interface": 1 }
            ],
            "dns": {}
        })
    }
}

/// Config A: proxy mode (fixed proxy addresses, so no route lookups), port 80, kube-system
/// exempt.
fn cfg_a() -> Value {
    json!({
        "type": "natguard",
        "metadata": {
            "mode": "proxy",
            "ports": [80],
            "proxyIPv4": "10.0.0.1",
            "proxyIPv6": "fd00::1",
            "exemptNamespaces": ["kube-system"]
        },
        "masquerade": { "nonMasqueradeCIDRs": non_masq() }
    })
}

/// Config B: deny mode, ports 80 and 8080; the same pods are intercepted as with A.
fn cfg_b() -> Value {
    let mut c = cfg_a();
    c["metadata"]["mode"] = json!("deny");
    c["metadata"]["ports"] = json!([80, 8080]);
    c
}

/// natguard's stdin: the plugin entry as libcni injects it.
fn stdin_of(cfg: &Value, prev: Option<Value>) -> Vec<u8> {
    let mut c = cfg.clone();
    c["cniVersion"] = json!("1.1.0");
    c["name"] = json!(NET);
    if let Some(p) = prev {
        c["prevResult"] = p;
    }
    serde_json::to_vec(&c).unwrap()
}

fn env_of(verb: &str, pod: Option<&SynPod>, netns: &str) -> Vec<(String, String)> {
    let mut e = vec![
        ("CNI_COMMAND".to_string(), verb.to_string()),
        ("CNI_PATH".to_string(), "/opt/cni/bin".to_string()),
        ("CNI_NETNS".to_string(), netns.to_string()),
    ];
    if let Some(p) = pod {
        e.push(("CNI_CONTAINERID".into(), p.cid.clone()));
        e.push(("CNI_IFNAME".into(), p.ifname.clone()));
        e.push(("CNI_ARGS".into(), p.cni_args()));
    }
    e
}

/// The pod's netns path as the runtime passes it. natguard never enters it; it only asks
/// whether it still exists when another attachment shares an address, to tell a live owner
/// from a dead one. So a synthetic pod's path is a file that exists for as long as the pod is
/// meant to be alive.
fn pod_netns(p: &SynPod) -> String {
    if p.vanished {
        return format!("/run/netns/ng-gone-{}", p.cid);
    }
    let dir = std::env::temp_dir().join("ng-hardening-netns");
    let _ = fs::create_dir_all(&dir);
    let path = dir.join(&p.cid);
    let _ = File::create(&path);
    path.display().to_string()
}

fn add(ns: &Netns, cfg: &Value, p: &SynPod) -> Inv {
    let prev = p.result(&pod_netns(p));
    let inv = exec(
        ns,
        &[],
        &env_of("ADD", Some(p), &pod_netns(p)),
        &stdin_of(cfg, Some(prev.clone())),
        None,
    );
    if inv.exit == Some(0) {
        let r = inv.reply();
        assert_eq!(r["ips"], prev["ips"], "ADD must pass the result on: {inv}");
        assert_eq!(r["interfaces"], prev["interfaces"], "{inv}");
    }
    inv
}

fn del(ns: &Netns, cfg: &Value, p: &SynPod) -> Inv {
    let prev = p.result(&pod_netns(p));
    exec(
        ns,
        &[],
        &env_of("DEL", Some(p), &pod_netns(p)),
        &stdin_of(cfg, Some(prev)),
        None,
    )
}

/// DEL as a 0.3.x list, a lost cache or CRI's second DEL sends it: no prevResult, no netns.
fn del_bare(ns: &Netns, cfg: &Value, p: &SynPod) -> Inv {
    exec(
        ns,
        &[],
        &env_of("DEL", Some(p), ""),
        &stdin_of(cfg, None),
        None,
    )
}

fn check(ns: &Netns, cfg: &Value, p: &SynPod) -> Inv {
    let prev = p.result(&pod_netns(p));
    exec(
        ns,
        &[],
        &env_of("CHECK", Some(p), &pod_netns(p)),
        &stdin_of(cfg, Some(prev)),
        None,
    )
}

fn gc(ns: &Netns, cfg: &Value, valid: &[&SynPod]) -> Inv {
    let mut c = cfg.clone();
    c["cni.dev/valid-attachments"] = json!(valid
        .iter()
        .map(|p| json!({ "containerID": p.cid, "ifname": p.ifname }))
        .collect::<Vec<_>>());
    exec(ns, &[], &env_of("GC", None, ""), &stdin_of(&c, None), None)
}

fn status(ns: &Netns, cfg: &Value, filter: Option<&Filter>) -> Inv {
    exec(
        ns,
        &[],
        &env_of("STATUS", None, ""),
        &stdin_of(cfg, None),
        filter,
    )
}

/// Runs every job on its own thread, all released at once; results in job order.
fn parallel<T: Send>(jobs: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
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

/// A small deterministic PRNG (xorshift64*); the seed is printed so a failure can be replayed
/// with `NATGUARD_TEST_SEED`.
struct Rng(u64);

impl Rng {
    fn new(test: &str) -> Rng {
        let seed = std::env::var("NATGUARD_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{test}: NATGUARD_TEST_SEED={seed}");
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel state
// ---------------------------------------------------------------------------------------------

/// natguard's table as `nft -j` shows it (handles dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    /// set -> element (addresses normalised) -> comment
    sets: BTreeMap<String, BTreeMap<String, Option<String>>>,
    /// chain -> rules in order, as (comment, expressions)
    rules: BTreeMap<String, Vec<(String, String)>>,
    /// table flags as nft prints them
    flags: String,
}

fn elem_key(v: &Value) -> String {
    match v {
        Value::String(s) => s
            .parse::<IpAddr>()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| s.clone()),
        other => other.to_string(),
    }
}

/// natguard's table in `ns`, or `None` when it does not exist.
fn state(ns: &Netns) -> Option<State> {
    // Table flags from the text form (nft 1.0.6 prints the family as the flags in JSON).
    let plain = nft_table(ns)?;
    let flags = plain
        .lines()
        .nth(1)
        .map(str::trim)
        .filter(|l| l.starts_with("flags "))
        .unwrap_or("")
        .to_string();
    let text = ns.run(&["nft", "-j", "list", "table", "inet", "natguard"]);
    let v: Value = serde_json::from_str(&text).expect("nft -j output");
    let mut st = State {
        sets: BTreeMap::new(),
        rules: BTreeMap::new(),
        flags,
    };
    for item in v["nftables"].as_array().expect("nftables array") {
        if let Some(s) = item.get("set") {
            let name = s["name"].as_str().unwrap().to_string();
            let mut elems = BTreeMap::new();
            for e in s["elem"].as_array().cloned().unwrap_or_default() {
                let (val, comment) = match e.get("elem") {
                    Some(inner) => (
                        elem_key(&inner["val"]),
                        inner["comment"].as_str().map(str::to_string),
                    ),
                    None => (elem_key(&e), None),
                };
                assert!(
                    elems.insert(val.clone(), comment).is_none(),
                    "element {val} listed twice in set {name}"
                );
            }
            st.sets.insert(name, elems);
        } else if let Some(c) = item.get("chain") {
            st.rules
                .entry(c["name"].as_str().unwrap().to_string())
                .or_default();
        } else if let Some(r) = item.get("rule") {
            st.rules
                .entry(r["chain"].as_str().unwrap().to_string())
                .or_default()
                .push((
                    r["comment"].as_str().unwrap_or("").to_string(),
                    without_counter_values(&r["expr"]).to_string(),
                ));
        }
    }
    Some(st)
}

/// A rule's expressions with every counter's values left out: traffic changes them, the policy
/// is the same.
fn without_counter_values(expr: &Value) -> Value {
    match expr {
        Value::Array(a) => Value::Array(a.iter().map(without_counter_values).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let v = if k == "counter" {
                        Value::Null
                    } else {
                        without_counter_values(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn must_state(ns: &Netns) -> State {
    state(ns).unwrap_or_else(|| panic!("no table inet natguard in {}", ns.name))
}

const POD_SETS: [&str; 13] = [
    "pods", "att", "ifs", "meta4", "meta6", "masq4", "masq6", "exempt4", "exempt6", "cntp4",
    "cntp6", "cntr4", "cntr6",
];

fn set_name(suffix: &str) -> String {
    format!("{NET}-{suffix}")
}

/// What the per-pod sets must hold for exactly these live pods.
fn expected_pod_sets(live: &[SynPod]) -> BTreeMap<String, BTreeMap<String, Option<String>>> {
    let mut m: BTreeMap<String, BTreeMap<String, Option<String>>> = POD_SETS
        .iter()
        .map(|s| (set_name(s), BTreeMap::new()))
        .collect();
    let mut ifaces: BTreeMap<String, u32> = BTreeMap::new();
    for p in live {
        let o = Some(p.owner());
        m.get_mut(&set_name("pods"))
            .unwrap()
            .insert(p.owner(), Some(p.comment()));
        m.get_mut(&set_name("att"))
            .unwrap()
            .insert(p.owner(), Some(p.attach_comment()));
        *ifaces.entry(p.host_iface()).or_default() += 1;
        for (a, f) in [(p.v4, "4"), (p.v6, "6")] {
            // Exempt addresses are keyed by the pod's host interface and the address.
            let (owned, key) = if p.exempt() {
                (
                    "exempt",
                    json!({ "concat": [p.host_iface(), a.to_string()] }).to_string(),
                )
            } else {
                ("meta", a.to_string())
            };
            m.get_mut(&set_name(&format!("{owned}{f}")))
                .unwrap()
                .insert(key, o.clone());
            m.get_mut(&set_name(&format!("masq{f}")))
                .unwrap()
                .insert(a.to_string(), o.clone());
            // Per-pod counters: resets for every pod, proxied connections for intercepted ones.
            m.get_mut(&set_name(&format!("cntr{f}")))
                .unwrap()
                .insert(a.to_string(), o.clone());
            if !p.exempt() && p.proxied {
                m.get_mut(&set_name(&format!("cntp{f}")))
                    .unwrap()
                    .insert(a.to_string(), o.clone());
            }
        }
    }
    for (i, n) in ifaces {
        m.get_mut(&set_name("ifs"))
            .unwrap()
            .insert(i, Some(format!("pods={n}")));
    }
    m
}

/// The per-pod sets hold exactly the live pods' entries: nothing lost, nothing leaked, every
/// address owned by its pod.
fn assert_pods_exactly(st: &State, live: &[SynPod], when: &str) {
    let want = expected_pod_sets(live);
    let mut problems = Vec::new();
    for (set, w) in &want {
        let got = st.sets.get(set).cloned().unwrap_or_default();
        for (k, c) in w {
            match got.get(k) {
                None => problems.push(format!("lost: {set} {k} ({c:?})")),
                Some(g) if g != c => {
                    problems.push(format!("wrong owner: {set} {k}: {g:?}, expected {c:?}"))
                }
                Some(_) => {}
            }
        }
        for (k, c) in &got {
            if !w.contains_key(k) {
                problems.push(format!("leaked: {set} {k} ({c:?})"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{when}: kernel state differs from the {} live pods:\n  {}",
        live.len(),
        problems.join("\n  ")
    );
}

/// The shared part of the state: rules, and the sets that are not per pod.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shared {
    rules: BTreeMap<String, Vec<(String, String)>>,
    sets: BTreeMap<String, BTreeMap<String, Option<String>>>,
}

fn shared_of(st: &State) -> Shared {
    let pod_sets: BTreeSet<String> = POD_SETS.iter().map(|s| set_name(s)).collect();
    Shared {
        rules: st.rules.clone(),
        sets: st
            .sets
            .iter()
            .filter(|(k, _)| !pod_sets.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// The fingerprints in the rule comments ("natguard NET <fingerprint> [counter]").
fn fingerprints(st: &State) -> BTreeSet<String> {
    st.rules
        .values()
        .flatten()
        .map(|(c, _)| c.split(' ').nth(2).unwrap_or("").to_string())
        .collect()
}

/// A fresh namespace for synthetic tests.
fn synthetic(test: &str) -> (Harness, Netns) {
    let h = Harness::new(test);
    require_tools(&["nft", "conntrack"]);
    let ns = h.netns("node");
    (h, ns)
}

/// The shared state one config produces, from a sequential ADD in a scratch namespace.
fn reference_shared(h: &Harness, role: &str, cfg: &Value) -> Shared {
    let ns = h.netns(role);
    add(&ns, cfg, &SynPod::new("ref", 1, 0)).succeeded();
    let sh = shared_of(&must_state(&ns));
    h.delete_netns(&ns);
    sh
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

enum Op {
    Add(SynPod),
    Del(SynPod),
    DelBare(SynPod),
}

fn run_ops(ns: &Netns, cfg: &Value, ops: Vec<Op>) {
    let jobs: Vec<Box<dyn FnOnce() -> Inv + Send + '_>> = ops
        .into_iter()
        .map(|op| -> Box<dyn FnOnce() -> Inv + Send + '_> {
            Box::new(move || match op {
                Op::Add(p) => add(ns, cfg, &p),
                Op::Del(p) => del(ns, cfg, &p),
                Op::DelBare(p) => del_bare(ns, cfg, &p),
            })
        })
        .collect();
    let failed: Vec<String> = parallel(jobs)
        .into_iter()
        .filter(|i| i.exit != Some(0))
        .map(|i| i.to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} parallel invocations failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// 64 ADDs/DELs of distinct pods at once, in random order, over several rounds (re-ADDs with
/// new addresses, DELs with and without prevResult): afterwards the kernel holds exactly the
/// live pods' entries for both families, and the shared rules exactly once.
#[test]
fn concurrent_add_del_of_64_pods_matches_live_set() {
    let (h, ns) = synthetic("conc-64");
    let mut rng = Rng::new("concurrent_add_del_of_64_pods_matches_live_set");
    let cfg = cfg_a();
    let reference = reference_shared(&h, "ref", &cfg);
    const POOL: u32 = 96;
    // live[i] = Some(generation) when pod i is attached.
    let mut live: Vec<Option<u32>> = vec![None; POOL as usize];
    let mut gens: Vec<u32> = vec![0; POOL as usize];
    let rounds = 6;
    let mut invocations = 0;
    for round in 0..rounds {
        let mut idx: Vec<u32> = (0..POOL).collect();
        rng.shuffle(&mut idx);
        let last = round == rounds - 1;
        let mut ops = Vec::new();
        for &i in idx.iter().take(64) {
            let u = i as usize;
            match live[u] {
                Some(g) if last || rng.below(10) < 6 => {
                    let p = SynPod::new("c", i, g);
                    ops.push(if rng.below(3) == 0 {
                        Op::DelBare(p)
                    } else {
                        Op::Del(p)
                    });
                    live[u] = None;
                }
                Some(_) => {
                    // Re-ADD of a live attachment with new addresses.
                    gens[u] += 1;
                    live[u] = Some(gens[u]);
                    ops.push(Op::Add(SynPod::new("c", i, gens[u])));
                }
                None if last => {}
                None => {
                    gens[u] += 1;
                    live[u] = Some(gens[u]);
                    ops.push(Op::Add(SynPod::new("c", i, gens[u])));
                }
            }
        }
        if last {
            // Whatever is still live goes too.
            for (i, l) in live.iter_mut().enumerate() {
                if let Some(g) = l.take() {
                    ops.push(Op::Del(SynPod::new("c", i as u32, g)));
                }
            }
        }
        invocations += ops.len();
        run_ops(&ns, &cfg, ops);
        let pods: Vec<SynPod> = live
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.map(|g| SynPod::new("c", i as u32, g)))
            .collect();
        let st = must_state(&ns);
        assert_pods_exactly(&st, &pods, &format!("after round {round}"));
        assert_eq!(
            shared_of(&st),
            reference,
            "after round {round}: the shared rules and sets differ from one sequential ADD's"
        );
        // Every live pod passes CHECK.
        for p in pods.iter().take(8) {
            check(&ns, &cfg, p).succeeded();
        }
    }
    eprintln!("{rounds} rounds, {invocations} parallel invocations");
}

/// Half of 64 parallel ADDs carry config A, half config B (a conflist rewritten while pods
/// start): the shared objects end up entirely one config's (uniform fingerprint, that config's
/// rule count and sets), and every pod is present.
#[test]
fn adds_racing_a_config_change_converge_to_one_config() {
    let (h, ns) = synthetic("conc-cfg");
    let mut rng = Rng::new("adds_racing_a_config_change_converge_to_one_config");
    let (a, b) = (cfg_a(), cfg_b());
    let ref_a = reference_shared(&h, "ref-a", &a);
    let ref_b = reference_shared(&h, "ref-b", &b);
    assert_ne!(ref_a, ref_b, "the two configs must differ in the kernel");
    let count = |s: &Shared| s.rules.values().map(Vec::len).sum::<usize>();
    assert_ne!(count(&ref_a), count(&ref_b), "rule counts must differ");
    let mut seen = BTreeSet::new();
    for round in 0..4u32 {
        let pods: Vec<SynPod> = (0..64)
            .map(|i| SynPod::new("r", i, round).denied(i % 2 == 1))
            .collect();
        let mut jobs: Vec<Box<dyn FnOnce() -> Inv + Send + '_>> = Vec::new();
        let mut order: Vec<usize> = (0..pods.len()).collect();
        rng.shuffle(&mut order);
        for &i in &order {
            let p = pods[i].clone();
            let cfg = if i.is_multiple_of(2) {
                a.clone()
            } else {
                b.clone()
            };
            let ns = &ns;
            jobs.push(Box::new(move || add(ns, &cfg, &p)));
        }
        for inv in parallel(jobs) {
            inv.succeeded();
        }
        let st = must_state(&ns);
        let fps = fingerprints(&st);
        assert_eq!(
            fps.len(),
            1,
            "round {round}: rules of more than one config: {fps:?}\n{st:#?}"
        );
        let sh = shared_of(&st);
        let which = if sh == ref_a {
            "A"
        } else if sh == ref_b {
            "B"
        } else {
            panic!("round {round}: shared objects are neither config A's nor B's:\n{sh:#?}\nA: {ref_a:#?}\nB: {ref_b:#?}")
        };
        seen.insert(which);
        assert_pods_exactly(&st, &pods, &format!("round {round} (config {which} won)"));
        // The network converges back on the next ADD of the other config.
        let extra = SynPod::new("x", 1, 50 + round);
        let (cfg, want) = if which == "A" {
            (&b, &ref_b)
        } else {
            (&a, &ref_a)
        };
        add(&ns, cfg, &extra).succeeded();
        assert_eq!(&shared_of(&must_state(&ns)), want, "round {round}");
        // Clean up for the next round, all at once.
        let mut all = pods.clone();
        all.push(extra);
        run_ops(&ns, &a, all.into_iter().map(Op::Del).collect());
        assert_pods_exactly(&must_state(&ns), &[], &format!("round {round} after DEL"));
    }
    eprintln!("configs that won a round: {seen:?}");
}

fn assert_owns(ns: &Netns, p: &SynPod, when: &str) {
    let st = must_state(ns);
    for (set, a) in [
        ("meta4", p.v4),
        ("meta6", p.v6),
        ("masq4", p.v4),
        ("masq6", p.v6),
    ] {
        let got = st.sets[&set_name(set)].get(&a.to_string()).cloned();
        assert_eq!(
            got,
            Some(Some(p.owner())),
            "{when}: {a} in {NET}-{set} should belong to live pod {} ({})",
            p.cid,
            p.owner()
        );
    }
    assert!(
        st.sets[&set_name("pods")].contains_key(&p.owner()),
        "{when}: pod {} is not in {NET}-pods",
        p.cid
    );
}

/// ADD A (IP X), ADD B (IP X), DEL A: B keeps its entries; and DEL A racing ADD B.
#[test]
fn same_ip_add_a_add_b_del_a_keeps_b() {
    let (_h, ns) = synthetic("same-ip");
    let cfg = cfg_a();
    for round in 0..10u32 {
        let x4 = format!("10.99.{round}.7");
        let x6 = format!("fd00:99::{round}:7");
        let a = SynPod::new("sa", round * 10 + 1, 0).with_addrs(&x4, &x6);
        let b = SynPod::new("sb", round * 10 + 1, 0).with_addrs(&x4, &x6);
        // Sequential.
        add(&ns, &cfg, &a).succeeded();
        add(&ns, &cfg, &b).succeeded();
        del(&ns, &cfg, &a).succeeded();
        assert_owns(&ns, &b, "ADD A, ADD B, DEL A");
        check(&ns, &cfg, &b).succeeded();
        assert_pods_exactly(&must_state(&ns), std::slice::from_ref(&b), "after DEL A");
        // A's stale DEL again, without prevResult, changes nothing.
        del_bare(&ns, &cfg, &a).succeeded();
        assert_pods_exactly(&must_state(&ns), std::slice::from_ref(&b), "second DEL A");
        del(&ns, &cfg, &b).succeeded();
        assert_pods_exactly(&must_state(&ns), &[], "after DEL B");

        // DEL A racing ADD B (A was added before): whichever runs first, B ends up owning X.
        add(&ns, &cfg, &a).succeeded();
        let r = parallel::<Inv>(vec![
            Box::new(|| del(&ns, &cfg, &a)),
            Box::new(|| add(&ns, &cfg, &b)),
        ]);
        for inv in r {
            inv.succeeded();
        }
        assert_owns(&ns, &b, "DEL A racing ADD B");
        assert_pods_exactly(&must_state(&ns), std::slice::from_ref(&b), "DEL A || ADD B");
        del(&ns, &cfg, &b).succeeded();
        assert_pods_exactly(&must_state(&ns), &[], "round end");
    }
}

/// Two live attachments with the same address: deleting either one must leave the other
/// protected. Today the address elements carry one owner (the last ADD), so "ADD B X, ADD A X,
/// DEL A" removes X from the meta/masq sets although B is alive and recorded with X: B's
/// metadata traffic is no longer intercepted. The racing form (ADD A || ADD B, then DEL A)
/// hits it about half of the time.
#[test]
fn same_ip_deleting_either_attachment_keeps_the_other() {
    let (_h, ns) = synthetic("same-ip-either");
    let cfg = cfg_a();
    let x4 = "10.98.0.7";
    let x6 = "fd00:98::7";
    let a = SynPod::new("ea", 1, 0).with_addrs(x4, x6);
    let b = SynPod::new("eb", 1, 0).with_addrs(x4, x6);
    // Sequential, the newer attachment deleted first.
    add(&ns, &cfg, &b).succeeded();
    add(&ns, &cfg, &a).succeeded();
    del(&ns, &cfg, &a).succeeded();
    let st = must_state(&ns);
    let chk = check(&ns, &cfg, &b);
    assert!(
        chk.exit == Some(0),
        "ADD B X, ADD A X, DEL A: live pod B lost its entries (CHECK B: {chk})\nstate: {:#?}",
        st.sets
    );
    del(&ns, &cfg, &b).succeeded();
    // Racing ADDs, then DEL of either one.
    for round in 0..20u32 {
        let (gone, stays) = if round.is_multiple_of(2) {
            (&a, &b)
        } else {
            (&b, &a)
        };
        for inv in parallel::<Inv>(vec![
            Box::new(|| add(&ns, &cfg, &a)),
            Box::new(|| add(&ns, &cfg, &b)),
        ]) {
            inv.succeeded();
        }
        del(&ns, &cfg, gone).succeeded();
        let chk = check(&ns, &cfg, stays);
        assert!(
            chk.exit == Some(0),
            "round {round}: ADD {} || ADD {}, DEL {}: live pod {} lost its entries: {chk}",
            a.cid,
            b.cid,
            gone.cid,
            stays.cid
        );
        del(&ns, &cfg, stays).succeeded();
        assert_pods_exactly(&must_state(&ns), &[], "round end");
    }
}

// ---------------------------------------------------------------------------------------------
// Churn
// ---------------------------------------------------------------------------------------------

/// 2,000 ADD/DEL cycles (in parallel batches; DELs with and without prevResult, repeated ADDs,
/// a second interface) leave natguard's table byte-identical and conntrack unchanged, and every
/// invocation exits 0.
#[test]
fn churn_2000_cycles_leave_table_and_conntrack_unchanged() {
    let (_h, ns) = synthetic("churn");
    let cfg = cfg_a();
    // An initial ADD creates the shared objects; this pod stays.
    let anchor = SynPod::new("anchor", 0, 9);
    add(&ns, &cfg, &anchor).succeeded();
    let before = nft_table(&ns).expect("table after the first ADD");
    let ct_before = conntrack_list(&ns, &[]);
    const CYCLES: u32 = 2000;
    const WORKERS: u32 = 8;
    let invocations = Mutex::new(0usize);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (ns, cfg, invocations, failures) = (&ns, &cfg, &invocations, &failures);
            s.spawn(move || {
                let mut n = 0;
                let mut record = |inv: Inv| {
                    n += 1;
                    if inv.exit != Some(0) {
                        failures.lock().unwrap().push(inv.to_string());
                    }
                };
                for k in (w..CYCLES).step_by(WORKERS as usize) {
                    // The node's pod network, as in real churn: the anchor's generation.
                    let p = SynPod::new("ch", k + 1, 9);
                    record(add(ns, cfg, &p));
                    match k % 4 {
                        0 => record(del(ns, cfg, &p)),
                        1 => record(del_bare(ns, cfg, &p)),
                        2 => {
                            record(add(ns, cfg, &p));
                            record(del(ns, cfg, &p));
                        }
                        // A DEL that comes twice (CRI retries, kubelet GC).
                        _ if k % 8 == 3 => {
                            record(del(ns, cfg, &p));
                            record(del(ns, cfg, &p));
                        }
                        _ => record(del(ns, cfg, &p)),
                    }
                }
                *invocations.lock().unwrap() += n;
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} invocations failed, first: {}",
        failures.len(),
        failures[0]
    );
    let after = nft_table(&ns).expect("table after churn");
    assert_eq!(
        before, after,
        "{CYCLES} ADD/DEL cycles changed natguard's table"
    );
    assert_eq!(
        conntrack_list(&ns, &[]),
        ct_before,
        "churn changed conntrack"
    );
    assert_pods_exactly(&must_state(&ns), &[anchor], "after churn");
    eprintln!(
        "{CYCLES} cycles, {} invocations, all exited 0",
        invocations.into_inner().unwrap()
    );
}

// ---------------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------------

/// Writes libcni cache entries for `pods` and a conflist listing natguard with `cfg`.
fn write_cache(dir: &Path, cfg: &Value, pods: &[(SynPod, String)]) -> (String, String) {
    let cache = dir.join("results");
    let netconf = dir.join("net.d");
    fs::create_dir_all(&cache).unwrap();
    fs::create_dir_all(&netconf).unwrap();
    let list = json!({
        "cniVersion": "1.1.0",
        "name": NET,
        "plugins": [
            { "type": "bridge", "bridge": "cni0", "ipam": { "type": "host-local" } },
            cfg
        ]
    });
    fs::write(
        netconf.join("10-hnet.conflist"),
        serde_json::to_vec_pretty(&list).unwrap(),
    )
    .unwrap();
    // Another network's conflist without natguard: its pods are skipped.
    let other =
        json!({ "cniVersion": "1.1.0", "name": "plain", "plugins": [{ "type": "bridge" }] });
    fs::write(
        netconf.join("20-plain.conflist"),
        serde_json::to_vec(&other).unwrap(),
    )
    .unwrap();
    let config = base64(&serde_json::to_vec(&list).unwrap());
    for (p, sandbox) in pods {
        let entry = json!({
            "kind": "cniCacheV1",
            "containerId": p.cid,
            "config": config,
            "ifName": p.ifname,
            "networkName": NET,
            "netns": sandbox,
            "cniArgs": [
                ["K8S_POD_NAMESPACE", p.k8s_ns],
                ["K8S_POD_NAME", p.name],
                ["K8S_POD_INFRA_CONTAINER_ID", p.cid]
            ],
            "result": p.result(sandbox),
        });
        fs::write(
            cache.join(format!("{NET}-{}-{}", p.cid, p.ifname)),
            serde_json::to_vec(&entry).unwrap(),
        )
        .unwrap();
    }
    (
        cache.to_str().unwrap().to_string(),
        netconf.to_str().unwrap().to_string(),
    )
}

/// Someone else removes natguard's state (`nft flush ruleset`, `nft delete table`, `nft flush
/// table`): CHECK of an existing pod reports it (code 101, naming the pod's key or the missing
/// object), the next ADD restores the shared objects, CHECK then names the missing pod entry,
/// and `natguard reconcile` restores every pod from the CNI cache.
#[test]
fn flushed_table_add_restores_check_reports_reconcile_restores() {
    let (h, ns) = synthetic("fault-flush");
    let cfg = cfg_a();
    let reference = reference_shared(&h, "ref", &cfg);
    let pods: Vec<SynPod> = (1..=12).map(|i| SynPod::new("f", i, 0)).collect();
    for p in &pods {
        add(&ns, &cfg, p).succeeded();
    }
    let full = must_state(&ns);
    assert_pods_exactly(&full, &pods, "before the fault");
    // A pod whose netns is gone is skipped by reconcile; the others' sandbox exists.
    let gone = SynPod::new("f", 99, 0).vanished();
    let mut cached: Vec<(SynPod, String)> =
        pods.iter().map(|p| (p.clone(), pod_netns(p))).collect();
    cached.push((gone.clone(), pod_netns(&gone)));
    let (cache, netconf) = write_cache(h.dir(), &cfg, &cached);

    let faults: [&[&str]; 3] = [
        &["nft", "flush", "ruleset"],
        &["nft", "delete", "table", "inet", "natguard"],
        &["nft", "flush", "table", "inet", "natguard"],
    ];
    for (n, fault) in faults.iter().enumerate() {
        let what = fault.join(" ");
        ns.run(fault);
        // CHECK reports the damage.
        let old = &pods[n];
        let inv = check(&ns, &cfg, old);
        let owner = old.owner();
        let chain = format!("{NET}-dnat");
        let needle: &str = if n == 2 { &chain } else { "hnet-" };
        inv.fails_with(101, &[needle]);
        // The next ADD restores the shared objects.
        let newcomer = SynPod::new("fn", n as u32 + 1, 5);
        add(&ns, &cfg, &newcomer).succeeded();
        let st = must_state(&ns);
        assert_eq!(shared_of(&st), reference, "after {what} and one ADD");
        check(&ns, &cfg, &newcomer).succeeded();
        if n < 2 {
            // The older pods' entries are gone; CHECK names the pod and the set.
            check(&ns, &cfg, old).fails_with(101, &[&owner, &set_name("pods")]);
        }
        // reconcile restores every cached pod.
        let inv = exec(
            &ns,
            &[
                "reconcile",
                "--cache-dir",
                &cache,
                "--netconf-dir",
                &netconf,
            ],
            &[],
            b"",
            None,
        )
        .succeeded();
        assert!(
            inv.stdout
                .contains("12 attachment(s) brought under policy, 1 skipped, 0 failed"),
            "reconcile report after {what}: {inv}"
        );
        assert!(
            inv.stdout.contains("no longer exists"),
            "the pod whose netns is gone is reported: {inv}"
        );
        let mut want = pods.clone();
        want.push(newcomer.clone());
        let st = must_state(&ns);
        assert_pods_exactly(&st, &want, &format!("after {what}, ADD, reconcile"));
        assert_eq!(shared_of(&st), reference);
        for p in &want {
            check(&ns, &cfg, p).succeeded();
        }
        // reconcile is idempotent.
        exec(
            &ns,
            &[
                "reconcile",
                "--cache-dir",
                &cache,
                "--netconf-dir",
                &netconf,
            ],
            &[],
            b"",
            None,
        )
        .succeeded();
        assert_eq!(must_state(&ns), st, "a second reconcile changed the state");
        del(&ns, &cfg, &newcomer).succeeded();
    }
}

/// A shared set emptied by someone else (here `nft flush set` of the metadata addresses, ports
/// or non-masquerade CIDRs) turns the policy off for every pod of the network. CHECK must report
/// it and the next ADD must restore the set, as it does for rules. Today `check_shared` only
/// compares set names and rule comments, so CHECK passes and ADD leaves the set empty.
#[test]
fn flushed_shared_set_is_reported_and_restored() {
    let (h, ns) = synthetic("fault-set");
    let cfg = cfg_a();
    let reference = reference_shared(&h, "ref", &cfg);
    let p = SynPod::new("s", 1, 0);
    add(&ns, &cfg, &p).succeeded();
    for (i, set) in ["mdst4", "mdst6", "mports", "nomasq4"].iter().enumerate() {
        let name = set_name(set);
        ns.run(&["nft", "flush", "set", "inet", "natguard", &name]);
        let inv = check(&ns, &cfg, &p);
        assert_eq!(
            inv.exit,
            Some(1),
            "CHECK passes although set {name} was emptied: {inv}"
        );
        inv.fails_with(101, &[&name]);
        let q = SynPod::new("s", 10 + i as u32, 0);
        add(&ns, &cfg, &q).succeeded();
        assert_eq!(
            shared_of(&must_state(&ns)),
            reference,
            "the ADD after `nft flush set {name}` did not restore it"
        );
    }
}

/// A table made dormant by someone else (`nft add table inet natguard { flags dormant; }`)
/// enforces nothing. CHECK must report it, and the next ADD must wake it up (converging the
/// shared objects does: NEWTABLE with flags 0). Today CHECK passes and ADD leaves it dormant.
#[test]
fn dormant_table_is_reported_and_woken_up() {
    let (_h, ns) = synthetic("fault-dormant");
    let cfg = cfg_a();
    let p = SynPod::new("d", 1, 0);
    add(&ns, &cfg, &p).succeeded();
    assert_eq!(must_state(&ns).flags, "", "fresh table has no flags");
    ns.run(&[
        "nft",
        "add",
        "table",
        "inet",
        "natguard",
        "{ flags dormant; }",
    ]);
    assert!(must_state(&ns).flags.contains("dormant"));
    let inv = check(&ns, &cfg, &p);
    assert_eq!(
        inv.exit,
        Some(1),
        "CHECK passes although natguard's table is dormant: {inv}"
    );
    inv.fails_with(101, &["dormant"]);
    add(&ns, &cfg, &SynPod::new("d", 2, 0)).succeeded();
    let st = must_state(&ns);
    assert!(
        !st.flags.contains("dormant"),
        "the next ADD left natguard's table dormant"
    );
}

/// DEL for a pod natguard never saw (with and without a table), DEL with CNI_NETNS="" and no
/// prevResult, DEL whose prevResult names another pod's address, and ADD whose pod netns no
/// longer exists: all end cleanly and touch nothing else.
#[test]
fn del_and_add_edge_cases_end_cleanly() {
    let (_h, ns) = synthetic("fault-del");
    let cfg = cfg_a();
    let stranger = SynPod::new("never", 1, 0);
    // No table at all.
    del(&ns, &cfg, &stranger).succeeded();
    del_bare(&ns, &cfg, &stranger).succeeded();
    assert!(state(&ns).is_none(), "DEL must not create the table");
    // GC with no table.
    gc(&ns, &cfg, &[]).succeeded();

    // ADD with a CNI_NETNS that does not exist (the pod netns vanished mid-ADD).
    let p = SynPod::new("e", 1, 0).vanished();
    assert!(!Path::new(&pod_netns(&p)).exists());
    add(&ns, &cfg, &p).succeeded();
    let q = SynPod::new("e", 2, 0);
    add(&ns, &cfg, &q).succeeded();
    let st = must_state(&ns);
    assert_pods_exactly(&st, &[p.clone(), q.clone()], "after ADD");

    // DEL of a stranger with the table present: nothing changes.
    del(&ns, &cfg, &stranger).succeeded();
    del_bare(&ns, &cfg, &stranger).succeeded();
    assert_eq!(
        must_state(&ns),
        st,
        "DEL of an unknown pod changed the state"
    );

    // DEL of a stranger whose prevResult claims q's addresses: q keeps them.
    let liar = SynPod::new("never", 2, 0).with_addrs(&q.v4.to_string(), &q.v6.to_string());
    del(&ns, &cfg, &liar).succeeded();
    assert_eq!(
        must_state(&ns),
        st,
        "DEL with another pod's addresses removed them"
    );

    // DEL with CNI_NETNS="" and no prevResult removes everything of p.
    del_bare(&ns, &cfg, &p).succeeded();
    assert_pods_exactly(
        &must_state(&ns),
        std::slice::from_ref(&q),
        "DEL without netns/prevResult",
    );
    // Again: still fine.
    del_bare(&ns, &cfg, &p).succeeded();
    // DEL with malformed CNI_ARGS still works (DEL only needs the IDs).
    let mut env = env_of("DEL", Some(&q), "");
    for (k, v) in env.iter_mut() {
        if k == "CNI_ARGS" {
            *v = "K8S_POD_NAMESPACE=Bad Name;junk".into();
        }
    }
    exec(&ns, &[], &env, &stdin_of(&cfg, None), None).succeeded();
    assert_pods_exactly(&must_state(&ns), &[], "all deleted");
}

/// A kernel without nf_tables netlink (simulated with a seccomp filter that makes
/// `socket(AF_NETLINK, .., NETLINK_NETFILTER)` fail): ADD fails with a clear error, STATUS says
/// not ready (code 50), DEL and GC succeed (there is nothing to remove). A kernel that keeps
/// answering EBUSY: ADD retries a bounded number of times, then reports code 11.
///
/// Conntrack netlink cannot be removed on its own this way: it shares the NETLINK_NETFILTER
/// socket with nf_tables, and the filter cannot see which subsystem a message addresses.
#[test]
fn netfilter_netlink_missing_or_busy_gives_clear_errors() {
    let (_h, ns) = synthetic("fault-nonft");
    let cfg = cfg_a();
    let p = SynPod::new("k", 1, 0);
    let prev = p.result(&pod_netns(&p));
    // The filter works: a plain STATUS succeeds, a filtered one does not.
    status(&ns, &cfg, None).succeeded();
    for errno in [libc::EPROTONOSUPPORT, libc::EAFNOSUPPORT] {
        let f = Filter::no_netfilter_socket(errno);
        let inv = exec(
            &ns,
            &[],
            &env_of("ADD", Some(&p), &pod_netns(&p)),
            &stdin_of(&cfg, Some(prev.clone())),
            Some(&f),
        );
        assert_eq!(inv.exit, Some(1), "{inv}");
        let r = inv.reply();
        let text = format!("{} {}", r["msg"], r["details"]);
        assert!(
            text.contains("netfilter netlink"),
            "ADD without nf_tables should say netfilter netlink is unavailable: {inv}"
        );
        assert_ne!(r["code"].as_u64(), Some(0));
        status(&ns, &cfg, Some(&f)).fails_with(50, &["nf_tables"]);
        let inv = exec(
            &ns,
            &[],
            &env_of("DEL", Some(&p), &pod_netns(&p)),
            &stdin_of(&cfg, Some(prev.clone())),
            Some(&f),
        );
        inv.succeeded();
        let mut gcconf = cfg.clone();
        gcconf["cni.dev/valid-attachments"] = json!([]);
        exec(
            &ns,
            &[],
            &env_of("GC", None, ""),
            &stdin_of(&gcconf, None),
            Some(&f),
        )
        .succeeded();
    }
    assert!(state(&ns).is_none(), "nothing may have been installed");
    // Busy kernel: bounded retries, then code 11 ("try again").
    let f = Filter::sends_fail(libc::EBUSY);
    let inv = exec(
        &ns,
        &[],
        &env_of("ADD", Some(&p), &pod_netns(&p)),
        &stdin_of(&cfg, Some(prev)),
        Some(&f),
    );
    inv.fails_with(11, &["EBUSY"]);
    status(&ns, &cfg, Some(&f)).fails_with(50, &["nf_tables"]);
    assert!(state(&ns).is_none());
    // And without the filter everything works.
    add(&ns, &cfg, &p).succeeded();
    status(&ns, &cfg, None).succeeded();
}

// ---------------------------------------------------------------------------------------------
// Security
// ---------------------------------------------------------------------------------------------

/// From its first packet, a pod never reaches the real metadata server: not through either
/// configured port, not over IPv6, not while the proxy is down (refused instead), and not from
/// a namespace whose name merely resembles the exempt one. Namespace names that would be
/// ambiguous are refused at ADD. The exempt namespace itself does reach the server, which shows
/// the negative results are the policy's doing.
#[test]
fn pods_never_reach_the_real_metadata_server() {
    let w = World::new("sec-meta");
    w.h.http_server(&w.cloud, 8080, "cloud");
    let ng = w.natguard(json!({
        "metadata": { "ports": [80, 8080], "exemptNamespaces": ["kube-system"] }
    }));
    let chain = w.chain(w.list("ngnet", "1.1.0", 0, Some(ng.clone())));
    let targets = [
        sa(META4, 80),
        sa(META4, 8080),
        sa(META6, 80),
        sa(META6, 8080),
    ];
    let expect = |pod: &Pod, want: &Outcome, when: &str| {
        for t in targets {
            let got = http_get(&pod.ns, t);
            assert_eq!(
                &got, want,
                "{when}: pod {} (namespace {}) -> http://{t}/",
                pod.att.container_id, pod.att.args[3].1
            );
        }
    };
    // While the proxy is down, a brand-new pod's very first connections are refused.
    w.stop_proxy();
    let early = w.add_pod(&chain, "early", "default");
    expect(&early, &Outcome::Refused, "proxy down, first packets");
    let control = w.add_pod(&chain, "sys", "kube-system");
    expect(&control, &body("cloud"), "exempt namespace");
    let lookalikes: Vec<Pod> = ["kube-system-x", "kube-syste", "xkube-system", "default"]
        .iter()
        .enumerate()
        .map(|(i, ns)| w.add_pod(&chain, &format!("look{i}"), ns))
        .collect();
    for p in &lookalikes {
        expect(p, &Outcome::Refused, "proxy down");
    }
    // Proxy back up: the proxy answers, never the cloud.
    let proxy = w.h.http_server(&w.node, PROXY_PORT, "proxy");
    for p in lookalikes.iter().chain([&early]) {
        expect(p, &body("proxy"), "proxy up");
    }
    w.h.stop(&proxy);
    for p in lookalikes.iter().chain([&early]) {
        expect(p, &Outcome::Refused, "proxy down again");
    }

    // Ambiguous or invalid namespaces are refused (code 4) and change nothing.
    let before = w.table().expect("table");
    let ruleset_before = nft_ruleset(&w.node);
    let prev = json!({
        "cniVersion": "1.1.0",
        "interfaces": [{ "name": "eth0", "sandbox": "/run/netns/x" }],
        "ips": [{ "address": "10.244.0.200/24", "interface": 0 }]
    });
    let mut conf = ng.clone();
    conf["name"] = json!("ngnet");
    conf["cniVersion"] = json!("1.1.0");
    conf["prevResult"] = prev;
    let bad_args = [
        "K8S_POD_NAMESPACE=KUBE-SYSTEM;K8S_POD_NAME=p",
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAMESPACE=default",
        "K8S_POD_NAMESPACE=default;K8S_POD_NAMESPACE=kube-system",
        "K8S_POD_NAMESPACE=kube-system ;K8S_POD_NAME=p",
        "K8S_POD_NAMESPACE= kube-system",
        "K8S_POD_NAMESPACE=kube-system\n",
        "K8S_POD_NAMESPACE=kube_system",
    ];
    for args in bad_args {
        let att = Attachment {
            container_id: "cid-bad".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: Vec::new(),
            cap_args: Default::default(),
        };
        let mut env = Chain::env("ADD", Some(&att), None);
        for (k, v) in env.iter_mut() {
            if k == "CNI_ARGS" {
                *v = args.to_string();
            }
        }
        let e = chain
            .exec("natguard", &conf, env)
            .expect_err(&format!("ADD with CNI_ARGS {args:?} must be refused"));
        assert_eq!(e.code, Some(4), "CNI_ARGS {args:?}: {e}");
        assert!(
            e.details.contains("K8S_POD_NAMESPACE"),
            "CNI_ARGS {args:?}: the error should name K8S_POD_NAMESPACE: {e}"
        );
    }
    assert_eq!(w.table().as_deref(), Some(before.as_str()));
    assert_eq!(nft_ruleset(&w.node), ruleset_before);
    for p in lookalikes.iter().chain([&early, &control]) {
        chain.del(&p.att).unwrap_or_else(|e| panic!("DEL: {e}"));
    }
}

/// A pod that sends from an address of its subnet that natguard did not record (a second
/// address on its interface: any pod with NET_ADMIN, or NET_RAW and a userspace stack) must
/// not reach the real metadata server either. Today interception matches `ip saddr @NET-meta4`
/// (the recorded pod addresses), so such traffic is neither DNATed nor rejected and reaches the
/// cloud.
#[test]
fn pod_with_an_unrecorded_source_address_never_reaches_metadata() {
    let w = World::new("sec-spoof");
    let chain = w.chain(w.list("ngnet", "1.1.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_eq!(http_get(&pod.ns, sa(META4, 80)), body("proxy"));
    // The pod adds an unused address of its own subnet and uses it towards the metadata server.
    let gw4 = "10.244.0.1";
    let gw6 = "fd00:10:244::1";
    pod.ns.addr("eth0", "10.244.0.250/24");
    pod.ns.addr("eth0", "fd00:10:244::fa/64");
    pod.ns.ip(&format!(
        "route replace {META4}/32 via {gw4} src 10.244.0.250"
    ));
    pod.ns.ip(&format!(
        "-6 route replace {META6}/128 via {gw6} src fd00:10:244::fa"
    ));
    for meta in [META4, META6] {
        let got = http_get(&pod.ns, sa(meta, 80));
        assert_ne!(
            got,
            body("cloud"),
            "a pod sending from an unrecorded address of its subnet reached the real metadata server at {meta}"
        );
    }
    chain.del(&pod.att).unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// `logFile` is opened without following a symlink planted in its place (to an existing file
/// or to a path that does not exist yet); a plain path is written. Shell syntax in CNI_ARGS
/// runs nothing.
#[test]
fn log_file_symlink_is_not_followed_and_args_reach_no_shell() {
    let (h, ns) = synthetic("sec-log");
    let dir = h.dir();
    let outside = dir.join("outside");
    fs::create_dir_all(&outside).unwrap();
    let target = outside.join("precious");
    fs::write(&target, "precious\n").unwrap();
    let link = dir.join("natguard.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let missing_target = outside.join("created-by-natguard");
    let dangling = dir.join("dangling.log");
    std::os::unix::fs::symlink(&missing_target, &dangling).unwrap();
    let plain = dir.join("plain.log");
    let marker = dir.join("pwned");
    let m = marker.to_str().unwrap();
    for (i, log) in [&link, &dangling, &plain].iter().enumerate() {
        let mut cfg = cfg_a();
        cfg["logFile"] = json!(log);
        // The ADD lines checked below are info lines; the default level writes warnings only.
        cfg["logLevel"] = json!("info");
        let mut p = SynPod::new("l", i as u32 + 1, 0);
        p.name = format!("$(touch${{IFS}}{m})`touch${{IFS}}{m}`");
        for verb in ["ADD", "CHECK", "DEL"] {
            let prev = p.result(&pod_netns(&p));
            exec(
                &ns,
                &[],
                &env_of(verb, Some(&p), &pod_netns(&p)),
                &stdin_of(&cfg, Some(prev)),
                None,
            )
            .succeeded();
        }
    }
    assert_eq!(
        fs::read_to_string(&target).unwrap(),
        "precious\n",
        "natguard wrote through the symlink planted at logFile"
    );
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the planted symlink was replaced"
    );
    assert!(
        !missing_target.exists(),
        "natguard created the target of a dangling symlink at logFile"
    );
    let text = fs::read_to_string(&plain).expect("a plain logFile is written");
    assert!(text.contains("ADD"), "log: {text}");
    assert!(!marker.exists(), "CNI_ARGS reached a shell");
}

/// Foreign tables, chains and sets, some with natguard's own object names, in `table inet
/// other`, `table ip nat`, `table ip natguard` and `table ip6 natguard` are byte-identical
/// after ADD, DEL, CHECK, GC, STATUS, a config change, churn, a restore after `nft delete
/// table inet natguard`, and reconcile.
#[test]
fn foreign_tables_are_never_touched() {
    let (h, ns) = synthetic("sec-foreign");
    let cfg = cfg_a();
    let p0 = SynPod::new("o", 1, 0);
    let script = format!(
        r#"
table inet other {{
    set {net}-pods {{ type ifname; elements = {{ "{owner}" comment "foreign" }} }}
    set {net}-meta4 {{ type ipv4_addr; elements = {{ {v4} comment "{owner}" }} }}
    chain {net}-dnat {{
        type nat hook prerouting priority -110; policy accept;
        ip daddr 169.254.169.254 tcp dport 80 dnat ip to 10.0.0.9:81 comment "natguard {net} 0000000000000000"
    }}
    chain plain {{ ip saddr @{net}-meta4 accept; }}
}}
table ip nat {{
    set keep {{ type ipv4_addr; flags interval; elements = {{ 10.0.0.0/8 }} }}
    chain PREROUTING {{ type nat hook prerouting priority dstnat; policy accept; }}
    chain POSTROUTING {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr 10.64.0.0/16 ip daddr != @keep masquerade
    }}
}}
table ip natguard {{
    set {net}-meta4 {{ type ipv4_addr; elements = {{ {v4} }} }}
    chain {net}-dnat {{
        type nat hook prerouting priority -110; policy accept;
        ip saddr @{net}-meta4 return comment "natguard {net} 0000000000000000"
    }}
}}
table ip6 natguard {{
    set {net}-pods {{ type ifname; elements = {{ "{owner}" }} }}
    chain {net}-fwd {{ type filter hook forward priority -10; policy accept; }}
}}
"#,
        net = NET,
        // An ifname key holds at most 15 characters in nft's syntax.
        owner = &p0.owner()[..15],
        v4 = p0.v4
    );
    let file = h.dir().join("foreign.nft");
    fs::write(&file, script).unwrap();
    ns.run(&["nft", "-f", file.to_str().unwrap()]);
    let tables = [
        ["inet", "other"],
        ["ip", "nat"],
        ["ip", "natguard"],
        ["ip6", "natguard"],
    ];
    let snapshot = || -> Vec<String> {
        tables
            .iter()
            .map(|[f, t]| ns.run(&["nft", "list", "table", f, t]))
            .collect()
    };
    let before = snapshot();
    let assert_same = |when: &str| {
        let now = snapshot();
        for (i, [f, t]) in tables.iter().enumerate() {
            assert_eq!(
                before[i], now[i],
                "{when}: natguard changed the foreign table {f} {t}"
            );
        }
    };

    let pods: Vec<SynPod> = (1..=10).map(|i| SynPod::new("o", i, 0)).collect();
    for p in &pods {
        add(&ns, &cfg, p).succeeded();
    }
    check(&ns, &cfg, &pods[0]).succeeded();
    status(&ns, &cfg, None).succeeded();
    assert_same("after ADD, CHECK, STATUS");
    add(&ns, &cfg_b(), &SynPod::new("ob", 1, 2)).succeeded();
    add(&ns, &cfg, &SynPod::new("ob", 2, 2)).succeeded();
    assert_same("after config changes");
    for p in &pods[..4] {
        del(&ns, &cfg, p).succeeded();
    }
    del_bare(&ns, &cfg, &pods[4]).succeeded();
    let valid: Vec<&SynPod> = pods[5..8].iter().collect();
    gc(&ns, &cfg, &valid).succeeded();
    assert_pods_exactly(&must_state(&ns), &pods[5..8], "after GC");
    assert_same("after DEL and GC");
    let churn: Vec<Op> = (0..200)
        .flat_map(|i| {
            let p = SynPod::new("oc", i, 1);
            [Op::Add(p.clone()), Op::DelBare(p)]
        })
        .collect();
    // ADDs and DELs of the same pod may run in either order here; only the foreign tables
    // matter, and a final DEL of each cleans up.
    run_ops(&ns, &cfg, churn);
    run_ops(
        &ns,
        &cfg,
        (0..200).map(|i| Op::Del(SynPod::new("oc", i, 1))).collect(),
    );
    assert_same("after churn");
    ns.run(&["nft", "delete", "table", "inet", "natguard"]);
    add(&ns, &cfg, &pods[9]).succeeded();
    let cached: Vec<(SynPod, String)> = pods[5..8].iter().map(|p| (p.clone(), ns.path())).collect();
    let (cache, netconf) = write_cache(h.dir(), &cfg, &cached);
    exec(
        &ns,
        &[
            "reconcile",
            "--cache-dir",
            &cache,
            "--netconf-dir",
            &netconf,
        ],
        &[],
        b"",
        None,
    )
    .succeeded();
    gc(&ns, &cfg, &[]).succeeded();
    assert_pods_exactly(&must_state(&ns), &[], "after GC of everything");
    assert_same("after restore, reconcile and GC");
}

/// A GC without `cni.dev/valid-attachments` must not read as "keep nothing": it removes nothing.
/// With the list, it removes exactly what is not listed.
#[test]
fn gc_without_the_attachment_list_removes_nothing() {
    let (_h, ns) = synthetic("gc-nolist");
    let cfg = cfg_a();
    let pods: Vec<SynPod> = (1..=3).map(|i| SynPod::new("gcn", i, 0)).collect();
    for p in &pods {
        let inv = add(&ns, &cfg, p);
        assert_eq!(inv.exit, Some(0), "{inv}");
    }
    let before = must_state(&ns);
    assert_pods_exactly(&before, &pods, "after ADD");
    let inv = exec(
        &ns,
        &[],
        &env_of("GC", None, ""),
        &stdin_of(&cfg, None),
        None,
    );
    assert_eq!(inv.exit, Some(0), "{inv}");
    assert_pods_exactly(&must_state(&ns), &pods, "after a GC without the list");
    let inv = gc(&ns, &cfg, &[&pods[1]]);
    assert_eq!(inv.exit, Some(0), "{inv}");
    assert_pods_exactly(&must_state(&ns), &pods[1..2], "after a GC keeping one pod");
}
