//! ctnetlink's wire format: message types, attribute numbers, and the entries and tuples of a
//! dump as natguard reads them.
//!
//! The numbers are public so that the benchmark's helper (benches/tools/nfbench.rs), which
//! plants and counts entries, speaks ctnetlink with the same ones rather than a copy of its
//! own; the entry and tuple parsers stay inside the conntrack module.

use super::super::netlink::{Attrs, Msg, MsgBuf, NFNL_SUBSYS_CTNETLINK};
use crate::error::{Error, Result};
use std::net::IpAddr;

// ctnetlink message types (linux/netfilter/nfnetlink_conntrack.h).
pub const IPCTNL_MSG_CT_NEW: u16 = 0;
pub const IPCTNL_MSG_CT_GET: u16 = 1;
pub const IPCTNL_MSG_CT_DELETE: u16 = 2;
pub const IPCTNL_MSG_CT_GET_STATS: u16 = 5;

// enum ctattr_type
pub const CTA_TUPLE_ORIG: u16 = 1;
pub const CTA_TUPLE_REPLY: u16 = 2;
pub const CTA_STATUS: u16 = 3;
pub const CTA_TIMEOUT: u16 = 7;
pub const CTA_ID: u16 = 12;
pub const CTA_ZONE: u16 = 18;
pub const CTA_LABELS: u16 = 22;
pub const CTA_FILTER: u16 = 25;
pub const CTA_STATUS_MASK: u16 = 26;
// enum ctattr_tuple
pub const CTA_TUPLE_IP: u16 = 1;
pub const CTA_TUPLE_PROTO: u16 = 2;
// enum ctattr_ip
pub const CTA_IP_V4_SRC: u16 = 1;
pub const CTA_IP_V4_DST: u16 = 2;
pub const CTA_IP_V6_SRC: u16 = 3;
pub const CTA_IP_V6_DST: u16 = 4;
// enum ctattr_l4proto
pub const CTA_PROTO_NUM: u16 = 1;
pub const CTA_PROTO_SRC_PORT: u16 = 2;
pub const CTA_PROTO_DST_PORT: u16 = 3;
pub const CTA_PROTO_ICMP_ID: u16 = 4;
pub const CTA_PROTO_ICMP_TYPE: u16 = 5;
pub const CTA_PROTO_ICMP_CODE: u16 = 6;
pub const CTA_PROTO_ICMPV6_ID: u16 = 7;
pub const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
pub const CTA_PROTO_ICMPV6_CODE: u16 = 9;
// enum ctattr_filter
pub const CTA_FILTER_ORIG_FLAGS: u16 = 1;
pub const CTA_FILTER_REPLY_FLAGS: u16 = 2;
// CTA_FILTER_F_* (net/netfilter/nf_internals.h; not in the uapi headers)
pub const CTA_FILTER_F_CTA_IP_SRC: u32 = 1 << 0;
pub const CTA_FILTER_F_CTA_IP_DST: u32 = 1 << 1;
pub const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
pub const CTA_FILTER_F_CTA_PROTO_DST_PORT: u32 = 1 << 5;
// enum ctattr_stats_global
pub const CTA_STATS_GLOBAL_ENTRIES: u16 = 1;
// enum ip_conntrack_status
pub const IPS_DST_NAT: u32 = 1 << 5;

pub const AF_INET: u8 = libc::AF_INET as u8;
pub const AF_INET6: u8 = libc::AF_INET6 as u8;
pub const IPPROTO_TCP: u8 = libc::IPPROTO_TCP as u8;
pub const IPPROTO_UDP: u8 = libc::IPPROTO_UDP as u8;
pub const IPPROTO_ICMP: u8 = libc::IPPROTO_ICMP as u8;
pub const IPPROTO_ICMPV6: u8 = libc::IPPROTO_ICMPV6 as u8;

/// One tuple attribute of an entry to create (`ty`: [`CTA_TUPLE_ORIG`] or [`CTA_TUPLE_REPLY`]):
/// both addresses (one family), the protocol and its ports; for ICMP and ICMPv6, `sport` is the
/// echo id and `dport` the type (code 0). natguard itself creates entries only in the IPv6
/// filter probe; the tests and the benchmark's helper plant theirs with it too.
pub fn put_tuple(
    b: &mut MsgBuf,
    ty: u16,
    proto: u8,
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
) {
    let t = b.nest_begin(ty);
    let ip = b.nest_begin(CTA_TUPLE_IP);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            b.attr(CTA_IP_V4_SRC, &s.octets());
            b.attr(CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            b.attr(CTA_IP_V6_SRC, &as_v6(s).octets());
            b.attr(CTA_IP_V6_DST, &as_v6(d).octets());
        }
    }
    b.nest_end(ip);
    let p = b.nest_begin(CTA_TUPLE_PROTO);
    b.attr_u8(CTA_PROTO_NUM, proto);
    match proto {
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let (id, kind, code) = if proto == IPPROTO_ICMP {
                (CTA_PROTO_ICMP_ID, CTA_PROTO_ICMP_TYPE, CTA_PROTO_ICMP_CODE)
            } else {
                (
                    CTA_PROTO_ICMPV6_ID,
                    CTA_PROTO_ICMPV6_TYPE,
                    CTA_PROTO_ICMPV6_CODE,
                )
            };
            b.attr_u16_be(id, sport);
            b.attr_u8(kind, dport as u8);
            b.attr_u8(code, 0);
        }
        _ => {
            b.attr_u16_be(CTA_PROTO_SRC_PORT, sport);
            b.attr_u16_be(CTA_PROTO_DST_PORT, dport);
        }
    }
    b.nest_end(p);
    b.nest_end(t);
}

