//! Lowering plan objects to nf_tables netlink messages.
//!
//! Each builder appends one message to a batch. Values follow the kernel ABI: attribute
//! integers are big-endian (`NLA_U32` with `ntohl` in nf_tables_api.c); data compared against
//! packet bytes is in packet order (addresses, ports); data compared against host fields
//! (`meta mark`, `ct status`) is in host order. Registers: the 16-byte NFT_REG_1 holds any address,
//! NFT_REG_2 the DNAT port.
//!
//! Batch messages do not ask for an ACK: the kernel reports their errors anyway, and
//! [`Tx::commit`](super::Tx::commit) asks for one acknowledgement, on the last message (see
//! `netlink`). Element lists are split over several messages of the batch ([`set_elems`]),
//! because one message's list is a single attribute with a 16-bit length.

use crate::netlink::*;
use crate::plan::{Action, Elem, Family, Match, NetNames, Rule, SetKind, TABLE};
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
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
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

/// libnftnl's user-data TLV types, so `nft list` shows our comments and key byte order.
const UDATA_COMMENT: u8 = 0;
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG: u32 = 2;

pub fn udata_comment(s: &str) -> Vec<u8> {
    let mut v = vec![UDATA_COMMENT, (s.len() + 1) as u8];
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
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

pub fn begin(b: &mut MsgBuf, msg: u16, flags: u16) -> u32 {
    b.begin(nft_type(msg), flags, NFPROTO_INET, 0)
}

pub fn new_table(b: &mut MsgBuf) -> u32 {
    let s = begin(b, NFT_MSG_NEWTABLE, NLM_F_CREATE);
    b.attr_str(NFTA_TABLE_NAME, TABLE);
    b.attr_u32_be(NFTA_TABLE_FLAGS, 0);
    b.end();
    s
}

pub fn del_table(b: &mut MsgBuf) -> u32 {
    let s = begin(b, NFT_MSG_DELTABLE, 0);
    b.attr_str(NFTA_TABLE_NAME, TABLE);
    b.end();
    s
}

pub fn new_chain(b: &mut MsgBuf, name: &str, ty: &str, hook: u32, prio: i32) -> u32 {
    let s = begin(b, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    b.attr_str(NFTA_CHAIN_TABLE, TABLE);
    b.attr_str(NFTA_CHAIN_NAME, name);
    let h = b.nest_begin(NFTA_CHAIN_HOOK);
    b.attr_u32_be(NFTA_HOOK_HOOKNUM, hook);
    b.attr_u32_be(NFTA_HOOK_PRIORITY, prio as u32);
    b.nest_end(h);
    b.attr_u32_be(NFTA_CHAIN_POLICY, NF_ACCEPT);
    b.attr_str(NFTA_CHAIN_TYPE, ty);
    b.end();
    s
}

/// Deletes every rule of a chain (a DELRULE without a handle).
pub fn flush_chain(b: &mut MsgBuf, chain: &str) -> u32 {
    let s = begin(b, NFT_MSG_DELRULE, 0);
    b.attr_str(NFTA_RULE_TABLE, TABLE);
    b.attr_str(NFTA_RULE_CHAIN, chain);
    b.end();
    s
}

pub fn new_set(b: &mut MsgBuf, name: &str, kind: SetKind, id: u32) -> u32 {
    let (key_type, key_len) = kind.key_type();
    let s = begin(b, NFT_MSG_NEWSET, NLM_F_CREATE);
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
    let order = if kind == SetKind::Pods {
        BYTEORDER_HOST
    } else {
        BYTEORDER_BIG
    };
    let mut ud = vec![UDATA_SET_KEYBYTEORDER, 4];
    ud.extend_from_slice(&order.to_ne_bytes());
    b.attr(NFTA_SET_USERDATA, &ud);
    b.end();
    s
}

/// Flushes a set: a DELSETELEM without elements.
pub fn flush_set(b: &mut MsgBuf, set: &str) -> u32 {
    let s = begin(b, NFT_MSG_DELSETELEM, 0);
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
        Elem::Addr(a) if !interval => vec![plain(ip_bytes(a))],
        Elem::Addr(a) => {
            let f = Family::of(a);
            let v = crate::config::ip_to_u128(*a);
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
        .map_or(0, |c| (4 + udata_comment(c).len()).next_multiple_of(4));
    4 + key + flags + comment
}

/// NEWSETELEM or DELSETELEM messages carrying `elems`, as many as [`MAX_ELEMS_BYTES`] needs,
/// in order; returns their sequence numbers. An interval's end element stays in the message
/// of its start. Every message belongs to the same batch, so the split changes nothing about
/// atomicity.
pub fn set_elems(b: &mut MsgBuf, msg: u16, flags: u16, set: &str, elems: &[ElemData]) -> Vec<u32> {
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
        seqs.push(set_elems_one(b, msg, flags, set, chunk));
        rest = tail;
        if rest.is_empty() {
            return seqs;
        }
    }
}

fn set_elems_one(b: &mut MsgBuf, msg: u16, flags: u16, set: &str, elems: &[ElemData]) -> u32 {
    let s = begin(b, msg, flags);
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
            b.attr(NFTA_SET_ELEM_USERDATA, &udata_comment(c));
        }
        b.nest_end(el);
    }
    b.nest_end(list);
    b.end();
    s
}

