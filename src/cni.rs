//! The CNI protocol: verbs, versions, environment, CNI_ARGS, prevResult and replies.
//!
//! natguard is a chained plugin: its ADD reply is the prevResult it was given, byte-for-byte in
//! meaning (unknown fields kept, key order kept), with `cniVersion` set to the configuration's.
//! Versions 0.3.0 through 1.1.0 are accepted because that is what real conflists carry (Calico,
//! Flannel and Cilium still write 0.3.1). Errors are printed as CNI error JSON on stdout by
//! `main`; this module only produces typed values.

use crate::error::{Error, Result};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

impl CniVersion {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "0.3.0" => CniVersion::V0_3_0,
            "0.3.1" => CniVersion::V0_3_1,
            "0.4.0" => CniVersion::V0_4_0,
            "1.0.0" => CniVersion::V1_0_0,
            "1.1.0" => CniVersion::V1_1_0,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }
    pub fn supports_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }
    pub fn supports_gc_status(self) -> bool {
        self >= CniVersion::V1_1_0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// The `CNI_*` environment of one invocation, validated for its verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: CniArgs,
}

/// `CNI_ARGS`, as the set of keys natguard uses. Unknown keys are ignored: kubelet and CRI
/// send `IgnoreUnknown=1;K8S_POD_NAMESPACE=…;…` in random order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
}

const MAX_ID_LEN: usize = 1024;

/// Container IDs: an alphanumeric then alphanumerics, `_`, `.`, `-` (spec 1.0).
pub fn is_container_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Interface names as the kernel accepts them.
pub fn is_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|c| c.is_ascii_graphic() && c != b'/' && c != b':')
}

impl CniArgs {
    /// Parses `K=V;K=V`. Pairs without `=` and repeated keys that natguard uses are errors,
    /// because a pod must not be able to look exempt through an ambiguous namespace.
    pub fn parse(s: &str) -> Result<CniArgs> {
        let mut seen: HashMap<&str, &str> = HashMap::new();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                Error::InvalidEnv(format!(
                    "CNI_ARGS: {:?} is not a KEY=VALUE pair",
                    truncate(pair, 64)
                ))
            })?;
            if matches!(k, "K8S_POD_NAMESPACE" | "K8S_POD_NAME") {
                if let Some(prev) = seen.insert(k, v) {
                    if prev != v {
                        return Err(Error::InvalidEnv(format!(
                            "CNI_ARGS: {k} is given twice ({:?} and {:?})",
                            truncate(prev, 64),
                            truncate(v, 64)
                        )));
                    }
                }
            }
        }
        let ns = seen.get("K8S_POD_NAMESPACE").map(|s| s.to_string());
        if let Some(n) = &ns {
            if !crate::config::is_dns_label(n) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_ARGS: K8S_POD_NAMESPACE={:?} is not a Kubernetes namespace name",
                    truncate(n, 64)
                )));
            }
        }
        let name = seen.get("K8S_POD_NAME").map(|s| s.to_string());
        if let Some(n) = &name {
            if n.len() > 253 || !n.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_ARGS: K8S_POD_NAME={:?} is not a Kubernetes object name",
                    truncate(n, 64)
                )));
            }
        }
        Ok(CniArgs {
            pod_namespace: ns,
            pod_name: name,
        })
    }
}

pub fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut cut = n;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

impl Env {
    /// Reads and validates the environment for `command`, from a lookup function so tests need
    /// not touch the process environment.
    pub fn from_lookup(command: Command, get: &dyn Fn(&str) -> Option<String>) -> Result<Env> {
        let need_ids = matches!(command, Command::Add | Command::Del | Command::Check);
        let var = |k: &str| get(k).unwrap_or_default();
        let container_id = var("CNI_CONTAINERID");
        let ifname = var("CNI_IFNAME");
        let netns = var("CNI_NETNS");
        if need_ids {
            if container_id.is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_CONTAINERID: must be set for {}",
                    command.as_str()
                )));
            }
            if !is_container_id(&container_id) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_CONTAINERID: {:?} is not a valid container ID",
                    truncate(&container_id, 80)
                )));
            }
            if ifname.is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_IFNAME: must be set for {}",
                    command.as_str()
                )));
            }
            if !is_ifname(&ifname) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_IFNAME: {:?} is not a valid interface name",
                    truncate(&ifname, 80)
                )));
            }
        }
        if matches!(command, Command::Add | Command::Check) {
            if netns.is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_NETNS: must be set for {}",
                    command.as_str()
                )));
            }
            if get("CNI_PATH").unwrap_or_default().is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_PATH: must be set for {}",
                    command.as_str()
                )));
            }
        }
        let raw_args = var("CNI_ARGS");
        let args = match CniArgs::parse(&raw_args) {
            Ok(a) => a,
            // DEL must not fail on what ADD would have refused: it only needs the IDs.
            Err(_) if command == Command::Del => CniArgs::default(),
            Err(e) => return Err(e),
        };
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args,
        })
    }
}

