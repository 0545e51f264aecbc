//! The DaemonSet operators apply (deploy/base, rendered into scripts/daemonset.yaml), parsed:
//! the fields that make natguard's installer work on real nodes with no more privilege than it
//! needs, its ConfigMap, and its probe against a real watcher.
//!
//! scripts/daemonset.yaml is `kubectl kustomize deploy/base` as it is; scripts/test.sh checks
//! that the two agree and validates every overlay against the Kubernetes API schemas, since
//! kubectl is installed there and not for `cargo test`. Here the rendered file is read with
//! PyYAML (`yaml.safe_load_all`, Debian's python3-yaml), an independent YAML 1.1 parser, and
//! checked as the JSON it turns into.
//!
//! The probes run as the kubelet runs them, against a real watcher in a world's node namespace
//! (root, never skipped): they pass while the node is guarded, fail when natguard's table is
//! deleted with the watcher frozen (SIGSTOP) and when the frozen watcher's heartbeat is old,
//! and pass again once the watcher is let go (SIGCONT) and has repaired.

mod common;

use common::run::{Access, Natguard};
use common::watcher::Watcher;
use common::World;
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
    // The probes: ready while guarded as the mounted config says (the same file as the
    // watcher's); alive while guarded and the watcher's heartbeat is fresh, without --config
    // so that a config the watcher refuses makes the pod unready, not restarted.
    assert_eq!(
        c["readinessProbe"]["exec"]["command"],
        json!([
            "/natguard",
            "install",
            "--check",
            "--health",
            "--config",
            CONFIG_PATH
        ])
    );
    assert_eq!(
        c["livenessProbe"]["exec"]["command"],
        json!(["/natguard", "install", "--check", "--health"])
    );
    // A flush is repaired in milliseconds: only a watcher that stays broken for minutes is
    // restarted.
    let live = &c["livenessProbe"];
    let patience =
        live["periodSeconds"].as_u64().unwrap() * live["failureThreshold"].as_u64().unwrap();
    assert!(patience >= 120, "{live}");
    // Requests, a memory limit, no CPU limit (a repair must not wait for CFS quota).
    assert!(c["resources"]["requests"]["cpu"].is_string(), "{c}");
    assert!(c["resources"]["limits"]["memory"].is_string(), "{c}");
    assert!(c["resources"]["limits"].get("cpu").is_none(), "{c}");

    // The host dirs: the CNI bin and netconf dirs, the CNI cache read-only, natguard's run dir,
    // the pods' network namespaces read-only and with the host's new mounts propagated; and
    // the ConfigMap, read-only.
    let volumes = pod["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().unwrap() {
        let netns = m["mountPath"].as_str().unwrap().ends_with("/netns");
        assert_eq!(
            m.get("mountPropagation").and_then(Value::as_str),
            netns.then_some("HostToContainer"),
            "{m}"
        );
    }
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
        ("/run/netns", "host-run-netns", true),
        ("/var/lib/cni", "cni-state", true),
        ("/var/run/netns", "host-var-run-netns", true),
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
    // The entry and dirs part: without --health, which the test below covers (this watcher
    // runs without kernel state).
    let probe: Vec<String> = probe_command("readinessProbe")
        .into_iter()
        .filter(|a| a != "--health")
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

