//! natguard's entry for the list, built from `--config` and the flags that override its fields,
//! and checked with the plugin's own config parser before it is written anywhere.
//!
//! The entry declares the `io.kubernetes.cri.pod-annotations` capability, so runtimes pass the
//! pod's annotations (see [`crate::policy`]). It keeps the order of the keys of `--config`; a flag replaces the one field it names
//! inside `metadata` or `masquerade` and leaves the rest of that section alone. A `--config`
//! holding a whole list (`plugins`, `name`, `cniVersion`) is refused: the list's own name and
//! version are kept, only natguard's entry is natguard's to give.

use super::PLUGIN_TYPE;
use crate::error::{Error, Result};
use crate::policy::POD_ANNOTATIONS_CAPABILITY;
use serde_json::{Map, Value};
use std::net::IpAddr;
use std::path::Path;

fn usage(msg: impl Into<String>) -> Error {
    Error::Command(msg.into())
}

/// Fields of natguard's entry given as flags.
#[derive(Debug, Clone, Default)]
pub(crate) struct EntryFlags {
    pub(crate) mode: Option<String>,
    pub(crate) proxy_port: Option<u16>,
    pub(crate) proxy_ipv4: Option<String>,
    pub(crate) proxy_ipv6: Option<String>,
    pub(crate) exempt_namespaces: Vec<String>,
    pub(crate) non_masquerade_cidrs: Vec<String>,
    pub(crate) no_masquerade: bool,
}

pub(crate) fn check_cidr(s: &str) -> Result<()> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| usage("expected ADDRESS/PREFIX"))?;
    let addr: IpAddr = addr.parse().map_err(|_| usage("bad address"))?;
    let len: u8 = len.parse().map_err(|_| usage("bad prefix length"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(usage(format!("prefix length {len} > {max}")));
    }
    Ok(())
}

/// natguard's entry: `{"type":"natguard"}`, then the keys of `--config` in their order, then the
/// flags, each overriding the field it names.
pub(crate) fn build_entry(config_file: Option<&Path>, flags: &EntryFlags) -> Result<Value> {
    let mut entry = Map::new();
    entry.insert("type".into(), Value::String(PLUGIN_TYPE.into()));
    let mut caps = Map::new();
    caps.insert(POD_ANNOTATIONS_CAPABILITY.into(), Value::Bool(true));
    entry.insert("capabilities".into(), Value::Object(caps));
    if let Some(path) = config_file {
        merge_config_file(&mut entry, path)?;
    }
    declare_pod_annotations(&mut entry)?;
    let mut meta = Vec::new();
    if let Some(m) = &flags.mode {
        meta.push(("mode", Value::String(m.clone())));
    }
    if let Some(p) = flags.proxy_port {
        meta.push(("proxyPort", Value::from(p)));
    }
    if let Some(a) = &flags.proxy_ipv4 {
        meta.push(("proxyIPv4", Value::String(a.clone())));
    }
    if let Some(a) = &flags.proxy_ipv6 {
        meta.push(("proxyIPv6", Value::String(a.clone())));
    }
    if !flags.exempt_namespaces.is_empty() {
        meta.push((
            "exemptNamespaces",
            Value::from(flags.exempt_namespaces.clone()),
        ));
    }
    let mut masq = Vec::new();
    if flags.no_masquerade {
        masq.push(("enabled", Value::Bool(false)));
    }
    if !flags.non_masquerade_cidrs.is_empty() {
        masq.push((
            "nonMasqueradeCIDRs",
            Value::from(flags.non_masquerade_cidrs.clone()),
        ));
    }
    for (name, fields) in [("metadata", meta), ("masquerade", masq)] {
        if fields.is_empty() {
            continue;
        }
        let section = entry
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(obj) = section else {
            return Err(usage(format!(
                "\"{name}\" is {section}, expected an object"
            )));
        };
        for (k, v) in fields {
            obj.insert(k.to_string(), v);
        }
    }
    Ok(Value::Object(entry))
}

/// natguard reads the pod's `natguard.io/` annotations from runtimeConfig, which containerd and
/// CRI-O fill only for a plugin that declares the capability: the entry always declares it,
/// beside whatever capabilities `--config` gives.
fn declare_pod_annotations(entry: &mut Map<String, Value>) -> Result<()> {
    match entry.get_mut("capabilities") {
        Some(Value::Object(caps)) => {
            caps.insert(POD_ANNOTATIONS_CAPABILITY.into(), Value::Bool(true));
            Ok(())
        }
        Some(other) => Err(usage(format!(
            "\"capabilities\" is {other}, expected an object of capability names"
        ))),
        None => {
            let mut caps = Map::new();
            caps.insert(POD_ANNOTATIONS_CAPABILITY.into(), Value::Bool(true));
            entry.insert("capabilities".into(), Value::Object(caps));
            Ok(())
        }
    }
}

/// The keys of a `--config` file, in their order, over `entry`.
fn merge_config_file(entry: &mut Map<String, Value>, path: &Path) -> Result<()> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io(format!("--config {shown}"), e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| usage(format!("--config {shown}: not JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(usage(format!(
            "--config {shown}: expected a JSON object (natguard's plugin entry)"
        )));
    };
    for (k, v) in obj {
        match k.as_str() {
            "type" if v != Value::String(PLUGIN_TYPE.into()) => {
                return Err(usage(format!(
                    "--config {shown}: \"type\" is {v}, expected \"natguard\""
                )))
            }
            "type" => {}
            "plugins" | "name" | "cniVersion" => {
                return Err(usage(format!(
                    "--config {shown}: has {k:?}; give natguard's plugin entry only, the list's \
                     name and cniVersion are kept"
                )))
            }
            _ => {
                entry.insert(k, v);
            }
        }
    }
    Ok(())
}

/// Checks natguard's entry with the plugin's own parser before it is written into a list, so
/// that a bad value fails here rather than at every pod's ADD.
pub(crate) fn validate_entry(entry: &Value) -> Result<crate::config::Config> {
    crate::config::parse_plugin_config(entry).map_err(|e| e.context("natguard's entry"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flags_build_the_entry() {
        let flags = EntryFlags {
            mode: Some("deny".into()),
            proxy_port: Some(9000),
            exempt_namespaces: vec!["kube-system".into(), "creds".into()],
            no_masquerade: true,
            ..Default::default()
        };
        let e = build_entry(None, &flags).unwrap();
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"natguard","capabilities":{"io.kubernetes.cri.pod-annotations":true},"metadata":{"mode":"deny","proxyPort":9000,"exemptNamespaces":["kube-system","creds"]},"masquerade":{"enabled":false}}"#
        );
        validate_entry(&e).unwrap();
        assert!(validate_entry(&json!({"type":"natguard","metadata":{"mode":"allow"}})).is_err());
        assert!(validate_entry(
            &json!({"type":"natguard","masquerade":{"nonMasqueradeCIDRs":["10.0.0.0/33"]}})
        )
        .is_err());
    }

    #[test]
    fn the_entry_declares_the_pod_annotations_capability() {
        let dir = std::env::temp_dir().join(format!("ng-entry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.json");
        std::fs::write(
            &f,
            r#"{"capabilities":{"portMappings":true},"logLevel":"info"}"#,
        )
        .unwrap();
        let e = build_entry(Some(&f), &EntryFlags::default()).unwrap();
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"natguard","capabilities":{"portMappings":true,"io.kubernetes.cri.pod-annotations":true},"logLevel":"info"}"#
        );
        std::fs::write(&f, r#"{"capabilities":[]}"#).unwrap();
        assert!(build_entry(Some(&f), &EntryFlags::default()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
