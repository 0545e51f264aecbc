//! The network configuration a runtime passes on stdin: the CNI keys (`cniVersion`, `name`,
//! `type`, `prevResult`, `cni.dev/valid-attachments`) around natguard's own sections, which
//! [`crate::config`] parses, and natguard's pod annotations in `runtimeConfig`, which
//! [`crate::policy`] parses. Unknown top-level keys belong to the runtime and are ignored.

use super::CniVersion;
use crate::config::{
    cfg_err, expect_array, expect_object, expect_str, parse_plugin_config, q, show, type_name,
    Config,
};
use crate::error::{Error, Result};
use serde_json::Value;

/// Largest stdin accepted: 16 MiB. A conflist with a prevResult is a few KiB, but a GC names
/// every valid attachment of the node in `cni.dev/valid-attachments`, about 100 bytes each
/// with a 64-hex container ID, so the cap holds over 160,000 of them ([`GC_ATTACHMENTS_THAT_FIT`]
/// of the longest plausible kind). It is still a cap: what a runaway runtime can make natguard
/// buffer and parse (the bytes, then about 400 bytes of JSON value and 100 of attachment per
/// entry: under 100 MiB at the cap) is bounded.
pub const MAX_STDIN: usize = 16 << 20;

/// Attachments of the longest plausible entry that a GC's stdin holds with room to spare:
/// `{"containerID":"<64 hex>","ifname":"<15 bytes>"},` is 110 bytes, and 4 KiB is left for
/// the rest of the config.
pub const GC_ATTACHMENTS_THAT_FIT: usize = (MAX_STDIN - 4096) / 110;
const _: () = assert!(GC_ATTACHMENTS_THAT_FIT >= 150_000);

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
    /// natguard's pod annotations, from `runtimeConfig["io.kubernetes.cri.pod-annotations"]`.
    pub annotations: crate::policy::Annotations,
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
                super::SUPPORTED_VERSIONS.join(", ")
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
    let annotations = crate::policy::parse(obj.get("runtimeConfig"))?;
    Ok(NetConf {
        cni_version,
        name,
        plugin_type,
        prev_result,
        valid_attachments,
        natguard,
        annotations,
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
        "logLevel",
        "logFileMaxSize",
        "cni.dev/valid-attachments",
        "runtimeConfig",
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
