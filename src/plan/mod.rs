//! The pure plan: (configuration, node facts, pod) → the kernel objects natguard wants.
//!
//! Nothing here makes a syscall or knows the kernel's ABI. Node facts (the proxy addresses that
//! `auto` resolves to) are looked up before planning and passed in, so the same inputs always
//! give the same plan, and the plan prints as nft text ([`render`]) for golden-file tests. The
//! kernel layer lowers these objects to netlink; nothing else reads them.
//!
//! Layout in the kernel: `inet natguard`, and beside it `netdev natguard` and `arp natguard`
//! ([`TableFamily`]). Each CNI network gets its own chains and sets ([`names`]), so networks
//! with different configs never clobber each other. What a network's pods share (chains, rules,
//! the CIDR and metadata sets) is written when it differs from the plan; what a pod owns is
//! only set elements, each naming its owners ([`record`]):
//! - its addresses in `NET-redir4/6` (intercepted, keyed by host-side interface and address),
//!   `NET-masq4/6` (masquerade policy) and the node-wide guard's sets (`exempt4/6` keyed by
//!   interface and address, `resets4/6`, `denylog4/6`, the arp table's `xarp4`/`narp4`, and an
//!   exempt pod's veth in the netdev table's `xveths`, whose chains the store keeps to it), each
//!   element listing every attachment that owns it, so "ADD A (ip X), ADD B (ip X), DEL A"
//!   leaves B alone; which sets those are is read from one list ([`owned_keys`]), for ADD and
//!   DEL alike;
//! - one element in `NET-pods`, keyed by the attachment's [`OwnerKey`], whose comment records the
//!   pod's addresses: DEL and GC find everything a pod owns from that key alone.
//!
//! Per-pod work is therefore a constant number of set operations, whatever the number of pods.

mod build;
pub mod names;
pub mod record;
pub mod render;

pub use crate::ifname::IfName;
pub use build::*;
pub(crate) use names::digest;
pub use names::{fnv1a64, NetNames, OwnerKey};
pub use record::*;
pub use render::*;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TABLE: &str = "natguard";
/// The mark kube-proxy sets on traffic it wants masqueraded; such traffic is never exempted.
pub const KUBE_MASQ_MARK: u32 = 0x4000;
/// The packet mark an exempt pod's frames get where they enter the node, on its own host-side
/// veth (`netdev natguard`, one ingress chain per exempt veth, named after it): within
/// [`EXEMPT_MARK_MASK`], bit 12 set and bit 13 clear. The guard's exemption asks for exactly
/// that, so an exempt identity holds only for what crossed that veth: another pod that claims
/// the identity on the same bridge, or sends through a tunnel, arrives without it. A pod cannot
/// set it (a packet's mark is cleared when it crosses from one network namespace to another),
/// and a component that writes every bit of the mark (all set, or all clear) leaves a value
/// that is not it: the exemption is then lost, never given. Bits 12 and 13: none of
/// kube-proxy's (0x4000, 0x8000), Cilium's (0x0f00 and the upper half), Calico's (the upper
/// half), Istio's (0x539) or the AWS VPC CNI's (0x80).
pub const EXEMPT_MARK: u32 = 0x1000;
/// The bits of the mark natguard owns for [`EXEMPT_MARK`].
pub const EXEMPT_MARK_MASK: u32 = 0x3000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
    pub fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "4",
            Family::V6 => "6",
        }
    }
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];
}

/// The tables natguard writes: `inet natguard` for the IP layer, `netdev natguard`, whose
/// chains hook the exempt pods' own host-side veths ([`EXEMPT_MARK`]), and `arp natguard`,
/// which keeps claims of an exempt identity from the node's neighbour table. `bridge natguard`
/// is an earlier version's (its bridge guard), which a converge deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableFamily {
    Inet,
    Netdev,
    Arp,
    Bridge,
}

