//! natguard's configuration: the plugin's entry in a conflist, parsed strictly once.
//!
//! Input is the JSON a runtime writes on stdin: the CNI keys (`cniVersion`, `name`, `type`,
//! `prevResult`, `runtimeConfig`, `cni.dev/valid-attachments`, …) plus natguard's own sections
//! `metadata`, `masquerade`, `conntrack` and `logFile`. Every natguard field is optional and has
//! the default documented in the README. Unknown keys inside natguard's sections are rejected,
//! because a misspelt `nonMasqueradeCidrs` silently falling back to defaults would change who
//! gets masqueraded. Unknown top-level keys belong to the runtime and are ignored.
//!
//! Errors name the field path and the offending value; downstream code never re-validates.

use crate::cni::CniVersion;
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// Largest stdin accepted; real conflists with a prevResult are a few KiB.
pub const MAX_STDIN: usize = 1 << 20;

/// The most entries natguard accepts in each config list (README, "Limits"). Every ADD reads
/// the network's shared sets back to compare them with the config, so their size is paid on
/// every pod start: at these limits about 8 ms more than with the defaults (measured on 2
/// vCPUs), with room far beyond real configs. Element lists of any of these sizes are split
/// across netlink messages (`nft::encode::set_elems`). A longer list is refused with code 7,
/// naming the field and the limit.
pub const MAX_NON_MASQUERADE_CIDRS: usize = 4096;
pub const MAX_METADATA_PORTS: usize = 1024;
pub const MAX_METADATA_ADDRESSES: usize = 64;
pub const MAX_EXEMPT_NAMESPACES: usize = 1024;

/// Refuses a list longer than `max`, before its entries are parsed.
fn check_len(path: &str, arr: &[Value], max: usize) -> Result<()> {
    if arr.len() > max {
        return Err(cfg_err(format!(
            "{path}: {} entries are more than natguard accepts (at most {max})",
            arr.len()
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataMode {
    /// DNAT metadata TCP traffic to the node-local proxy.
    Proxy,
    /// Reject metadata TCP traffic with a TCP reset.
    Deny,
    /// Leave metadata traffic alone.
    Off,
}

impl MetadataMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MetadataMode::Proxy => "proxy",
            MetadataMode::Deny => "deny",
            MetadataMode::Off => "off",
        }
    }
}

/// A proxy address: the node's own primary address of the family, or a fixed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyAddr<T> {
    Auto,
    Fixed(T),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub mode: MetadataMode,
    pub addresses: Vec<IpAddr>,
    pub ports: Vec<u16>,
    pub proxy_port: u16,
    pub proxy_ipv4: ProxyAddr<Ipv4Addr>,
    pub proxy_ipv6: ProxyAddr<Ipv6Addr>,
    pub exempt_namespaces: Vec<String>,
}

/// An address prefix, stored with its host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = s.split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let prefix: u8 = p.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return None;
        }
        Some(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// First and last address of the prefix, as integers of the family's width.
    pub fn range(&self) -> (u128, u128) {
        let bits = if self.is_ipv4() { 32 } else { 128 };
        let start = ip_to_u128(self.addr);
        let host = bits - self.prefix as u32;
        let span = if host >= 128 {
            u128::MAX
        } else {
            (1u128 << host) - 1
        };
        (start, start | span)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix)
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masquerade {
    pub enabled: bool,
    pub non_masquerade_cidrs: Vec<Cidr>,
    pub masq_link_local: bool,
    pub masq_link_local_ipv6: bool,
    pub random_fully: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conntrack {
    pub flush_on_add: bool,
}

/// natguard's own configuration, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub metadata: Metadata,
    pub masquerade: Masquerade,
    pub conntrack: Conntrack,
    pub log_file: Option<PathBuf>,
}

pub const DEFAULT_NON_MASQUERADE_CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
];

