//! Synthetic pods: natguard run directly with a CNI environment and a made-up dual-stack
//! prevResult, and a model of the kernel state they must leave.
//!
//! natguard never looks at the pod's interface, so tests of kernel state need no real pods:
//! [`SynPod`] is a pod as natguard sees it (IDs, CNI_ARGS, addresses, the netns path a runtime
//! passes) and builds the invocations of each verb ([`SynPod::invocation`], [`add`], [`del`],
//! ...), run with [`super::run::Natguard`]. Thousands of them stay fast.
//!
//! The model: [`state`] reads natguard's table with `nft -j`; [`assert_pods_exactly`] compares
//! the per-pod sets with what exactly the given live pods must own, and [`Shared`] is the rest
//! (rules and shared sets), which must equal what one config produces ([`reference_shared`]).
//! The model covers pods of the network [`NET`] with a host-side interface, as
//! [`SynPod::numbered`] makes them.

use super::run::{Invocation, Natguard, Seccomp};
use super::{base64, merge, nft_table, non_masq, require_tools, Harness, Netns};
use natguard::plan::{self, OwnerKey, PodRef};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// The network of the tests that use the model.
pub const NET: &str = "hnet";

/// Where a synthetic pod's netns path points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sandbox {
    /// A file that exists for as long as the pod is meant to be alive. natguard never enters
    /// the pod's netns; it only asks whether it still exists when another attachment shares an
    /// address, to tell a live owner from a dead one.
    Live,
    /// A path under /run/netns that does not exist (the pod vanished without a DEL).
    Gone,
}

/// A pod as natguard sees it: IDs, CNI_ARGS and a dual-stack prevResult.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynPod {
    pub net: String,
    pub cid: String,
    pub ifname: String,
    /// `K8S_POD_NAMESPACE`; `None`: no CNI_ARGS at all.
    pub k8s_ns: Option<String>,
    pub name: String,
    pub v4: IpAddr,
    pub v6: IpAddr,
    pub prefix4: u8,
    pub prefix6: u8,
    /// The host side of a bridge-style attachment, listed before the pod's interface in the
    /// prevResult; `None`: the prevResult lists the pod's interface only.
    pub host_iface: Option<String>,
    pub sandbox: Sandbox,
    /// ADDed under a config in `proxy` mode ([`cfg_a`]); `false` for `deny` ([`cfg_b`]).
    pub proxied: bool,
}

impl SynPod {
    /// Pod `cid` of network `net` on eth0 in Kubernetes namespace `default`, `/16` and `/64`
    /// prefixes, a host-side veth, and a netns that no longer exists.
    pub fn new(net: &str, cid: &str, v4: IpAddr, v6: IpAddr) -> SynPod {
        SynPod {
            net: net.to_string(),
            cid: cid.to_string(),
            ifname: "eth0".into(),
            k8s_ns: Some("default".into()),
            name: format!("pod-{cid}"),
            v4,
            v6,
            prefix4: 16,
            prefix6: 64,
            host_iface: Some(format!("veth{}", &cid[cid.len().saturating_sub(8)..])),
            sandbox: Sandbox::Gone,
            proxied: true,
        }
    }

