//! The DaemonSet operators apply (deploy/base, rendered into scripts/daemonset.yaml), parsed:
//! the fields that make natguard's installer work on real nodes with no more privilege than it
//! needs, its ConfigMap, and its probe against a real watcher.
//!
//! scripts/daemonset.yaml is `kubectl kustomize deploy/base` as it is; scripts/test.sh checks
//! that the two agree and validates every overlay against the Kubernetes API schemas, since
//! kubectl is installed there and not for `cargo test`. Here the rendered file is read with
//! PyYAML (`yaml.safe_load_all`, Debian's python3-yaml), an independent YAML 1.1 parser, and
//! checked as the JSON it turns into.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const RENDERED: &str = include_str!("../scripts/daemonset.yaml");
const BASE_DAEMONSET: &str = include_str!("../deploy/base/daemonset.yaml");
const CONFIG: &str = include_str!("../deploy/base/natguard.json");
const README: &str = include_str!("../README.md");
/// Where the DaemonSet mounts the ConfigMap's entry.
const CONFIG_PATH: &str = "/etc/natguard/natguard.json";

/// Every document of `text` as PyYAML reads it, as JSON.
fn parse_all(text: &str) -> Vec<Value> {
    use std::io::Write as _;
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run /usr/bin/python3 (python3-yaml)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "PyYAML rejects the document: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("PyYAML's JSON")
}

/// The rendered object of this kind.
fn object(kind: &str) -> Value {
    let docs = parse_all(RENDERED);
    let mut found = docs.into_iter().filter(|d| d["kind"] == kind);
    let o = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "more than one {kind}");
    o
}

#[test]
fn the_yaml_parser_reads_what_it_is_given() {
    let v = parse_all(
        "a: 1\nb:\n  - x\n  - k: \"v # not a comment\"\n    n: true # comment\nc: [\"p\", q]\n---\nd: 2\n",
    );
    assert_eq!(
        Value::from(v),
        json!([{"a": 1, "b": ["x", {"k": "v # not a comment", "n": true}], "c": ["p", "q"]}, {"d": 2}])
    );
}

#[test]
fn the_daemonset_runs_the_installer_with_what_it_needs_and_no_more() {
    let kinds: Vec<Value> = parse_all(RENDERED)
        .iter()
        .map(|d| d["kind"].clone())
        .collect();
    assert_eq!(
        kinds,
        json!(["ConfigMap", "DaemonSet"])
            .as_array()
            .unwrap()
            .clone()
    );
    let ds = object("DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    // What the image runs on: a static linux/amd64 binary.
    assert_eq!(
        pod["nodeSelector"],
        json!({"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"})
    );
    // Every taint, not-ready and CNI-less nodes included (the comment says why).
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(pod["automountServiceAccountToken"], false);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(
        c["image"],
        format!("natguard:{}", env!("CARGO_PKG_VERSION"))
    );
    // The image's entrypoint (`install --watch`) with the ConfigMap's entry.
    assert!(c.get("command").is_none(), "{c}");
    assert_eq!(c["args"], json!(["--config", CONFIG_PATH]));

    let sc = &c["securityContext"];
    assert_eq!(
        sc,
        &json!({
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false,
            "privileged": false, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
            // What CNI installers run as on SELinux-enforcing nodes, to write the host's CNI dirs.
            "seLinuxOptions": {"type": "spc_t"},
        })
    );
    // The probe reads the same file as the watcher.
    assert_eq!(
        c["readinessProbe"]["exec"]["command"],
        json!(["/natguard", "install", "--check", "--config", CONFIG_PATH])
    );

    // The host dirs: the CNI bin and netconf dirs, the CNI cache read-only, natguard's run dir;
    // and the ConfigMap, read-only.
    let volumes = pod["volumes"].as_array().unwrap();
    let mut mounts: Vec<(String, String, bool)> = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let vol = volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        let source = if let Some(host) = vol["hostPath"]["path"].as_str() {
            assert_eq!(
                m["mountPath"], host,
                "{name} is mounted elsewhere than on the host"
            );
            host.to_string()
        } else {
            let cm = vol["configMap"]["name"]
                .as_str()
                .expect("a hostPath or a configMap");
            assert_eq!(m["mountPath"], "/etc/natguard");
            format!("configMap {cm}")
        };
        mounts.push((source, name.to_string(), m["readOnly"] == true));
    }
    mounts.sort();
    let want = [
        ("/etc/cni/net.d", "cni-netconf", false),
        ("/opt/cni/bin", "cni-bin", false),
        ("/run/natguard", "run-natguard", false),
        ("/var/lib/cni", "cni-state", true),
        ("configMap natguard-config", "config", true),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(h, n, ro)| (h.to_string(), n.to_string(), *ro))
        .collect();
    assert_eq!(mounts, want);
}

