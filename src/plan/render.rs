//! The plan as nft text: golden files, `natguard status` and error messages print it in the
//! shape `nft list table` does, so a reader can compare it with the kernel's own listing.

use super::*;
use std::fmt::Write as _;

fn render_match(m: &Match, names: &NetNames) -> String {
    let set = |k: &SetKind| names.set(*k);
    match m {
        // nft prints the family dependency implicitly, as part of the address match.
        Match::NfProto(_) => String::new(),
        Match::Protocol(t) => format!("meta protocol {}", t.nft()),
        Match::NotTcp => "meta l4proto != tcp".into(),
        Match::IsTcp => "meta l4proto tcp".into(),
        Match::IsIcmpv6 => "meta l4proto ipv6-icmp".into(),
        Match::IifIs(name) => format!("iifname \"{name}\""),
        Match::IifIn(s) => format!("iifname @{}", set(s)),
        Match::IifNotIn(s) => format!("iifname != @{}", set(s)),
        Match::IifSaddrIn(f, s) => format!("iifname . {} saddr @{}", f.nft(), set(s)),
        Match::CtDirOriginal => "ct direction original".into(),
        Match::CtLabel(bit) => format!("ct label {bit}"),
        Match::CtStatusDnat => "ct status dnat".into(),
        Match::ToIn(f, s) => format!("{} daddr . tcp dport @{}", f.nft(), set(s)),
        Match::SaddrNotLocal => "fib saddr type != local".into(),
        Match::SaddrIn(f, s) => format!("{} saddr @{}", f.nft(), set(s)),
        Match::DaddrIn(f, s) => format!("{} daddr @{}", f.nft(), set(s)),
        Match::TcpDportIn(s) => format!("tcp dport @{}", set(s)),
        Match::IifSaddrNotIn(f, s) => format!("iifname . {} saddr != @{}", f.nft(), set(s)),
        Match::IifArpSpaIn(s) => format!("iifname . arp saddr ip @{}", set(s)),
        Match::IifArpSpaNotIn(s) => format!("iifname . arp saddr ip != @{}", set(s)),
        Match::NeighborAdvert => "icmpv6 type nd-neighbor-advert".into(),
        Match::IifNdTargetIn(s) => format!("iifname . @th,64,128 @{}", set(s)),
        Match::IifNdTargetNotIn(s) => format!("iifname . @th,64,128 != @{}", set(s)),
        Match::MarkHas(m) => format!("meta mark & 0x{m:08x} == 0x{m:08x}"),
        Match::MarkIs { mask, value } => format!("meta mark & 0x{mask:08x} == 0x{value:08x}"),
        Match::MarkIsNot { mask, value } => format!("meta mark & 0x{mask:08x} != 0x{value:08x}"),
        Match::Limit { per_second, burst } => {
            format!("limit rate {per_second}/second burst {burst} packets")
        }
        Match::CtOrigDaddrIn(f, s) => format!("ct original {} daddr @{}", f.nft(), set(s)),
        Match::CtOrigToIn(f, s) => format!(
            "meta l4proto tcp ct original {} daddr . ct original proto-dst @{}",
            f.nft(),
            set(s)
        ),
    }
}

fn render_action(a: &Action) -> String {
    match a {
        Action::DnatTo(IpAddr::V4(ip), port) => format!("dnat ip to {ip}:{port}"),
        Action::DnatTo(IpAddr::V6(ip), port) => format!("dnat ip6 to [{ip}]:{port}"),
        Action::SnatToSaddr(f) => format!("snat {0} to {0} saddr", f.nft()),
        Action::Masquerade { random_fully } => {
            if *random_fully {
                "masquerade fully-random".into()
            } else {
                "masquerade".into()
            }
        }
        Action::RejectTcpReset => "reject with tcp reset".into(),
        Action::Drop => "drop".into(),
        Action::Return => "return".into(),
        Action::Goto(c) => format!("goto {}", c.suffix()),
        Action::Log { prefix } => format!("log prefix \"{prefix}\" level warn"),
        Action::Continue => String::new(),
        Action::SetCtLabel(bit) => format!("ct label set {bit}"),
        Action::Accept => "accept".into(),
        Action::MarkExempt => format!(
            "meta mark set meta mark & {:#010x} | {EXEMPT_MARK:#010x}",
            !EXEMPT_MARK_MASK
        ),
    }
}

