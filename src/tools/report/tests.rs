//! Unit tests of the report: the text, the JSON shape, and the Prometheus output read back
//! with a strict parser.

use super::exposition::parse_exposition;
use super::metrics_tests::{family, value_of};
use super::*;

// -----------------------------------------------------------------------------------------
// Reports

pub(super) fn fam(
    family: Family,
    proxied: u64,
    reset: u64,
    masq: u64,
    kept: u64,
) -> FamilyCounters {
    FamilyCounters {
        family,
        proxied,
        reset,
        masqueraded: masq,
        kept_source: kept,
        logged: 0,
    }
}

fn pod(ns: &str, name: &str, cid: &str, addrs: &[&str], reset: u64, proxied: u64) -> PodReport {
    PodReport {
        namespace: Some(ns.to_string()),
        name: Some(name.to_string()),
        container_id: cid.to_string(),
        ifname: "eth0".to_string(),
        interface: Some(format!("veth{}", &cid[..4.min(cid.len())])),
        addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        exempt: false,
        policy: String::new(),
        policy_source: String::new(),
        proxied: Some(proxied),
        reset: Some(reset),
    }
}

/// Three networks given out of name order; pods out of display order; a pod with no name;
/// nasty strings in every label value.
pub(super) fn node() -> NodeReport {
    let mut creds = pod(
        "kube-system",
        "creds",
        "5e5e5e5e5e5e",
        &["10.244.0.3"],
        0,
        0,
    );
    creds.exempt = true;
    let mut anon = pod("x", "y", "a0a0a0a0a0a0", &[], 0, 0);
    anon.namespace = None;
    anon.name = None;
    anon.interface = None;
    NodeReport {
        broken_lists: Vec::new(),
        ready: true,
        not_ready_reason: None,
        per_pod_counters: true,
        unreadable: false,
        unenforced: Vec::new(),
        guard: vec![(Family::V4, 9, 2), (Family::V6, 1, 0)],
        self_repair: None,
        proxy: None,
        installation: Some(Installation::Guarding),
        exempt_veths: Some(2),
        networks: vec![
            NetworkReport {
                name: "pods".to_string(),
                mode: "proxy".to_string(),
                fingerprint: "cb1f5ff0b7e79f45".to_string(),
                log_denied: true,
                metadata_addresses: vec![
                    "169.254.169.254".parse().unwrap(),
                    "fd00:ec2::254".parse().unwrap(),
                ],
                metadata_ports: vec![80],
                interfaces: vec![("cni0".to_string(), 6)],
                families: vec![
                    FamilyCounters {
                        logged: 4,
                        ..fam(Family::V6, 4, 1, 30, 2)
                    },
                    fam(Family::V4, 12, 3, 400, 70),
                ],
                pods: vec![
                    pod(
                        "default",
                        "web",
                        "0123456789abcdef",
                        &["10.244.0.2", "fd00::2"],
                        0,
                        9,
                    ),
                    creds,
                    pod("team-b", "job", "bbbbbbbbbbbb", &["10.244.0.7"], 1, 1),
                    anon,
                    pod(
                        "team-a",
                        "miner",
                        "aaaaaaaaaaaa",
                        &["10.244.0.5", "fd00::5"],
                        3,
                        0,
                    ),
                    pod("team-a", "batch", "abababababab", &["10.244.0.6"], 1, 2),
                ],
            },
            NetworkReport {
                name: "a\"b\\c\nd \u{e9}\u{1F512}".to_string(),
                mode: "deny".to_string(),
                fingerprint: "0000000000000001".to_string(),
                log_denied: false,
                metadata_addresses: vec!["169.254.169.254".parse().unwrap()],
                metadata_ports: vec![80, 8080],
                interfaces: vec![("veth\n1".to_string(), 1)],
                families: vec![fam(Family::V4, 0, 5, 1, 1)],
                pods: vec![pod(
                    "ns\"q\\",
                    "p\nod-\u{65e5}\u{672c}",
                    "c\"id\\\n0000000",
                    &["192.168.1.9"],
                    5,
                    0,
                )],
            },
            NetworkReport {
                name: "empty".to_string(),
                mode: "off".to_string(),
                fingerprint: "ffffffffffffffff".to_string(),
                log_denied: false,
                families: vec![],
                pods: vec![],
                ..NetworkReport::default()
            },
        ],
    }
}

