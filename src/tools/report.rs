//! What natguard stopped on this node, for people and for monitoring: the presentation of a
//! [`NodeReport`] as `natguard status` text, as `natguard status --json`, and as Prometheus text
//! exposition for `natguard metrics` and the node_exporter textfile collector.
//!
//! The report is filled elsewhere, from the kernel's rule and set-element counters; this module
//! only renders it and does no I/O, so every output is unit-tested from hand-built reports.
//! All three outputs are deterministic for a given report. Networks are shown in name order.
//! The text and the JSON list a network's pods with the ones that had metadata attempts reset
//! first, because those are what an operator looks for. The metrics list series in label order,
//! so successive scrapes diff cleanly.
//!
//! Both address families are always shown, with zeros where the report has no counters for one:
//! natguard's rules exist for both families, so a series that appears later would hide its first
//! increase from `increase()`. Per-pod counters need set-element counters (Linux 5.11 or later).
//! Without them the report says so once, the JSON has `null` for each pod's counters and the
//! per-pod metric families are left out, while the per-network counters stay complete.
//!
//! Pod names, namespaces and container IDs are what the runtime passed (CNI_ARGS,
//! CNI_CONTAINERID), so they are not trusted to be printable: the text escapes control characters (a newline in a
//! name cannot forge a line), the metrics escape label values as the exposition format requires,
//! and the JSON is escaped by serde.

use crate::plan::{Family, LOG_PREFIX};
use serde_json::{json, Value};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

/// The `version` of the `status --json` document; bumped only when a key changes meaning or goes.
pub(crate) const JSON_VERSION: u64 = 1;
/// Container IDs are shown by their first 12 characters, as `docker ps` and `crictl ps` do.
const SHORT_ID_LEN: usize = 12;

/// One node's natguard state and counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeReport {
    /// nf_tables and conntrack netlink answer.
    pub ready: bool,
    pub not_ready_reason: Option<String>,
    /// false on kernels without set-element counters (5.10 and earlier).
    pub per_pod_counters: bool,
    pub networks: Vec<NetworkReport>,
    /// natguard's state could not be read at all (`not_ready_reason` says why): the report
    /// knows nothing about networks or counters, and says nothing about them.
    pub unreadable: bool,
}

/// One CNI network with natguard rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NetworkReport {
    pub name: String,
    /// "proxy" | "deny" | "off" | "unknown"
    pub mode: String,
    pub fingerprint: String,
    pub log_denied: bool,
    /// The metadata destinations and ports the rules match (empty in mode off).
    pub metadata_addresses: Vec<IpAddr>,
    pub metadata_ports: Vec<u16>,
    /// Host-side interfaces the network's pods' packets enter through, with how many pods sit
    /// behind each: metadata TCP from these fails closed.
    pub interfaces: Vec<(String, u32)>,
    /// At most one entry per family is expected; several are added up.
    pub families: Vec<FamilyCounters>,
    pub pods: Vec<PodReport>,
}

/// A network's counters for one address family.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FamilyCounters {
    pub family: Family,
    /// Connections DNATed to the proxy.
    pub proxied: u64,
    /// Metadata attempts reset (fail-closed), in packets.
    pub reset: u64,
    /// Connections masqueraded.
    pub masqueraded: u64,
    /// Connections that kept the pod's source address (non-masquerade destinations).
    pub kept_source: u64,
    /// Denied attempts written to the kernel log (`metadata.logDenied`, rate-limited), in
    /// packets.
    pub logged: u64,
}

/// One pod attachment (container ID, ifname) in a network.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PodReport {
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The first 12 characters; longer IDs are cut when rendered.
    pub container_id: String,
    pub ifname: String,
    /// The host-side interface.
    pub interface: Option<String>,
    pub addrs: Vec<IpAddr>,
    pub exempt: bool,
    /// None when per-pod counters are unavailable.
    pub proxied: Option<u64>,
    pub reset: Option<u64>,
}

/// A network's counters for one family, added up over the report's entries for it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    proxied: u64,
    reset: u64,
    masqueraded: u64,
    kept_source: u64,
    logged: u64,
}

fn family_label(f: Family) -> &'static str {
    match f {
        Family::V4 => "ipv4",
        Family::V6 => "ipv6",
    }
}