    /// Pod `i` of the test `tag` in [`NET`], addresses of generation `gen` (a re-ADD with
    /// another generation changes the pod's addresses). Every fifth pod is in `kube-system`
    /// (exempt under [`cfg_a`]), some use `net1`, and the netns is [`Sandbox::Live`].
    pub fn numbered(tag: &str, i: u32, gen: u32) -> SynPod {
        let v4 = IpAddr::V4(Ipv4Addr::new(
            10,
            (64 + gen) as u8,
            (i >> 8) as u8,
            (i & 0xff) as u8,
        ));
        let v6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 1, gen as u16, 0, 0, 0, 0, i as u16));
        let k8s_ns = if i.is_multiple_of(5) {
            "kube-system"
        } else {
            "default"
        };
        let mut p = SynPod::new(NET, &format!("{tag}{i:05}"), v4, v6)
            .in_namespace(k8s_ns)
            .named(&format!("pod-{i}"));
        if i % 7 == 3 {
            p.ifname = "net1".into();
        }
        p.sandbox = Sandbox::Live;
        p
    }

    pub fn in_namespace(mut self, k8s_ns: &str) -> SynPod {
        self.k8s_ns = Some(k8s_ns.into());
        self
    }

    /// No CNI_ARGS (a runtime that is not Kubernetes).
    pub fn without_k8s_args(mut self) -> SynPod {
        self.k8s_ns = None;
        self
    }

    pub fn named(mut self, name: &str) -> SynPod {
        self.name = name.into();
        self
    }

    pub fn prefixes(mut self, prefix4: u8, prefix6: u8) -> SynPod {
        self.prefix4 = prefix4;
        self.prefix6 = prefix6;
        self
    }

    /// A prevResult with the pod's interface only (as ptp-style or routed plugins report).
    pub fn without_host_iface(mut self) -> SynPod {
        self.host_iface = None;
        self
    }

    /// Marks the pod as ADDed under [`cfg_b`] (`deny` mode) rather than [`cfg_a`].
    pub fn denied(mut self, deny: bool) -> SynPod {
        self.proxied = !deny;
        self
    }

    /// The pod's netns is gone.
    pub fn vanished(mut self) -> SynPod {
        self.sandbox = Sandbox::Gone;
        self
    }

    pub fn with_addrs(mut self, v4: &str, v6: &str) -> SynPod {
        self.v4 = v4.parse().unwrap();
        self.v6 = v6.parse().unwrap();
        self
    }

    pub fn exempt(&self) -> bool {
        self.k8s_ns.as_deref() == Some("kube-system")
    }

    pub fn addrs(&self) -> Vec<IpAddr> {
        vec![self.v4, self.v6]
    }

    pub fn owner_key(&self) -> OwnerKey {
        OwnerKey::new(&self.net, &self.cid, &self.ifname)
    }

    pub fn owner(&self) -> String {
        self.owner_key().hex()
    }

    /// The comment of the pod's `NET-pods` element.
    pub fn comment(&self) -> String {
        plan::pod_comment(
            &PodRef {
                network: &self.net,
                container_id: &self.cid,
                ifname: &self.ifname,
                namespace: self.k8s_ns.as_deref(),
                pod_name: self.k8s_ns.as_ref().map(|_| self.name.as_str()),
                netns: "",
                annotations: Default::default(),
                host: None,
            },
            &self.addrs(),
        )
    }

    /// The host-side interface the prevResult claims; no such link exists in the test's
    /// namespace, so natguard never uses it (the pod's host side comes from the kernel).
    pub fn host_iface(&self) -> String {
        self.host_iface
            .clone()
            .unwrap_or_else(|| panic!("pod {} has no host-side interface", self.cid))
    }

    /// The `NET-att` record natguard keeps for this pod. The host side the prevResult claims
    /// is no veth whose peer is the pod's interface (no such link exists, and no pod interface
    /// either), so natguard records none: the pod is keyed by nothing the kernel did not show.
    pub fn attach_comment(&self) -> String {
        format!("if=- port=- netns={}", self.netns_path())
    }

    /// The netns path a runtime passes for the pod; for a [`Sandbox::Live`] pod this creates
    /// the path it names: a symlink to `/proc/self/ns/net`, so natguard finds a network
    /// namespace there (its own) and no interface of the pod's in it.
    pub fn netns_path(&self) -> String {
        match self.sandbox {
            Sandbox::Gone => format!("/run/netns/ng-gone-{}", self.cid),
            Sandbox::Live => {
                let dir = std::env::temp_dir().join("ng-synthetic-netns");
                let _ = fs::create_dir_all(&dir);
                let path = dir.join(&self.cid);
                if !fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                    let _ = fs::remove_file(&path);
                    let _ = std::os::unix::fs::symlink("/proc/self/ns/net", &path);
                }
                path.display().to_string()
            }
        }
    }

    /// CNI_ARGS as kubelet's runtimes send them (`None` for [`SynPod::without_k8s_args`]).
    pub fn cni_args(&self) -> Option<String> {
        let ns = self.k8s_ns.as_ref()?;
        Some(format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.name, self.cid
        ))
    }

    /// A 1.1.0 result: the host veth (if any), then the pod interface in `sandbox`.
    pub fn result_in(&self, sandbox: &str) -> Value {
        let mut interfaces = Vec::new();
        if let Some(host) = &self.host_iface {
            interfaces.push(json!({ "name": host }));
        }
        interfaces.push(json!({ "name": self.ifname, "sandbox": sandbox }));
        let pod = interfaces.len() - 1;
        json!({
            "cniVersion": "1.1.0",
            "interfaces": interfaces,
            "ips": [
                { "address": format!("{}/{}", self.v4, self.prefix4), "interface": pod },
                { "address": format!("{}/{}", self.v6, self.prefix6), "interface": pod }
            ],
            "dns": {}
        })
    }

    /// [`SynPod::result_in`] the pod's own netns path.
    pub fn result(&self) -> Value {
        self.result_in(&self.netns_path())
    }

    /// The CNI environment of `verb` for this pod with `CNI_NETNS` = `netns`.
    pub fn env_with_netns(&self, verb: &str, netns: &str) -> Vec<(String, String)> {
        let mut e = vec![
            ("CNI_COMMAND".to_string(), verb.to_string()),
            ("CNI_PATH".to_string(), "/opt/cni/bin".to_string()),
            ("CNI_NETNS".to_string(), netns.to_string()),
            ("CNI_CONTAINERID".to_string(), self.cid.clone()),
            ("CNI_IFNAME".to_string(), self.ifname.clone()),
        ];
        if let Some(args) = self.cni_args() {
            e.push(("CNI_ARGS".into(), args));
        }
        e
    }

    /// The CNI environment of `verb` for this pod.
    pub fn env(&self, verb: &str) -> Vec<(String, String)> {
        self.env_with_netns(verb, &self.netns_path())
    }

    /// `verb` for this pod under `cfg`, with the pod's prevResult.
    pub fn invocation(&self, verb: &str, cfg: &Value) -> Natguard {
        Natguard::cni(
            &self.env(verb),
            &stdin_of(cfg, &self.net, Some(self.result())),
        )
    }

    /// `verb` as a 0.3.x list, a lost cache or CRI's second DEL sends it: no prevResult, no
    /// netns.
    pub fn bare_invocation(&self, verb: &str, cfg: &Value) -> Natguard {
        Natguard::cni(
            &self.env_with_netns(verb, ""),
            &stdin_of(cfg, &self.net, None),
        )
    }
}

