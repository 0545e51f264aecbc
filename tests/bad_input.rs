//! A corpus of malformed invocations of the real binary. Each one must get the expected CNI
//! error code with a message naming what is wrong, exit 1 (never a signal, never a panic),
//! print exactly one JSON object on stdout, and leave the kernel state unchanged.
//!
//! Needs root, and never skips: everything runs inside a network namespace the test creates
//! (`common::Harness`), seeded with a real pod so that "unchanged" covers natguard's own table.
//! natguard runs there through `common::run`, with exactly the corpus's environment and stdin.
//! `nft list ruleset` of that namespace is compared before and after the whole corpus.

mod common;
#[path = "bad_input/corpus.rs"]
mod corpus;

use common::run::{Invocation, Natguard};
use common::{require_tools, Harness, Netns};
use corpus::*;
use serde_json::{json, Value};
use std::ffi::OsString;

// ---------------------------------------------------------------------------------------------
// The namespace
// ---------------------------------------------------------------------------------------------

fn ruleset(ns: &Netns) -> String {
    ns.run(&["nft", "list", "ruleset"])
}

/// Runs natguard in the namespace with exactly `env` and `stdin` (`None`: no stdin).
fn natguard(ns: &Netns, env: &[(String, OsString)], stdin: Option<&[u8]>) -> Invocation {
    let inv = Natguard::new().env(env);
    match stdin {
        Some(data) => inv.stdin(data),
        None => inv.no_stdin(),
    }
    .run_in(ns)
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

/// What is wrong with natguard's answer to `row`, if anything.
fn judge(row: &Row, out: &Invocation) -> Result<(), String> {
    let stdout = &out.stdout;
    let stderr = &out.stderr;
    if let Some(sig) = out.signal() {
        return Err(format!("killed by signal {sig}; stderr: {stderr}"));
    }
    if stderr.contains("panicked") {
        return Err(format!("panicked: {stderr}"));
    }
    if out.exit != Some(1) {
        return Err(format!(
            "exit status {:?}, expected 1; stdout: {stdout}; stderr: {stderr}",
            out.exit
        ));
    }
    // Runtimes put the reply in their own logs and events: it must stay short, whatever the input.
    if out.raw_stdout.len() > 4096 {
        return Err(format!(
            "reply of {} bytes; errors must not echo unbounded input: {}...",
            out.raw_stdout.len(),
            short(stdout)
        ));
    }
    let mut it = serde_json::Deserializer::from_slice(&out.raw_stdout).into_iter::<Value>();
    let v = match it.next() {
        Some(Ok(v)) if v.is_object() => v,
        other => {
            return Err(format!(
                "stdout is not a JSON object ({other:?}): {stdout:?}"
            ))
        }
    };
    if !out.raw_stdout[it.byte_offset()..]
        .iter()
        .all(u8::is_ascii_whitespace)
    {
        return Err(format!("stdout has more than one JSON object: {stdout:?}"));
    }
    if v["code"] != row.code {
        return Err(format!("code {}, expected {}: {v}", v["code"], row.code));
    }
    if !v["cniVersion"].is_string() {
        return Err(format!("no cniVersion: {v}"));
    }
    let msg = v["msg"].as_str().unwrap_or_default();
    if msg.is_empty() {
        return Err(format!("empty msg: {v}"));
    }
    let text = format!("{msg} {}", v["details"].as_str().unwrap_or_default());
    if !text.contains(&row.needle) {
        return Err(format!("message does not name {:?}: {v}", row.needle));
    }
    Ok(())
}

#[test]
fn malformed_invocations_fail_cleanly_and_change_nothing() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root: it creates a network namespace and runs natguard in it"
    );
    let h = Harness::new("bad");
    require_tools(&["nft"]);
    let ns = h.netns("node");
    let netns_path = ns.path();

    // Seed the namespace with a real pod, so natguard's table, sets and elements exist.
    let good = serde_json::to_vec(&good_conf()).unwrap();
    let out = natguard(&ns, &base_env("ADD", &netns_path), Some(&good));
    assert!(
        out.exit == Some(0),
        "seeding ADD failed: {}\n{}",
        out.stdout,
        out.stderr
    );
    let before = ruleset(&ns);
    assert!(
        before.contains("table inet natguard") && before.contains("10.99.0.5"),
        "the seeded pod is not in the ruleset:\n{before}"
    );

    let rows = corpus();
    assert!(rows.len() >= 60, "only {} cases", rows.len());
    let mut failures = Vec::new();
    for row in &rows {
        let mut env = base_env(row.verb, &netns_path);
        for (k, v) in &row.env {
            env.retain(|(n, _)| n != k);
            if let Some(v) = v {
                env.push((k.to_string(), v.clone()));
            }
        }
        let out = natguard(&ns, &env, row.stdin.as_deref());
        if let Err(e) = judge(row, &out) {
            failures.push(format!("[{} {}] {e}", row.verb, row.name));
        }
    }

    let after = ruleset(&ns);
    // The seeded pod is still exactly as ADD left it.
    let check = natguard(&ns, &base_env("CHECK", &netns_path), Some(&good));
    if check.exit != Some(0) {
        failures.push(format!(
            "CHECK of the seeded pod after the corpus failed: {}",
            check.stdout
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} malformed invocations were not handled as expected:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    assert_eq!(
        before, after,
        "the corpus changed the kernel state of {}",
        ns.name
    );
    eprintln!(
        "{} malformed invocations: all rejected, ruleset unchanged",
        rows.len()
    );
}

/// DEL must clean up even when natguard's section no longer parses (a config edited between ADD
/// and DEL): a failing DEL stops the runtime before the primary plugin's DEL, leaking the IP.
#[test]
fn del_with_a_broken_config_still_removes_the_pod() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let h = Harness::new("baddel");
    require_tools(&["nft"]);
    let ns = h.netns("node");
    let netns_path = ns.path();
    let good = serde_json::to_vec(&good_conf()).unwrap();
    let out = natguard(&ns, &base_env("ADD", &netns_path), Some(&good));
    assert!(out.exit == Some(0), "ADD: {}", out.stdout);
    assert!(ruleset(&ns).contains("10.99.0.5"));

    for broken in [
        patched(&["masquerade", "nonMasqueradeCidrs"], Some(json!([]))),
        patched(&["prevResult"], Some(json!("not a result"))),
        patched(&["metadata", "ports"], Some(json!([0]))),
    ] {
        let out = natguard(
            &ns,
            &base_env("DEL", &netns_path),
            Some(&serde_json::to_vec(&broken).unwrap()),
        );
        assert!(
            out.exit == Some(0),
            "DEL with {broken} failed: {}",
            out.stdout
        );
    }
    let after = ruleset(&ns);
    assert!(
        !after.contains("10.99.0.5") && !after.contains("fd00:99::5"),
        "the pod's elements survived DEL:\n{after}"
    );
    // Without a name there is nothing to find the pod by: that still fails, with code 7.
    let out = natguard(
        &ns,
        &base_env("DEL", &netns_path),
        Some(&serde_json::to_vec(&patched(&["name"], None)).unwrap()),
    );
    assert!(out.exit != Some(0));
    let v: Value = serde_json::from_slice(&out.raw_stdout).unwrap();
    assert_eq!(v["code"], 7, "{v}");
}