impl Default for Config {
    fn default() -> Self {
        Config {
            metadata: Metadata {
                mode: MetadataMode::Proxy,
                addresses: vec![
                    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
                    "fd00:ec2::254".parse().unwrap(),
                ],
                ports: vec![80],
                proxy_port: 8181,
                proxy_ipv4: ProxyAddr::Auto,
                proxy_ipv6: ProxyAddr::Auto,
                exempt_namespaces: Vec::new(),
            },
            masquerade: Masquerade {
                enabled: true,
                non_masquerade_cidrs: DEFAULT_NON_MASQUERADE_CIDRS
                    .iter()
                    .map(|s| Cidr::parse(s).unwrap())
                    .collect(),
                masq_link_local: false,
                masq_link_local_ipv6: false,
                random_fully: true,
            },
            conntrack: Conntrack { flush_on_add: true },
            log_file: None,
        }
    }
}

/// One attachment named by a CNI 1.1 GC request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

/// The whole network configuration a runtime passed on stdin.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    pub plugin_type: String,
    pub prev_result: Option<Value>,
    /// `cni.dev/valid-attachments`, present on GC.
    pub valid_attachments: Option<Vec<Attachment>>,
    pub natguard: Config,
}

/// A user string quoted for an error message, cut so replies stay small whatever the input.
fn q(s: &str) -> String {
    format!("{:?}", crate::cni::truncate(s, 80))
}

fn cfg_err(msg: String) -> Error {
    Error::InvalidConfig(msg)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short, printable rendering of a bad value for error messages.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let mut cut = 77;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &s[..cut])
    } else {
        s
    }
}

fn expect_bool(path: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected true or false, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

fn expect_str<'a>(path: &str, v: &'a Value) -> Result<&'a str> {
    v.as_str().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected a string, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

fn expect_array<'a>(path: &str, v: &'a Value) -> Result<&'a Vec<Value>> {
    v.as_array().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected an array, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

fn expect_port(path: &str, v: &Value) -> Result<u16> {
    match v.as_u64() {
        Some(p) if (1..=65535).contains(&p) => Ok(p as u16),
        _ => Err(cfg_err(format!(
            "{path}: {} is not a valid port (an integer from 1 to 65535)",
            show(v)
        ))),
    }
}

fn expect_object<'a>(path: &str, v: &'a Value) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected an object, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

