//! Golden-file tests of the pure plan: for a set of configurations, the shared objects of the
//! network (`plan_shared`) and the entries of a few pods (`plan_pod`), rendered as nft text and
//! compared with `tests/golden/<case>.nft`. No root and no kernel needed.
//!
//! Each configuration goes through the real parser (`natguard::cni::netconf::parse_netconf`), so
//! a golden file pins what a conflist entry turns into. After an intended change of the plan, rewrite the
//! files with `UPDATE_GOLDEN=1 cargo test --test plan` and review the diff.
//!
//! The golden text (render) and the netlink bytes (lower) are two translations of the same
//! plan, so one root test keeps them from drifting: for every case it loads the golden shared
//! objects with `nft -f` in one private network namespace, converges the same plans with
//! natguard's own batch in another, and compares what `nft list ruleset` prints for both.

use natguard::cni::CniArgs;
use natguard::config::{self, Config, MetadataMode};
use natguard::plan::{
    self, Action, ChainKind, Family, HostSide, IfName, Key, NodeFacts, PodRef, SetKind,
};
mod common;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// The proxy addresses `auto` resolved to on an imaginary node.
const NODE_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);

fn both() -> NodeFacts {
    NodeFacts {
        proxy_v4: Some(NODE_V4),
        proxy_v6: Some(NODE_V6),
    }
}

/// One pod of a case: its invocation and the addresses prevResult gives it.
struct Pod {
    container_id: &'static str,
    ifname: &'static str,
    cni_args: &'static str,
    addrs: &'static [&'static str],
}

const DUAL: Pod = Pod {
    container_id: "0123456789abcdef0123456789abcdef",
    ifname: "eth0",
    cni_args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
    addrs: &["10.22.0.5", "fd00:22::5"],
};

const V4_ONLY: Pod = Pod {
    container_id: "fedcba9876543210",
    ifname: "net1",
    cni_args: "K8S_POD_NAME=batch-1;K8S_POD_NAMESPACE=jobs",
    addrs: &["10.22.0.6"],
};

const NO_ARGS: Pod = Pod {
    container_id: "podman-4711",
    ifname: "eth0",
    cni_args: "",
    addrs: &["10.22.0.7"],
};

const EXEMPT: Pod = Pod {
    container_id: "cafe0001",
    ifname: "eth0",
    cni_args: "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=kiam-server-x1;IgnoreUnknown=1",
    addrs: &["10.22.0.8", "fd00:22::8"],
};

/// A namespace that merely resembles an exempt one: it is intercepted.
const LOOKALIKE: Pod = Pod {
    container_id: "cafe0002",
    ifname: "eth0",
    cni_args: "K8S_POD_NAMESPACE=kube-system-2;K8S_POD_NAME=mallory",
    addrs: &["10.22.0.9", "fd00:22::9"],
};

struct Network {
    /// The plugin entry as a runtime passes it on stdin (without prevResult).
    conf: &'static str,
    node: NodeFacts,
    pods: &'static [Pod],
}

struct Case {
    name: &'static str,
    networks: Vec<Network>,
}

