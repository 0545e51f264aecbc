//! `natguard install` / `natguard uninstall` on temporary directories, through the real binary.
//! No root needed: every directory (netconf, bin, readiness file) is a temp dir given by flag.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_natguard");

struct Node {
    dir: PathBuf,
}

impl Node {
    fn new(tag: &str) -> Node {
        let dir = std::env::temp_dir().join(format!("ng-install-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("net.d")).unwrap();
        fs::create_dir_all(dir.join("bin")).unwrap();
        Node { dir }
    }
    fn netd(&self) -> PathBuf {
        self.dir.join("net.d")
    }
    fn conf(&self, name: &str) -> PathBuf {
        self.netd().join(name)
    }
    fn bin(&self) -> PathBuf {
        self.dir.join("bin")
    }
    fn ready(&self) -> PathBuf {
        self.dir.join("run/ready")
    }
    fn write(&self, name: &str, text: &str) {
        fs::write(self.conf(name), text).unwrap();
    }
    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.conf(name)).unwrap()
    }
    fn base_args(&self) -> Vec<String> {
        vec![
            "--netconf-dir".into(),
            self.netd().display().to_string(),
            "--cni-bin-dir".into(),
            self.bin().display().to_string(),
            "--ready-file".into(),
            self.ready().display().to_string(),
        ]
    }
    fn cmd(&self, sub: &str, extra: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg(sub).args(self.base_args());
        // Never the kernel: these tests may run as root, in the root network namespace.
        match sub {
            "install" => c.arg("--no-adopt"),
            _ => c.arg("--keep-kernel-state"),
        };
        c.args(extra);
        c
    }
    fn run(&self, sub: &str, extra: &[&str]) -> Output {
        self.cmd(sub, extra).output().unwrap()
    }
    fn install(&self, extra: &[&str]) -> Output {
        let out = self.run("install", extra);
        assert!(out.status.success(), "install failed: {}", text(&out));
        out
    }
    /// Every file of the netconf dir with its bytes, for "nothing else changed" checks.
    fn snapshot(&self) -> BTreeMap<String, (Vec<u8>, u64)> {
        let mut m = BTreeMap::new();
        for e in fs::read_dir(self.netd()).unwrap() {
            let e = e.unwrap();
            let meta = fs::symlink_metadata(e.path()).unwrap();
            let bytes = if meta.file_type().is_symlink() {
                fs::read_link(e.path())
                    .unwrap()
                    .display()
                    .to_string()
                    .into_bytes()
            } else {
                fs::read(e.path()).unwrap_or_default()
            };
            m.insert(e.file_name().to_string_lossy().into(), (bytes, meta.ino()));
        }
        m
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn parse(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

/// Waits (bounded) until `cond` holds; the bound only stops a broken build from hanging.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gave up waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// A Calico-style list: 4-space indent, cniVersion 0.3.1, numbers and escapes that a
// re-serialization would change, and keys in no particular order.
const CALICO: &str = r#"{
    "name": "k8s-pod-network",
    "cniVersion": "0.3.1",
    "disableCheck": true,
    "plugins": [
        {
            "type": "calico",
            "log_level": "info",
            "mtu": 1.44e3,
            "nodename_file_optional": false,
            "note": "caf\u00e9 ]}",
            "ipam": {"type": "calico-ipam"},
            "policy": {
                "type": "k8s"
            }
        },
        {
            "type": "portmap",
            "snat": true,
            "capabilities": {"portMappings": true}
        }
    ],
    "zzz": [1, 2.50, -0.0]
}
"#;

#[test]
fn insert_appends_after_the_chain_and_keeps_every_other_byte() {
    let n = Node::new("insert");
    n.write("10-calico.conflist", CALICO);
    n.install(&[]);
    let after = n.read("10-calico.conflist");
    // Everything up to the end of the last plugin and everything after it is unchanged.
    let cut = CALICO.find("\n    ],").unwrap();
    assert!(after.starts_with(&CALICO[..cut]), "{after}");
    assert!(after.ends_with(&CALICO[cut..]), "{after}");
    assert_eq!(
        &after[cut..after.len() - (CALICO.len() - cut)],
        ",\n        {\n            \"type\": \"natguard\",\n            \"capabilities\": {\n                \"io.kubernetes.cri.pod-annotations\": true\n            }\n        }"
    );
    let v = parse(&after);
    assert_eq!(
        keys(&v),
        ["name", "cniVersion", "disableCheck", "plugins", "zzz"]
    );
    assert_eq!(v["cniVersion"], "0.3.1");
    let types: Vec<_> = v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["calico", "portmap", "natguard"]);
    assert_eq!(
        v["plugins"][2],
        json!({"type": "natguard", "capabilities": {"io.kubernetes.cri.pod-annotations": true}})
    );

    // The binary is in the bin dir, executable, byte for byte the running one.
    let installed = n.bin().join("natguard");
    assert_eq!(fs::read(&installed).unwrap(), fs::read(BIN).unwrap());
    assert_eq!(
        fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // The readiness file names the list; no temporary file is left behind.
    assert_eq!(
        fs::read_to_string(n.ready()).unwrap().trim(),
        n.conf("10-calico.conflist").display().to_string()
    );
    let names: Vec<_> = n.snapshot().into_keys().collect();
    assert_eq!(names, ["10-calico.conflist"]);
    assert_eq!(fs::read_dir(n.bin()).unwrap().count(), 1);
}

#[test]
fn a_second_run_writes_nothing() {
    let n = Node::new("idem");
    n.write("10-calico.conflist", CALICO);
    n.install(&["--mode", "deny"]);
    let list = n.snapshot();
    let bin_ino = fs::metadata(n.bin().join("natguard")).unwrap().ino();
    let ready_ino = fs::metadata(n.ready()).unwrap().ino();
    let out = n.install(&["--mode", "deny"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already in"),
        "{}",
        text(&out)
    );
    assert_eq!(n.snapshot(), list, "the list was rewritten");
    assert_eq!(
        fs::metadata(n.bin().join("natguard")).unwrap().ino(),
        bin_ino
    );
    assert_eq!(fs::metadata(n.ready()).unwrap().ino(), ready_ino);
}

#[test]
fn config_from_flags_and_file_replaces_only_natguards_entry() {
    let n = Node::new("config");
    n.write("10-calico.conflist", CALICO);
    n.install(&[
        "--mode",
        "proxy",
        "--proxy-port",
        "9181",
        "--proxy-ipv4",
        "10.0.0.1",
        "--proxy-ipv6=auto",
        "--exempt-namespace",
        "kube-system",
        "--exempt-namespace",
        "creds",
        "--non-masquerade-cidr",
        "10.0.0.0/8",
        "--non-masquerade-cidr",
        "fd00::/8",
    ]);
    let v = parse(&n.read("10-calico.conflist"));
    assert_eq!(
        v["plugins"][2],
        json!({"type": "natguard", "capabilities": {"io.kubernetes.cri.pod-annotations": true}, "metadata": {"mode": "proxy", "proxyPort": 9181,
            "proxyIPv4": "10.0.0.1", "proxyIPv6": "auto", "exemptNamespaces": ["kube-system", "creds"]},
            "masquerade": {"nonMasqueradeCIDRs": ["10.0.0.0/8", "fd00::/8"]}})
    );

    // A config file; flags override its fields; "type" may be left out.
    let cfg = n.dir.join("natguard.json");
    fs::write(
        &cfg,
        r#"{"metadata": {"mode": "proxy", "ports": [80, 8080]}, "logFile": "/var/log/natguard.log"}"#,
    )
    .unwrap();
    n.install(&[
        "--config",
        cfg.to_str().unwrap(),
        "--mode",
        "deny",
        "--no-masquerade",
    ]);
    let after = n.read("10-calico.conflist");
    let v = parse(&after);
    let entry = &v["plugins"][2];
    assert_eq!(
        entry,
        &json!({"type": "natguard", "capabilities": {"io.kubernetes.cri.pod-annotations": true},
            "metadata": {"mode": "deny", "ports": [80, 8080]},
            "logFile": "/var/log/natguard.log", "masquerade": {"enabled": false}})
    );
    assert_eq!(
        keys(entry),
        ["type", "capabilities", "metadata", "logFile", "masquerade"]
    );
    let cut = CALICO.find("\n    ],").unwrap();
    assert!(after.starts_with(&CALICO[..cut]) && after.ends_with(&CALICO[cut..]));
    assert_eq!(v["plugins"].as_array().unwrap().len(), 3);

    // Back to the defaults: the entry is replaced in place, nothing else moves.
    n.install(&[]);
    let v = parse(&n.read("10-calico.conflist"));
    assert_eq!(
        v["plugins"][2],
        json!({"type": "natguard", "capabilities": {"io.kubernetes.cri.pod-annotations": true}})
    );
    assert_eq!(v["plugins"].as_array().unwrap().len(), 3);
}

#[test]
fn the_first_config_by_name_is_the_active_one() {
    let n = Node::new("active");
    let bridge = |name: &str| {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge","bridge":"{name}"}}]}}"#
        )
    };
    n.write("20-b.conflist", &bridge("b"));
    n.write("10-a.conflist", &bridge("a"));
    n.write("05-notes.txt", "not a config");
    n.write("00-a.conflist.bak", "{");
    fs::create_dir(n.conf("01-dir.conflist")).unwrap();
    n.install(&[]);
    let a = parse(&n.read("10-a.conflist"));
    assert_eq!(a["plugins"][1]["type"], "natguard");
    // Compact lists stay compact.
    assert_eq!(
        n.read("10-a.conflist"),
        r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge","bridge":"a"},{"type":"natguard","capabilities":{"io.kubernetes.cri.pod-annotations":true}}]}"#
    );
    assert_eq!(n.read("20-b.conflist"), bridge("b"));

    // --conflist forces another file (a name in the netconf dir, or a path).
    n.install(&["--conflist", "20-b.conflist"]);
    assert_eq!(
        parse(&n.read("20-b.conflist"))["plugins"][1]["type"],
        "natguard"
    );
}

#[test]
fn a_lone_conf_becomes_a_list() {
    for ext in ["conf", "json"] {
        let n = Node::new(&format!("conv-{ext}"));
        let conf = r#"{
  "cniVersion": "0.4.0",
  "name": "mynet",
  "type": "bridge",
  "bridge": "cni0",
  "isGateway": true,
  "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}
}"#;
        n.write(&format!("10-mynet.{ext}"), conf);
        n.write("20-other.conflist", "{\"name\":\"x\"}");
        n.install(&["--mode", "deny"]);
        assert!(!n.conf(&format!("10-mynet.{ext}")).exists());
        let v = parse(&n.read("10-mynet.conflist"));
        // The config as it was, for uninstall to put back.
        assert_eq!(
            keys(&v),
            ["cniVersion", "name", "plugins", "natguard.io/convertedFrom"]
        );
        assert_eq!(v["natguard.io/convertedFrom"]["text"], conf);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["name"], "mynet");
        assert_eq!(
            v["plugins"][0],
            json!({"type": "bridge", "bridge": "cni0", "isGateway": true,
                "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}})
        );
        assert_eq!(
            keys(&v["plugins"][0]),
            ["type", "bridge", "isGateway", "ipam"]
        );
        assert_eq!(
            v["plugins"][1],
            json!({"type": "natguard", "capabilities": {"io.kubernetes.cri.pod-annotations": true}, "metadata": {"mode": "deny"}})
        );
        let snap = n.snapshot();
        n.install(&["--mode", "deny"]);
        assert_eq!(n.snapshot(), snap);

        // The agent writes its .conf again: the conversion is redone over natguard's own list.
        n.write(&format!("10-mynet.{ext}"), conf);
        n.install(&["--mode", "deny"]);
        assert!(!n.conf(&format!("10-mynet.{ext}")).exists());
        assert_eq!(
            parse(&n.read("10-mynet.conflist"))["plugins"][1]["type"],
            "natguard"
        );
    }
}

fn assert_refused(n: &Node, extra: &[&str], needle: &str) {
    let before = n.snapshot();
    let out = n.run("install", extra);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert_eq!(n.snapshot(), before, "a refused install changed the dir");
    assert!(!n.ready().exists());
}

/// A refused install removes nothing: the readiness file of an earlier install stays while
/// its entry does (here `--conflist` names a list that does not exist), and a `--cache-dir`
/// that does not exist is refused like the other dirs, before anything is written.
#[test]
fn a_refusal_removes_nothing_and_a_missing_cache_dir_is_refused() {
    let n = Node::new("refuse-keeps");
    n.write("10-calico.conflist", CALICO);
    n.install(&[]);
    assert!(n.ready().exists());
    let ready = fs::read(n.ready()).unwrap();
    let before = n.snapshot();
    let out = n.run("install", &["--conflist", "99-nope.conflist"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("99-nope.conflist"),
        "{}",
        text(&out)
    );
    assert_eq!(n.snapshot(), before, "a refused install changed the dir");
    assert_eq!(
        fs::read(n.ready()).ok(),
        Some(ready.clone()),
        "a refused install removed or changed the readiness file"
    );
    let missing = n.dir.join("cnii");
    let out = n.run("install", &["--cache-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cache-dir") && err.contains("cnii") && err.contains("no such directory"),
        "{err}"
    );
    assert!(!missing.exists());
    assert_eq!(n.snapshot(), before);
    assert_eq!(fs::read(n.ready()).ok(), Some(ready));
    // An existing one is taken, and libcni's own layout before the node's first pod made it.
    fs::create_dir_all(&missing).unwrap();
    n.install(&["--cache-dir", missing.to_str().unwrap()]);
    let fresh = n.dir.join("var-lib/cni/results");
    n.install(&["--cache-dir", fresh.to_str().unwrap()]);
    assert!(!fresh.exists(), "taken, not created");
}

/// A misspelling of one of natguard's own top-level keys (`"metdata"`) is refused before
/// anything is written (with it every default would apply); another unknown key is warned
/// about by `install` and `install --check`; an entry that does not set
/// `masquerade.masqueradeOutside` is told the default changed.
#[test]
fn unknown_top_level_keys_are_named_at_once() {
    let n = Node::new("entry-keys");
    n.write("10-calico.conflist", CALICO);
    let cfg = n.dir.join("natguard.json");
    fs::write(
        &cfg,
        r#"{"metdata":{"mode":"deny"},"masquerade":{"masqueradeOutside":false}}"#,
    )
    .unwrap();
    let before = n.snapshot();
    let out = n.run("install", &["--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"metdata\"") && err.contains("did you mean \"metadata\""),
        "{err}"
    );
    assert_eq!(n.snapshot(), before);
    assert!(!n.ready().exists());

    fs::write(
        &cfg,
        r#"{"frobnicate":1,"masquerade":{"masqueradeOutside":false}}"#,
    )
    .unwrap();
    for extra in [&[][..], &["--check"][..]] {
        let mut args = vec!["--config", cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = n.run("install", &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("\"frobnicate\": unknown top-level key"),
            "{extra:?}: {}",
            text(&out)
        );
        assert!(!err.contains("masqueradeOutside is not set"), "{err}");
    }
    fs::write(&cfg, r#"{"metadata":{"mode":"deny"}}"#).unwrap();
    let out = n.install(&["--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("masquerade.masqueradeOutside is not set"),
        "{err}"
    );
}

#[test]
fn unsafe_directories_are_refused_untouched() {
    let n = Node::new("refuse");
    assert_refused(&n, &[], "no network config");

    // An unparsable file that sorts first: containerd fails on it, kubelet skips it.
    n.write("05-broken.conflist", "{\"name\": \"x\", ");
    n.write("10-calico.conflist", CALICO);
    assert_refused(&n, &[], "05-broken.conflist is not valid JSON");
    fs::remove_file(n.conf("05-broken.conflist")).unwrap();

    // The active file is a symlink (e.g. into a ConfigMap mount).
    let outside = n.dir.join("outside.conflist");
    fs::write(&outside, CALICO).unwrap();
    std::os::unix::fs::symlink(&outside, n.conf("01-link.conflist")).unwrap();
    assert_refused(&n, &[], "is a symbolic link");
    assert_eq!(fs::read_to_string(&outside).unwrap(), CALICO);
    fs::remove_file(n.conf("01-link.conflist")).unwrap();

    let cases = [
        (
            r#"{"cniVersion":"0.2.0","name":"n","plugins":[{"type":"bridge"}]}"#,
            "cniVersion \"0.2.0\" is not one natguard supports",
        ),
        (
            r#"{"name":"n","plugins":[{"type":"bridge"}]}"#,
            "no \"cniVersion\"",
        ),
        (
            r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
            "no \"name\"",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#,
            "no primary plugin",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"natguard"}]}"#,
            "no primary plugin",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"natguard"},{"type":"natguard","x":1}]}"#,
            "natguard is listed 2 times",
        ),
        (r#"["not", "an", "object"]"#, "not a JSON object"),
    ];
    for (list, needle) in cases {
        n.write("01-case.conflist", list);
        assert_refused(&n, &[], needle);
    }
    fs::remove_file(n.conf("01-case.conflist")).unwrap();

    // A list in a .conf file: runtimes read it as one plugin config and fail.
    n.write(
        "01-list.conf",
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#,
    );
    assert_refused(&n, &[], "rename it to .conflist");
    fs::remove_file(n.conf("01-list.conf")).unwrap();

    // Converting would let another file sort first.
    n.write(
        "01-x.conf",
        r#"{"cniVersion":"1.0.0","name":"x","type":"bridge"}"#,
    );
    n.write(
        "01-x.conf-b.conf",
        r#"{"cniVersion":"1.0.0","name":"y","type":"bridge"}"#,
    );
    assert_refused(&n, &[], "would become the active network");
    fs::remove_file(n.conf("01-x.conf-b.conf")).unwrap();

    // Converting would overwrite a list natguard did not make.
    n.write(
        "01-x.conflist",
        r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"ptp"}]}"#,
    );
    assert_refused(&n, &[], "already exists");

    // Bad entries are usage errors, checked before anything is touched.
    for bad in [
        vec!["--mode", "allow"],
        vec!["--proxy-port", "0"],
        vec!["--proxy-ipv4", "fd00::1"],
        vec!["--non-masquerade-cidr", "10.0.0.0/40"],
        vec!["--frobnicate"],
    ] {
        let before = n.snapshot();
        let out = n.run("install", &bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out));
        assert_eq!(n.snapshot(), before);
        assert!(!n.bin().join("natguard").exists());
    }
    let cfg = n.dir.join("bad.json");
    for (body, needle) in [
        (r#"{"type":"bridge"}"#, "expected \"natguard\""),
        (r#"{"metadata":{"mode":"allow"}}"#, "metadata.mode"),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#,
            "plugin entry only",
        ),
        ("[1]", "expected a JSON object"),
        ("{", "not JSON"),
    ] {
        fs::write(&cfg, body).unwrap();
        let out = n.run("install", &["--config", cfg.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{needle}: {}",
            text(&out)
        );
    }
}

#[test]
fn uninstall_removes_only_natguard() {
    let n = Node::new("uninstall");
    n.write("10-calico.conflist", CALICO);
    let other = r#"{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"natguard"},{"type":"bridge"}, {"type":"natguard","metadata":{}}]}"#;
    n.write("20-other.conflist", other);
    n.write("30-plain.conflist", "{\"name\":\"plain\",\"plugins\":[]}");
    n.write("40-broken.conflist", "{");
    n.install(&["--mode", "deny"]);
    assert!(n.bin().join("natguard").exists() && n.ready().exists());
    let out = n.run("uninstall", &[]);
    assert!(out.status.success(), "{}", text(&out));
    // The spliced entry is cut out again: the list is byte for byte what it was.
    assert_eq!(n.read("10-calico.conflist"), CALICO);
    assert_eq!(
        n.read("20-other.conflist"),
        r#"{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"bridge"}]}"#
    );
    assert_eq!(
        n.read("30-plain.conflist"),
        "{\"name\":\"plain\",\"plugins\":[]}"
    );
    assert_eq!(n.read("40-broken.conflist"), "{");
    assert!(!n.bin().join("natguard").exists());
    assert!(!n.ready().exists());
    // Twice is fine.
    let out = n.run("uninstall", &[]);
    assert!(out.status.success(), "{}", text(&out));

    // A converted .conf is restored byte for byte, its list removed.
    let n = Node::new("uninstall-conv");
    let conf =
        "{ \"cniVersion\": \"0.3.1\",\n  \"name\":\"mynet\", \"type\":\"ptp\",\"ipMasq\":true}\n";
    n.write("10-mynet.conf", conf);
    n.install(&[]);
    assert!(!n.conf("10-mynet.conf").exists());
    assert!(n.conf("10-mynet.conflist").exists());
    assert!(n.run("uninstall", &[]).status.success());
    assert_eq!(n.read("10-mynet.conf"), conf);
    assert!(!n.conf("10-mynet.conflist").exists());
    // One whose list the agent changed since stays a list, without natguard and the record.
    let n = Node::new("uninstall-conv-changed");
    n.write("10-mynet.conf", conf);
    n.install(&[]);
    let mut list = parse(&n.read("10-mynet.conflist"));
    list["plugins"][0]["ipMasq"] = json!(false);
    n.write("10-mynet.conflist", &list.to_string());
    assert!(n.run("uninstall", &[]).status.success());
    assert!(!n.conf("10-mynet.conf").exists());
    assert_eq!(
        parse(&n.read("10-mynet.conflist")),
        json!({"cniVersion":"0.3.1","name":"mynet","plugins":[{"type":"ptp","ipMasq":false}]})
    );
}

#[test]
fn check_reports_whether_natguard_is_in_the_active_list() {
    let n = Node::new("check");
    n.write("10-calico.conflist", CALICO);
    let check = || n.run("install", &["--check"]);
    let out = check();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("not ready"));
    n.install(&[]);
    let out = check();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ready: natguard is in"));
    // --check only looks.
    let snap = n.snapshot();
    check();
    assert_eq!(n.snapshot(), snap);
    n.write("10-calico.conflist", CALICO);
    assert_eq!(check().status.code(), Some(1));
    n.install(&[]);
    fs::remove_file(n.bin().join("natguard")).unwrap();
    assert_eq!(check().status.code(), Some(1));
}