impl TableFamily {
    pub fn nft(self) -> &'static str {
        match self {
            TableFamily::Inet => "inet",
            TableFamily::Bridge => "bridge",
            TableFamily::Netdev => "netdev",
            TableFamily::Arp => "arp",
        }
    }
    /// The tables this version writes.
    pub const ALL: [TableFamily; 3] = [TableFamily::Inet, TableFamily::Netdev, TableFamily::Arp];
    /// Every table a version of natguard wrote: what a converge reads, uninstall deletes.
    pub const EVERY: [TableFamily; 4] = [
        TableFamily::Inet,
        TableFamily::Netdev,
        TableFamily::Arp,
        TableFamily::Bridge,
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainKind {
    /// nat, prerouting, dstnat - 10: the network's metadata DNAT, before any other DNAT.
    Dnat,
    /// nat, postrouting, srcnat - 10: identity SNAT for exceptions, then masquerade.
    Snat,
    /// Node-wide. filter, forward, filter - 10: sends metadata TCP (by its destination, or by
    /// where its connection was first headed) to [`ChainKind::Judge`]; everything else returns
    /// at once.
    GuardForward,
    /// Node-wide. The same at input, where the metadata address (or a relay) is local.
    GuardInput,
    /// Node-wide. filter, output, filter - 10: metadata TCP leaving the node with a source
    /// that is not the node's own (what IPVS forwards on a pod's behalf) is reset.
    GuardOutput,
    /// Node-wide regular chain: the allow-list. Metadata TCP from an exempt pod's own
    /// interface and address, to natguard's proxy, or from the node itself returns; the rest is
    /// reset.
    Judge(Family),
    /// Node-wide. arp filter, input: ARP that claims an exempt identity (the bridge or veth it
    /// arrives on, and its sender address) without having crossed the exempt pod's own veth
    /// is dropped before the node's neighbour table learns it.
    ArpGuard,
}

impl ChainKind {
    pub const ALL: [ChainKind; 8] = [
        ChainKind::Dnat,
        ChainKind::Snat,
        ChainKind::Judge(Family::V4),
        ChainKind::Judge(Family::V6),
        ChainKind::GuardForward,
        ChainKind::GuardInput,
        ChainKind::GuardOutput,
        ChainKind::ArpGuard,
    ];
    /// Chains every network shares: one guard for the node, so an allowance anywhere is an
    /// allowance everywhere, and a packet pays for one guard, not one per network.
    pub fn is_node(self) -> bool {
        !matches!(self, ChainKind::Dnat | ChainKind::Snat)
    }
    pub fn suffix(self) -> &'static str {
        match self {
            ChainKind::Dnat => "dnat",
            ChainKind::Snat => "snat",
            ChainKind::GuardForward => "guard_fwd",
            ChainKind::GuardInput => "guard_in",
            ChainKind::GuardOutput => "guard_out",
            ChainKind::Judge(Family::V4) => "judge4",
            ChainKind::Judge(Family::V6) => "judge6",
            ChainKind::ArpGuard => "guard",
        }
    }
    pub fn table(self) -> TableFamily {
        match self {
            ChainKind::ArpGuard => TableFamily::Arp,
            _ => TableFamily::Inet,
        }
    }
    /// Whether the chain hooks into the stack (a base chain) or is only jumped to.
    pub fn is_base(self) -> bool {
        !matches!(self, ChainKind::Judge(_))
    }
    pub fn chain_type(self) -> &'static str {
        match self {
            ChainKind::Dnat | ChainKind::Snat => "nat",
            _ => "filter",
        }
    }
    pub fn hook_name(self) -> &'static str {
        match self {
            ChainKind::Dnat => "prerouting",
            ChainKind::GuardInput | ChainKind::ArpGuard => "input",
            ChainKind::GuardForward => "forward",
            ChainKind::GuardOutput => "output",
            ChainKind::Snat => "postrouting",
            ChainKind::Judge(_) => "",
        }
    }
    pub fn priority_name(self) -> &'static str {
        match self {
            ChainKind::Dnat => "dstnat - 10",
            ChainKind::Snat => "srcnat - 10",
            ChainKind::GuardForward | ChainKind::GuardInput | ChainKind::GuardOutput => {
                "filter - 10"
            }
            ChainKind::ArpGuard => "filter",
            ChainKind::Judge(_) => "",
        }
    }
}

/// Chain suffixes of earlier versions' per-network guard chains: a converge deletes them, so
/// an upgraded node judges metadata traffic by the node-wide allow-list only.
pub const LEGACY_CHAIN_SUFFIXES: [(TableFamily, &str); 2] =
    [(TableFamily::Inet, "fwd"), (TableFamily::Inet, "in")];

/// Suffixes of sets that earlier versions of natguard created and this one no longer uses (or
/// uses under another name with another key type): a converge deletes them, after flushing
/// the chains whose old rules referred to them, so an upgraded node keeps only what is used.
pub const LEGACY_SET_SUFFIXES: [(TableFamily, &str); 15] = [
    (TableFamily::Inet, "nets4"),
    (TableFamily::Inet, "nets6"),
    (TableFamily::Inet, "allow4"),
    (TableFamily::Inet, "allow6"),
    (TableFamily::Inet, "exempt4"),
    (TableFamily::Inet, "exempt6"),
    (TableFamily::Inet, "cntr4"),
    (TableFamily::Inet, "cntr6"),
    // The metadata addresses and ports as two sets; now address . port pairs (`mproxy4/6`,
    // `mguard4/6`), so each endpoint has its own ports and mode.
    (TableFamily::Inet, "mdst4"),
    (TableFamily::Inet, "mdst6"),
    (TableFamily::Inet, "mports"),
    // Pod addresses redirected to the proxy, and again counted, by address alone; now
    // `iifname . saddr` (`redir4/6`, `redirc4/6`), so an address is redirected only where its
    // pod's packets enter.
    (TableFamily::Inet, "meta4"),
    (TableFamily::Inet, "meta6"),
    (TableFamily::Inet, "cntp4"),
    (TableFamily::Inet, "cntp6"),
];