/// The pod addresses a prevResult assigns to `ifname`: IPs whose `interface` index names that
/// interface, and IPs without an index (0.3.x results of some primary plugins omit it).
pub fn pod_addresses(prev: &Value, ifname: &str) -> Result<Vec<IpAddr>> {
    Ok(pod_cidrs(prev, ifname)?
        .into_iter()
        .map(|(a, _)| a)
        .collect())
}

/// Like [`pod_addresses`], with each address's prefix length.
pub fn pod_cidrs(prev: &Value, ifname: &str) -> Result<Vec<(IpAddr, u8)>> {
    let obj = prev
        .as_object()
        .ok_or_else(|| Error::Decode("prevResult: expected an object".into()))?;
    let ifaces: Vec<Option<&str>> = match obj.get("interfaces") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|i| i.get("name").and_then(Value::as_str))
            .collect(),
        Some(_) => {
            return Err(Error::Decode(
                "prevResult.interfaces: expected an array".into(),
            ))
        }
    };
    let ips = match obj.get("ips") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(Error::Decode("prevResult.ips: expected an array".into())),
    };
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, ip) in ips.iter().enumerate() {
        let p = format!("prevResult.ips[{i}]");
        let o = ip
            .as_object()
            .ok_or_else(|| Error::Decode(format!("{p}: expected an object")))?;
        let addr = o
            .get("address")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Decode(format!("{p}.address: missing or not a string")))?;
        let (a, plen) = addr.split_once('/').ok_or_else(|| {
            Error::Decode(format!(
                "{p}.address: {:?} is not an address with a prefix length",
                truncate(addr, 64)
            ))
        })?;
        let a: IpAddr = a.parse().map_err(|_| {
            Error::Decode(format!(
                "{p}.address: {:?} is not an IP address",
                truncate(addr, 64)
            ))
        })?;
        let max = if a.is_ipv4() { 32 } else { 128 };
        let plen = match plen.parse::<u8>() {
            Ok(l) if l <= max && !plen.starts_with('+') => l,
            _ => {
                return Err(Error::Decode(format!(
                    "{p}.address: {:?} has an invalid prefix length",
                    truncate(addr, 64)
                )))
            }
        };
        let on_ifname = match o.get("interface") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => {
                let idx = n
                    .as_u64()
                    .ok_or_else(|| Error::Decode(format!("{p}.interface: {n} is not an index")))?
                    as usize;
                match ifaces.get(idx) {
                    Some(name) => *name == Some(ifname),
                    None => {
                        return Err(Error::Decode(format!(
                            "{p}.interface: index {idx} is out of range ({} interfaces)",
                            ifaces.len()
                        )))
                    }
                }
            }
            Some(other) => {
                return Err(Error::Decode(format!(
                    "{p}.interface: expected an index, got {other}"
                )))
            }
        };
        if on_ifname && seen.insert(a) {
            out.push((a, plen));
        }
    }
    Ok(out)
}

/// Checks that a prevResult is a result this plugin can pass on: the shape of spec 0.3.0+.
pub fn validate_prev_result(prev: &Value, ifname: &str) -> Result<Vec<IpAddr>> {
    let obj = prev
        .as_object()
        .ok_or_else(|| Error::Decode("prevResult: expected an object".into()))?;
    if obj.contains_key("ip4") || obj.contains_key("ip6") {
        return Err(Error::Decode(
            "prevResult: a 0.1.0/0.2.0 result (ip4/ip6) is not supported; use cniVersion 0.3.0 or later"
                .into(),
        ));
    }
    if let Some(v) = obj.get("cniVersion") {
        let s = v
            .as_str()
            .ok_or_else(|| Error::Decode("prevResult.cniVersion: expected a string".into()))?;
        if CniVersion::parse(s).is_none() {
            return Err(Error::IncompatibleVersion(format!(
                "prevResult.cniVersion: {:?} is not supported (supported: {})",
                truncate(s, 32),
                SUPPORTED_VERSIONS.join(", ")
            )));
        }
    }
    pod_addresses(prev, ifname)
}

