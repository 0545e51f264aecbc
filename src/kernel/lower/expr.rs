//! Rule expressions: each plan match and action as the nf_tables expressions that implement
//! it, with the nft syntax it corresponds to written above each arm.

use super::*;

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
        self.cmp(sreg, NFT_CMP_EQ, value);
    }

    fn cmp(&mut self, sreg: u32, op: u32, value: &[u8]) {
        self.expr("cmp", |b| {
            b.attr_u32_be(1, sreg); // NFTA_CMP_SREG
            b.attr_u32_be(2, op); // NFTA_CMP_OP
            Self::data(b, 3, value); // NFTA_CMP_DATA
        });
    }

    /// A conntrack field of the original direction.
    fn ct_original(&mut self, key: u32, dreg: u32) {
        self.expr("ct", |b| {
            b.attr_u32_be(1, dreg); // NFTA_CT_DREG
            b.attr_u32_be(2, key); // NFTA_CT_KEY
            b.attr_u8(3, 0); // NFTA_CT_DIRECTION: IP_CT_DIR_ORIGINAL
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

    fn immediate_data(&mut self, dreg: u32, value: &[u8]) {
        self.expr("immediate", |b| {
            b.attr_u32_be(1, dreg); // NFTA_IMMEDIATE_DREG
            Self::data(b, 2, value); // NFTA_IMMEDIATE_DATA
        });
    }

    fn verdict(&mut self, code: i32, chain: Option<&str>) {
        self.expr("immediate", |b| {
            b.attr_u32_be(1, NFT_REG_VERDICT);
            let d = b.nest_begin(2); // NFTA_IMMEDIATE_DATA
            let v = b.nest_begin(NFTA_DATA_VERDICT);
            b.attr_u32_be(NFTA_VERDICT_CODE, code as u32);
            if let Some(c) = chain {
                b.attr_str(2, c); // NFTA_VERDICT_CHAIN
            }
            b.nest_end(v);
            b.nest_end(d);
        });
    }
}

pub(super) fn nfproto(f: Family) -> u8 {
    match f {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

/// (offset, len) of the source and destination address in the network header.
pub(super) fn addr_offsets(f: Family) -> ((u32, u32), (u32, u32)) {
    match f {
        Family::V4 => ((12, 4), (16, 4)),
        Family::V6 => ((8, 16), (24, 16)),
    }
}

const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
/// `goto` (`NFT_GOTO` in `enum nft_verdicts`).
const NFT_GOTO: i32 = -4;
/// `fib` result and flags: the address type of the source address.
const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
const NFTA_FIB_F_SADDR: u32 = 1;
/// `RTN_LOCAL`, host order, as the fib expression stores it.
const RTN_LOCAL: u32 = 2;
/// `ct` keys (`enum nft_ct_keys`).
const NFT_CT_DIRECTION: u32 = 1;
const NFT_CT_STATUS: u32 = 2;
/// `IPS_DST_NAT` of `enum ip_conntrack_status`: the connection was DNATed.
const IPS_DST_NAT: u32 = 0x20;
const NFT_CT_PROTO_DST: u32 = 12;
const NFT_CT_LABELS: u32 = 13;
const NFT_CT_DST_IP: u32 = 20;
const NFT_CT_DST_IP6: u32 = 22;
const NFT_META_PROTOCOL: u32 = 1;
const NFT_META_MARK: u32 = 3;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const BASE_NETWORK: u32 = 1;
const BASE_TRANSPORT: u32 = 2;
/// Offset of the sender protocol address in an ARP packet for IPv4 over Ethernet.
const ARP_SPA_OFFSET: u32 = 14;
const ICMPV6_ND_NEIGHBOR_ADVERT: u8 = 136;
/// Offset of the target address in a neighbour advertisement.
const ND_TARGET_OFFSET: u32 = 8;

/// `meta iifname . <field> <op> @set`: the interface name fills NFT_REG32_00..03 and the
/// field follows at NFT_REG32_04, the layout of a concatenated key.
fn iif_concat_lookup(x: &mut Exprs<'_>, field: (u32, u32, u32), set: &str, invert: bool) {
    name_concat_lookup(x, NFT_META_IIFNAME, field, set, invert);
}

/// A 16-byte name from meta `key`, then a field, looked up as one concatenated key.
fn name_concat_lookup(
    x: &mut Exprs<'_>,
    key: u32,
    field: (u32, u32, u32),
    set: &str,
    invert: bool,
) {
    let (base, off, len) = field;
    x.meta(key, NFT_REG32_00);
    x.payload(base, off, len, NFT_REG32_04);
    x.lookup(set, NFT_REG32_00, invert);
}

fn lower_match(x: &mut Exprs<'_>, m: &Match, names: &NetNames) {
    let set = |k: &SetKind| names.set(*k);
    match m {
        // meta nfproto ipv4 → [ meta load nfproto => reg 1 ] [ cmp eq reg 1 0x02 ]
        Match::NfProto(f) => {
            x.meta(NFT_META_NFPROTO, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[nfproto(*f)]);
        }
        // meta protocol ip → [ meta load protocol => reg 1 ] [ cmp eq reg 1 0x0800 ] (network order)
        Match::Protocol(t) => {
            x.meta(NFT_META_PROTOCOL, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &t.value().to_be_bytes());
        }
        // ip saddr @set → [ payload load 4b @ network + 12 => reg 1 ] [ lookup reg 1 set ]
        Match::SaddrIn(f, s) => {
            let ((off, len), _) = addr_offsets(*f);
            x.payload(BASE_NETWORK, off, len, NFT_REG_1);
            x.lookup(&set(s), NFT_REG_1, false);
        }
        Match::DaddrIn(f, s) => {
            let (_, (off, len)) = addr_offsets(*f);
            x.payload(BASE_NETWORK, off, len, NFT_REG_1);
            x.lookup(&set(s), NFT_REG_1, false);
        }
        // tcp dport @set → [ meta load l4proto ] [ cmp eq 6 ] [ payload load 2b @ transport + 2 ] [ lookup ]
        Match::TcpDportIn(s) => {
            x.meta(NFT_META_L4PROTO, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[libc::IPPROTO_TCP as u8]);
            x.payload(BASE_TRANSPORT, 2, 2, NFT_REG_1);
            x.lookup(&set(s), NFT_REG_1, false);
        }
        // iifname . ip saddr != @set → [ meta load iifname => reg32 0 ]
        //   [ payload load 4b @ network + 12 => reg32 4 ] [ lookup reg32 0 set, inverted ]
        Match::IifSaddrNotIn(f, s) => {
            let ((off, len), _) = addr_offsets(*f);
            iif_concat_lookup(x, (BASE_NETWORK, off, len), &set(s), true);
        }
        // iifname . arp saddr ip @set → [ meta load iifname => reg32 0 ]
        //   [ payload load 4b @ network + 14 => reg32 4 ] [ lookup reg32 0 set ]
        Match::IifArpSpaIn(s) | Match::IifArpSpaNotIn(s) => {
            let invert = matches!(m, Match::IifArpSpaNotIn(_));
            iif_concat_lookup(x, (BASE_NETWORK, ARP_SPA_OFFSET, 4), &set(s), invert);
        }
        // icmpv6 type nd-neighbor-advert → [ meta load l4proto ] [ cmp eq 58 ]
        //   [ payload load 1b @ transport + 0 ] [ cmp eq 136 ]
        Match::NeighborAdvert => {
            x.meta(NFT_META_L4PROTO, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[libc::IPPROTO_ICMPV6 as u8]);
            x.payload(BASE_TRANSPORT, 0, 1, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[ICMPV6_ND_NEIGHBOR_ADVERT]);
        }
        Match::IifNdTargetIn(s) | Match::IifNdTargetNotIn(s) => {
            let invert = matches!(m, Match::IifNdTargetNotIn(_));
            iif_concat_lookup(x, (BASE_TRANSPORT, ND_TARGET_OFFSET, 16), &set(s), invert);
        }
        // meta mark & M == M → [ meta load mark ] [ bitwise & M ] [ cmp eq M ] (host order)
        Match::MarkHas(mark) => {
            x.meta(NFT_META_MARK, NFT_REG_1);
            x.bitwise_and(NFT_REG_1, &mark.to_ne_bytes());
            x.cmp_eq(NFT_REG_1, &mark.to_ne_bytes());
        }
        // meta mark & MASK ==/!= V → [ meta load mark ] [ bitwise & MASK ] [ cmp eq/neq V ]
        Match::MarkIs { mask, value } | Match::MarkIsNot { mask, value } => {
            let op = if matches!(m, Match::MarkIs { .. }) {
                NFT_CMP_EQ
            } else {
                NFT_CMP_NEQ
            };
            x.meta(NFT_META_MARK, NFT_REG_1);
            x.bitwise_and(NFT_REG_1, &mask.to_ne_bytes());
            x.cmp(NFT_REG_1, op, &value.to_ne_bytes());
        }
        // ct original ip daddr @set → [ ct load dst_ip => reg 1, dir original ] [ lookup ]
        Match::CtOrigDaddrIn(f, s) => {
            let key = match f {
                Family::V4 => NFT_CT_DST_IP,
                Family::V6 => NFT_CT_DST_IP6,
            };
            x.ct_original(key, NFT_REG_1);
            x.lookup(&set(s), NFT_REG_1, false);
        }
        // meta l4proto tcp ct original ip daddr . ct original proto-dst @set →
        //   [ meta load l4proto ] [ cmp eq 6 ] [ ct load dst_ip => reg32 0, dir original ]
        //   [ ct load proto_dst => reg32 1 (4 for IPv6), dir original ] [ lookup reg32 0 ]:
        //   the layout of a concatenated key, as for `ip daddr . tcp dport`.
        Match::CtOrigToIn(f, s) => {
            let (key, len) = match f {
                Family::V4 => (NFT_CT_DST_IP, 4),
                Family::V6 => (NFT_CT_DST_IP6, 16),
            };
            x.meta(NFT_META_L4PROTO, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[libc::IPPROTO_TCP as u8]);
            x.ct_original(key, NFT_REG32_00);
            x.ct_original(NFT_CT_PROTO_DST, NFT_REG32_00 + len / 4);
            x.lookup(&set(s), NFT_REG32_00, false);
        }
        // ct status dnat → [ ct load status => reg 1 ] [ bitwise reg 1 = (reg 1 & 0x20) ^ 0 ]
        //   [ cmp neq reg 1 0 ] (the status word in host order)
        Match::CtStatusDnat => {
            x.expr("ct", |b| {
                b.attr_u32_be(1, NFT_REG_1); // NFTA_CT_DREG
                b.attr_u32_be(2, NFT_CT_STATUS); // NFTA_CT_KEY
            });
            x.bitwise_and(NFT_REG_1, &IPS_DST_NAT.to_ne_bytes());
            x.cmp(NFT_REG_1, NFT_CMP_NEQ, &0u32.to_ne_bytes());
        }
        // ct label N → [ ct load label => reg 1 ] [ bitwise reg 1 = (reg 1 & bit N) ^ 0 ]
        //   [ cmp neq reg 1 0 ] (16 bytes)
        Match::CtLabel(bit) => {
            x.expr("ct", |b| {
                b.attr_u32_be(1, NFT_REG_1); // NFTA_CT_DREG
                b.attr_u32_be(2, NFT_CT_LABELS); // NFTA_CT_KEY
            });
            x.bitwise_and(NFT_REG_1, &label_bits(*bit));
            x.cmp(NFT_REG_1, NFT_CMP_NEQ, &[0; 16]);
        }
        // ct direction original → [ ct load direction => reg 1 ] [ cmp eq 0 ]
        Match::CtDirOriginal => {
            x.expr("ct", |b| {
                b.attr_u32_be(1, NFT_REG_1); // NFTA_CT_DREG
                b.attr_u32_be(2, NFT_CT_DIRECTION); // NFTA_CT_KEY
            });
            x.cmp_eq(NFT_REG_1, &[0]); // IP_CT_DIR_ORIGINAL
        }
        // ip daddr . tcp dport @set → [ payload load daddr => reg32 0 ]
        //   [ payload load 2b @ transport + 2 => reg32 1 (4 for IPv6) ] [ lookup reg32 0 ]
        Match::ToIn(f, s) => {
            let (_, (off, len)) = addr_offsets(*f);
            x.payload(BASE_NETWORK, off, len, NFT_REG32_00);
            x.payload(BASE_TRANSPORT, 2, 2, NFT_REG32_00 + len / 4);
            x.lookup(&set(s), NFT_REG32_00, false);
        }
        // meta l4proto != tcp → [ meta load l4proto => reg 1 ] [ cmp neq reg 1 6 ]
        Match::NotTcp => {
            x.meta(NFT_META_L4PROTO, NFT_REG_1);
            x.cmp(NFT_REG_1, NFT_CMP_NEQ, &[libc::IPPROTO_TCP as u8]);
        }
        // meta l4proto ipv6-icmp → [ meta load l4proto => reg 1 ] [ cmp eq reg 1 58 ]
        Match::IsIcmpv6 => {
            x.meta(NFT_META_L4PROTO, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[libc::IPPROTO_ICMPV6 as u8]);
        }
        Match::IsTcp => {
            x.meta(NFT_META_L4PROTO, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &[libc::IPPROTO_TCP as u8]);
        }
        // iifname "lo" → [ meta load iifname => reg 1 ] [ cmp eq reg 1 "lo\0…" (16 bytes) ]
        Match::IifIs(name) => {
            let mut v = name.as_bytes().to_vec();
            v.resize(IFNAME_LEN as usize, 0);
            x.meta(NFT_META_IIFNAME, NFT_REG_1);
            x.cmp_eq(NFT_REG_1, &v);
        }
        // iifname @set → [ meta load iifname => reg 1 ] [ lookup reg 1 set ]
        Match::IifIn(s) => {
            x.meta(NFT_META_IIFNAME, NFT_REG_1);
            x.lookup(&set(s), NFT_REG_1, false);
        }
        // iifname != @set → [ meta load iifname => reg 1 ] [ lookup reg 1 set, inverted ]
        Match::IifNotIn(s) => {
            x.meta(NFT_META_IIFNAME, NFT_REG_1);
            x.lookup(&set(s), NFT_REG_1, true);
        }
        Match::IifSaddrIn(f, s) => {
            let ((off, len), _) = addr_offsets(*f);
            iif_concat_lookup(x, (BASE_NETWORK, off, len), &set(s), false);
        }
        // fib saddr type != local → [ fib saddr type => reg 1 ] [ cmp neq reg 1 2 ] (host order)
        Match::SaddrNotLocal => {
            x.expr("fib", |b| {
                b.attr_u32_be(1, NFT_REG_1); // NFTA_FIB_DREG
                b.attr_u32_be(2, NFT_FIB_RESULT_ADDRTYPE); // NFTA_FIB_RESULT
                b.attr_u32_be(3, NFTA_FIB_F_SADDR); // NFTA_FIB_FLAGS
            });
            x.cmp(NFT_REG_1, NFT_CMP_NEQ, &RTN_LOCAL.to_ne_bytes());
        }
        // limit rate N/second burst B packets → [ limit rate N/second burst B type packets ]
        Match::Limit { per_second, burst } => {
            x.expr("limit", |b| {
                b.attr_u64_be(1, *per_second); // NFTA_LIMIT_RATE
                b.attr_u64_be(2, 1); // NFTA_LIMIT_UNIT: seconds
                b.attr_u32_be(3, *burst); // NFTA_LIMIT_BURST
                b.attr_u32_be(4, 0); // NFTA_LIMIT_TYPE: NFT_LIMIT_PKTS
            });
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
        Action::Drop => x.verdict(NF_DROP, None),
        Action::Return => x.verdict(NFT_RETURN, None),
        Action::Goto(c) => x.verdict(NFT_GOTO, Some(c.suffix())),
        // log prefix "…" level warn → [ log prefix … level 4 ] (to the kernel log)
        Action::Log { prefix } => {
            const LOGLEVEL_WARNING: u32 = 4;
            x.expr("log", |b| {
                b.attr_str(2, prefix); // NFTA_LOG_PREFIX
                b.attr_u32_be(5, LOGLEVEL_WARNING); // NFTA_LOG_LEVEL
            });
        }
        Action::Continue => {}
        // ct label set N → [ immediate reg 1 bit N ] [ ct set label with reg 1 ]
        Action::SetCtLabel(bit) => {
            x.immediate_data(NFT_REG_1, &label_bits(*bit));
            x.expr("ct", |b| {
                b.attr_u32_be(2, NFT_CT_LABELS); // NFTA_CT_KEY
                b.attr_u32_be(4, NFT_REG_1); // NFTA_CT_SREG
            });
        }
        Action::Accept => x.verdict(NF_ACCEPT as i32, None),
        // meta mark set meta mark & ~MASK | MARK → [ meta load mark => reg 1 ]
        //   [ bitwise reg 1 = (reg 1 & ~MASK) ^ MARK ] [ meta set mark with reg 1 ] (host order;
        //   MARK within MASK, so the xor sets its bits)
        Action::MarkExempt => {
            let (mask, value) = (crate::plan::EXEMPT_MARK_MASK, crate::plan::EXEMPT_MARK);
            x.meta(NFT_META_MARK, NFT_REG_1);
            x.expr("bitwise", |b| {
                b.attr_u32_be(1, NFT_REG_1); // NFTA_BITWISE_SREG
                b.attr_u32_be(2, NFT_REG_1); // NFTA_BITWISE_DREG
                b.attr_u32_be(3, 4); // NFTA_BITWISE_LEN
                Exprs::data(b, 4, &(!mask).to_ne_bytes()); // NFTA_BITWISE_MASK
                Exprs::data(b, 5, &value.to_ne_bytes()); // NFTA_BITWISE_XOR
            });
            x.expr("meta", |b| {
                b.attr_u32_be(2, NFT_META_MARK); // NFTA_META_KEY
                b.attr_u32_be(3, NFT_REG_1); // NFTA_META_SREG
            });
        }
    }
}

/// Conntrack label bit `bit` as the kernel's 128-bit label bitmap lays it out: an array of
/// native words, bit N in byte N/8 on the little-endian machines natguard is built for.
fn label_bits(bit: u8) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[usize::from(bit / 8) % 16] = 1 << (bit % 8);
    b
}

/// One NEWRULE appended to `chain`, commented with the plan's fingerprint.
pub fn new_rule(
    b: &mut MsgBuf,
    t: TableFamily,
    chain: &str,
    rule: &Rule,
    names: &NetNames,
    comment: &str,
) -> u32 {
    let counted = rule.count.is_some();
    new_rule_of(
        b,
        t,
        chain,
        (&rule.matches, counted, &rule.action),
        names,
        comment,
    )
}

/// One NEWRULE appended to `chain`: its matches, a counter if asked, its action.
pub fn new_rule_of(
    b: &mut MsgBuf,
    t: TableFamily,
    chain: &str,
    (matches, counted, action): (&[Match], bool, &Action),
    names: &NetNames,
    comment: &str,
) -> u32 {
    let s = begin(b, t, NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
    b.attr_str(NFTA_RULE_TABLE, TABLE);
    b.attr_str(NFTA_RULE_CHAIN, chain);
    let list = b.nest_begin(NFTA_RULE_EXPRESSIONS);
    {
        let mut x = Exprs { b };
        for m in matches {
            lower_match(&mut x, m, names);
        }
        if counted {
            x.expr("counter", |_| {});
        }
        lower_action(&mut x, action);
    }
    b.nest_end(list);
    attr_comment(b, NFTA_RULE_USERDATA, comment);
    b.end();
    s
}
