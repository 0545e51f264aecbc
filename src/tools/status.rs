//! `natguard status`: what natguard has installed on this node, in plain words.
//!
//! It reads the kernel only: the networks are the `NET-dnat` chains of natguard's table, the
//! policy is each network's rules, and the pods are the elements of `NET-pods`, whose comments
//! carry the addresses, namespace and name recorded at ADD.

use crate::error::Result;
use crate::plan;
use crate::store;
use std::fmt::Write as _;

pub fn cli(args: &[String]) -> i32 {
    if let Some(a) = args.first() {
        eprintln!("natguard status: unexpected argument {a:?}");
        return 2;
    }
    match report() {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("natguard status: {e}");
            1
        }
    }
}

/// The report as text.
pub(crate) fn report() -> Result<String> {
    let mut store = store::open()?;
    let mut out = String::new();
    let Some(networks) = store.networks()? else {
        out.push_str("natguard has nothing installed on this node (no table inet natguard).\n");
        return Ok(out);
    };
    let _ = writeln!(
        out,
        "natguard: table inet {}, {} network(s)",
        plan::TABLE,
        networks.len()
    );
    for net in &networks {
        let st = store.network_state(net)?;
        let _ = writeln!(out, "\nnetwork {net}");
        if let Some(first) = st.chains.iter().find_map(|(_, _, c)| c.first()) {
            let fp = plan::fingerprint_of_rule_comment(&first.comment).unwrap_or("");
            let _ = writeln!(out, "  policy fingerprint {fp}");
        }
        for (c, name, comments) in &st.chains {
            let _ = writeln!(
                out,
                "  chain {name} ({} hook {}): {} rule(s)",
                c.chain_type(),
                c.hook_name(),
                comments.len()
            );
        }
        let list = |items: Vec<String>| {
            if items.is_empty() {
                "none".to_string()
            } else {
                items.join(", ")
            }
        };
        for (v4, what) in [
            (true, "metadata addresses (IPv4)"),
            (false, "metadata addresses (IPv6)"),
        ] {
            let items = st
                .meta_dst
                .iter()
                .filter(|a| a.is_ipv4() == v4)
                .map(|a| a.to_string())
                .collect();
            let _ = writeln!(out, "  {what}: {}", list(items));
        }
        let ports = st.meta_ports.iter().map(|p| p.to_string()).collect();
        let _ = writeln!(out, "  metadata ports: {}", list(ports));
        let ifaces: Vec<String> = st
            .ifaces
            .iter()
            .map(|(i, n)| format!("{i} ({n} pod(s))"))
            .collect();
        let _ = writeln!(
            out,
            "  pod interfaces (metadata fails closed from these): {}",
            list(ifaces)
        );
        let _ = writeln!(out, "  pods: {}", st.pods.len());
        for p in &st.pods {
            let c = p.comment.as_str();
            let addrs = plan::addrs_from_comment(c);
            let shown: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
            let exempt = p.exempt;
            let key = p.owner.hex();
            let _ = writeln!(
                out,
                "    {} {} [{}]{} key={key}",
                plan::who_from_comment(c),
                shown.join(", "),
                c.split(' ').skip(2).collect::<Vec<_>>().join(" "),
                if exempt { " metadata-exempt" } else { "" }
            );
        }
    }
    Ok(out)
}
