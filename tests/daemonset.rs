//! scripts/daemonset.yaml, parsed: the fields that make natguard's installer work on real nodes
//! with no more privilege than it needs.
//!
//! The file is read with PyYAML (`yaml.safe_load`, Debian's python3-yaml), an independent YAML
//! 1.1 parser, and checked as the JSON it turns into.

use serde_json::{json, Value};
use std::process::Command;

const DAEMONSET: &str = include_str!("../scripts/daemonset.yaml");

/// `doc` as PyYAML reads it (one document), as JSON.
fn parse(doc: &str) -> Value {
    use std::io::Write as _;
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))",
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
        .write_all(doc.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "PyYAML rejects the document: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("PyYAML's JSON")
}

#[test]
fn the_yaml_parser_reads_what_it_is_given() {
    let v = parse(
        "a: 1\nb:\n  - x\n  - k: \"v # not a comment\"\n    n: true # comment\nc: [\"p\", q]\n",
    );
    assert_eq!(
        v,
        json!({"a": 1, "b": ["x", {"k": "v # not a comment", "n": true}], "c": ["p", "q"]})
    );
}

#[test]
fn the_daemonset_runs_the_installer_with_what_it_needs_and_no_more() {
    let ds = parse(DAEMONSET);
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(pod["automountServiceAccountToken"], false);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(
        c["image"],
        format!("natguard:{}", env!("CARGO_PKG_VERSION"))
    );
    // The image's entrypoint runs alone: `install --watch`, natguard's default entry.
    assert!(c.get("args").is_none() && c.get("command").is_none(), "{c}");

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
    assert_eq!(
        c["readinessProbe"]["exec"]["command"],
        json!(["/natguard", "install", "--check"])
    );

    // The host dirs: the CNI bin and netconf dirs, the CNI cache read-only, natguard's run dir.
    let mut mounts: Vec<(String, String, bool)> = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        let host = vol["hostPath"]["path"].as_str().unwrap();
        assert_eq!(
            m["mountPath"], host,
            "{name} is mounted elsewhere than on the host"
        );
        mounts.push((host.to_string(), name.to_string(), m["readOnly"] == true));
    }
    mounts.sort();
    let want = [
        ("/etc/cni/net.d", "cni-netconf", false),
        ("/opt/cni/bin", "cni-bin", false),
        ("/run/natguard", "run-natguard", false),
        ("/var/lib/cni", "cni-state", true),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(h, n, ro)| (h.to_string(), n.to_string(), *ro))
        .collect();
    assert_eq!(mounts, want);
}

#[test]
fn cleanup_on_exit_is_a_commented_opt_in_the_binary_knows() {
    let line = DAEMONSET
        .lines()
        .find(|l| l.contains("--cleanup-on-exit"))
        .expect("the DaemonSet mentions --cleanup-on-exit");
    assert_eq!(line.trim(), r#"# args: ["--cleanup-on-exit"]"#);
    let out = Command::new(env!("CARGO_BIN_EXE_natguard"))
        .args(["install", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--cleanup-on-exit"));
}

/// The readiness probe does not see the container's args: run as written in the DaemonSet, it
/// checks the directories the watcher runs with (recorded beside the ready file), so a custom
/// `--cni-bin-dir` in the args does not leave the pod unready.
#[test]
fn the_probe_checks_the_dirs_the_watcher_runs_with() {
    let ds = parse(DAEMONSET);
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
    let (bin, netd, ready) = (
        dir.join("home-kubernetes-bin"),
        dir.join("net.d"),
        dir.join("run/ready"),
    );
    std::fs::create_dir_all(&netd).unwrap();
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
    // The probe's own arguments, with the test's ready file in place of /run/natguard/ready.
    let out = Command::new(env!("CARGO_BIN_EXE_natguard"))
        .args(&probe[1..])
        .arg("--ready-file")
        .arg(&ready)
        .output()
        .unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(watcher.id() as i32, libc::SIGTERM);
    }
    let _ = watcher.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ready: natguard is in"));
}