pub(super) fn without_per_pod_counters(mut r: NodeReport) -> NodeReport {
    r.per_pod_counters = false;
    for net in &mut r.networks {
        for p in &mut net.pods {
            p.proxied = None;
            p.reset = None;
        }
    }
    r
}

const UNAVAILABLE: &str = "per-pod counters: unavailable on this kernel (needs 5.11 or later \
                           for set-element counters); per-network counters are complete";

// -----------------------------------------------------------------------------------------
// Text

fn section<'a>(text: &'a str, network_line_start: &str) -> &'a str {
    let start = text
        .find(&format!("\nnetwork {network_line_start}"))
        .unwrap();
    let rest = &text[start + 1..];
    let end = rest.find("\n\nnetwork ").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

fn pod_lines(section: &str) -> Vec<&str> {
    section.lines().filter(|l| l.starts_with("    ")).collect()
}

#[test]
fn text_lists_pods_with_resets_first() {
    let text = render_text(&node());
    let pods = pod_lines(section(&text, "pods:"));
    let order: Vec<&str> = pods
        .iter()
        .map(|l| l.trim_start().split(' ').next().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "team-a/miner",
            "team-a/batch",
            "team-b/job",
            "default/web",
            "kube-system/creds",
            "(pod",
        ],
        "{text}"
    );
    assert_eq!(
        pods[0],
        "    team-a/miner 10.244.0.5, fd00::5 via vethaaaa [cid=aaaaaaaaaaaa if=eth0]: 3 \
         attempt(s) to reach the real metadata API reset, 0 connection(s) sent to the proxy"
    );
    assert!(
        pods[3].contains("[cid=0123456789ab if=eth0]"),
        "{}",
        pods[3]
    );
    assert!(pods[4].contains(" metadata-exempt:"), "{}", pods[4]);
    assert!(pods[5].contains("(no addresses recorded)"), "{}", pods[5]);
    assert!(!pods[5].contains(" via "), "{}", pods[5]);
    assert!(
        text.contains("  pods: 6 (3 with reset attempts)\n"),
        "{text}"
    );
}

#[test]
fn text_first_line_networks_and_family_counters() {
    let text = render_text(&node());
    assert_eq!(
        text.lines().next().unwrap(),
        "natguard: guarding (the node-wide metadata guard is in place; nf_tables and conntrack netlink answer), 3 network(s)"
    );
    assert!(!text.contains("per-pod counters: unavailable"), "{text}");
    let pods = section(&text, "pods:");
    assert!(pods.starts_with(
        "network pods: mode proxy (metadata TCP goes to the node-local proxy; what bypasses \
         it is reset), policy fingerprint cb1f5ff0b7e79f45\n"
    ));
    assert!(pods.contains(
        "\n  ipv4: 12 connection(s) sent to the proxy, 3 attempt(s) to reach the real \
         metadata API reset, 400 connection(s) masqueraded, 70 connection(s) kept the pod's \
         source address, 0 denied attempt(s) logged\n  ipv6: 4 connection(s) sent to the \
         proxy, 1 attempt(s)"
    ));
    assert!(
        pods.contains("source address, 4 denied attempt(s) logged\n"),
        "{pods}"
    );
    assert!(pods.contains(
        "\n  metadata destinations: 169.254.169.254, fd00:ec2::254; TCP port(s): 80\n  pod interfaces: \
         cni0 (6 pod(s))\n"
    ));
    let empty = section(&text, "empty:");
    assert!(empty.contains("\n  ipv6: 0 connection(s) sent to the proxy, 0 attempt(s)"));
    assert!(empty.contains("\n  pods: none\n"));
    // Mode off matches no metadata destination, and nothing is logged.
    assert!(
        !empty.contains("  metadata destinations:")
            && !empty.contains("pod interfaces")
            && !empty.contains("denied attempt(s) logged"),
        "{empty}"
    );
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("network "))
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(names, ["a\"b\\c\\nd \u{e9}\u{1F512}", "empty", "pods"]);
}

