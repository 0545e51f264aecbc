//! Addresses and prefixes: the one place that does address arithmetic.
//!
//! Prefixes are stored with their host bits cleared and handled as inclusive integer ranges of
//! the family's width (32 or 128 bits), which is how interval sets hold them in the kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address prefix, stored with its host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = s.split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let prefix: u8 = p.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return None;
        }
        Some(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// First and last address of the prefix, as integers of the family's width.
    pub fn range(&self) -> (u128, u128) {
        let bits = if self.is_ipv4() { 32 } else { 128 };
        let start = ip_to_u128(self.addr);
        let host = bits - self.prefix as u32;
        let span = if host >= 128 {
            u128::MAX
        } else {
            (1u128 << host) - 1
        };
        (start, start | span)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix)
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// The address of family `v4`/`v6` whose integer form is `v`.
pub fn u128_to_ip(v4: bool, v: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

/// The shortest prefix a pod address may come with, per family. A primary plugin that hands
/// out a shorter one (a `/0` above all) is broken, and natguard refuses the pod rather than
/// guess what the pod's network is.
pub const MIN_POD_PREFIX_V4: u8 = 8;
pub const MIN_POD_PREFIX_V6: u8 = 16;

/// Why `a/prefix` cannot be a pod's address, or `None` when it can. IPv4 link-local addresses
/// stay legal (AWS VPC CNI gives IPv6 pods one from 169.254.172.0/22).
pub fn not_a_pod_address(a: IpAddr, prefix: u8) -> Option<String> {
    let what = match a {
        IpAddr::V4(v4) if v4.is_unspecified() => "the unspecified address",
        IpAddr::V4(v4) if v4.octets()[0] == 0 => "in 0.0.0.0/8 (\"this network\")",
        IpAddr::V4(v4) if v4.is_loopback() => "a loopback address",
        IpAddr::V4(v4) if v4.is_multicast() => "a multicast address",
        IpAddr::V4(v4) if v4.is_broadcast() => "the broadcast address",
        IpAddr::V6(v6) if v6.is_unspecified() => "the unspecified address",
        IpAddr::V6(v6) if v6.is_loopback() => "a loopback address",
        IpAddr::V6(v6) if v6.is_multicast() => "a multicast address",
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => "an IPv4-mapped IPv6 address",
        _ => {
            let min = if a.is_ipv4() {
                MIN_POD_PREFIX_V4
            } else {
                MIN_POD_PREFIX_V6
            };
            if prefix < min {
                return Some(format!(
                    "has prefix /{prefix}, shorter than /{min}, the shortest natguard accepts for a pod"
                ));
            }
            return None;
        }
    };
    Some(format!("is {what}"))
}

/// Whether `a` lies in `net/prefix`.
pub fn contains(net: IpAddr, prefix: u8, a: IpAddr) -> bool {
    if net.is_ipv4() != a.is_ipv4() {
        return false;
    }
    let c = Cidr {
        addr: mask(net, prefix),
        prefix,
    };
    let (lo, hi) = c.range();
    let v = ip_to_u128(a);
    lo <= v && v <= hi
}