/// Sets this version keeps under a new name (its key changed), each as (table, scope, earlier
/// name, name now), names without the network's prefix. Found beside its earlier name, the set
/// of the new name is stale: an earlier release has converged since this one (a downgrade), its
/// DELs could not reach a set it does not know, and an element there may name a pod that is
/// gone. A converge then deletes it before creating it again, empty, and every live pod's
/// elements are restored from its records.
pub const RENAMED_SETS: [(TableFamily, Scope, &str, &str); 6] = [
    (TableFamily::Inet, Scope::Network, "meta4", "redir4"),
    (TableFamily::Inet, Scope::Network, "meta6", "redir6"),
    (TableFamily::Inet, Scope::Network, "cntp4", "redirc4"),
    (TableFamily::Inet, Scope::Network, "cntp6", "redirc6"),
    (TableFamily::Inet, Scope::Node, "logged4", "denylog4"),
    (TableFamily::Inet, Scope::Node, "logged6", "denylog6"),
];

/// Node-wide sets of earlier versions, deleted after a converge the same way: the guard's
/// metadata addresses and ports as two sets, now the address . port pairs of `guarded4/6`;
/// the addresses whose denied attempts are logged, now `iifname . saddr` (`denylog4/6`).
pub const LEGACY_NODE_SETS: [(TableFamily, &str); 5] = [
    (TableFamily::Inet, "metadata4"),
    (TableFamily::Inet, "metadata6"),
    (TableFamily::Inet, "metaports"),
    (TableFamily::Inet, "logged4"),
    (TableFamily::Inet, "logged6"),
];

/// What a set's keys are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyShape {
    /// An address of the family.
    Addr(Family),
    /// An interface name, then an address of the family.
    IfAddr(Family),
    /// An address of the family, then a port.
    AddrPort(Family),
    Port,
    /// A 16-byte name (an interface, or an owner key in its hex form).
    Name,
}

/// A kind of set. Each variant is named after its set in the kernel (`nft list ruleset`), where
/// a per-family kind ends in `4` or `6` and a network's own sets start with `NET-`; its row in
/// [`SetKind::row`] gives the exact name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    /// `NET-redir4/6`, redirected: `iifname . saddr` of pods whose metadata traffic is
    /// intercepted (pods not in an exempt namespace): an address is redirected only on packets
    /// that enter through that pod's own host side.
    Redir(Family),
    /// `NET-masq4/6`: pod addresses under the masquerade policy.
    Masq(Family),
    /// `NET-nomasq4/6`: destinations that keep the pod's source address (interval set).
    NoMasq(Family),
    /// `NET-mproxy4/6`, metadata to proxy: the network's `proxy` endpoints (address . port),
    /// what its DNAT redirects.
    MProxy(Family),
    /// `NET-mguard4/6`, metadata to guard: the network's `proxy` and `deny` endpoints
    /// (address . port), the record from which the node-wide [`SetKind::Guarded`] is derived.
    /// `allow` endpoints are in neither.
    MGuard(Family),
    /// `NET-pods`: owner keys of the pods of this network; the comment records the pod's
    /// addresses.
    Pods,
    /// `NET-att`, attachments: owner keys again; the comment records the attachment's host side
    /// (interface, bridge port, MAC, network namespace), so DEL finds its interface elements
    /// and ADD can tell a dead attachment from a live one.
    Att,
    /// `NET-ifs`, interfaces: the host sides of the network's pods (a routed veth, or the
    /// bridge); each element counts the pods behind it. The DNAT reads it: a network redirects
    /// only what enters on its own pods' host sides.
    Ifs,
    /// `NET-redirc4/6`, redirected and counted: the elements of [`SetKind::Redir`] again, each
    /// with a counter: connections DNATed to the proxy, per pod.
    RedirCount(Family),
    /// `NET-pxy4/6`, proxy: the network's proxy target (address . port), the record from which
    /// the node-wide [`SetKind::Proxies`] is derived.
    Pxy(Family),
    /// `guarded4/6`, node-wide: every network's `proxy` and `deny` endpoints (address . port):
    /// what the guard judges, one lookup per packet.
    Guarded(Family),
    /// `NET-allowifs`: the network's `metadata.allowInterfaces`, the record from which the
    /// node-wide [`SetKind::AllowedIfs`] is derived.
    AllowIfs,
    /// `allowedifs`, node-wide: every network's `metadata.allowInterfaces`, whose metadata TCP
    /// the guard lets through (containers on a bridge no CNI network manages; empty by
    /// default).
    AllowedIfs,
    /// `proxies4/6`, node-wide: every network's proxy target, the one destination a connection
    /// first headed for a metadata address may have been sent to.
    Proxies(Family),
    /// `exempt4/6`, node-wide: `iifname . saddr` of exempt pods: an address is exempt only on
    /// packets that enter through that pod's own host-side interface.
    Exempt(Family),
    /// `resets4/6`, node-wide: `iifname . saddr` of every pod, each element with a counter:
    /// metadata attempts reset, counted by the interface the packet came in on and its source.
    Resets(Family),
    /// `denylog4/6`, node-wide: `iifname . saddr` of pods whose network logs denied attempts
    /// (`logDenied`).
    DenyLog(Family),
    /// `xarp4`, node-wide, arp table: the IPv4 exempt identities (`iifname . saddr`, the
    /// elements of `exempt4` again), whose ARP only their own veth may send.
    XArp,
    /// `narp4`, node-wide, arp table: the IPv4 identities of every attachment that is not
    /// exempt (the elements of `resets4` again): an identity also held by one of them carries
    /// no exemption, and its ARP is not judged.
    NArp,
    /// `xveths`, node-wide, netdev table: every exempt pod's own host-side veth (its bridge
    /// port, or its routed veth). Each element has an ingress chain of the same name that gives
    /// [`EXEMPT_MARK`] to what the veth's pod sends as itself ([`veth_rules`]); the store keeps
    /// the chains to the elements.
    XVeths,
    /// `xsrc4/6`, node-wide, netdev table: `iifname . address` of every exempt pod's own veth
    /// and its own addresses. A veth chain marks only frames that claim one of its own pod's
    /// addresses (IP source, ARP sender, neighbour advertisement target): another exempt pod
    /// that claims them from its own veth gets no mark for them.
    XSrc(Family),
}

