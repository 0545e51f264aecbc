//! Building the plan: the rules and sets a network shares, and what one attachment owns.

use super::*;
use crate::config::{Cidr, Config, MetadataMode};
use std::net::IpAddr;

pub fn merge_ranges(mut r: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    r.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The CIDRs whose destinations keep the pod's source address, per family, merged.
pub fn non_masquerade_ranges(cfg: &Config, f: Family) -> Vec<(u128, u128)> {
    let m = &cfg.masquerade;
    let mut cidrs: Vec<Cidr> = m
        .non_masquerade_cidrs
        .iter()
        .filter(|c| Family::of(&c.addr) == f)
        .copied()
        .collect();
    match f {
        Family::V4 if !m.masq_link_local => cidrs.push(Cidr::parse("169.254.0.0/16").unwrap()),
        Family::V6 if !m.masq_link_local_ipv6 => cidrs.push(Cidr::parse("fe80::/10").unwrap()),
        _ => {}
    }
    merge_ranges(cidrs.iter().map(Cidr::range).collect())
}

/// Plans the objects a network shares, from its config and the node facts.
pub fn plan_shared(network: &str, cfg: &Config, node: &NodeFacts) -> SharedPlan {
    let names = NetNames::new(network);
    let md = &cfg.metadata;
    let mut warnings = Vec::new();
    let mut rules = Vec::new();

    let meta_on = md.mode != MetadataMode::Off;
    for f in Family::ALL {
        let has_dst = md.addresses.iter().any(|a| Family::of(a) == f);
        if !meta_on || !has_dst {
            continue;
        }
        let to_metadata = [
            Match::DaddrIn(f, SetKind::MetaDst(f)),
            Match::TcpDportIn(SetKind::MetaPorts),
        ];
        // The destination first: most packets are not for a metadata address and stop there.
        let from = |m: Vec<Match>| {
            let mut v = vec![Match::NfProto(f)];
            v.extend(to_metadata.iter().cloned());
            v.extend(m);
            v
        };
        if md.mode == MetadataMode::Proxy {
            let proxy: Option<IpAddr> = match f {
                Family::V4 => node.proxy_v4.map(IpAddr::V4),
                Family::V6 => node.proxy_v6.map(IpAddr::V6),
            };
            match proxy {
                Some(p) => {
                    // Per pod: the lookup in the counted set bumps the source's element.
                    rules.push(Rule {
                        chain: ChainKind::Dnat,
                        matches: from(vec![Match::SaddrIn(f, SetKind::CountProxied(f))]),
                        action: Action::Continue,
                        count: None,
                    });
                    rules.push(Rule {
                        chain: ChainKind::Dnat,
                        matches: from(vec![Match::SaddrIn(f, SetKind::Meta(f))]),
                        action: Action::DnatTo(p, md.proxy_port),
                        count: Some(Count::Proxied(f)),
                    });
                }
                None => warnings.push(format!(
                    "network {network}: no IPv{} proxy address (proxyIPv{} is \"auto\" and the node has no route to pick one from); IPv{} metadata traffic is denied",
                    f.suffix(), f.suffix(), f.suffix()
                )),
            }
        }
        // Fail closed, judged where the packet is about to be delivered, after every NAT of
        // every component: whatever still goes to a metadata address and port (natguard's own
        // DNAT has sent what it intercepts to the proxy) is reset when it comes from one of the
        // network's pod interfaces, unless that exact interface and source belong to an exempt
        // pod; and when its source is an intercepted address, wherever it comes from. No
        // conntrack state is consulted, so untracked, invalid and pre-existing flows and
        // segments with any TCP flags are judged the same. An address that also has an
        // intercepted owner is in `meta`, so it is never exempt: the strictest owner wins.
        // Each reset is preceded by a rule that counts it per pod and, with `logDenied`, by a
        // rate-limited log rule.
        //
        // The same is judged on where the connection was first headed, before any NAT: another
        // component's DNAT or REDIRECT of a metadata connection to anything but natguard's
        // proxy (a relay that would fetch from the real API for the pod) is reset too.
        let proxy_target: Option<(IpAddr, u16)> = (md.mode == MetadataMode::Proxy)
            .then(|| match f {
                Family::V4 => node.proxy_v4.map(IpAddr::V4),
                Family::V6 => node.proxy_v6.map(IpAddr::V6),
            })
            .flatten()
            .map(|p| (p, md.proxy_port));
        let mut first_headed = vec![
            Match::NfProto(f),
            Match::CtOrigDaddrIn(f, SetKind::MetaDst(f)),
            Match::CtOrigTcpDportIn(SetKind::MetaPorts),
        ];
        if proxy_target.is_some() {
            first_headed.push(Match::NotToIn(f, SetKind::ProxyTarget(f)));
        }
        let sources = [
            vec![
                Match::IifIn(SetKind::Ifaces),
                Match::IifSaddrNotIn(f, SetKind::Allow(f)),
            ],
            vec![Match::SaddrIn(f, SetKind::Meta(f))],
        ];
        for chain in [ChainKind::Forward, ChainKind::Input] {
            for dest in [from(Vec::new()), first_headed.clone()] {
                for src in &sources {
                    let mut matches = dest.clone();
                    matches.extend(src.iter().cloned());
                    let mut per_pod = matches.clone();
                    per_pod.push(Match::SaddrIn(f, SetKind::CountReset(f)));
                    rules.push(Rule {
                        chain,
                        matches: per_pod,
                        action: Action::Continue,
                        count: None,
                    });
                    if md.log_denied {
                        let mut logged = matches.clone();
                        logged.push(Match::Limit {
                            per_second: LOG_PER_SECOND,
                            burst: LOG_BURST,
                        });
                        rules.push(Rule {
                            chain,
                            matches: logged,
                            action: Action::Log { prefix: LOG_PREFIX },
                            count: Some(Count::Logged(f)),
                        });
                    }
                    rules.push(Rule {
                        chain,
                        matches,
                        action: Action::RejectTcpReset,
                        count: Some(Count::Reset(f)),
                    });
                }
            }
        }
        // On a bridge the IP layer sees the bridge, not the port: there, a frame that claims an
        // exempt pod's address (as source, in ARP, or as a neighbour advertisement's target)
        // from any other port is dropped before it can borrow the exemption or the address.
        let guard = |matches: Vec<Match>| Rule {
            chain: ChainKind::Guard,
            matches,
            action: Action::Drop,
            count: None,
        };
        rules.push(guard(vec![
            Match::EtherType(EtherProto::Ip(f)),
            Match::SaddrIn(f, SetKind::GuardAddr(f)),
            Match::IifSaddrNotIn(f, SetKind::GuardPort(f)),
        ]));
        match f {
            Family::V4 => rules.push(guard(vec![
                Match::EtherType(EtherProto::Arp),
                Match::ArpSpaIn(SetKind::GuardAddr(f)),
                Match::IifArpSpaNotIn(SetKind::GuardPort(f)),
            ])),
            Family::V6 => rules.push(guard(vec![
                Match::EtherType(EtherProto::Ip(f)),
                Match::NeighborAdvert,
                Match::NdTargetIn(SetKind::GuardAddr(f)),
                Match::IifNdTargetNotIn(SetKind::GuardPort(f)),
            ])),
        }
    }

    let mut nomasq: [Vec<(u128, u128)>; 2] = [Vec::new(), Vec::new()];
    if cfg.masquerade.enabled {
        rules.push(Rule {
            chain: ChainKind::Snat,
            matches: vec![Match::MarkHas(KUBE_MASQ_MARK)],
            action: Action::Return,
            count: None,
        });
        for (i, f) in Family::ALL.into_iter().enumerate() {
            nomasq[i] = non_masquerade_ranges(cfg, f);
            if !nomasq[i].is_empty() {
                rules.push(Rule {
                    chain: ChainKind::Snat,
                    matches: vec![
                        Match::NfProto(f),
                        Match::SaddrIn(f, SetKind::Masq(f)),
                        Match::DaddrIn(f, SetKind::NoMasq(f)),
                    ],
                    action: Action::SnatToSaddr(f),
                    count: Some(Count::KeptSource(f)),
                });
            }
            rules.push(Rule {
                chain: ChainKind::Snat,
                matches: vec![Match::NfProto(f), Match::SaddrIn(f, SetKind::Masq(f))],
                action: Action::Masquerade {
                    random_fully: cfg.masquerade.random_fully,
                },
                count: Some(Count::Masqueraded(f)),
            });
        }
    }

    let sets = SetKind::ALL
        .iter()
        .map(|&kind| {
            let elements = match kind {
                k if k.is_per_pod() => None,
                SetKind::NoMasq(f) => Some(
                    nomasq[if f == Family::V4 { 0 } else { 1 }]
                        .iter()
                        .map(|&(s, e)| {
                            if s == e {
                                Elem::Addr(u128_to_ip(f, s))
                            } else {
                                Elem::Range(f, s, e)
                            }
                        })
                        .collect(),
                ),
                SetKind::MetaDst(f) => Some(if meta_on {
                    md.addresses
                        .iter()
                        .filter(|a| Family::of(a) == f)
                        .map(|a| Elem::Addr(*a))
                        .collect()
                } else {
                    Vec::new()
                }),
                SetKind::MetaPorts => Some(if meta_on {
                    md.ports.iter().map(|p| Elem::Port(*p)).collect()
                } else {
                    Vec::new()
                }),
                SetKind::ProxyTarget(f) => {
                    let proxy = match f {
                        Family::V4 => node.proxy_v4.map(IpAddr::V4),
                        Family::V6 => node.proxy_v6.map(IpAddr::V6),
                    };
                    Some(
                        proxy
                            .filter(|_| md.mode == MetadataMode::Proxy)
                            .map(|p| vec![Elem::AddrPort(p, md.proxy_port)])
                            .unwrap_or_default(),
                    )
                }
                _ => None,
            };
            SetSpec {
                kind,
                name: names.set(kind),
                elements,
            }
        })
        .collect();

    let mut plan = SharedPlan {
        names,
        sets,
        rules,
        fingerprint: String::new(),
        warnings,
    };
    plan.fingerprint = format!("{:016x}", fnv1a64(render_shared_body(&plan).as_bytes()));
    plan
}

pub fn u128_to_ip(f: Family, v: u128) -> IpAddr {
    crate::addr::u128_to_ip(f == Family::V4, v)
}

/// Plans what one attachment owns.
pub fn plan_pod(cfg: &Config, pod: &PodRef<'_>, addrs: &[IpAddr]) -> PodPlan {
    let owner = OwnerKey::new(pod.network, pod.container_id, pod.ifname);
    let decision = crate::policy::decide(cfg, pod.namespace, &pod.annotations);
    let meta_on = cfg.metadata.mode != MetadataMode::Off;
    // `deny` asked in a proxy network: neither DNATed nor exempt, so the fail-closed rules
    // reset it.
    let intercept = meta_on
        && match decision.policy {
            crate::policy::Policy::Proxy => true,
            // Without a host side the current fail-closed rules cannot see the pod's
            // interface: proxied rather than left open.
            crate::policy::Policy::Deny => {
                cfg.metadata.mode == MetadataMode::Deny || pod.host.is_none()
            }
            _ => false,
        };
    let allowed = meta_on && decision.is_exempt();
    let mut present = Vec::new();
    let mut absent = Vec::new();
    let mut want = |kind: SetKind, key: Key, yes: bool| {
        if yes {
            present.push((kind, key));
        } else {
            absent.push((kind, key));
        }
    };
    for a in addrs {
        let f = Family::of(a);
        want(SetKind::Meta(f), Key::Addr(*a), intercept);
        want(SetKind::Masq(f), Key::Addr(*a), cfg.masquerade.enabled);
        want(
            SetKind::CountProxied(f),
            Key::Addr(*a),
            intercept && cfg.metadata.mode == MetadataMode::Proxy,
        );
        want(SetKind::CountReset(f), Key::Addr(*a), meta_on);
        if let Some(h) = &pod.host {
            want(SetKind::Allow(f), Key::IfAddr(h.iface, *a), allowed);
            if let Some(port) = h.port {
                want(SetKind::GuardAddr(f), Key::Addr(*a), allowed);
                want(SetKind::GuardPort(f), Key::IfAddr(port, *a), allowed);
            }
        }
    }
    PodPlan {
        owner,
        comment: record::with_policy(
            pod_comment(pod, addrs),
            crate::policy::record_token(&decision),
        ),
        attach: attach_comment(pod.host.as_ref(), pod.netns),
        addrs: addrs.to_vec(),
        host: pod.host,
        present,
        absent,
    }
}