fn reject_unknown(path: &str, obj: &Map<String, Value>, known: &[&str]) -> Result<()> {
    for k in obj.keys() {
        if !known.contains(&k.as_str()) {
            return Err(cfg_err(format!(
                "{path}.{k}: unknown field (known fields: {})",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// Kubernetes namespace names are DNS-1123 labels.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Parses natguard's sections out of a plugin entry (the whole stdin object or a conflist
/// entry). Top-level keys other than natguard's are ignored.
pub fn parse_plugin_config(v: &Value) -> Result<Config> {
    let obj = expect_object("config", v)?;
    let mut c = Config::default();
    if let Some(m) = obj.get("metadata") {
        parse_metadata(m, &mut c.metadata)?;
    }
    if let Some(m) = obj.get("masquerade") {
        parse_masquerade(m, &mut c.masquerade)?;
    }
    if let Some(ct) = obj.get("conntrack") {
        let o = expect_object("conntrack", ct)?;
        reject_unknown("conntrack", o, &["flushOnAdd"])?;
        if let Some(f) = o.get("flushOnAdd") {
            c.conntrack.flush_on_add = expect_bool("conntrack.flushOnAdd", f)?;
        }
    }
    if let Some(l) = obj.get("logFile") {
        let s = expect_str("logFile", l)?;
        if !s.is_empty() {
            if !s.starts_with('/') || s.contains('\0') {
                return Err(cfg_err(format!(
                    "logFile: {} is not an absolute path",
                    q(s)
                )));
            }
            c.log_file = Some(PathBuf::from(s));
        }
    }
    Ok(c)
}

fn parse_metadata(v: &Value, m: &mut Metadata) -> Result<()> {
    let o = expect_object("metadata", v)?;
    reject_unknown(
        "metadata",
        o,
        &[
            "mode",
            "addresses",
            "ports",
            "proxyPort",
            "proxyIPv4",
            "proxyIPv6",
            "exemptNamespaces",
        ],
    )?;
    if let Some(x) = o.get("mode") {
        m.mode = match expect_str("metadata.mode", x)? {
            "proxy" => MetadataMode::Proxy,
            "deny" => MetadataMode::Deny,
            "off" => MetadataMode::Off,
            other => {
                return Err(cfg_err(format!(
                    "metadata.mode: {} is not one of \"proxy\", \"deny\", \"off\"",
                    q(other)
                )))
            }
        };
    }
    if let Some(x) = o.get("addresses") {
        let arr = expect_array("metadata.addresses", x)?;
        check_len("metadata.addresses", arr, MAX_METADATA_ADDRESSES)?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, a) in arr.iter().enumerate() {
            let p = format!("metadata.addresses[{i}]");
            let s = expect_str(&p, a)?;
            let ip: IpAddr = s
                .parse()
                .map_err(|_| cfg_err(format!("{p}: {} is not an IP address", q(s))))?;
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                return Err(cfg_err(format!(
                    "{p}: {} cannot be a metadata address",
                    q(s)
                )));
            }
            if seen.insert(ip) {
                out.push(ip);
            }
        }
        m.addresses = out;
    }
    if let Some(x) = o.get("ports") {
        let arr = expect_array("metadata.ports", x)?;
        check_len("metadata.ports", arr, MAX_METADATA_PORTS)?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, p) in arr.iter().enumerate() {
            let port = expect_port(&format!("metadata.ports[{i}]"), p)?;
            if seen.insert(port) {
                out.push(port);
            }
        }
        if out.is_empty() && m.mode != MetadataMode::Off {
            return Err(cfg_err(
                "metadata.ports: must list at least one port unless metadata.mode is \"off\""
                    .into(),
            ));
        }
        m.ports = out;
    }
    if let Some(x) = o.get("proxyPort") {
        m.proxy_port = expect_port("metadata.proxyPort", x)?;
    }
    if let Some(x) = o.get("proxyIPv4") {
        let s = expect_str("metadata.proxyIPv4", x)?;
        m.proxy_ipv4 = if s == "auto" {
            ProxyAddr::Auto
        } else {
            match s.parse::<Ipv4Addr>() {
                Ok(a)
                    if !a.is_unspecified()
                        && !a.is_multicast()
                        && !a.is_broadcast()
                        && !a.is_loopback() =>
                {
                    ProxyAddr::Fixed(a)
                }
                _ => {
                    return Err(cfg_err(format!(
                        "metadata.proxyIPv4: {} is not \"auto\" or a unicast, non-loopback IPv4 address", q(s)
                    )))
                }
            }
        };
    }
    if let Some(x) = o.get("proxyIPv6") {
        let s = expect_str("metadata.proxyIPv6", x)?;
        m.proxy_ipv6 = if s == "auto" {
            ProxyAddr::Auto
        } else {
            match s.parse::<Ipv6Addr>() {
                Ok(a)
                    if !a.is_unspecified()
                        && !a.is_multicast()
                        && !a.is_loopback()
                        && a.to_ipv4_mapped().is_none() =>
                {
                    ProxyAddr::Fixed(a)
                }
                _ => {
                    return Err(cfg_err(format!(
                        "metadata.proxyIPv6: {} is not \"auto\" or a unicast, non-loopback IPv6 address", q(s)
                    )))
                }
            }
        };
    }
    if let Some(x) = o.get("exemptNamespaces") {
        let arr = expect_array("metadata.exemptNamespaces", x)?;
        check_len("metadata.exemptNamespaces", arr, MAX_EXEMPT_NAMESPACES)?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, n) in arr.iter().enumerate() {
            let p = format!("metadata.exemptNamespaces[{i}]");
            let s = expect_str(&p, n)?;
            if !is_dns_label(s) {
                return Err(cfg_err(format!(
                    "{p}: {} is not a Kubernetes namespace name",
                    q(s)
                )));
            }
            if seen.insert(s) {
                out.push(s.to_string());
            }
        }
        m.exempt_namespaces = out;
    }
    if m.mode != MetadataMode::Off && m.addresses.is_empty() {
        return Err(cfg_err(
            "metadata.addresses: must list at least one address unless metadata.mode is \"off\""
                .into(),
        ));
    }
    Ok(())
}

fn parse_masquerade(v: &Value, m: &mut Masquerade) -> Result<()> {
    let o = expect_object("masquerade", v)?;
    reject_unknown(
        "masquerade",
        o,
        &[
            "enabled",
            "nonMasqueradeCIDRs",
            "masqLinkLocal",
            "masqLinkLocalIPv6",
            "randomFully",
        ],
    )?;
    if let Some(x) = o.get("enabled") {
        m.enabled = expect_bool("masquerade.enabled", x)?;
    }
    if let Some(x) = o.get("nonMasqueradeCIDRs") {
        let arr = expect_array("masquerade.nonMasqueradeCIDRs", x)?;
        check_len(
            "masquerade.nonMasqueradeCIDRs",
            arr,
            MAX_NON_MASQUERADE_CIDRS,
        )?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, c) in arr.iter().enumerate() {
            let p = format!("masquerade.nonMasqueradeCIDRs[{i}]");
            let s = expect_str(&p, c)?;
            let cidr = Cidr::parse(s).ok_or_else(|| {
                cfg_err(format!(
                    "{p}: {} is not a CIDR such as \"10.0.0.0/8\"",
                    q(s)
                ))
            })?;
            if seen.insert(cidr) {
                out.push(cidr);
            }
        }
        m.non_masquerade_cidrs = out;
    }
    if let Some(x) = o.get("masqLinkLocal") {
        m.masq_link_local = expect_bool("masquerade.masqLinkLocal", x)?;
    }
    if let Some(x) = o.get("masqLinkLocalIPv6") {
        m.masq_link_local_ipv6 = expect_bool("masquerade.masqLinkLocalIPv6", x)?;
    }
    if let Some(x) = o.get("randomFully") {
        m.random_fully = expect_bool("masquerade.randomFully", x)?;
    }
    Ok(())
}

/// CNI network names: an alphanumeric, then alphanumerics, `_`, `.` or `-` (spec 1.0).
pub fn is_network_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Decodes stdin into JSON, with the decode-error code for anything that is not a JSON object.
pub fn decode_stdin(bytes: &[u8]) -> Result<Value> {
    if bytes.len() > MAX_STDIN {
        return Err(Error::Decode(format!(
            "stdin: {} bytes is more than the {MAX_STDIN} bytes a network configuration may have",
            bytes.len()
        )));
    }
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::Decode(format!("stdin: not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(Error::Decode(format!(
            "stdin: expected a JSON object, got {}",
            type_name(&v)
        )));
    }
    Ok(v)
}