/// A `natguard install --watch` child whose stderr lines are collected.
struct Watcher {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The thread collecting stderr: it ends at EOF, once the watcher has exited.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    fn start(n: &Node, extra: &[&str]) -> Watcher {
        Watcher::spawn(n.cmd("install", &[&["--watch"], extra].concat()))
    }
    fn spawn(mut cmd: Command) -> Watcher {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let err = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        Watcher {
            child,
            lines,
            reader: Some(reader),
        }
    }
    fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
    fn stop(mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM)
    }
    /// Sends `sig` and waits (bounded) for the watcher to exit and its last lines to be read.
    fn signal(&mut self, sig: libc::c_int) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                if let Some(r) = self.reader.take() {
                    r.join().unwrap();
                }
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "watcher ignored signal {sig}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the readiness file exists and names `list`.
fn ready_names(n: &Node, list: &Path) -> bool {
    fs::read_to_string(n.ready()).is_ok_and(|t| t.trim() == list.display().to_string())
}

fn has_natguard(path: &Path) -> bool {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["plugins"].as_array().cloned())
        .is_some_and(|p| p.iter().any(|x| x["type"] == "natguard"))
}

#[test]
fn watch_keeps_natguard_in_the_active_list() {
    let n = Node::new("watch");
    let w = Watcher::start(&n, &[]);
    // No config yet (the primary plugin's agent has not written it): the watcher waits.
    wait_for("the watcher to report the empty dir", || {
        w.count("no network config") >= 1
    });
    assert!(!n.ready().exists());

    // The agent writes its list: natguard joins it.
    let list = n.conf("10-aws.conflist");
    n.write("10-aws.conflist", CALICO);
    wait_for("natguard in the new list", || has_natguard(&list));
    wait_for("the readiness file", || n.ready().exists());

    // The agent rewrites its list from the template, atomically (rename over it).
    let tmp = n.conf(".aws.tmp");
    fs::write(&tmp, CALICO).unwrap();
    fs::rename(&tmp, &list).unwrap();
    wait_for("natguard back after a rename", || has_natguard(&list));

    // ... and in place (truncate and write).
    fs::write(&list, CALICO).unwrap();
    wait_for("natguard back after an in-place write", || {
        has_natguard(&list)
    });
    wait_for("three writes logged", || {
        w.count("added natguard's entry") == 3
    });

    // Another agent puts a list in front (cni-exclusive renames the others away).
    fs::rename(&list, n.conf("10-aws.conflist.cilium_bak")).unwrap();
    let cilium = n.conf("05-cilium.conflist");
    n.write(
        "05-cilium.conflist",
        r#"{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni"}]}"#,
    );
    wait_for("natguard in the list that sorts first", || {
        has_natguard(&cilium)
    });
    // The watcher writes the list first and the readiness file after it: wait for both.
    wait_for(
        "the readiness file to name the list that sorts first",
        || ready_names(&n, &cilium),
    );

    // Its own writes do not wake it into writing again: an unrelated event gets one check,
    // which finds nothing to do, and the list keeps its inode.
    wait_for("four writes logged", || {
        w.count("added natguard's entry") == 4
    });
    let ino = fs::metadata(&cilium).unwrap().ino();
    let checks = w.count("nothing to write");
    n.write("99-unrelated.conflist", "{}");
    wait_for("the unrelated event checked", || {
        w.count("nothing to write") > checks
    });
    assert_eq!(w.count("added natguard's entry"), 4, "{}", w.log());
    assert_eq!(fs::metadata(&cilium).unwrap().ino(), ino);

    // The active list goes away and what remains cannot take natguard: not ready.
    fs::remove_file(&cilium).unwrap();
    fs::remove_file(n.conf("10-aws.conflist.cilium_bak")).unwrap();
    wait_for("the readiness file removed", || !n.ready().exists());
    fs::remove_file(n.conf("99-unrelated.conflist")).unwrap();

    let status = w.stop();
    assert!(status.success(), "watcher exit {status:?}");
}