#[test]
fn text_escapes_control_characters_in_names() {
    let text = render_text(&node());
    let nasty = section(&text, "a\"b");
    let lines = pod_lines(nasty);
    assert_eq!(lines.len(), 1, "{nasty}");
    assert!(
        lines[0].starts_with("    ns\"q\\/p\\nod-\u{65e5}\u{672c} 192.168.1.9"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("[cid=c\"id\\\\n000000 if=eth0]"),
        "{}",
        lines[0]
    );
    assert!(text.lines().all(|l| !l.starts_with("od-")));
    assert!(nasty.contains(": veth\\n1 (1 pod(s))\n"), "{nasty}");
}

#[test]
fn text_counts_resets_of_no_pod() {
    let mut r = node();
    r.networks[1].families[0].reset = 7;
    let text = render_text(&r);
    let nasty = section(&text, "a\"b");
    assert!(
        nasty.contains(
            "\n  2 reset attempt(s) came from addresses of no pod listed below (an address a \
             pod added itself, a pod started without natguard's ADD, a pod deleted since)\n"
        ),
        "{nasty}"
    );
    // Where the pods account for every reset, and without per-pod counters: no such line.
    assert!(!render_text(&node()).contains("of no pod"));
    assert!(!render_text(&without_per_pod_counters(r)).contains("of no pod"));
}

#[test]
fn text_says_how_many_exempt_veths_mark_their_frames() {
    let line = |r: &NodeReport| render_text(r).lines().nth(1).unwrap_or("").to_string();
    assert!(
        line(&node()).starts_with("exempt veths: 2 "),
        "{}",
        line(&node())
    );
    assert_eq!(render_json(&node())["guard"]["exemptVeths"], 2);
    let none = NodeReport {
        exempt_veths: None,
        ..node()
    };
    assert!(!render_text(&none).contains("exempt veths"));
    assert_eq!(render_json(&none)["guard"]["exemptVeths"], Value::Null);
}

#[test]
fn text_says_once_when_per_pod_counters_are_unavailable() {
    let text = render_text(&without_per_pod_counters(node()));
    assert_eq!(text.matches(UNAVAILABLE).count(), 1, "{text}");
    // After the first line and the exempt veths'.
    assert_eq!(text.lines().nth(2), Some(UNAVAILABLE));
    let pods = pod_lines(section(&text, "pods:"));
    assert!(pods.iter().all(|l| !l.contains("attempt(s)")), "{pods:#?}");
    let order: Vec<&str> = pods
        .iter()
        .map(|l| l.trim_start().split(' ').next().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "default/web",
            "kube-system/creds",
            "team-a/batch",
            "team-a/miner",
            "team-b/job",
            "(pod",
        ]
    );
    assert!(text.contains("  pods: 6\n"));
    // The per-network counters are still shown in full.
    assert!(text.contains("  ipv4: 12 connection(s) sent to the proxy, 3 attempt(s)"));
}

#[test]
fn text_ignores_pod_counters_the_node_says_it_cannot_have() {
    let mut r = node();
    r.per_pod_counters = false;
    let text = render_text(&r);
    assert_eq!(text, render_text(&without_per_pod_counters(node())));
}

#[test]
fn text_explains_the_denied_log() {
    let text = render_text(&node());
    let on = section(&text, "pods:");
    assert!(
        on.contains(&format!("`journalctl -k | grep '{LOG_PREFIX}'`")),
        "{on}"
    );
    assert!(
        on.contains(&format!("`dmesg | grep '{LOG_PREFIX}'`")),
        "{on}"
    );
    assert!(on.contains("SRC= is the pod's address and DST="), "{on}");
    assert!(!on.contains("metadata.logDenied"), "{on}");
    let off = section(&text, "a\"b");
    assert!(off.contains("`metadata.logDenied: true`"), "{off}");
    assert!(!off.contains(LOG_PREFIX), "{off}");
    let mut r = node();
    r.networks[2].log_denied = true;
    let text = render_text(&r);
    let mode_off = section(&text, "empty:");
    assert!(
        mode_off.contains("\n  nothing is denied in mode off, so nothing is logged\n"),
        "{mode_off}"
    );
    assert!(!mode_off.contains(LOG_PREFIX) && !mode_off.contains("logDenied"));
    assert_eq!(LOG_PREFIX, "natguard denied ");
}