/// Reads `cniVersion` from a decoded config; `None` when absent.
pub fn cni_version_of(v: &Value) -> Result<Option<CniVersion>> {
    match v.get("cniVersion") {
        None => Ok(None),
        Some(Value::String(s)) => CniVersion::parse(s).map(Some).ok_or_else(|| {
            Error::IncompatibleVersion(format!(
                "cniVersion: {} is not supported (supported: {})",
                q(s),
                crate::cni::SUPPORTED_VERSIONS.join(", ")
            ))
        }),
        Some(other) => Err(cfg_err(format!(
            "cniVersion: expected a string, got {} {}",
            type_name(other),
            show(other)
        ))),
    }
}

/// Parses the network configuration of an ADD, DEL, CHECK or GC.
pub fn parse_netconf(bytes: &[u8]) -> Result<NetConf> {
    let v = decode_stdin(bytes)?;
    netconf_from_value(&v)
}

pub fn netconf_from_value(v: &Value) -> Result<NetConf> {
    let obj = v.as_object().expect("decode_stdin checks for an object");
    let cni_version = cni_version_of(v)?.ok_or_else(|| {
        Error::IncompatibleVersion("cniVersion: missing from the network configuration".into())
    })?;
    let name = match obj.get("name") {
        Some(Value::String(s)) if is_network_name(s) => s.clone(),
        Some(Value::String(s)) => {
            return Err(cfg_err(format!(
                "name: {} is not a valid network name (letters, digits, '_', '.', '-'; starting with a letter or digit; at most 128 bytes)", q(s)
            )))
        }
        Some(other) => {
            return Err(cfg_err(format!(
                "name: expected a string, got {} {}",
                type_name(other),
                show(other)
            )))
        }
        None => return Err(cfg_err("name: missing from the network configuration".into())),
    };
    let plugin_type = match obj.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(cfg_err(format!(
                "type: expected a string, got {} {}",
                type_name(other),
                show(other)
            )))
        }
        None => "natguard".to_string(),
    };
    let prev_result = match obj.get("prevResult") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p.clone()),
        Some(other) => {
            return Err(Error::Decode(format!(
                "prevResult: expected an object, got {} {}",
                type_name(other),
                show(other)
            )))
        }
    };
    let valid_attachments = match obj.get("cni.dev/valid-attachments") {
        None | Some(Value::Null) => None,
        Some(x) => Some(parse_attachments(x)?),
    };
    let natguard = parse_plugin_config(v)?;
    Ok(NetConf {
        cni_version,
        name,
        plugin_type,
        prev_result,
        valid_attachments,
        natguard,
    })
}

