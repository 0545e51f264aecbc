//! Building the plan: the rules and sets a network shares, and what one attachment owns.

use super::*;
use crate::config::{Cidr, Config, EndpointMode, MetadataMode};
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

/// `meta mark & EXEMPT_MARK_MASK != EXEMPT_MARK`: the packet did not cross an exempt pod's veth.
fn unmarked() -> Match {
    Match::MarkIsNot {
        mask: EXEMPT_MARK_MASK,
        value: EXEMPT_MARK,
    }
}

/// One rule of an exempt pod's veth chain ([`veth_rules`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethRule {
    pub matches: Vec<Match>,
    pub action: Action,
    /// Its comment in the kernel, by which CHECK knows it.
    pub comment: &'static str,
}

/// The rules of every exempt pod's veth chain (`netdev natguard VETH`, on the veth's ingress),
/// in order, the same for every veth. They give [`EXEMPT_MARK`] to what the veth's pod sends as
/// itself and to nothing else: IPv4 or IPv6 from one of its own addresses, ARP with one as
/// sender (its own addresses: the veth's elements of `xsrc4/6`). A neighbour advertisement
/// claims its target, so one whose target is not the pod's own leaves the chain first,
/// unmarked, whatever its source. Another exempt pod that claims these addresses sends from its
/// own veth, whose elements are its own: its claims arrive unmarked, and the guard treats them
/// as any pod's.
pub fn veth_rules() -> Vec<VethRule> {
    let (v4, v6) = (Family::V4, Family::V6);
    let r = |matches, action, comment| VethRule {
        matches,
        action,
        comment,
    };
    vec![
        r(
            vec![
                Match::Protocol(EtherType::Ip6),
                Match::NeighborAdvert,
                Match::IifNdTargetNotIn(SetKind::XSrc(v6)),
            ],
            Action::Accept,
            "natguard ~node exempt-veth nd-target",
        ),
        r(
            vec![
                Match::Protocol(EtherType::Ip),
                Match::IifSaddrIn(v4, SetKind::XSrc(v4)),
            ],
            Action::MarkExempt,
            "natguard ~node exempt-veth ip",
        ),
        r(
            vec![
                Match::Protocol(EtherType::Ip6),
                Match::IifSaddrIn(v6, SetKind::XSrc(v6)),
            ],
            Action::MarkExempt,
            "natguard ~node exempt-veth ip6",
        ),
        r(
            vec![
                Match::Protocol(EtherType::Arp),
                Match::IifArpSpaIn(SetKind::XSrc(v4)),
            ],
            Action::MarkExempt,
            "natguard ~node exempt-veth arp",
        ),
    ]
}

/// The comments of [`veth_rules`], in order: what CHECK expects a veth chain to hold.
pub fn veth_rule_comments() -> Vec<&'static str> {
    veth_rules().iter().map(|r| r.comment).collect()
}