/// The ConfigMap holds deploy/base/natguard.json: natguard's entry with every field at its
/// default, the same as the README's Configuration section shows, and the plugin's parser
/// takes it.
#[test]
fn the_configmap_is_the_full_default_entry() {
    let cm = object("ConfigMap");
    assert_eq!(cm["metadata"]["name"], "natguard-config");
    assert_eq!(cm["metadata"]["namespace"], "kube-system");
    assert_eq!(cm["data"]["natguard.json"], CONFIG);
    let entry: Value = serde_json::from_str(CONFIG).unwrap();
    let parsed = natguard::config::parse_plugin_config(&entry).unwrap();
    assert_eq!(parsed, natguard::config::Config::default());
    // The README's block is the same entry.
    let block = README
        .split("## Configuration")
        .nth(1)
        .and_then(|s| s.split("```json\n").nth(1))
        .and_then(|s| s.split("\n```").next())
        .expect("the README's configuration block");
    let readme: Value = serde_json::from_str(block).unwrap();
    assert_eq!(
        readme, entry,
        "README.md's Configuration block and natguard.json differ"
    );
    // Every field the README's table documents is in it ("`metadata.proxyIPv4`, `proxyIPv6`"
    // names two fields of one section), but for those the table says are absent by default
    // (`metadata.preset` and `metadata.endpoints`, the alternatives to `addresses`/`ports`).
    let table = README.split("## Configuration").nth(1).unwrap();
    let table = table.split("\n## ").next().unwrap();
    for row in table
        .lines()
        .filter(|l| l.starts_with("| `") && !l.contains("| Absent by default"))
    {
        let mut section = None;
        for field in row.split('|').nth(1).unwrap().split(',') {
            let field = field.trim().trim_matches('`');
            let key = match field.split_once('.') {
                Some((s, k)) => {
                    section = Some(s);
                    k
                }
                None => field,
            };
            let holder = match section {
                Some(s) => &entry[s],
                None => &entry,
            };
            assert!(
                holder.get(key).is_some(),
                "{field} is documented but not in natguard.json"
            );
        }
    }
}

#[test]
fn cleanup_on_exit_is_a_documented_opt_in_the_binary_knows() {
    assert!(BASE_DAEMONSET.contains("\"--cleanup-on-exit\""));
    let out = Command::new(env!("CARGO_BIN_EXE_natguard"))
        .args(["install", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--cleanup-on-exit"));
}

/// The readiness probe does not see the container's args: run as written in the DaemonSet, it
/// checks the directories the watcher runs with (recorded beside the ready file), so a custom
/// `--cni-bin-dir` in the args does not leave the pod unready; and the entry the ConfigMap
/// gives, so a pod is ready once its watcher has applied it.
#[test]
fn the_probe_checks_the_dirs_and_the_config_the_watcher_runs_with() {
    let ds = object("DaemonSet");
    let probe: Vec<String> = ds["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        ["exec"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(probe[0], "/natguard");
    let dir = std::env::temp_dir().join(format!("ng-ds-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (bin, netd, ready, cfg) = (
        dir.join("home-kubernetes-bin"),
        dir.join("net.d"),
        dir.join("run/ready"),
        dir.join("etc-natguard/natguard.json"),
    );
    std::fs::create_dir_all(&netd).unwrap();
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(&cfg, CONFIG).unwrap();
    std::fs::write(
        netd.join("10-net.conflist"),
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    let mut watcher = Command::new(env!("CARGO_BIN_EXE_natguard"))
        .args(["install", "--watch", "--no-adopt", "--create-dirs"])
        .arg("--cni-bin-dir")
        .arg(&bin)
        .arg("--netconf-dir")
        .arg(&netd)
        .arg("--ready-file")
        .arg(&ready)
        .arg("--config")
        .arg(&cfg)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no ready file"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The probe's own arguments, with the test's files in place of /run/natguard/ready and
    // /etc/natguard/natguard.json.
    let probe_args: Vec<String> = probe[1..]
        .iter()
        .map(|a| {
            if a == CONFIG_PATH {
                cfg.display().to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    let run_probe = || {
        Command::new(env!("CARGO_BIN_EXE_natguard"))
            .args(&probe_args)
            .arg("--ready-file")
            .arg(&ready)
            .output()
            .unwrap()
    };
    let out = run_probe();
    // A config the watcher has not applied (it is stopped) is not ready.
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(watcher.id() as i32, libc::SIGTERM);
    }
    let _ = watcher.wait();
    std::fs::write(&cfg, r#"{"metadata":{"mode":"deny"}}"#).unwrap();
    let stale = run_probe();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ready: natguard is in"));
    assert_eq!(stale.status.code(), Some(1), "{stale:?}");
    assert!(
        String::from_utf8_lossy(&stale.stdout).contains("is not the one"),
        "{stale:?}"
    );
}

/// The overlays exist where the docs say, each a kustomization over the base.
#[test]
fn the_overlays_build_on_the_base() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for overlay in ["metrics", "uninstall"] {
        let k = std::fs::read_to_string(
            root.join(format!("deploy/overlays/{overlay}/kustomization.yaml")),
        )
        .unwrap();
        let k = &parse_all(&k)[0];
        assert_eq!(k["kind"], "Kustomization");
        assert_eq!(k["resources"], json!(["../../base"]), "{overlay}");
    }
}
