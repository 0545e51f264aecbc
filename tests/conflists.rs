//! The example conflists in `conflist/`: each is a valid list with natguard last, and natguard's
//! entry, as a runtime hands it over (name and cniVersion injected), is accepted by the plugin's
//! own parser with the values the file states. No root needed.

use natguard::cni::netconf::parse_netconf;
use natguard::config::MetadataMode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Every example and the cniVersion it is written for.
const EXAMPLES: [(&str, &str); 5] = [
    ("bridge-host-local.conflist", "1.0.0"),
    ("ptp.conflist", "1.0.0"),
    ("calico.conflist", "0.3.1"),
    ("flannel.conflist", "0.3.1"),
    ("aws-vpc-cni.conflist", "0.4.0"),
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conflist")
}

fn load(file: &str) -> Value {
    let path = dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file} is not valid JSON: {e}"))
}

/// A prevResult of the given version, as the primary plugin would print it.
fn prev_result(version: &str) -> Value {
    json!({
        "cniVersion": version,
        "interfaces": [
            { "name": "cni0", "mac": "aa:bb:cc:dd:ee:01" },
            { "name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/run/netns/test" }
        ],
        "ips": [
            { "address": "10.244.0.2/24", "gateway": "10.244.0.1", "interface": 1 }
        ]
    })
}

#[test]
fn every_example_is_covered() {
    let mut found: Vec<String> = std::fs::read_dir(dir())
        .expect("conflist dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".conflist"))
        .collect();
    found.sort();
    let mut expected: Vec<String> = EXAMPLES.iter().map(|(f, _)| f.to_string()).collect();
    expected.sort();
    assert_eq!(
        found, expected,
        "every example in conflist/ must be listed here"
    );
}

#[test]
fn examples_are_lists_with_natguard_last() {
    for (file, version) in EXAMPLES {
        let list = load(file);
        assert_eq!(list["cniVersion"], json!(version), "{file}: cniVersion");
        let name = list["name"].as_str().unwrap_or("");
        assert!(!name.is_empty(), "{file}: network name missing");
        let plugins = list["plugins"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: plugins is not an array"));
        assert!(plugins.len() >= 2, "{file}: a primary plugin and natguard");
        let types: Vec<&str> = plugins
            .iter()
            .map(|p| {
                p["type"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{file}: plugin without type: {p}"))
            })
            .collect();
        assert_eq!(
            types.last(),
            Some(&"natguard"),
            "{file}: natguard must be last"
        );
        assert_eq!(
            types.iter().filter(|t| **t == "natguard").count(),
            1,
            "{file}: natguard listed once"
        );
        assert_ne!(types[0], "natguard", "{file}: natguard is a chained plugin");
    }
}

#[test]
fn natguard_entries_parse_with_the_plugin_parser() {
    for (file, version) in EXAMPLES {
        let list = load(file);
        let entry = list["plugins"]
            .as_array()
            .and_then(|p| p.last())
            .cloned()
            .expect("natguard entry");
        // What libcni hands the plugin on ADD.
        let mut conf = entry.clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = json!(version);
        conf["prevResult"] = prev_result(version);
        let bytes = serde_json::to_vec(&conf).unwrap();
        let parsed = parse_netconf(&bytes)
            .unwrap_or_else(|e| panic!("{file}: natguard rejects its entry: {e}\n{conf:#}"));

        assert_eq!(parsed.name, list["name"].as_str().unwrap(), "{file}: name");
        assert_eq!(parsed.plugin_type, "natguard", "{file}: type");
        assert_eq!(parsed.cni_version.as_str(), version, "{file}: cniVersion");
        assert!(parsed.prev_result.is_some(), "{file}: prevResult kept");

        let ng = &parsed.natguard;
        let mode = entry["metadata"]["mode"].as_str().unwrap_or("proxy");
        assert_eq!(ng.metadata.mode.as_str(), mode, "{file}: metadata.mode");
        if let Some(port) = entry["metadata"]["proxyPort"].as_u64() {
            assert_eq!(u64::from(ng.metadata.proxy_port), port, "{file}: proxyPort");
        }
        let exempt: Vec<String> = entry["metadata"]["exemptNamespaces"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        assert_eq!(
            ng.metadata.exempt_namespaces, exempt,
            "{file}: exemptNamespaces"
        );
        let enabled = entry["masquerade"]["enabled"].as_bool().unwrap_or(true);
        assert_eq!(ng.masquerade.enabled, enabled, "{file}: masquerade.enabled");
        if let Some(cidrs) = entry["masquerade"]["nonMasqueradeCIDRs"].as_array() {
            let got: Vec<String> = ng
                .masquerade
                .non_masquerade_cidrs
                .iter()
                .map(|c| c.to_string())
                .collect();
            let want: Vec<String> = cidrs
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect();
            assert_eq!(got, want, "{file}: nonMasqueradeCIDRs");
        }
        if mode == "proxy" {
            assert_eq!(ng.metadata.mode, MetadataMode::Proxy);
        }
    }
}

/// The entry must also be accepted without a prevResult (DEL of a 0.3.x list) and, for 1.1.0
/// lists, on GC with `cni.dev/valid-attachments`.
#[test]
fn natguard_entries_parse_for_del_and_gc() {
    for (file, version) in EXAMPLES {
        let list = load(file);
        let mut conf = list["plugins"].as_array().unwrap().last().cloned().unwrap();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = json!(version);
        parse_netconf(&serde_json::to_vec(&conf).unwrap())
            .unwrap_or_else(|e| panic!("{file}: entry without prevResult rejected: {e}"));

        conf["cniVersion"] = json!("1.1.0");
        conf["cni.dev/valid-attachments"] = json!([{ "containerID": "abc", "ifname": "eth0" }]);
        let parsed = parse_netconf(&serde_json::to_vec(&conf).unwrap())
            .unwrap_or_else(|e| panic!("{file}: entry as GC config rejected: {e}"));
        let valid = parsed.valid_attachments.expect("valid attachments kept");
        assert_eq!(valid.len(), 1);
        assert_eq!(valid[0].container_id, "abc");
        assert_eq!(valid[0].ifname, "eth0");
    }
}
