//! Unit tests of `natguard metrics`: the Prometheus text read back with the tests' strict parser
//! (tests/common/exposition.rs, whose own tests are in tests/counters.rs).

use super::exposition::*;
use super::tests::{fam, node, without_per_pod_counters};
use super::*;
use std::collections::HashSet;

pub(super) fn family<'a>(metrics: &'a [Metric], name: &str) -> &'a Metric {
    metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no metric {name}"))
}

pub(super) fn value_of(m: &Metric, pairs: &[(&str, &str)]) -> f64 {
    let want = labels(pairs);
    m.samples
        .iter()
        .find(|s| s.labels == want)
        .unwrap_or_else(|| panic!("{}: no series {pairs:?}", m.name))
        .value
}

// -----------------------------------------------------------------------------------------
// Metrics

const ALWAYS: [(&str, &str); 13] = [
    ("natguard_up", "gauge"),
    ("natguard_guarded", "gauge"),
    ("natguard_per_pod_counters_available", "gauge"),
    ("natguard_networks", "gauge"),
    ("natguard_broken_lists", "gauge"),
    ("natguard_unenforced_pods", "gauge"),
    ("natguard_pods", "gauge"),
    ("natguard_proxied_connections_total", "counter"),
    ("natguard_reset_attempts_total", "counter"),
    ("natguard_masqueraded_connections_total", "counter"),
    ("natguard_kept_source_connections_total", "counter"),
    ("natguard_logged_attempts_total", "counter"),
    ("natguard_guard_reset_attempts_total", "counter"),
];
const PER_POD: [(&str, &str); 2] = [
    ("natguard_pod_reset_attempts_total", "counter"),
    ("natguard_pod_proxied_connections_total", "counter"),
];

#[test]
fn metrics_parse_strictly_with_every_family() {
    let text = render_prometheus(&node());
    assert!(text.ends_with('\n'));
    let metrics = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let got: Vec<(&str, &str)> = metrics
        .iter()
        .map(|m| (m.name.as_str(), m.kind.as_deref().unwrap()))
        .collect();
    let want: Vec<(&str, &str)> = ALWAYS.iter().chain(&PER_POD).copied().collect();
    assert_eq!(got, want);
    for m in &metrics {
        assert!(
            m.help.as_deref().is_some_and(|h| !h.is_empty()),
            "{}",
            m.name
        );
    }
    assert_eq!(value_of(family(&metrics, "natguard_up"), &[]), 1.0);
    // The kernel answering is not natguard guarding: each has its own gauge.
    let mut unguarded = node();
    unguarded.installation = Some(Installation::NoTable);
    let of = |r: &NodeReport| {
        let m = parse_exposition(&render_prometheus(r)).unwrap();
        (
            value_of(family(&m, "natguard_up"), &[]),
            value_of(family(&m, "natguard_guarded"), &[]),
        )
    };
    assert_eq!(of(&unguarded), (1.0, 0.0));
    unguarded.installation = Some(Installation::Incomplete {
        missing: vec!["judge4".into()],
    });
    assert_eq!(of(&unguarded), (1.0, 0.0));
    assert_eq!(node().installation, Some(Installation::Guarding));
    assert_eq!(of(&node()), (1.0, 1.0));
    assert_eq!(
        value_of(family(&metrics, "natguard_per_pod_counters_available"), &[]),
        1.0
    );
    assert_eq!(value_of(family(&metrics, "natguard_networks"), &[]), 3.0);
    let pods = family(&metrics, "natguard_pods");
    assert_eq!(value_of(pods, &[("network", "pods")]), 6.0);
    assert_eq!(value_of(pods, &[("network", "empty")]), 0.0);
    let net = |name: &str, network: &str, f: &str| {
        value_of(
            family(&metrics, name),
            &[("network", network), ("family", f)],
        )
    };
    assert_eq!(
        net("natguard_proxied_connections_total", "pods", "ipv4"),
        12.0
    );
    assert_eq!(net("natguard_reset_attempts_total", "pods", "ipv4"), 3.0);
    assert_eq!(net("natguard_reset_attempts_total", "pods", "ipv6"), 1.0);
    assert_eq!(
        net("natguard_masqueraded_connections_total", "pods", "ipv4"),
        400.0
    );
    assert_eq!(
        net("natguard_kept_source_connections_total", "pods", "ipv6"),
        2.0
    );
    // A family the report has no counters for is still a series, at zero.
    assert_eq!(net("natguard_reset_attempts_total", "empty", "ipv6"), 0.0);
    for (name, _) in &ALWAYS[7..12] {
        assert_eq!(family(&metrics, name).samples.len(), 6, "{name}");
    }
    // The node-wide guard's resets, every source included: one series per family.
    let guard = family(&metrics, "natguard_guard_reset_attempts_total");
    assert_eq!(value_of(guard, &[("family", "ipv4")]), 9.0);
    assert_eq!(value_of(guard, &[("family", "ipv6")]), 1.0);
    let miner = [
        ("network", "pods"),
        ("namespace", "team-a"),
        ("pod", "miner"),
        ("container_id", "aaaaaaaaaaaa"),
        ("ifname", "eth0"),
    ];
    assert_eq!(
        value_of(
            family(&metrics, "natguard_pod_reset_attempts_total"),
            &miner
        ),
        3.0
    );
    let anon = [
        ("network", "pods"),
        ("namespace", ""),
        ("pod", ""),
        ("container_id", "a0a0a0a0a0a0"),
        ("ifname", "eth0"),
    ];
    assert_eq!(
        value_of(
            family(&metrics, "natguard_pod_proxied_connections_total"),
            &anon
        ),
        0.0
    );
    assert_eq!(
        family(&metrics, "natguard_pod_reset_attempts_total")
            .samples
            .len(),
        7
    );
}

