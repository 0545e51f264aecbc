//! What natguard stopped on this node, for people and for monitoring: the presentation of a
//! [`NodeReport`] as `natguard status` text, as `natguard status --json`, and as Prometheus text
//! exposition for `natguard metrics` and the node_exporter textfile collector.
//!
//! The report is filled elsewhere, from the kernel's rule and set-element counters (and the
//! watcher's self-repair record, shown only where a watcher keeps one); this module only
//! renders it and does no I/O, so every output is unit-tested from hand-built reports.
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
pub(crate) use crate::store::Installation;
pub(crate) use crate::tools::watcher::{ProxyRecord, RepairStats};
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
    /// The node-wide guard's own counters, per family: (reset, logged) over every source,
    /// the ones natguard has no pod for (a tunnel, an address a pod gave itself) included.
    pub guard: Vec<(Family, u64, u64)>,
    /// natguard's state could not be read at all (`not_ready_reason` says why): the report
    /// knows nothing about networks or counters, and says nothing about them.
    pub unreadable: bool,
    /// What `install --watch` has repaired; `None` without a watcher's record.
    pub self_repair: Option<RepairStats>,
    /// What the watcher's metadata proxy serves; `None` where no watcher serves one.
    pub proxy: Option<ProxyRecord>,
    /// Whether natguard's table and its node-wide guard are there; `None` when unreadable.
    /// Kernel APIs that answer (`ready`) say nothing about it.
    pub installation: Option<Installation>,
    /// How many exempt pods' own veths mark their frames (chains of `netdev natguard`);
    /// `None` without that table.
    pub exempt_veths: Option<usize>,
    /// Network lists whose natguard entry cannot be read (not JSON, or an entry that does not
    /// parse): their networks are left as they are, every other one is served.
    pub broken_lists: Vec<crate::restore::BrokenList>,
    /// Pods whose host-side interface has tc filters that steer packets around netfilter
    /// (accepted with `metadata.acceptUnenforced`, or steered since their ADD): natguard's
    /// rules are there but cannot enforce the metadata policy for them.
    pub unenforced: Vec<Unenforced>,
}

/// A pod natguard cannot enforce for: what on its host-side interface steers around netfilter.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Unenforced {
    pub network: String,
    /// `namespace/name` as recorded at ADD (see [`PodReport`]).
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub container_id: String,
    /// The pod's host-side interface.
    pub interface: String,
    /// What was found, one line each ([`crate::kernel::link::Links::tc_steering`]).
    pub found: Vec<String>,
}

impl Unenforced {
    /// `namespace/name` as recorded (`?` for a missing half), `None` without either.
    fn pod(&self) -> Option<String> {
        match (self.namespace.as_deref(), self.name.as_deref()) {
            (None, None) => None,
            (ns, name) => Some(format!("{}/{}", ns.unwrap_or("?"), name.unwrap_or("?"))),
        }
    }

    /// `namespace/name`, as the pod lines say it.
    fn who(&self) -> String {
        who(&PodReport {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            ..PodReport::default()
        })
    }
}

/// The node-wide guard is in place.
fn guarding(r: &NodeReport) -> bool {
    r.installation == Some(Installation::Guarding)
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
    /// The effective metadata policy (`proxy`, `deny`, `exempt`, `off`, `unknown`) and what
    /// decided it (`network`, `namespace`, `annotation`; see [`crate::policy`]).
    pub policy: String,
    pub policy_source: String,
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
    if !p.policy.is_empty() {
        let why = match p.policy_source.as_str() {
            "annotation" => "the pod's annotation natguard.io/metadata",
            "namespace" => "its namespace is exempt",
            _ => "the network's metadata.mode",
        };
        let _ = writeln!(
            out,
            "      metadata policy: {} ({why})",
            printable(&p.policy)
        );
    }
}