/// A watcher on a Calico list, once natguard is in it and the readiness file names it.
fn watching_calico(n: &Node, extra: &[&str]) -> (Watcher, PathBuf) {
    n.write("10-calico.conflist", CALICO);
    let list = n.conf("10-calico.conflist");
    let w = Watcher::start(n, extra);
    wait_for("natguard in the list", || has_natguard(&list));
    // The readiness file is written after the signal handlers are in place.
    wait_for("the readiness file", || ready_names(n, &list));
    (w, list)
}

#[test]
fn cleanup_on_exit_takes_the_entry_out_on_sigterm_and_sigint() {
    for (sig, name) in [(libc::SIGTERM, "term"), (libc::SIGINT, "int")] {
        let n = Node::new(&format!("cleanup-{name}"));
        let (mut w, list) = watching_calico(&n, &["--cleanup-on-exit"]);
        let status = w.signal(sig);
        let log = w.log();
        assert!(status.success(), "signal {sig}: exit {status:?}\n{log}");
        // The entry is cut out again: the list is byte for byte the agent's, and nothing else
        // is left in the dir.
        assert_eq!(fs::read_to_string(&list).unwrap(), CALICO, "{log}");
        let names: Vec<_> = n.snapshot().into_keys().collect();
        assert_eq!(names, ["10-calico.conflist"]);
        assert!(!n.ready().exists(), "the readiness file outlived the entry");
        // The binary stays (a DEL run with the config a pod was created with still calls it),
        // and so does the kernel state, which this test never creates.
        assert_eq!(
            fs::read(n.bin().join("natguard")).unwrap(),
            fs::read(BIN).unwrap()
        );
        assert!(log.contains("removed natguard's entry from"), "{log}");
    }
}