#[test]
fn text_not_ready_and_empty() {
    let r = NodeReport {
        broken_lists: Vec::new(),
        ready: false,
        not_ready_reason: Some("conntrack netlink: Operation not permitted".to_string()),
        per_pod_counters: true,
        guard: Vec::new(),
        networks: vec![],
        unreadable: false,
        unenforced: Vec::new(),
        self_repair: None,
        proxy: None,
        installation: None,
        exempt_veths: None,
    };
    assert_eq!(
        render_text(&r),
        "natguard: NOT READY: conntrack netlink: Operation not permitted, 0 network(s)\n\
         no network has natguard rules on this node\n"
    );
    let r = NodeReport {
        ready: false,
        not_ready_reason: Some("read table: EPERM".to_string()),
        unreadable: true,
        self_repair: None,
        proxy: None,
        ..NodeReport::default()
    };
    assert_eq!(
        render_text(&r),
        "natguard: NOT READY: read table: EPERM\nits rules and counters could not be read\n"
    );
    let text = render_prometheus(&r);
    let metrics = parse_exposition(&text).unwrap();
    assert_eq!(value_of(family(&metrics, "natguard_up"), &[]), 0.0);
    assert!(
        family(&metrics, "natguard_networks").samples.is_empty(),
        "{text}"
    );
    assert!(family(&metrics, "natguard_per_pod_counters_available")
        .samples
        .is_empty());
    assert_eq!(render_json(&r)["networks"], json!([]));
    let r = NodeReport::default();
    assert!(render_text(&r).starts_with("natguard: NOT READY: no reason given, 0 network(s)\n"));
}

// -----------------------------------------------------------------------------------------
// JSON

#[test]
fn json_golden() {
    let r = NodeReport {
        broken_lists: Vec::new(),
        ready: true,
        not_ready_reason: None,
        per_pod_counters: true,
        unreadable: false,
        unenforced: Vec::new(),
        guard: Vec::new(),
        self_repair: None,
        proxy: None,
        installation: Some(Installation::Guarding),
        exempt_veths: Some(2),
        networks: vec![NetworkReport {
            name: "demo".to_string(),
            mode: "proxy".to_string(),
            fingerprint: "cb1f5ff0b7e79f45".to_string(),
            log_denied: false,
            metadata_addresses: vec!["169.254.169.254".parse().unwrap()],
            metadata_ports: vec![80],
            interfaces: vec![("cni0".to_string(), 2)],
            families: vec![fam(Family::V4, 12, 3, 40, 7)],
            pods: vec![
                pod(
                    "default",
                    "web",
                    "0123456789abcdef",
                    &["10.244.0.2", "fd00::2"],
                    0,
                    12,
                ),
                PodReport {
                    interface: None,
                    exempt: true,
                    policy: "exempt".into(),
                    policy_source: "namespace".into(),
                    ..pod(
                        "kube-system",
                        "creds",
                        "c0ffee000000",
                        &["10.244.0.3"],
                        3,
                        0,
                    )
                },
            ],
        }],
    };
    let golden = r#"{
  "version": 1,
  "ready": true,
  "notReadyReason": null,
  "perPodCounters": true,
  "installed": true,
  "guarding": true,
  "guard": {
    "families": [],
    "exemptVeths": 2
  },
  "networks": [
    {
      "name": "demo",
      "mode": "proxy",
      "fingerprint": "cb1f5ff0b7e79f45",
      "logDenied": false,
      "metadataAddresses": [
        "169.254.169.254"
      ],
      "metadataPorts": [
        80
      ],
      "podInterfaces": [
        {
          "name": "cni0",
          "pods": 2
        }
      ],
      "families": {
        "ipv4": {
          "proxied": 12,
          "reset": 3,
          "masqueraded": 40,
          "keptSource": 7,
          "logged": 0
        },
        "ipv6": {
          "proxied": 0,
          "reset": 0,
          "masqueraded": 0,
          "keptSource": 0,
          "logged": 0
        }
      },
      "pods": [
        {
          "namespace": "kube-system",
          "name": "creds",
          "containerId": "c0ffee000000",
          "ifname": "eth0",
          "interface": null,
          "addresses": [
            "10.244.0.3"
          ],
          "exempt": true,
          "policy": "exempt",
          "policySource": "namespace",
          "proxied": 0,
          "reset": 3
        },
        {
          "namespace": "default",
          "name": "web",
          "containerId": "0123456789ab",
          "ifname": "eth0",
          "interface": "veth0123",
          "addresses": [
            "10.244.0.2",
            "fd00::2"
          ],
          "exempt": false,
          "policy": "",
          "policySource": "",
          "proxied": 12,
          "reset": 0
        }
      ]
    }
  ]
}"#;
    assert_eq!(
        serde_json::to_string_pretty(&render_json(&r)).unwrap(),
        golden
    );
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Bool,
    Uint,
    Str,
    StrOrNull,
    UintOrNull,
}

