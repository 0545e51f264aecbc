//! `natguard status [--json]`: what natguard has installed on this node and what its rules
//! stopped, in plain words or as one JSON document.
//!
//! It reads the kernel, without the node lock (a report never writes), and the record of
//! `install --watch`'s self-repair (`/run/natguard/repair.json`) when a watcher keeps one,
//! with whether that watcher still runs (its lock, see [`crate::tools::watcher`]).
//! Kernel APIs that answer are not natguard being there: without natguard's table the report
//! says "not installed", and without the node-wide guard's chains "not guarding"
//! ([`store::Installation`]).
//! The networks are named by the comments of natguard's rules; a network's mode is read back from the rules
//! themselves (what they enforce, not what a config file says): a DNAT to the proxy is `proxy`,
//! resets without a DNAT are `deny`, neither is `off`. Pods are the elements of `NET-pods`,
//! whose comments carry the addresses, namespace, name, container ID and ifname recorded at
//! ADD, with the host-side interface from `NET-att` (the pod's bridge port, or its routed
//! veth). Each pod's effective metadata policy is read from its record (`pol=` when an
//! annotation decided, see [`crate::policy`]), else from the sets (exempt) and the network's
//! mode. Each pod's host-side interface is read for tc filters that steer its packets around
//! netfilter (what ADD and CHECK refuse unless `metadata.acceptUnenforced`): such a pod is named
//! and the node is reported not guarded. The counters are the rules' and the
//! counted sets' ([`crate::store`] sums them). The presentation is [`super::report`].

use super::report::{self, FamilyCounters, NetworkReport, NodeReport, PodReport};
use crate::error::Result;
use crate::kernel;
use crate::plan::{self, Count, Family};
use crate::store;
use crate::tools::cli::{options_or_exit, parse_switches};
use crate::warn;
use std::collections::BTreeMap;

pub fn cli(args: &[String]) -> i32 {
    let json = match options_or_exit("status", USAGE, parse_switches(args, &["--json"])) {
        Ok(switches) => !switches.is_empty(),
        Err(code) => return code,
    };
    let (r, unreadable) = collect_or_unreadable();
    // 0 only where the node-wide guard is in place and enforces for every pod: a node natguard
    // does not guard (no table, chains missing, state unreadable, a pod's host side steering
    // around netfilter) is exit 1, as the docs' exit codes say.
    let code = if unreadable == 0
        && r.installation == Some(store::Installation::Guarding)
        && r.unenforced.is_empty()
    {
        EXIT_GUARDED
    } else {
        EXIT_NOT_GUARDED
    };
    if json {
        println!("{}", report::render_json(&r));
    } else {
        print!("{}", report::render_text(&r));
        print!("{}", preset_lines(&netconf_dir()));
    }
    code
}

/// Which endpoint preset each natguard network's config chose and why (`metadata.preset`;
/// for `auto`, the DMI string that decided, or that none did), one line per network that names
/// one. Read from the conflists: the kernel holds the endpoints, not where they came from.
fn preset_lines(netconf_dir: &std::path::Path) -> String {
    let Ok(networks) = crate::restore::natguard_networks(netconf_dir) else {
        return String::new();
    };
    networks
        .iter()
        .filter_map(|(name, cfg)| {
            let p = cfg.metadata.preset.as_ref()?;
            Some(format!("network {name}: {}\n", p.describe()))
        })
        .collect()
}