fn net(conf: &'static str, node: NodeFacts, pods: &'static [Pod]) -> Network {
    Network { conf, node, pods }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "defaults",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"kubenet","type":"natguard"}"#,
                both(),
                &[DUAL, V4_ONLY, NO_ARGS],
            )],
        },
        Case {
            name: "deny",
            networks: vec![net(
                r#"{"cniVersion":"0.3.1","name":"k8s-pod-network","type":"natguard",
                    "metadata":{"mode":"deny","ports":[80,443,8080]}}"#,
                both(),
                &[DUAL, V4_ONLY],
            )],
        },
        Case {
            name: "off",
            networks: vec![net(
                r#"{"cniVersion":"0.4.0","name":"cbr0","type":"natguard",
                    "metadata":{"mode":"off","ports":[]}}"#,
                both(),
                &[DUAL],
            )],
        },
        Case {
            name: "masquerade_disabled",
            networks: vec![net(
                r#"{"cniVersion":"1.1.0","name":"mynet","type":"natguard",
                    "masquerade":{"enabled":false}}"#,
                both(),
                &[DUAL],
            )],
        },
        Case {
            // natguard's own MASQUERADE of everything outside nonMasqueradeCIDRs, asked for.
            name: "masquerade_outside",
            networks: vec![net(
                r#"{"cniVersion":"1.1.0","name":"kubenet","type":"natguard",
                    "masquerade":{"masqueradeOutside":true}}"#,
                both(),
                &[DUAL, V4_ONLY],
            )],
        },
        Case {
            name: "masq_link_local",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"mynet","type":"natguard",
                    "masquerade":{"masqLinkLocal":true,"masqLinkLocalIPv6":true,"randomFully":false}}"#,
                both(),
                &[DUAL],
            )],
        },
        Case {
            name: "custom_cidrs",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"mynet","type":"natguard",
                    "masquerade":{"nonMasqueradeCIDRs":[
                        "10.0.0.0/8","10.96.0.0/12","10.255.255.255/32","11.0.0.0/8",
                        "192.168.1.77/24","192.168.0.0/24","203.0.113.7/32",
                        "fd00::/8","fd00:22::/64","2001:db8::/32","2001:db8:1::1/128",
                        "10.0.0.0/8"]}}"#,
                both(),
                &[DUAL],
            )],
        },
        Case {
            name: "fixed_proxy",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"mynet","type":"natguard",
                    "metadata":{"addresses":["169.254.169.254","fd00:ec2::254","169.254.170.2"],
                                "ports":[80,8080],"proxyPort":8775,
                                "proxyIPv4":"192.168.50.10","proxyIPv6":"2001:db8:50::10"}}"#,
                // Fixed addresses come from the config, not from the node: the case resolves them
                // with `node::facts`, which only asks the kernel for "auto".
                NodeFacts::default(),
                &[DUAL],
            )],
        },
        Case {
            name: "no_ipv6_proxy",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"mynet","type":"natguard"}"#,
                NodeFacts {
                    proxy_v4: Some(NODE_V4),
                    proxy_v6: None,
                },
                &[DUAL],
            )],
        },
        Case {
            name: "no_proxy_at_all",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"mynet","type":"natguard"}"#,
                NodeFacts::default(),
                &[DUAL],
            )],
        },
        Case {
            name: "exempt_namespaces",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"mynet","type":"natguard",
                    "metadata":{"exemptNamespaces":["kube-system","kiam","kube-system"]}}"#,
                both(),
                &[EXEMPT, LOOKALIKE, DUAL, NO_ARGS],
            )],
        },
        Case {
            name: "two_networks",
            networks: vec![
                net(
                    r#"{"cniVersion":"1.0.0","name":"net-a","type":"natguard"}"#,
                    both(),
                    &[DUAL],
                ),
                net(
                    r#"{"cniVersion":"0.3.1","name":"net-b","type":"natguard",
                        "metadata":{"mode":"deny","addresses":["169.254.169.254"]},
                        "masquerade":{"nonMasqueradeCIDRs":["10.0.0.0/8"]}}"#,
                    both(),
                    // The same attachment in both networks owns different keys.
                    &[DUAL],
                ),
            ],
        },
        Case {
            // One node, two treatments: IMDS proxied, the WireServer's TCP 80 and 32526 denied.
            name: "preset_azure",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"azure-cni","type":"natguard",
                    "metadata":{"preset":"azure","exemptNamespaces":["kube-system"]}}"#,
                both(),
                &[DUAL, EXEMPT],
            )],
        },
        Case {
            // The Pod Identity agent is `allow`: in no set the DNAT or the guard reads.
            name: "preset_aws_with_an_override",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"aws-cni","type":"natguard",
                    "metadata":{"preset":"aws","endpoints":[
                        {"address":"fd00:ec2::254","mode":"deny"}]}}"#,
                both(),
                &[DUAL],
            )],
        },
        Case {
            // Oracle's IMDS on both families: the IPv6 address proxied like the IPv4 one.
            name: "preset_oracle",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","name":"oci","type":"natguard",
                    "metadata":{"preset":"oracle","exemptNamespaces":["kube-system"]}}"#,
                both(),
                &[DUAL, EXEMPT],
            )],
        },
        Case {
            name: "long_network_name",
            networks: vec![net(
                r#"{"cniVersion":"1.0.0","type":"natguard",
                    "name":"a-very-long-network-name-that-is-longer-than-forty-bytes.example"}"#,
                both(),
                &[V4_ONLY],
            )],
        },
    ]
}