fn check(v: &Value, kind: Kind, at: &str) {
    let ok = match kind {
        Kind::Bool => v.is_boolean(),
        Kind::Uint => v.is_u64(),
        Kind::Str => v.is_string(),
        Kind::StrOrNull => v.is_string() || v.is_null(),
        Kind::UintOrNull => v.is_u64() || v.is_null(),
    };
    assert!(ok, "{at}: {v} is not {kind:?}");
}

fn object<'a>(v: &'a Value, keys: &[&str], at: &str) -> &'a serde_json::Map<String, Value> {
    let m = v
        .as_object()
        .unwrap_or_else(|| panic!("{at}: not an object"));
    let got: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(got, keys, "{at}: keys");
    m
}

fn check_shape(doc: &Value) {
    let top = object(
        doc,
        &[
            "version",
            "ready",
            "notReadyReason",
            "perPodCounters",
            "installed",
            "guarding",
            "guard",
            "networks",
        ],
        "$",
    );
    object(&top["guard"], &["families", "exemptVeths"], "$.guard");
    check(
        &top["guard"]["exemptVeths"],
        Kind::UintOrNull,
        "$.guard.exemptVeths",
    );
    assert_eq!(top["version"], 1);
    check(&top["ready"], Kind::Bool, "$.ready");
    check(&top["notReadyReason"], Kind::StrOrNull, "$.notReadyReason");
    check(&top["perPodCounters"], Kind::Bool, "$.perPodCounters");
    let per_pod = top["perPodCounters"].as_bool().unwrap();
    for (i, net) in top["networks"].as_array().unwrap().iter().enumerate() {
        let at = format!("$.networks[{i}]");
        let n = object(
            net,
            &[
                "name",
                "mode",
                "fingerprint",
                "logDenied",
                "metadataAddresses",
                "metadataPorts",
                "podInterfaces",
                "families",
                "pods",
            ],
            &at,
        );
        check(&n["name"], Kind::Str, &at);
        check(&n["mode"], Kind::Str, &at);
        check(&n["fingerprint"], Kind::Str, &at);
        check(&n["logDenied"], Kind::Bool, &at);
        let fams = object(&n["families"], &["ipv4", "ipv6"], &at);
        for (f, c) in fams {
            let at = format!("{at}.families.{f}");
            let c = object(
                c,
                &["proxied", "reset", "masqueraded", "keptSource", "logged"],
                &at,
            );
            c.values().for_each(|v| check(v, Kind::Uint, &at));
        }
        for (j, p) in n["pods"].as_array().unwrap().iter().enumerate() {
            let at = format!("{at}.pods[{j}]");
            let keys = [
                "namespace",
                "name",
                "containerId",
                "ifname",
                "interface",
                "addresses",
                "exempt",
                "policy",
                "policySource",
                "proxied",
                "reset",
            ];
            let p = object(p, &keys, &at);
            let kinds = [
                Kind::StrOrNull,
                Kind::StrOrNull,
                Kind::Str,
                Kind::Str,
                Kind::StrOrNull,
                Kind::Str, // checked below
                Kind::Bool,
                Kind::Str,
                Kind::Str,
                Kind::UintOrNull,
                Kind::UintOrNull,
            ];
            for (k, kind) in keys.iter().zip(kinds) {
                if *k == "addresses" {
                    for a in p[*k].as_array().unwrap() {
                        let s = a.as_str().unwrap();
                        assert!(s.parse::<IpAddr>().is_ok(), "{at}: {s}");
                    }
                } else {
                    check(&p[*k], kind, &format!("{at}.{k}"));
                }
            }
            if !per_pod {
                assert!(p["proxied"].is_null() && p["reset"].is_null(), "{at}");
            }
        }
    }
}