/// The ADD reply: the prevResult unchanged, with the configuration's cniVersion.
pub fn passthrough(prev: &Value, version: CniVersion) -> Value {
    let mut out = Map::new();
    out.insert("cniVersion".into(), Value::String(version.as_str().into()));
    if let Some(o) = prev.as_object() {
        for (k, v) in o {
            if k != "cniVersion" {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The VERSION reply. It needs no configuration: podman sends only `{"cniVersion":"1.0.0"}`.
pub fn version_reply(requested: Option<CniVersion>) -> Value {
    json!({
        "cniVersion": requested.unwrap_or(CniVersion::V1_1_0).as_str(),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// CNI error JSON.
pub fn error_reply(version: Option<CniVersion>, err: &Error) -> Value {
    let msg = err.to_string();
    let (msg, details) = match msg.split_once(": ") {
        Some((head, _)) if head.len() < msg.len() => (head.to_string(), msg.clone()),
        _ => (msg.clone(), msg.clone()),
    };
    json!({
        "cniVersion": version.unwrap_or(CniVersion::V1_1_0).as_str(),
        "code": err.code(),
        "msg": msg,
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn cni_args_are_an_unordered_set() {
        let a = CniArgs::parse("K8S_POD_NAME=web;IgnoreUnknown=1;FOO=bar;K8S_POD_NAMESPACE=prod")
            .unwrap();
        let b = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.pod_namespace.as_deref(), Some("prod"));
        assert!(CniArgs::parse("junk").is_err());
        let e =
            CniArgs::parse("K8S_POD_NAMESPACE=kube-system;K8S_POD_NAMESPACE=default").unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(CniArgs::parse("K8S_POD_NAMESPACE=Kube System").is_err());
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn env_is_validated_per_verb() {
        let full = [
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        assert!(Env::from_lookup(Command::Add, &env(&full)).is_ok());
        let no_netns = [("CNI_CONTAINERID", "abc"), ("CNI_IFNAME", "eth0")];
        assert_eq!(
            Env::from_lookup(Command::Add, &env(&no_netns))
                .unwrap_err()
                .code(),
            4
        );
        assert!(Env::from_lookup(Command::Del, &env(&no_netns)).is_ok());
        let bad_if = [("CNI_CONTAINERID", "abc"), ("CNI_IFNAME", "eth/0")];
        let e = Env::from_lookup(Command::Del, &env(&bad_if)).unwrap_err();
        assert!(e.to_string().contains("CNI_IFNAME") && e.to_string().contains("eth/0"));
        assert!(Env::from_lookup(Command::Version, &env(&[])).is_ok());
        let bad_id = [("CNI_CONTAINERID", "../etc"), ("CNI_IFNAME", "eth0")];
        assert!(Env::from_lookup(Command::Del, &env(&bad_id)).is_err());
    }

    #[test]
    fn pod_addresses_follow_the_interface_index() {
        let prev = json!({
            "interfaces":[{"name":"cni0"},{"name":"veth1"},{"name":"eth0","sandbox":"/run/netns/p"}],
            "ips":[{"address":"10.22.0.5/16","interface":2},
                   {"address":"fd00::5/64","interface":2},
                   {"address":"10.99.0.1/16","interface":0},
                   {"address":"10.22.0.5/16","interface":2}]
        });
        let a = pod_addresses(&prev, "eth0").unwrap();
        assert_eq!(
            a,
            vec![
                "10.22.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        let no_idx = json!({"ips":[{"version":"4","address":"10.1.0.2/32"}]});
        assert_eq!(pod_addresses(&no_idx, "eth0").unwrap().len(), 1);
        let bad = json!({"ips":[{"address":"10.1.0.2/40"}]});
        assert_eq!(pod_addresses(&bad, "eth0").unwrap_err().code(), 6);
        let out_of_range = json!({"ips":[{"address":"10.1.0.2/24","interface":3}]});
        assert!(pod_addresses(&out_of_range, "eth0").is_err());
    }

    #[test]
    fn passthrough_keeps_unknown_fields_and_sets_version() {
        let prev = json!({"cniVersion":"1.0.0","zz":1,"ips":[],"custom":{"a":[1,2]}});
        let out = passthrough(&prev, CniVersion::V0_3_1);
        assert_eq!(out["cniVersion"], "0.3.1");
        assert_eq!(out["custom"], json!({"a":[1,2]}));
        assert_eq!(out["zz"], 1);
    }

    #[test]
    fn version_reply_lists_every_supported_version() {
        let v = version_reply(CniVersion::parse("0.4.0"));
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 5);
    }
}