const USAGE: &str = "usage: natguard status [--json]
  prints what natguard has installed on this node and what its rules stopped
  --json   the same report as one JSON document (see docs/operations.md, \"natguard status --json\")
exit codes: 0 natguard guards this node (its table and the node-wide guard are in place),
  1 it does not (not installed, guard chains missing, its state cannot be read, or a pod's
  host-side interface steers packets around netfilter), 2 usage error
";

/// `status` exits 0 only where natguard guards the node.
const EXIT_GUARDED: i32 = 0;
/// Not installed, the guard incomplete, or natguard's state unreadable.
const EXIT_NOT_GUARDED: i32 = 1;

/// The node's report; when natguard's state cannot be read at all, a report that says why
/// (not ready, no networks) and exit code 1.
pub(crate) fn collect_or_unreadable() -> (NodeReport, i32) {
    match collect() {
        Ok(r) => (r, 0),
        Err(e) => (
            NodeReport {
                ready: false,
                not_ready_reason: Some(format!("cannot read natguard's state: {e}")),
                per_pod_counters: false,
                networks: Vec::new(),
                guard: Vec::new(),
                unreadable: true,
                unenforced: Vec::new(),
                self_repair: read_self_repair(),
                proxy: read_proxy(),
                installation: None,
                exempt_veths: None,
                broken_lists: broken_lists(),
            },
            1,
        ),
    }
}

/// The record of the node's `install --watch`, if one runs (or ran) with the default
/// readiness file.
fn read_self_repair() -> Option<report::RepairStats> {
    use crate::tools::watcher::{read_state, DEFAULT_READY_FILE, STATE_FILE};
    let sr = read_state(std::path::Path::new(STATE_FILE))?;
    Some(sr.with_running(std::path::Path::new(DEFAULT_READY_FILE)))
}

/// The netconf dir the node's watcher runs with (recorded beside its readiness file), else the
/// default.
fn netconf_dir() -> std::path::PathBuf {
    use crate::tools::watcher::DEFAULT_READY_FILE;
    crate::tools::install::record::read_options(std::path::Path::new(DEFAULT_READY_FILE))
        .map(|r| r.netconf_dir)
        .unwrap_or_else(|| crate::restore::DEFAULT_NETCONF_DIR.into())
}

/// The lists of the netconf dir whose natguard entry cannot be read: their networks are left
/// as they are (see [`crate::restore::BrokenList`]).
fn broken_lists() -> Vec<crate::restore::BrokenList> {
    crate::restore::scan_networks(&netconf_dir())
        .map(|n| n.broken)
        .unwrap_or_default()
}

/// The record of the watcher's metadata proxy, if one serves (or served) with the default
/// readiness file; a watcher that is gone serves nothing.
fn read_proxy() -> Option<report::ProxyRecord> {
    use crate::tools::watcher::{read_proxy, watcher_running, DEFAULT_READY_FILE, PROXY_FILE};
    let mut p = read_proxy(std::path::Path::new(PROXY_FILE))?;
    p.running = watcher_running(std::path::Path::new(DEFAULT_READY_FILE));
    Some(p)
}

/// Reads the calling thread's network namespace into a [`NodeReport`].
pub(crate) fn collect() -> Result<NodeReport> {
    let mut store = store::open()?;
    let (ready, not_ready_reason) = match store.probe() {
        Ok(()) => (true, None),
        Err(e) => (false, Some(e.to_string())),
    };
    let mut r = NodeReport {
        ready,
        not_ready_reason,
        per_pod_counters: true,
        networks: Vec::new(),
        guard: Vec::new(),
        unreadable: false,
        unenforced: Vec::new(),
        self_repair: read_self_repair(),
        proxy: read_proxy(),
        installation: Some(store.installation()?),
        exempt_veths: store.exempt_veths()?,
        broken_lists: broken_lists(),
    };
    let node = store.node_counts()?;
    r.guard = Family::ALL
        .into_iter()
        .map(|f| {
            let get = |c: Count| node.get(&c).copied().unwrap_or(0);
            (f, get(Count::Reset(f)), get(Count::Logged(f)))
        })
        .collect();
    for net in store.networks()?.unwrap_or_default() {
        let st = store.network_state(&net)?;
        // Vacuously true for a network without pods: no element said otherwise.
        r.per_pod_counters &= st.per_pod_counters;
        r.networks.push(network_report(&st));
    }
    r.unenforced = unenforced(&r.networks);
    Ok(r)
}

/// The pods whose host-side interface has tc filters that steer packets around netfilter
/// ([`kernel::link::Links::tc_steering`], as ADD and CHECK refuse them): accepted with
/// `metadata.acceptUnenforced`, or steered since their ADD. Read at report time, one filter
/// dump per hook of each interface (an interface several pods share is read once), with the
/// netlink socket's deadlines. What cannot be read is warned about and not reported: ADD and
/// CHECK treat it the same way.
fn unenforced(networks: &[NetworkReport]) -> Vec<report::Unenforced> {
    let mut out = Vec::new();
    if !networks
        .iter()
        .any(|n| n.pods.iter().any(|p| p.interface.is_some()))
    {
        return out;
    }
    let mut links = match kernel::link::Links::open() {
        Ok(l) => l,
        Err(e) => {
            warn!("cannot list the tc filters of the pods' host sides: {e}");
            return out;
        }
    };
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for net in networks {
        for p in &net.pods {
            let Some(iface) = &p.interface else { continue };
            if !found.contains_key(iface) {
                let f = match links.link_in(None, iface) {
                    // Gone (the pod with it): nothing steers it.
                    Ok(None) => Ok(Vec::new()),
                    Ok(Some(l)) => links.tc_steering(l.index),
                    Err(e) => Err(e),
                };
                let f = f.unwrap_or_else(|e| {
                    warn!("cannot list the tc filters of {iface}: {e}");
                    Vec::new()
                });
                found.insert(iface.clone(), f);
            }
            let steering = &found[iface];
            if !steering.is_empty() {
                out.push(report::Unenforced {
                    network: net.name.clone(),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    container_id: p.container_id.clone(),
                    interface: iface.clone(),
                    found: steering.clone(),
                });
            }
        }
    }
    out.sort_by(|a, b| {
        (&a.network, &a.namespace, &a.name, &a.container_id).cmp(&(
            &b.network,
            &b.namespace,
            &b.name,
            &b.container_id,
        ))
    });
    out
}

fn network_report(st: &store::NetworkState) -> NetworkReport {
    let fingerprint = st
        .chains
        .iter()
        .flat_map(|(_, _, rules)| rules.iter())
        .find_map(|r| plan::fingerprint_of_rule_comment(&r.comment))
        .unwrap_or("")
        .to_string();
    let mode = st.mode;
    let count = |c: Count| st.counts.get(&c).copied().unwrap_or(0);
    let families = Family::ALL
        .into_iter()
        .map(|f| FamilyCounters {
            family: f,
            proxied: count(Count::Proxied(f)),
            reset: count(Count::Reset(f)),
            masqueraded: count(Count::Masqueraded(f)),
            kept_source: count(Count::KeptSource(f)),
            logged: count(Count::Logged(f)),
        })
        .collect();
    let mut metadata_addresses = st.guarded_addrs.clone();
    metadata_addresses.sort();
    let mut metadata_ports = st.guarded_ports.clone();
    metadata_ports.sort();
    let mut interfaces: Vec<(String, u32)> =
        st.ifaces.iter().map(|(i, n)| (i.to_string(), *n)).collect();
    interfaces.sort();
    NetworkReport {
        name: st.network.clone(),
        mode: mode.to_string(),
        fingerprint,
        log_denied: st.log_denied,
        metadata_addresses,
        metadata_ports,
        interfaces,
        families,
        pods: st.pods.iter().map(|p| pod_report(p, mode)).collect(),
    }
}

/// A pod from its `NET-pods` record (`ADDRS NS/NAME cid=CID if=IFNAME`, possibly cut at nft's
/// comment limit) and its `NET-att` record. `-` is what ADD records for a missing name.
fn pod_report(p: &store::PodRecord, network_mode: &str) -> PodReport {
    let known = |s: &str| (!s.is_empty() && s != "-").then(|| s.to_string());
    let (ns, name) = plan::who_from_comment(&p.comment)
        .split_once('/')
        .unwrap_or(("-", "-"));
    let field = |key: &str| {
        p.comment
            .split(' ')
            .skip(2)
            .find_map(|part| part.strip_prefix(key))
            .unwrap_or("")
            .to_string()
    };
    // An annotation's decision is recorded; otherwise the sets and the rules say it.
    let (policy, source) = match plan::policy_from_comment(&p.comment) {
        Some(t) => (t, "annotation"),
        None if p.exempt => ("exempt", "namespace"),
        None => (network_mode, "network"),
    };
    PodReport {
        namespace: known(ns),
        name: known(name),
        container_id: field("cid="),
        ifname: field("if="),
        // The pod's own host-side interface: its bridge port, or the routed veth.
        interface: p.attach.port.or(p.attach.iface).map(|i| i.to_string()),
        addrs: plan::addrs_from_comment(&p.comment),
        exempt: p.exempt,
        policy: policy.to_string(),
        policy_source: source.to_string(),
        proxied: p.proxied,
        reset: p.reset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_each_network_s_preset_and_why() {
        let dir = std::env::temp_dir().join(format!("ng-status-preset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let list = |name: &str, entry: &str| {
            format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge"}},{entry}]}}"#
            )
        };
        std::fs::write(
            dir.join("10-azure.conflist"),
            list(
                "azure",
                r#"{"type":"natguard","metadata":{"preset":"azure"}}"#,
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("20-plain.conflist"),
            list("plain", r#"{"type":"natguard"}"#),
        )
        .unwrap();
        let text = preset_lines(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "network azure: preset azure (from the config)\n");
        assert_eq!(preset_lines(std::path::Path::new("/nonexistent")), "");
    }
    use crate::plan::{AttachRecord, IfName, OwnerKey};

    fn record(comment: &str) -> store::PodRecord {
        store::PodRecord {
            owner: OwnerKey::new("n", "c", "eth0"),
            comment: comment.to_string(),
            attach: AttachRecord {
                iface: IfName::new("cni0"),
                ..AttachRecord::default()
            },
            exempt: false,
            proxied: Some(2),
            reset: None,
        }
    }

    #[test]
    fn pods_are_read_from_their_records() {
        let p = pod_report(
            &record("10.244.0.2,fd00::2 default/web cid=0123456789ab if=eth0"),
            "proxy",
        );
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.name.as_deref(), Some("web"));
        assert_eq!(p.container_id, "0123456789ab");
        assert_eq!(p.ifname, "eth0");
        assert_eq!(p.interface.as_deref(), Some("cni0"));
        let mut bridged = record("10.244.0.4 a/b cid=x if=eth0");
        bridged.attach.port = IfName::new("veth1a2b");
        assert_eq!(
            pod_report(&bridged, "proxy").interface.as_deref(),
            Some("veth1a2b")
        );
        assert_eq!(p.addrs.len(), 2);
        assert_eq!((p.proxied, p.reset), (Some(2), None));
        // What ADD records without CNI_ARGS names, and a record cut before its ifname.
        let p = pod_report(&record("10.244.0.3 -/- cid=abc"), "deny");
        assert_eq!((p.namespace, p.name), (None, None));
        assert_eq!((p.container_id.as_str(), p.ifname.as_str()), ("abc", ""));
        assert_eq!(
            (p.policy.as_str(), p.policy_source.as_str()),
            ("deny", "network")
        );
        // An annotation's decision is read from the record, wherever the record goes on.
        let p = pod_report(
            &record("10.244.0.4 default/web pol=deny cid=abc if=eth0"),
            "proxy",
        );
        assert_eq!(
            (p.policy.as_str(), p.policy_source.as_str()),
            ("deny", "annotation")
        );
        assert_eq!(
            (p.container_id.as_str(), p.ifname.as_str()),
            ("abc", "eth0")
        );
        let mut ex = record("10.244.0.5 kube-system/dns cid=abc if=eth0");
        ex.exempt = true;
        let p = pod_report(&ex, "proxy");
        assert_eq!(
            (p.policy.as_str(), p.policy_source.as_str()),
            ("exempt", "namespace")
        );
        assert_eq!(
            (p.container_id.as_str(), p.ifname.as_str()),
            ("abc", "eth0")
        );
    }
}