/// A GETSETELEM for one key (no dump): the kernel answers with the element or ENOENT.
pub fn get_elem(b: &mut MsgBuf, set: &str, key: &[u8]) -> u32 {
    let s = begin(b, NFT_MSG_GETSETELEM, 0);
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

pub fn dump_elems(b: &mut MsgBuf, set: &str) -> u32 {
    let s = begin(b, NFT_MSG_GETSETELEM, NLM_F_DUMP);
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
    b.end();
    s
}

pub fn dump_rules(b: &mut MsgBuf, chain: Option<&str>) -> u32 {
    let s = begin(b, NFT_MSG_GETRULE, NLM_F_DUMP);
    b.attr_str(NFTA_RULE_TABLE, TABLE);
    if let Some(c) = chain {
        b.attr_str(NFTA_RULE_CHAIN, c);
    }
    b.end();
    s
}

pub fn dump_chains(b: &mut MsgBuf) -> u32 {
    let s = begin(b, NFT_MSG_GETCHAIN, NLM_F_DUMP);
    b.attr_str(NFTA_CHAIN_TABLE, TABLE);
    b.end();
    s
}

pub fn dump_sets(b: &mut MsgBuf) -> u32 {
    let s = begin(b, NFT_MSG_GETSET, NLM_F_DUMP);
    b.attr_str(NFTA_SET_TABLE, TABLE);
    b.end();
    s
}

pub fn get_table(b: &mut MsgBuf) -> u32 {
    let s = begin(b, NFT_MSG_GETTABLE, 0);
    b.attr_str(NFTA_TABLE_NAME, TABLE);
    b.end();
    s
}

pub fn get_gen(b: &mut MsgBuf) -> u32 {
    let s = b.begin(nft_type(NFT_MSG_GETGEN), 0, 0, 0);
    b.end();
    s
}

// ---------- expressions ----------

struct Exprs<'a> {
    b: &'a mut MsgBuf,
}

