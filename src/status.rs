//! `natguard status`: what natguard has installed on this node, in plain words.
//!
//! It reads the kernel only: the networks are the `NET-dnat` chains of natguard's table, the
//! policy is each network's rules, and the pods are the elements of `NET-pods`, whose comments
//! carry the addresses, namespace and name recorded at ADD.

use crate::error::Result;
use crate::netlink::NfSocket;
use crate::nft;
use crate::plan::{self, NetNames, SetKind};
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
pub fn report() -> Result<String> {
    let mut sock = NfSocket::open()?;
    let mut out = String::new();
    if !nft::table_exists(&mut sock)? {
        out.push_str("natguard has nothing installed on this node (no table inet natguard).\n");
        return Ok(out);
    }
    let chains = nft::chain_names(&mut sock)?;
    let mut networks: Vec<String> = chains
        .iter()
        .filter_map(|c| NetNames::network_of_chain(c).map(str::to_string))
        .collect();
    networks.sort();
    let _ = writeln!(
        out,
        "natguard: table inet {}, {} network(s)",
        plan::TABLE,
        networks.len()
    );
    let mut rules = nft::rule_comments_by_chain(&mut sock)?;
    for net in &networks {
        let names = NetNames::new(net);
        let _ = writeln!(out, "\nnetwork {net}");
        let mut any = false;
        for c in plan::ChainKind::ALL {
            let comments = rules.remove(&names.chain(c)).unwrap_or_default();
            if let Some(first) = comments.first() {
                if !any {
                    let fp = first.rsplit(' ').next().unwrap_or("");
                    let _ = writeln!(out, "  policy fingerprint {fp}");
                    any = true;
                }
            }
            let _ = writeln!(
                out,
                "  chain {} ({} hook {}): {} rule(s)",
                names.chain(c),
                c.chain_type(),
                c.hook_name(),
                comments.len()
            );
        }
        for (kind, what) in [
            (
                SetKind::MetaDst(plan::Family::V4),
                "metadata addresses (IPv4)",
            ),
            (
                SetKind::MetaDst(plan::Family::V6),
                "metadata addresses (IPv6)",
            ),
            (SetKind::MetaPorts, "metadata ports"),
        ] {
            let elems = nft::dump_set(&mut sock, &names.set(kind))?;
            let items: Vec<String> = elems
                .iter()
                .map(|e| match e.key.len() {
                    2 => u16::from_be_bytes([e.key[0], e.key[1]]).to_string(),
                    _ => e.addr().map(|a| a.to_string()).unwrap_or_default(),
                })
                .collect();
            let _ = writeln!(
                out,
                "  {what}: {}",
                if items.is_empty() {
                    "none".to_string()
                } else {
                    items.join(", ")
                }
            );
        }
        for f in plan::Family::ALL {
            let nets = nft::ranges_of(&nft::dump_set(&mut sock, &names.set(SetKind::Nets(f)))?);
            if !nets.is_empty() {
                let shown: Vec<String> = nets
                    .iter()
                    .map(|&(a, b)| plan::render_elem(&plan::Elem::Range(f, a, b)))
                    .collect();
                let _ = writeln!(
                    out,
                    "  pod networks (IPv{}, metadata fails closed here): {}",
                    f.suffix(),
                    shown.join(", ")
                );
            }
        }
        let pods = nft::dump_set(&mut sock, &names.set(SetKind::Pods))?;
        let allowed: std::collections::HashSet<std::net::IpAddr> = [
            SetKind::Allow(plan::Family::V4),
            SetKind::Allow(plan::Family::V6),
        ]
        .iter()
        .map(|k| nft::dump_set(&mut sock, &names.set(*k)))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .filter_map(|e| e.addr())
        .collect();
        let _ = writeln!(out, "  pods: {}", pods.len());
        for p in &pods {
            let c = p.comment.as_deref().unwrap_or("");
            let addrs = plan::addrs_from_comment(c);
            let shown: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
            let exempt = !addrs.is_empty() && addrs.iter().all(|a| allowed.contains(a));
            let key = p.owner().map(|o| o.hex()).unwrap_or_default();
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