/// natguard's entry with fixed proxy addresses (so no route lookups), `patch` merged in.
pub fn fixed_proxy_cfg(patch: Value) -> Value {
    let mut c = json!({
        "type": "natguard",
        "metadata": { "proxyIPv4": "10.0.0.1", "proxyIPv6": "fd00::1" },
        // natguard's own masquerade too, so its rules are among those the tests check.
        "masquerade": { "masqueradeOutside": true }
    });
    merge(&mut c, &patch);
    c
}

/// Config A: proxy mode (fixed proxy addresses), port 80, kube-system exempt.
pub fn cfg_a() -> Value {
    fixed_proxy_cfg(json!({
        "metadata": { "mode": "proxy", "ports": [80], "exemptNamespaces": ["kube-system"] },
        "masquerade": { "nonMasqueradeCIDRs": non_masq() }
    }))
}

/// Config B: deny mode, ports 80 and 8080; the same pods are intercepted as with A.
pub fn cfg_b() -> Value {
    let mut c = cfg_a();
    c["metadata"]["mode"] = json!("deny");
    c["metadata"]["ports"] = json!([80, 8080]);
    c
}

/// natguard's stdin: the plugin entry of network `net` as libcni injects it (1.1.0).
pub fn stdin_of(cfg: &Value, net: &str, prev: Option<Value>) -> Vec<u8> {
    let mut c = cfg.clone();
    c["cniVersion"] = json!("1.1.0");
    c["name"] = json!(net);
    if let Some(p) = prev {
        c["prevResult"] = p;
    }
    serde_json::to_vec(&c).unwrap()
}

/// ADD of `p`; when it succeeds, the reply must be the prevResult, passed on.
pub fn add(ns: &Netns, cfg: &Value, p: &SynPod) -> Invocation {
    let inv = p.invocation("ADD", cfg).run_in(ns);
    if inv.exit == Some(0) {
        let prev = p.result();
        let r = inv.reply();
        assert_eq!(r["ips"], prev["ips"], "ADD must pass the result on: {inv}");
        assert_eq!(r["interfaces"], prev["interfaces"], "{inv}");
    }
    inv
}