/// Both families, in `Family::ALL` order, zero where the report has nothing.
fn family_totals(net: &NetworkReport) -> [(Family, Totals); 2] {
    Family::ALL.map(|f| {
        let mut t = Totals::default();
        for c in net.families.iter().filter(|c| c.family == f) {
            t.proxied = t.proxied.saturating_add(c.proxied);
            t.reset = t.reset.saturating_add(c.reset);
            t.masqueraded = t.masqueraded.saturating_add(c.masqueraded);
            t.kept_source = t.kept_source.saturating_add(c.kept_source);
            t.logged = t.logged.saturating_add(c.logged);
        }
        (f, t)
    })
}

fn networks_by_name(r: &NodeReport) -> Vec<&NetworkReport> {
    let mut nets: Vec<&NetworkReport> = r.networks.iter().collect();
    nets.sort_by(|a, b| a.name.cmp(&b.name));
    nets
}

fn short_id(id: &str) -> &str {
    id.char_indices()
        .nth(SHORT_ID_LEN)
        .map_or(id, |(at, _)| &id[..at])
}

/// A pod counter as the report can vouch for it: none at all without per-pod counters.
fn pod_counter(r: &NodeReport, v: Option<u64>) -> Option<u64> {
    v.filter(|_| r.per_pod_counters)
}

/// Sorts by namespace, name, container ID, ifname; pods with no recorded name go last.
fn identity(p: &PodReport) -> impl Ord + '_ {
    (
        p.namespace.is_none(),
        p.namespace.as_deref(),
        p.name.is_none(),
        p.name.as_deref(),
        short_id(&p.container_id),
        p.ifname.as_str(),
    )
}

/// The order of the text and the JSON: reset attempts first, most first, then by identity.
fn pods_for_display<'a>(r: &NodeReport, net: &'a NetworkReport) -> Vec<&'a PodReport> {
    let mut pods: Vec<&PodReport> = net.pods.iter().collect();
    pods.sort_by(|a, b| {
        let resets = |p: &PodReport| Reverse(pod_counter(r, p.reset).unwrap_or(0));
        resets(a)
            .cmp(&resets(b))
            .then_with(|| identity(a).cmp(&identity(b)))
    });
    pods
}

// ---------------------------------------------------------------------------------------------
// natguard status

/// Control characters as escapes, so a name from CNI_ARGS cannot break or forge a line.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn who(p: &PodReport) -> String {
    match (p.namespace.as_deref(), p.name.as_deref()) {
        (None, None) => "(pod name not recorded)".to_string(),
        (ns, name) => format!(
            "{}/{}",
            printable(ns.unwrap_or("?")),
            printable(name.unwrap_or("?"))
        ),
    }
}

fn list_or_none(items: Vec<String>) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

fn mode_in_words(mode: &str) -> &'static str {
    match mode {
        "proxy" => "metadata TCP goes to the node-local proxy; what bypasses it is reset",
        "deny" => "metadata TCP is reset",
        "off" => "metadata traffic is left alone",
        _ => "the metadata policy could not be read from the rules",
    }
}

fn write_log_hint(out: &mut String, net: &NetworkReport) {
    if net.mode == "off" {
        let _ = writeln!(out, "  nothing is denied in mode off, so nothing is logged");
    } else if net.log_denied {
        let _ = writeln!(
            out,
            "  denied attempts are logged to the kernel log: `journalctl -k | grep '{LOG_PREFIX}'` \
             or `dmesg | grep '{LOG_PREFIX}'`; in each line SRC= is the pod's address and DST= \
             the metadata address it tried"
        );
    } else {
        let _ = writeln!(
            out,
            "  denied attempts are not logged; `metadata.logDenied: true` in this network's \
             natguard config logs each one to the kernel log"
        );
    }
}

fn write_pod(out: &mut String, r: &NodeReport, p: &PodReport) {
    let mut line = format!("    {}", who(p));
    if p.addrs.is_empty() {
        line.push_str(" (no addresses recorded)");
    } else {
        let addrs: Vec<String> = p.addrs.iter().map(|a| a.to_string()).collect();
        let _ = write!(line, " {}", addrs.join(", "));
    }
    if let Some(iface) = &p.interface {
        let _ = write!(line, " via {}", printable(iface));
    }
    let _ = write!(
        line,
        " [cid={} if={}]",
        printable(short_id(&p.container_id)),
        printable(&p.ifname)
    );
    if p.exempt {
        line.push_str(" metadata-exempt");
    }
    if r.per_pod_counters {
        let reset = pod_counter(r, p.reset).map_or("?".to_string(), |n| n.to_string());
        let proxied = pod_counter(r, p.proxied).map_or("?".to_string(), |n| n.to_string());
        let _ = write!(
            line,
            ": {reset} attempt(s) to reach the real metadata API reset, \
             {proxied} connection(s) sent to the proxy"
        );
    }
    let _ = writeln!(out, "{line}");
}