/// The pods whose host side steers around netfilter, one line each, and how many.
fn write_unenforced(out: &mut String, r: &NodeReport) {
    if r.unenforced.is_empty() {
        return;
    }
    for u in &r.unenforced {
        let found: Vec<String> = u.found.iter().map(|f| printable(f)).collect();
        let _ = writeln!(
            out,
            "UNENFORCED {} ({}) in network {}: {} steers its packets around netfilter",
            u.who(),
            printable(&u.interface),
            printable(&u.network),
            found.join("; ")
        );
    }
    let _ = writeln!(
        out,
        "unenforced: {} pod(s) whose host-side interface steers packets around netfilter; \
         natguard cannot enforce the metadata policy for them (docs/security.md)",
        r.unenforced.len()
    );
}

/// `natguard status`: the report in plain words.
/// The node-wide guard: what it reset over every source, and how much of that came from no pod
/// natguard knows (the per-pod counters name the rest).
fn write_guard(out: &mut String, r: &NodeReport) {
    if r.guard.is_empty() {
        return;
    }
    let families: Vec<String> = r
        .guard
        .iter()
        .map(|(f, reset, _)| format!("{} {reset}", family_label(*f)))
        .collect();
    let _ = writeln!(
        out,
        "guard (node-wide, every network): metadata attempts reset: {}",
        families.join(", ")
    );
    if r.per_pod_counters {
        let total: u64 = r.guard.iter().map(|(_, n, _)| n).sum();
        let of_pods: u64 = r
            .networks
            .iter()
            .flat_map(|n| n.pods.iter())
            .filter_map(|p| p.reset)
            .sum();
        let others = total.saturating_sub(of_pods);
        if others > 0 {
            let _ = writeln!(
                out,
                "  {others} reset attempt(s) came from sources of no pod listed below (an \
                 address a pod gave itself, a tunnel, IPVS, a pod natguard never saw, a pod \
                 deleted since)"
            );
        }
    }
}

/// The watcher's self-repair, in one line.
fn write_self_repair(out: &mut String, sr: &RepairStats) {
    if !sr.repairing {
        let _ = write!(
            out,
            "self-repair: OFF (install --watch pid {} runs with --no-repair or --no-adopt); before it: ",
            sr.pid
        );
    } else if sr.running == Some(false) {
        let from = sr
            .updated
            .map_or_else(|| "an unknown time".to_string(), utc_time);
        let _ = write!(
            out,
            "self-repair: watcher pid {} is not running (record from {from}): ",
            sr.pid
        );
    } else if let Some(age) = sr
        .updated
        .map(crate::tools::watcher::age_of)
        .filter(|a| *a > crate::tools::watcher::HEARTBEAT_MAX_AGE.as_secs_f64())
    {
        let _ = write!(
            out,
            "self-repair: watcher pid {} is NOT RESPONDING (its last heartbeat was {age:.0} s \
             ago; frozen or wedged, it repairs nothing): ",
            sr.pid
        );
    } else {
        let _ = write!(out, "self-repair (install --watch, pid {}): ", sr.pid);
    }
    let _ = write!(out, "{} repair(s) in {} check(s)", sr.repairs, sr.checks);
    if let (Some(at), Some(ms)) = (sr.last_repair, sr.last_repair_ms) {
        let ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| (d.as_secs_f64() - at).max(0.0))
            .unwrap_or(0.0);
        let _ = write!(
            out,
            "; last {ago:.0} s ago, {ms:.1} ms after the first notification, because {}",
            printable(sr.last_cause.as_deref().unwrap_or("of a change"))
        );
    }
    let _ = writeln!(out);
    // What the last check could not restore: pods that are not protected until it can.
    if !sr.skipped.is_empty() {
        let total: u64 = sr.skipped.iter().map(|(_, n)| n).sum();
        let why: Vec<String> = sr
            .skipped
            .iter()
            .map(|(k, n)| format!("{n} {}", printable(k)))
            .collect();
        let _ = writeln!(
            out,
            "self-repair: {total} cached attachment(s) skipped at the last check ({}); the watcher's log says which and why",
            why.join(", ")
        );
    }
}