/// Where a set lives: one per network (named `NET-…`), or one for the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Network,
    Node,
}

/// What a set holds, and so who writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// The network's config: a converge flushes and fills it.
    Config,
    /// Node-wide: the union of every network's set of this kind, derived at each converge
    /// from the networks' own records (never kept for a network that no longer declares it).
    Union(SetKind),
    /// Per-pod records keyed by the pod's owner key or counted per interface: written by the
    /// pods' verbs, never flushed by a converge, not owner lists.
    Record,
    /// Per-pod elements whose comments list their owners: written by the pods' verbs, never
    /// flushed by a converge; DEL removes an owner and the element with its last one.
    Owned,
}

/// One row of the set catalogue: everything natguard says of a set kind, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetRow {
    /// The name in the kernel (`nft list ruleset`), before the family digit of a per-family
    /// kind (`redir` gives `NET-redir4` and `NET-redir6`).
    pub name: &'static str,
    pub family: Option<Family>,
    pub table: TableFamily,
    pub scope: Scope,
    pub holds: Holds,
    pub key: KeyShape,
    /// Every element carries a counter (where the kernel supports it).
    pub counted: bool,
    /// An interval set (ranges of addresses).
    pub interval: bool,
}

impl SetKind {
    /// The catalogue: one row per kind. Every property of a set is read from here.
    pub const fn row(self) -> SetRow {
        use Holds::*;
        use Scope::*;
        use TableFamily::{Arp, Inet, Netdev};
        const fn r(
            name: &'static str,
            family: Option<Family>,
            table: TableFamily,
            scope: Scope,
            holds: Holds,
            key: KeyShape,
        ) -> SetRow {
            SetRow {
                name,
                family,
                table,
                scope,
                holds,
                key,
                counted: false,
                interval: false,
            }
        }
        const fn counted(mut row: SetRow) -> SetRow {
            row.counted = true;
            row
        }
        const fn interval(mut row: SetRow) -> SetRow {
            row.interval = true;
            row
        }
        let n = KeyShape::Name;
        match self {
            // The network's pods: records keyed by the owner key.
            SetKind::Pods => r("pods", None, Inet, Network, Record, n),
            SetKind::Att => r("att", None, Inet, Network, Record, n),
            SetKind::Ifs => r("ifs", None, Inet, Network, Record, n),
            // The network's pods' addresses.
            SetKind::Redir(f) => r("redir", Some(f), Inet, Network, Owned, KeyShape::IfAddr(f)),
            SetKind::Masq(f) => r("masq", Some(f), Inet, Network, Owned, KeyShape::Addr(f)),
            SetKind::RedirCount(f) => counted(r(
                "redirc",
                Some(f),
                Inet,
                Network,
                Owned,
                KeyShape::IfAddr(f),
            )),
            // The network's config.
            SetKind::NoMasq(f) => interval(r(
                "nomasq",
                Some(f),
                Inet,
                Network,
                Config,
                KeyShape::Addr(f),
            )),
            SetKind::MProxy(f) => r(
                "mproxy",
                Some(f),
                Inet,
                Network,
                Config,
                KeyShape::AddrPort(f),
            ),
            SetKind::MGuard(f) => r(
                "mguard",
                Some(f),
                Inet,
                Network,
                Config,
                KeyShape::AddrPort(f),
            ),
            SetKind::Pxy(f) => r("pxy", Some(f), Inet, Network, Config, KeyShape::AddrPort(f)),
            SetKind::AllowIfs => r("allowifs", None, Inet, Network, Config, n),
            // The node's unions of the networks' config.
            SetKind::Guarded(f) => r(
                "guarded",
                Some(f),
                Inet,
                Node,
                Union(SetKind::MGuard(f)),
                KeyShape::AddrPort(f),
            ),
            SetKind::Proxies(f) => r(
                "proxies",
                Some(f),
                Inet,
                Node,
                Union(SetKind::Pxy(f)),
                KeyShape::AddrPort(f),
            ),
            SetKind::AllowedIfs => r("allowedifs", None, Inet, Node, Union(SetKind::AllowIfs), n),
            // The node's guard: every network's pods.
            SetKind::Exempt(f) => r("exempt", Some(f), Inet, Node, Owned, KeyShape::IfAddr(f)),
            SetKind::Resets(f) => {
                counted(r("resets", Some(f), Inet, Node, Owned, KeyShape::IfAddr(f)))
            }
            SetKind::DenyLog(f) => r("denylog", Some(f), Inet, Node, Owned, KeyShape::IfAddr(f)),
            SetKind::XVeths => r("xveths", None, Netdev, Node, Owned, n),
            SetKind::XSrc(f) => r("xsrc", Some(f), Netdev, Node, Owned, KeyShape::IfAddr(f)),
            SetKind::XArp => r(
                "xarp4",
                None,
                Arp,
                Node,
                Owned,
                KeyShape::IfAddr(Family::V4),
            ),
            SetKind::NArp => r(
                "narp4",
                None,
                Arp,
                Node,
                Owned,
                KeyShape::IfAddr(Family::V4),
            ),
        }
    }
    /// The set's name in the kernel without the network prefix.
    pub fn suffix(self) -> String {
        let row = self.row();
        match row.family {
            Some(f) => format!("{}{}", row.name, f.suffix()),
            None => row.name.to_string(),
        }
    }
    /// Sets every network shares (named without a network prefix).
    pub fn is_node(self) -> bool {
        self.row().scope == Scope::Node
    }
    /// Node-wide sets whose contents are the union of every network's config (the store
    /// derives them from the networks' own records at each converge).
    pub fn is_union(self) -> bool {
        matches!(self.row().holds, Holds::Union(_))
    }
    /// The network's own record a node-wide union set is derived from.
    pub fn union_source(self) -> Option<SetKind> {
        match self.row().holds {
            Holds::Union(source) => Some(source),
            _ => None,
        }
    }
    /// Sets whose every element carries a counter (where the kernel supports it).
    pub fn is_counted(self) -> bool {
        self.row().counted
    }
    pub fn table(self) -> TableFamily {
        self.row().table
    }
    /// What a key of this set is made of: for the lowering (datatype ids, key lengths) and
    /// the rendering (nft type names) alike.
    pub fn key_shape(self) -> KeyShape {
        self.row().key
    }
    pub fn type_name(self) -> &'static str {
        match self.key_shape() {
            KeyShape::Addr(Family::V4) => "ipv4_addr",
            KeyShape::Addr(Family::V6) => "ipv6_addr",
            KeyShape::IfAddr(Family::V4) => "ifname . ipv4_addr",
            KeyShape::IfAddr(Family::V6) => "ifname . ipv6_addr",
            KeyShape::AddrPort(Family::V4) => "ipv4_addr . inet_service",
            KeyShape::AddrPort(Family::V6) => "ipv6_addr . inet_service",
            KeyShape::Port => "inet_service",
            KeyShape::Name => "ifname",
        }
    }
    pub fn is_interval(self) -> bool {
        self.row().interval
    }
    /// Sets whose elements come from pods; the shared converge never flushes them.
    pub fn is_per_pod(self) -> bool {
        matches!(self.row().holds, Holds::Record | Holds::Owned)
    }
    /// Per-pod sets whose elements name their owners in their comment.
    pub fn is_owned(self) -> bool {
        self.row().holds == Holds::Owned
    }
    pub const ALL: [SetKind; 34] = [
        SetKind::Pods,
        SetKind::Att,
        SetKind::Ifs,
        SetKind::Redir(Family::V4),
        SetKind::Redir(Family::V6),
        SetKind::Masq(Family::V4),
        SetKind::Masq(Family::V6),
        SetKind::MProxy(Family::V4),
        SetKind::MProxy(Family::V6),
        SetKind::MGuard(Family::V4),
        SetKind::MGuard(Family::V6),
        SetKind::NoMasq(Family::V4),
        SetKind::NoMasq(Family::V6),
        SetKind::RedirCount(Family::V4),
        SetKind::RedirCount(Family::V6),
        SetKind::Pxy(Family::V4),
        SetKind::Pxy(Family::V6),
        SetKind::AllowIfs,
        SetKind::Guarded(Family::V4),
        SetKind::Guarded(Family::V6),
        SetKind::Proxies(Family::V4),
        SetKind::Proxies(Family::V6),
        SetKind::AllowedIfs,
        SetKind::Exempt(Family::V4),
        SetKind::Exempt(Family::V6),
        SetKind::Resets(Family::V4),
        SetKind::Resets(Family::V6),
        SetKind::DenyLog(Family::V4),
        SetKind::DenyLog(Family::V6),
        SetKind::XVeths,
        SetKind::XSrc(Family::V4),
        SetKind::XSrc(Family::V6),
        SetKind::XArp,
        SetKind::NArp,
    ];
}

