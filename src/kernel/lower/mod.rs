//! Lowering plan objects to nf_tables netlink messages.
//!
//! Each builder appends one message to a batch. Values follow the kernel ABI: attribute
//! integers are big-endian (`NLA_U32` with `ntohl` in nf_tables_api.c); data compared against
//! packet bytes is in packet order (addresses, ports); data compared against host fields
//! (`meta mark`) is in host order. Registers: the 16-byte NFT_REG_1 holds any single address,
//! NFT_REG_2 the DNAT port; a concatenated key fills the 32-bit registers from NFT_REG32_00 on.
//!
//! Batch messages do not ask for an ACK: the kernel reports their errors anyway, and
//! [`Tx::commit`](super::nft::Tx::commit) asks for one acknowledgement, on the last message (see
//! `netlink`). Element lists are split over several messages of the batch ([`set_elems`]),
//! because one message's list is a single attribute with a 16-bit length.

use super::netlink::*;
use crate::plan::{
    Action, ChainKind, Elem, Family, Key, KeyShape, Match, NetNames, Rule, SetKind, TableFamily,
    TABLE,
};
use std::net::IpAddr;

pub const NFPROTO_INET: u8 = 1;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_GETGEN: u16 = 16;

pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_USERDATA: u16 = 7;
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_EXPR: u16 = 17;
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
pub const NFTA_COUNTER_PACKETS: u16 = 2;
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
const NF_ACCEPT: u32 = 1;
const NFT_RETURN: i32 = -5;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
/// The 32-bit registers a concatenated key is loaded into (`NFT_REG32_00`, `NFT_REG32_04`).
const NFT_REG32_00: u32 = 8;
const NFT_REG32_04: u32 = 12;
const NF_DROP: i32 = 0;

/// libnftnl's user-data TLV types, so `nft list` shows our comments and key byte order.
const UDATA_COMMENT: u8 = 0;
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG: u32 = 2;

// ---------- where the plan's names meet the kernel's numbers ----------

/// Netfilter hook numbers (`NF_INET_*`).
const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_LOCAL_IN: u32 = 1;
const NF_INET_FORWARD: u32 = 2;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_INET_POST_ROUTING: u32 = 4;
/// The arp family's input hook (`NF_ARP_IN`).
const NF_ARP_IN: u32 = 0;
/// Base chain priorities of the standard nft names (`dstnat`, `filter`, `srcnat`).
const NF_IP_PRI_NAT_DST: i32 = -100;
const NF_IP_PRI_FILTER: i32 = 0;
const NF_IP_PRI_NAT_SRC: i32 = 100;
/// natguard's chains run this much before the standard priority of their kind, so its DNAT
/// and identity SNAT bind a connection before any other component's NAT at that priority.
const AHEAD: i32 = 10;

/// The hook and priority a base chain attaches with (the priority rendered as
/// `dstnat - 10`, ... by the plan); `None` for a regular chain.
pub(crate) fn hook_of(c: ChainKind) -> Option<(u32, i32)> {
    Some(match c {
        ChainKind::Dnat => (NF_INET_PRE_ROUTING, NF_IP_PRI_NAT_DST - AHEAD),
        ChainKind::GuardInput => (NF_INET_LOCAL_IN, NF_IP_PRI_FILTER - AHEAD),
        ChainKind::GuardForward => (NF_INET_FORWARD, NF_IP_PRI_FILTER - AHEAD),
        ChainKind::GuardOutput => (NF_INET_LOCAL_OUT, NF_IP_PRI_FILTER - AHEAD),
        ChainKind::Snat => (NF_INET_POST_ROUTING, NF_IP_PRI_NAT_SRC - AHEAD),
        ChainKind::ArpGuard => (NF_ARP_IN, NF_IP_PRI_FILTER),
        ChainKind::Judge(_) => return None,
    })
}

