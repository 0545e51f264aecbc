//! Facts about the node that the plan needs, looked up before planning.
//!
//! - Which of a pod's addresses are the node's own: a pod may never be given one of them. The
//!   kernel is asked about those addresses only (one rtnetlink route lookup each, answered as
//!   `RTN_LOCAL` for an address of the node), so the cost does not grow with the node's
//!   interfaces: a node with a hundred pods has a hundred veths. An address the kernel does not
//!   deliver locally (on an interface that is down, or still tentative in IPv6's duplicate
//!   address detection) is not the node's yet. Where a route lookup fails, every interface's
//!   addresses are listed instead (one rtnetlink address dump, what `getifaddrs` sends).
//! - Where a pod's packets enter the node: the node-side peer of the pod's veth, told by the
//!   kernel (interface indexes over rtnetlink), and the bridge that veth is a port of. The
//!   host-side interfaces the primary plugin reports in prevResult are only checked against
//!   it: a claim is never used as the host side.
//!
//! `auto` proxy addresses are the node's primary address of each family: the source address the
//! kernel picks for a route to a documentation address (192.0.2.1, 2001:db8::1). Connecting a UDP
//! socket sends nothing; it only asks the routing table. No route means no address, and the plan
//! then denies that family's metadata traffic instead of letting it through.

use crate::config::{Config, ProxyAddr};
use crate::kernel::link;
use crate::kernel::podside::PodLink;
use crate::plan::{HostSide, IfName, NodeFacts};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The source address the kernel would use towards `dst`, if it has a route.
pub fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect((dst, 9)).ok()?;
    let src = s.local_addr().ok()?.ip();
    (!src.is_unspecified()).then_some(src)
}