/// A probe's command as the rendered DaemonSet gives it.
fn probe_command(probe: &str) -> Vec<String> {
    let ds = object("DaemonSet");
    ds["spec"]["template"]["spec"]["containers"][0][probe]["exec"]["command"]
        .as_array()
        .unwrap_or_else(|| panic!("no {probe}"))
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The readiness and liveness probes, run as the kubelet would (their commands from the rendered
/// DaemonSet, with the watcher's `/run/natguard` and the test's config file in place of the
/// ConfigMap's), say whether the node is guarded: they pass over a guarded node, fail once
/// natguard's table is deleted while the watcher is frozen, fail when a frozen watcher's
/// heartbeat is old even with the guard in place, and pass again after SIGCONT, once the
/// watcher has repaired. `status` exits 1 while the node is unguarded, and `natguard_guarded`
/// says 0, while `natguard_up` stays 1 (the kernel answers).
#[test]
fn the_probes_fail_while_the_node_is_unguarded_and_recover() {
    let w = World::new("dsprobe");
    let chain = w.chain(w.list("probe", "1.0.0", 0, Some(w.natguard(json!({})))));
    let _pod = w.add_pod(&chain, "web", "default");
    let entry = chain.list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "natguard")
        .unwrap()
        .clone();
    std::fs::create_dir_all(w.dir().join("net.d")).unwrap();
    std::fs::write(
        w.dir().join("net.d/10-probe.conflist"),
        serde_json::to_vec_pretty(&chain.list).unwrap(),
    )
    .unwrap();
    let watcher = Watcher::spawn(
        &w,
        &entry,
        &w.cache_dir().join("results"),
        &[],
        "watcher.log",
    );
    let entry_file = w.dir().join("natguard-entry.json");
    let deadline = std::time::Duration::from_secs(20);
    let run = |args: &[String]| {
        Natguard::new()
            .args(args)
            .bind_mount(&watcher.run_dir, "/run/natguard", Access::ReadWrite)
            .run_in(&w.node)
    };
    let probe = |which: &str| {
        let args: Vec<String> = probe_command(which)[1..]
            .iter()
            .map(|a| {
                if a == CONFIG_PATH {
                    entry_file.display().to_string()
                } else {
                    a.clone()
                }
            })
            .collect();
        run(&args)
    };
    let both_pass = || {
        ["readinessProbe", "livenessProbe"]
            .iter()
            .all(|p| probe(p).exit == Some(0))
    };
    watcher.wait_for(
        "the probes to pass over the guarded node",
        deadline,
        both_pass,
    );
    let ready = probe("readinessProbe");
    println!("probe over the guarded node: {}", ready.stdout.trim());
    assert!(ready.stdout.contains("guarding"), "{ready}");
    let status = run(&["status".to_string()]);
    assert_eq!(status.exit, Some(0), "{status}");

    // Frozen: its heartbeat stops. The record rewritten as it would stand a minute and a half
    // later (the watcher cannot write it while stopped): the guard is intact, the probes fail.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(watcher.pid() as i32, libc::SIGSTOP) };
    let record_path = watcher.run_dir.join("repair.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    record["updated"] = json!(now - 90.0);
    std::fs::write(&record_path, record.to_string()).unwrap();
    for which in ["readinessProbe", "livenessProbe"] {
        let out = probe(which);
        println!(
            "{which} with the watcher frozen: exit {:?}: {}",
            out.exit,
            out.stdout.trim()
        );
        assert_eq!(out.exit, Some(1), "{out}");
        assert!(out.stdout.contains("frozen or wedged"), "{out}");
    }
    let status = run(&["status".to_string()]);
    assert!(status.stdout.contains("is NOT RESPONDING"), "{status}");

    // And the table deleted: nothing repairs it.
    w.node.run(&["nft", "delete", "table", "inet", "natguard"]);
    for which in ["readinessProbe", "livenessProbe"] {
        let out = probe(which);
        println!(
            "{which} with the table deleted: exit {:?}: {}",
            out.exit,
            out.stdout.trim()
        );
        assert_eq!(out.exit, Some(1), "{out}");
        assert!(
            out.stdout.contains("NOT GUARDING: no natguard table"),
            "{out}"
        );
    }
    let status = run(&["status".to_string()]);
    assert_eq!(status.exit, Some(1), "{status}");
    assert!(
        status.stdout.starts_with("natguard: not installed"),
        "{status}"
    );
    let metrics = run(&["metrics".to_string()]).stdout;
    assert!(
        metrics.lines().any(|l| l == "natguard_guarded 0"),
        "{metrics}"
    );
    assert!(metrics.lines().any(|l| l == "natguard_up 1"), "{metrics}");

    // Let go: it repairs what it was told of and beats again.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(watcher.pid() as i32, libc::SIGCONT) };
    watcher.wait_for("the probes to pass after SIGCONT", deadline, both_pass);
    for which in ["readinessProbe", "livenessProbe"] {
        let out = probe(which);
        println!(
            "{which} after SIGCONT and the repair: exit {:?}: {}",
            out.exit,
            out.stdout.trim()
        );
    }
    let status = run(&["status".to_string()]);
    assert_eq!(status.exit, Some(0), "{status}");
}