#[test]
fn json_shape_with_and_without_per_pod_counters() {
    let with = render_json(&node());
    check_shape(&with);
    assert_eq!(with["networks"][2]["pods"][0]["reset"], 3);
    let mut r = without_per_pod_counters(node());
    r.ready = false;
    r.not_ready_reason = Some("nf_tables: Operation not permitted".to_string());
    let without = render_json(&r);
    check_shape(&without);
    assert_eq!(without["ready"], false);
    assert_eq!(
        without["notReadyReason"],
        "nf_tables: Operation not permitted"
    );
    assert_eq!(without["perPodCounters"], false);
    assert!(without["networks"][2]["pods"][0]["reset"].is_null());
    // Counters the node says it cannot have are null even if the report carries numbers.
    let mut r = node();
    r.per_pod_counters = false;
    assert_eq!(render_json(&r), without_json_ready(&without));
}

fn without_json_ready(v: &Value) -> Value {
    let mut v = v.clone();
    v["ready"] = Value::Bool(true);
    v["notReadyReason"] = Value::Null;
    v
}

#[test]
fn json_keeps_the_text_order_and_raw_strings() {
    let r = node();
    let doc = render_json(&r);
    let text = render_text(&r);
    let nets = doc["networks"].as_array().unwrap();
    let names: Vec<&str> = nets.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a\"b\\c\nd \u{e9}\u{1F512}", "empty", "pods"]);
    let json_order: Vec<String> = nets[2]["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| match (p["namespace"].as_str(), p["name"].as_str()) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            _ => "(pod".to_string(),
        })
        .collect();
    let text_order: Vec<String> = pod_lines(section(&text, "pods:"))
        .iter()
        .map(|l| l.trim_start().split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(json_order, text_order);
    let nasty = &nets[0]["pods"][0];
    assert_eq!(nasty["name"], "p\nod-\u{65e5}\u{672c}");
    assert_eq!(nasty["containerId"], "c\"id\\\n000000");
    let anon = &nets[2]["pods"][5];
    assert!(anon["namespace"].is_null() && anon["name"].is_null());
    assert!(anon["interface"].is_null());
    assert_eq!(anon["addresses"], json!([]));
    // The document is one line of valid JSON when printed compactly.
    let compact = doc.to_string();
    assert!(!compact.contains('\n'));
    assert_eq!(serde_json::from_str::<Value>(&compact).unwrap(), doc);
}

#[test]
fn each_pod_shows_its_policy_and_where_it_came_from() {
    let mut r = node();
    let net = &mut r.networks[0];
    net.pods[0].policy = "deny".into();
    net.pods[0].policy_source = "annotation".into();
    let text = render_text(&r);
    assert!(
        text.contains(
            "\n      metadata policy: deny (the pod's annotation natguard.io/metadata)\n"
        ),
        "{text}"
    );
}

#[test]
fn kernel_apis_that_answer_are_not_an_installation() {
    let r = NodeReport {
        ready: true,
        per_pod_counters: true,
        installation: Some(Installation::NoTable),
        ..NodeReport::default()
    };
    let text = render_text(&r);
    assert!(
        text.starts_with(
            "natguard: not installed: no natguard table on this node (nf_tables and conntrack \
             netlink answer)\n"
        ),
        "{text}"
    );
    assert!(!text.contains("ready"), "{text}");
    let j = render_json(&r);
    assert_eq!(
        (&j["installed"], &j["guarding"]),
        (&json!(false), &json!(false))
    );
    let r = NodeReport {
        installation: Some(Installation::Incomplete {
            missing: vec!["guard_fwd".into(), "judge6".into()],
        }),
        ..r
    };
    assert!(render_text(&r).starts_with(
        "natguard: NOT GUARDING: table inet natguard lacks the node-wide guard's chain(s) \
         guard_fwd, judge6"
    ));
    assert_eq!(
        (&render_json(&r)["installed"], &render_json(&r)["guarding"]),
        (&json!(true), &json!(false))
    );
    let r = NodeReport {
        installation: Some(Installation::Guarding),
        ..r
    };
    assert!(render_text(&r)
        .starts_with("natguard: guarding (the node-wide metadata guard is in place; nf_tables and conntrack netlink answer), 0 network(s)"));
    assert_eq!(render_json(&r)["guarding"], json!(true));
}