/// An address as IPv6 (an IPv4 one mapped), for a tuple whose family is IPv6.
fn as_v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}

pub const fn ct_msg(msg: u16) -> u16 {
    ((NFNL_SUBSYS_CTNETLINK as u16) << 8) | msg
}

/// The fields of a tuple that matching needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tuple {
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    pub(super) proto: u8,
    pub(super) sport: Option<u16>,
    pub(super) dport: Option<u16>,
}

impl Tuple {
    pub(super) fn parse(payload: &[u8], family: u8) -> Result<Tuple> {
        let bad = |what: &str| Error::Protocol(format!("conntrack: malformed tuple: {what}"));
        let attrs = Attrs::new(payload);
        let ip = attrs.get(CTA_TUPLE_IP).ok_or_else(|| bad("no address"))?;
        let ip = ip.nested();
        let (src, dst) = match family {
            AF_INET => (
                ip.get(CTA_IP_V4_SRC).and_then(|a| v4(a.payload)),
                ip.get(CTA_IP_V4_DST).and_then(|a| v4(a.payload)),
            ),
            AF_INET6 => (
                ip.get(CTA_IP_V6_SRC).and_then(|a| v6(a.payload)),
                ip.get(CTA_IP_V6_DST).and_then(|a| v6(a.payload)),
            ),
            _ => (None, None),
        };
        let proto = attrs
            .get(CTA_TUPLE_PROTO)
            .ok_or_else(|| bad("no protocol"))?;
        let proto = proto.nested();
        Ok(Tuple {
            src: src.ok_or_else(|| bad("no source address"))?,
            dst: dst.ok_or_else(|| bad("no destination address"))?,
            proto: proto
                .get(CTA_PROTO_NUM)
                .and_then(|a| a.payload.first().copied())
                .ok_or_else(|| bad("no protocol number"))?,
            sport: proto.get(CTA_PROTO_SRC_PORT).and_then(|a| a.u16_be()),
            dport: proto.get(CTA_PROTO_DST_PORT).and_then(|a| a.u16_be()),
        })
    }
}

pub(super) fn v4(p: &[u8]) -> Option<IpAddr> {
    let o: [u8; 4] = p.try_into().ok()?;
    Some(IpAddr::from(o))
}

pub(super) fn v6(p: &[u8]) -> Option<IpAddr> {
    let o: [u8; 16] = p.try_into().ok()?;
    Some(IpAddr::from(o))
}

/// One dumped entry.
#[derive(Debug)]
pub(super) struct Entry<'a> {
    pub(super) family: u8,
    pub(super) orig: Tuple,
    pub(super) reply: Tuple,
    /// The CTA_TUPLE_ORIG payload as the kernel sent it.
    pub(super) orig_raw: &'a [u8],
    pub(super) id: Option<u32>,
    pub(super) zone: Option<&'a [u8]>,
    /// The conntrack labels (`CTA_LABELS`, the kernel's 128-bit bitmap: bit N in byte N/8 on
    /// the little-endian machines natguard is built for, as `ct label set N` writes it); 0
    /// when the entry has none.
    pub(super) labels: u128,
}

impl<'a> Entry<'a> {
    pub(super) fn parse(m: &'a Msg) -> Result<Entry<'a>> {
        let family = m.nf_family();
        if family != AF_INET && family != AF_INET6 {
            return Err(Error::Protocol(format!(
                "conntrack: entry of unknown family {family}"
            )));
        }
        let attrs = m.nf_attrs();
        let orig = attrs
            .get(CTA_TUPLE_ORIG)
            .ok_or_else(|| Error::Protocol("conntrack: entry without original tuple".into()))?;
        let reply = attrs
            .get(CTA_TUPLE_REPLY)
            .ok_or_else(|| Error::Protocol("conntrack: entry without reply tuple".into()))?;
        Ok(Entry {
            family,
            orig: Tuple::parse(orig.payload, family)?,
            reply: Tuple::parse(reply.payload, family)?,
            orig_raw: orig.payload,
            id: attrs.get(CTA_ID).and_then(|a| a.u32_be()),
            zone: attrs.get(CTA_ZONE).map(|a| a.payload),
            labels: attrs
                .get(CTA_LABELS)
                .and_then(|a| <[u8; 16]>::try_from(a.payload).ok())
                .map_or(0, u128::from_le_bytes),
        })
    }
}