pub fn render_rule(r: &Rule, names: &NetNames) -> String {
    let mut parts: Vec<String> = r
        .matches
        .iter()
        .map(|m| render_match(m, names))
        .filter(|s| !s.is_empty())
        .collect();
    if r.count.is_some() {
        parts.push("counter".into());
    }
    parts.push(render_action(&r.action));
    parts.retain(|p| !p.is_empty());
    parts.join(" ")
}

pub fn render_elem(e: &Elem) -> String {
    match e {
        Elem::Addr(a) => a.to_string(),
        Elem::AddrPort(a, p) => format!("{a} . {p}"),
        Elem::Port(p) => p.to_string(),
        Elem::Iface(i) => format!("\"{i}\""),
        Elem::Range(f, s, e) => {
            // Print as a prefix when the range is one.
            let span = e - s;
            let bits = if *f == Family::V4 { 32 } else { 128 };
            if span == u128::MAX {
                format!("{}/0", u128_to_ip(*f, *s))
            } else if span.wrapping_add(1).is_power_of_two() && s & span == 0 {
                let host = (span + 1).trailing_zeros();
                format!("{}/{}", u128_to_ip(*f, *s), bits - host)
            } else {
                format!("{}-{}", u128_to_ip(*f, *s), u128_to_ip(*f, *e))
            }
        }
    }
}

/// The rules, one per line, in order: what the node-wide guard's fingerprint covers.
pub(crate) fn render_rules(rules: &[Rule], names: &NetNames) -> String {
    rules
        .iter()
        .map(|r| format!("{:?} {}\n", r.chain, render_rule(r, names)))
        .collect()
}

fn render_set(out: &mut String, s: &SetSpec) {
    let _ = write!(
        out,
        "\tset {} {{\n\t\ttype {}\n",
        s.name,
        s.kind.type_name()
    );
    if s.kind.is_interval() {
        out.push_str("\t\tflags interval\n");
    }
    if s.kind.is_counted() {
        out.push_str("\t\tcounter\n");
    }
    match &s.elements {
        Some(e) if !e.is_empty() => {
            let items: Vec<String> = e.iter().map(render_elem).collect();
            let _ = writeln!(out, "\t\telements = {{ {} }}", items.join(", "));
        }
        Some(_) => {}
        None => out.push_str("\t\t# per-pod elements\n"),
    }
    out.push_str("\t}\n");
}

fn render_chain(out: &mut String, p: &SharedPlan, c: ChainKind) {
    let _ = writeln!(out, "\tchain {} {{", p.names.chain(c));
    if c.is_base() {
        let _ = writeln!(
            out,
            "\t\ttype {} hook {} priority {}; policy accept;",
            c.chain_type(),
            c.hook_name(),
            c.priority_name()
        );
    }
    for r in p.rules_of(c) {
        let _ = writeln!(out, "\t\t{}", render_rule(r, &p.names));
    }
    out.push_str("\t}\n");
}

/// How much of the node-wide objects a rendering shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePart {
    /// None: what the network's fingerprint covers.
    Without,
    /// The union sets with this network's part, not the guard's chains (a second network of
    /// one node: its text adds its part, and the chains are the first network's).
    SetsOnly,
    /// The node-wide sets and the guard's chains.
    All,
}

/// The sets and chains of one of the tables, as nft text: the network's own objects first,
/// then the node-wide ones `node` asks for.
fn render_table_body(p: &SharedPlan, table: TableFamily, node: NodePart) -> String {
    let mut out = String::new();
    for s in p.sets.iter().filter(|s| s.kind.table() == table) {
        if !s.kind.is_node() {
            render_set(&mut out, s);
        }
    }
    for c in ChainKind::ALL.into_iter().filter(|c| c.table() == table) {
        if !c.is_node() {
            render_chain(&mut out, p, c);
        }
    }
    if node != NodePart::Without {
        let _ = writeln!(
            out,
            "\t# node-wide, shared by every network (guard fingerprint {}; union sets show this network's part)",
            p.node_fingerprint
        );
        for s in p.sets.iter().filter(|s| s.kind.table() == table) {
            if s.kind.is_node() {
                render_set(&mut out, s);
            }
        }
        for c in ChainKind::ALL.into_iter().filter(|c| c.table() == table) {
            if c.is_node() && node == NodePart::All {
                render_chain(&mut out, p, c);
            }
        }
    }
    out
}

