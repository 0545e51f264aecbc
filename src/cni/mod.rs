//! The CNI protocol: verbs, versions, environment, CNI_ARGS, prevResult and replies.
//!
//! natguard is a chained plugin: its ADD reply is the prevResult it was given, byte-for-byte in
//! meaning (unknown fields kept, key order kept), with `cniVersion` set to the configuration's.
//! Versions 0.3.0 through 1.1.0 are accepted because that is what real conflists carry (Calico,
//! Flannel and Cilium still write 0.3.1). Errors are printed as CNI error JSON on stdout by
//! `main`; this module only produces typed values.

pub mod env;
pub mod netconf;
pub mod prev_result;

pub use crate::error::truncate;
pub use env::{is_container_id, is_ifname, CniArgs, Env};
pub use netconf::{Attachment, NetConf};
pub use prev_result::{pod_addresses, pod_cidrs, validate_prev_result};

use crate::error::Error;
use serde_json::{json, Map, Value};

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

/// Where libcni keeps a runtime's results: one file per attachment (network, container,
/// interface), removed by the runtime after the DEL of every plugin.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/results";

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

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