/// Parses a case's config the way the plugin does; resolves fixed proxy addresses.
fn load(n: &Network) -> (String, Config, NodeFacts) {
    let conf = natguard::cni::netconf::parse_netconf(n.conf.as_bytes())
        .unwrap_or_else(|e| panic!("case config does not parse: {e}\n{}", n.conf));
    let md = &conf.natguard.metadata;
    let node = match (md.proxy_ipv4, md.proxy_ipv6) {
        // Both addresses fixed: the node's own addresses play no part.
        (config::ProxyAddr::Fixed(a), config::ProxyAddr::Fixed(b)) => NodeFacts {
            proxy_v4: Some(a),
            proxy_v6: Some(b),
        },
        _ => n.node,
    };
    (conf.name, conf.natguard, node)
}

fn addrs(p: &Pod) -> Vec<IpAddr> {
    p.addrs.iter().map(|a| a.parse().unwrap()).collect()
}

fn render_case(c: &Case) -> String {
    let mut out = String::new();
    for (i, n) in c.networks.iter().enumerate() {
        let (name, cfg, node) = load(n);
        let shared = plan::plan_shared(&name, &cfg, &node);
        let _ = writeln!(
            out,
            "# node: proxy_v4={} proxy_v6={}",
            node.proxy_v4.map_or("none".into(), |a| a.to_string()),
            node.proxy_v6.map_or("none".into(), |a| a.to_string())
        );
        // The guard's chains are the node's: shown with the first network only.
        let part = if i == 0 {
            plan::NodePart::All
        } else {
            plan::NodePart::SetsOnly
        };
        out.push_str(&plan::render_shared_with(&shared, part));
        for p in n.pods {
            let args = CniArgs::parse(p.cni_args).unwrap();
            // A bridge-plugin pod: the IP layer sees cni0, the bridge sees the pod's port.
            let port = format!("veth{}", &p.container_id[..4.min(p.container_id.len())]);
            let netns = format!("/run/netns/{}", p.container_id);
            let pod = PodRef {
                network: &name,
                container_id: p.container_id,
                ifname: p.ifname,
                namespace: args.pod_namespace.as_deref(),
                pod_name: args.pod_name.as_deref(),
                netns: &netns,
                annotations: Default::default(),
                host: Some(HostSide {
                    mac: None,
                    bridge: None,
                    iface: IfName::new("cni0").unwrap(),
                    port: IfName::new(&port),
                }),
            };
            let plan_pod = plan::plan_pod(&cfg, &pod, &addrs(p));
            let _ = writeln!(
                out,
                "# pod {} {} CNI_ARGS={:?}",
                p.container_id, p.ifname, p.cni_args
            );
            out.push_str(&plan::render_pod(&plan_pod, &shared.names));
        }
        out.push('\n');
    }
    out
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn plans_match_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let dir = golden_dir();
    let mut failures = Vec::new();
    for c in cases() {
        let got = render_case(&c);
        let path = dir.join(format!("{}.nft", c.name));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => failures.push(format!(
                "{}: plan differs from {}\n{}",
                c.name,
                path.display(),
                diff(&want, &got)
            )),
            Err(e) => failures.push(format!(
                "{}: cannot read {} ({e}); run with UPDATE_GOLDEN=1 to create it",
                c.name,
                path.display()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(after an intended change: UPDATE_GOLDEN=1 cargo test --test plan, then review the diff)",
        failures.join("\n")
    );
}

/// Every golden file belongs to a case: a renamed case must not leave a stale file behind.
#[test]
fn no_stale_golden_files() {
    let names: Vec<String> = cases().iter().map(|c| format!("{}.nft", c.name)).collect();
    for e in std::fs::read_dir(golden_dir()).unwrap() {
        let f = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(names.contains(&f), "tests/golden/{f} belongs to no case");
    }
}

/// A line-by-line diff that is good enough to spot what changed.
fn diff(want: &str, got: &str) -> String {
    let w: Vec<&str> = want.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    for i in 0..w.len().max(g.len()) {
        match (w.get(i), g.get(i)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => {
                let _ = writeln!(out, "  line {}:", i + 1);
                if let Some(a) = a {
                    let _ = writeln!(out, "  - {a}");
                }
                if let Some(b) = b {
                    let _ = writeln!(out, "  + {b}");
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Properties the golden files rely on, stated directly so a wrong regeneration cannot hide them.
// ---------------------------------------------------------------------------------------------

fn plan_of(conf: &str, node: NodeFacts) -> plan::SharedPlan {
    let c = natguard::cni::netconf::parse_netconf(conf.as_bytes()).unwrap();
    plan::plan_shared(&c.name, &c.natguard, &node)
}

#[test]
fn missing_ipv6_proxy_fails_closed_with_a_warning() {
    let p = plan_of(
        r#"{"cniVersion":"1.0.0","name":"n"}"#,
        NodeFacts {
            proxy_v4: Some(NODE_V4),
            proxy_v6: None,
        },
    );
    let dnat: Vec<_> = p
        .rules_of(ChainKind::Dnat)
        .filter(|r| matches!(r.action, Action::DnatTo(..)))
        .collect();
    assert_eq!(dnat.len(), 1, "only the IPv4 DNAT: {dnat:?}");
    assert!(matches!(dnat[0].action, Action::DnatTo(IpAddr::V4(a), 8181) if a == NODE_V4));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(p.warnings[0].contains("IPv6"), "{:?}", p.warnings);
    // The node-wide guard sends metadata TCP, by its destination and by where it was first
    // headed (in the original direction only), to the judge, which admits exempt pods on
    // their own interface, natguard's proxy and loopback, and resets the rest.
    for chain in [ChainKind::GuardForward, ChainKind::GuardInput] {
        let mut rules: Vec<_> = p.rules_of(chain).collect();
        // At input, first the drops of IPv6 neighbour claims of an exempt identity that did
        // not cross its pod's veth (they are not TCP).
        if chain == ChainKind::GuardInput {
            let nd: Vec<_> = rules.drain(..2).collect();
            for r in nd {
                assert_eq!(r.action, Action::Drop, "{r:?}");
                assert!(
                    r.matches.contains(&plan::Match::MarkIsNot {
                        mask: plan::EXEMPT_MARK_MASK,
                        value: plan::EXEMPT_MARK
                    }),
                    "{r:?}"
                );
            }
        }
        assert_eq!(rules[0].matches, vec![plan::Match::NotTcp], "{chain:?}");
        assert_eq!(rules[0].action, Action::Return);
        for f in Family::ALL {
            let to_judge: Vec<_> = rules
                .iter()
                .filter(|r| r.action == Action::Goto(ChainKind::Judge(f)))
                .collect();
            assert_eq!(to_judge.len(), 2, "{chain:?} {f:?}");
            assert!(to_judge[1].matches.contains(&plan::Match::CtDirOriginal));
        }
    }
    for f in Family::ALL {
        let judge: Vec<_> = p.rules_of(ChainKind::Judge(f)).collect();
        let last = judge.last().unwrap();
        assert_eq!(last.action, Action::RejectTcpReset, "{f:?}");
        assert!(judge.iter().any(|r| r.action == Action::Return
            && r.matches
                .contains(&plan::Match::IifSaddrIn(f, SetKind::Exempt(f)))));
    }
}

#[test]
fn deny_and_off_have_no_dnat() {
    let deny = plan_of(
        r#"{"cniVersion":"1.0.0","name":"n","metadata":{"mode":"deny"}}"#,
        both(),
    );
    // No DNAT; the DNAT chain only marks the network's connections for its masquerade rules.
    let no_dnat = |p: &plan::SharedPlan| {
        let rules: Vec<_> = p.rules_of(ChainKind::Dnat).collect();
        assert_eq!(rules.len(), 1, "{rules:?}");
        assert!(
            matches!(rules[0].action, Action::SetCtLabel(_)),
            "{rules:?}"
        );
    };
    no_dnat(&deny);
    // The guard is the node's, the same whatever the network's mode.
    let proxy = plan_of(r#"{"cniVersion":"1.0.0","name":"n"}"#, both());
    assert_eq!(deny.node_fingerprint, proxy.node_fingerprint);
    assert!(deny.warnings.is_empty());
    let off = plan_of(
        r#"{"cniVersion":"1.0.0","name":"n","metadata":{"mode":"off"}}"#,
        NodeFacts::default(),
    );
    no_dnat(&off);
    // Off contributes no metadata address to the node-wide guard.
    for s in off.sets.iter().filter(|s| s.kind.is_union()) {
        assert_eq!(s.elements.as_deref(), Some(&[][..]), "{:?}", s.kind);
    }
    assert!(off.warnings.is_empty(), "off mode needs no proxy");
}

#[test]
fn plans_are_deterministic_and_fingerprints_follow_the_config() {
    let a = plan_of(r#"{"cniVersion":"1.0.0","name":"n"}"#, both());
    let b = plan_of(r#"{"cniVersion":"0.3.1","name":"n"}"#, both());
    assert_eq!(a, b, "cniVersion does not change the plan");
    let c = plan_of(
        r#"{"cniVersion":"1.0.0","name":"n","metadata":{"ports":[80,81]}}"#,
        both(),
    );
    assert_ne!(a.fingerprint, c.fingerprint);
    let d = plan_of(
        r#"{"cniVersion":"1.0.0","name":"n"}"#,
        NodeFacts {
            proxy_v4: Some(Ipv4Addr::new(10, 0, 0, 2)),
            ..both()
        },
    );
    assert_ne!(
        a.fingerprint, d.fingerprint,
        "a new node address is a change"
    );
}

#[test]
fn two_networks_share_no_object_names() {
    let a = plan_of(r#"{"cniVersion":"1.0.0","name":"net-a"}"#, both());
    let b = plan_of(r#"{"cniVersion":"1.0.0","name":"net-b"}"#, both());
    // A network's own objects are its own; the node-wide guard's are shared, and named so
    // that no network's name can produce one (no `-`).
    for k in ChainKind::ALL {
        if k.is_node() {
            assert_eq!(a.names.chain(k), b.names.chain(k));
            assert!(!a.names.chain(k).contains('-'), "{k:?}");
        } else {
            assert_ne!(a.names.chain(k), b.names.chain(k));
        }
    }
    for s in a.sets.iter().filter(|s| !s.kind.is_node()) {
        assert!(b.sets.iter().all(|t| t.name != s.name), "{}", s.name);
    }
    for s in a.sets.iter().filter(|s| s.kind.is_node()) {
        assert!(!s.name.contains('-'), "{}", s.name);
    }
    // Long names are shortened with a hash, and stay distinct.
    let l1 = plan::NetNames::new(&format!("{}1", "x".repeat(60)));
    let l2 = plan::NetNames::new(&format!("{}2", "x".repeat(60)));
    assert_ne!(l1.chain(ChainKind::Dnat), l2.chain(ChainKind::Dnat));
    assert!(l1.set(SetKind::NoMasq(Family::V6)).len() < 64);
}

#[test]
fn exempt_pods_are_masqueraded_but_not_intercepted() {
    let c = natguard::cni::netconf::parse_netconf(
        br#"{"cniVersion":"1.0.0","name":"n","metadata":{"exemptNamespaces":["kube-system"]}}"#,
    )
    .unwrap();
    assert_eq!(c.natguard.metadata.mode, MetadataMode::Proxy);
    let a = addrs(&EXEMPT);
    for (ns, exempt) in [
        (Some("kube-system"), true),
        (Some("kube-system-2"), false),
        (Some("kube"), false),
        (None, false),
    ] {
        let p = plan::plan_pod(
            &c.natguard,
            &PodRef {
                network: "n",
                container_id: "c",
                ifname: "eth0",
                namespace: ns,
                pod_name: None,
                netns: "/run/netns/c",
                annotations: Default::default(),
                host: Some(HostSide {
                    mac: None,
                    bridge: None,
                    iface: IfName::new("veth-c").unwrap(),
                    port: None,
                }),
            },
            &a,
        );
        for ip in &a {
            let f = Family::of(ip);
            let key = Key::Addr(*ip);
            let id = Key::IfAddr(IfName::new("veth-c").unwrap(), *ip);
            assert_eq!(
                p.present.contains(&(SetKind::Redir(f), id)),
                !exempt,
                "{ns:?} {ip}: redirection is bound to the pod's interface"
            );
            assert_eq!(
                p.present.contains(&(SetKind::Exempt(f), id)),
                exempt,
                "{ns:?} {ip}: exemption is bound to the pod's interface"
            );
            assert!(p.present.contains(&(SetKind::Masq(f), key)), "{ns:?} {ip}");
        }
        assert_eq!(plan::addrs_from_comment(&p.comment), a);
    }
}

// ---------------------------------------------------------------------------------------------
// The golden text against the kernel (root)
// ---------------------------------------------------------------------------------------------

/// Whether a rule line matches a raw payload (`@th,64,128`, the neighbour advertisement's
/// target) against a set of a typed key: nft prints such a rule but its grammar cannot read
/// it back ("datatype mismatch"), so it is compared as text instead of loaded.
fn raw_payload_against_a_set(line: &str) -> bool {
    line.contains("@th,") && line.contains(" @")
}

/// The shared objects of a golden file, loadable by `nft -f`: its table blocks, without the
/// pods' element lines and the raw-payload rules (returned apart, trimmed).
fn golden_shared_objects(text: &str) -> (String, Vec<String>) {
    let mut load = String::new();
    let mut raw = Vec::new();
    // A pod's element lines, and its veth chain (the exempt pod's own, not a shared object).
    let per_pod = |l: &&str| {
        l.starts_with("add element")
            || l.starts_with("add chain netdev")
            || l.starts_with("add rule netdev")
    };
    for l in text.lines().filter(|l| !per_pod(l)) {
        if raw_payload_against_a_set(l) {
            // nft lists the `ether type ip6` dependency of an icmpv6 match implicitly.
            let l = l.trim();
            raw.push(l.strip_prefix("ether type ip6 ").unwrap_or(l).to_string());
        } else {
            load.push_str(l);
            load.push('\n');
        }
    }
    (load, raw)
}

/// `nft -s list ruleset` in `ns`, with natguard's rule comments (which the golden text leaves
/// out: they carry the fingerprint shown in its `# network` lines) taken out.
fn listed_without_comments(ns: &common::Netns) -> String {
    let text = common::nft_ruleset(ns);
    text.lines()
        .map(|l| match l.find(" comment \"") {
            Some(i) if l.ends_with('"') => l[..i].to_string(),
            _ => l.to_string(),
        })
        .map(|l| l + "\n")
        .collect()
}

/// For every golden case, the ruleset `nft -f` makes of the golden text equals the one
/// natguard's converge batch makes of the same plans: the render and the lowering agree, set
/// by set and rule by rule. Each side has a network namespace of its own; needs root and `nft`.
#[test]
fn golden_text_loaded_by_nft_equals_what_natguards_batch_installs() {
    common::require_root();
    common::require_tools(&["nft"]);
    let h = common::Harness::new("golden-kernel");
    let mut failures = Vec::new();
    for (i, c) in cases().into_iter().enumerate() {
        let by_text = h.netns(&format!("t{i}"));
        let by_bytes = h.netns(&format!("b{i}"));
        let golden = std::fs::read_to_string(golden_dir().join(format!("{}.nft", c.name)))
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let file = h.dir().join(format!("{}.nft", c.name));
        // nft's grammar takes no `~` in a name, the mark of a long network's cut name: both
        // sides are compared with it spelt `_` (nft lists such names but cannot read them back).
        let golden = golden.replace('~', "_");
        let (loadable, raw_rules) = golden_shared_objects(&golden);
        std::fs::write(&file, loadable).unwrap();
        let loaded = common::output(by_text.cmd("nft").arg("-f").arg(&file));
        assert!(
            loaded.status.success(),
            "{}: nft -f of the golden text failed: {}",
            c.name,
            String::from_utf8_lossy(&loaded.stderr)
        );
        let mut plans: Vec<plan::SharedPlan> = c
            .networks
            .iter()
            .map(|n| {
                let (name, cfg, node) = load(n);
                plan::plan_shared(&name, &cfg, &node)
            })
            .collect();
        // The node-wide union sets hold every network's part, as the store derives them when
        // networks converge (loading the golden texts one after another adds them up too).
        let mut union: Vec<(plan::SetKind, Vec<plan::Elem>)> = Vec::new();
        for spec in plans
            .iter()
            .flat_map(|p| p.sets.iter())
            .filter(|s| s.kind.is_union())
        {
            let i = match union.iter().position(|(k, _)| *k == spec.kind) {
                Some(i) => i,
                None => {
                    union.push((spec.kind, Vec::new()));
                    union.len() - 1
                }
            };
            for e in spec.elements.iter().flatten() {
                if !union[i].1.contains(e) {
                    union[i].1.push(e.clone());
                }
            }
        }
        for p in &mut plans {
            for spec in p.sets.iter_mut().filter(|s| s.kind.is_union()) {
                if let Some((_, all)) = union.iter().find(|(k, _)| *k == spec.kind) {
                    let mut all = all.clone();
                    all.sort();
                    spec.elements = Some(all);
                }
            }
        }
        common::in_netns(&by_bytes, || {
            let mut sock = natguard::kernel::netlink::NfSocket::open().expect("netfilter socket");
            let mut tx = natguard::kernel::nft::Tx::new(&mut sock, None);
            for p in &plans {
                tx.converge_shared(p, true);
            }
            tx.commit(&mut sock)
                .unwrap_or_else(|e| panic!("{}: natguard's converge failed: {e}", c.name));
        });
        let want = listed_without_comments(&by_text);
        let listed = listed_without_comments(&by_bytes).replace('~', "_");
        for r in &raw_rules {
            if !listed.lines().any(|l| l.trim() == r) {
                let near: Vec<&str> = listed
                    .lines()
                    .filter(|l| l.contains("nd-neighbor-advert"))
                    .map(str::trim)
                    .collect();
                failures.push(format!(
                    "{}: natguard's batch installed no rule that nft lists as the golden {r:?}; nft lists {near:?}",
                    c.name
                ));
            }
        }
        let got: String = listed
            .lines()
            .filter(|l| !raw_payload_against_a_set(l))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(want.contains("table inet natguard"), "{}: {want}", c.name);
        if want != got {
            failures.push(format!(
                "{}: the golden text (-) and natguard's batch (+) install different rulesets\n{}",
                c.name,
                diff(&want, &got)
            ));
        }
        h.delete_netns(&by_text);
        h.delete_netns(&by_bytes);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An exempt pod's veth chain: the text the golden files show for it (`plan::render_veth_chain`),
/// loaded by `nft -f`, and natguard's own batch for it install the same chain and rule. Each side
/// has a network namespace of its own with a device of the chain's name; needs root and `nft`.
#[test]
fn a_veth_chain_loaded_by_nft_equals_what_natguards_batch_installs() {
    common::require_root();
    common::require_tools(&["nft"]);
    let h = common::Harness::new("golden-veth");
    const VETH: &str = "vethcafe";
    let by_text = h.netns("t");
    let by_bytes = h.netns("b");
    for ns in [&by_text, &by_bytes] {
        ns.ip(&format!("link add {VETH} type veth peer name {VETH}p"));
    }
    // The sets the chain's rules look up, on both sides, from the same text.
    let mut sets = format!("add table netdev {}\n", plan::TABLE);
    for k in plan::SetKind::ALL
        .into_iter()
        .filter(|k| k.table() == plan::TableFamily::Netdev)
    {
        sets.push_str(&format!(
            "add set netdev {} {} {{ type {}; }}\n",
            plan::TABLE,
            k.suffix(),
            k.type_name()
        ));
    }
    let load = |ns: &common::Netns, name: &str, text: &str| {
        let file = h.dir().join(name);
        std::fs::write(&file, text).unwrap();
        let loaded = common::output(ns.cmd("nft").arg("-f").arg(&file));
        assert!(
            loaded.status.success(),
            "nft -f of {name} failed: {}\n{text}",
            String::from_utf8_lossy(&loaded.stderr)
        );
    };
    load(&by_bytes, "sets.nft", &sets);
    // The neighbour advertisement's rule (a raw payload against a typed set) nft cannot read
    // back: it is compared as listed text below.
    let (mut loadable, mut raw) = (sets, Vec::new());
    let prefix = format!("add rule netdev {} {VETH} ", plan::TABLE);
    for l in plan::render_veth_chain(VETH).lines() {
        match l.strip_prefix(&prefix) {
            Some(rule) if raw_payload_against_a_set(l) => {
                let rule = rule.split(" comment \"").next().unwrap_or(rule);
                raw.push(rule.to_string());
            }
            _ => loadable.push_str(&format!("{l}\n")),
        }
    }
    assert_eq!(raw.len(), 1, "the veth chain's advertisement rule: {raw:?}");
    load(&by_text, "veth.nft", &loadable);
    common::in_netns(&by_bytes, || {
        let mut sock = natguard::kernel::netlink::NfSocket::open().expect("netfilter socket");
        let mut tx = natguard::kernel::nft::Tx::new(&mut sock, None);
        tx.veth_chain(VETH);
        tx.commit(&mut sock)
            .unwrap_or_else(|e| panic!("natguard's veth chain failed: {e}"));
    });
    let want = listed_without_comments(&by_text);
    let listed = listed_without_comments(&by_bytes);
    for r in &raw {
        // nft lists the `meta protocol ip6` dependency of an icmpv6 match implicitly.
        let short = r.strip_prefix("meta protocol ip6 ").unwrap_or(r);
        assert!(
            listed.lines().any(|l| l.trim() == r || l.trim() == short),
            "natguard's batch installed no rule that nft lists as {r:?}:\n{listed}"
        );
    }
    let got: String = listed
        .lines()
        .filter(|l| !raw_payload_against_a_set(l))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        want.contains(&format!("hook ingress device \"{VETH}\"")),
        "{want}"
    );
    assert_eq!(want, got, "{}", diff(&want, &got));
}
