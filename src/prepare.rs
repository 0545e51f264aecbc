//! One attachment, validated and planned: what ADD installs, and what `natguard adopt` installs
//! from a runtime's cached result.
//!
//! Both go through [`prepare_pod`], so a cached result meets exactly the checks a live ADD does:
//! the shape of prevResult, addresses that no pod may hold (including the node's own and the
//! metadata addresses), the proxy outside the pods' networks, a pod interface whose traffic
//! crosses the node's netfilter. Everything is refused before the kernel is touched; the node
//! facts the plan needs are looked up here, and the plan itself is [`crate::plan`]'s, pure.

use crate::cni;
use crate::cni::prev_result::PodIp;
use crate::config::{Config, MetadataMode, ProxyAddr};
use crate::error::{Error, Result};
use crate::kernel;
use crate::plan::{self, NodeFacts, PodPlan, PodRef, SharedPlan};
use crate::warn;
use serde_json::Value;
use std::net::IpAddr;

/// One attachment, validated and planned: what ADD (and adopt, from a cached result) installs.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub shared: SharedPlan,
    pub pod: PodPlan,
    pub addrs: Vec<IpAddr>,
}

/// Who an attachment is, from the CNI identity and CNI_ARGS.
pub(crate) struct Identity<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// `CNI_NETNS` (or the cached result's sandbox); empty when unknown.
    pub netns: &'a str,
    /// Where `netns` came from, for error messages (`CNI_NETNS`).
    pub netns_from: &'static str,
    pub args: &'a cni::CniArgs,
    /// natguard's pod annotations (runtimeConfig, or the cache's capabilityArgs).
    pub annotations: crate::policy::Annotations,
}

/// [`Identity::netns_from`] of an attachment read from a runtime's CNI result cache.
pub(crate) const CACHED_SANDBOX: &str = "the cached result's sandbox";

/// Validates a primary plugin's result for `who` and plans its attachment under `cfg`; the
/// node facts (proxy addresses, the node's own addresses, the pod's host-side interface) are
/// looked up here, before planning. Everything is refused before the kernel is touched.
/// The pod's own interface, inspected once as its network namespace sees it
/// ([`kernel::podside::inspect`]); a path that is no network namespace is a CNI error naming
/// where the path came from.
pub(crate) fn inspect(who: &Identity<'_>) -> Result<Option<kernel::podside::PodLink>> {
    kernel::podside::inspect(who.netns, who.ifname).map_err(|e| {
        Error::InvalidEnv(format!(
            "{}: {:?} {}",
            who.netns_from,
            crate::error::truncate(who.netns, 200),
            e.0
        ))
    })
}

/// `pod_link`: what [`inspect`] found (the caller decides what an uninspectable namespace
/// means: an error at ADD, a skipped attachment for adopt).
pub(crate) fn prepare_pod(
    cfg: &Config,
    who: &Identity<'_>,
    prev: &Value,
    pod_link: Option<kernel::podside::PodLink>,
) -> Result<Prepared> {
    crate::policy::refuse_unenforceable(cfg, &who.annotations)?;
    let ips = cni::prev_result::check_shape(prev, who.ifname)?;
    // One rtnetlink socket for every lookup of the node's side: its addresses, the tc filters
    // and the host side of the pod's interface.
    let mut links = kernel::link::Links::open().ok();
    let addrs_of_result: Vec<IpAddr> = ips.iter().map(|ip| ip.addr).collect();
    let own = match links.as_mut() {
        Some(l) if !addrs_of_result.is_empty() => crate::node::own_among_with(l, &addrs_of_result),
        _ => Vec::new(),
    };
    if let Some((ip, why)) = ips
        .iter()
        .find_map(|ip| not_a_pod_address_here(cfg, &own, ip).map(|why| (ip, why)))
    {
        return Err(Error::InvalidConfig(format!(
            "{}: {:?} {why}, not a pod address; the primary plugin's result is refused",
            ip.field(),
            ip.text()
        )));
    }
    let addrs: Vec<IpAddr> = ips.iter().map(|ip| ip.addr).collect();
    check_addr_count(&addrs, who.ifname)?;
    let node: NodeFacts = crate::node::facts(cfg);
    check_proxy_outside_pods(cfg, &node, &ips)?;
    if let Some(link) = &pod_link {
        if !link.crosses_the_node() && !cfg.metadata.accept_unenforced {
            return Err(Error::InvalidConfig(format!(
                "{}: the pod's interface {} in {} is {}, not a veth: its traffic never crosses this node's netfilter, so natguard cannot enforce the metadata policy for it (set metadata.acceptUnenforced to true to accept the pod unguarded)",
                who.network,
                who.ifname,
                who.netns,
                link.kind
                    .as_deref()
                    .map(|k| format!("a {k} device"))
                    .unwrap_or_else(|| "a device of its own (a NIC or a VF)".into())
            )));
        }
    }
    if let Some(peer) = pod_link.as_ref().and_then(|l| l.peer) {
        refuse_steered(cfg, who, links.as_mut(), peer)?;
    }
    let host = host_side_of(cfg, who, prev, &addrs, pod_link.as_ref(), links.as_mut())?;
    let shared = plan::plan_shared(who.network, cfg, &node);
    let pod_ref = PodRef {
        network: who.network,
        container_id: who.container_id,
        ifname: who.ifname,
        namespace: who.args.pod_namespace.as_deref(),
        pod_name: who.args.pod_name.as_deref(),
        netns: who.netns,
        host,
        annotations: who.annotations,
    };
    let pod = plan::plan_pod(cfg, &pod_ref, &addrs);
    Ok(Prepared { shared, pod, addrs })
}