/// The lenient parse DEL falls back to when the strict one fails on natguard's own sections or
/// on prevResult: DEL needs only the network name (with the container ID and ifname from the
/// environment) to find what the pod owns, and a DEL that fails leaks the primary plugin's IP.
pub fn netconf_for_del(bytes: &[u8]) -> Result<NetConf> {
    let v = decode_stdin(bytes)?;
    let mut obj = v.as_object().cloned().unwrap_or_default();
    for k in [
        "metadata",
        "masquerade",
        "conntrack",
        "logFile",
        "cni.dev/valid-attachments",
    ] {
        obj.remove(k);
    }
    if !obj.get("prevResult").is_some_and(Value::is_object) {
        obj.remove("prevResult");
    }
    netconf_from_value(&Value::Object(obj))
}

fn parse_attachments(v: &Value) -> Result<Vec<Attachment>> {
    let p = "cni.dev/valid-attachments";
    let arr = expect_array(p, v)?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, a) in arr.iter().enumerate() {
        let ap = format!("{p}[{i}]");
        let o = expect_object(&ap, a)?;
        let cid = expect_str(
            &format!("{ap}.containerID"),
            o.get("containerID").unwrap_or(&Value::Null),
        )?;
        let ifname = expect_str(
            &format!("{ap}.ifname"),
            o.get("ifname").unwrap_or(&Value::Null),
        )?;
        out.push(Attachment {
            container_id: cid.to_string(),
            ifname: ifname.to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(extra: Value) -> Value {
        let mut base = json!({"cniVersion":"1.0.0","name":"net1","type":"natguard"});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    }

    #[test]
    fn defaults_match_the_documented_interface() {
        let c = netconf_from_value(&conf(json!({}))).unwrap().natguard;
        assert_eq!(c, Config::default());
        assert_eq!(c.metadata.mode, MetadataMode::Proxy);
        assert_eq!(c.metadata.ports, vec![80]);
        assert_eq!(c.metadata.proxy_port, 8181);
        assert_eq!(c.masquerade.non_masquerade_cidrs.len(), 11);
        assert!(c.masquerade.random_fully && c.masquerade.enabled);
        assert!(c.conntrack.flush_on_add);
        assert_eq!(c.log_file, None);
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        let cases = [
            (
                json!({"metadata":{"ports":[80, 70000]}}),
                "metadata.ports[1]",
                "70000",
            ),
            (
                json!({"metadata":{"mode":"block"}}),
                "metadata.mode",
                "block",
            ),
            (
                json!({"metadata":{"proxyIPv4":"1.2.3"}}),
                "metadata.proxyIPv4",
                "1.2.3",
            ),
            (
                json!({"metadata":{"addresses":["x"]}}),
                "metadata.addresses[0]",
                "x",
            ),
            (
                json!({"metadata":{"exemptNamespaces":["Kube_System"]}}),
                "metadata.exemptNamespaces[0]",
                "Kube_System",
            ),
            (
                json!({"masquerade":{"nonMasqueradeCIDRs":["10.0.0.0/33"]}}),
                "masquerade.nonMasqueradeCIDRs[0]",
                "10.0.0.0/33",
            ),
            (
                json!({"masquerade":{"enabled":"yes"}}),
                "masquerade.enabled",
                "yes",
            ),
            (
                json!({"masquerade":{"nonMasqueradeCidrs":[]}}),
                "masquerade.nonMasqueradeCidrs",
                "unknown field",
            ),
            (
                json!({"conntrack":{"flush":true}}),
                "conntrack.flush",
                "unknown field",
            ),
            (json!({"logFile":"relative.log"}), "logFile", "relative.log"),
            (
                json!({"metadata":{"proxyPort":0}}),
                "metadata.proxyPort",
                "0",
            ),
        ];
        for (extra, field, value) in cases {
            let e = netconf_from_value(&conf(extra.clone())).unwrap_err();
            assert_eq!(e.code(), 7, "{extra}: {e}");
            let m = e.to_string();
            assert!(m.contains(field) && m.contains(value), "{extra}: {m}");
        }
    }

    #[test]
    fn lists_up_to_their_limit_parse_and_longer_ones_name_the_limit() {
        let cidrs = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
                .collect()
        };
        let ports = |n: usize| -> Vec<u64> { (1..=n as u64).collect() };
        let addrs = |n: usize| -> Vec<String> { (1..=n).map(|i| format!("10.9.0.{i}")).collect() };
        let nss = |n: usize| -> Vec<String> { (0..n).map(|i| format!("ns-{i}")).collect() };
        let cases = [
            (
                "masquerade.nonMasqueradeCIDRs",
                MAX_NON_MASQUERADE_CIDRS,
                json!({"masquerade":{"nonMasqueradeCIDRs": cidrs(MAX_NON_MASQUERADE_CIDRS)}}),
                json!({"masquerade":{"nonMasqueradeCIDRs": cidrs(MAX_NON_MASQUERADE_CIDRS + 1)}}),
            ),
            (
                "metadata.ports",
                MAX_METADATA_PORTS,
                json!({"metadata":{"ports": ports(MAX_METADATA_PORTS)}}),
                json!({"metadata":{"ports": ports(MAX_METADATA_PORTS + 1)}}),
            ),
            (
                "metadata.addresses",
                MAX_METADATA_ADDRESSES,
                json!({"metadata":{"addresses": addrs(MAX_METADATA_ADDRESSES)}}),
                json!({"metadata":{"addresses": addrs(MAX_METADATA_ADDRESSES + 1)}}),
            ),
            (
                "metadata.exemptNamespaces",
                MAX_EXEMPT_NAMESPACES,
                json!({"metadata":{"exemptNamespaces": nss(MAX_EXEMPT_NAMESPACES)}}),
                json!({"metadata":{"exemptNamespaces": nss(MAX_EXEMPT_NAMESPACES + 1)}}),
            ),
        ];
        for (field, max, at, over) in cases {
            netconf_from_value(&conf(at)).unwrap_or_else(|e| panic!("{field} at {max}: {e}"));
            let e = netconf_from_value(&conf(over)).unwrap_err();
            assert_eq!(e.code(), 7, "{field}: {e}");
            let m = e.to_string();
            assert!(
                m.contains(field) && m.contains(&format!("at most {max}")),
                "{m}"
            );
        }
    }

    #[test]
    fn cidrs_are_normalised() {
        let c = Cidr::parse("10.1.2.3/8").unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!(c.range(), (0x0a00_0000, 0x0aff_ffff));
        let c6 = Cidr::parse("fd00::1/64").unwrap();
        assert_eq!(c6.to_string(), "fd00::/64");
        assert!(Cidr::parse("10.0.0.0/+8").is_none());
        assert!(Cidr::parse("10.0.0.0").is_none());
        assert_eq!(Cidr::parse("::/0").unwrap().range(), (0, u128::MAX));
    }

    #[test]
    fn version_and_name_are_required() {
        let e = netconf_from_value(&json!({"name":"n"})).unwrap_err();
        assert_eq!(e.code(), 1);
        let e = netconf_from_value(&json!({"cniVersion":"9.9.9","name":"n"})).unwrap_err();
        assert_eq!(e.code(), 1);
        let e = netconf_from_value(&json!({"cniVersion":"1.0.0"})).unwrap_err();
        assert!(e.to_string().contains("name"));
        let e = netconf_from_value(&json!({"cniVersion":"1.0.0","name":"a b"})).unwrap_err();
        assert_eq!(e.code(), 7);
    }

    #[test]
    fn decode_errors_use_code_6() {
        assert_eq!(decode_stdin(b"{").unwrap_err().code(), 6);
        assert_eq!(decode_stdin(b"[]").unwrap_err().code(), 6);
        assert_eq!(decode_stdin(&[0xff, 0xfe]).unwrap_err().code(), 6);
        let big = vec![b' '; MAX_STDIN + 1];
        assert_eq!(decode_stdin(&big).unwrap_err().code(), 6);
    }
}