/// nft's datatype ids (`enum datatypes` in nftables' datatype.h) for set keys.
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const TYPE_INET_SERVICE: u32 = 13;
const TYPE_IFNAME: u32 = 41;
/// A concatenation's datatype is its members' ids, `TYPE_BITS` apart (nftables' concat_type).
const TYPE_BITS: u32 = 6;
/// Each member of a concatenated key takes whole 32-bit registers.
const IFNAME_LEN: u32 = 16;

fn addr_type(f: Family) -> (u32, u32) {
    match f {
        Family::V4 => (TYPE_IPADDR, 4),
        Family::V6 => (TYPE_IP6ADDR, 16),
    }
}

/// nft datatype id and key length in bytes of a set kind.
pub(crate) fn set_key_type(kind: SetKind) -> (u32, u32) {
    match kind.key_shape() {
        KeyShape::Addr(f) => addr_type(f),
        KeyShape::IfAddr(f) => {
            let (t, len) = addr_type(f);
            ((TYPE_IFNAME << TYPE_BITS) | t, IFNAME_LEN + len)
        }
        KeyShape::AddrPort(f) => {
            let (t, len) = addr_type(f);
            ((t << TYPE_BITS) | TYPE_INET_SERVICE, len + 4)
        }
        KeyShape::Port => (TYPE_INET_SERVICE, 2),
        KeyShape::Name => (TYPE_IFNAME, IFNAME_LEN),
    }
}

/// A comment as nft stores it: the user-data TLV `UDATA_COMMENT`, length checked where it is
/// written ([`MsgBuf::attr_udata_text`]).
pub(crate) fn attr_comment(b: &mut MsgBuf, ty: u16, comment: &str) {
    b.attr_udata_text(ty, UDATA_COMMENT, comment);
}

/// The comment inside a user-data blob, if any.
pub fn comment_of_udata(u: &[u8]) -> Option<&str> {
    let mut rest = u;
    while rest.len() >= 2 {
        let (ty, len) = (rest[0], rest[1] as usize);
        let val = rest.get(2..2 + len)?;
        if ty == UDATA_COMMENT {
            let end = val.iter().position(|&b| b == 0).unwrap_or(val.len());
            return std::str::from_utf8(&val[..end]).ok();
        }
        rest = &rest[2 + len..];
    }
    None
}

fn nft_type(m: u16) -> u16 {
    ((NFNL_SUBSYS_NFTABLES as u16) << 8) | m
}

pub fn begin_batch(b: &mut MsgBuf) {
    b.begin(NFNL_MSG_BATCH_BEGIN, 0, 0, NFNL_SUBSYS_NFTABLES as u16);
    b.end();
}

pub fn end_batch(b: &mut MsgBuf) {
    b.begin(NFNL_MSG_BATCH_END, 0, 0, NFNL_SUBSYS_NFTABLES as u16);
    b.end();
}

pub const NFPROTO_BRIDGE: u8 = 7;
pub const NFPROTO_NETDEV: u8 = 5;
pub const NFPROTO_ARP: u8 = 3;

/// The nfgenmsg family of a table.
fn nfproto_of(t: TableFamily) -> u8 {
    match t {
        TableFamily::Inet => NFPROTO_INET,
        TableFamily::Bridge => NFPROTO_BRIDGE,
        TableFamily::Netdev => NFPROTO_NETDEV,
        TableFamily::Arp => NFPROTO_ARP,
    }
}

pub fn begin(b: &mut MsgBuf, t: TableFamily, msg: u16, flags: u16) -> u32 {
    b.begin(nft_type(msg), flags, nfproto_of(t), 0)
}

/// A NEWTABLE: creates the table if missing. With `flags`, they are the table's flags after
/// the commit (on an existing table, an update); without, an existing table keeps its own.
pub fn new_table(b: &mut MsgBuf, t: TableFamily, flags: Option<u32>) -> u32 {
    let s = begin(b, t, NFT_MSG_NEWTABLE, NLM_F_CREATE);
    b.attr_str(NFTA_TABLE_NAME, TABLE);
    if let Some(f) = flags {
        b.attr_u32_be(NFTA_TABLE_FLAGS, f);
    }
    b.end();
    s
}