/// `natguard status`: the report in plain words.
pub(crate) fn render_text(r: &NodeReport) -> String {
    let mut out = String::new();
    let readiness = if r.ready {
        "ready (nf_tables and conntrack netlink answer)".to_string()
    } else {
        format!(
            "NOT READY: {}",
            printable(r.not_ready_reason.as_deref().unwrap_or("no reason given"))
        )
    };
    if r.unreadable {
        let _ = writeln!(
            out,
            "natguard: {readiness}
its rules and counters could not be read"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "natguard: {readiness}, {} network(s)",
        r.networks.len()
    );
    // Without networks there is nothing the kernel could have counted per pod.
    if !r.per_pod_counters && !r.networks.is_empty() {
        let _ = writeln!(
            out,
            "per-pod counters: unavailable on this kernel (needs 5.11 or later for set-element \
             counters); per-network counters are complete"
        );
    }
    if r.networks.is_empty() {
        let _ = writeln!(out, "no network has natguard rules on this node");
    }
    for net in networks_by_name(r) {
        let _ = writeln!(
            out,
            "\nnetwork {}: mode {} ({}), policy fingerprint {}",
            printable(&net.name),
            printable(&net.mode),
            mode_in_words(&net.mode),
            printable(&net.fingerprint)
        );
        if net.mode != "off" {
            let addrs: Vec<String> = net
                .metadata_addresses
                .iter()
                .map(|a| a.to_string())
                .collect();
            let ports: Vec<String> = net.metadata_ports.iter().map(|p| p.to_string()).collect();
            let _ = writeln!(
                out,
                "  metadata destinations: {}; TCP port(s): {}",
                list_or_none(addrs),
                list_or_none(ports)
            );
            let ifaces: Vec<String> = net
                .interfaces
                .iter()
                .map(|(i, n)| format!("{} ({n} pod(s))", printable(i)))
                .collect();
            let _ = writeln!(
                out,
                "  pod interfaces (metadata fails closed from these): {}",
                list_or_none(ifaces)
            );
        }
        for (f, t) in family_totals(net) {
            let mut line = format!(
                "  {}: {} connection(s) sent to the proxy, {} attempt(s) to reach the real \
                 metadata API reset, {} connection(s) masqueraded, {} connection(s) kept the \
                 pod's source address",
                family_label(f),
                t.proxied,
                t.reset,
                t.masqueraded,
                t.kept_source
            );
            if net.log_denied {
                let _ = write!(line, ", {} denied attempt(s) logged", t.logged);
            }
            let _ = writeln!(out, "{line}");
        }
        write_log_hint(&mut out, net);
        if r.per_pod_counters {
            // The rules count every reset; the pods' elements only those from their own
            // addresses.
            let total: u64 = family_totals(net).iter().map(|(_, t)| t.reset).sum();
            let of_pods: u64 = net.pods.iter().filter_map(|p| p.reset).sum();
            let others = total.saturating_sub(of_pods);
            if others > 0 {
                let _ = writeln!(
                    out,
                    "  {others} reset attempt(s) came from addresses of no pod listed below (an \
                     address a pod added itself, a pod started without natguard's ADD, a pod \
                     deleted since)"
                );
            }
        }
        let pods = pods_for_display(r, net);
        let with_resets = pods
            .iter()
            .filter(|p| pod_counter(r, p.reset).unwrap_or(0) > 0)
            .count();
        if pods.is_empty() {
            let _ = writeln!(out, "  pods: none");
        } else if r.per_pod_counters {
            let _ = writeln!(
                out,
                "  pods: {} ({with_resets} with reset attempts)",
                pods.len()
            );
        } else {
            let _ = writeln!(out, "  pods: {}", pods.len());
        }
        for p in pods {
            write_pod(&mut out, r, p);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// natguard status --json

fn pod_json(r: &NodeReport, p: &PodReport) -> Value {
    let addrs: Vec<String> = p.addrs.iter().map(|a| a.to_string()).collect();
    json!({
        "namespace": p.namespace,
        "name": p.name,
        "containerId": short_id(&p.container_id),
        "ifname": p.ifname,
        "interface": p.interface,
        "addresses": addrs,
        "exempt": p.exempt,
        "proxied": pod_counter(r, p.proxied),
        "reset": pod_counter(r, p.reset),
    })
}

fn network_json(r: &NodeReport, net: &NetworkReport) -> Value {
    let mut families = serde_json::Map::new();
    for (f, t) in family_totals(net) {
        families.insert(
            family_label(f).to_string(),
            json!({
                "proxied": t.proxied,
                "reset": t.reset,
                "masqueraded": t.masqueraded,
                "keptSource": t.kept_source,
                "logged": t.logged,
            }),
        );
    }
    let pods: Vec<Value> = pods_for_display(r, net)
        .into_iter()
        .map(|p| pod_json(r, p))
        .collect();
    let addrs: Vec<String> = net
        .metadata_addresses
        .iter()
        .map(|a| a.to_string())
        .collect();
    let ifaces: Vec<Value> = net
        .interfaces
        .iter()
        .map(|(name, pods)| json!({ "name": name, "pods": pods }))
        .collect();
    json!({
        "name": net.name,
        "mode": net.mode,
        "fingerprint": net.fingerprint,
        "logDenied": net.log_denied,
        "metadataAddresses": addrs,
        "metadataPorts": net.metadata_ports,
        "podInterfaces": ifaces,
        "families": families,
        "pods": pods,
    })
}

/// `natguard status --json`: one document, `version` 1, keys in a fixed order.
pub(crate) fn render_json(r: &NodeReport) -> Value {
    let networks: Vec<Value> = networks_by_name(r)
        .into_iter()
        .map(|n| network_json(r, n))
        .collect();
    json!({
        "version": JSON_VERSION,
        "ready": r.ready,
        "notReadyReason": r.not_ready_reason,
        "perPodCounters": r.per_pod_counters,
        "networks": networks,
    })
}

// ---------------------------------------------------------------------------------------------
// natguard metrics

#[derive(Debug, Clone, Copy)]
enum MetricType {
    Counter,
    Gauge,
}

/// One metric family: its samples keyed by label values (in `labels` order), so the series come
/// out sorted and a repeated series is added up instead of printed twice.
struct MetricFamily {
    name: &'static str,
    kind: MetricType,
    help: &'static str,
    labels: &'static [&'static str],
    samples: BTreeMap<Vec<String>, u64>,
}

impl MetricFamily {
    fn new(
        name: &'static str,
        kind: MetricType,
        labels: &'static [&'static str],
        help: &'static str,
    ) -> Self {
        MetricFamily {
            name,
            kind,
            help,
            labels,
            samples: BTreeMap::new(),
        }
    }

    fn add(&mut self, label_values: Vec<String>, value: u64) {
        debug_assert_eq!(label_values.len(), self.labels.len());
        let v = self.samples.entry(label_values).or_default();
        *v = v.saturating_add(value);
    }

    fn write(&self, out: &mut String) {
        let kind = match self.kind {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (values, v) in &self.samples {
            out.push_str(self.name);
            if !self.labels.is_empty() {
                let pairs: Vec<String> = self
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(l, v)| format!("{l}=\"{}\"", escape_label_value(v)))
                    .collect();
                let _ = write!(out, "{{{}}}", pairs.join(","));
            }
            let _ = writeln!(out, " {v}");
        }
    }
}

/// A label value in the exposition format: backslash, double quote and line feed escaped.
fn escape_label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text in the exposition format: backslash and line feed escaped.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

const NET: &[&str] = &["network"];
const NET_FAMILY: &[&str] = &["network", "family"];
const POD: &[&str] = &["network", "namespace", "pod", "container_id", "ifname"];

/// `natguard metrics`: Prometheus text exposition format 0.0.4, ending with a newline.
pub(crate) fn render_prometheus(r: &NodeReport) -> String {
    use MetricType::{Counter, Gauge};
    let mut up = MetricFamily::new(
        "natguard_up",
        Gauge,
        &[],
        "1 if nf_tables and conntrack netlink answer on this node, else 0.",
    );
    let mut per_pod = MetricFamily::new(
        "natguard_per_pod_counters_available",
        Gauge,
        &[],
        "1 if the kernel keeps set-element counters (5.11 or later), so per-pod counters are \
         exported.",
    );
    let mut networks = MetricFamily::new(
        "natguard_networks",
        Gauge,
        &[],
        "CNI networks with natguard rules on this node.",
    );
    let mut pods = MetricFamily::new(
        "natguard_pods",
        Gauge,
        NET,
        "Pod attachments natguard has recorded in the network.",
    );
    let mut proxied = MetricFamily::new(
        "natguard_proxied_connections_total",
        Counter,
        NET_FAMILY,
        "Metadata connections DNATed to the node-local proxy.",
    );
    let mut reset = MetricFamily::new(
        "natguard_reset_attempts_total",
        Counter,
        NET_FAMILY,
        "Packets of metadata attempts reset instead of reaching the real metadata API (deny \
         mode, a family without a proxy address, a flow that bypassed the DNAT, or a source \
         address natguard has no pod for).",
    );
    let mut masqueraded = MetricFamily::new(
        "natguard_masqueraded_connections_total",
        Counter,
        NET_FAMILY,
        "Pod connections masqueraded to the node's address.",
    );
    let mut kept = MetricFamily::new(
        "natguard_kept_source_connections_total",
        Counter,
        NET_FAMILY,
        "Pod connections to non-masquerade destinations that kept the pod's source address.",
    );
    let mut logged = MetricFamily::new(
        "natguard_logged_attempts_total",
        Counter,
        NET_FAMILY,
        "Packets of denied metadata attempts written to the kernel log (metadata.logDenied; \
         rate-limited, so at most the reset attempts).",
    );
    let mut pod_reset = MetricFamily::new(
        "natguard_pod_reset_attempts_total",
        Counter,
        POD,
        "Packets of metadata attempts reset, per pod attachment (all of its address families).",
    );
    let mut pod_proxied = MetricFamily::new(
        "natguard_pod_proxied_connections_total",
        Counter,
        POD,
        "Metadata connections DNATed to the node-local proxy, per pod attachment (all of its \
         address families).",
    );

    up.add(vec![], u64::from(r.ready));
    // What could not be read is left out, not reported as zero.
    if !r.unreadable {
        per_pod.add(vec![], u64::from(r.per_pod_counters));
        networks.add(vec![], r.networks.len() as u64);
    }
    for net in &r.networks {
        pods.add(vec![net.name.clone()], net.pods.len() as u64);
        for (f, t) in family_totals(net) {
            let labels = vec![net.name.clone(), family_label(f).to_string()];
            proxied.add(labels.clone(), t.proxied);
            reset.add(labels.clone(), t.reset);
            masqueraded.add(labels.clone(), t.masqueraded);
            kept.add(labels.clone(), t.kept_source);
            logged.add(labels, t.logged);
        }
        for p in &net.pods {
            let labels = vec![
                net.name.clone(),
                p.namespace.clone().unwrap_or_default(),
                p.name.clone().unwrap_or_default(),
                short_id(&p.container_id).to_string(),
                p.ifname.clone(),
            ];
            if let Some(n) = pod_counter(r, p.reset) {
                pod_reset.add(labels.clone(), n);
            }
            if let Some(n) = pod_counter(r, p.proxied) {
                pod_proxied.add(labels, n);
            }
        }
    }

    let mut out = String::new();
    for family in [
        &up,
        &per_pod,
        &networks,
        &pods,
        &proxied,
        &reset,
        &masqueraded,
        &kept,
        &logged,
    ] {
        family.write(&mut out);
    }
    if r.per_pod_counters {
        pod_reset.write(&mut out);
        pod_proxied.write(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    // -----------------------------------------------------------------------------------------
    // Reports

    fn fam(family: Family, proxied: u64, reset: u64, masq: u64, kept: u64) -> FamilyCounters {
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
            proxied: Some(proxied),
            reset: Some(reset),
        }
    }

    /// Three networks given out of name order; pods out of display order; a pod with no name;
    /// nasty strings in every label value.
    fn node() -> NodeReport {
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
            ready: true,
            not_ready_reason: None,
            per_pod_counters: true,
            unreadable: false,
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

    fn without_per_pod_counters(mut r: NodeReport) -> NodeReport {
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
            "natguard: ready (nf_tables and conntrack netlink answer), 3 network(s)"
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
            "\n  metadata destinations: 169.254.169.254, fd00:ec2::254; TCP port(s): 80\n  pod interfaces (metadata \
             fails closed from these): cni0 (6 pod(s))\n"
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
        assert!(nasty.contains("): veth\\n1 (1 pod(s))\n"), "{nasty}");
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
    fn text_says_once_when_per_pod_counters_are_unavailable() {
        let text = render_text(&without_per_pod_counters(node()));
        assert_eq!(text.matches(UNAVAILABLE).count(), 1, "{text}");
        assert_eq!(text.lines().nth(1), Some(UNAVAILABLE));
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
            ready: false,
            not_ready_reason: Some("conntrack netlink: Operation not permitted".to_string()),
            per_pod_counters: true,
            networks: vec![],
            unreadable: false,
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
            ready: true,
            not_ready_reason: None,
            per_pod_counters: true,
            unreadable: false,
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
                "networks",
            ],
            "$",
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

    // -----------------------------------------------------------------------------------------
    // A strict parser for the subset of the Prometheus text format 0.0.4 that natguard writes:
    // `# HELP`, `# TYPE` (counter or gauge) and samples without timestamps.

    type Labels = Vec<(String, String)>;

    #[derive(Debug, Clone, PartialEq)]
    struct Sample {
        labels: Labels,
        value: f64,
    }

    #[derive(Debug, Clone, PartialEq)]
    struct Metric {
        name: String,
        help: Option<String>,
        kind: Option<String>,
        samples: Vec<Sample>,
    }

    fn is_metric_name(s: &str) -> bool {
        let mut chars = s.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn is_label_name(s: &str) -> bool {
        let mut chars = s.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with("__")
    }

    fn unescape_help(s: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('\\') => out.push('\\'),
                    Some('n') => out.push('\n'),
                    other => return Err(format!("bad escape in HELP: \\{other:?}")),
                }
            } else {
                out.push(c);
            }
        }
        Ok(out)
    }

    fn parse_value(s: &str) -> Result<f64, String> {
        match s {
            "+Inf" => return Ok(f64::INFINITY),
            "-Inf" => return Ok(f64::NEG_INFINITY),
            "NaN" => return Ok(f64::NAN),
            _ => {}
        }
        if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit() || ".eE+-".contains(c)) {
            return Err(format!("bad value {s:?}"));
        }
        s.parse::<f64>()
            .map_err(|e| format!("bad value {s:?}: {e}"))
    }

    /// `name{label="value",...} value`, labels optional.
    fn parse_sample(line: &str) -> Result<(String, Labels, f64), String> {
        let name_end = line.find(['{', ' ']).ok_or("sample without a value")?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(format!("bad metric name {name:?}"));
        }
        let mut rest = &line[name_end..];
        let mut labels: Labels = vec![];
        if let Some(after) = rest.strip_prefix('{') {
            let mut chars = after.char_indices().peekable();
            if let Some((i, '}')) = chars.peek().copied() {
                rest = &after[i + 1..];
            } else {
                loop {
                    let mut label = String::new();
                    while let Some((_, c)) =
                        chars.next_if(|&(_, c)| c.is_ascii_alphanumeric() || c == '_')
                    {
                        label.push(c);
                    }
                    if !matches!(chars.next(), Some((_, '='))) || !is_label_name(&label) {
                        return Err(format!("bad label name {label:?}"));
                    }
                    if labels.iter().any(|(l, _)| *l == label) {
                        return Err(format!("label {label:?} given twice"));
                    }
                    if !matches!(chars.next(), Some((_, '"'))) {
                        return Err(format!("label {label:?}: value not quoted"));
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '"')) => break,
                            Some((_, '\\')) => match chars.next() {
                                Some((_, '\\')) => value.push('\\'),
                                Some((_, '"')) => value.push('"'),
                                Some((_, 'n')) => value.push('\n'),
                                other => {
                                    return Err(format!("label {label:?}: bad escape {other:?}"))
                                }
                            },
                            Some((_, c)) => value.push(c),
                            None => return Err(format!("label {label:?}: unterminated value")),
                        }
                    }
                    labels.push((label, value));
                    match chars.next() {
                        Some((_, ',')) => continue,
                        Some((i, '}')) => {
                            rest = &after[i + 1..];
                            break;
                        }
                        Some((_, c)) => return Err(format!("after a label value: {c:?}")),
                        None => return Err("unterminated label set".into()),
                    }
                }
            }
        }
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| format!("no single space before the value in {line:?}"))?;
        if value.contains(' ') {
            return Err(format!("trailing fields (timestamp?) in {line:?}"));
        }
        Ok((name.to_string(), labels, parse_value(value)?))
    }

    fn parse_exposition(text: &str) -> Result<Vec<Metric>, String> {
        let body = text
            .strip_suffix('\n')
            .ok_or("does not end with a newline")?;
        let mut metrics: Vec<Metric> = vec![];
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut series: HashSet<(String, Labels)> = HashSet::new();
        let mut current: Option<String> = None;
        for (n, line) in body.split('\n').enumerate() {
            let at = |e: String| format!("line {}: {e}", n + 1);
            if line.is_empty() || line.contains('\r') {
                return Err(at("blank line or carriage return".into()));
            }
            let mut entry = |name: &str| -> usize {
                *index.entry(name.to_string()).or_insert_with(|| {
                    metrics.push(Metric {
                        name: name.to_string(),
                        help: None,
                        kind: None,
                        samples: vec![],
                    });
                    metrics.len() - 1
                })
            };
            if let Some(comment) = line.strip_prefix('#') {
                let (keyword, rest) = if let Some(r) = comment.strip_prefix(" HELP ") {
                    ("HELP", r)
                } else if let Some(r) = comment.strip_prefix(" TYPE ") {
                    ("TYPE", r)
                } else {
                    return Err(at(format!("not a HELP or TYPE line: {line:?}")));
                };
                let (name, arg) = rest
                    .split_once(' ')
                    .ok_or_else(|| at(format!("{keyword} without text")))?;
                if !is_metric_name(name) {
                    return Err(at(format!("bad metric name {name:?}")));
                }
                let i = entry(name);
                let m = &mut metrics[i];
                if !m.samples.is_empty() {
                    return Err(at(format!("{keyword} for {name} after its samples")));
                }
                if keyword == "HELP" {
                    if m.help.is_some() {
                        return Err(at(format!("second HELP for {name}")));
                    }
                    m.help = Some(unescape_help(arg).map_err(at)?);
                } else {
                    if m.kind.is_some() {
                        return Err(at(format!("second TYPE for {name}")));
                    }
                    if arg != "counter" && arg != "gauge" {
                        return Err(at(format!("type {arg:?} for {name}")));
                    }
                    m.kind = Some(arg.to_string());
                }
                continue;
            }
            let (name, labels, value) = parse_sample(line).map_err(at)?;
            let i = entry(&name);
            let m = &mut metrics[i];
            if m.kind.is_none() {
                return Err(at(format!("sample of {name} before its TYPE")));
            }
            if current.as_deref() != Some(name.as_str()) && !m.samples.is_empty() {
                return Err(at(format!("samples of {name} are not together")));
            }
            current = Some(name.clone());
            let mut key = labels.clone();
            key.sort();
            if !series.insert((name.clone(), key)) {
                return Err(at(format!("duplicate series {line:?}")));
            }
            m.samples.push(Sample { labels, value });
        }
        Ok(metrics)
    }

    fn family<'a>(metrics: &'a [Metric], name: &str) -> &'a Metric {
        metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(l, v)| (l.to_string(), v.to_string()))
            .collect()
    }

    fn value_of(m: &Metric, pairs: &[(&str, &str)]) -> f64 {
        let want = labels(pairs);
        m.samples
            .iter()
            .find(|s| s.labels == want)
            .unwrap_or_else(|| panic!("{}: no series {pairs:?}", m.name))
            .value
    }

    #[test]
    fn parser_accepts_the_format() {
        let text = "# HELP a_total Something \\\\ with\\nlines.\n\
                    # TYPE a_total counter\n\
                    a_total{x=\"1\",y=\"q\\\"\\\\\\n\u{e9}\"} 3\n\
                    a_total{x=\"2\"} 1.5e3\n\
                    # TYPE b gauge\n\
                    b +Inf\n\
                    b{} NaN\n";
        // `b` and `b{}` are the same series.
        assert!(parse_exposition(text)
            .unwrap_err()
            .contains("duplicate series"));
        let text = text.replace("b{} NaN\n", "b{k=\"\"} -0.5\n");
        let m = parse_exposition(&text).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].help.as_deref(), Some("Something \\ with\nlines."));
        assert_eq!(m[0].kind.as_deref(), Some("counter"));
        assert_eq!(
            m[0].samples[0].labels,
            labels(&[("x", "1"), ("y", "q\"\\\n\u{e9}")])
        );
        assert_eq!(m[0].samples[1].value, 1500.0);
        assert_eq!(m[1].help, None);
        assert_eq!(m[1].samples[0].value, f64::INFINITY);
        assert_eq!(m[1].samples[1].value, -0.5);
    }

    #[test]
    fn parser_rejects_malformed_input() {
        let head = "# HELP m_total Help.\n# TYPE m_total counter\n";
        let bad: &[(&str, &str)] = &[
            ("m_total 1", "newline"),
            ("m_total 1\n\n", "blank"),
            ("m_total 1\r\n", "carriage"),
            (
                "m_total{a=\"1\"} 1\nm_total{a=\"1\"} 2\n",
                "duplicate series",
            ),
            (
                "m_total{a=\"1\",b=\"2\"} 1\nm_total{b=\"2\",a=\"1\"} 2\n",
                "duplicate series",
            ),
            ("m_total{a=\"1\",a=\"2\"} 1\n", "twice"),
            ("m_total{a=1} 1\n", "not quoted"),
            ("m_total{a=\"1} 1\n", "unterminated"),
            ("m_total{a=\"x\"y\"} 1\n", "after a label value"),
            ("m_total{a=\"\\t\"} 1\n", "bad escape"),
            ("m_total{a=\"1\",} 1\n", "bad label name"),
            ("m_total{1a=\"1\"} 1\n", "bad label name"),
            ("m_total{__name__=\"x\"} 1\n", "bad label name"),
            ("m_total{a-b=\"1\"} 1\n", "bad label name"),
            ("m_total{a=\"1\"\n", "unterminated"),
            ("m_total one\n", "bad value"),
            ("m_total 0x10\n", "bad value"),
            ("m_total inf\n", "bad value"),
            ("m_total 1..2\n", "bad value"),
            ("m_total\n", "without a value"),
            ("m_total  1\n", "trailing fields"),
            ("m_total 1 1700000000000\n", "timestamp"),
            ("m_total{a=\"1\"}1\n", "single space"),
            ("0m 1\n", "bad metric name"),
            ("m-x 1\n", "bad metric name"),
            ("other 1\n", "before its TYPE"),
            ("m_total 1\n# TYPE m_total counter\n", "after its samples"),
            ("m_total 1\n# HELP m_total Again.\n", "after its samples"),
            ("# HELP m_total Again.\nm_total 1\n", "second HELP"),
            ("# TYPE m_total gauge\nm_total 1\n", "second TYPE"),
            ("# TYPE h histogram\nh 1\n", "type"),
            ("# TYPE g\n", "without text"),
            ("# TYPE 9g gauge\n", "bad metric name"),
            ("# HELP g bad \\t escape\n", "bad escape"),
            ("# just a comment\n", "not a HELP or TYPE"),
            ("#HELP m_total x\n", "not a HELP or TYPE"),
            (
                "m_total{a=\"1\"} 1\n# TYPE g gauge\ng 1\nm_total{a=\"2\"} 1\n",
                "not together",
            ),
        ];
        for (tail, why) in bad {
            let text = format!("{head}{tail}");
            match parse_exposition(&text) {
                Ok(m) => panic!("accepted {text:?}: {m:?}"),
                Err(e) => assert!(e.contains(why), "{text:?}: {e} (wanted {why:?})"),
            }
        }
        assert!(parse_exposition(&format!("{head}m_total 1\n")).is_ok());
    }

    // -----------------------------------------------------------------------------------------
    // Metrics

    const ALWAYS: [(&str, &str); 9] = [
        ("natguard_up", "gauge"),
        ("natguard_per_pod_counters_available", "gauge"),
        ("natguard_networks", "gauge"),
        ("natguard_pods", "gauge"),
        ("natguard_proxied_connections_total", "counter"),
        ("natguard_reset_attempts_total", "counter"),
        ("natguard_masqueraded_connections_total", "counter"),
        ("natguard_kept_source_connections_total", "counter"),
        ("natguard_logged_attempts_total", "counter"),
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
        for (name, _) in &ALWAYS[4..] {
            assert_eq!(family(&metrics, name).samples.len(), 6, "{name}");
        }
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
            short_id(
                "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}"
            ),
            "\u{e9}".repeat(12)
        );
    }
}