impl Exprs<'_> {
    fn expr(&mut self, name: &str, body: impl FnOnce(&mut MsgBuf)) {
        let el = self.b.nest_begin(NFTA_LIST_ELEM);
        self.b.attr_str(NFTA_EXPR_NAME, name);
        let d = self.b.nest_begin(NFTA_EXPR_DATA);
        body(self.b);
        self.b.nest_end(d);
        self.b.nest_end(el);
    }

    fn data(b: &mut MsgBuf, ty: u16, value: &[u8]) {
        let n = b.nest_begin(ty);
        b.attr(NFTA_DATA_VALUE, value);
        b.nest_end(n);
    }

    /// payload load: base (1 network, 2 transport), offset, len → reg
    fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32) {
        self.expr("payload", |b| {
            b.attr_u32_be(1, dreg); // NFTA_PAYLOAD_DREG
            b.attr_u32_be(2, base); // NFTA_PAYLOAD_BASE
            b.attr_u32_be(3, offset); // NFTA_PAYLOAD_OFFSET
            b.attr_u32_be(4, len); // NFTA_PAYLOAD_LEN
        });
    }

    fn meta(&mut self, key: u32, dreg: u32) {
        self.expr("meta", |b| {
            b.attr_u32_be(1, dreg); // NFTA_META_DREG
            b.attr_u32_be(2, key); // NFTA_META_KEY
        });
    }

    fn cmp_eq(&mut self, sreg: u32, value: &[u8]) {
        self.expr("cmp", |b| {
            b.attr_u32_be(1, sreg); // NFTA_CMP_SREG
            b.attr_u32_be(2, 0); // NFTA_CMP_OP: NFT_CMP_EQ
            Self::data(b, 3, value); // NFTA_CMP_DATA
        });
    }

    fn bitwise_and(&mut self, reg: u32, mask: &[u8]) {
        let zero = vec![0u8; mask.len()];
        self.expr("bitwise", |b| {
            b.attr_u32_be(1, reg); // NFTA_BITWISE_SREG
            b.attr_u32_be(2, reg); // NFTA_BITWISE_DREG
            b.attr_u32_be(3, mask.len() as u32); // NFTA_BITWISE_LEN
            Self::data(b, 4, mask); // NFTA_BITWISE_MASK
            Self::data(b, 5, &zero); // NFTA_BITWISE_XOR
        });
    }

    fn lookup(&mut self, set: &str, sreg: u32, invert: bool) {
        self.expr("lookup", |b| {
            b.attr_str(1, set); // NFTA_LOOKUP_SET
            b.attr_u32_be(2, sreg); // NFTA_LOOKUP_SREG
            if invert {
                b.attr_u32_be(5, 1); // NFTA_LOOKUP_FLAGS: NFT_LOOKUP_F_INV
            }
        });
    }

    fn ct_status(&mut self, dreg: u32) {
        self.expr("ct", |b| {
            b.attr_u32_be(1, dreg); // NFTA_CT_DREG
            b.attr_u32_be(2, 2); // NFTA_CT_KEY: NFT_CT_STATUS
        });
    }

    fn immediate_data(&mut self, dreg: u32, value: &[u8]) {
        self.expr("immediate", |b| {
            b.attr_u32_be(1, dreg); // NFTA_IMMEDIATE_DREG
            Self::data(b, 2, value); // NFTA_IMMEDIATE_DATA
        });
    }

    fn verdict(&mut self, code: i32) {
        self.expr("immediate", |b| {
            b.attr_u32_be(1, NFT_REG_VERDICT);
            let d = b.nest_begin(2); // NFTA_IMMEDIATE_DATA
            let v = b.nest_begin(NFTA_DATA_VERDICT);
            b.attr_u32_be(NFTA_VERDICT_CODE, code as u32);
            b.nest_end(v);
            b.nest_end(d);
        });
    }
}