pub fn del_table(b: &mut MsgBuf, t: TableFamily) -> u32 {
    let s = begin(b, t, NFT_MSG_DELTABLE, 0);
    b.attr_str(NFTA_TABLE_NAME, TABLE);
    b.end();
    s
}

/// A NEWCHAIN: a base chain when `hook` is given (hook number, priority), else a regular
/// chain that only a `goto` or `jump` reaches.
pub fn new_chain(
    b: &mut MsgBuf,
    t: TableFamily,
    name: &str,
    ty: &str,
    hook: Option<(u32, i32)>,
) -> u32 {
    let s = begin(b, t, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    b.attr_str(NFTA_CHAIN_TABLE, TABLE);
    b.attr_str(NFTA_CHAIN_NAME, name);
    if let Some((hook, prio)) = hook {
        let h = b.nest_begin(NFTA_CHAIN_HOOK);
        b.attr_u32_be(NFTA_HOOK_HOOKNUM, hook);
        b.attr_u32_be(NFTA_HOOK_PRIORITY, prio as u32);
        b.nest_end(h);
        b.attr_u32_be(NFTA_CHAIN_POLICY, NF_ACCEPT);
        b.attr_str(NFTA_CHAIN_TYPE, ty);
    }
    b.end();
    s
}

/// The netdev family's ingress hook, and the priority of natguard's chains there: after
/// other components' chains of that hook, so none of them can take the mark off again.
const NF_NETDEV_INGRESS: u32 = 0;
const XVETH_PRIORITY: i32 = 500;
const NFTA_HOOK_DEV: u16 = 3;

/// The ingress chain of an exempt pod's own veth, named after it, with its rules
/// ([`crate::plan::veth_rules`]): a NEWCHAIN (a base chain of the netdev family hooks one
/// device), a flush and the rules, so an existing chain is rewritten whole. The sequence
/// numbers of the chain, the flush and each rule, with the rule.
pub fn new_veth_chain(b: &mut MsgBuf, veth: &str) -> (u32, u32, Vec<(u32, crate::plan::VethRule)>) {
    let t = TableFamily::Netdev;
    let s = begin(b, t, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    b.attr_str(NFTA_CHAIN_TABLE, TABLE);
    b.attr_str(NFTA_CHAIN_NAME, veth);
    let h = b.nest_begin(NFTA_CHAIN_HOOK);
    b.attr_u32_be(NFTA_HOOK_HOOKNUM, NF_NETDEV_INGRESS);
    b.attr_u32_be(NFTA_HOOK_PRIORITY, XVETH_PRIORITY as u32);
    b.attr_str(NFTA_HOOK_DEV, veth);
    b.nest_end(h);
    b.attr_u32_be(NFTA_CHAIN_POLICY, NF_ACCEPT);
    b.attr_str(NFTA_CHAIN_TYPE, "filter");
    b.end();
    let f = flush_chain(b, t, veth);
    let names = NetNames::new(crate::plan::NODE);
    let rules = crate::plan::veth_rules()
        .into_iter()
        .map(|r| {
            let part = (r.matches.as_slice(), false, &r.action);
            (expr::new_rule_of(b, t, veth, part, &names, r.comment), r)
        })
        .collect();
    (s, f, rules)
}

/// Deletes an empty chain.
pub fn del_chain(b: &mut MsgBuf, t: TableFamily, name: &str) -> u32 {
    const NFT_MSG_DELCHAIN: u16 = 5;
    let s = begin(b, t, NFT_MSG_DELCHAIN, 0);
    b.attr_str(NFTA_CHAIN_TABLE, TABLE);
    b.attr_str(NFTA_CHAIN_NAME, name);
    b.end();
    s
}

/// Deletes every rule of a chain (a DELRULE without a handle).
pub fn flush_chain(b: &mut MsgBuf, t: TableFamily, chain: &str) -> u32 {
    let s = begin(b, t, NFT_MSG_DELRULE, 0);
    b.attr_str(NFTA_RULE_TABLE, TABLE);
    b.attr_str(NFTA_RULE_CHAIN, chain);
    b.end();
    s
}

/// One NEWSET; `counters`: give the elements of counted sets a counter (kernels without
/// set-element expressions refuse that, and get the set without).
pub fn new_set(
    b: &mut MsgBuf,
    t: TableFamily,
    name: &str,
    kind: SetKind,
    id: u32,
    counters: bool,
) -> u32 {
    let (key_type, key_len) = set_key_type(kind);
    let s = begin(b, t, NFT_MSG_NEWSET, NLM_F_CREATE);
    b.attr_str(NFTA_SET_TABLE, TABLE);
    b.attr_str(NFTA_SET_NAME, name);
    b.attr_u32_be(
        NFTA_SET_FLAGS,
        if kind.is_interval() {
            NFT_SET_INTERVAL
        } else {
            0
        },
    );
    b.attr_u32_be(NFTA_SET_KEY_TYPE, key_type);
    b.attr_u32_be(NFTA_SET_KEY_LEN, key_len);
    b.attr_u32_be(NFTA_SET_ID, id);
    // nft prints string keys (ifname) in host order and addresses in network order; a
    // concatenation starting with an ifname is marked host order too, as nft marks it.
    let order = match kind.key_shape() {
        KeyShape::Name | KeyShape::IfAddr(_) => BYTEORDER_HOST,
        _ => BYTEORDER_BIG,
    };
    let mut ud = vec![UDATA_SET_KEYBYTEORDER, 4];
    ud.extend_from_slice(&order.to_ne_bytes());
    b.attr(NFTA_SET_USERDATA, &ud);
    if kind.is_counted() && counters {
        // Every element gets a counter, which the lookups that match it update.
        let e = b.nest_begin(NFTA_SET_EXPR);
        b.attr_str(NFTA_EXPR_NAME, "counter");
        let d = b.nest_begin(NFTA_EXPR_DATA);
        b.nest_end(d);
        b.nest_end(e);
    }
    b.end();
    s
}

pub fn del_set(b: &mut MsgBuf, t: TableFamily, set: &str) -> u32 {
    let s = begin(b, t, NFT_MSG_DELSET, 0);
    b.attr_str(NFTA_SET_TABLE, TABLE);
    b.attr_str(NFTA_SET_NAME, set);
    b.end();
    s
}

/// Flushes a set: a DELSETELEM without elements.
pub fn flush_set(b: &mut MsgBuf, t: TableFamily, set: &str) -> u32 {
    let s = begin(b, t, NFT_MSG_DELSETELEM, 0);
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
    b.end();
    s
}

pub fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The 16-byte key of an owner in the `ifname`-typed pods set.
pub fn owner_key_bytes(hex: &str) -> Vec<u8> {
    let mut k = hex.as_bytes().to_vec();
    k.resize(16, 0);
    k
}

/// The bytes of a set key.
pub fn key_bytes(k: &Key) -> Vec<u8> {
    match k {
        Key::Addr(a) => ip_bytes(a),
        Key::Port(p) => p.to_be_bytes().to_vec(),
        Key::Owner(o) => owner_key_bytes(&o.hex()),
        Key::Iface(i) => i.bytes().to_vec(),
        Key::IfAddr(i, a) => {
            let mut k = i.bytes().to_vec();
            k.extend_from_slice(&ip_bytes(a));
            k
        }
        Key::AddrPort(a, p) => addr_port_bytes(a, *p),
    }
}

/// An address . port key: the port takes a whole 32-bit register, zero-padded.
fn addr_port_bytes(a: &IpAddr, p: u16) -> Vec<u8> {
    let mut k = ip_bytes(a);
    k.extend_from_slice(&p.to_be_bytes());
    k.extend_from_slice(&[0, 0]);
    k
}

/// A key read back, decoded for its set's kind; `None` for bytes of another shape.
pub fn key_of(kind: SetKind, b: &[u8]) -> Option<Key> {
    let addr = |b: &[u8]| -> Option<IpAddr> {
        match b.len() {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
            16 => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
            _ => None,
        }
    };
    let name = |b: &[u8]| crate::plan::IfName::from_bytes(b);
    if matches!(kind, SetKind::Pods | SetKind::Att) {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        return Some(Key::Owner(crate::plan::OwnerKey::parse_hex(
            std::str::from_utf8(&b[..end]).ok()?,
        )?));
    }
    Some(match kind.key_shape() {
        KeyShape::Name => Key::Iface(name(b)?),
        KeyShape::Port => Key::Port(u16::from_be_bytes(b.try_into().ok()?)),
        KeyShape::IfAddr(_) => {
            let (i, a) = b.split_at_checked(IFNAME_LEN as usize)?;
            Key::IfAddr(name(i)?, addr(a)?)
        }
        KeyShape::AddrPort(_) => {
            let (a, p) = b.split_at_checked(b.len().checked_sub(4)?)?;
            Key::AddrPort(addr(a)?, u16::from_be_bytes([p[0], p[1]]))
        }
        KeyShape::Addr(_) => Key::Addr(addr(b)?),
    })
}

/// Set element payload: (key bytes, flags, comment).
pub struct ElemData {
    pub key: Vec<u8>,
    pub flags: u32,
    pub comment: Option<String>,
}

fn range_bytes(f: Family, v: u128) -> Vec<u8> {
    match f {
        Family::V4 => (v as u32).to_be_bytes().to_vec(),
        Family::V6 => v.to_be_bytes().to_vec(),
    }
}

/// The kernel form of a shared set element: an interval set takes a start key and, unless the
/// range runs to the end of the address space, an end key one past the range flagged
/// INTERVAL_END.
pub fn elem_data(e: &Elem, interval: bool) -> Vec<ElemData> {
    let plain = |key: Vec<u8>| ElemData {
        key,
        flags: 0,
        comment: None,
    };
    match e {
        Elem::Port(p) => vec![plain(p.to_be_bytes().to_vec())],
        Elem::Iface(i) => vec![plain(i.bytes().to_vec())],
        Elem::AddrPort(a, p) => vec![plain(addr_port_bytes(a, *p))],
        Elem::Addr(a) if !interval => vec![plain(ip_bytes(a))],
        Elem::Addr(a) => {
            let f = Family::of(a);
            let v = crate::addr::ip_to_u128(*a);
            elem_data(&Elem::Range(f, v, v), true)
        }
        Elem::Range(f, s, e) => {
            let max = match f {
                Family::V4 => u32::MAX as u128,
                Family::V6 => u128::MAX,
            };
            let mut out = vec![plain(range_bytes(*f, *s))];
            if *e < max {
                out.push(ElemData {
                    key: range_bytes(*f, e + 1),
                    flags: NFT_SET_ELEM_INTERVAL_END,
                    comment: None,
                });
            }
            out
        }
    }
}

/// The most bytes of elements one NEWSETELEM or DELSETELEM message carries. All of a message's
/// elements sit in one nested NFTA_SET_ELEM_LIST_ELEMENTS attribute, whose length is 16 bits:
/// a longer list would wrap it. 16 KiB (some 600 interval elements) stays well clear of that.
pub const MAX_ELEMS_BYTES: usize = 16 << 10;

/// The encoded size of one element inside NFTA_SET_ELEM_LIST_ELEMENTS.
fn elem_size(e: &ElemData) -> usize {
    let key = 4 + 4 + e.key.len().next_multiple_of(4);
    let flags = if e.flags != 0 { 8 } else { 0 };
    let comment = e
        .comment
        .as_ref()
        .map_or(0, |c| MsgBuf::udata_text_attr_size(c));
    4 + key + flags + comment
}

/// NEWSETELEM or DELSETELEM messages carrying `elems`, as many as [`MAX_ELEMS_BYTES`] needs,
/// in order; returns their sequence numbers. An interval's end element stays in the message
/// of its start. Every message belongs to the same batch, so the split changes nothing about
/// atomicity.
pub fn set_elems(
    b: &mut MsgBuf,
    t: TableFamily,
    msg: u16,
    flags: u16,
    set: &str,
    elems: &[ElemData],
) -> Vec<u32> {
    let mut seqs = Vec::new();
    let mut rest = elems;
    loop {
        let mut bytes = 0;
        let mut n = 0;
        while n < rest.len() {
            let sz = elem_size(&rest[n]);
            let keeps_pair = rest[n].flags & NFT_SET_ELEM_INTERVAL_END != 0;
            if n > 0 && bytes + sz > MAX_ELEMS_BYTES && !keeps_pair {
                break;
            }
            bytes += sz;
            n += 1;
        }
        let (chunk, tail) = rest.split_at(n);
        seqs.push(set_elems_one(b, t, msg, flags, set, chunk));
        rest = tail;
        if rest.is_empty() {
            return seqs;
        }
    }
}

fn set_elems_one(
    b: &mut MsgBuf,
    t: TableFamily,
    msg: u16,
    flags: u16,
    set: &str,
    elems: &[ElemData],
) -> u32 {
    let s = begin(b, t, msg, flags);
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
    let list = b.nest_begin(NFTA_SET_ELEM_LIST_ELEMENTS);
    for e in elems {
        let el = b.nest_begin(NFTA_LIST_ELEM);
        let k = b.nest_begin(NFTA_SET_ELEM_KEY);
        b.attr(NFTA_DATA_VALUE, &e.key);
        b.nest_end(k);
        if e.flags != 0 {
            b.attr_u32_be(NFTA_SET_ELEM_FLAGS, e.flags);
        }
        if let Some(c) = &e.comment {
            attr_comment(b, NFTA_SET_ELEM_USERDATA, c);
        }
        b.nest_end(el);
    }
    b.nest_end(list);
    b.end();
    s
}

/// A GETSETELEM for one key (no dump): the kernel answers with the element or ENOENT.
pub fn get_elem(b: &mut MsgBuf, t: TableFamily, set: &str, key: &[u8]) -> u32 {
    let s = begin(b, t, NFT_MSG_GETSETELEM, 0);
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
    let list = b.nest_begin(NFTA_SET_ELEM_LIST_ELEMENTS);
    let el = b.nest_begin(NFTA_LIST_ELEM);
    let k = b.nest_begin(NFTA_SET_ELEM_KEY);
    b.attr(NFTA_DATA_VALUE, key);
    b.nest_end(k);
    b.nest_end(el);
    b.nest_end(list);
    b.end();
    s
}

pub fn dump_elems(b: &mut MsgBuf, t: TableFamily, set: &str) -> u32 {
    let s = begin(b, t, NFT_MSG_GETSETELEM, NLM_F_DUMP);
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
    b.end();
    s
}

pub fn dump_rules(b: &mut MsgBuf, t: TableFamily, chain: Option<&str>) -> u32 {
    let s = begin(b, t, NFT_MSG_GETRULE, NLM_F_DUMP);
    b.attr_str(NFTA_RULE_TABLE, TABLE);
    if let Some(c) = chain {
        b.attr_str(NFTA_RULE_CHAIN, c);
    }
    b.end();
    s
}

pub fn dump_chains(b: &mut MsgBuf, t: TableFamily) -> u32 {
    let s = begin(b, t, NFT_MSG_GETCHAIN, NLM_F_DUMP);
    b.attr_str(NFTA_CHAIN_TABLE, TABLE);
    b.end();
    s
}

pub fn dump_sets(b: &mut MsgBuf, t: TableFamily) -> u32 {
    let s = begin(b, t, NFT_MSG_GETSET, NLM_F_DUMP);
    b.attr_str(NFTA_SET_TABLE, TABLE);
    b.end();
    s
}

pub fn get_table(b: &mut MsgBuf, t: TableFamily) -> u32 {
    let s = begin(b, t, NFT_MSG_GETTABLE, 0);
    b.attr_str(NFTA_TABLE_NAME, TABLE);
    b.end();
    s
}

pub fn get_gen(b: &mut MsgBuf) -> u32 {
    let s = b.begin(nft_type(NFT_MSG_GETGEN), 0, 0, 0);
    b.end();
    s
}

mod expr;
pub use expr::new_rule;

#[cfg(test)]
mod tests;
