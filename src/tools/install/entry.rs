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
    /// `--masquerade-outside`: `masquerade.masqueradeOutside = true`.
    pub(crate) masquerade_outside: bool,
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
    if flags.masquerade_outside {
        masq.push(("masqueradeOutside", Value::Bool(true)));
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
/// that a bad value fails here rather than at every pod's ADD; a misspelling of natguard's own
/// keys is refused too ([`entry_warnings`]).
pub(crate) fn validate_entry(entry: &Value) -> Result<crate::config::Config> {
    let cfg =
        crate::config::parse_plugin_config(entry).map_err(|e| e.context("natguard's entry"))?;
    entry_warnings(entry)?;
    Ok(cfg)
}

/// Logs what natguard's entry may not mean as written ([`entry_warnings`]), once logging has
/// its format.
pub(crate) fn warn_about_entry(entry: &Value) {
    for w in entry_warnings(entry).unwrap_or_default() {
        crate::warn!("natguard's entry: {w}");
    }
}

/// natguard's own top-level keys.
const OWN_KEYS: [&str; 7] = [
    "metadata",
    "masquerade",
    "conntrack",
    "logFile",
    "logLevel",
    "logFileMaxSize",
    "logFormat",
];

/// Top-level keys a runtime or a meta plugin puts in a plugin's entry: the CNI spec's
/// (`cniVersion`, `name`, `type`, `capabilities`, `runtimeConfig`, `args`, `prevResult`, the
/// well-known `ipMasq`, `ipam`, `dns`), libcni's `cni.dev/...` and `runtimeConfig` keys,
/// CRI-O's and Multus's (`cniVersion`, `name` and `kubeconfig`-style keys of their own).
const RUNTIME_KEYS: [&str; 12] = [
    "cniVersion",
    "name",
    "type",
    "capabilities",
    "runtimeConfig",
    "args",
    "prevResult",
    "ipMasq",
    "ipam",
    "dns",
    "disableCheck",
    "kubeconfig",
];

/// What natguard's entry may not mean as written: a top-level key that is neither natguard's
/// nor a runtime's is warned about (a runtime may add keys natguard does not know); one that is
/// a misspelling of natguard's own (`metdata`) is refused, since every default would apply
/// silently in its place. And a `masquerade` section that relies on 0.2.0's default of
/// masquerading everything outside nonMasqueradeCIDRs is told the default changed.
pub(crate) fn entry_warnings(entry: &Value) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let Some(obj) = entry.as_object() else {
        return Ok(out);
    };
    for k in obj.keys() {
        if OWN_KEYS.contains(&k.as_str())
            || RUNTIME_KEYS.contains(&k.as_str())
            || k.contains('/')
            || k.contains('.')
        {
            continue; // natguard's, a runtime's, or a namespaced key (cni.dev/..., example.com/...)
        }
        if let Some(near) = OWN_KEYS
            .iter()
            .find(|o| k.len() > 3 && edit_distance(&o.to_lowercase(), &k.to_lowercase()) <= 2)
        {
            return Err(usage(format!(
                "natguard's entry: {k:?}: unknown key; did you mean {near:?}? (with it misspelt \
                 every default of {near:?} would apply)"
            )));
        }
        out.push(format!(
            "{k:?}: unknown top-level key, ignored (natguard's own are {}; a runtime's are kept \
             as they are)",
            OWN_KEYS.join(", ")
        ));
    }
    let masq = obj.get("masquerade").and_then(Value::as_object);
    let enabled = masq
        .and_then(|m| m.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if enabled && !masq.is_some_and(|m| m.contains_key("masqueradeOutside")) {
        out.push(
            "masquerade.masqueradeOutside is not set: natguard masquerades only what the \
             exceptions need (traffic to nonMasqueradeCIDRs keeps the pod's address) and no longer \
             everything else, as 0.2.0 did by default; set masquerade.masqueradeOutside to true to \
             keep 0.2.0's masquerade, or false to say this is meant (docs/upgrade.md)"
                .into(),
        );
    }
    Ok(out)
}

/// Levenshtein distance, for short keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelt_own_key_is_refused_and_an_unknown_one_warned_about() {
        let e = entry_warnings(&json!({"type":"natguard","metdata":{"mode":"deny"}})).unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("\"metdata\"") && t.contains("did you mean \"metadata\""),
            "{t}"
        );
        assert!(entry_warnings(&json!({"Masquerade":{}})).is_err());
        let w = entry_warnings(&json!({"type":"natguard","frobnicate":1,
            "masquerade":{"masqueradeOutside":true}}))
        .unwrap();
        assert!(
            w.len() == 1 && w[0].contains("\"frobnicate\": unknown top-level key"),
            "{w:?}"
        );
        // A runtime's and namespaced keys say nothing.
        let quiet = json!({"cniVersion":"1.0.0","name":"n","type":"natguard","capabilities":{},
            "runtimeConfig":{},"args":{"cni":{}},"prevResult":{},"cni.dev/x":1,"dns":{},
            "metadata":{},"masquerade":{"masqueradeOutside":false}});
        let _ = &quiet;
        assert_eq!(entry_warnings(&quiet).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_masquerade_section_without_masquerade_outside_is_told_the_default_changed() {
        let w =
            entry_warnings(&json!({"masquerade":{"nonMasqueradeCIDRs":["10.0.0.0/8"]}})).unwrap();
        assert!(
            w.len() == 1 && w[0].contains("masqueradeOutside is not set"),
            "{w:?}"
        );
        assert_eq!(
            entry_warnings(&json!({})).unwrap().len(),
            1,
            "the defaults changed too"
        );
        for quiet in [
            json!({"masquerade":{"masqueradeOutside":true}}),
            json!({"masquerade":{"enabled":false}}),
        ] {
            assert_eq!(
                entry_warnings(&quiet).unwrap(),
                Vec::<String>::new(),
                "{quiet}"
            );
        }
    }

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
