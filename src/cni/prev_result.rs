//! The primary plugin's result (prevResult): the pod's addresses on natguard's interface.

use super::{CniVersion, SUPPORTED_VERSIONS};
use crate::error::{truncate, Error, Result};
use serde_json::Value;
use std::net::IpAddr;

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
    Ok(pod_ips(prev, ifname)?
        .into_iter()
        .map(|p| (p.addr, p.prefix))
        .collect())
}

/// One of the pod's addresses in prevResult, with where it stands there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIp {
    /// Its index in `prevResult.ips`.
    pub index: usize,
    pub addr: IpAddr,
    pub prefix: u8,
}

impl PodIp {
    /// The field, for error messages: `prevResult.ips[N].address`.
    pub fn field(&self) -> String {
        format!("prevResult.ips[{}].address", self.index)
    }
    /// The value as prevResult wrote it (normalised).
    pub fn text(&self) -> String {
        format!("{}/{}", self.addr, self.prefix)
    }
}

/// The names of the host-side interfaces a prevResult reports: those without a sandbox.
pub fn host_interfaces(prev: &Value) -> Vec<String> {
    prev.get("interfaces")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|i| {
                    i.get("sandbox")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                })
                .filter_map(|i| i.get("name").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The pod's addresses on `ifname`, each with its index and prefix length.
pub fn pod_ips(prev: &Value, ifname: &str) -> Result<Vec<PodIp>> {
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
            out.push(PodIp {
                index: i,
                addr: a,
                prefix: plen,
            });
        }
    }
    Ok(out)
}

/// Checks that a prevResult is a result this plugin can pass on (the shape of spec 0.3.0+) and
/// that every address it gives `ifname` can be a pod's: unicast, not loopback, not v4-mapped,
/// with a sane prefix ([`crate::addr::not_a_pod_address`]). A refusal names the field and the
/// value, and comes before anything touches the kernel.
pub fn validate_prev_result(prev: &Value, ifname: &str) -> Result<Vec<IpAddr>> {
    let ips = check_shape(prev, ifname)?;
    for ip in &ips {
        if let Some(why) = crate::addr::not_a_pod_address(ip.addr, ip.prefix) {
            return Err(Error::InvalidConfig(format!(
                "{}: {:?} {why}, not a pod address; the primary plugin's result is refused",
                ip.field(),
                ip.text()
            )));
        }
    }
    Ok(ips.into_iter().map(|p| p.addr).collect())
}

/// The shape checks of [`validate_prev_result`], returning the pod's addresses unjudged.
pub fn check_shape(prev: &Value, ifname: &str) -> Result<Vec<PodIp>> {
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
    pod_ips(prev, ifname)
}