#[test]
fn metrics_round_trip_nasty_label_values() {
    let r = node();
    let metrics = parse_exposition(&render_prometheus(&r)).unwrap();
    let nasty_net = &r.networks[1];
    let nasty_pod = &nasty_net.pods[0];
    assert_eq!(
        value_of(
            family(&metrics, "natguard_reset_attempts_total"),
            &[("network", &nasty_net.name), ("family", "ipv4")]
        ),
        5.0
    );
    assert_eq!(
        value_of(
            family(&metrics, "natguard_pod_reset_attempts_total"),
            &[
                ("network", &nasty_net.name),
                ("namespace", nasty_pod.namespace.as_deref().unwrap()),
                ("pod", nasty_pod.name.as_deref().unwrap()),
                ("container_id", short_id(&nasty_pod.container_id)),
                ("ifname", "eth0"),
            ]
        ),
        5.0
    );
    // Every label value of every series comes back exactly as one of the report's strings.
    let mut known: HashSet<String> = ["ipv4", "ipv6", "eth0", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for net in &r.networks {
        known.insert(net.name.clone());
        for p in &net.pods {
            known.extend(p.namespace.clone());
            known.extend(p.name.clone());
            known.insert(short_id(&p.container_id).to_string());
        }
    }
    for m in &metrics {
        for s in &m.samples {
            for (l, v) in &s.labels {
                assert!(known.contains(v), "{}: {l}={v:?}", m.name);
            }
        }
    }
    let raw = render_prometheus(&r);
    assert!(
        raw.contains("network=\"a\\\"b\\\\c\\nd \u{e9}\u{1F512}\""),
        "{raw}"
    );
}

#[test]
fn metrics_without_per_pod_counters_leave_the_pod_families_out() {
    let mut r = without_per_pod_counters(node());
    r.ready = false;
    let text = render_prometheus(&r);
    let metrics = parse_exposition(&text).unwrap();
    let got: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
    let want: Vec<&str> = ALWAYS.iter().map(|(n, _)| *n).collect();
    assert_eq!(got, want);
    assert!(!text.contains("natguard_pod_"));
    assert_eq!(value_of(family(&metrics, "natguard_up"), &[]), 0.0);
    assert_eq!(
        value_of(family(&metrics, "natguard_per_pod_counters_available"), &[]),
        0.0
    );
    // Pod counts and per-network counters do not depend on per-pod counters.
    assert_eq!(
        value_of(family(&metrics, "natguard_pods"), &[("network", "pods")]),
        6.0
    );
    let mut with = node();
    with.ready = false;
    let with = render_prometheus(&with);
    assert!(with.starts_with(&text.replace(
        "natguard_per_pod_counters_available 0",
        "natguard_per_pod_counters_available 1"
    )));
}

#[test]
fn metrics_are_deterministic_and_never_repeat_a_series() {
    let r = node();
    let mut shuffled = r.clone();
    shuffled.networks.reverse();
    for net in &mut shuffled.networks {
        net.pods.reverse();
        net.families.reverse();
    }
    assert_eq!(render_prometheus(&r), render_prometheus(&shuffled));
    assert_eq!(render_text(&r), render_text(&shuffled));
    assert_eq!(render_json(&r), render_json(&shuffled));

    // The same attachment twice, and a family given twice, are added up, not repeated.
    let mut twice = r.clone();
    let web = twice.networks[0].pods[0].clone();
    twice.networks[0].pods.push(web);
    twice.networks[0].families.push(fam(Family::V4, 1, 1, 1, 1));
    let metrics = parse_exposition(&render_prometheus(&twice)).unwrap();
    let web = [
        ("network", "pods"),
        ("namespace", "default"),
        ("pod", "web"),
        ("container_id", "0123456789ab"),
        ("ifname", "eth0"),
    ];
    assert_eq!(
        value_of(
            family(&metrics, "natguard_pod_proxied_connections_total"),
            &web
        ),
        18.0
    );
    assert_eq!(
        value_of(
            family(&metrics, "natguard_reset_attempts_total"),
            &[("network", "pods"), ("family", "ipv4")]
        ),
        4.0
    );
}

#[test]
fn metrics_of_an_empty_node() {
    let text = render_prometheus(&NodeReport::default());
    let metrics = parse_exposition(&text).unwrap();
    assert_eq!(metrics.len(), ALWAYS.len());
    assert_eq!(value_of(family(&metrics, "natguard_networks"), &[]), 0.0);
    assert!(family(&metrics, "natguard_pods").samples.is_empty());
    assert!(text.starts_with(
        "# HELP natguard_up 1 if nf_tables and conntrack netlink answer on this node, else \
         0.\n# TYPE natguard_up gauge\nnatguard_up 0\n"
    ));
}

#[test]
fn short_ids_cut_at_characters() {
    assert_eq!(short_id("0123456789abcdef"), "0123456789ab");
    assert_eq!(short_id("abc"), "abc");
    assert_eq!(
        short_id("\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}"),
        "\u{e9}".repeat(12)
    );
}

#[test]
fn repairs_are_exported_only_where_a_watcher_repairs() {
    let text = render_prometheus(&node());
    assert!(!text.contains("natguard_repair"), "{text}");
    let mut r = node();
    r.self_repair = Some(RepairStats {
        pid: 42,
        repairs: 3,
        checks: 5,
        last_repair: Some(1_700_000_000.75),
        last_repair_ms: Some(21.5),
        last_cause: Some("nft (pid 9) changed 4 object(s) of natguard's tables".into()),
        updated: Some(1_700_000_100.5),
        ..RepairStats::default()
    });
    let text = render_prometheus(&r);
    parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for line in [
        "# TYPE natguard_repairs_total counter",
        "natguard_repairs_total 3",
        "natguard_repair_checks_total 5",
        "# TYPE natguard_last_repair_timestamp_seconds gauge",
        "natguard_last_repair_timestamp_seconds 1700000000",
        "# TYPE natguard_self_repair_heartbeat_timestamp_seconds gauge",
        "natguard_self_repair_heartbeat_timestamp_seconds 1700000100",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
    }
    // A watcher that has not repaired yet: counters at 0, no timestamp.
    r.self_repair = Some(RepairStats {
        pid: 42,
        ..RepairStats::default()
    });
    let text = render_prometheus(&r);
    assert!(
        text.lines().any(|l| l == "natguard_repairs_total 0"),
        "{text}"
    );
    assert!(
        !text.contains("natguard_last_repair_timestamp_seconds"),
        "{text}"
    );
    let status = render_text(&r);
    assert!(
        status.contains("self-repair (install --watch, pid 42): 0 repair(s) in 0 check(s)"),
        "{status}"
    );
    assert_eq!(render_json(&r)["selfRepair"]["repairs"], 0);
    assert!(render_json(&node())["selfRepair"].is_null());
}

#[test]
fn the_scrape_leaves_pod_identities_out_unless_asked() {
    let text = render_prometheus(&node());
    let hidden = render_prometheus_with(&node(), PodSeries::Hidden);
    assert!(text.contains("natguard_pod_"));
    assert!(
        !hidden.contains("natguard_pod_") && !hidden.contains("namespace="),
        "{hidden}"
    );
    parse_exposition(&hidden).unwrap_or_else(|e| panic!("{e}\n{hidden}"));
    assert_eq!(render_prometheus_with(&node(), PodSeries::Shown), text);
}

#[test]
fn the_proxy_is_exported_only_where_a_watcher_serves_it() {
    assert!(!render_prometheus(&node()).contains("natguard_proxy"));
    let mut r = node();
    r.proxy = Some(ProxyRecord {
        pid: 7,
        serving: vec!["10.0.0.1:8181".parse().unwrap()],
        cloud: "aws (metadata.proxyCloud)".into(),
        served: 5,
        concealed: 2,
        refused: 1,
        upstream_error: 0,
        running: Some(true),
    });
    let text = render_prometheus(&r);
    parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for line in [
        "natguard_proxy_requests_total{result=\"served\"} 5",
        "natguard_proxy_requests_total{result=\"concealed\"} 2",
        "natguard_proxy_requests_total{result=\"refused\"} 1",
        "natguard_proxy_requests_total{result=\"upstream_error\"} 0",
        "natguard_proxy_serving 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
    }
    let status = render_text(&r);
    assert!(
        status.contains("metadata proxy (pid 7): serving aws (metadata.proxyCloud) on 10.0.0.1:8181: 5 served, 2 concealed, 1 refused, 0 upstream error(s)"),
        "{status}"
    );
    let j = render_json(&r);
    assert_eq!(j["proxy"]["serving"], true);
    assert_eq!(j["proxy"]["requests"]["concealed"], 2);
    assert!(render_json(&node())["proxy"].is_null());
}