/// A frame's network protocol, as the netdev family sees it (`meta protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    Ip,
    Ip6,
    Arp,
}

impl EtherType {
    pub fn nft(self) -> &'static str {
        match self {
            EtherType::Ip => "ip",
            EtherType::Ip6 => "ip6",
            EtherType::Arp => "arp",
        }
    }
    /// The ethertype (`ETH_P_IP`, `ETH_P_IPV6`, `ETH_P_ARP`).
    pub fn value(self) -> u16 {
        match self {
            EtherType::Ip => 0x0800,
            EtherType::Ip6 => 0x86dd,
            EtherType::Arp => 0x0806,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `meta nfproto ipv4|ipv6`: every address match in an inet table needs it.
    NfProto(Family),
    /// `meta protocol ip|ip6|arp`: what every header match in the netdev table needs.
    Protocol(EtherType),
    /// `meta l4proto != tcp`
    NotTcp,
    /// `meta l4proto tcp`
    IsTcp,
    /// `meta l4proto ipv6-icmp`
    IsIcmpv6,
    SaddrIn(Family, SetKind),
    DaddrIn(Family, SetKind),
    /// `meta l4proto tcp tcp dport @set`
    TcpDportIn(SetKind),
    /// `iifname "NAME"`
    IifIs(&'static str),
    /// `meta iifname @set`
    IifIn(SetKind),
    /// `meta iifname != @set`
    IifNotIn(SetKind),
    /// `meta iifname . ip saddr @set`
    IifSaddrIn(Family, SetKind),
    /// `meta iifname . ip saddr != @set`
    IifSaddrNotIn(Family, SetKind),
    /// `meta iifname . arp saddr ip @set` (ARP for IPv4 over Ethernet, in the arp family)
    IifArpSpaIn(SetKind),
    /// `meta iifname . arp saddr ip != @set`
    IifArpSpaNotIn(SetKind),
    /// `icmpv6 type nd-neighbor-advert`
    NeighborAdvert,
    /// `meta iifname .` the advertisement's target `@set`
    IifNdTargetIn(SetKind),
    /// `meta iifname .` the advertisement's target `!= @set`
    IifNdTargetNotIn(SetKind),
    /// `meta mark & M == M`
    MarkHas(u32),
    /// `meta mark & MASK == VALUE`
    MarkIs {
        mask: u32,
        value: u32,
    },
    /// `meta mark & MASK != VALUE`
    MarkIsNot {
        mask: u32,
        value: u32,
    },
    /// `limit rate N/second burst B packets`: matches while under the rate.
    Limit {
        per_second: u64,
        burst: u32,
    },
    /// `ct label N`: the connection carries conntrack label bit N (see [`Action::SetCtLabel`]).
    CtLabel(u8),
    /// `ct direction original`: the packet travels the way its connection was opened.
    CtDirOriginal,
    /// `ct status dnat`: the connection's destination was rewritten by a DNAT.
    CtStatusDnat,
    /// `ct original ip daddr @set`: where the connection was first headed, before any NAT.
    CtOrigDaddrIn(Family, SetKind),
    /// `meta l4proto tcp ct original ip daddr . ct original proto-dst @set`: where the
    /// connection was first headed, address and port, in one lookup.
    CtOrigToIn(Family, SetKind),
    /// `ip daddr . tcp dport @set`
    ToIn(Family, SetKind),
    /// `fib saddr type != local`: the source is not one of the node's own addresses.
    SaddrNotLocal,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    DnatTo(IpAddr, u16),
    /// `snat ip to ip saddr`: an identity SNAT. A plain `accept` in an earlier nat chain does
    /// not stop later nat chains from masquerading; a NAT binding does.
    SnatToSaddr(Family),
    Masquerade {
        random_fully: bool,
    },
    /// `reject with tcp reset`; a segment that cannot be answered with a reset (one carrying
    /// RST itself) is dropped.
    RejectTcpReset,
    Drop,
    Return,
    /// `goto CHAIN`: the verdict of the chain gone to is the verdict of this one.
    Goto(ChainKind),
    /// `log prefix "…"`, to the kernel log; evaluation goes on.
    Log {
        prefix: &'static str,
    },
    /// No verdict: the rule only counts (in the elements its lookups match) and goes on.
    Continue,
    /// `ct label set N`: marks the packet's connection with conntrack label bit N; no verdict.
    SetCtLabel(u8),
    /// `accept`: this chain is done with the packet (other chains of the hook still see it).
    Accept,
    /// `meta mark set meta mark & ~EXEMPT_MARK_MASK | EXEMPT_MARK` ([`EXEMPT_MARK`]); no verdict.
    MarkExempt,
}

/// What a rule's counter measures; the rule's comment carries it, so `status` reads counters
/// without knowing the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Count {
    /// Connections DNATed to the proxy (a nat rule sees a connection's first packet only).
    Proxied(Family),
    /// Packets to a metadata address reset by the fail-closed rules: attempts.
    Reset(Family),
    /// Connections masqueraded.
    Masqueraded(Family),
    /// Connections that kept the pod's source (the masquerade exceptions).
    KeptSource(Family),
    /// Denied attempts written to the kernel log (rate-limited).
    Logged(Family),
}

impl Count {
    pub fn tag(self) -> String {
        let (what, f) = match self {
            Count::Proxied(f) => ("proxied", f),
            Count::Reset(f) => ("reset", f),
            Count::Masqueraded(f) => ("masqueraded", f),
            Count::KeptSource(f) => ("kept", f),
            Count::Logged(f) => ("logged", f),
        };
        format!("{what}{}", f.suffix())
    }
    pub fn parse(tag: &str) -> Option<Count> {
        let (what, f) = tag.split_at_checked(tag.len().checked_sub(1)?)?;
        let f = match f {
            "4" => Family::V4,
            "6" => Family::V6,
            _ => return None,
        };
        Some(match what {
            "proxied" => Count::Proxied(f),
            "reset" => Count::Reset(f),
            "masqueraded" => Count::Masqueraded(f),
            "kept" => Count::KeptSource(f),
            "logged" => Count::Logged(f),
            _ => return None,
        })
    }
}

/// The prefix of denied attempts in the kernel log (`metadata.logDenied`).
pub const LOG_PREFIX: &str = "natguard denied ";
/// At most this many denied attempts are logged per second (per rule), bursts up to
/// [`LOG_BURST`].
pub const LOG_PER_SECOND: u64 = 5;
pub const LOG_BURST: u32 = 20;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub chain: ChainKind,
    pub matches: Vec<Match>,
    pub action: Action,
    /// A counter on the rule, and what it measures.
    pub count: Option<Count>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Elem {
    Addr(IpAddr),
    /// An interface name.
    Iface(IfName),
    /// An address and a port (a concatenation).
    AddrPort(IpAddr, u16),
    /// An inclusive address range of one family.
    Range(Family, u128, u128),
    Port(u16),
}

impl Elem {
    /// The inclusive range an interval-set element covers.
    pub fn range(&self) -> Option<(u128, u128)> {
        match self {
            Elem::Addr(a) => {
                let v = crate::addr::ip_to_u128(*a);
                Some((v, v))
            }
            Elem::Range(_, s, e) => Some((*s, *e)),
            Elem::Port(_) | Elem::AddrPort(..) | Elem::Iface(_) => None,
        }
    }
    /// The key of a plain-set element.
    pub fn key(&self) -> Option<Key> {
        match self {
            Elem::Addr(a) => Some(Key::Addr(*a)),
            Elem::Port(p) => Some(Key::Port(*p)),
            Elem::AddrPort(a, p) => Some(Key::AddrPort(*a, *p)),
            Elem::Iface(i) => Some(Key::Iface(*i)),
            Elem::Range(..) => None,
        }
    }
}

/// The key of one element of a set, as the plan names it; the kernel layer lays it out in bytes
/// and reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// An address (the address sets).
    Addr(IpAddr),
    /// A port (a port set; none is in use, the metadata ports are paired with addresses).
    Port(u16),
    /// An attachment (the `NET-pods` and `NET-att` sets).
    Owner(OwnerKey),
    /// An interface (`NET-ifs`, `ports`, `allowedifs`).
    Iface(IfName),
    /// An interface and an address (`exempt4/6`, `resets4/6`, `xarp4`).
    IfAddr(IfName, IpAddr),
    /// An address and a port (`NET-pxy4/6`, `NET-mproxy4/6`, `NET-mguard4/6`, `guarded4/6`,
    /// `proxies4/6`).
    AddrPort(IpAddr, u16),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetSpec {
    pub kind: SetKind,
    pub name: String,
    /// Contents the converge writes (flush, then fill); `None` for per-pod sets.
    pub elements: Option<Vec<Elem>>,
}

/// Node facts looked up before planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeFacts {
    pub proxy_v4: Option<Ipv4Addr>,
    pub proxy_v6: Option<Ipv6Addr>,
}