pub fn del(ns: &Netns, cfg: &Value, p: &SynPod) -> Invocation {
    p.invocation("DEL", cfg).run_in(ns)
}

/// DEL without prevResult and with `CNI_NETNS=""`.
pub fn del_bare(ns: &Netns, cfg: &Value, p: &SynPod) -> Invocation {
    p.bare_invocation("DEL", cfg).run_in(ns)
}

pub fn check(ns: &Netns, cfg: &Value, p: &SynPod) -> Invocation {
    p.invocation("CHECK", cfg).run_in(ns)
}

/// GC of network `net` keeping exactly the attachments of `valid`.
pub fn gc_invocation(net: &str, cfg: &Value, valid: &[&SynPod]) -> Natguard {
    let mut c = cfg.clone();
    c["cni.dev/valid-attachments"] = json!(valid
        .iter()
        .map(|p| json!({ "containerID": p.cid, "ifname": p.ifname }))
        .collect::<Vec<_>>());
    gc_without_list(net, &c)
}

/// GC with `cfg` as it is (a GC without `cni.dev/valid-attachments` unless `cfg` has one).
pub fn gc_without_list(net: &str, cfg: &Value) -> Natguard {
    Natguard::cni(&verb_env("GC"), &stdin_of(cfg, net, None))
}

/// The environment of a verb that concerns no pod (GC, STATUS).
pub fn verb_env(verb: &str) -> Vec<(String, String)> {
    vec![
        ("CNI_COMMAND".to_string(), verb.to_string()),
        ("CNI_PATH".to_string(), "/opt/cni/bin".to_string()),
        ("CNI_NETNS".to_string(), String::new()),
    ]
}

/// GC of [`NET`] keeping exactly `valid`.
pub fn gc(ns: &Netns, cfg: &Value, valid: &[&SynPod]) -> Invocation {
    gc_invocation(NET, cfg, valid).run_in(ns)
}

/// STATUS of [`NET`], under `filter` if given.
pub fn status(ns: &Netns, cfg: &Value, filter: Option<&Seccomp>) -> Invocation {
    let mut n = Natguard::cni(&verb_env("STATUS"), &stdin_of(cfg, NET, None));
    if let Some(f) = filter {
        n = n.seccomp(f);
    }
    n.run_in(ns)
}

/// `natguard reconcile` over a CNI cache and a conflist directory ([`write_cni_cache`]).
pub fn reconcile(ns: &Netns, cache: &str, netconf: &str) -> Invocation {
    Natguard::new()
        .args(&["reconcile", "--cache-dir", cache, "--netconf-dir", netconf])
        .run_in(ns)
}

/// A fresh harness and one namespace, the node, for synthetic tests.
pub fn synthetic_node(test: &str) -> (Harness, Netns) {
    let h = Harness::new(test);
    require_tools(&["nft", "conntrack"]);
    let ns = h.netns("node");
    (h, ns)
}

// ---------------------------------------------------------------------------------------------
// Many invocations
// ---------------------------------------------------------------------------------------------

pub enum Op {
    Add(SynPod),
    Del(SynPod),
    DelBare(SynPod),
}

/// Runs every op at once ([`super::run::parallel`]); all must succeed.
pub fn run_ops(ns: &Netns, cfg: &Value, ops: Vec<Op>) {
    let jobs: Vec<Box<dyn FnOnce() -> Invocation + Send + '_>> = ops
        .into_iter()
        .map(|op| -> Box<dyn FnOnce() -> Invocation + Send + '_> {
            Box::new(move || match op {
                Op::Add(p) => add(ns, cfg, &p),
                Op::Del(p) => del(ns, cfg, &p),
                Op::DelBare(p) => del_bare(ns, cfg, &p),
            })
        })
        .collect();
    let failed: Vec<String> = super::run::parallel(jobs)
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

/// A small deterministic PRNG (xorshift64*); the seed is printed so a failure can be replayed
/// with `NATGUARD_TEST_SEED`.
pub struct Rng(u64);