/// Everything the network's fingerprint covers: its own sets, chains and rules in both
/// tables (the node-wide guard has a fingerprint of its own).
pub(crate) fn render_network_body(p: &SharedPlan) -> String {
    TableFamily::ALL
        .iter()
        .map(|&t| render_table_body(p, t, NodePart::Without))
        .collect()
}

/// The shared plan as nft text, in the shape `nft list table` prints, one block per table.
pub fn render_shared(p: &SharedPlan) -> String {
    render_shared_with(p, NodePart::All)
}

/// [`render_shared`] with only as much of the node-wide objects as `node` says.
pub fn render_shared_with(p: &SharedPlan, node: NodePart) -> String {
    let mut out = String::new();
    for t in TableFamily::ALL {
        let _ = write!(
            out,
            "table {} {TABLE} {{\n\t# network {} fingerprint {}\n",
            t.nft(),
            p.names.network,
            p.fingerprint
        );
        if t == TableFamily::Inet {
            for w in &p.warnings {
                let _ = writeln!(out, "\t# warning: {w}");
            }
        }
        out.push_str(&render_table_body(p, t, node));
        out.push_str("}\n");
    }
    out
}

/// A set key as nft prints it.
pub fn render_key(k: &Key) -> String {
    match k {
        Key::Addr(a) => a.to_string(),
        Key::Port(p) => p.to_string(),
        Key::Owner(o) => format!("\"{}\"", o.hex()),
        Key::Iface(i) => format!("\"{i}\""),
        Key::IfAddr(i, a) => format!("\"{i}\" . {a}"),
        Key::AddrPort(a, p) => format!("{a} . {p}"),
    }
}

/// A MAC as nft prints it.
pub fn render_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The ingress chain of an exempt pod's own veth, as `nft -f` reads it.
pub fn render_veth_chain(veth: &str) -> String {
    let mut out = format!(
        "add chain netdev {TABLE} {veth} {{ type filter hook ingress device \"{veth}\" priority 500; policy accept; }}\n"
    );
    for r in veth_rules() {
        let _ = writeln!(
            out,
            "add rule netdev {TABLE} {veth} {} comment \"{}\"",
            render_veth_rule(&r),
            r.comment
        );
    }
    out
}

/// One rule of a veth chain as nft prints it (without its comment).
pub fn render_veth_rule(r: &VethRule) -> String {
    let names = NetNames::new(NODE);
    let mut parts: Vec<String> = r.matches.iter().map(|m| render_match(m, &names)).collect();
    parts.push(render_action(&r.action));
    parts.join(" ")
}

pub fn render_pod(p: &PodPlan, names: &NetNames) -> String {
    let owner = p.owner.hex();
    let mut out = String::new();
    for (kind, comment) in [(SetKind::Pods, &p.comment), (SetKind::Att, &p.attach)] {
        let _ = writeln!(
            out,
            "add element inet {TABLE} {} {{ \"{owner}\" comment \"{comment}\" }}",
            names.set(kind)
        );
    }
    if let Some(h) = &p.host {
        let _ = writeln!(
            out,
            "# counted: {} {{ \"{}\" }}",
            names.set(SetKind::Ifs),
            h.iface
        );
    }
    for (k, key) in &p.present {
        let _ = writeln!(
            out,
            "add element {} {TABLE} {} {{ {} comment \"{owner}\" }}",
            k.table().nft(),
            names.set(*k),
            render_key(key)
        );
        if let (SetKind::XVeths, Key::Iface(veth)) = (k, key) {
            out.push_str(&render_veth_chain(veth.as_str()));
        }
    }
    for (k, key) in &p.absent {
        let _ = writeln!(
            out,
            "# not owned: {} {} {}",
            k.table().nft(),
            names.set(*k),
            render_key(key)
        );
    }
    out
}
