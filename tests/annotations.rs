//! Per-pod tightening from pod annotations (`natguard.io/metadata`), with real traffic.
//!
//! The standard world (`common::World`: a bridge pod network, the REAL metadata server in the
//! "cloud" namespace answering "cloud", the node-local proxy answering "proxy"). natguard's
//! entry declares the `io.kubernetes.cri.pod-annotations` capability, and the chain driver
//! passes each pod's annotations as libcni does (`runtimeConfig`, and `capabilityArgs` in the
//! CNI cache). Every case checks what the pod's metadata request gets: the proxy, a reset, or
//! the real server, which only an exempt pod may reach. Then `status` names each pod's policy
//! and its source, CHECK passes, and after `nft flush ruleset` `natguard reconcile` restores
//! the annotated policies from the cache.
//!
//! Needs root (network namespaces, nf_tables); never skips.

mod common;

use common::run::{Access, Natguard};
use common::*;
use serde_json::{json, Value};
use std::fs;

const CAP: &str = "io.kubernetes.cri.pod-annotations";

fn entry(w: &World, patch: Value) -> Value {
    let mut e = w.natguard(json!({
        "capabilities": { CAP: true },
        "metadata": { "exemptNamespaces": ["kube-system"] }
    }));
    merge(&mut e, &patch);
    e
}

/// A pod of `k8s_ns` whose sandbox carries `annotations` (as CRI passes them).
fn try_pod(
    w: &World,
    chain: &Chain,
    role: &str,
    k8s_ns: &str,
    annotations: Value,
) -> CniResult<Pod> {
    let ns = w.h.netns(role);
    let mut att = Attachment::new(&format!("cid-{role}"), &ns).k8s(k8s_ns, role);
    att.cap_args.insert(CAP.into(), annotations);
    w.try_attach(chain, ns, att)
}

fn pod(w: &World, chain: &Chain, role: &str, k8s_ns: &str, annotations: Value) -> Pod {
    try_pod(w, chain, role, k8s_ns, annotations)
        .unwrap_or_else(|e| panic!("ADD of {role} failed: {e}"))
}

fn metadata(p: &Pod) -> (Outcome, Outcome) {
    (
        http_get(&p.ns, sa(META4, HTTP_PORT)),
        http_get(&p.ns, sa(META6, HTTP_PORT)),
    )
}

fn proxied() -> (Outcome, Outcome) {
    (body("proxy"), body("proxy"))
}
fn reset() -> (Outcome, Outcome) {
    (Outcome::Refused, Outcome::Refused)
}
fn real() -> (Outcome, Outcome) {
    (body("cloud"), body("cloud"))
}

/// A directory of the test over `/run/natguard` (the lock, no watcher's record), so the node
/// tools never touch the machine's.
fn run_dir(w: &World) -> std::path::PathBuf {
    let d = w.dir().join("run-natguard");
    fs::create_dir_all(&d).unwrap();
    d
}

fn status(w: &World) -> String {
    Natguard::new()
        .args(&["status"])
        .bind_mount(&run_dir(w), "/run/natguard", Access::ReadWrite)
        .run_in(&w.node)
        .succeeded()
        .stdout
}

/// The line after a pod's line in `status`: its policy and where it came from.
fn policy_line(status: &str, who: &str) -> String {
    let mut lines = status.lines();
    while let Some(l) = lines.next() {
        if l.trim_start().starts_with(&format!("{who} ")) {
            return lines.next().unwrap_or("").trim().to_string();
        }
    }
    panic!("{who} not in status:\n{status}")
}

