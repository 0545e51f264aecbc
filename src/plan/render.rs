//! The plan as nft text: golden files, `natguard status` and error messages print it in the
//! shape `nft list table` does, so a reader can compare it with the kernel's own listing.

use super::*;
use std::fmt::Write as _;

fn render_match(m: &Match, names: &NetNames) -> String {
    match m {
        // nft prints the family dependency implicitly, as part of the address match.
        Match::NfProto(_) => String::new(),
        Match::SaddrIn(f, s) => format!("{} saddr @{}", f.nft(), names.set(*s)),
        Match::SaddrNotIn(f, s) => format!("{} saddr != @{}", f.nft(), names.set(*s)),
        Match::DaddrIn(f, s) => format!("{} daddr @{}", f.nft(), names.set(*s)),
        Match::TcpDportIn(s) => format!("tcp dport @{}", names.set(*s)),
        Match::MarkHas(m) => format!("meta mark & 0x{m:08x} == 0x{m:08x}"),
        Match::NotDnatted => "ct status ! dnat".to_string(),
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
        Action::Return => "return".into(),
    }
}

pub fn render_rule(r: &Rule, names: &NetNames) -> String {
    let mut parts: Vec<String> = r
        .matches
        .iter()
        .map(|m| render_match(m, names))
        .filter(|s| !s.is_empty())
        .collect();
    parts.push(render_action(&r.action));
    parts.join(" ")
}

pub fn render_elem(e: &Elem) -> String {
    match e {
        Elem::Addr(a) => a.to_string(),
        Elem::Port(p) => p.to_string(),
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

pub(crate) fn render_shared_body(p: &SharedPlan) -> String {
    let mut out = String::new();
    for s in &p.sets {
        let _ = write!(
            out,
            "\tset {} {{\n\t\ttype {}\n",
            s.name,
            s.kind.type_name()
        );
        if s.kind.is_interval() {
            out.push_str("\t\tflags interval\n");
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
    for c in ChainKind::ALL {
        let _ = write!(
            out,
            "\tchain {} {{\n\t\ttype {} hook {} priority {}; policy accept;\n",
            p.names.chain(c),
            c.chain_type(),
            c.hook_name(),
            c.priority_name()
        );
        for r in p.rules_of(c) {
            let _ = writeln!(out, "\t\t{}", render_rule(r, &p.names));
        }
        out.push_str("\t}\n");
    }
    out
}

/// The shared plan as nft text, in the shape `nft list table` prints.
pub fn render_shared(p: &SharedPlan) -> String {
    let mut out = format!(
        "table inet {TABLE} {{\n\t# network {} fingerprint {}\n",
        p.names.network, p.fingerprint
    );
    for w in &p.warnings {
        let _ = writeln!(out, "\t# warning: {w}");
    }
    out.push_str(&render_shared_body(p));
    out.push_str("}\n");
    out
}

pub fn render_pod(p: &PodPlan, names: &NetNames) -> String {
    let mut out = format!(
        "add element inet {TABLE} {} {{ \"{}\" comment \"{}\" }}\n",
        names.set(SetKind::Pods),
        p.owner.hex(),
        p.comment
    );
    for (k, a) in &p.present {
        let _ = writeln!(
            out,
            "add element inet {TABLE} {} {{ {a} comment \"{}\" }}",
            names.set(*k),
            p.owner.hex()
        );
    }
    for (k, a) in &p.absent {
        let _ = writeln!(out, "# not owned: {} {a}", names.set(*k));
    }
    for c in &p.nets {
        let _ = writeln!(
            out,
            "add element inet {TABLE} {} {{ {c} }}",
            names.set(SetKind::Nets(Family::of(&c.addr)))
        );
    }
    out
}
