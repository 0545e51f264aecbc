//! Facts about the node that the plan needs, looked up before planning.
//!
//! - Which of a pod's addresses are the node's own: a pod may never be given one of them. The
//!   kernel is asked about those addresses only (one rtnetlink route lookup each, answered as
//!   `RTN_LOCAL` for an address of the node), so the cost does not grow with the node's
//!   interfaces: a node with a hundred pods has a hundred veths. An address the kernel does not
//!   deliver locally (on an interface that is down, or still tentative in IPv6's duplicate
//!   address detection) is not the node's yet. Without an rtnetlink socket, every interface's
//!   addresses are listed instead (`getifaddrs`).
//! - Where a pod's packets enter the node: the host-side interfaces the primary plugin reports
//!   in prevResult, resolved with rtnetlink into the interface the IP layer sees (the routed
//!   veth, or the bridge) and, on a bridge, the pod's port.
//!
//! `auto` proxy addresses are the node's primary address of each family: the source address the
//! kernel picks for a route to a documentation address (192.0.2.1, 2001:db8::1). Connecting a UDP
//! socket sends nothing; it only asks the routing table. No route means no address, and the plan
//! then denies that family's metadata traffic instead of letting it through.

use crate::config::{Config, ProxyAddr};
use crate::kernel::link;
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

/// Those of `addrs` that are the node's own (see the module doc).
pub fn own_among(addrs: &[IpAddr]) -> Vec<IpAddr> {
    if addrs.is_empty() {
        return Vec::new();
    }
    let Ok(mut links) = link::Links::open() else {
        return own_addresses();
    };
    let mut own = Vec::new();
    for &a in addrs {
        match links.is_local(a) {
            Ok(true) => own.push(a),
            Ok(false) => {}
            Err(_) => return own_addresses(),
        }
    }
    own
}

/// Every address configured on an interface of the calling thread's network namespace.
fn own_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we walk read-only and free once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let sa = (*cur).ifa_addr;
            if !sa.is_null() {
                match (*sa).sa_family as libc::c_int {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// Where a pod's packets enter the node, from the host-side interface names of its
/// prevResult: a port of a bridge gives (bridge, port); an interface that is not a port is the
/// routed veth itself. An interface the kernel does not know is taken as routed, as reported.
/// A primary plugin that reports no host-side interface gets the interface the node's route to
/// the pod's first address leaves by. On a bridge whose IP layer sits on another device of the
/// same bridge (the bridge plugin's `vlan`: the gateway is on `BRIDGE.VLAN`, a veth whose peer
/// is a port of the bridge; or a VLAN device on the bridge), that device is where the pod's
/// packets enter the IP layer, so it is the one the guard keys the pod by; the port stays the
/// bridge port. A route that leaves by anything else (an uplink) changes nothing.
pub fn host_side(names: &[String], addrs: &[IpAddr]) -> Option<HostSide> {
    // One socket for every lookup; without one, every interface is taken as reported.
    let mut links = link::Links::open().ok();
    let route_oif = |links: &mut link::Links| {
        addrs
            .iter()
            .find_map(|a| links.route_oif(*a).ok().flatten())
    };
    if names.is_empty() {
        let links = links.as_mut()?;
        let oif = route_oif(links)?;
        return classify(Some(links), &[oif]);
    }
    let mut host = classify(links.as_mut(), names)?;
    if let (Some(port), Some(l)) = (host.port, links.as_mut()) {
        if let Some(oif) = route_oif(l) {
            if let Some(dev) = bridge_ip_device(l, &oif, host.iface, port) {
                host.iface = dev;
            }
        }
    }
    Some(host)
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

/// [`host_side`] for named interfaces.
fn classify(mut links: Option<&mut link::Links>, names: &[String]) -> Option<HostSide> {
    let (mut port, mut routed, mut bridge, mut unknown) = (None, None, None, None);
    for name in names {
        let Some(n) = IfName::new(name) else { continue };
        let found = match links.as_deref_mut() {
            Some(l) => l.link(name),
            None => Ok(None),
        };
        match found {
            Ok(Some(l)) if l.is_bridge => {
                bridge.get_or_insert(n);
            }
            Ok(Some(l)) => match l.master.as_deref().and_then(IfName::new) {
                Some(m) => {
                    port.get_or_insert((m, n));
                }
                None => {
                    routed.get_or_insert(n);
                }
            },
            Ok(None) | Err(_) => {
                unknown.get_or_insert(n);
            }
        }
    }
    if let Some((iface, p)) = port {
        return Some(HostSide {
            iface,
            port: Some(p),
            mac: None,
        });
    }
    routed.or(bridge).or(unknown).map(|iface| HostSide {
        iface,
        port: None,
        mac: None,
    })
}

/// The calling thread's network namespace as (device, inode) of `/proc/thread-self/ns/net`:
/// what natguard's per-node records are keyed by, since generations and conntrack tables of
/// different namespaces are unrelated.
pub(crate) fn netns_id() -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/thread-self/ns/net").ok()?;
    Some((m.dev(), m.ino()))
}

/// A small file of the kernel's (procfs, sysfs) read whole into a buffer of `cap` bytes made
/// up front: procfs gives no size, and growing a buffer from 32 bytes costs a read each step.
pub(crate) fn read_small(path: &str, cap: usize) -> Option<String> {
    use std::io::Read as _;
    let mut s = String::with_capacity(cap);
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}