#[test]
fn annotations_tighten_what_network_and_namespace_impose() {
    let w = World::new("ann-tighten");
    let chain = w.chain(w.list("ann", "1.0.0", 0, Some(entry(&w, json!({})))));
    let plain = pod(&w, &chain, "plain", "default", json!({}));
    let denied = pod(
        &w,
        &chain,
        "denied",
        "default",
        json!({"natguard.io/metadata": "deny", "other.io/x": "y"}),
    );
    let system = pod(&w, &chain, "system", "kube-system", json!({}));
    let system_proxied = pod(
        &w,
        &chain,
        "sysproxy",
        "kube-system",
        json!({"natguard.io/metadata": "proxy"}),
    );
    let system_denied = pod(
        &w,
        &chain,
        "sysdeny",
        "kube-system",
        json!({"natguard.io/metadata": "deny"}),
    );
    // `exempt` outside an exempt namespace loosens nothing.
    let asks_exempt = pod(
        &w,
        &chain,
        "asks",
        "default",
        json!({"natguard.io/metadata": "exempt"}),
    );
    let cases: [(&Pod, &str, (Outcome, Outcome), &str); 6] = [
        (
            &plain,
            "default/plain",
            proxied(),
            "proxy (the network's metadata.mode)",
        ),
        (
            &denied,
            "default/denied",
            reset(),
            "deny (the pod's annotation natguard.io/metadata)",
        ),
        (
            &system,
            "kube-system/system",
            real(),
            "exempt (its namespace is exempt)",
        ),
        (
            &system_proxied,
            "kube-system/sysproxy",
            proxied(),
            "proxy (the pod's annotation natguard.io/metadata)",
        ),
        (
            &system_denied,
            "kube-system/sysdeny",
            reset(),
            "deny (the pod's annotation natguard.io/metadata)",
        ),
        (
            &asks_exempt,
            "default/asks",
            proxied(),
            "proxy (the network's metadata.mode)",
        ),
    ];
    let check_all = |when: &str| {
        let st = status(&w);
        for (p, who, want, policy) in &cases {
            assert_eq!(&metadata(p), want, "{who} {when}");
            assert_eq!(
                policy_line(&st, who),
                format!("metadata policy: {policy}"),
                "{who} {when}"
            );
            chain
                .check(&p.att)
                .unwrap_or_else(|e| panic!("CHECK of {who} {when}: {e}"));
        }
    };
    check_all("after ADD");

    // Someone flushes the ruleset; reconcile restores every pod's policy from the cache's
    // capabilityArgs.
    w.node.run(&["nft", "flush", "ruleset"]);
    assert_eq!(metadata(&denied), real(), "the flush opened the window");
    let netd = w.dir().join("net.d");
    fs::create_dir_all(&netd).unwrap();
    fs::write(
        netd.join("10-ann.conflist"),
        serde_json::to_vec(&chain.list).unwrap(),
    )
    .unwrap();
    let cache = w.cache_dir().join("results");
    Natguard::new()
        .args(&[
            "reconcile".as_ref(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--netconf-dir".as_ref(),
            netd.as_os_str(),
        ])
        .bind_mount(&run_dir(&w), "/run/natguard", Access::ReadWrite)
        .run_in(&w.node)
        .succeeded();
    check_all("after a flush and reconcile");
}

#[test]
fn exempt_requires_annotation_narrows_an_exempt_namespace() {
    let w = World::new("ann-require");
    let chain = w.chain(w.list(
        "ann",
        "1.0.0",
        0,
        Some(entry(
            &w,
            json!({"metadata": {"exemptRequiresAnnotation": true}}),
        )),
    ));
    let dns = pod(&w, &chain, "dns", "kube-system", json!({}));
    let creds = pod(
        &w,
        &chain,
        "creds",
        "kube-system",
        json!({"natguard.io/metadata": "exempt"}),
    );
    let web = pod(
        &w,
        &chain,
        "web",
        "default",
        json!({"natguard.io/metadata": "exempt"}),
    );
    assert_eq!(
        metadata(&dns),
        proxied(),
        "kube-system alone is no longer enough"
    );
    assert_eq!(
        metadata(&creds),
        real(),
        "the credential agent asks and is granted"
    );
    assert_eq!(metadata(&web), proxied(), "a default pod cannot ask for it");
    let st = status(&w);
    assert_eq!(
        policy_line(&st, "kube-system/dns"),
        "metadata policy: proxy (the network's metadata.mode)"
    );
    assert_eq!(
        policy_line(&st, "kube-system/creds"),
        "metadata policy: exempt (its namespace is exempt)"
    );
}

#[test]
fn unknown_annotations_and_unenforceable_ones_are_refused() {
    let w = World::new("ann-refuse");
    let chain = w.chain(w.list("ann", "1.0.0", 0, Some(entry(&w, json!({})))));
    for (role, anns, needles) in [
        (
            "typo",
            json!({"natguard.io/metdata": "deny"}),
            &["natguard.io/metdata", "unknown natguard annotation"][..],
        ),
        (
            "value",
            json!({"natguard.io/metadata": "allow"}),
            &["natguard.io/metadata", "\"allow\""][..],
        ),
        (
            "number",
            json!({"natguard.io/metadata": 1}),
            &["natguard.io/metadata", "expected a string"][..],
        ),
    ] {
        let e = try_pod(&w, &chain, role, "default", anns.clone())
            .err()
            .unwrap_or_else(|| panic!("{anns} was accepted"));
        assert_eq!((e.plugin.as_str(), e.code), ("natguard", Some(7)), "{e}");
        for n in needles {
            assert!(e.details.contains(n), "{anns}: {e}");
        }
    }
    // deny in a network without metadata rules cannot be honoured: refused, not ignored.
    let off = w.chain(w.list(
        "off",
        "1.0.0",
        1,
        Some(entry(&w, json!({"metadata": {"mode": "off"}}))),
    ));
    let e = try_pod(
        &w,
        &off,
        "offdeny",
        "default",
        json!({"natguard.io/metadata": "deny"}),
    )
    .expect_err("deny in an off network was accepted");
    assert_eq!(e.code, Some(7), "{e}");
    assert!(e.details.contains("metadata.mode is \"off\""), "{e}");
}