#[test]
fn a_record_of_an_exited_watcher_is_shown_as_gone() {
    let sr = RepairStats {
        pid: 41,
        repairs: 3,
        checks: 9,
        updated: Some(1_796_420_866.0),
        running: Some(false),
        ..RepairStats::default()
    };
    let r = NodeReport {
        ready: true,
        installation: Some(Installation::Guarding),
        self_repair: Some(sr.clone()),
        proxy: None,
        ..NodeReport::default()
    };
    let text = render_text(&r);
    assert!(
        text.contains(
            "self-repair: watcher pid 41 is not running (record from 2026-12-04 21:47:46 UTC): \
             3 repair(s) in 9 check(s)"
        ),
        "{text}"
    );
    assert_eq!(render_json(&r)["selfRepair"]["running"], json!(false));
    let metrics = parse_exposition(&render_prometheus(&r)).unwrap();
    assert_eq!(
        value_of(family(&metrics, "natguard_self_repair_running"), &[]),
        0.0
    );
    assert_eq!(
        value_of(family(&metrics, "natguard_repairs_total"), &[]),
        3.0
    );
    let live = NodeReport {
        self_repair: Some(RepairStats {
            running: Some(true),
            ..sr
        }),
        ..r
    };
    // A running watcher whose heartbeat is old is frozen or wedged: said, not hidden.
    let text = render_text(&live);
    assert!(
        text.contains("self-repair: watcher pid 41 is NOT RESPONDING (its last heartbeat was "),
        "{text}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut fresh = live.clone();
    fresh.self_repair.as_mut().unwrap().updated = Some(now - 5.0);
    assert!(render_text(&fresh).contains("self-repair (install --watch, pid 41): 3 repair(s)"));
    let metrics = parse_exposition(&render_prometheus(&live)).unwrap();
    assert_eq!(
        value_of(family(&metrics, "natguard_self_repair_running"), &[]),
        1.0
    );
}

#[test]
fn pods_steered_around_netfilter_are_named_in_text_json_and_metrics() {
    let plain = node();
    assert!(!render_text(&plain).contains("UNENFORCED"));
    assert!(!render_text(&plain).contains("unenforced"));
    assert_eq!(render_json(&plain).get("unenforced"), None);
    let metrics = parse_exposition(&render_prometheus(&plain)).unwrap();
    assert_eq!(
        value_of(family(&metrics, "natguard_unenforced_pods"), &[]),
        0.0
    );
    let r = NodeReport {
        unenforced: vec![
            Unenforced {
                network: "pods".to_string(),
                namespace: Some("default".to_string()),
                name: Some("web\nUNENFORCED forged".to_string()),
                container_id: "0123456789abcdef".to_string(),
                interface: "veth1a2b".to_string(),
                found: vec![
                    "a bpf filter cil_from_container, direct action on its tc ingress hook"
                        .to_string(),
                    "a u32 filter with a mirred action on its tc egress hook".to_string(),
                ],
            },
            Unenforced {
                network: "pods".to_string(),
                interface: "veth3c4d".to_string(),
                found: vec!["a u32 filter with a mirred action on its tc ingress hook".into()],
                ..Unenforced::default()
            },
        ],
        ..node()
    };
    let text = render_text(&r);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("UNENFORCED "))
        .collect();
    assert_eq!(
        lines,
        [
            "UNENFORCED default/web\\nUNENFORCED forged (veth1a2b) in network pods: a bpf filter \
             cil_from_container, direct action on its tc ingress hook; a u32 filter with a \
             mirred action on its tc egress hook steers its packets around netfilter",
            "UNENFORCED (pod name not recorded) (veth3c4d) in network pods: a u32 filter with a \
             mirred action on its tc ingress hook steers its packets around netfilter",
        ]
    );
    assert!(
        text.contains("unenforced: 2 pod(s) whose host-side interface steers packets around"),
        "{text}"
    );
    let doc = render_json(&r);
    assert_eq!(
        doc["unenforced"][0],
        json!({
            "pod": "default/web\nUNENFORCED forged",
            "network": "pods",
            "containerId": "0123456789ab",
            "interface": "veth1a2b",
            "found": [
                "a bpf filter cil_from_container, direct action on its tc ingress hook",
                "a u32 filter with a mirred action on its tc egress hook",
            ],
        })
    );
    assert_eq!(doc["unenforced"][1]["pod"], Value::Null);
    let metrics = parse_exposition(&render_prometheus(&r)).unwrap();
    assert_eq!(
        value_of(family(&metrics, "natguard_unenforced_pods"), &[]),
        2.0
    );
}