/// A pod whose host-side veth (index `peer`) has tc filters that can steer its packets around
/// the node's netfilter (a `bpf` classifier, as Cilium's host routing and Calico's eBPF
/// dataplane attach with direct action; a `mirred` redirect) would be reported as guarded and
/// reach the real metadata API: refused with code 7 unless the operator accepts unenforced
/// pods, and then logged. tcx attachments (Linux 6.6) are not listed by a filter dump and not
/// seen here (docs/security.md).
fn refuse_steered(
    cfg: &Config,
    who: &Identity<'_>,
    links: Option<&mut kernel::link::Links>,
    peer: u32,
) -> Result<()> {
    // What cannot be listed cannot be shown clean: refused like a steered pod (fail closed).
    let listed = match links {
        Some(l) => l
            .tc_steering(peer)
            .map(|f| (f, l))
            .map_err(|e| e.to_string()),
        None => Err("no rtnetlink socket".into()),
    };
    let (found, links) = match listed {
        Ok(x) => x,
        Err(e) => {
            let msg = format!(
                "{}: the tc filters of the host side of {} cannot be listed ({e}): natguard cannot tell whether they steer its packets around netfilter",
                who.network, who.ifname
            );
            if !cfg.metadata.accept_unenforced {
                return Err(Error::InvalidConfig(format!(
                    "{msg} (set metadata.acceptUnenforced to true to accept such pods unguarded)"
                )));
            }
            warn!("{msg}; accepted (metadata.acceptUnenforced)");
            return Ok(());
        }
    };
    if found.is_empty() {
        return Ok(());
    }
    let name = links
        .link_by_index(peer)
        .ok()
        .flatten()
        .map_or_else(|| format!("index {peer}"), |(n, _)| n);
    let msg = format!(
        "{}: the host side {name} of the pod's interface {} has {}: packets it steers bypass this node's netfilter, so natguard cannot enforce the metadata policy for them",
        who.network,
        who.ifname,
        found.join("; ")
    );
    if !cfg.metadata.accept_unenforced {
        return Err(Error::InvalidConfig(format!(
            "{msg} (set metadata.acceptUnenforced to true to accept the pod unguarded)"
        )));
    }
    warn!("{msg}; accepted unguarded (metadata.acceptUnenforced)");
    Ok(())
}

/// The pod's host side as the kernel tells it ([`crate::node::host_side`]). A host-side
/// interface prevResult names that is neither the pod's veth nor its bridge (`lo`, an uplink,
/// another device) is refused with code 7 unless the operator accepts unenforced networks;
/// where the pod's veth cannot be found, the pod is exempt nowhere (it fails closed) and the
/// log says why.
fn host_side_of(
    cfg: &Config,
    who: &Identity<'_>,
    prev: &Value,
    addrs: &[IpAddr],
    pod: Option<&kernel::podside::PodLink>,
    links: Option<&mut kernel::link::Links>,
) -> Result<Option<plan::HostSide>> {
    let found = crate::node::host_side(links, &cni::prev_result::host_interfaces(prev), addrs, pod);
    if let Some(name) = found.foreign.first() {
        let msg = format!(
            "prevResult.interfaces: {:?} is not the host side of {}'s interface {} (not a veth whose peer is the pod's interface, nor that veth's bridge)",
            crate::error::truncate(name, 40),
            who.network,
            who.ifname
        );
        if !cfg.metadata.accept_unenforced {
            return Err(Error::InvalidConfig(format!(
                "{msg}; natguard never keys a pod by such a device (set metadata.acceptUnenforced to true to accept the network regardless)"
            )));
        }
        warn!("{msg}; it is ignored (metadata.acceptUnenforced)");
    }
    match found.side {
        Ok(mut h) => {
            h.mac = pod.and_then(|p| p.mac);
            Ok(Some(h))
        }
        Err(why) => {
            warn!(
                "{}: the host side of {} cannot be established ({why}); the pod is exempt on no interface",
                who.network, who.ifname
            );
            Ok(None)
        }
    }
}