#[test]
fn without_cleanup_on_exit_sigterm_leaves_the_entry() {
    let n = Node::new("no-cleanup");
    let (w, list) = watching_calico(&n, &[]);
    let before = n.snapshot();
    let status = w.stop();
    assert!(status.success(), "exit {status:?}");
    assert!(has_natguard(&list));
    assert_eq!(n.snapshot(), before, "the list was rewritten on SIGTERM");
    assert!(ready_names(&n, &list));

    // The flag means nothing without --watch: a usage error, nothing touched.
    for extra in [
        &["--cleanup-on-exit"][..],
        &["--check", "--cleanup-on-exit"],
    ] {
        let out = n.run("install", extra);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert_eq!(n.snapshot(), before);
    }
}

#[test]
fn watch_runs_adopt_at_start_and_after_each_reinsert_and_again_later() {
    let n = Node::new("watch-adopt");
    n.write("10-calico.conflist", CALICO);
    n.install(&[]);
    let list = n.conf("10-calico.conflist");
    // Adopt on, with an empty CNI cache: adopt finds no pod. The watcher puts the node-wide
    // guard in place, so it runs in a network namespace of its own, with a /run of its own
    // (the node lock): nothing of the machine's is touched.
    fs::create_dir_all(n.dir.join("cache")).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--net",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
    ])
    .arg("mount -t tmpfs tmpfs /run && exec \"$0\" \"$@\"")
    .arg(BIN)
    .arg("install")
    .args(n.base_args())
    .arg("--watch")
    .arg("--cache-dir")
    .arg(n.dir.join("cache"));
    let w = Watcher::spawn(cmd);
    let adopted = || w.count("natguard adopt: done");
    // The entry is already there at start; adopt runs anyway, as a one-shot install does (the
    // watcher before this one may have stopped between a re-insert and its adopt).
    wait_for("adopt at start", || adopted() == 1);

    // The agent rewrites its list: the entry comes back, then adopt runs for the pods that
    // started in between.
    fs::write(&list, CALICO).unwrap();
    wait_for("natguard back", || has_natguard(&list));
    wait_for("adopt after the re-insert", || adopted() == 2);
    // ... and once more ten seconds later, for pods whose ADD was still under way.
    let t = Instant::now();
    wait_for("the follow-up adopt", || adopted() == 3);
    assert!(t.elapsed() > Duration::from_secs(5), "{}", w.log());
    assert_eq!(w.count("adopting again"), 1);

    // A pass that writes nothing does not adopt.
    let checks = w.count("nothing to write");
    n.write("99-unrelated.conflist", "{}");
    wait_for("the unrelated event checked", || {
        w.count("nothing to write") > checks
    });
    assert_eq!(adopted(), 3, "{}", w.log());
    assert!(w.stop().success());
}