fn nfproto(f: Family) -> u8 {
    match f {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

/// (offset, len) of the source and destination address in the network header.
fn addr_offsets(f: Family) -> ((u32, u32), (u32, u32)) {
    match f {
        Family::V4 => ((12, 4), (16, 4)),
        Family::V6 => ((8, 16), (24, 16)),
    }
}

fn lower_match(x: &mut Exprs<'_>, m: &Match, names: &NetNames) {
    match m {
        // meta nfproto ipv4 → [ meta load nfproto => reg 1 ] [ cmp eq reg 1 0x02 ]
        Match::NfProto(f) => {
            x.meta(15, NFT_REG_1); // NFT_META_NFPROTO
            x.cmp_eq(NFT_REG_1, &[nfproto(*f)]);
        }
        // ip saddr @set → [ payload load 4b @ network + 12 => reg 1 ] [ lookup reg 1 set ]
        Match::SaddrIn(f, s) => {
            let ((off, len), _) = addr_offsets(*f);
            x.payload(1, off, len, NFT_REG_1);
            x.lookup(&names.set(*s), NFT_REG_1, false);
        }
        // ip saddr != @set → the same lookup, inverted
        Match::SaddrNotIn(f, s) => {
            let ((off, len), _) = addr_offsets(*f);
            x.payload(1, off, len, NFT_REG_1);
            x.lookup(&names.set(*s), NFT_REG_1, true);
        }
        Match::DaddrIn(f, s) => {
            let (_, (off, len)) = addr_offsets(*f);
            x.payload(1, off, len, NFT_REG_1);
            x.lookup(&names.set(*s), NFT_REG_1, false);
        }
        // tcp dport @set → [ meta load l4proto ] [ cmp eq 6 ] [ payload load 2b @ transport + 2 ] [ lookup ]
        Match::TcpDportIn(s) => {
            x.meta(16, NFT_REG_1); // NFT_META_L4PROTO
            x.cmp_eq(NFT_REG_1, &[libc::IPPROTO_TCP as u8]);
            x.payload(2, 2, 2, NFT_REG_1);
            x.lookup(&names.set(*s), NFT_REG_1, false);
        }
        // meta mark & M == M → [ meta load mark ] [ bitwise & M ] [ cmp eq M ] (host order)
        Match::MarkHas(mark) => {
            x.meta(3, NFT_REG_1); // NFT_META_MARK
            x.bitwise_and(NFT_REG_1, &mark.to_ne_bytes());
            x.cmp_eq(NFT_REG_1, &mark.to_ne_bytes());
        }
        // ct status & dnat == 0 → [ ct load status ] [ bitwise & IPS_DST_NAT ] [ cmp eq 0 ]
        Match::NotDnatted => {
            const IPS_DST_NAT: u32 = 1 << 5;
            x.ct_status(NFT_REG_1);
            x.bitwise_and(NFT_REG_1, &IPS_DST_NAT.to_ne_bytes());
            x.cmp_eq(NFT_REG_1, &0u32.to_ne_bytes());
        }
    }
}

fn lower_action(x: &mut Exprs<'_>, a: &Action) {
    match a {
        // dnat ip to A:P → [ immediate reg 1 A ] [ immediate reg 2 P ] [ nat dnat ip addr reg 1 proto reg 2 ]
        Action::DnatTo(ip, port) => {
            x.immediate_data(NFT_REG_1, &ip_bytes(ip));
            x.immediate_data(NFT_REG_2, &port.to_be_bytes());
            let fam = nfproto(Family::of(ip));
            x.expr("nat", |b| {
                b.attr_u32_be(1, 1); // NFTA_NAT_TYPE: NFT_NAT_DNAT
                b.attr_u32_be(2, fam as u32); // NFTA_NAT_FAMILY
                b.attr_u32_be(3, NFT_REG_1); // NFTA_NAT_REG_ADDR_MIN
                b.attr_u32_be(5, NFT_REG_2); // NFTA_NAT_REG_PROTO_MIN
            });
        }
        // snat ip to ip saddr → [ payload load saddr => reg 1 ] [ nat snat ip addr reg 1 ]
        Action::SnatToSaddr(f) => {
            let ((off, len), _) = addr_offsets(*f);
            x.payload(1, off, len, NFT_REG_1);
            let fam = nfproto(*f);
            x.expr("nat", |b| {
                b.attr_u32_be(1, 0); // NFT_NAT_SNAT
                b.attr_u32_be(2, fam as u32);
                b.attr_u32_be(3, NFT_REG_1);
            });
        }
        Action::Masquerade { random_fully } => {
            const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 1 << 4;
            let flags = if *random_fully {
                NF_NAT_RANGE_PROTO_RANDOM_FULLY
            } else {
                0
            };
            x.expr("masq", |b| {
                if flags != 0 {
                    b.attr_u32_be(1, flags); // NFTA_MASQ_FLAGS
                }
            });
        }
        Action::RejectTcpReset => {
            x.expr("reject", |b| {
                b.attr_u32_be(1, 1); // NFTA_REJECT_TYPE: NFT_REJECT_TCP_RST
                b.attr_u8(2, 0); // NFTA_REJECT_ICMP_CODE
            });
        }
        Action::Return => x.verdict(NFT_RETURN),
    }
}

/// One NEWRULE appended to `chain`, commented with the plan's fingerprint.
pub fn new_rule(b: &mut MsgBuf, chain: &str, rule: &Rule, names: &NetNames, comment: &str) -> u32 {
    let s = begin(b, NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
    b.attr_str(NFTA_RULE_TABLE, TABLE);
    b.attr_str(NFTA_RULE_CHAIN, chain);
    let list = b.nest_begin(NFTA_RULE_EXPRESSIONS);
    {
        let mut x = Exprs { b };
        for m in &rule.matches {
            lower_match(&mut x, m, names);
        }
        lower_action(&mut x, &rule.action);
    }
    b.nest_end(list);
    b.attr(NFTA_RULE_USERDATA, &udata_comment(comment));
    b.end();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(m: &crate::netlink::Msg) -> Vec<(Vec<u8>, u32)> {
        let list = m.nf_attrs().get(NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
        list.nested()
            .map(|el| {
                let a = el.nested();
                let key = a.get(NFTA_SET_ELEM_KEY).unwrap().nested();
                let flags = a
                    .get(NFTA_SET_ELEM_FLAGS)
                    .and_then(|f| f.u32_be())
                    .unwrap_or(0);
                (key.get(NFTA_DATA_VALUE).unwrap().payload.to_vec(), flags)
            })
            .collect()
    }

    #[test]
    fn long_element_lists_are_split_and_keep_interval_pairs() {
        // 5,000 non-adjacent /32s: 10,000 interval elements, far past one 16-bit nla_len.
        let data: Vec<ElemData> = (0..5000u128)
            .flat_map(|i| {
                elem_data(
                    &Elem::Range(Family::V4, 0x0a00_0000 + 2 * i, 0x0a00_0000 + 2 * i),
                    true,
                )
            })
            .collect();
        assert_eq!(data.len(), 10_000);
        let mut b = MsgBuf::new(1);
        let seqs = set_elems(&mut b, NFT_MSG_NEWSETELEM, 0, "n-nets4", &data);
        assert!(seqs.len() > 1 && !b.is_oversized());
        let msgs = crate::netlink::parse_msgs(b.as_bytes());
        assert_eq!(msgs.len(), seqs.len());
        let mut all = Vec::new();
        for m in &msgs {
            let list = m.nf_attrs().get(NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
            assert!(list.payload.len() <= MAX_ELEMS_BYTES + 64);
            let els = elements(m);
            // A message never starts with an interval's end.
            assert_eq!(els[0].1 & NFT_SET_ELEM_INTERVAL_END, 0);
            all.extend(els);
        }
        let want: Vec<(Vec<u8>, u32)> = data.iter().map(|d| (d.key.clone(), d.flags)).collect();
        assert_eq!(all, want, "every element once, in order");
    }

    #[test]
    fn batch_messages_ask_for_no_ack() {
        let mut b = MsgBuf::new(1);
        new_table(&mut b);
        flush_set(&mut b, "s");
        set_elems(
            &mut b,
            NFT_MSG_DELSETELEM,
            0,
            "s",
            &[ElemData {
                key: vec![1, 2, 3, 4],
                flags: 0,
                comment: Some("c".into()),
            }],
        );
        assert_eq!(b.acked_seqs().count(), 0);
        assert_eq!(b.ack_last(), Some(3));
        assert_eq!(b.acked_seqs().collect::<Vec<_>>(), vec![3]);
        let last = crate::netlink::parse_msgs(b.as_bytes()).pop().unwrap();
        assert_ne!(last.flags & NLM_F_ACK, 0);
    }
}