/// Why `ip` cannot be a pod's address on this node, if it cannot: the one rule by which ADD
/// refuses a primary plugin's result and DEL filters what it flushes. Besides the addresses no
/// pod can hold, a pod claiming a metadata address or one of the node's own would make natguard
/// exempt, or flush, traffic that is not the pod's. `own`: those of the pod's addresses that are
/// the node's ([`crate::node::own_among`]).
pub(crate) fn not_a_pod_address_here(cfg: &Config, own: &[IpAddr], ip: &PodIp) -> Option<String> {
    if let Some(why) = crate::addr::not_a_pod_address(ip.addr, ip.prefix) {
        Some(why)
    } else if cfg.metadata.addresses.contains(&ip.addr) {
        Some("is a metadata address (metadata.addresses)".into())
    } else if own.contains(&ip.addr) {
        Some("is an address of this node".into())
    } else {
        None
    }
}

/// A proxy inside the pod's own network would put the interception's target among the pods;
/// an `auto` proxy that resolves to a metadata endpoint would be the real API.
fn check_proxy_outside_pods(cfg: &Config, node: &NodeFacts, ips: &[PodIp]) -> Result<()> {
    if cfg.metadata.mode != MetadataMode::Proxy {
        return Ok(());
    }
    let proxies = [
        (
            "metadata.proxyIPv4",
            node.proxy_v4.map(IpAddr::V4),
            matches!(cfg.metadata.proxy_ipv4, ProxyAddr::Fixed(_)),
        ),
        (
            "metadata.proxyIPv6",
            node.proxy_v6.map(IpAddr::V6),
            matches!(cfg.metadata.proxy_ipv6, ProxyAddr::Fixed(_)),
        ),
    ];
    for (field, proxy, fixed) in proxies {
        let Some(p) = proxy else { continue };
        // A fixed one was refused when the config was parsed.
        if let Some(why) = crate::config::not_a_proxy(p, &cfg.metadata.addresses) {
            return Err(Error::InvalidConfig(format!(
                "{field}: \"auto\" resolves to \"{p}\", which {why}: the proxy must be another address (set {field} to the proxy's address)"
            )));
        }
        for ip in ips {
            if crate::addr::contains(ip.addr, ip.prefix, p) {
                let msg = format!(
                    "{field}: \"{p}\" is inside the pod network {} ({}); the proxy must be outside the pods' networks",
                    ip.text(),
                    ip.field()
                );
                if fixed {
                    return Err(Error::InvalidConfig(msg));
                }
                warn!("{msg} (resolved from \"auto\")");
            }
        }
    }
    Ok(())
}

/// The record of a pod keeps every address: refuse more than it can hold.
fn check_addr_count(addrs: &[IpAddr], ifname: &str) -> Result<()> {
    if plan::addrs_fit(addrs) {
        return Ok(());
    }
    Err(Error::InvalidConfig(format!(
        "prevResult: {} addresses on {ifname} ({}{}) are more than natguard records per interface (at most {} IPv6 addresses)",
        addrs.len(),
        addrs.iter().take(4).map(|a| a.to_string()).collect::<Vec<_>>().join(", "),
        if addrs.len() > 4 { ", ..." } else { "" },
        plan::MAX_POD_ADDRS
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_auto_proxy_that_resolves_to_a_metadata_endpoint_is_refused() {
        let cfg = Config::default();
        for (v4, v6, field, value) in [
            (
                Some("169.254.170.2"),
                None,
                "metadata.proxyIPv4",
                "169.254.170.2",
            ),
            (
                None,
                Some("fd00:ec2::254"),
                "metadata.proxyIPv6",
                "fd00:ec2::254",
            ),
        ] {
            let node = NodeFacts {
                proxy_v4: v4.map(|a| a.parse().unwrap()),
                proxy_v6: v6.map(|a| a.parse().unwrap()),
            };
            let e = check_proxy_outside_pods(&cfg, &node, &[]).unwrap_err();
            assert_eq!(e.code(), 7, "{e}");
            let m = e.to_string();
            assert!(m.contains(field) && m.contains(value), "{m}");
        }
        let node = NodeFacts {
            proxy_v4: Some("10.0.0.1".parse().unwrap()),
            proxy_v6: None,
        };
        assert!(check_proxy_outside_pods(&cfg, &node, &[]).is_ok());
    }
}