/// Everything a network's pods share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPlan {
    pub names: NetNames,
    pub sets: Vec<SetSpec>,
    pub rules: Vec<Rule>,
    /// A hash of the network's own part of the plan, written into its rules' comments; CHECK
    /// compares it.
    pub fingerprint: String,
    /// A hash of the node-wide guard's rules, written into their comments. The guard's rules
    /// are the same for every network, so networks converging one after another agree on it.
    pub node_fingerprint: String,
    pub warnings: Vec<String>,
}

/// The network a natguard rule comment (`natguard NETWORK FINGERPRINT [COUNT]`) names.
pub fn network_of_rule_comment(comment: &str) -> Option<&str> {
    let mut parts = comment.split(' ');
    (parts.next() == Some("natguard"))
        .then(|| parts.next())
        .flatten()
}

/// The fingerprint in a natguard rule comment.
pub fn fingerprint_of_rule_comment(comment: &str) -> Option<&str> {
    let mut parts = comment.split(' ');
    (parts.next() == Some("natguard"))
        .then(|| parts.nth(1))
        .flatten()
}

/// What the counter of a rule with this comment measures.
pub fn count_of_rule_comment(comment: &str) -> Option<Count> {
    comment.split(' ').nth(3).and_then(Count::parse)
}

/// What the node-wide guard's rule comments name in place of a network.
pub const NODE: &str = "~node";

