//! Interface facts from rtnetlink: whether an interface is a bridge and the bridge an interface
//! is a port of (`RTM_GETLINK`), the interface a route to an address leaves by
//! (`RTM_GETROUTE`), for primary plugins that report no host-side interface, and whether an
//! address is the node's own (the same route lookup, answered with a route of type
//! `RTN_LOCAL`: one lookup per address, whatever the number of interfaces), or, where that
//! lookup fails, every address of every interface (an `RTM_GETADDR` dump); and an interface of
//! another network namespace, asked from this one: the namespace's id here (`RTM_GETNSID`,
//! assigned with `RTM_NEWNSID` where it has none, both given the namespace's file descriptor)
//! names it in an `RTM_GETLINK` (`IFLA_TARGET_NETNSID`, Linux 4.20). That needs
//! `CAP_NET_ADMIN` alone, where entering the namespace needs `CAP_SYS_ADMIN`. Asked over netlink
//! rather than read from /sys, because /sys shows the namespace it was mounted in, not
//! necessarily the caller's. One [`Links`] socket answers every lookup of an ADD, each reply
//! awaited at most [`REPLY_DEADLINE`]. And the bridge forwarding entries that pin an exempt
//! pod's MAC to its port ([`Links::pin_mac`], `RTM_NEWNEIGH` in `AF_BRIDGE`).

use super::netlink::{Attrs, Msg, MsgBuf, NfSocket};
use crate::error::Result;
use std::time::Duration;