/// Every subcommand answers `--help`/`-h` with its usage on stdout (exit 0), and a bad argument
/// with one line on stderr that names it and points at `--help` (exit 2). Nothing reaches the
/// kernel: the command line is parsed first.
#[test]
fn every_subcommand_answers_help_and_refuses_a_bad_argument_in_one_line() {
    for verb in [
        "status",
        "metrics",
        "adopt",
        "reconcile",
        "install",
        "uninstall",
        "version",
    ] {
        for help in ["--help", "-h"] {
            let out = Command::new(BIN).args([verb, help]).output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{verb} {help}: {}", text(&out));
            let usage = String::from_utf8_lossy(&out.stdout);
            assert!(
                usage.starts_with(&format!("usage: natguard {verb}")),
                "{verb} {help}: {}",
                text(&out)
            );
            assert!(out.stderr.is_empty(), "{verb} {help}: {}", text(&out));
        }
        let out = Command::new(BIN)
            .args([verb, "--bogus-flag"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{verb}: {}", text(&out));
        assert!(out.stdout.is_empty(), "{verb}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err,
            format!(
                "natguard {verb}: unknown argument \"--bogus-flag\"; try `natguard {verb} --help`\n"
            )
        );
    }
    // A value missing, a bad value: the same one line.
    for (args, needle) in [
        (&["adopt", "--cache-dir"][..], "--cache-dir needs a value"),
        (&["install", "--proxy-port", "0"], "--proxy-port \"0\""),
        (&["install", "--watch", "--check"], "exclude each other"),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(needle) && err.contains("--help`") && !err.contains("warn"),
            "{args:?}: {err}"
        );
    }
}

/// A `--cni-bin-dir` or `--netconf-dir` that does not exist is a typo until `--create-dirs` says
/// otherwise: refused (exit 1, the path named), nothing created, nothing written.
#[test]
fn a_directory_that_does_not_exist_is_refused_unless_created_on_request() {
    let n = Node::new("create-dirs");
    n.write("10-calico.conflist", CALICO);
    let typo = n.dir.join("opt/cni/bni");
    let typo_s = typo.display().to_string();
    let before = n.snapshot();
    for watch in [&[][..], &["--watch"]] {
        let out = n.run("install", &[watch, &["--cni-bin-dir", &typo_s]].concat());
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--cni-bin-dir {typo_s}: no such directory"))
                && err.contains("--create-dirs"),
            "{err}"
        );
        assert!(!typo.exists() && !n.ready().exists());
        assert_eq!(n.snapshot(), before);
    }
    let netd_typo = n.dir.join("etc/cni/net.d-typo");
    let out = n.run(
        "install",
        &["--netconf-dir", &netd_typo.display().to_string()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--netconf-dir"));
    assert!(!netd_typo.exists());

    // Asked for: created, and the install goes on.
    let out = n.run("install", &["--cni-bin-dir", &typo_s, "--create-dirs"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(typo.join("natguard").is_file());
    assert!(has_natguard(&n.conf("10-calico.conflist")));
    // A probe creates nothing.
    let out = n.run("install", &["--check", "--create-dirs"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// The readiness probe runs without the container's args: `install --check` without directory
/// flags checks the directories the watcher recorded beside the ready file, and explicit flags
/// still win. `uninstall` removes what the watcher keeps there (its record, its directories).
#[test]
fn check_without_flags_checks_what_the_watcher_installs() {
    let n = Node::new("check-record");
    n.write("10-calico.conflist", CALICO);
    let ready = n.ready().display().to_string();
    let probe = |extra: &[&str]| {
        Command::new(BIN)
            .args(["install", "--check", "--ready-file", &ready])
            .args(extra)
            .output()
            .unwrap()
    };
    // No watcher yet: the default dirs, which have no natguard here.
    let w = Watcher::start(&n, &[]);
    let list = n.conf("10-calico.conflist");
    wait_for("the watcher's insert", || ready_names(&n, &list));
    let out = probe(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("ready: natguard is in {}\n", list.display())
    );
    let elsewhere = n.dir.join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    let out = probe(&["--cni-bin-dir", &elsewhere.display().to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(w.stop().success());

    let run = n.ready().parent().unwrap().to_path_buf();
    assert!(run.join("install.json").is_file());
    fs::write(
        run.join("repair.json"),
        r#"{"pid":1,"repairs":2,"checks":3}"#,
    )
    .unwrap();
    let out = n.run("uninstall", &[]);
    assert!(out.status.success(), "{}", text(&out));
    for f in ["ready", "repair.json", "install.json"] {
        assert!(!run.join(f).exists(), "uninstall left {f}");
    }
}

/// One watcher per node: a second `install --watch` on the same ready file waits, saying for
/// whom, and takes over only once the first has exited.
#[test]
fn a_second_watcher_waits_for_the_first() {
    let n = Node::new("two-watchers");
    n.write("10-calico.conflist", CALICO);
    let list = n.conf("10-calico.conflist");
    let first = Watcher::start(&n, &[]);
    wait_for("the first watcher's insert", || ready_names(&n, &list));
    let first_pid = first.child.id();
    let second = Watcher::start(&n, &[]);
    wait_for("the second watcher to wait", || {
        second.count(&format!("(pid {first_pid}); waiting for it to exit")) == 1
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(second.count("watching"), 0, "{}", second.log());
    assert!(first.stop().success());
    wait_for("the second watcher to take over", || {
        second.count("watching ") == 1
    });
    let lock = fs::read_to_string(n.ready().parent().unwrap().join("watch.lock")).unwrap();
    assert_eq!(lock.trim(), second.child.id().to_string());
    assert!(second.stop().success());
}

/// `--cache-dir` names the CNI cache root as readily as its `results/`: the root, which has a
/// `results` directory and no cache files of its own, is read as `results/`.
#[test]
fn the_cache_root_is_read_as_its_results() {
    use natguard::restore::results_dir;
    let n = Node::new("cache-root");
    let root = n.dir.join("var-lib-cni");
    fs::create_dir_all(root.join("results")).unwrap();
    fs::create_dir_all(root.join("networks")).unwrap();
    assert_eq!(results_dir(&root), root.join("results"));
    assert_eq!(results_dir(&root.join("results")), root.join("results"));
    // A directory of cache files is itself, whatever else it holds.
    fs::write(root.join("mynet-abc-eth0"), "{}").unwrap();
    assert_eq!(results_dir(&root), root);
    assert_eq!(results_dir(&n.dir.join("missing")), n.dir.join("missing"));
}

/// A directory laid out as the kubelet lays out a ConfigMap volume: `natguard.json` is a
/// symlink to `..data/natguard.json`, and `..data` a symlink to a timestamped directory. An
/// update writes a new directory and renames a new `..data` symlink over the old one.
struct ConfigMapDir {
    dir: PathBuf,
    version: usize,
}

impl ConfigMapDir {
    fn new(dir: PathBuf, first: &str) -> ConfigMapDir {
        fs::create_dir_all(&dir).unwrap();
        let mut c = ConfigMapDir { dir, version: 0 };
        c.update(first);
        std::os::unix::fs::symlink("..data/natguard.json", c.file()).unwrap();
        c
    }
    fn file(&self) -> PathBuf {
        self.dir.join("natguard.json")
    }
    /// What the kubelet does on an update: a new data dir, then `..data` swapped atomically.
    fn update(&mut self, text: &str) {
        self.version += 1;
        let data = format!("..2026_12_04_{:02}", self.version);
        fs::create_dir_all(self.dir.join(&data)).unwrap();
        fs::write(self.dir.join(&data).join("natguard.json"), text).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

fn natguard_entry(list: &Path) -> Value {
    let v: Value = serde_json::from_str(&fs::read_to_string(list).unwrap()).unwrap();
    v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "natguard")
        .cloned()
        .unwrap_or(Value::Null)
}

/// `install --watch --config FILE` follows FILE like a DaemonSet's ConfigMap: a `..data`
/// swap and a plain rewrite both become natguard's entry in the active list (flags still
/// override it), a config the plugin's parser refuses is logged and the entry kept, and the
/// readiness probe with the same `--config` is ready exactly when the list has that file's
/// entry. With `--log-format json` every line the watcher writes is one JSON object.
#[test]
fn watch_follows_its_config_file_like_a_configmap() {
    let n = Node::new("configmap");
    n.write("10-calico.conflist", CALICO);
    let list = n.conf("10-calico.conflist");
    let mut cm = ConfigMapDir::new(
        n.dir.join("etc-natguard"),
        r#"{"metadata":{"mode":"deny"}}"#,
    );
    let cfg = cm.file().display().to_string();
    let w = Watcher::start(
        &n,
        &[
            "--config",
            &cfg,
            "--exempt-namespace",
            "kube-system",
            "--log-format",
            "json",
        ],
    );
    let mode = || natguard_entry(&list)["metadata"]["mode"].clone();
    wait_for("the first entry", || mode() == "deny");
    let ready = n.ready().display().to_string();
    let probe = || {
        Command::new(BIN)
            .args([
                "install",
                "--check",
                "--ready-file",
                &ready,
                "--config",
                &cfg,
            ])
            .args(["--exempt-namespace", "kube-system"])
            .output()
            .unwrap()
    };
    let out = probe();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A ConfigMap update: the new entry replaces the old one, the flags still apply.
    cm.update(r#"{"metadata":{"mode":"proxy","proxyPort":9000},"logFormat":"json"}"#);
    wait_for("the updated entry", || mode() == "proxy");
    let e = natguard_entry(&list);
    assert_eq!(e["metadata"]["proxyPort"], 9000);
    assert_eq!(e["metadata"]["exemptNamespaces"], json!(["kube-system"]));
    assert_eq!(e["logFormat"], "json");
    assert_eq!(
        e["capabilities"],
        json!({"io.kubernetes.cri.pod-annotations": true})
    );
    wait_for("the probe to pass on the new entry", || {
        probe().status.code() == Some(0)
    });

    // A bad config: logged, the entry stays, and the probe says not ready.
    let before = fs::read(&list).unwrap();
    cm.update(r#"{"metadata":{"mode":"allow"}}"#);
    wait_for("the refusal in the log", || {
        w.count("keeping natguard's entry as it is") == 1
    });
    assert_eq!(fs::read(&list).unwrap(), before);
    let out = probe();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));

    // Fixed by hand: a plain file in place of the ConfigMap's symlink.
    let tmp = cm.dir.join("natguard.json.new");
    fs::write(&tmp, r#"{"metadata":{"mode":"off"}}"#).unwrap();
    fs::rename(&tmp, cm.file()).unwrap();
    wait_for("the fixed entry", || mode() == "off");
    wait_for("the probe to pass again", || {
        probe().status.code() == Some(0)
    });
    // The agent's rewrite from its template gets the current entry back, not the first one.
    fs::write(&list, CALICO).unwrap();
    wait_for("the entry back after the agent's rewrite", || {
        mode() == "off"
    });

    let mut w = w;
    assert!(w.signal(libc::SIGTERM).success());
    let log = w.log();
    assert!(log.lines().count() >= 5, "{log}");
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["component"], "install", "{line}");
        for k in ["time", "level", "msg"] {
            assert!(v[k].is_string(), "{k} missing: {line}");
        }
        assert!(v["time"].as_str().unwrap().ends_with('Z'), "{line}");
    }
}

/// The uninstall DaemonSet's pod: `uninstall --stay` takes natguard off the node and keeps
/// running until SIGTERM, and `uninstall --check` (its readiness probe) says clean exactly when
/// no list has natguard and the bin dir has no natguard binary.
#[test]
fn uninstall_stays_and_its_check_says_when_the_node_is_clean() {
    let n = Node::new("uninstall-stay");
    n.write("10-calico.conflist", CALICO);
    n.install(&[]);
    let check = || n.run("uninstall", &["--check"]);
    let out = check();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("not clean: natguard is in "));
    let mut stay = Watcher::spawn(n.cmd("uninstall", &["--stay", "--log-format", "json"]));
    wait_for("the node clean", || check().status.code() == Some(0));
    assert_eq!(n.read("10-calico.conflist"), CALICO);
    std::thread::sleep(Duration::from_millis(200));
    assert!(stay.child.try_wait().unwrap().is_none(), "{}", stay.log());
    assert!(stay.signal(libc::SIGTERM).success());
    assert!(
        stay.count(r#""msg":"natguard is off this node; staying until SIGTERM (--stay)""#) == 1
    );
    let out = n.run("uninstall", &["--stay", "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