impl SharedPlan {
    /// The part of every rule's comment that CHECK compares: the network and the fingerprint,
    /// or [`NODE`] and the guard's fingerprint for the node-wide chains.
    pub fn rule_comment(&self) -> String {
        format!("natguard {} {}", self.names.network, self.fingerprint)
    }
    /// [`SharedPlan::rule_comment`] of a chain's rules.
    pub fn chain_comment(&self, c: ChainKind) -> String {
        if c.is_node() {
            format!("natguard {NODE} {}", self.node_fingerprint)
        } else {
            self.rule_comment()
        }
    }
    /// A rule's whole comment: [`SharedPlan::chain_comment`], then what its counter measures.
    pub fn comment_of(&self, r: &Rule) -> String {
        match r.count {
            Some(c) => format!("{} {}", self.chain_comment(r.chain), c.tag()),
            None => self.chain_comment(r.chain),
        }
    }
    pub fn rules_of(&self, c: ChainKind) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(move |r| r.chain == c)
    }
    /// Whether this is the node-wide guard alone ([`plan_node_guard`]), with no network's own
    /// chains and sets.
    pub fn is_node_only(&self) -> bool {
        self.names.network == NODE
    }
    /// The chains this plan writes: every kind, or only the node-wide ones for the guard alone.
    pub fn chains(&self) -> impl Iterator<Item = ChainKind> {
        let node_only = self.is_node_only();
        ChainKind::ALL
            .into_iter()
            .filter(move |c| !node_only || c.is_node())
    }
}