const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETADDR: u16 = 22;
const RTM_NEWADDR: u16 = 20;
/// `struct ifaddrmsg`: family, prefix length, flags, scope, index.
const IFADDRMSG_LEN: usize = 8;
const IFA_ADDRESS: u16 = 1;
/// The interface's own address where `IFA_ADDRESS` is a point-to-point link's peer.
const IFA_LOCAL: u16 = 2;
const RTMSG_LEN: usize = 12;
/// `rtm_type`'s offset in `struct rtmsg`, and the type of a route to one of the node's addresses.
const RTM_TYPE_OFFSET: usize = 7;
const RTN_LOCAL: u8 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_MULTIPATH: u16 = 9;
/// `rtm_dst_len`'s offset in `struct rtmsg`: 0 for a default route.
const RTM_DST_LEN_OFFSET: usize = 1;
const RTN_UNICAST: u8 = 1;
/// `struct rtnexthop`: length, flags, hops, interface index; its attributes follow.
const RTNH_LEN: usize = 8;
const IFINFOMSG_LEN: usize = 16;
/// `ifi_index`'s offset in `struct ifinfomsg`.
const IFI_INDEX_OFFSET: usize = 4;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
/// `IFLA_TARGET_NETNSID`: the request is about the namespace this one knows by that id.
const IFLA_TARGET_NETNSID: u16 = 46;
const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;
/// `struct rtgenmsg` (the family, one byte), padded to the attributes' alignment.
const RTGENMSG_LEN: usize = 4;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;
/// `NETNSA_NSID` of a namespace that has no id here yet; as a request, "pick one".
const NETNSA_NSID_NOT_ASSIGNED: i32 = -1;
const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
/// `struct tcmsg`: family, padding, ifindex, handle, parent, info.
const TCMSG_LEN: usize = 20;
const TCM_IFINDEX_OFFSET: usize = 4;
const TCM_PARENT_OFFSET: usize = 12;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
/// `TCA_BPF_NAME` and `TCA_BPF_FLAGS` (`TCA_BPF_FLAG_ACT_DIRECT`) of a `bpf` classifier.
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`: the hooks of a `clsact` qdisc
/// (the ingress one also of an `ingress` qdisc).
pub const TC_INGRESS: u32 = 0xFFFF_FFF2;
pub const TC_EGRESS: u32 = 0xFFFF_FFF3;
/// Actions that take a packet off its path: `mirred` (redirect or mirror to another device)
/// and `bpf` (a program that may return `TC_ACT_REDIRECT`).
const STEERING_ACTIONS: [&str; 2] = ["mirred", "bpf"];

const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
/// `struct ndmsg`: family, padding, interface index, state, flags, type.
const NDMSG_LEN: usize = 12;
const NDA_LLADDR: u16 = 2;
const AF_BRIDGE: u8 = 7;
/// `NUD_NOARP`: a static forwarding entry (`bridge fdb add ... static`), never aged out.
const NUD_NOARP: u16 = 0x40;
/// `NTF_MASTER`: the entry is the bridge's (the port's master), not the port's own.
const NTF_MASTER: u8 = 0x04;
/// `NTF_STICKY` (Linux 5.5): the bridge never moves the entry to another port, whichever port
/// a frame with its MAC as source arrives on.
const NTF_STICKY: u8 = 0x40;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;

/// An `RTM_NEWNEIGH` (create or replace) or `RTM_DELNEIGH` of the bridge's static, sticky
/// forwarding entry of `mac` on port `index`.
fn fdb_request(b: &mut MsgBuf, msg_type: u16, index: u32, mac: [u8; 6]) {
    let flags = super::netlink::NLM_F_ACK
        | if msg_type == RTM_NEWNEIGH {
            NLM_F_CREATE | NLM_F_REPLACE
        } else {
            0
        };
    b.begin_header(msg_type, flags);
    let mut nd = [0u8; NDMSG_LEN];
    nd[0] = AF_BRIDGE;
    nd[4..8].copy_from_slice(&index.to_ne_bytes());
    nd[8..10].copy_from_slice(&NUD_NOARP.to_ne_bytes());
    nd[10] = NTF_MASTER | NTF_STICKY;
    b.bytes(&nd);
    b.attr(NDA_LLADDR, &mac);
    b.end();
}

/// An `RTM_GETNEIGH` dump of the bridge's forwarding entries of port `index`.
fn fdb_dump_request(b: &mut MsgBuf, index: u32) {
    b.begin_header(RTM_GETNEIGH, super::netlink::NLM_F_DUMP);
    let mut nd = [0u8; NDMSG_LEN];
    nd[0] = AF_BRIDGE;
    nd[4..8].copy_from_slice(&index.to_ne_bytes());
    b.bytes(&nd);
    b.end();
}

/// Whether the dump's replies hold a static, sticky entry of `mac` on port `index` (the kernel
/// may answer with every port's entries: filtering by port is a request it may ignore).
fn fdb_pinned(msgs: &[Msg], index: u32, mac: [u8; 6]) -> bool {
    msgs.iter().any(|m| {
        m.msg_type == RTM_NEWNEIGH
            && m.body.len() >= NDMSG_LEN
            && m.body[0] == AF_BRIDGE
            && m.body[4..8] == index.to_ne_bytes()
            && u16::from_ne_bytes([m.body[8], m.body[9]]) & NUD_NOARP != 0
            && m.body[10] & NTF_STICKY != 0
            && Attrs::new(&m.body[NDMSG_LEN..])
                .get(NDA_LLADDR)
                .is_some_and(|a| a.payload == mac)
    })
}

/// A link lookup answers at once; this only bounds a kernel that does not.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(2);

/// What the kernel says about one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// `IFLA_INFO_KIND` is `bridge`.
    pub is_bridge: bool,
    /// The name of the interface this one is enslaved to (a bridge port's bridge).
    pub master: Option<String>,
    /// `IFLA_LINK`: the device this one sits on (a VLAN's lower device, a veth's peer), when it
    /// is in this namespace (with `IFLA_LINK_NETNSID` the index is another namespace's).
    pub lower: Option<String>,
    /// `IFLA_INFO_KIND` (`veth`, `macvlan`, ...); `None` for a device without one (a NIC).
    pub kind: Option<String>,
    /// The link-layer address, when it is an Ethernet one.
    pub mac: Option<[u8; 6]>,
    /// Its own index (`ifi_index`) in the namespace asked.
    pub index: u32,
    /// `IFLA_LINK` when `IFLA_LINK_NETNSID` says it is another namespace's index: a veth's peer
    /// there. Compared as a number, never resolved to a name here.
    pub peer: Option<u32>,
}

/// An rtnetlink socket in the calling thread's network namespace, for lookups.
pub struct Links {
    sock: NfSocket,
}

/// An `RTM_GETLINK` request for the interface called `name`: in this namespace, or in the one
/// this namespace knows by id `target`.
fn getlink_request(b: &mut MsgBuf, name: &str, target: Option<i32>) {
    b.begin_header(RTM_GETLINK, 0);
    b.bytes(&[0u8; IFINFOMSG_LEN]); // AF_UNSPEC, any index
    b.attr_str(IFLA_IFNAME, name);
    if let Some(id) = target {
        b.attr(IFLA_TARGET_NETNSID, &id.to_ne_bytes());
    }
    b.end();
}

/// An `RTM_GETTFILTER` dump of the filters on hook `parent` ([`TC_INGRESS`], [`TC_EGRESS`]) of
/// the interface with index `index`.
fn getfilter_dump_request(b: &mut MsgBuf, index: u32, parent: u32) {
    b.begin_header(RTM_GETTFILTER, super::netlink::NLM_F_DUMP);
    let mut tcm = [0u8; TCMSG_LEN];
    tcm[TCM_IFINDEX_OFFSET..TCM_IFINDEX_OFFSET + 4].copy_from_slice(&index.to_ne_bytes());
    tcm[TCM_PARENT_OFFSET..TCM_PARENT_OFFSET + 4].copy_from_slice(&parent.to_ne_bytes());
    b.bytes(&tcm);
    b.end();
}

/// The strings of nested attributes under `attrs` (a few levels down) that name one of
/// [`STEERING_ACTIONS`]: the kinds (`TCA_ACT_KIND`) of a filter's actions, wherever its
/// classifier nests them.
fn steering_actions(attrs: &Attrs<'_>, depth: usize, out: &mut Vec<String>) {
    for a in attrs.clone() {
        let text = a.payload.strip_suffix(&[0]).unwrap_or(&[]);
        if let Some(k) = STEERING_ACTIONS.iter().find(|k| k.as_bytes() == text) {
            if !out.iter().any(|o| o == k) {
                out.push((*k).to_string());
            }
        } else if depth > 0 && a.payload.len() >= 4 {
            steering_actions(&a.nested(), depth - 1, out);
        }
    }
}

/// What a filter dump's replies install that can steer packets around netfilter, one line
/// each: a `bpf` classifier (named, with direct action or not) and any filter with a `mirred`
/// or `bpf` action.
fn steering_filters(msgs: &[Msg], index: u32) -> Vec<String> {
    let mut out = Vec::new();
    for m in msgs.iter().filter(|m| m.msg_type == RTM_NEWTFILTER) {
        let ifindex = m
            .body
            .get(TCM_IFINDEX_OFFSET..TCM_IFINDEX_OFFSET + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        if ifindex != Some(index) {
            continue;
        }
        let attrs = Attrs::new(m.body.get(TCMSG_LEN..).unwrap_or(&[]));
        let Some(kind) = attrs.get(TCA_KIND).map(|k| k.str().to_string()) else {
            continue;
        };
        let opts = attrs.get(TCA_OPTIONS).map(|o| o.nested());
        let mut actions = Vec::new();
        if let Some(o) = &opts {
            steering_actions(o, 3, &mut actions);
        }
        if kind == "bpf" {
            let o = opts.as_ref();
            let name = o
                .and_then(|o| o.get(TCA_BPF_NAME))
                .map(|n| format!(" {}", n.str()))
                .unwrap_or_default();
            let direct = o
                .and_then(|o| o.get(TCA_BPF_FLAGS))
                .and_then(|f| f.payload.get(..4))
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .is_some_and(|f| f & TCA_BPF_FLAG_ACT_DIRECT != 0);
            let da = if direct { ", direct action" } else { "" };
            out.push(format!("a bpf filter{name}{da}"));
        } else if !actions.is_empty() {
            out.push(format!(
                "a {kind} filter with a {} action",
                actions.join(" and a ")
            ));
        }
    }
    out.dedup();
    out
}

/// An `RTM_GETNSID` (the id) or `RTM_NEWNSID` (assign one, the kernel's pick) request about
/// the namespace whose file is open as descriptor `fd`.
fn nsid_request(b: &mut MsgBuf, msg_type: u16, fd: i32) {
    let flags = if msg_type == RTM_NEWNSID {
        super::netlink::NLM_F_ACK
    } else {
        0
    };
    b.begin_header(msg_type, flags);
    b.bytes(&[0u8; RTGENMSG_LEN]); // AF_UNSPEC
    b.attr(NETNSA_FD, &(fd as u32).to_ne_bytes());
    if msg_type == RTM_NEWNSID {
        b.attr(NETNSA_NSID, &NETNSA_NSID_NOT_ASSIGNED.to_ne_bytes());
    }
    b.end();
}

/// The id an `RTM_GETNSID` reply gives; `None` when the namespace has none here.
fn nsid_reply(msgs: &[Msg]) -> Option<i32> {
    let m = msgs.iter().find(|m| m.msg_type == RTM_NEWNSID)?;
    let a = Attrs::new(m.body.get(RTGENMSG_LEN..).unwrap_or(&[])).get(NETNSA_NSID)?;
    let id = i32::from_ne_bytes(a.payload.get(..4)?.try_into().ok()?);
    (id >= 0).then_some(id)
}

/// An `RTM_GETLINK` request for the interface with index `index`.
fn getlink_by_index_request(b: &mut MsgBuf, index: u32) {
    b.begin_header(RTM_GETLINK, 0);
    let mut ifi = [0u8; IFINFOMSG_LEN];
    ifi[IFI_INDEX_OFFSET..IFI_INDEX_OFFSET + 4].copy_from_slice(&index.to_ne_bytes());
    b.bytes(&ifi); // AF_UNSPEC, this index
    b.end();
}

/// An `RTM_GETROUTE` request for the route to `addr`.
fn getroute_request(b: &mut MsgBuf, addr: std::net::IpAddr) {
    let (family, bytes, bits) = match addr {
        std::net::IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec(), 32u8),
        std::net::IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec(), 128u8),
    };
    b.begin_header(RTM_GETROUTE, 0);
    let mut rtmsg = [0u8; RTMSG_LEN];
    rtmsg[0] = family;
    rtmsg[1] = bits; // rtm_dst_len
    b.bytes(&rtmsg);
    b.attr(RTA_DST, &bytes);
    b.end();
}

/// An `RTM_GETROUTE` dump of every route of every table, both families.
fn getroute_dump_request(b: &mut MsgBuf) {
    b.begin_header(RTM_GETROUTE, super::netlink::NLM_F_DUMP);
    b.bytes(&[0u8; RTMSG_LEN]); // AF_UNSPEC
    b.end();
}

/// The interface indexes the default routes of a route dump leave by (of any table, each
/// next hop of a multipath route), sorted, each once.
fn default_route_oifs(msgs: &[Msg]) -> Vec<u32> {
    let u32_of = |b: &[u8]| {
        b.get(..4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut out = Vec::new();
    for m in msgs.iter().filter(|m| m.msg_type == RTM_NEWROUTE) {
        let Some(hdr) = m.body.get(..RTMSG_LEN) else {
            continue;
        };
        if hdr[RTM_DST_LEN_OFFSET] != 0 || hdr[RTM_TYPE_OFFSET] != RTN_UNICAST {
            continue;
        }
        let attrs = Attrs::new(&m.body[RTMSG_LEN..]);
        out.extend(attrs.get(RTA_OIF).and_then(|a| u32_of(a.payload)));
        let mut hops = attrs.get(RTA_MULTIPATH).map_or(&[][..], |a| a.payload);
        while hops.len() >= RTNH_LEN {
            let len = usize::from(u16::from_ne_bytes([hops[0], hops[1]]));
            out.extend(u32_of(&hops[4..]));
            let step = (len.max(RTNH_LEN) + 3) & !3;
            hops = hops.get(step..).unwrap_or(&[]);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// An `RTM_GETADDR` dump of every address of every interface, both families.
fn getaddr_dump_request(b: &mut MsgBuf) {
    b.begin_header(RTM_GETADDR, super::netlink::NLM_F_DUMP);
    b.bytes(&[0u8; IFADDRMSG_LEN]); // AF_UNSPEC
    b.end();
}

/// The addresses an `RTM_GETADDR` dump lists: each interface's own (`IFA_LOCAL` where there
/// is one, `IFA_ADDRESS` otherwise), as `getifaddrs` reports them.
fn addr_replies(msgs: &[Msg]) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    for m in msgs.iter().filter(|m| m.msg_type == RTM_NEWADDR) {
        let Some(&family) = m.body.first() else {
            continue;
        };
        let attrs = Attrs::new(m.body.get(IFADDRMSG_LEN..).unwrap_or(&[]));
        let Some(a) = attrs.get(IFA_LOCAL).or_else(|| attrs.get(IFA_ADDRESS)) else {
            continue;
        };
        let addr = match (family as libc::c_int, a.payload.len()) {
            (libc::AF_INET, 4) => std::net::IpAddr::from(<[u8; 4]>::try_from(a.payload).unwrap()),
            (libc::AF_INET6, 16) => {
                std::net::IpAddr::from(<[u8; 16]>::try_from(a.payload).unwrap())
            }
            _ => continue,
        };
        out.push(addr);
    }
    out
}

/// The interface index in attribute `ty` of a reply body, by name.
fn index_attr(attrs: &Attrs<'_>, ty: u16) -> Option<String> {
    attrs
        .get(ty)
        .and_then(|a| a.payload.get(..4))
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .and_then(index_to_name)
}

/// The interface a route reply leaves by.
fn route_reply_oif(msgs: &[Msg]) -> Option<String> {
    let m = msgs.iter().find(|m| m.msg_type == RTM_NEWROUTE)?;
    index_attr(&Attrs::new(m.body.get(RTMSG_LEN..).unwrap_or(&[])), RTA_OIF)
}

/// Whether a route reply is a route to one of the namespace's own addresses.
fn route_reply_is_local(msgs: &[Msg]) -> bool {
    msgs.iter()
        .find(|m| m.msg_type == RTM_NEWROUTE)
        .and_then(|m| m.body.get(RTM_TYPE_OFFSET).copied())
        == Some(RTN_LOCAL)
}

/// The link a `RTM_GETLINK` reply describes.
fn link_reply(msgs: &[Msg]) -> Option<Link> {
    let m = msgs.iter().find(|m| m.msg_type == RTM_NEWLINK)?;
    let attrs = Attrs::new(m.body.get(IFINFOMSG_LEN..).unwrap_or(&[]));
    let u32_at = |b: Option<&[u8]>| b.map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    let link_index = u32_at(attrs.get(IFLA_LINK).and_then(|a| a.payload.get(..4)));
    let kind = attrs
        .get(IFLA_LINKINFO)
        .and_then(|li| li.nested().get(IFLA_INFO_KIND))
        .map(|k| k.str().to_string());
    Some(Link {
        is_bridge: kind.as_deref() == Some("bridge"),
        master: index_attr(&attrs, IFLA_MASTER),
        lower: match attrs.get(IFLA_LINK_NETNSID) {
            Some(_) => None,
            None => index_attr(&attrs, IFLA_LINK),
        },
        kind,
        mac: attrs
            .get(IFLA_ADDRESS)
            .and_then(|a| <[u8; 6]>::try_from(a.payload).ok()),
        index: u32_at(m.body.get(IFI_INDEX_OFFSET..IFI_INDEX_OFFSET + 4)).unwrap_or(0),
        peer: attrs.get(IFLA_LINK_NETNSID).and(link_index),
    })
}

impl Links {
    pub fn open() -> Result<Self> {
        let mut sock = NfSocket::open_route()?;
        sock.set_reply_timeout(REPLY_DEADLINE);
        Ok(Links { sock })
    }

    /// The interface a route from this namespace to `addr` leaves by; `None` without a route.
    pub fn route_oif(&mut self, addr: std::net::IpAddr) -> Result<Option<String>> {
        let mut b = self.sock.msgbuf();
        getroute_request(&mut b, addr);
        match self
            .sock
            .request(&b, &format!("look up the route to {addr}"))
        {
            Ok(msgs) => Ok(route_reply_oif(&msgs)),
            Err(e) if matches!(e.errno(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The interfaces this namespace's default routes leave by (its uplinks), by name.
    pub fn default_route_oifs(&mut self) -> Result<Vec<String>> {
        let mut b = self.sock.msgbuf();
        getroute_dump_request(&mut b);
        let msgs = self.sock.request(&b, "list the routes")?;
        Ok(default_route_oifs(&msgs)
            .into_iter()
            .filter_map(index_to_name)
            .collect())
    }

    /// Whether `addr` is an address of this namespace: the kernel routes it locally
    /// (`RTN_LOCAL`, from the local table that holds every address of an interface that is up).
    /// No route at all is not local.
    pub fn is_local(&mut self, addr: std::net::IpAddr) -> Result<bool> {
        let mut b = self.sock.msgbuf();
        getroute_request(&mut b, addr);
        match self
            .sock
            .request(&b, &format!("look up the route to {addr}"))
        {
            Ok(msgs) => Ok(route_reply_is_local(&msgs)),
            Err(e) if matches!(e.errno(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Every address configured on an interface of this namespace, up or not.
    pub fn addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        let mut b = self.sock.msgbuf();
        getaddr_dump_request(&mut b);
        let msgs = self.sock.request(&b, "list the interfaces' addresses")?;
        Ok(addr_replies(&msgs))
    }

    /// Pins `mac` to bridge port `port`: a static, sticky forwarding entry, so a frame with
    /// that MAC as source from any other port never moves it there (and what the node sends
    /// to the MAC is never delivered to that port). `Ok(false)` when `port` does not exist.
    pub fn pin_mac(&mut self, port: &str, mac: [u8; 6]) -> Result<bool> {
        let Some(l) = self.link(port)? else {
            return Ok(false);
        };
        let mut b = self.sock.msgbuf();
        fdb_request(&mut b, RTM_NEWNEIGH, l.index, mac);
        self.sock.request(
            &b,
            &format!(
                "pin MAC {} to bridge port {port}",
                crate::plan::render_mac(&mac)
            ),
        )?;
        Ok(true)
    }

    /// Removes the pin of `mac` on `port`; nothing to do when either is gone.
    pub fn unpin_mac(&mut self, port: &str, mac: [u8; 6]) -> Result<()> {
        let Some(l) = self.link(port)? else {
            return Ok(());
        };
        let mut b = self.sock.msgbuf();
        fdb_request(&mut b, RTM_DELNEIGH, l.index, mac);
        match self.sock.request(
            &b,
            &format!(
                "unpin MAC {} from bridge port {port}",
                crate::plan::render_mac(&mac)
            ),
        ) {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// Whether `mac` is pinned to `port`; `None` when the port does not exist.
    pub fn mac_pinned(&mut self, port: &str, mac: [u8; 6]) -> Result<Option<bool>> {
        let Some(l) = self.link(port)? else {
            return Ok(None);
        };
        let mut b = self.sock.msgbuf();
        fdb_dump_request(&mut b, l.index);
        let msgs = self.sock.request(
            &b,
            &format!("list the forwarding entries of bridge port {port}"),
        )?;
        Ok(Some(fdb_pinned(&msgs, l.index, mac)))
    }

    /// Looks `name` up; `None` when there is no such interface.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>> {
        self.link_in(None, name)
    }

    /// The id this namespace knows the network namespace open as `ns` by, assigned first
    /// where it has none (which needs `CAP_NET_ADMIN` here). `EINVAL` when `ns` is no
    /// network namespace's file.
    pub fn netnsid(&mut self, ns: std::os::fd::BorrowedFd<'_>) -> Result<i32> {
        use std::os::fd::AsRawFd;
        let fd = ns.as_raw_fd();
        let get = |s: &mut Self| -> Result<Option<i32>> {
            let mut b = s.sock.msgbuf();
            nsid_request(&mut b, RTM_GETNSID, fd);
            Ok(nsid_reply(
                &s.sock.request(&b, "look up the namespace's id")?,
            ))
        };
        if let Some(id) = get(self)? {
            return Ok(id);
        }
        let mut b = self.sock.msgbuf();
        nsid_request(&mut b, RTM_NEWNSID, fd);
        match self.sock.request(&b, "assign the namespace an id") {
            // EEXIST: someone else assigned one meanwhile.
            Err(e) if e.errno() != Some(libc::EEXIST) => return Err(e),
            _ => {}
        }
        get(self)?.ok_or_else(|| {
            crate::error::Error::netlink(
                "the namespace has no id after one was assigned",
                libc::ENOENT,
            )
        })
    }

    /// Looks `name` up in this namespace (`target` `None`) or in the one this namespace knows
    /// by id `target`; `None` when there is no such interface. The facts are as that
    /// namespace sees them, except [`Link::master`] and [`Link::lower`], which are names of
    /// this namespace's and so left out for another's.
    pub fn link_in(&mut self, target: Option<i32>, name: &str) -> Result<Option<Link>> {
        let mut b = self.sock.msgbuf();
        getlink_request(&mut b, name, target);
        match self.sock.request(&b, &format!("look up interface {name}")) {
            Ok(msgs) => Ok(link_reply(&msgs).map(|l| match target {
                None => l,
                Some(_) => Link {
                    master: None,
                    lower: None,
                    ..l
                },
            })),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What on interface `index`'s tc hooks (`clsact` or `ingress` qdisc) can steer its packets
    /// around the node's netfilter: `bpf` classifiers and filters with a redirecting action,
    /// each named with its hook. Empty when there is none (or no such qdisc).
    pub fn tc_steering(&mut self, index: u32) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (parent, hook) in [(TC_INGRESS, "ingress"), (TC_EGRESS, "egress")] {
            let msgs = match self.sock.request_retry(
                &|b| getfilter_dump_request(b, index, parent),
                "list the interface's tc filters",
            ) {
                Ok(m) => m,
                // No such hook (no clsact qdisc): nothing there.
                Err(e) if matches!(e.errno(), Some(libc::EINVAL | libc::ENOENT)) => continue,
                Err(e) => return Err(e),
            };
            out.extend(
                steering_filters(&msgs, index)
                    .into_iter()
                    .map(|f| format!("{f} on its tc {hook} hook")),
            );
        }
        Ok(out)
    }

    /// Looks the interface with index `index` up: its name and its facts; `None` when there is
    /// no such interface.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<(String, Link)>> {
        let mut b = self.sock.msgbuf();
        getlink_by_index_request(&mut b, index);
        match self
            .sock
            .request(&b, &format!("look up interface index {index}"))
        {
            Ok(msgs) => Ok(link_reply(&msgs).and_then(|l| {
                let m = msgs.iter().find(|m| m.msg_type == RTM_NEWLINK)?;
                let attrs = Attrs::new(m.body.get(IFINFOMSG_LEN..).unwrap_or(&[]));
                let name = attrs.get(IFLA_IFNAME)?.str().to_string();
                Some((name, l))
            })),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// `if_indextoname`: `SIOCGIFNAME` on a socket of the calling thread's network namespace.
fn index_to_name(index: u32) -> Option<String> {
    use rustix::net::{netdevice, socket_with, AddressFamily, SocketFlags, SocketType};
    let s = socket_with(
        AddressFamily::UNIX,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    netdevice::index_to_name(&s, index).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::{parse_msgs, NLMSG_HDRLEN, NLM_F_REQUEST};

    fn one(b: &MsgBuf) -> Msg {
        let mut msgs = parse_msgs(b.as_bytes());
        assert_eq!(msgs.len(), 1);
        msgs.remove(0)
    }

    /// The pin is the bridge's (`NTF_MASTER`) static (`NUD_NOARP`) and sticky entry of the
    /// MAC on the port's index, created or replaced and acknowledged; its removal names the
    /// same entry. A dump answers whether it is there: another port's, a non-sticky or a
    /// learnt entry of the MAC, or another MAC's on the port, are no pin.
    #[test]
    fn a_mac_pin_is_a_static_sticky_entry_of_the_bridge_on_the_port() {
        let mac = [2, 0, 0, 0, 0, 9];
        for (ty, flags) in [
            (
                RTM_NEWNEIGH,
                NLM_F_REQUEST | super::super::netlink::NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            ),
            (
                RTM_DELNEIGH,
                NLM_F_REQUEST | super::super::netlink::NLM_F_ACK,
            ),
        ] {
            let mut b = MsgBuf::new(3);
            fdb_request(&mut b, ty, 42, mac);
            let m = one(&b);
            assert_eq!((m.msg_type, m.flags), (ty, flags));
            assert_eq!(m.body[0], AF_BRIDGE);
            assert_eq!(&m.body[4..8], &42u32.to_ne_bytes());
            assert_eq!(&m.body[8..10], &NUD_NOARP.to_ne_bytes());
            assert_eq!(m.body[10], NTF_MASTER | NTF_STICKY);
            let attrs = Attrs::new(&m.body[NDMSG_LEN..]);
            assert_eq!(attrs.get(NDA_LLADDR).unwrap().payload, &mac);
        }
        let mut b = MsgBuf::new(4);
        fdb_dump_request(&mut b, 42);
        let m = one(&b);
        assert_eq!(m.msg_type, RTM_GETNEIGH);
        assert_eq!(
            m.flags & super::super::netlink::NLM_F_DUMP,
            super::super::netlink::NLM_F_DUMP
        );
        let entry = |index: u32, state: u16, flags: u8, lladdr: [u8; 6]| {
            let mut b = MsgBuf::new(1);
            b.begin_header(RTM_NEWNEIGH, 0);
            let mut nd = [0u8; NDMSG_LEN];
            nd[0] = AF_BRIDGE;
            nd[4..8].copy_from_slice(&index.to_ne_bytes());
            nd[8..10].copy_from_slice(&state.to_ne_bytes());
            nd[10] = flags;
            b.bytes(&nd);
            b.attr(NDA_LLADDR, &lladdr);
            b.end();
            parse_msgs(b.as_bytes())
        };
        assert!(fdb_pinned(
            &entry(42, NUD_NOARP, NTF_MASTER | NTF_STICKY, mac),
            42,
            mac
        ));
        assert!(!fdb_pinned(
            &entry(43, NUD_NOARP, NTF_MASTER | NTF_STICKY, mac),
            42,
            mac
        ));
        assert!(!fdb_pinned(&entry(42, NUD_NOARP, NTF_MASTER, mac), 42, mac));
        assert!(!fdb_pinned(&entry(42, 0x02, NTF_MASTER, mac), 42, mac));
        assert!(!fdb_pinned(
            &entry(42, NUD_NOARP, NTF_MASTER | NTF_STICKY, [2, 0, 0, 0, 0, 8]),
            42,
            mac
        ));
    }

    #[test]
    fn getlink_asks_by_name_with_an_empty_ifinfomsg() {
        let mut b = MsgBuf::new(7);
        getlink_request(&mut b, "veth1234", None);
        let m = one(&b);
        assert_eq!(m.msg_type, RTM_GETLINK);
        assert_eq!(m.flags, NLM_F_REQUEST);
        assert_eq!(m.seq, 7);
        assert_eq!(&m.body[..IFINFOMSG_LEN], &[0u8; IFINFOMSG_LEN]);
        let attrs = Attrs::new(&m.body[IFINFOMSG_LEN..]);
        assert_eq!(attrs.get(IFLA_IFNAME).unwrap().str(), "veth1234");
        assert_eq!(b.len() % 4, 0);
        assert_eq!(b.len(), NLMSG_HDRLEN + IFINFOMSG_LEN + 4 + 12);
    }

    #[test]
    fn getlink_in_another_namespace_names_it_by_id() {
        let mut b = MsgBuf::new(3);
        getlink_request(&mut b, "eth0", Some(5));
        let m = one(&b);
        assert_eq!(m.msg_type, RTM_GETLINK);
        let attrs = Attrs::new(&m.body[IFINFOMSG_LEN..]);
        assert_eq!(attrs.get(IFLA_IFNAME).unwrap().str(), "eth0");
        assert_eq!(
            attrs.get(IFLA_TARGET_NETNSID).unwrap().payload,
            &5i32.to_ne_bytes()
        );
    }

    #[test]
    fn nsid_requests_name_the_namespace_by_descriptor() {
        let mut b = MsgBuf::new(9);
        nsid_request(&mut b, RTM_GETNSID, 17);
        let m = one(&b);
        assert_eq!((m.msg_type, m.flags), (RTM_GETNSID, NLM_F_REQUEST));
        assert_eq!(&m.body[..RTGENMSG_LEN], &[0u8; RTGENMSG_LEN]);
        let attrs = Attrs::new(&m.body[RTGENMSG_LEN..]);
        assert_eq!(attrs.get(NETNSA_FD).unwrap().payload, &17u32.to_ne_bytes());
        assert!(attrs.get(NETNSA_NSID).is_none());
        // Assigning asks for the kernel's pick and for an acknowledgement.
        let mut b = MsgBuf::new(10);
        nsid_request(&mut b, RTM_NEWNSID, 17);
        let m = one(&b);
        assert_eq!(
            (m.msg_type, m.flags),
            (
                RTM_NEWNSID,
                NLM_F_REQUEST | crate::kernel::netlink::NLM_F_ACK
            )
        );
        let attrs = Attrs::new(&m.body[RTGENMSG_LEN..]);
        assert_eq!(attrs.get(NETNSA_FD).unwrap().payload, &17u32.to_ne_bytes());
        assert_eq!(
            attrs.get(NETNSA_NSID).unwrap().payload,
            &(-1i32).to_ne_bytes()
        );
        // Replies: an id, "none assigned", and a reply of another type.
        let id = |v: i32| {
            reply(RTM_NEWNSID, RTGENMSG_LEN, &|b| {
                b.attr(NETNSA_NSID, &v.to_ne_bytes())
            })
        };
        assert_eq!(nsid_reply(&id(0)), Some(0));
        assert_eq!(nsid_reply(&id(7)), Some(7));
        assert_eq!(nsid_reply(&id(-1)), None);
        assert_eq!(
            nsid_reply(&reply(RTM_NEWLINK, IFINFOMSG_LEN, &|_| {})),
            None
        );
    }

    #[test]
    fn a_filter_dump_names_bpf_classifiers_and_redirecting_actions() {
        let mut b = MsgBuf::new(4);
        getfilter_dump_request(&mut b, 9, TC_INGRESS);
        let m = one(&b);
        assert_eq!(m.msg_type, RTM_GETTFILTER);
        assert_eq!(
            m.flags & super::super::netlink::NLM_F_DUMP,
            super::super::netlink::NLM_F_DUMP
        );
        assert_eq!(
            &m.body[TCM_IFINDEX_OFFSET..TCM_IFINDEX_OFFSET + 4],
            &9u32.to_ne_bytes()
        );
        assert_eq!(
            &m.body[TCM_PARENT_OFFSET..TCM_PARENT_OFFSET + 4],
            &TC_INGRESS.to_ne_bytes()
        );
        let filter = |ifindex: u32, kind: &str, opts: &dyn Fn(&mut MsgBuf)| {
            let mut b = MsgBuf::new(1);
            b.begin_header(RTM_NEWTFILTER, 0);
            let mut tcm = [0u8; TCMSG_LEN];
            tcm[TCM_IFINDEX_OFFSET..TCM_IFINDEX_OFFSET + 4].copy_from_slice(&ifindex.to_ne_bytes());
            b.bytes(&tcm);
            b.attr_str(TCA_KIND, kind);
            let o = b.nest_begin(TCA_OPTIONS);
            opts(&mut b);
            b.nest_end(o);
            b.end();
            parse_msgs(b.as_bytes())
        };
        let mut msgs = filter(9, "bpf", &|b| {
            b.attr_str(TCA_BPF_NAME, "cil_from_container");
            b.attr(TCA_BPF_FLAGS, &TCA_BPF_FLAG_ACT_DIRECT.to_ne_bytes());
        });
        // matchall with a mirred action: TCA_MATCHALL_ACT (2) > prio 1 > TCA_ACT_KIND (1).
        msgs.extend(filter(9, "matchall", &|b| {
            let acts = b.nest_begin(2);
            let prio = b.nest_begin(1);
            b.attr_str(1, "mirred");
            b.nest_end(prio);
            b.nest_end(acts);
        }));
        // A filter without a steering action, and another interface's filter.
        msgs.extend(filter(9, "u32", &|b| b.attr(1, &[1, 0, 0, 0])));
        msgs.extend(filter(8, "bpf", &|_| {}));
        assert_eq!(
            steering_filters(&msgs, 9),
            vec![
                "a bpf filter cil_from_container, direct action".to_string(),
                "a matchall filter with a mirred action".to_string(),
            ]
        );
    }

    #[test]
    fn getroute_asks_for_a_host_route_in_the_addresses_family() {
        for (addr, family, bits) in [
            ("10.1.2.3", libc::AF_INET as u8, 32u8),
            ("fd00::7", libc::AF_INET6 as u8, 128),
        ] {
            let a: std::net::IpAddr = addr.parse().unwrap();
            let mut b = MsgBuf::new(1);
            getroute_request(&mut b, a);
            let m = one(&b);
            assert_eq!(m.msg_type, RTM_GETROUTE);
            assert_eq!((m.body[0], m.body[1]), (family, bits), "{addr}");
            let dst = Attrs::new(&m.body[RTMSG_LEN..]).get(RTA_DST).unwrap();
            let want = match a {
                std::net::IpAddr::V4(v) => v.octets().to_vec(),
                std::net::IpAddr::V6(v) => v.octets().to_vec(),
            };
            assert_eq!(dst.payload, &want[..], "{addr}");
        }
    }

    /// A reply built the way the kernel lays it out: nlmsghdr, family header, attributes.
    fn reply(msg_type: u16, header_len: usize, attrs: &dyn Fn(&mut MsgBuf)) -> Vec<Msg> {
        let mut b = MsgBuf::new(1);
        b.begin_header(msg_type, 0);
        b.bytes(&vec![0u8; header_len]);
        attrs(&mut b);
        b.end();
        parse_msgs(b.as_bytes())
    }

    #[test]
    fn default_routes_are_found_by_their_interfaces_single_and_multipath() {
        let mut b = MsgBuf::new(2);
        getroute_dump_request(&mut b);
        let m = one(&b);
        assert_eq!(m.msg_type, RTM_GETROUTE);
        assert_ne!(m.flags & crate::kernel::netlink::NLM_F_DUMP, 0);
        assert_eq!(m.body[0], 0, "both families");
        // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
        let route = |dst_len: u8, ty: u8, attrs: &dyn Fn(&mut MsgBuf)| -> Vec<u8> {
            let mut b = MsgBuf::new(1);
            b.begin_header(RTM_NEWROUTE, 0);
            b.bytes(&[2, dst_len, 0, 0, 254, 0, 0, ty, 0, 0, 0, 0]);
            attrs(&mut b);
            b.end();
            b.as_bytes().to_vec()
        };
        let hop = |index: u32| -> Vec<u8> {
            let mut h = 8u16.to_ne_bytes().to_vec();
            h.extend([0, 0]);
            h.extend(index.to_ne_bytes());
            h
        };
        let mut all = route(0, RTN_UNICAST, &|b| b.attr(RTA_OIF, &7u32.to_ne_bytes()));
        // A host route and a local route leave by other interfaces: not uplinks.
        all.extend(route(32, RTN_UNICAST, &|b| {
            b.attr(RTA_OIF, &8u32.to_ne_bytes())
        }));
        all.extend(route(0, RTN_LOCAL, &|b| {
            b.attr(RTA_OIF, &9u32.to_ne_bytes())
        }));
        // An IPv6 default route over two next hops, one of them the first route's.
        all.extend(route(0, RTN_UNICAST, &|b| {
            let mut hops = hop(11);
            hops.extend(hop(7));
            b.attr(RTA_MULTIPATH, &hops);
        }));
        assert_eq!(default_route_oifs(&parse_msgs(&all)), vec![7, 11]);
        assert!(default_route_oifs(&[]).is_empty());
    }

    #[test]
    fn replies_give_bridge_kind_master_and_oif_by_name() {
        // Index 1 is the loopback interface of whatever namespace runs the unit tests.
        let lo = index_to_name(1).expect("interface 1 exists");
        let msgs = reply(RTM_NEWLINK, IFINFOMSG_LEN, &|b| {
            b.attr(IFLA_MASTER, &1u32.to_ne_bytes());
            b.attr(IFLA_LINK, &1u32.to_ne_bytes());
            let li = b.nest_begin(IFLA_LINKINFO);
            b.attr_str(IFLA_INFO_KIND, "bridge");
            b.nest_end(li);
        });
        let l = link_reply(&msgs).unwrap();
        assert!(l.is_bridge);
        assert_eq!(l.master.as_deref(), Some(lo.as_str()));
        assert_eq!(l.lower.as_deref(), Some(lo.as_str()));
        // A peer in another namespace: its index means nothing here.
        let peer = link_reply(&reply(RTM_NEWLINK, IFINFOMSG_LEN, &|b| {
            b.attr(IFLA_LINK, &1u32.to_ne_bytes());
            b.attr(IFLA_LINK_NETNSID, &0u32.to_ne_bytes());
        }))
        .unwrap();
        assert_eq!(peer.lower, None);
        assert_eq!(
            peer.peer,
            Some(1),
            "the peer's index in the other namespace"
        );
        assert_eq!(
            l.peer, None,
            "an index of this namespace is no peer elsewhere"
        );
        let plain = link_reply(&reply(RTM_NEWLINK, IFINFOMSG_LEN, &|_| {})).unwrap();
        assert_eq!(
            plain,
            Link {
                is_bridge: false,
                master: None,
                lower: None,
                kind: None,
                mac: None,
                index: 0,
                peer: None,
            }
        );
        let route = reply(RTM_NEWROUTE, RTMSG_LEN, &|b| {
            b.attr(RTA_OIF, &1u32.to_ne_bytes())
        });
        assert_eq!(route_reply_oif(&route), Some(lo));
        // An index no interface has, and a reply of another type, name nothing.
        let gone = reply(RTM_NEWROUTE, RTMSG_LEN, &|b| {
            b.attr(RTA_OIF, &u32::MAX.to_ne_bytes())
        });
        assert_eq!(route_reply_oif(&gone), None);
        assert_eq!(link_reply(&route), None);
    }

    #[test]
    fn a_route_of_type_local_is_an_own_address() {
        let typed = |t: u8| {
            let mut b = MsgBuf::new(1);
            b.begin_header(RTM_NEWROUTE, 0);
            let mut rtmsg = [0u8; RTMSG_LEN];
            rtmsg[RTM_TYPE_OFFSET] = t;
            b.bytes(&rtmsg);
            b.end();
            parse_msgs(b.as_bytes())
        };
        assert!(route_reply_is_local(&typed(RTN_LOCAL)));
        for t in [1u8, 3, 4, 5] {
            // unicast, broadcast, anycast, multicast
            assert!(!route_reply_is_local(&typed(t)), "type {t}");
        }
        assert!(!route_reply_is_local(&[]));
    }

    /// The loopback address is local in every namespace, a documentation address is not.
    #[test]
    fn the_kernel_answers_loopback_as_local() {
        let Ok(mut l) = Links::open() else {
            panic!("no rtnetlink socket")
        };
        assert!(l.is_local("127.0.0.1".parse().unwrap()).unwrap());
        assert!(!l.is_local("192.0.2.77".parse().unwrap()).unwrap());
    }

    #[test]
    fn an_address_dump_gives_each_interface_s_own_address() {
        let addr = |family: u8, attrs: &dyn Fn(&mut MsgBuf)| {
            let mut b = MsgBuf::new(1);
            b.begin_header(RTM_NEWADDR, 0);
            let mut ifa = [0u8; IFADDRMSG_LEN];
            ifa[0] = family;
            b.bytes(&ifa);
            attrs(&mut b);
            b.end();
            parse_msgs(b.as_bytes())
        };
        let mut msgs = addr(libc::AF_INET as u8, &|b| {
            b.attr(IFA_ADDRESS, &[10, 0, 0, 1])
        });
        // Point to point: IFA_ADDRESS is the peer, IFA_LOCAL the interface's own.
        msgs.extend(addr(libc::AF_INET as u8, &|b| {
            b.attr(IFA_ADDRESS, &[10, 9, 9, 9]);
            b.attr(IFA_LOCAL, &[10, 0, 0, 2]);
        }));
        let v6: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
        msgs.extend(addr(libc::AF_INET6 as u8, &|b| {
            b.attr(IFA_ADDRESS, &v6.octets())
        }));
        // A length that does not fit the family, and a message of another type, are skipped.
        msgs.extend(addr(libc::AF_INET as u8, &|b| {
            b.attr(IFA_ADDRESS, &v6.octets())
        }));
        msgs.extend(reply(RTM_NEWROUTE, RTMSG_LEN, &|_| {}));
        let want: Vec<std::net::IpAddr> = vec![
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            v6.into(),
        ];
        assert_eq!(addr_replies(&msgs), want);
    }

    /// The kernel's dump lists the loopback address, which every namespace's `lo` has.
    #[test]
    fn the_kernel_lists_the_loopback_address() {
        let Ok(mut l) = Links::open() else {
            panic!("no rtnetlink socket")
        };
        let all = l.addresses().unwrap();
        assert!(all.contains(&"127.0.0.1".parse().unwrap()), "{all:?}");
        assert!(!all.contains(&"192.0.2.77".parse().unwrap()), "{all:?}");
    }
}
