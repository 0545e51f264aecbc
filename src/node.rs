//! Facts about the node that the plan needs, looked up before planning.
//!
//! `auto` proxy addresses are the node's primary address of each family: the source address the
//! kernel picks for a route to a documentation address (192.0.2.1, 2001:db8::1). Connecting a UDP
//! socket sends nothing; it only asks the routing table. No route means no address, and the plan
//! then denies that family's metadata traffic instead of letting it through.

use crate::config::{Config, ProxyAddr};
use crate::plan::NodeFacts;
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