impl Rng {
    pub fn new(test: &str) -> Rng {
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
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Writes libcni cache entries (`<dir>/results`) for `pods`, each with its sandbox, and a
/// conflist directory (`<dir>/net.d`) listing natguard with `cfg` for [`NET`] and another
/// network without natguard. Returns both directories.
pub fn write_cni_cache(dir: &Path, cfg: &Value, pods: &[(SynPod, String)]) -> (String, String) {
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
            "result": p.result_in(sandbox),
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

// ---------------------------------------------------------------------------------------------
// The model of the kernel state
// ---------------------------------------------------------------------------------------------

/// natguard's table as `nft -j` shows it (handles dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// set -> element (addresses normalised) -> comment
    pub sets: BTreeMap<String, BTreeMap<String, Option<String>>>,
    /// chain -> rules in order, as (comment, expressions)
    pub rules: BTreeMap<String, Vec<(String, String)>>,
    /// table flags as nft prints them
    pub flags: String,
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
pub fn state(ns: &Netns) -> Option<State> {
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

pub fn must_state(ns: &Netns) -> State {
    state(ns).unwrap_or_else(|| panic!("no table inet natguard in {}", ns.name))
}

pub const POD_SETS: [&str; 15] = [
    "pods", "att", "ifs", "redir4", "redir6", "masq4", "masq6", "exempt4", "exempt6", "redirc4",
    "redirc6", "resets4", "resets6", "denylog4", "denylog6",
];

/// The node-wide per-pod sets: every network's pods, under one name.
const NODE_SETS: [&str; 6] = [
    "exempt4", "exempt6", "resets4", "resets6", "denylog4", "denylog6",
];

/// The full name of set `suffix` of [`NET`] (a node-wide set has no network prefix).
pub fn set_name(suffix: &str) -> String {
    if NODE_SETS.contains(&suffix) {
        suffix.to_string()
    } else {
        format!("{NET}-{suffix}")
    }
}

/// What the per-pod sets must hold for exactly these live pods.
fn expected_pod_sets(live: &[SynPod]) -> BTreeMap<String, BTreeMap<String, Option<String>>> {
    let mut m: BTreeMap<String, BTreeMap<String, Option<String>>> = POD_SETS
        .iter()
        .map(|s| (set_name(s), BTreeMap::new()))
        .collect();
    for p in live {
        let o = Some(p.owner());
        m.get_mut(&set_name("pods"))
            .unwrap()
            .insert(p.owner(), Some(p.comment()));
        m.get_mut(&set_name("att"))
            .unwrap()
            .insert(p.owner(), Some(p.attach_comment()));
        // No verified host side: no interface count, no redirection, exemption, reset counter
        // or log entry, which are keyed by the host interface (a pod whose host side cannot be
        // found is neither proxied nor exempt: it fails closed).
        for (a, f) in [(p.v4, "4"), (p.v6, "6")] {
            m.get_mut(&set_name(&format!("masq{f}")))
                .unwrap()
                .insert(a.to_string(), o.clone());
        }
    }
    m
}

/// The per-pod sets hold exactly the live pods' entries: nothing lost, nothing leaked, every
/// address owned by its pod.
#[track_caller]
pub fn assert_pods_exactly(st: &State, live: &[SynPod], when: &str) {
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

/// The pod's addresses in the masq sets belong to it, and it is in `NET-pods`.
#[track_caller]
pub fn assert_owns(ns: &Netns, p: &SynPod, when: &str) {
    let st = must_state(ns);
    for (set, a) in [("masq4", p.v4), ("masq6", p.v6)] {
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

/// The shared part of the state: rules, and the sets that are not per pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    pub rules: BTreeMap<String, Vec<(String, String)>>,
    pub sets: BTreeMap<String, BTreeMap<String, Option<String>>>,
}

pub fn shared_of(st: &State) -> Shared {
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

/// The fingerprints in the network's rule comments ("natguard NET <fingerprint> [counter]");
/// the node-wide guard's ("natguard ~node ...") are the same for every config.
pub fn fingerprints(st: &State) -> BTreeSet<String> {
    st.rules
        .values()
        .flatten()
        .filter(|(c, _)| c.split(' ').nth(1) != Some("~node"))
        .map(|(c, _)| c.split(' ').nth(2).unwrap_or("").to_string())
        .collect()
}

/// The shared state one config produces, from a sequential ADD in a scratch namespace.
pub fn reference_shared(h: &Harness, role: &str, cfg: &Value) -> Shared {
    let ns = h.netns(role);
    add(&ns, cfg, &SynPod::numbered("ref", 1, 0)).succeeded();
    let sh = shared_of(&must_state(&ns));
    h.delete_netns(&ns);
    sh
}