/// The node-wide guard: the same rules for every network, so that networks converging one
/// after another never disagree about them. What differs between networks (their metadata
/// addresses and ports, their proxies) lives in the node-wide union sets, and what differs
/// between pods in the per-pod node-wide sets.
///
/// Every packet the node forwards, delivers or sends pays for one cheap test: not TCP, or TCP
/// neither headed for a judged endpoint nor opened towards one, returns at once. An endpoint is
/// an address and a port (`ip daddr . tcp dport @guarded4`), so each endpoint has its own ports
/// and a packet still pays one lookup per question; `allow` endpoints are not in the set, so
/// the guard never sees them.
/// What is left is metadata TCP, and [`ChainKind::Judge`] admits only what is known to be
/// good: an exempt pod on its own host-side interface with its own address, a connection on
/// its way to natguard's proxy (DNATed there from a metadata address), and the node itself
/// over loopback.
/// Everything else is reset, whatever interface it arrived on (a tunnel, another network, an
/// interface natguard never saw) and whatever its conntrack state (untracked, invalid or from
/// before the rules). No conntrack state is consulted on the packet's own destination; the
/// connection's original destination is consulted only in the original direction, so replies
/// to an exempt pod are never judged. At output, metadata TCP whose source is not one of the
/// node's own addresses is reset: that is a pod's connection that IPVS (kube-proxy's IPVS
/// mode) rewrote after input and sends on through output.
fn plan_node_rules() -> Vec<Rule> {
    let mut rules = Vec::new();
    let rule = |chain, matches, action, count| Rule {
        chain,
        matches,
        action,
        count,
    };
    for chain in [ChainKind::GuardForward, ChainKind::GuardInput] {
        rules.push(rule(chain, vec![Match::NotTcp], Action::Return, None));
        for f in Family::ALL {
            rules.push(rule(
                chain,
                vec![
                    Match::NfProto(f),
                    Match::IsTcp,
                    Match::ToIn(f, SetKind::Guarded(f)),
                ],
                Action::Goto(ChainKind::Judge(f)),
                None,
            ));
            rules.push(rule(
                chain,
                // No family match: the ct key of one family breaks on a connection of the other.
                vec![
                    Match::CtDirOriginal,
                    Match::CtOrigToIn(f, SetKind::Guarded(f)),
                ],
                Action::Goto(ChainKind::Judge(f)),
                None,
            ));
        }
    }
    rules.push(rule(
        ChainKind::GuardOutput,
        vec![Match::NotTcp],
        Action::Return,
        None,
    ));
    for f in Family::ALL {
        rules.push(rule(
            ChainKind::GuardOutput,
            vec![
                Match::NfProto(f),
                Match::IsTcp,
                Match::ToIn(f, SetKind::Guarded(f)),
                Match::SaddrNotLocal,
            ],
            Action::RejectTcpReset,
            Some(Count::Reset(f)),
        ));
        let judge = ChainKind::Judge(f);
        rules.push(rule(judge, vec![Match::IifIs("lo")], Action::Return, None));
        // An exempt identity (host-side interface and address) that no attachment holds
        // without the exemption: where two attachments share one (the same address on one
        // bridge, from two networks' pools or a static address), neither gets more than the
        // stricter of the two, since the IP layer cannot tell their packets apart. Every
        // attachment that is not exempt has its identity in the counted set. And only what
        // entered the node through an exempt pod's own veth, which marks its frames
        // (`EXEMPT_MARK`): on a bridge the IP layer sees the bridge, not the port, and a pod
        // that claims the identity from another port arrives without the mark.
        rules.push(rule(
            judge,
            vec![
                Match::NfProto(f),
                Match::MarkIs {
                    mask: EXEMPT_MARK_MASK,
                    value: EXEMPT_MARK,
                },
                Match::IifSaddrIn(f, SetKind::Exempt(f)),
                Match::IifSaddrNotIn(f, SetKind::Resets(f)),
            ],
            Action::Return,
            None,
        ));
        // What an operator allowed explicitly (`metadata.allowInterfaces`; empty by default).
        rules.push(rule(
            judge,
            vec![Match::IifIn(SetKind::AllowedIfs)],
            Action::Return,
            None,
        ));
        // On its way to a proxy because natguard's DNAT sent it there: a connection to a
        // proxy target that was DNATed, first headed for a judged endpoint (address and port).
        // A destination by itself admits nothing: a proxy target that is some metadata
        // endpoint, reached directly, is reset like any other.
        rules.push(rule(
            judge,
            vec![
                Match::NfProto(f),
                Match::IsTcp,
                Match::ToIn(f, SetKind::Proxies(f)),
                Match::CtStatusDnat,
                Match::CtDirOriginal,
                Match::CtOrigToIn(f, SetKind::Guarded(f)),
            ],
            Action::Return,
            None,
        ));
        // Per pod: the lookup in the counted set bumps the element of the interface and
        // source the attempt came from, so a pod sending with another pod's address on another
        // interface is never counted against it.
        rules.push(rule(
            judge,
            vec![Match::NfProto(f), Match::IifSaddrIn(f, SetKind::Resets(f))],
            Action::Continue,
            None,
        ));
        rules.push(rule(
            judge,
            vec![
                Match::NfProto(f),
                Match::IifSaddrIn(f, SetKind::DenyLog(f)),
                Match::Limit {
                    per_second: LOG_PER_SECOND,
                    burst: LOG_BURST,
                },
            ],
            Action::Log { prefix: LOG_PREFIX },
            Some(Count::Logged(f)),
        ));
        rules.push(rule(
            judge,
            vec![Match::IsTcp],
            Action::RejectTcpReset,
            Some(Count::Reset(f)),
        ));
    }
    // Claims of an exempt identity that did not cross the exempt pod's own veth (no
    // `EXEMPT_MARK`) are kept from the node's neighbour table, so the node's answers to the
    // exempt pod (its metadata among them) never go to another pod's MAC: ARP with the
    // identity as sender, IPv6 from it (neighbour solicitations and advertisements, router
    // solicitations), and neighbour advertisements with it as target, whatever their source.
    // An identity that an attachment without the exemption also holds (in `resets`, `narp4`)
    // carries no exemption (see the judge), so it is not judged here either: both attachments
    // keep their neighbours, as where addresses collide on any bridge.
    rules.push(rule(
        ChainKind::ArpGuard,
        vec![
            unmarked(),
            Match::IifArpSpaIn(SetKind::XArp),
            Match::IifArpSpaNotIn(SetKind::NArp),
        ],
        Action::Drop,
        None,
    ));
    let v6 = Family::V6;
    let nd = [
        rule(
            ChainKind::GuardInput,
            vec![
                Match::NfProto(v6),
                Match::IsIcmpv6,
                unmarked(),
                Match::IifSaddrIn(v6, SetKind::Exempt(v6)),
                Match::IifSaddrNotIn(v6, SetKind::Resets(v6)),
            ],
            Action::Drop,
            None,
        ),
        rule(
            ChainKind::GuardInput,
            vec![
                Match::NfProto(v6),
                Match::NeighborAdvert,
                unmarked(),
                Match::IifNdTargetIn(SetKind::Exempt(v6)),
                Match::IifNdTargetNotIn(SetKind::Resets(v6)),
            ],
            Action::Drop,
            None,
        ),
    ];
    // First in the input chain: they are not TCP.
    let at = rules
        .iter()
        .position(|r| r.chain == ChainKind::GuardInput)
        .unwrap_or(rules.len());
    rules.splice(at..at, nd);
    rules
}

