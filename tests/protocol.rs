//! The CNI protocol of the real binary, without root and without touching the kernel: VERSION
//! for every cniVersion (also exactly as podman sends it, and with no stdin at all), and the
//! error path of every verb for every cniVersion.
//!
//! Only invocations that must fail before natguard opens a netlink socket belong here: a
//! successful ADD, DEL, CHECK, GC or STATUS would read or write the nftables state of the
//! namespace the test runs in. Those are tested in namespaces of their own by the root tests.

use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const VERBS: [&str; 5] = ["ADD", "DEL", "CHECK", "GC", "STATUS"];

/// What one invocation of the binary did.
struct Run {
    what: String,
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs natguard with exactly `env` (nothing inherited) and `stdin` (`None`: no stdin at all).
fn run(env: &[(&str, &str)], stdin: Option<&[u8]>) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_natguard"));
    cmd.env_clear()
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().expect("run natguard");
    let writer = stdin.map(|data| {
        let mut pipe = child.stdin.take().unwrap();
        let data = data.to_vec();
        // natguard may exit before reading everything (e.g. on a bad CNI_COMMAND): ignore EPIPE.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        })
    });
    let out = child.wait_with_output().expect("wait for natguard");
    if let Some(w) = writer {
        w.join().unwrap();
    }
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    Run {
        what: format!(
            "{} <<< {}",
            shown.join(" "),
            stdin.map_or("(no stdin)".into(), |s| String::from_utf8_lossy(s)
                .chars()
                .take(300)
                .collect::<String>())
        ),
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Run {
    /// stdout holds exactly one JSON object (and a newline): nothing else may be printed there.
    fn reply(&self) -> Value {
        let mut it = serde_json::Deserializer::from_slice(&self.stdout).into_iter::<Value>();
        let v = match it.next() {
            Some(Ok(v)) => v,
            other => panic!(
                "{}: stdout is not one JSON value ({other:?}): {:?}\nstderr: {}",
                self.what,
                String::from_utf8_lossy(&self.stdout),
                self.stderr
            ),
        };
        let rest = &self.stdout[it.byte_offset()..];
        assert!(
            rest.iter().all(u8::is_ascii_whitespace),
            "{}: stdout has more than one JSON object: {:?}",
            self.what,
            String::from_utf8_lossy(&self.stdout)
        );
        assert!(v.is_object(), "{}: reply is not an object: {v}", self.what);
        v
    }

    fn assert_no_panic(&self) {
        assert!(
            self.status.signal().is_none(),
            "{}: killed by signal {:?}; stderr: {}",
            self.what,
            self.status.signal(),
            self.stderr
        );
        assert!(
            !self.stderr.contains("panicked"),
            "{}: panicked: {}",
            self.what,
            self.stderr
        );
    }

    fn ok(&self) -> Value {
        self.assert_no_panic();
        assert!(
            self.status.success(),
            "{}: expected success, got {:?}\nstdout: {}\nstderr: {}",
            self.what,
            self.status,
            String::from_utf8_lossy(&self.stdout),
            self.stderr
        );
        self.reply()
    }

    /// A CNI error: exit 1, one error object on stdout with `code` and a message naming `what`.
    /// With `version`, the error carries the configuration's cniVersion.
    fn error(&self, code: u64, needle: &str, version: Option<&str>) -> Value {
        self.assert_no_panic();
        assert_eq!(
            self.status.code(),
            Some(1),
            "{}: expected exit 1; stdout: {}\nstderr: {}",
            self.what,
            String::from_utf8_lossy(&self.stdout),
            self.stderr
        );
        let v = self.reply();
        assert_eq!(v["code"], code, "{}: wrong error code in {v}", self.what);
        let msg = v["msg"].as_str().unwrap_or_default();
        assert!(!msg.is_empty(), "{}: no msg in {v}", self.what);
        let text = format!("{msg} {}", v["details"].as_str().unwrap_or_default());
        assert!(
            text.contains(needle),
            "{}: error does not name {needle:?}: {v}",
            self.what
        );
        let got = v["cniVersion"].as_str().unwrap_or_default();
        match version {
            Some(want) => assert_eq!(got, want, "{}: error cniVersion in {v}", self.what),
            None => assert!(
                VERSIONS.contains(&got),
                "{}: error cniVersion {got:?} is not a supported version: {v}",
                self.what
            ),
        }
        v
    }
}

/// The environment a runtime sets for `verb`.
fn env_for(verb: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("CNI_COMMAND", verb),
        ("CNI_CONTAINERID", "0123456789abcdef"),
        ("CNI_NETNS", "/var/run/netns/ng-protocol-does-not-exist"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
        ),
    ]
}

fn without(
    mut env: Vec<(&'static str, &'static str)>,
    key: &str,
) -> Vec<(&'static str, &'static str)> {
    env.retain(|(k, _)| *k != key);
    env
}

fn conf(version: &str, extra: Value) -> Vec<u8> {
    let mut c = json!({"cniVersion": version, "name": "ng-protocol", "type": "natguard"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    serde_json::to_vec(&c).unwrap()
}

fn supported(reply: &Value) -> Vec<String> {
    reply["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no supportedVersions in {reply}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// VERSION
// ---------------------------------------------------------------------------------------------

#[test]
fn version_for_every_cni_version() {
    for v in VERSIONS {
        let r = run(&[("CNI_COMMAND", "VERSION")], Some(&conf(v, json!({}))));
        let reply = r.ok();
        assert_eq!(reply["cniVersion"], v, "{reply}");
        assert_eq!(supported(&reply), VERSIONS, "{reply}");
        // With a whole conflist entry and a full environment, too.
        let r = run(
            &env_for("VERSION"),
            Some(&conf(
                v,
                json!({"metadata":{"mode":"deny"},"prevResult":{"cniVersion":v,"ips":[]}}),
            )),
        );
        assert_eq!(r.ok()["cniVersion"], v);
    }
}

#[test]
fn version_exactly_as_podman_sends_it() {
    let env = [
        ("CNI_COMMAND", "VERSION"),
        ("CNI_NETNS", "dummy"),
        ("CNI_IFNAME", "dummy"),
        ("CNI_PATH", "dummy"),
    ];
    let reply = run(&env, Some(br#"{"cniVersion":"1.0.0"}"#)).ok();
    assert_eq!(reply["cniVersion"], "1.0.0");
    assert_eq!(supported(&reply), VERSIONS);
    // libcni's GetVersionInfo also sets a dummy container ID.
    let mut env = env.to_vec();
    env.push(("CNI_CONTAINERID", "dummy"));
    let reply = run(&env, Some(br#"{"cniVersion":"1.0.0"}"#)).ok();
    assert_eq!(supported(&reply), VERSIONS);
}

#[test]
fn version_needs_no_stdin_at_all() {
    let reply = run(&[("CNI_COMMAND", "VERSION")], None).ok();
    assert_eq!(supported(&reply), VERSIONS);
    assert!(VERSIONS.contains(&reply["cniVersion"].as_str().unwrap()));
    // Empty stdin, junk, and a version natguard does not know (a newer runtime) all still
    // get the list of supported versions: that is how the runtime finds out.
    for stdin in [
        &b""[..],
        b"not json",
        br#"{"cniVersion":"9.9.9"}"#,
        br#"{"cniVersion":42}"#,
        br#"[]"#,
    ] {
        let reply = run(&[("CNI_COMMAND", "VERSION")], Some(stdin)).ok();
        assert_eq!(supported(&reply), VERSIONS);
    }
}

// ---------------------------------------------------------------------------------------------
// Error paths, every verb and every version
// ---------------------------------------------------------------------------------------------

#[test]
fn add_without_prev_result_is_a_config_error() {
    for v in VERSIONS {
        for extra in [json!({}), json!({"prevResult": null})] {
            let r = run(&env_for("ADD"), Some(&conf(v, extra)));
            let e = r.error(7, "prevResult", Some(v));
            assert!(
                e["details"].as_str().unwrap().contains("chained"),
                "the message says why: {e}"
            );
        }
    }
}

#[test]
fn check_needs_0_4_0_and_a_prev_result() {
    for v in VERSIONS {
        let r = run(&env_for("CHECK"), Some(&conf(v, json!({}))));
        if matches!(v, "0.3.0" | "0.3.1") {
            r.error(1, "CHECK", Some(v));
            r.error(1, "0.4.0", Some(v));
        } else {
            r.error(7, "prevResult", Some(v));
        }
    }
}

#[test]
fn gc_and_status_need_1_1_0() {
    for verb in ["GC", "STATUS"] {
        for v in VERSIONS {
            if v == "1.1.0" {
                continue;
            }
            let r = run(&env_for(verb), Some(&conf(v, json!({}))));
            r.error(1, verb, Some(v));
            r.error(1, "1.1.0", Some(v));
            // GC and STATUS need no container environment: only the verb.
            let r = run(&[("CNI_COMMAND", verb)], Some(&conf(v, json!({}))));
            r.error(1, verb, Some(v));
        }
    }
    // On 1.1.0 their error path is the configuration.
    let r = run(
        &[("CNI_COMMAND", "GC")],
        Some(&conf(
            "1.1.0",
            json!({"cni.dev/valid-attachments":[{"containerID":"a"}]}),
        )),
    );
    r.error(7, "cni.dev/valid-attachments[0].ifname", Some("1.1.0"));
    let r = run(
        &[("CNI_COMMAND", "GC")],
        Some(&conf("1.1.0", json!({"cni.dev/valid-attachments":"all"}))),
    );
    r.error(7, "cni.dev/valid-attachments", Some("1.1.0"));
}

#[test]
fn invalid_config_fails_add_check_gc_and_status_in_every_version() {
    let bad = [
        (
            json!({"masquerade":{"nonMasqueradeCidrs":["10.0.0.0/8"]}}),
            "masquerade.nonMasqueradeCidrs",
        ),
        (
            json!({"metadata":{"ports":[80, 65536]}}),
            "metadata.ports[1]",
        ),
        (json!({"metadata":"proxy"}), "metadata"),
        (json!({"name":"has space"}), "name"),
        (json!({"name":7}), "name"),
    ];
    // Not DEL: a DEL that fails keeps the runtime from running the primary plugin's DEL, and
    // DEL needs only the network name and the attachment to clean up. What DEL answers to a
    // broken natguard section is tested where DEL may touch the kernel.
    for verb in ["ADD", "CHECK", "GC", "STATUS"] {
        for v in VERSIONS {
            for (extra, needle) in &bad {
                let r = run(&env_for(verb), Some(&conf(v, extra.clone())));
                r.error(7, needle, Some(v));
            }
        }
    }
}

#[test]
fn unsupported_or_missing_cni_version_is_code_1() {
    for verb in VERBS {
        for stdin in [
            &br#"{"cniVersion":"0.2.0","name":"n"}"#[..],
            br#"{"cniVersion":"0.1.0","name":"n"}"#,
            br#"{"cniVersion":"1.2.0","name":"n"}"#,
            br#"{"cniVersion":"","name":"n"}"#,
            br#"{"name":"n"}"#,
        ] {
            let r = run(&env_for(verb), Some(stdin));
            r.error(1, "cniVersion", None);
        }
    }
}

#[test]
fn undecodable_stdin_is_code_6() {
    for verb in VERBS {
        for stdin in [&b""[..], b"{", b"[]", b"\"x\"", b"\xff\xfe"] {
            let r = run(&env_for(verb), Some(stdin));
            r.error(6, "stdin", None);
        }
        let r = run(&env_for(verb), None);
        r.error(6, "stdin", None);
    }
}

#[test]
fn missing_environment_is_code_4() {
    let needs: [(&str, &[&str]); 3] = [
        (
            "ADD",
            &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_PATH"],
        ),
        (
            "CHECK",
            &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_PATH"],
        ),
        // DEL runs without a netns (containerd's second DEL) and without CNI_PATH.
        ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME"]),
    ];
    for (verb, vars) in needs {
        for v in VERSIONS {
            for var in vars {
                let stdin = conf(v, json!({}));
                let r = run(&without(env_for(verb), var), Some(&stdin));
                r.error(4, var, Some(v));
                // Set but empty is the same as missing.
                let mut env = without(env_for(verb), var);
                env.push((var, ""));
                run(&env, Some(&stdin)).error(4, var, Some(v));
            }
        }
    }
}

#[test]
fn missing_or_unknown_cni_command_is_code_4() {
    let stdin = conf("1.0.0", json!({}));
    run(&without(env_for("ADD"), "CNI_COMMAND"), Some(&stdin)).error(4, "CNI_COMMAND", None);
    // With no CNI variable at all the binary was run by hand: tests/conventions.rs.
    run(&[("CNI_PATH", "/opt/cni/bin")], None).error(4, "CNI_COMMAND", None);
    for cmd in ["add", "FOO", "", "VERSION2", "ADD ", "DEL\u{1}", "UPDATE"] {
        let mut env = without(env_for("ADD"), "CNI_COMMAND");
        env.push(("CNI_COMMAND", cmd));
        run(&env, Some(&stdin)).error(4, "CNI_COMMAND", None);
    }
}

#[test]
fn errors_go_to_stdout_and_logs_never_do() {
    // The error reply is the only thing on stdout, and it is compact JSON on one line.
    let r = run(&env_for("ADD"), Some(&conf("0.3.1", json!({}))));
    r.error(7, "prevResult", Some("0.3.1"));
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    assert_eq!(text.matches('\n').count(), 1, "{text:?}");
    assert!(text.ends_with("}\n"), "{text:?}");
    // The runtime logs stderr: the same failure is explained there.
    assert!(r.stderr.contains("prevResult"), "stderr: {}", r.stderr);
}