/// A `CNI_NETNS` that is no network namespace: a FIFO (whose plain open would block until a
/// writer came, wedging ADD until the runtime killed it), a regular file, a directory. ADD
/// answers at once with code 4 naming the variable and the path; DEL, which needs no
/// namespace, still removes the pod and exits 0. Each invocation must exit within 10 s.
#[test]
fn a_netns_that_is_no_network_namespace_is_refused_at_once() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let h = Harness::new("badns");
    require_tools(&["nft"]);
    let ns = h.netns("node");
    let fifo = h.dir().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let file = h.dir().join("regular");
    std::fs::write(&file, b"not a namespace").unwrap();
    let dir = h.dir().join("directory");
    std::fs::create_dir_all(&dir).unwrap();
    let bound = std::time::Duration::from_secs(10);
    let run = |verb: &str, netns: &str, conf: &Value| {
        Natguard::new()
            .env(&base_env(verb, netns))
            .stdin(&serde_json::to_vec(conf).unwrap())
            .bound(bound)
            .run_in(&ns)
    };
    let good = good_conf();
    for path in [&fifo, &file, &dir] {
        let p = path.to_str().unwrap();
        run("ADD", p, &good).fails_with(4, &["CNI_NETNS", p, "not a network namespace"]);
    }
    assert!(
        !ruleset(&ns).contains("10.99.0.5"),
        "a refused ADD installs nothing"
    );
    run("ADD", &ns.path(), &good).succeeded();
    assert!(ruleset(&ns).contains("10.99.0.5"));
    run("DEL", fifo.to_str().unwrap(), &good).succeeded();
    let after = ruleset(&ns);
    assert!(
        !after.contains("10.99.0.5") && !after.contains("fd00:99::5"),
        "DEL with a FIFO for CNI_NETNS left the pod's elements:\n{after}"
    );
}