/// Plans the objects a network shares, from its config and the node facts: its own DNAT and
/// masquerade chains and sets, its contributions to the node-wide union sets, and the
/// node-wide guard.
pub fn plan_shared(network: &str, cfg: &Config, node: &NodeFacts) -> SharedPlan {
    let names = NetNames::new(network);
    let md = &cfg.metadata;
    let mut warnings = Vec::new();
    let mut rules = Vec::new();
    // The network's connections, marked where they enter (on its pods' host sides) for the
    // masquerade rules below, which run at postrouting where the input interface is no longer
    // known: so a pod of another network with the same address never gets this network's
    // masquerade policy. nat chains see a connection's first packet only, as the label needs.
    if cfg.masquerade.enabled {
        rules.push(Rule {
            chain: ChainKind::Dnat,
            matches: vec![Match::IifIn(SetKind::Ifs)],
            action: Action::SetCtLabel(names.label_bit()),
            count: None,
        });
    }

    let meta_on = md.mode != MetadataMode::Off;
    // Each family's endpoint pairs by mode, sorted: the DNAT's (`proxy`) and the guard's
    // (`proxy` and `deny`); `allow` endpoints are in neither.
    let pairs = |f: Family, modes: &[EndpointMode]| -> Vec<Elem> {
        let mut v: Vec<Elem> = md
            .pairs(modes)
            .filter(|(a, _)| Family::of(a) == f)
            .map(|(a, p)| Elem::AddrPort(a, p))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    for f in Family::ALL {
        if pairs(f, &[EndpointMode::Proxy]).is_empty() {
            continue;
        }
        // Only packets that enter on a host side of this network's pods: another network's
        // pod with the same address (overlapping ranges, Multus `ips`) is never this
        // network's to redirect.
        let from = |m: Vec<Match>| {
            let mut v = vec![
                Match::NfProto(f),
                Match::IifIn(SetKind::Ifs),
                Match::IsTcp,
                Match::ToIn(f, SetKind::MProxy(f)),
            ];
            v.extend(m);
            v
        };
        let proxy: Option<IpAddr> = match f {
            Family::V4 => node.proxy_v4.map(IpAddr::V4),
            Family::V6 => node.proxy_v6.map(IpAddr::V6),
        };
        match proxy {
            Some(p) => {
                // Per pod: the lookup in the counted set bumps the source's element.
                rules.push(Rule {
                    chain: ChainKind::Dnat,
                    matches: from(vec![Match::IifSaddrIn(f, SetKind::RedirCount(f))]),
                    action: Action::Continue,
                    count: None,
                });
                rules.push(Rule {
                    chain: ChainKind::Dnat,
                    matches: from(vec![Match::IifSaddrIn(f, SetKind::Redir(f))]),
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
    let node_rules = plan_node_rules();

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
                        Match::CtLabel(names.label_bit()),
                        Match::SaddrIn(f, SetKind::Masq(f)),
                        Match::DaddrIn(f, SetKind::NoMasq(f)),
                    ],
                    action: Action::SnatToSaddr(f),
                    count: Some(Count::KeptSource(f)),
                });
            }
            // Everything else only where asked: by default the primary and the node's other
            // components decide (masquerade.masqueradeOutside).
            if !cfg.masquerade.masquerade_outside {
                continue;
            }
            rules.push(Rule {
                chain: ChainKind::Snat,
                matches: vec![
                    Match::NfProto(f),
                    Match::CtLabel(names.label_bit()),
                    Match::SaddrIn(f, SetKind::Masq(f)),
                ],
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
                SetKind::MProxy(f) => Some(pairs(f, &[EndpointMode::Proxy])),
                SetKind::MGuard(f) | SetKind::Guarded(f) => {
                    Some(pairs(f, &[EndpointMode::Proxy, EndpointMode::Deny]))
                }
                SetKind::AllowIfs | SetKind::AllowedIfs => Some(
                    md.allow_interfaces
                        .iter()
                        .filter(|_| meta_on)
                        .map(|i| Elem::Iface(*i))
                        .collect(),
                ),
                SetKind::Pxy(f) | SetKind::Proxies(f) => {
                    let proxy = match f {
                        Family::V4 => node.proxy_v4.map(IpAddr::V4),
                        Family::V6 => node.proxy_v6.map(IpAddr::V6),
                    };
                    Some(
                        proxy
                            .filter(|_| md.has(EndpointMode::Proxy))
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

    // The veth chains' rules are the node's too: a release that changes them changes the
    // fingerprint, so its first converge rewrites every exempt pod's chain.
    let mut guard_text = render_rules(&node_rules, &names);
    for r in veth_rules() {
        guard_text.push_str(&format!("veth {} {}\n", render_veth_rule(&r), r.comment));
    }
    let node_fingerprint = format!("{:016x}", fnv1a64(guard_text.as_bytes()));
    rules.extend(node_rules);
    let mut plan = SharedPlan {
        names,
        sets,
        rules,
        fingerprint: String::new(),
        node_fingerprint,
        warnings,
    };
    plan.fingerprint = format!("{:016x}", fnv1a64(render_network_body(&plan).as_bytes()));
    plan
}

/// The node-wide guard alone, for a node where no network lists natguard yet (a fresh node, a
/// primary plugin that has not written its conflist): the guard's chains and the node-wide
/// sets, the union sets filled from `cfg` (what natguard's entry will say), no network's own
/// chains or sets. Every pod is then judged by the allow-list, which admits no pod: metadata
/// TCP from any pod is reset until a network's ADD or adopt exempts or proxies it. The first
/// converge of a real network derives the union sets from the networks again.
pub fn plan_node_guard(cfg: &Config, node: &NodeFacts) -> SharedPlan {
    let mut plan = plan_shared(NODE, cfg, node);
    plan.rules.retain(|r| r.chain.is_node());
    plan.sets.retain(|s| s.kind.is_node());
    plan.warnings.clear();
    plan.fingerprint = plan.node_fingerprint.clone();
    plan
}

pub fn u128_to_ip(f: Family, v: u128) -> IpAddr {
    crate::addr::u128_to_ip(f == Family::V4, v)
}

/// What a pod's policy asks of the elements it can own.
#[derive(Debug, Clone, Copy, Default)]
struct Wants {
    /// Its metadata traffic is DNATed to the proxy.
    intercept: bool,
    /// Its egress is under the masquerade policy.
    masquerade: bool,
    /// Its denied attempts are logged.
    logged: bool,
    /// It is exempt: the guard lets its metadata traffic through.
    allowed: bool,
}

/// Every element an attachment with these addresses and this host side can own, each with
/// whether `w` wants it. Which elements are listed depends on the addresses and the host side
/// alone, never on `w`, so [`owned_keys`] finds them all without knowing the policy the pod
/// was added with.
fn pod_elements(addrs: &[IpAddr], host: Option<HostSide>, w: Wants) -> Vec<(SetKind, Key, bool)> {
    let mut out = Vec::new();
    for a in addrs {
        let f = Family::of(a);
        out.push((SetKind::Masq(f), Key::Addr(*a), w.masquerade));
        if let Some(h) = &host {
            // Redirected, counted and logged by the identity the packet enters with: another
            // attachment holding the address behind another host side is never taken for it.
            let id = Key::IfAddr(h.iface, *a);
            out.push((SetKind::Redir(f), id, w.intercept));
            out.push((SetKind::RedirCount(f), id, w.intercept));
            out.push((SetKind::DenyLog(f), id, w.logged));
            out.push((SetKind::Exempt(f), id, w.allowed));
            out.push((SetKind::Resets(f), id, !w.allowed));
            if f == Family::V4 {
                out.push((SetKind::XArp, id, w.allowed));
                out.push((SetKind::NArp, id, !w.allowed));
            }
        }
    }
    // The exempt pod's own veth (its bridge port, or its routed veth), and its own addresses
    // there: what it sends as itself gets the exemption's mark on that veth, and nowhere else.
    if let Some(h) = &host {
        let veth = h.port.unwrap_or(h.iface);
        for a in addrs {
            let f = Family::of(a);
            out.push((SetKind::XSrc(f), Key::IfAddr(veth, *a), w.allowed));
        }
        out.push((
            SetKind::XVeths,
            Key::Iface(veth),
            w.allowed && !addrs.is_empty(),
        ));
    }
    out
}

/// Every (set, key) an attachment with these addresses and this host side can own, whatever
/// its policy: what DEL releases, and what an ADD of the same attachment gives up when its
/// addresses or host side change. Read from the same list as [`plan_pod`]'s, so a set a pod
/// can own is never missed here.
pub fn owned_keys(addrs: &[IpAddr], host: Option<HostSide>) -> Vec<(SetKind, Key)> {
    pod_elements(addrs, host, Wants::default())
        .into_iter()
        .map(|(kind, key, _)| (kind, key))
        .collect()
}

/// Plans what one attachment owns.
pub fn plan_pod(cfg: &Config, pod: &PodRef<'_>, addrs: &[IpAddr]) -> PodPlan {
    let owner = OwnerKey::new(pod.network, pod.container_id, pod.ifname);
    let decision = crate::policy::decide(cfg, pod.namespace, &pod.annotations);
    let meta_on = cfg.metadata.mode != MetadataMode::Off;
    // Only a pod whose policy is `proxy` in a proxy network is DNATed; with `deny` (asked by
    // the network or the pod) it is neither DNATed nor exempt, so the node-wide guard resets
    // it. With metadata interception off for the network, its pods are treated as exempt:
    // the guard still judges them, and "off" means the operator lets them through.
    let intercept =
        cfg.metadata.has(EndpointMode::Proxy) && decision.policy == crate::policy::Policy::Proxy;
    let allowed = !meta_on || decision.is_exempt();
    let wants = Wants {
        intercept,
        masquerade: cfg.masquerade.enabled,
        logged: meta_on && cfg.metadata.log_denied && !allowed,
        allowed,
    };
    let (mut present, mut absent) = (Vec::new(), Vec::new());
    for (kind, key, yes) in pod_elements(addrs, pod.host, wants) {
        if yes {
            present.push((kind, key));
        } else {
            absent.push((kind, key));
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