/// Where an attachment's packets enter the node, looked up before planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSide {
    /// The interface the IP layer sees the pod's packets arrive on: the pod's routed veth, or
    /// the bridge its veth is a port of.
    pub iface: IfName,
    /// The pod's bridge port, when `iface` is a bridge.
    pub port: Option<IfName>,
    /// The pod's own MAC, when known: on a bridge, an exempt pod's MAC is pinned to its port (a
    /// static, sticky forwarding entry).
    pub mac: Option<[u8; 6]>,
    /// The bridge `port` belongs to, where `iface` is another IP device of it (the bridge
    /// plugin's `vlan` gateway `BRIDGE.VLAN`); `None` where `iface` is the bridge itself.
    pub bridge: Option<IfName>,
}

impl HostSide {
    /// The bridge the pod's port belongs to; `None` for a routed veth.
    pub fn bridge(&self) -> Option<IfName> {
        self.port.map(|_| self.bridge.unwrap_or(self.iface))
    }
}

/// What one attachment owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub owner: OwnerKey,
    /// Comment of the `NET-pods` element: addresses first (DEL parses them), then who it is.
    pub comment: String,
    /// Comment of the `NET-att` element: the host side and the network namespace.
    pub attach: String,
    pub addrs: Vec<IpAddr>,
    pub host: Option<HostSide>,
    /// (set, key) pairs that must exist, owned by this pod.
    pub present: Vec<(SetKind, Key)>,
    /// (set, key) pairs this pod must not own (e.g. an exempt pod's address in `meta4`).
    pub absent: Vec<(SetKind, Key)>,
}

/// Who a pod is, from the CNI invocation, and where it is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub namespace: Option<&'a str>,
    pub pod_name: Option<&'a str>,
    /// `CNI_NETNS`: lets a later ADD tell whether this attachment still exists.
    pub netns: &'a str,
    pub host: Option<HostSide>,
    /// The pod's `natguard.io/` annotations (runtimeConfig), which can tighten its policy.
    pub annotations: crate::policy::Annotations,
}

#[cfg(test)]
mod tests;