pub fn primary_v4() -> Option<Ipv4Addr> {
    match route_source(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)))? {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

pub fn primary_v6() -> Option<Ipv6Addr> {
    match route_source(IpAddr::V6("2001:db8::1".parse().ok()?))? {
        IpAddr::V6(a) if !a.is_loopback() => Some(a),
        _ => None,
    }
}

/// Resolves the config's proxy addresses; only `auto` asks the kernel.
pub fn facts(cfg: &Config) -> NodeFacts {
    NodeFacts {
        proxy_v4: match cfg.metadata.proxy_ipv4 {
            ProxyAddr::Fixed(a) => Some(a),
            ProxyAddr::Auto => primary_v4(),
        },
        proxy_v6: match cfg.metadata.proxy_ipv6 {
            ProxyAddr::Fixed(a) => Some(a),
            ProxyAddr::Auto => primary_v6(),
        },
    }
}

/// Those of `addrs` that are the node's own (see the module doc). Where a route lookup fails,
/// the same socket lists every interface's addresses once (one `RTM_GETADDR` dump) and those
/// of `addrs` among them are the node's; none when rtnetlink answers neither.
pub fn own_among(addrs: &[IpAddr]) -> Vec<IpAddr> {
    if addrs.is_empty() {
        return Vec::new();
    }
    match link::Links::open() {
        Ok(mut links) => own_among_with(&mut links, addrs),
        Err(_) => Vec::new(),
    }
}

/// [`own_among`] on the caller's rtnetlink socket.
pub fn own_among_with(links: &mut link::Links, addrs: &[IpAddr]) -> Vec<IpAddr> {
    let mut own = Vec::new();
    for &a in addrs {
        match links.is_local(a) {
            Ok(true) => own.push(a),
            Ok(false) => {}
            Err(_) => {
                let all = links.addresses().unwrap_or_default();
                return addrs.iter().copied().filter(|a| all.contains(a)).collect();
            }
        }
    }
    own
}

/// Where a pod's packets enter the node, established from the kernel, not from the primary
/// plugin's word: the node-side peer of the pod's veth (the pod's interface has `IFLA_LINK` =
/// its index, it is a veth, and its own `IFLA_LINK` is the pod's interface's index), and, when
/// that veth is a port of a bridge, the bridge. A port gives (bridge, port); a veth that is
/// no port is the routed veth itself.
#[derive(Debug)]
pub struct HostFinding {
    /// The pod's host side, or why it cannot be told (then the pod is exempt nowhere).
    pub side: Result<HostSide, String>,
    /// Host-side interfaces prevResult names that exist on the node and are neither the pod's
    /// veth nor its bridge (`lo`, an uplink, another pod's veth): never used. Told only when
    /// the pod's veth was found.
    pub foreign: Vec<String>,
}

/// [`HostFinding`] for the pod interface `pod` (as [`crate::kernel::podside::inspect`] saw
/// it), checking the host-side interface names of its prevResult (`names`) against it. On a
/// bridge whose IP layer sits on another device of the same bridge (the bridge plugin's
/// `vlan`: the gateway is on `BRIDGE.VLAN`, a veth whose peer is a port of the bridge; or a
/// VLAN device on the bridge), that device is where the pod's packets enter the IP layer, so
/// it is the one the guard keys the pod by (found by the node's route to the pod's first
/// address); the port stays the bridge port. A route that leaves by anything else (an uplink)
/// changes nothing.
pub fn host_side(
    links: Option<&mut link::Links>,
    names: &[String],
    addrs: &[IpAddr],
    pod: Option<&PodLink>,
) -> HostFinding {
    let Some(links) = links else {
        return HostFinding {
            side: Err("no rtnetlink socket to look the host side up with".into()),
            foreign: Vec::new(),
        };
    };
    let peer = pod_peer(links, pod);
    let side = peer.clone().map(|(veth, bridge)| match bridge {
        Some(bridge) => {
            let iface = addrs
                .iter()
                .find_map(|a| links.route_oif(*a).ok().flatten())
                .and_then(|oif| bridge_ip_device(links, &oif, bridge, veth))
                .unwrap_or(bridge);
            HostSide {
                iface,
                port: Some(veth),
                mac: None,
                bridge: (iface != bridge).then_some(bridge),
            }
        }
        None => HostSide {
            iface: veth,
            port: None,
            mac: None,
            bridge: None,
        },
    });
    let mut foreign = Vec::new();
    // Without the pod's veth nothing is used, and a claim cannot be told from the truth.
    if let Ok((veth, bridge)) = peer {
        for name in names {
            let Some(n) = IfName::new(name) else { continue };
            // The pod's veth, its bridge, or another IP device of that bridge (the bridge
            // plugin's `vlan` gateway `BRIDGE.VLAN`, which its result lists) is the pod's.
            let ours = n == veth
                || bridge
                    .is_some_and(|b| n == b || bridge_ip_device(links, name, b, veth).is_some());
            // A name the kernel does not know names nothing natguard could use.
            if !ours && matches!(links.link(name), Ok(Some(_))) {
                foreign.push(name.clone());
            }
        }
    }
    HostFinding { side, foreign }
}

/// The node-side peer of the pod's veth and the bridge it is a port of, or why there is none.
fn pod_peer(
    links: &mut link::Links,
    pod: Option<&PodLink>,
) -> Result<(IfName, Option<IfName>), String> {
    let pod = pod.ok_or("the pod's interface could not be looked up in its network namespace")?;
    let peer = pod
        .peer
        .ok_or("the pod's interface has no peer in another namespace (not a veth)")?;
    let (name, l) = links
        .link_by_index(peer)
        .map_err(|e| format!("looking up its peer (index {peer}): {e}"))?
        .ok_or_else(|| format!("the node has no interface with its peer's index {peer}"))?;
    if l.kind.as_deref() != Some("veth") || l.peer != Some(pod.index) {
        return Err(format!(
            "the node's interface {name:?} (index {peer}) is not the pod's veth peer"
        ));
    }
    let veth = IfName::new(&name).ok_or_else(|| format!("{name:?} is no interface name"))?;
    let bridge = match l.master {
        Some(m) if matches!(links.link(&m), Ok(Some(ml)) if ml.is_bridge) => IfName::new(&m),
        _ => None,
    };
    Ok((veth, bridge))
}

/// `oif` when it is another IP device of `bridge`: a VLAN device on it, or a veth whose peer is
/// one of its ports (never the pod's own port).
fn bridge_ip_device(
    links: &mut link::Links,
    oif: &str,
    bridge: IfName,
    port: IfName,
) -> Option<IfName> {
    let dev = IfName::new(oif)?;
    if dev == bridge || dev == port {
        return None;
    }
    let lower = links.link(oif).ok()??.lower?;
    let lower_name = IfName::new(&lower)?;
    if lower_name == port {
        return None;
    }
    let on_bridge = lower_name == bridge
        || links
            .link(&lower)
            .ok()
            .flatten()
            .and_then(|l| l.master)
            .and_then(|m| IfName::new(&m))
            == Some(bridge);
    on_bridge.then_some(dev)
}

/// The calling thread's network namespace as (device, inode) of `/proc/thread-self/ns/net`:
/// what natguard's per-node records are keyed by, since generations and conntrack tables of
/// different namespaces are unrelated.
pub(crate) fn netns_id() -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/thread-self/ns/net").ok()?;
    Some((m.dev(), m.ino()))
}