/// The watcher's metadata proxy, in one line.
fn write_proxy(out: &mut String, p: &ProxyRecord) {
    let at: Vec<String> = p.serving.iter().map(|a| a.to_string()).collect();
    if p.running == Some(false) {
        let _ = write!(
            out,
            "metadata proxy: watcher pid {} is not running (not serving): ",
            p.pid
        );
    } else if at.is_empty() {
        let _ = write!(out, "metadata proxy (pid {}): serving nowhere: ", p.pid);
    } else {
        let _ = write!(
            out,
            "metadata proxy (pid {}): serving {} on {}: ",
            p.pid,
            printable(&p.cloud),
            at.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "{} served, {} concealed, {} refused, {} upstream error(s)",
        p.served, p.concealed, p.refused, p.upstream_error
    );
}

/// Unix time `t` as `YYYY-MM-DD HH:MM:SS UTC` (the proleptic Gregorian calendar).
fn utc_time(t: f64) -> String {
    let secs = t.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = crate::log::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

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
    match &r.installation {
        Some(Installation::NoTable) if r.ready => {
            let _ = writeln!(
                out,
                "natguard: not installed: no natguard table on this node (nf_tables and \
                 conntrack netlink answer)"
            );
        }
        Some(Installation::Incomplete { missing }) if r.ready => {
            let _ = writeln!(
                out,
                "natguard: NOT GUARDING: table inet natguard lacks the node-wide guard's \
                 chain(s) {} (nf_tables and conntrack netlink answer), {} network(s)",
                missing.join(", "),
                r.networks.len()
            );
        }
        Some(Installation::Guarding) if r.ready => {
            let _ = writeln!(
                out,
                "natguard: guarding (the node-wide metadata guard is in place; nf_tables and \
                 conntrack netlink answer), {} network(s)",
                r.networks.len()
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "natguard: {readiness}, {} network(s)",
                r.networks.len()
            );
        }
    }
    for b in &r.broken_lists {
        let _ = writeln!(out, "BROKEN LIST: {}", printable(&b.to_string()));
    }
    write_unenforced(&mut out, r);
    if let Some(n) = r.exempt_veths {
        let _ = writeln!(
            out,
            "exempt veths: {n} (each exempt pod's own veth marks its frames; only what crosses \
             it is exempt)"
        );
    }
    // Without networks there is nothing the kernel could have counted per pod.
    if !r.per_pod_counters && !r.networks.is_empty() {
        let _ = writeln!(
            out,
            "per-pod counters: unavailable on this kernel (needs 5.11 or later for set-element \
             counters); per-network counters are complete"
        );
    }
    if let Some(sr) = &r.self_repair {
        write_self_repair(&mut out, sr);
    }
    if let Some(p) = &r.proxy {
        write_proxy(&mut out, p);
    }
    if r.networks.is_empty() {
        let _ = writeln!(out, "no network has natguard rules on this node");
    }
    write_guard(&mut out, r);
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
            let _ = writeln!(out, "  pod interfaces: {}", list_or_none(ifaces));
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
        "policy": p.policy,
        "policySource": p.policy_source,
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
    let guard: Vec<Value> = r
        .guard
        .iter()
        .map(|(f, reset, logged)| {
            json!({ "family": family_label(*f), "reset": reset, "logged": logged })
        })
        .collect();
    let mut doc = json!({
        "version": JSON_VERSION,
        "ready": r.ready,
        "notReadyReason": r.not_ready_reason,
        "perPodCounters": r.per_pod_counters,
        "installed": r.installation.as_ref().map(|i| *i != Installation::NoTable),
        "guarding": r.installation.as_ref().map(|_| guarding(r)),
        "guard": {
            "families": guard,
            "exemptVeths": r.exempt_veths,
        },
        "networks": networks,
    });
    // Only where a list is broken: on a sound node the document is unchanged.
    if !r.broken_lists.is_empty() {
        doc["brokenLists"] = r
            .broken_lists
            .iter()
            .map(|b| {
                json!({
                    "file": b.file.display().to_string(),
                    "network": b.network,
                    "reason": b.reason,
                })
            })
            .collect();
    }
    // Only where a pod's host side steers around netfilter.
    if !r.unenforced.is_empty() {
        doc["unenforced"] = r
            .unenforced
            .iter()
            .map(|u| {
                json!({
                    "pod": u.pod(),
                    "network": u.network,
                    "containerId": short_id(&u.container_id),
                    "interface": u.interface,
                    "found": u.found,
                })
            })
            .collect();
    }
    // Only where a watcher repairs: without --watch the document is unchanged.
    if let Some(sr) = &r.self_repair {
        doc["selfRepair"] = sr.to_json();
    }
    // Only where a watcher serves the proxy.
    if let Some(p) = &r.proxy {
        let mut v = p.to_json();
        v["serving"] = serde_json::Value::Bool(p.running != Some(false) && !p.serving.is_empty());
        v["addresses"] = p
            .serving
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .into();
        doc["proxy"] = v;
    }
    doc
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

    fn has_samples(&self) -> bool {
        !self.samples.is_empty()
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
    render_prometheus_with(r, PodSeries::Shown)
}

/// Whether the per-pod series (labelled with each pod's namespace and name) are rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodSeries {
    Shown,
    /// Left out: the scrape endpoint's default, since whoever reaches it would read every
    /// pod's identity.
    Hidden,
}

/// [`render_prometheus`], with or without the per-pod series.
pub(crate) fn render_prometheus_with(r: &NodeReport, pod_series: PodSeries) -> String {
    use MetricType::{Counter, Gauge};
    let mut up = MetricFamily::new(
        "natguard_up",
        Gauge,
        &[],
        "1 if nf_tables and conntrack netlink answer on this node, else 0.",
    );
    let mut guarded = MetricFamily::new(
        "natguard_guarded",
        Gauge,
        &[],
        "1 if natguard guards this node (its table and the node-wide guard's chains are in \
         place), else 0.",
    );
    let mut heartbeat = MetricFamily::new(
        "natguard_self_repair_heartbeat_timestamp_seconds",
        Gauge,
        &[],
        "Unix time install --watch's self-repair last wrote its record (every 10 s while it \
         runs): a stale value is a frozen or wedged watcher.",
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
    let mut broken_lists = MetricFamily::new(
        "natguard_broken_lists",
        Gauge,
        &[],
        "Network lists whose natguard entry cannot be read (not JSON, or an entry that does \
         not parse); their networks are left as they are (status names them).",
    );
    let mut unenforced = MetricFamily::new(
        "natguard_unenforced_pods",
        Gauge,
        &[],
        "Pod attachments whose host-side interface has tc filters that steer packets around \
         netfilter, so natguard cannot enforce the metadata policy for them (status names them).",
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
    let mut guard_reset = MetricFamily::new(
        "natguard_guard_reset_attempts_total",
        Counter,
        &["family"],
        "Packets of metadata TCP the node-wide guard reset, from every source (pods, and what \
         natguard has no pod for: tunnels, addresses a pod gave itself, IPVS).",
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

    let mut repairs = MetricFamily::new(
        "natguard_repairs_total",
        Counter,
        &[],
        "Repairs of natguard's tables by install --watch after someone else changed them.",
    );
    let mut checks = MetricFamily::new(
        "natguard_repair_checks_total",
        Counter,
        &[],
        "Checks of natguard's tables by install --watch (repairs included).",
    );
    let mut last_repair = MetricFamily::new(
        "natguard_last_repair_timestamp_seconds",
        Gauge,
        &[],
        "Unix time of install --watch's last repair of natguard's tables.",
    );
    let mut watcher_running = MetricFamily::new(
        "natguard_self_repair_running",
        Gauge,
        &[],
        "1 if the install --watch that holds the watcher lock keeps the self-repair record \
         and repairs, 0 if the record is left from a watcher that exited or the running one \
         does not repair (--no-repair).",
    );
    let mut proxy_requests = MetricFamily::new(
        "natguard_proxy_requests_total",
        Counter,
        &["result"],
        "Requests to natguard's metadata proxy by result: served, concealed (a path the \
         allow-list withholds), refused (who or how it was asked), upstream_error.",
    );
    let mut proxy_serving = MetricFamily::new(
        "natguard_proxy_serving",
        Gauge,
        &[],
        "1 if install --watch serves natguard's metadata proxy on at least one address.",
    );
    if let Some(p) = &r.proxy {
        proxy_serving.add(
            vec![],
            u64::from(p.running != Some(false) && !p.serving.is_empty()),
        );
        for (what, n) in [
            ("concealed", p.concealed),
            ("refused", p.refused),
            ("served", p.served),
            ("upstream_error", p.upstream_error),
        ] {
            proxy_requests.add(vec![what.to_string()], n);
        }
    }
    let mut skipped = MetricFamily::new(
        "natguard_repair_skipped_attachments",
        Gauge,
        &["reason"],
        "Attachments of the CNI result cache that install --watch's last check could not \
         restore, by reason (netns_gone, netns_not_visible, not_a_netns, not_permitted, \
         no_natguard, no_address, unreadable_cache, broken_list, deleted).",
    );
    if let Some(sr) = &r.self_repair {
        // Every reason, zeros included: a series that appears later hides its first rise.
        for reason in crate::restore::SKIP_REASONS {
            skipped.add(vec![reason.to_string()], 0);
        }
        for (reason, n) in &sr.skipped {
            skipped.add(vec![reason.clone()], *n);
        }
        if let Some(running) = sr.running {
            watcher_running.add(vec![], u64::from(running));
        }
        repairs.add(vec![], sr.repairs);
        checks.add(vec![], sr.checks);
        if let Some(t) = sr.last_repair {
            last_repair.add(vec![], t as u64);
        }
        if let Some(t) = sr.updated {
            heartbeat.add(vec![], t as u64);
        }
    }

    up.add(vec![], u64::from(r.ready));
    // What could not be read is left out, not reported as zero.
    if !r.unreadable {
        guarded.add(vec![], u64::from(guarding(r)));
        per_pod.add(vec![], u64::from(r.per_pod_counters));
        networks.add(vec![], r.networks.len() as u64);
        broken_lists.add(vec![], r.broken_lists.len() as u64);
        unenforced.add(vec![], r.unenforced.len() as u64);
    }
    for (f, n, _) in &r.guard {
        guard_reset.add(vec![family_label(*f).to_string()], *n);
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
        &guarded,
        &per_pod,
        &networks,
        &broken_lists,
        &unenforced,
        &pods,
        &proxied,
        &reset,
        &masqueraded,
        &kept,
        &logged,
        &guard_reset,
    ] {
        family.write(&mut out);
    }
    if r.per_pod_counters && pod_series == PodSeries::Shown {
        pod_reset.write(&mut out);
        pod_proxied.write(&mut out);
    }
    // Only where a watcher repairs: without --watch, nothing of it.
    if r.self_repair.is_some() {
        if watcher_running.has_samples() {
            watcher_running.write(&mut out);
        }
        repairs.write(&mut out);
        checks.write(&mut out);
        if last_repair.has_samples() {
            last_repair.write(&mut out);
        }
        skipped.write(&mut out);
        if heartbeat.has_samples() {
            heartbeat.write(&mut out);
        }
    }
    // Only where a watcher serves the proxy.
    if r.proxy.is_some() {
        proxy_requests.write(&mut out);
        proxy_serving.write(&mut out);
    }
    out
}

// The Rust tests' one Prometheus text parser lives with the other test fixtures.
#[cfg(test)]
#[path = "../../../tests/common/exposition.rs"]
mod exposition;
#[cfg(test)]
mod metrics_tests;
#[cfg(test)]
mod tests;
