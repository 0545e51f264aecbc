//! Attacks on natguard's promise: from its first packet, a pod that is not exempt never talks to
//! the real instance-metadata API, on either family.
//!
//! Every test runs the real binary after Debian's reference plugins in namespaces of its own
//! (`common::World`), with the real metadata server of `common::attack` listening only on
//! 169.254.169.254:80 and [fd00:ec2::254]:80 and answering "REAL". A test fails when REAL
//! answers an attacker (a reset, a timeout or the proxy's answer are all fine), or when an ADD
//! that must be refused is accepted. Each one also checks a positive control (an exempt pod
//! reaching REAL, the proxy answering, the pod reaching another host), so that it cannot pass
//! because the network is broken. Multi-part tests collect every finding and report them
//! together. Needs root; never skips; nothing is asserted about time.

mod common;

use common::attack::*;
use common::*;
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The MAC addresses `ns` has learnt for its gateways (by its earlier traffic), to pin later.
fn gateway_macs(ns: &Netns, gws: [IpAddr; 2]) -> Vec<(IpAddr, String)> {
    gws.into_iter()
        .map(|gw| {
            let mac = neighbour_mac(ns, gw)
                .unwrap_or_else(|| panic!("control: no neighbour entry for the gateway {gw}"));
            (gw, mac)
        })
        .collect()
}

/// Pins the gateways' neighbour entries in `ns` as permanent. A pod that sends from a stolen
/// address solicits its gateway from that address too, and the guard drops the solicitation:
/// without the pin, its packets would die queued in its own netns, never tested against the
/// guard, and a control sent behind them would die with them.
fn pin_gateways(ns: &Netns, macs: &[(IpAddr, String)]) {
    for (gw, mac) in macs {
        ns.ip(&format!(
            "neigh replace {gw} lladdr {mac} dev eth0 nud permanent"
        ));
    }
}

/// Runs an nft script (several lines) in `ns`.
fn nft_script(w: &World, ns: &Netns, name: &str, text: &str) {
    let path = w.dir().join(format!("{name}.nft"));
    std::fs::write(&path, text).expect("write nft script");
    ns.run(&["nft", "-f", path.to_str().expect("utf-8 path")]);
}

/// A prevResult (1.1.0) with the given addresses on one pod interface in `sandbox`.
fn prev_result(addrs: &[&str], sandbox: &str) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            { "name": "vethsec0" },
            { "name": "eth0", "sandbox": sandbox }
        ],
        "ips": addrs.iter().map(|a| json!({ "address": a, "interface": 1 })).collect::<Vec<_>>(),
        "dns": {}
    })
}

/// The error text of a CNI error (msg and details).
fn error_text(e: &CniError) -> String {
    format!("{} {}", e.msg, e.details)
}

// ---------------------------------------------------------------------------------------------
// 1. Address theft
// ---------------------------------------------------------------------------------------------

/// The thief takes the exempt pod's addresses (and, with `steal_mac`, its MAC address), makes the
/// node's neighbour entries point at itself, and talks to the metadata addresses from them.
fn address_theft(w: &World, chain: &Chain, steal_mac: bool) -> Findings {
    address_theft_by(w, chain, chain, steal_mac)
}

/// [`address_theft`] with the thief attached through `thief_chain`: the exempt pod's own
/// network, or another list on the same bridge that does not list natguard (a pod natguard
/// never saw: another conflist on the bridge, a pod from before the install).
fn address_theft_by(w: &World, chain: &Chain, thief_chain: &Chain, steal_mac: bool) -> Findings {
    let exempt = w.add_pod(chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(thief_chain, "thief", "default");
    control_metadata(&exempt, REAL, "exempt pod before the theft");
    let natguard_saw_it = thief_chain
        .plugins()
        .iter()
        .any(|p| p["type"] == "natguard");
    if natguard_saw_it {
        control_metadata(&thief, "proxy", "the thief before the theft");
    } else {
        for t in metas() {
            assert_eq!(
                http_get(&thief.ns, t),
                Outcome::Refused,
                "control: a pod natguard never saw -> http://{t}/ is reset"
            );
        }
    }

    let (gw4, gw6) = gateways(&thief);
    // Read before the MAC address changes, which flushes the thief's neighbour entries.
    let gw_macs = gateway_macs(&thief.ns, [gw4, gw6]);
    let own_mac = mac_of(&thief.ns, "eth0");
    if steal_mac {
        let mac = mac_of(&exempt.ns, "eth0");
        thief.ns.ip(&format!("link set eth0 address {mac}"));
    }
    claim_addresses(&thief, &exempt, (gw4, gw6));
    thief.ns.ip("neigh flush all");
    pin_gateways(&thief.ns, &gw_macs);
    announce(&w.h, &thief.ns, "eth0", exempt.v4, gw4, exempt.v6);

    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&thief.ns, t);
        f.not_real(
            &got,
            &format!("the default/ thief sending from the exempt pod's addresses -> http://{t}/"),
        );
    }
    // The exempt pod keeps its exemption and its replies.
    for t in metas() {
        let got = http_get(&exempt.ns, t);
        f.check(got == body(REAL), || {
            format!("after the theft the exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
    }
    // With the exempt pod's MAC, nothing of the thief's port crosses the bridge any more: the
    // control below needs the thief's own MAC back, after the stolen SYNs were sent.
    let restore = steal_mac.then_some(own_mac.as_str());
    stolen_segments_never_arrive(w, &exempt, &thief, restore, &mut f);
    f
}

/// Below the replies (which the node routes back to the exempt pod, not the thief): not one
/// SYN the thief sends from the exempt pod's addresses reaches the metadata host. The exempt
/// pod's own SYNs arriving first shows the counters see the flow; the thief's SYNs to the cloud
/// from its own addresses arriving last shows the stolen ones had their chance.
fn stolen_segments_never_arrive(
    w: &World,
    exempt: &Pod,
    thief: &Pod,
    restore_mac: Option<&str>,
    f: &mut Findings,
) {
    // SYNs only: the exempt pod answers the replies to the thief's SYNs with RSTs of its own.
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            syns_to_metadata(("stolen4", "stolen6"), (exempt.v4, exempt.v6)).as_slice(),
            &[
                (
                    "ctl4",
                    format!("ip saddr {} ip daddr {cloud4} tcp dport 80", thief.v4),
                ),
                (
                    "ctl6",
                    format!("ip6 saddr {} ip6 daddr {cloud6} tcp dport 80", thief.v6),
                ),
            ],
        ]
        .concat(),
    );
    const EACH: u32 = 3;
    let wait_for = |names: [&str; 2], what: &str| counters.wait(&names, u64::from(EACH), what);
    send_segments(&w.h, &exempt.ns, exempt.v4, META4, 80, EACH, &[0x02]);
    send_segments(&w.h, &exempt.ns, exempt.v6, META6, 80, EACH, &[0x02]);
    wait_for(
        ["stolen4", "stolen6"],
        "the exempt pod's own SYNs to the metadata addresses",
    );
    // The baseline is what the exempt pod's own SYNs gave; the thief must add nothing to it.
    std::thread::sleep(Duration::from_millis(200));
    let before = ["stolen4", "stolen6"].map(|n| counters.packets(n));
    send_segments(&w.h, &thief.ns, exempt.v4, META4, 80, EACH, &[0x02]);
    send_segments(&w.h, &thief.ns, exempt.v6, META6, 80, EACH, &[0x02]);
    if let Some(mac) = restore_mac {
        thief.ns.ip(&format!("link set eth0 address {mac}"));
        thief.ns.ip("neigh flush all");
    }
    send_segments(&w.h, &thief.ns, thief.v4, cloud4, 80, EACH, &[0x02]);
    send_segments(&w.h, &thief.ns, thief.v6, cloud6, 80, EACH, &[0x02]);
    wait_for(
        ["ctl4", "ctl6"],
        "the thief's SYNs to the cloud from its own addresses",
    );
    std::thread::sleep(Duration::from_millis(200));
    for (fam, before) in ["4", "6"].into_iter().zip(before) {
        let n = counters.packets(&format!("stolen{fam}")) - before;
        f.check(n == 0, || {
            format!("{n} packet(s) of the {EACH} SYN(s) the thief sent from the exempt pod's address reached the IPv{fam} metadata host")
        });
    }
}

#[test]
fn address_theft_on_a_bridge_never_reaches_real_metadata() {
    let w = real_world("sec-theft-br");
    let chain = w.chain(w.list("theft", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    address_theft(&w, &chain, false).finish("address theft on a bridge");
}

/// Beyond the address: the thief also takes the exempt pod's MAC address, so a filter that ties
/// an address to a MAC address is not enough on a bridge.
#[test]
fn address_and_mac_theft_on_a_bridge_never_reaches_real_metadata() {
    let w = real_world("sec-theft-mac");
    let chain = w.chain(w.list("theftmac", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    address_theft(&w, &chain, true).finish("address and MAC theft on a bridge");
}

/// The same on Debian's `ptp` plugin: a routed veth per pod, no bridge.
#[test]
fn address_theft_on_ptp_never_reaches_real_metadata() {
    let w = real_world("sec-theft-ptp");
    let ptp = w.ptp("ptp", 7);
    let list = json!({
        "cniVersion": "1.0.0",
        "name": "theftptp",
        "plugins": [ptp, exempt_cfg(&w, json!({}))]
    });
    let chain = w.chain(list);
    address_theft(&w, &chain, false).finish("address theft on ptp");
}

/// The same when the primary plugin reports only the pod's interface (Calico and AWS VPC CNI
/// style): natguard finds the pod's routed veth from the node's route to its address, and the
/// thief on its own routed veth still gets nothing from the exempt pod's exemption.
#[test]
fn address_theft_on_routed_veths_reported_without_host_side_never_reaches_real_metadata() {
    let w = real_world("sec-theft-rt");
    let ptp = w.ptp("rt", 8);
    let list = json!({
        "cniVersion": "1.0.0",
        "name": "theftrt",
        "plugins": [ptp, { "type": POD_IFACE_ONLY }, exempt_cfg(&w, json!({}))]
    });
    let chain = w.chain(list);
    let findings = address_theft(&w, &chain, false);
    // The route fallback, not a reported name, gave natguard the interfaces.
    for call in chain.calls_to("natguard") {
        if let Some(prev) = call.stdin.get("prevResult") {
            let ifaces = prev["interfaces"].as_array().unwrap();
            assert!(
                ifaces.iter().all(|i| i.get("sandbox").is_some()),
                "natguard was told a host-side interface: {prev}"
            );
        }
    }
    findings.finish("address theft on routed veths reported without host side");
}

// ---------------------------------------------------------------------------------------------
// 2. Another component's DNAT to the metadata server
// ---------------------------------------------------------------------------------------------

const CLUSTER4: &str = "10.96.0.50";
const CLUSTER6: &str = "fd00:96::50";

/// Another component's rules, installed in the node before the pods; `targets` are what the
/// pods connect to. The exempt pod reaching REAL through them is the control.
fn foreign_dnat(test: &str, setup: impl FnOnce(&World), targets: [SocketAddr; 2]) {
    let w = real_world(test);
    setup(&w);
    let chain = w.chain(w.list("fdnat", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "pod", "default");
    for t in targets {
        assert_eq!(
            http_get(&sys.ns, t),
            body(REAL),
            "control: the exempt pod -> http://{t}/ should reach REAL through the other component's DNAT"
        );
    }
    control_network(&pod, "default pod");
    let mut f = Findings::new();
    for t in targets {
        let got = http_get(&pod.ns, t);
        f.not_real(&got, &format!("the default pod -> http://{t}/"));
    }
    f.finish(test);
}

fn cluster_targets() -> [SocketAddr; 2] {
    [
        sa(CLUSTER4.parse().unwrap(), 80),
        sa(CLUSTER6.parse().unwrap(), 80),
    ]
}

#[test]
fn clusterip_dnat_of_iptables_nft_never_reaches_real_metadata() {
    foreign_dnat(
        "sec-dnat-ipt-nft",
        |w| {
            w.on_node(&format!("iptables-nft -t nat -A PREROUTING -d {CLUSTER4} -p tcp --dport 80 -j DNAT --to-destination {META4}:80"));
            w.on_node(&format!("ip6tables-nft -t nat -A PREROUTING -d {CLUSTER6} -p tcp --dport 80 -j DNAT --to-destination [{META6}]:80"));
        },
        cluster_targets(),
    );
}

#[test]
fn clusterip_dnat_of_iptables_legacy_never_reaches_real_metadata() {
    foreign_dnat(
        "sec-dnat-ipt-legacy",
        |w| {
            w.on_node(&format!("iptables-legacy -t nat -A PREROUTING -d {CLUSTER4} -p tcp --dport 80 -j DNAT --to-destination {META4}:80"));
            w.on_node(&format!("ip6tables-legacy -t nat -A PREROUTING -d {CLUSTER6} -p tcp --dport 80 -j DNAT --to-destination [{META6}]:80"));
        },
        cluster_targets(),
    );
}

#[test]
fn clusterip_dnat_of_a_native_nft_table_never_reaches_real_metadata() {
    foreign_dnat(
        "sec-dnat-nft",
        |w| {
            nft_script(
                w,
                &w.node,
                "svc",
                &format!(
                    "table ip svc {{\n  chain pre {{\n    type nat hook prerouting priority dstnat; policy accept;\n    ip daddr {CLUSTER4} tcp dport 80 dnat to {META4}:80\n  }}\n}}\n\
                     table ip6 svc {{\n  chain pre {{\n    type nat hook prerouting priority dstnat; policy accept;\n    ip6 daddr {CLUSTER6} tcp dport 80 dnat to [{META6}]:80\n  }}\n}}\n"
                ),
            );
        },
        cluster_targets(),
    );
}

/// Beyond the list: a component that DNATs the metadata address to itself (a no-op DNAT, as
/// agents that "pin" the metadata endpoint do) in a nat chain that runs before natguard's. The
/// first NAT binding of a connection wins, so natguard's DNAT to the proxy never happens.
#[test]
fn earlier_identity_dnat_of_the_metadata_address_never_reaches_real_metadata() {
    foreign_dnat(
        "sec-dnat-identity",
        |w| {
            nft_script(
                w,
                &w.node,
                "pin",
                &format!(
                    "table ip pin {{\n  chain pre {{\n    type nat hook prerouting priority dstnat - 50; policy accept;\n    ip daddr {META4} tcp dport 80 dnat to {META4}:80\n  }}\n}}\n\
                     table ip6 pin {{\n  chain pre {{\n    type nat hook prerouting priority dstnat - 50; policy accept;\n    ip6 daddr {META6} tcp dport 80 dnat to [{META6}]:80\n  }}\n}}\n"
                ),
            );
        },
        metas(),
    );
}

/// Beyond the list: another component writes packet and conntrack marks on everything (all bits
/// set, then all cleared) at several points of prerouting and forward, before and after where a
/// metadata policy would run. A policy that relies on marks must not lose to a component that
/// owns them (kube-proxy, Calico and Cilium all write mark bits): natguard's exemption asks for
/// its own value within its two bits, which neither all bits set nor all clear is, so the
/// exemption is then lost (the exempt pod is reset too: fail closed), never given to a pod that
/// claims the exempt pod's address. Without the writer, the exempt pod has its exemption back.
#[test]
fn foreign_marks_never_expose_real_metadata() {
    let w = real_world("sec-marks");
    let chain = w.chain(w.list("marks", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "pod", "default");
    let thief = w.add_pod(&chain, "thief", "default");
    let (gw4, gw6) = gateways(&thief);
    // The thief's gateways, pinned: the node answers no ARP claiming the exempt address.
    control_network(&thief, "the thief");
    let gw_macs = gateway_macs(&thief.ns, [gw4, gw6]);
    pin_gateways(&thief.ns, &gw_macs);
    claim_addresses(&thief, &sys, (gw4, gw6));
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &syns_to_metadata(("stolen4", "stolen6"), (sys.v4, sys.v6)),
    );
    let mut f = Findings::new();
    for value in ["0xffffffff", "0x00000000"] {
        let mut text = String::from("table inet marker {\n");
        for (i, (hook, prio)) in [
            ("prerouting", "-400"),
            ("prerouting", "-300"),
            ("prerouting", "-150"),
            ("prerouting", "-105"),
            ("prerouting", "-95"),
            ("prerouting", "0"),
            ("forward", "-200"),
            ("forward", "-5"),
            ("input", "-200"),
        ]
        .iter()
        .enumerate()
        {
            text.push_str(&format!(
                "  chain c{i} {{\n    type filter hook {hook} priority {prio}; policy accept;\n    meta mark set {value}\n    ct mark set {value}\n  }}\n"
            ));
        }
        text.push_str("}\n");
        nft_script(&w, &w.node, "marker", &text);
        control_network(&pod, &format!("default pod, marks {value}"));
        for t in metas() {
            for (who, p) in [("the default pod", &pod), ("the exempt pod", &sys)] {
                let got = http_get(&p.ns, t);
                f.not_real(
                    &got,
                    &format!("{who} with foreign marks {value} -> http://{t}/"),
                );
            }
        }
        // Counted from here: the exempt pod's own SYNs (refused above, answered after the
        // writer goes) are not the thief's.
        let base = [counters.packets("stolen4"), counters.packets("stolen6")];
        send_segments(&w.h, &thief.ns, sys.v4, META4, 80, 3, &[0x02]);
        send_segments(&w.h, &thief.ns, sys.v6, META6, 80, 3, &[0x02]);
        std::thread::sleep(Duration::from_millis(300));
        for (i, name) in ["stolen4", "stolen6"].into_iter().enumerate() {
            let n = counters.packets(name) - base[i];
            f.check(n == 0, || {
                format!("{n} SYN(s) of a pod claiming the exempt pod's address, with foreign marks {value} on everything, reached the metadata host ({name})")
            });
        }
        w.on_node("nft delete table inet marker");
        control_metadata(&sys, REAL, &format!("exempt pod after the marks {value}"));
    }
    f.finish("foreign marks");
}

/// Beyond the list: a node-level transparent egress proxy (a nat chain that runs before
/// natguard's REDIRECTs the pods' port-80 TCP to a local relay, which connects to each
/// connection's original destination). The first NAT binding wins, so natguard's DNAT never
/// happens and the relay fetches from REAL on the pod's behalf.
#[test]
fn transparent_egress_proxy_on_the_node_never_relays_to_real_metadata() {
    let w = real_world("sec-tproxy");
    start_transparent_relay(&w.h, &w.node, 15001);
    nft_script(
        &w,
        &w.node,
        "egress",
        &format!(
            "table ip egress {{\n  chain pre {{\n    type nat hook prerouting priority dstnat - 20; policy accept;\n    ip saddr {} tcp dport 80 redirect to :15001\n  }}\n}}\n\
             table ip6 egress {{\n  chain pre {{\n    type nat hook prerouting priority dstnat - 20; policy accept;\n    ip6 saddr {} tcp dport 80 redirect to :15001\n  }}\n}}\n",
            pod_subnet4(0),
            pod_subnet6(0)
        ),
    );
    let chain = w.chain(w.list("egress", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&sys, REAL, "exempt pod through the egress proxy");
    control_network(&pod, "default pod");
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&pod.ns, t);
        f.not_real(
            &got,
            &format!("the default pod through the node's egress proxy -> http://{t}/"),
        );
    }
    f.finish("transparent egress proxy");
}

// ---------------------------------------------------------------------------------------------
// 3. Untracked traffic
// ---------------------------------------------------------------------------------------------

/// (a) Another component exempts the pod network from connection tracking (`setup`, run in the
/// node before the pods exist).
fn notrack(test: &str, setup: impl FnOnce(&World)) {
    let w = real_world(test);
    setup(&w);
    let chain = w.chain(w.list("notrack", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&sys, REAL, "exempt pod, untracked");
    control_network(&pod, "default pod, untracked");
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&pod.ns, t);
        f.not_real(&got, &format!("the untracked default pod -> http://{t}/"));
    }
    f.finish(test);
}

#[test]
fn notrack_for_pod_sources_in_a_raw_priority_nft_chain_never_reaches_real_metadata() {
    notrack("sec-notrack-nft", |w| {
        nft_script(
            w,
            &w.node,
            "raw0",
            &format!(
                "table ip raw0 {{\n  chain pre {{\n    type filter hook prerouting priority raw; policy accept;\n    ip saddr {} notrack\n  }}\n}}\n\
                 table ip6 raw0 {{\n  chain pre {{\n    type filter hook prerouting priority raw; policy accept;\n    ip6 saddr {} notrack\n  }}\n}}\n",
                pod_subnet4(0),
                pod_subnet6(0)
            ),
        );
    });
}

/// The same NOTRACK from iptables-legacy's raw table.
#[test]
fn notrack_for_pod_sources_in_iptables_legacy_raw_never_reaches_real_metadata() {
    notrack("sec-notrack-legacy", |w| {
        w.on_node(&format!(
            "iptables-legacy -t raw -A PREROUTING -s {} -j CT --notrack",
            pod_subnet4(0)
        ));
        w.on_node(&format!(
            "ip6tables-legacy -t raw -A PREROUTING -s {} -j CT --notrack",
            pod_subnet6(0)
        ));
    });
}

/// (b) With `nf_conntrack_tcp_loose=0` in the node, a flow whose conntrack entry natguard
/// deleted is no longer tracked at all: a keep-alive connection opened before natguard's ADD
/// must not keep talking to REAL afterwards.
#[test]
fn keepalive_from_before_add_with_tcp_loose_off_never_reaches_real_metadata() {
    let w = real_world("sec-loose");
    w.node.sysctl("net.netfilter.nf_conntrack_tcp_loose", "0");
    // A conntrack user on the node, as on any node with kube-proxy (it matches nothing here).
    w.on_node("iptables-nft -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE");
    w.on_node("ip6tables-nft -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE");

    // The primary plugin attaches the pod; natguard's ADD comes later.
    let ng = w.natguard(json!({}));
    let plain = w.chain(w.list("loose", "1.1.0", 0, None));
    let pod = w.add_pod(&plain, "pod", "default");
    let mut conns: Vec<KeepAlive> = metas()
        .into_iter()
        .map(|t| KeepAlive::open(&pod.ns, t).unwrap_or_else(|e| panic!("connect to {t}: {e}")))
        .collect();
    for c in conns.iter_mut() {
        for _ in 0..2 {
            let got = c.get();
            assert_eq!(
                got,
                body(REAL),
                "control: before natguard, {} -> {} is answered by REAL over one connection",
                c.local,
                c.target
            );
        }
    }

    let full = w.chain(w.list("loose", "1.1.0", 0, Some(ng.clone())));
    let conf = natguard_conf(&ng, "loose", "1.1.0", Some(&pod.result));
    natguard_verb(&full, "ADD", &conf, &pod.att).unwrap_or_else(|e| panic!("natguard ADD: {e}"));

    let mut f = Findings::new();
    for c in conns.iter_mut() {
        for i in 1..=5 {
            let got = c.get();
            f.not_real(
                &got,
                &format!(
                    "request {i} after natguard's ADD on the keep-alive connection {} -> {}",
                    c.local, c.target
                ),
            );
            if !matches!(got, Outcome::Body(_)) {
                break;
            }
        }
    }
    // Control: a new connection is intercepted.
    for t in metas() {
        let got = http_get(&pod.ns, t);
        f.check(got == body("proxy"), || {
            format!("control: a new connection {t} after ADD got {got:?}, not the proxy")
        });
    }
    f.finish("keep-alive across ADD with tcp_loose=0");
}

/// (c) Segments with flag combinations that connection tracking does not track (SYN+FIN, FIN,
/// NULL, Xmas), a bare ACK and a SYN, from a default pod to both metadata addresses: nothing from
/// the pod may arrive at the metadata host. SYNs from the same pod to another address of the
/// cloud are the control that the sender and the counters work.
#[test]
fn crafted_tcp_segments_never_reach_the_metadata_host() {
    let w = real_world("sec-segments");
    let chain = w.chain(w.list("segs", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&pod, "proxy", "default pod");
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let combos: [(&str, u8); 6] = [
        ("synfin", 0x03),
        ("fin", 0x01),
        ("null", 0x00),
        ("xmas", 0x29),
        ("ack", 0x10),
        ("syn", 0x02),
    ];
    let mut rules: Vec<(String, String)> = Vec::new();
    for (name, flags) in combos {
        rules.push((
            format!("m4{name}"),
            format!(
                "ip saddr {} ip daddr {META4} tcp dport 80 tcp flags == {flags:#04x}",
                pod.v4
            ),
        ));
        rules.push((
            format!("m6{name}"),
            format!(
                "ip6 saddr {} ip6 daddr {META6} tcp dport 80 tcp flags == {flags:#04x}",
                pod.v6
            ),
        ));
    }
    rules.push((
        "ctl4".into(),
        format!("ip saddr {} ip daddr {cloud4} tcp dport 80", pod.v4),
    ));
    rules.push((
        "ctl6".into(),
        format!("ip6 saddr {} ip6 daddr {cloud6} tcp dport 80", pod.v6),
    ));
    let refs: Vec<(&str, String)> = rules.iter().map(|(n, m)| (n.as_str(), m.clone())).collect();
    let counters = Counters::install(&w.h, &w.cloud, &refs);

    let flags: Vec<u8> = combos.iter().map(|(_, f)| *f).collect();
    const EACH: u32 = 3;
    send_segments(&w.h, &pod.ns, pod.v4, META4, 80, EACH, &flags);
    send_segments(&w.h, &pod.ns, pod.v6, META6, 80, EACH, &flags);
    // The control goes last: once it has arrived, so has everything sent before it.
    send_segments(&w.h, &pod.ns, pod.v4, cloud4, 80, EACH, &[0x02]);
    send_segments(&w.h, &pod.ns, pod.v6, cloud6, 80, EACH, &[0x02]);
    counters.wait(
        &["ctl4", "ctl6"],
        u64::from(EACH),
        &format!("the SYNs from the pod to {cloud4}:80 / [{cloud6}]:80"),
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut f = Findings::new();
    for (name, flags) in combos {
        for fam in ["4", "6"] {
            let n = counters.packets(&format!("m{fam}{name}"));
            f.check(n == 0, || {
                format!(
                    "{n} of {EACH} {name} segment(s) (flags {flags:#04x}) from the default pod reached the IPv{fam} metadata host"
                )
            });
        }
    }
    f.finish("crafted TCP segments");
}

/// Beyond the list: the same kinds of segments (a SYN included), each split into two fragments
/// so that the first carries only the ports and the sequence number and the second the flags.
/// Nothing from the pod may arrive at the metadata host (counted per packet, before any
/// reassembly there); the same fragmented SYNs to another address of the cloud are the control.
/// An IPv6 first fragment without the whole TCP header is not reassembled by the node's
/// connection tracking but passed on as it is, untracked, so even a SYN crosses the node.
#[test]
fn fragmented_tcp_segments_never_reach_the_metadata_host() {
    let w = real_world("sec-fragments");
    let chain = w.chain(w.list("frags", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&pod, "proxy", "default pod");
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            ("meta4", format!("ip saddr {} ip daddr {META4}", pod.v4)),
            ("meta6", format!("ip6 saddr {} ip6 daddr {META6}", pod.v6)),
            ("ctl4", format!("ip saddr {} ip daddr {cloud4}", pod.v4)),
            ("ctl6", format!("ip6 saddr {} ip6 daddr {cloud6}", pod.v6)),
        ],
    );
    // SYN, SYN+FIN, FIN, NULL, Xmas, bare ACK.
    let flags = [0x02, 0x03, 0x01, 0x00, 0x29, 0x10];
    const EACH: u32 = 2;
    send_fragmented_segments(&w.h, &pod.ns, pod.v4, META4, 80, EACH, &flags);
    send_fragmented_segments(&w.h, &pod.ns, pod.v6, META6, 80, EACH, &flags);
    send_fragmented_segments(&w.h, &pod.ns, pod.v4, cloud4, 80, EACH, &[0x02]);
    send_fragmented_segments(&w.h, &pod.ns, pod.v6, cloud6, 80, EACH, &[0x02]);
    counters.wait(
        &["ctl4", "ctl6"],
        u64::from(EACH),
        &format!("the fragmented SYNs from the pod to {cloud4} / {cloud6}"),
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut f = Findings::new();
    for (name, meta) in [("meta4", META4), ("meta6", META6)] {
        let n = counters.packets(name);
        f.check(n == 0, || {
            format!("{n} packet(s) of the default pod's fragmented segments reached the metadata host {meta}")
        });
    }
    f.finish("fragmented TCP segments");
}

/// Beyond the list: IP options and IPv6 extension headers (hop-by-hop, destination options, both)
/// on every segment of a kernel TCP connection. The exempt pod with the same headers reaching
/// REAL (and the headers counted at the cloud) is the control that they cross the network.
#[test]
fn ip_options_and_ipv6_extension_headers_never_reach_real_metadata() {
    let w = real_world("sec-exthdr");
    let chain = w.chain(w.list("exthdr", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "pod", "default");
    let cases: [(SocketAddr, &[&str]); 4] = [
        (sa(META4, 80), &["ipopts"]),
        (sa(META6, 80), &["hopopts"]),
        (sa(META6, 80), &["dstopts"]),
        (sa(META6, 80), &["hopopts", "dstopts"]),
    ];
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            ("seenrr", format!("ip saddr {} ip option rr exists", sys.v4)),
            ("seenhbh", format!("ip6 saddr {} exthdr hbh exists", sys.v6)),
            ("seendst", format!("ip6 saddr {} exthdr dst exists", sys.v6)),
        ],
    );
    for (t, kinds) in cases {
        let got = http_get_with_headers(&w.h, &sys.ns, t, kinds);
        assert_eq!(
            got,
            body(REAL),
            "control: the exempt pod -> http://{t}/ with {kinds:?} should reach REAL"
        );
    }
    for name in ["seenrr", "seenhbh", "seendst"] {
        assert!(
            counters.packets(name) > 0,
            "control: no segment of the exempt pod with the {name} header arrived at the cloud"
        );
    }
    let mut f = Findings::new();
    for (t, kinds) in cases {
        let got = http_get_with_headers(&w.h, &pod.ns, t, kinds);
        f.not_real(
            &got,
            &format!("the default pod -> http://{t}/ with {kinds:?}"),
        );
    }
    f.finish("IP options and IPv6 extension headers");
}

// ---------------------------------------------------------------------------------------------
// 4. Stale exemption
// ---------------------------------------------------------------------------------------------

/// An exempt pod's netns vanishes without a DEL (the node crashed); a default pod gets the same
/// addresses. In deny mode, the default pod must not inherit the exemption, and its CHECK passes.
#[test]
fn stale_exemption_of_a_vanished_pod_is_not_inherited() {
    let w = real_world("sec-stale");
    let bridge = json!({
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "static",
            "addresses": [
                { "address": "10.244.0.77/24", "gateway": "10.244.0.1" },
                { "address": "fd00:10:244::77/64", "gateway": "fd00:10:244::1" }
            ],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
        }
    });
    let ng = exempt_cfg(&w, json!({ "metadata": { "mode": "deny" } }));
    let chain = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "stale",
        "plugins": [bridge, ng]
    }));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    control_metadata(&sys, REAL, "exempt pod in deny mode");
    // The node crashes: the netns is gone, no DEL ever ran.
    w.h.delete_netns(&sys.ns);

    let web = w.add_pod(&chain, "web", "default");
    assert_eq!(
        web.ips(),
        sys.ips(),
        "the static IPAM should give the same addresses"
    );
    control_network(&web, "the new default pod");
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&web.ns, t);
        f.not_real(
            &got,
            &format!("the default pod that reused a vanished exempt pod's address -> http://{t}/"),
        );
    }
    if let Err(e) = chain.check(&web.att) {
        f.check(false, || format!("CHECK of the default pod failed: {e}"));
    }
    f.finish("stale exemption");
}

/// Beyond the list: the same stale exemption, used by a pod that is already running. An exempt
/// pod's netns vanishes without a DEL; no new pod gets its address, but a running default pod on
/// the same bridge puts the address on its own interface (nobody else answers for it now).
#[test]
fn stale_exemption_of_a_vanished_pod_is_not_usable_by_a_neighbour() {
    let w = real_world("sec-stale-steal");
    let chain = w.chain(w.list(
        "stalesteal",
        "1.1.0",
        0,
        Some(exempt_cfg(&w, json!({ "metadata": { "mode": "deny" } }))),
    ));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&chain, "thief", "default");
    control_metadata(&sys, REAL, "exempt pod in deny mode");
    for t in metas() {
        assert_eq!(
            http_get(&thief.ns, t),
            Outcome::Refused,
            "control: the default pod -> http://{t}/ is refused in deny mode"
        );
    }
    w.h.delete_netns(&sys.ns);

    let (gw4, gw6) = gateways(&thief);
    claim_addresses(&thief, &sys, (gw4, gw6));
    let gw_macs = gateway_macs(&thief.ns, [gw4, gw6]);
    thief.ns.ip("neigh flush all");
    pin_gateways(&thief.ns, &gw_macs);
    announce(&w.h, &thief.ns, "eth0", sys.v4, gw4, sys.v6);
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&thief.ns, t);
        f.not_real(
            &got,
            &format!(
                "the default pod sending from a vanished exempt pod's addresses -> http://{t}/"
            ),
        );
    }
    // Control: a new exempt pod still reaches REAL.
    let sys2 = w.add_pod(&chain, "sys2", EXEMPT_NS);
    for t in metas() {
        let got = http_get(&sys2.ns, t);
        f.check(got == body(REAL), || {
            format!("control: a new exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
    }
    f.finish("stale exemption used by a neighbour");
}

// ---------------------------------------------------------------------------------------------
// 5. Two networks; prevResult prefixes
// ---------------------------------------------------------------------------------------------

/// A bridge + host-local entry with explicit ranges.
/// Issue of a shared bridge: a pod natguard never saw (another conflist on the exempt pod's
/// bridge) claims the exempt pod's addresses (ARP, neighbour advertisement, source) and opens
/// metadata TCP from them: it never reaches the REAL server, and the exempt pod keeps its own.
#[test]
fn address_theft_by_a_pod_natguard_never_saw_on_the_same_bridge_never_reaches_real_metadata() {
    theft_by_a_never_seen_pod("sec-theft-unseen", false);
}

/// ... and with the exempt pod's MAC too.
#[test]
fn address_and_mac_theft_by_a_pod_natguard_never_saw_never_reaches_real_metadata() {
    theft_by_a_never_seen_pod("sec-theft-unseen-mac", true);
}

fn theft_by_a_never_seen_pod(test: &str, steal_mac: bool) {
    let w = real_world(test);
    let chain = w.chain(w.list("theftns", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let unguarded = unguarded_on_cni0(&w);
    address_theft_by(&w, &chain, &unguarded, steal_mac).finish(&format!(
        "{test}: theft by a pod natguard never saw on the same bridge"
    ));
}

/// `interfaces` is optional in CNI: an exempt pod whose primary reports none is pinned to its
/// port all the same (natguard finds the port from the kernel), so another pod that claims its
/// addresses never reaches the REAL server.
#[test]
fn an_exempt_pod_without_interfaces_in_its_result_is_pinned_to_its_port() {
    let w = real_world("sec-noifs");
    let mut list = w.list("noifs", "1.1.0", 0, Some(exempt_cfg(&w, json!({}))));
    list["plugins"]
        .as_array_mut()
        .unwrap()
        .insert(1, json!({ "type": POD_IFACE_ONLY, "dropAll": true }));
    let chain = w.chain(list);
    let f = address_theft(&w, &chain, false);
    let marked = w.node.run(&["nft", "list", "table", "netdev", "natguard"]);
    assert!(
        marked.contains("hook ingress device \"veth"),
        "the exempt pod's port marks its frames: {marked}"
    );
    f.finish("address theft of an exempt pod whose result lists no interfaces");
}

/// Every exempt pod's own veth marks its frames (one netdev chain each), and nothing else does:
/// no chain for a pod that is not exempt, each exempt pod's chain created in the batch of its
/// ADD and deleted with its DEL, and no bridge table at all (a bridged frame pays for no
/// natguard chain of the bridge family). Someone else deleting the chain, or putting the netdev
/// table to sleep, takes the exemption away (fail closed: its metadata TCP is reset) and is a
/// failed CHECK naming the chain, and the next ADD puts it back. A thief on the bridge of an
/// exempt pod added afterwards never reaches the REAL server with its identity.
#[test]
fn an_exempt_pods_veth_marks_its_frames_from_its_add_to_its_del() {
    let w = real_world("sec-veth");
    let chain = w.chain(w.list("vethns", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let _web = w.add_pod(&chain, "web", "default");
    assert!(
        veth_chains(&w).is_empty(),
        "a veth chain without an exempt pod: {:?}",
        veth_chains(&w)
    );
    let first = w.add_pod(&chain, "sys1", EXEMPT_NS);
    let veth = match veth_chains(&w).as_slice() {
        [one] => one.clone(),
        other => panic!("one exempt pod, veth chains {other:?}"),
    };
    let tables = w.on_node("nft list tables");
    assert!(
        !tables.contains("bridge natguard"),
        "a bridge table: {tables}"
    );
    control_metadata(&first, REAL, "the exempt pod");
    let tampers: [String; 2] = [
        format!("nft delete chain netdev natguard {veth}"),
        "nft add table netdev natguard { flags dormant ; }".to_string(),
    ];
    for (i, tamper) in tampers.iter().enumerate() {
        w.on_node(tamper);
        for t in metas() {
            assert_eq!(
                http_get(&first.ns, t),
                Outcome::Refused,
                "{tamper}: the exempt pod still reaches http://{t}/ without its mark"
            );
        }
        let e = chain
            .check(&first.att)
            .expect_err("CHECK passes although the exempt pod's frames are not marked");
        assert!(
            e.to_string().contains(&veth) || e.to_string().contains("dormant"),
            "{tamper}: {e}"
        );
        let _web = w.add_pod(&chain, &format!("web{}", i + 2), "default");
        assert_eq!(
            veth_chains(&w),
            std::slice::from_ref(&veth),
            "{tamper}: after the next ADD"
        );
        chain
            .check(&first.att)
            .unwrap_or_else(|e| panic!("{tamper}: CHECK after the ADD that restored it: {e}"));
        control_metadata(&first, REAL, "the exempt pod after the next ADD");
    }
    chain.del(&first.att).expect("DEL of the first exempt pod");
    assert!(
        veth_chains(&w).is_empty(),
        "after the DEL: {:?}",
        veth_chains(&w)
    );
    let f = address_theft(&w, &chain, false);
    assert_eq!(veth_chains(&w).len(), 1);
    f.finish("address theft of an exempt pod added after the first one left");
}

/// An exempt pod on ptp: a pod on a bridge (natguard's, and one natguard never saw) that claims
/// its addresses in untagged, priority-tagged and 802.1ad frames never reaches the REAL server:
/// whatever the kernel does with the tags, the claim enters the IP layer on the bridge, where
/// no exemption is keyed, and it never crossed the exempt pod's veth.
#[test]
fn claims_from_a_bridge_of_an_exempt_pod_on_ptp_never_reach_real_metadata() {
    let w = real_world("sec-asleep");
    let routed = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "asleeprt",
        "plugins": [w.ptp("asleeprt", 8), exempt_cfg(&w, json!({}))]
    }));
    let exempt = w.add_pod(&routed, "sys", EXEMPT_NS);
    let bridged = w.chain(w.list("asleep", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let thieves = [
        w.add_pod(&bridged, "thief", "default"),
        w.add_pod(&unguarded_on_cni0(&w), "unseen", "default"),
    ];
    control_metadata(&exempt, REAL, "the exempt pod on ptp");
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &syns_to_metadata(("stolen4", "stolen6"), (exempt.v4, exempt.v6)),
    );
    const EACH: u64 = 3;
    let bridge_mac = mac_of(&w.node, "cni0");
    for thief in &thieves {
        let mac = mac_of(&thief.ns, "eth0");
        for tags in ["", "q", "adq"] {
            for (src, dst) in [(exempt.v4, META4), (exempt.v6, META6)] {
                let args = syn_frames(src, dst, EACH);
                send_frames(&w, thief, &mac, &bridge_mac, tags, &args);
            }
        }
    }
    // The control: the exempt pod's own SYNs arrive, so the counters count.
    for (src, dst) in [(exempt.v4, META4), (exempt.v6, META6)] {
        send_segments(&w.h, &exempt.ns, src, dst, 80, EACH as u32, &[0x02]);
    }
    counters.wait(&["stolen4"], EACH, "the exempt pod's own IPv4 SYNs");
    counters.wait(&["stolen6"], EACH, "the exempt pod's own IPv6 SYNs");
    std::thread::sleep(Duration::from_millis(200));
    let mut f = Findings::new();
    for name in ["stolen4", "stolen6"] {
        let n = counters.packets(name);
        f.check(n == EACH, || {
            format!("{name}: {n} SYNs from the exempt pod's address reached the metadata host, expected only its own {EACH}: a claim from the bridge got through")
        });
    }
    control_metadata(&exempt, REAL, "the exempt pod after the claims");
    f.finish("claims from a bridge of an exempt pod on ptp");
}

fn bridge_entry(w: &World, name: &str, bridge: &str, v4: Value, v6: Value) -> Value {
    json!({
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "dataDir": w.dir().join(format!("ipam-{name}")),
            "ranges": [[v4], [v6]],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
        }
    })
}

/// Network A's pods are in 10.250.0.0/23 and fd00:250::/56 (its ranges stop short of B's), network
/// B's in 10.250.1.0/24 and fd00:250:0:1::/64, inside A's prefixes; B exempts kube-system. B's exempt pod keeps reaching REAL after A adds a pod.
#[test]
fn overlapping_network_does_not_take_another_networks_exemption() {
    let w = real_world("sec-overlap");
    let a = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "neta",
        "plugins": [
            bridge_entry(&w, "neta", "cnia", json!({
                "subnet": "10.250.0.0/23",
                "rangeStart": "10.250.0.2",
                "rangeEnd": "10.250.0.254",
                "gateway": "10.250.0.1"
            }), json!({
                "subnet": "fd00:250::/56",
                "rangeStart": "fd00:250::2",
                "rangeEnd": "fd00:250::fe",
                "gateway": "fd00:250::1"
            })),
            w.natguard(json!({}))
        ]
    }));
    let b = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "netb",
        "plugins": [
            bridge_entry(&w, "netb", "cnib", json!({ "subnet": "10.250.1.0/24" }),
                json!({ "subnet": "fd00:250:0:1::/64" })),
            exempt_cfg(&w, json!({}))
        ]
    }));
    let sysb = w.add_pod(&b, "sysb", EXEMPT_NS);
    control_metadata(&sysb, REAL, "B's exempt pod before A has pods");
    let poda = w.add_pod(&a, "poda", "default");
    control_metadata(&poda, "proxy", "A's default pod");
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&sysb.ns, t);
        f.check(got == body(REAL), || {
            format!("after A's ADD, B's exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
    }
    f.finish("overlapping networks");
}

/// Two bridge networks whose pods share an address (overlapping ranges, an address picked on a
/// secondary network): network A's exempt pod has 10.251.0.10 / fd00:251::10 on bridge `cnia`,
/// network B's default pod the same addresses on bridge `cnib`, and a neighbour on `cnib`.
/// A's exempt pod keeps the REAL server (B's DNAT is only for what enters on B's pods' host
/// sides) and A's masquerade policy (A masquerades nothing, B everything: B's masquerade rules
/// match only connections marked as entering on B's host sides), and B's pod keeps its
/// layer-2 neighbour (the exempt pod's pins let every natguard pod's own address through from
/// its own port).
#[test]
fn overlapping_networks_never_act_on_each_others_pods() {
    let w = real_world("sec-overlap2");
    let ranges = |last: &str| {
        (
            json!({ "subnet": "10.251.0.0/24", "rangeStart": "10.251.0.10", "rangeEnd": format!("10.251.0.{last}"), "gateway": "10.251.0.1" }),
            json!({ "subnet": "fd00:251::/64", "rangeStart": "fd00:251::10", "rangeEnd": format!("fd00:251::{last}"), "gateway": "fd00:251::1" }),
        )
    };
    let (a4, a6) = ranges("10");
    let a = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "ova",
        "plugins": [
            bridge_entry(&w, "ova", "cnia", a4, a6),
            exempt_cfg(&w, json!({ "masquerade": { "enabled": false } }))
        ]
    }));
    let (b4, b6) = ranges("11");
    let b = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "ovb",
        "plugins": [bridge_entry(&w, "ovb", "cnib", b4, b6), w.natguard(json!({}))]
    }));
    let sys = w.add_pod(&a, "ovsys", EXEMPT_NS);
    control_metadata(&sys, REAL, "A's exempt pod before B has pods");
    let twin = w.add_pod(&b, "ovtwin", "default");
    let neighbour = w.add_pod(&b, "ovnb", "default");
    assert_eq!(
        twin.ips(),
        sys.ips(),
        "control: B's pod has A's exempt pod's addresses"
    );
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&sys.ns, t);
        f.check(got == body(REAL), || {
            format!("after B's ADD, A's exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
        let got = http_get(&twin.ns, t);
        f.not_real(
            &got,
            &format!("B's default pod with A's exempt addresses -> http://{t}/"),
        );
    }
    for (what, args) in [
        (
            "IPv4",
            vec!["busybox", "ping", "-c", "3", "-W", "2", "10.251.0.11"],
        ),
        (
            "IPv6",
            vec!["busybox", "ping6", "-c", "3", "-W", "2", "fd00:251::11"],
        ),
    ] {
        let ok = twin.ns.try_run(&args).is_ok();
        f.check(ok, || {
            format!("B's pod lost its {what} neighbour on its own bridge (pinged from the address A's exempt pod also has)")
        });
    }
    // A masquerades nothing: the remote host outside sees A's pod's own address.
    let seen = tcp_whoami(&sys.ns, sa(REMOTE_OUT4, WHOAMI_PORT));
    f.check(seen == Ok(sys.v4), || {
        format!("A's exempt pod -> {REMOTE_OUT4}: the remote host saw {seen:?}, not the pod's own {} (another network's masquerade policy applied)", sys.v4)
    });
    drop(neighbour);
    f.finish("overlapping networks");
}

/// What two attachments that share one identity on a bridge (the same address behind the same
/// bridge, which is all the IP layer sees) get from each target: `twin` holds `exempt`'s
/// addresses but not its exemption. SYNs to each target are counted where it listens: none of
/// the twin's (its connects and hand-made SYNs) and, while it lives, none of the
/// exempt pod's either may arrive there, since neither gets more than the stricter of the two.
/// Controls: the twin's SYNs to the cloud's other address arrive (its frames cross the bridge
/// and the node), and after `del` (the twin's DEL) the exempt pod reaches every target again.
fn shared_identity(
    w: &World,
    exempt: &Pod,
    twin: &Pod,
    targets: &[SocketAddr],
    del: impl FnOnce(),
) -> Findings {
    let syn = "tcp flags & (syn | ack | rst) == syn";
    let fam = |a: &IpAddr| if a.is_ipv4() { "ip" } else { "ip6" };
    let src = |a: &IpAddr| if a.is_ipv4() { twin.v4 } else { twin.v6 };
    let mut rules: Vec<(String, String)> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (a, f) = (t.ip(), fam(&t.ip()));
            // By destination alone: the shared address may be masqueraded on the way.
            let m = format!("{f} daddr {a} tcp dport {} {syn}", t.port());
            (format!("t{i}"), m)
        })
        .collect();
    for (name, dst) in [("cloud4", CLOUD4), ("cloud6", CLOUD6)] {
        let f = fam(&dst);
        let m = format!("{f} saddr {} {f} daddr {dst} {SYN}", src(&dst));
        rules.push((name.to_string(), m));
    }
    let named: Vec<(&str, String)> = rules.iter().map(|(n, m)| (n.as_str(), m.clone())).collect();
    let counters = Counters::install(&w.h, &w.cloud, &named);
    const EACH: u32 = 3;
    let mut f = Findings::new();
    for (who, pod) in [
        ("the twin", twin),
        ("the exempt pod, while the twin lives", exempt),
    ] {
        for t in targets {
            let got = http_get(&pod.ns, *t);
            println!("RESULT shared identity: {who} -> {t}: {got:?}");
            f.not_real(&got, &format!("{who} -> http://{t}/"));
            send_segments(&w.h, &pod.ns, src(&t.ip()), t.ip(), t.port(), EACH, &[0x02]);
        }
    }
    for dst in [CLOUD4, CLOUD6] {
        send_segments(&w.h, &twin.ns, src(&dst), dst, 80, EACH, &[0x02]);
    }
    counters.wait(
        &["cloud4", "cloud6"],
        EACH.into(),
        "the twin's SYNs to the cloud's other address",
    );
    std::thread::sleep(Duration::from_millis(200));
    for (i, t) in targets.iter().enumerate() {
        let n = counters.packets(&format!("t{i}"));
        f.check(n == 0, || {
            format!(
                "{n} SYNs from the shared address {} reached {t}",
                src(&t.ip())
            )
        });
    }
    del();
    w.node.ip("neigh flush all");
    for t in targets {
        let got = http_get(&exempt.ns, *t);
        f.check(is_real(&got), || {
            format!("control: after the twin's DEL the exempt pod -> http://{t}/ got {got:?}, not the endpoint")
        });
    }
    f
}

/// Two natguard networks share one bridge, each with its own host-local pool of the same
/// subnets (a second conflist, a Multus attachment). Network A exempts kube-system; network B is
/// `mode: deny`. B's pod is handed A's exempt pod's addresses: it never reaches the metadata
/// host, on either family ([`shared_identity`]).
#[test]
fn a_deny_networks_pod_with_an_exempt_pods_address_on_its_bridge_never_reaches_real_metadata() {
    let w = real_world("sec-shared");
    let pool = |name: &str| {
        bridge_entry(
            &w,
            name,
            "cnis",
            json!({ "subnet": "10.252.0.0/24", "rangeStart": "10.252.0.10", "rangeEnd": "10.252.0.20", "gateway": "10.252.0.1" }),
            json!({ "subnet": "fd00:252::/64", "rangeStart": "fd00:252::10", "rangeEnd": "fd00:252::20", "gateway": "fd00:252::1" }),
        )
    };
    let a = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "shra",
        "plugins": [pool("shra"), exempt_cfg(&w, json!({}))]
    }));
    let b = w.chain(json!({
        "cniVersion": "1.1.0",
        "name": "shrb",
        "plugins": [pool("shrb"), w.natguard(json!({ "metadata": { "mode": "deny" } }))]
    }));
    let sys = w.add_pod(&a, "shsys", EXEMPT_NS);
    control_metadata(&sys, REAL, "A's exempt pod before B has pods");
    let twin = w.add_pod(&b, "shtwin", "default");
    assert_eq!(
        twin.ips(),
        sys.ips(),
        "control: B's pod has A's exempt pod's addresses"
    );
    let f = shared_identity(&w, &sys, &twin, &metas(), || {
        b.del(&twin.att).expect("DEL of B's pod");
    });
    f.finish("a deny network's pod with an exempt pod's address on one bridge");
}

/// The azure preset, with IPv6 metadata as a `deny` endpoint too; a second attachment of the
/// same network (static IPAM, as Multus `ips` gives) holds the exempt pod's addresses. Its
/// traffic to the deny endpoints (the WireServer's TCP 80 and 32526, [fd00:ec2::254]:80) never
/// arrives, and its IMDS traffic is proxied ([`shared_identity`]).
#[test]
fn a_second_attachment_with_an_exempt_pods_address_never_reaches_a_deny_endpoint() {
    const WIRESERVER: &str = "168.63.129.16";
    let w = real_world("sec-twin-azure");
    let wire: IpAddr = WIRESERVER.parse().unwrap();
    w.cloud.addr("lo", &format!("{wire}/32"));
    w.node.route(&format!("{wire}/32"), "10.20.0.2");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/http_keepalive.py");
    for port in [80u16, 32526] {
        w.h.spawn(
            &w.cloud,
            &format!("wireserver-{port}"),
            &[
                "python3",
                "-u",
                script.to_str().unwrap(),
                &port.to_string(),
                REAL,
                WIRESERVER,
            ],
        );
    }
    wait_listening(&w.cloud, "tcp", 32526, 1);
    let ng = exempt_cfg(
        &w,
        json!({ "metadata": {
            "preset": "azure",
            "endpoints": [{ "address": "fd00:ec2::254", "ports": [80], "mode": "deny" }]
        } }),
    );
    let chain = w.chain(w.list("twinaz", "1.1.0", 0, Some(ng.clone())));
    let sys = w.add_pod(&chain, "azsys", EXEMPT_NS);
    let targets = [sa(wire, 80), sa(wire, 32526), sa(META6, 80)];
    for t in targets {
        assert_eq!(
            http_get(&sys.ns, t),
            body(REAL),
            "control: the exempt pod -> {t}"
        );
    }
    let mut bridge = w.bridge("twinaz", 0);
    bridge["ipam"] = json!({
        "type": "static",
        "addresses": [
            { "address": format!("{}/24", sys.v4), "gateway": "10.244.0.1" },
            { "address": format!("{}/64", sys.v6), "gateway": "fd00:10:244::1" }
        ],
        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
    });
    let second =
        w.chain(json!({ "cniVersion": "1.1.0", "name": "twinaz", "plugins": [bridge, ng] }));
    let twin = w.add_pod(&second, "aztwin", "default");
    assert_eq!(
        twin.ips(),
        sys.ips(),
        "control: the second attachment has the exempt pod's addresses"
    );
    let imds = http_get(&twin.ns, sa(META4, 80));
    let mut f = shared_identity(&w, &sys, &twin, &targets, || {
        second.del(&twin.att).expect("DEL of the second attachment");
    });
    f.check(imds == body("proxy"), || {
        format!("the second attachment -> IMDS got {imds:?}, not the proxy")
    });
    f.finish("a second attachment with an exempt pod's address, azure");
}

/// A prevResult address with prefix /0 is refused (code 7, naming the field and the value) and
/// changes nothing: a `mode: "off"` network's pod keeps reaching the metadata server.
#[test]
fn prefix_zero_prev_result_is_refused_and_leaves_other_networks_alone() {
    let w = real_world("sec-prefix0");
    let off = w.chain(w.list(
        "netoff",
        "1.1.0",
        3,
        Some(w.natguard(json!({ "metadata": { "mode": "off" } }))),
    ));
    let offpod = w.add_pod(&off, "offpod", "default");
    control_metadata(&offpod, REAL, "the off network's pod");
    let ng = w.natguard(json!({}));
    let a = w.chain(w.list("neta", "1.1.0", 0, Some(ng.clone())));
    let before = nft_ruleset(&w.node);

    let mut f = Findings::new();
    let victim = w.h.netns("zero");
    let att = Attachment::new("cid-zero", &victim).k8s("default", "zero");
    let prev = prev_result(&["10.250.0.5/0"], &victim.path());
    let conf = natguard_conf(&ng, "neta", "1.1.0", Some(&prev));
    match natguard_verb(&a, "ADD", &conf, &att) {
        Ok(r) => f.check(false, || {
            format!("ADD with prevResult address 10.250.0.5/0 was accepted: {r:?}")
        }),
        Err(e) => {
            let text = error_text(&e);
            f.check(
                e.code == Some(7)
                    && text.contains("prevResult.ips[0].address")
                    && text.contains("10.250.0.5/0"),
                || format!("ADD with 10.250.0.5/0: expected code 7 naming prevResult.ips[0].address and the value: {e}"),
            );
        }
    }
    for t in metas() {
        let got = http_get(&offpod.ns, t);
        f.check(got == body(REAL), || {
            format!("after the /0 ADD, the off network's pod -> http://{t}/ got {got:?}, not REAL as before")
        });
    }
    let after = nft_ruleset(&w.node);
    f.check(after == before, || {
        format!(
            "the /0 ADD changed the node's ruleset:\n{}",
            line_diff(&before, &after)
        )
    });
    f.finish("prefix /0");
}

// ---------------------------------------------------------------------------------------------
// 6. Network names whose shortened names collide
// ---------------------------------------------------------------------------------------------

// Two 43-byte network names whose shortened object names are the same: the same first 23
// bytes (what a long name keeps) and the same 64-bit FNV-1a hash over the whole name
// (0xfa5420cbd96a0bb4), so both map to `sec-collision-network~fa5420cbd96a0bb4`. Found by a
// parallel-rho search over `sec-collision-network-name-` followed by 16 hex digits (about
// 1.5e9 hashes).
const COLLIDE_P: &str = "sec-collision-network-name-b27fcd534a050c53";
const COLLIDE_O: &str = "sec-collision-network-name-70402edbff41581d";

/// Network P (proxy) has a pod; network O (mode off), whose long name shortens to exactly P's
/// object names, ADDs a pod. O's converge would overwrite P's chains, so O's ADD is refused
/// with code 7 naming both networks, and P's pod keeps its policy: it never reaches REAL and
/// is still answered by the proxy.
#[test]
fn colliding_long_network_names_never_expose_real_metadata() {
    assert_eq!(
        natguard::plan::fnv1a64(COLLIDE_P.as_bytes()),
        0xfa54_20cb_d96a_0bb4
    );
    assert_eq!(
        natguard::plan::fnv1a64(COLLIDE_P.as_bytes()),
        natguard::plan::fnv1a64(COLLIDE_O.as_bytes())
    );
    let (np, no) = (
        natguard::plan::NetNames::new(COLLIDE_P),
        natguard::plan::NetNames::new(COLLIDE_O),
    );
    assert_eq!(
        np.chain(natguard::plan::ChainKind::Dnat),
        no.chain(natguard::plan::ChainKind::Dnat),
        "the names must really collide"
    );
    let w = real_world("sec-collide");
    let p = w.chain(w.list(COLLIDE_P, "1.1.0", 0, Some(w.natguard(json!({})))));
    let o = w.chain(w.list(
        COLLIDE_O,
        "1.1.0",
        1,
        Some(w.natguard(json!({ "metadata": { "mode": "off" } }))),
    ));
    let ppod = w.add_pod(&p, "ppod", "default");
    control_metadata(&ppod, "proxy", "P's pod before O's ADD");
    let mut f = Findings::new();
    match w.try_add_pod(&o, "opod", "default") {
        Ok(_) => f.check(false, || {
            "O's ADD succeeded over P's object names; it must be refused with code 7".to_string()
        }),
        Err(e) => {
            let text = error_text(&e);
            f.check(
                e.code == Some(7) && text.contains(COLLIDE_P) && text.contains(COLLIDE_O),
                || format!("O's ADD was refused, but not with code 7 naming both networks: {e}"),
            );
        }
    }
    for t in metas() {
        let got = http_get(&ppod.ns, t);
        f.not_real(&got, &format!("P's pod after O's ADD -> http://{t}/"));
        f.check(got == body("proxy"), || {
            format!("P's pod after O's refused ADD -> http://{t}/ got {got:?}, not the proxy")
        });
    }
    f.finish("colliding network names");
}

// ---------------------------------------------------------------------------------------------
// 7. Many owners of one address
// ---------------------------------------------------------------------------------------------

/// Eight attachments (distinct container IDs, a live netns each) share one address. An owner
/// list holds seven: the second to seventh ADDs succeed, the eighth fails with code 11 (try
/// again) naming the address, and no live owner is dropped to make room. The newer ones are
/// deleted; the oldest, still running, keeps its policy: CHECK passes and its metadata
/// traffic is still sent to the proxy.
#[test]
fn oldest_of_eight_owners_of_one_address_keeps_its_policy() {
    let w = real_world("sec-owners");
    let ng = w.natguard(json!({}));
    let chain = w.chain(w.list("owners", "1.1.0", 0, Some(ng.clone())));
    let oldest = w.add_pod(&chain, "oldest", "default");
    control_metadata(&oldest, "proxy", "the oldest owner");

    let mut f = Findings::new();
    let mut newer = Vec::new();
    for i in 1..=7 {
        let ns = w.h.netns(&format!("own{i}"));
        let att = Attachment::new(&format!("cid-own{i}"), &ns).k8s("default", &format!("own{i}"));
        let mut prev = oldest.result.clone();
        for iface in prev["interfaces"].as_array_mut().expect("interfaces") {
            if iface.get("sandbox").is_some() {
                iface["sandbox"] = json!(ns.path());
            }
        }
        let conf = natguard_conf(&ng, "owners", "1.1.0", Some(&prev));
        let owners_before = i; // the oldest and owners 1..i-1
        match natguard_verb(&chain, "ADD", &conf, &att) {
            Ok(_) => f.check(owners_before < 7, || {
                format!("ADD of owner {i} succeeded: an eighth owner must be refused with code 11")
            }),
            Err(e) => {
                let text = error_text(&e);
                f.check(
                    owners_before == 7
                        && e.code == Some(11)
                        && (text.contains(&oldest.v4.to_string())
                            || text.contains(&oldest.v6.to_string())),
                    || {
                        format!(
                            "ADD of owner {i} ({owners_before} live owners before it) failed; only the eighth may, with code 11 naming the address: {e}"
                        )
                    },
                );
            }
        }
        newer.push((ns, att, conf));
    }
    for (_, att, conf) in newer.iter().rev() {
        if let Err(e) = natguard_verb(&chain, "DEL", conf, att) {
            f.check(false, || format!("DEL of {}: {e}", att.container_id));
        }
    }
    if let Err(e) = chain.check(&oldest.att) {
        f.check(false, || {
            format!("CHECK of the oldest owner after the seven newer were deleted: {e}")
        });
    }
    for t in metas() {
        let got = http_get(&oldest.ns, t);
        f.not_real(&got, &format!("the oldest owner -> http://{t}/"));
        f.check(got == body("proxy"), || {
            format!(
                "the oldest owner -> http://{t}/ got {got:?}, not the proxy: it lost its policy"
            )
        });
    }
    f.finish("eight owners");
}

// ---------------------------------------------------------------------------------------------
// 8. Addresses that are not a pod's
// ---------------------------------------------------------------------------------------------

/// ADD is refused (code 7, naming the field and the value, kernel unchanged) for prevResult
/// addresses no pod can have, and for proxy and metadata addresses that would undo the policy.
/// An IPv4 link-local pod address (as AWS VPC CNI's egress plugin assigns) stays accepted.
#[test]
fn addresses_that_are_not_a_pods_are_refused() {
    let w = World::new("sec-addrs");
    let ng = w.natguard(json!({}));
    let chain = w.chain(w.list("addrs", "1.1.0", 0, Some(ng.clone())));
    // A real pod first: the table exists and the bridge carries the gateway address.
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&pod, "proxy", "a real pod");
    let sandbox = w.h.netns("syn");
    let mut f = Findings::new();
    let mut n = 0;
    let mut refused =
        |f: &mut Findings, entry: &Value, addrs: &[&str], field: &str, value: &str| {
            n += 1;
            let att = Attachment::new(&format!("cid-bad{n}"), &sandbox).k8s("default", "bad");
            let prev = prev_result(addrs, &sandbox.path());
            let conf = natguard_conf(entry, "addrs", "1.1.0", Some(&prev));
            let before = nft_ruleset(&w.node);
            let what = format!("ADD with prevResult addresses {addrs:?}");
            match natguard_verb(&chain, "ADD", &conf, &att) {
                Ok(_) => f.check(false, || {
                    format!("{what}: accepted; expected code 7 naming {field} and {value}")
                }),
                Err(e) => {
                    let text = error_text(&e);
                    f.check(
                        e.code == Some(7) && text.contains(field) && text.contains(value),
                        || format!("{what}: expected code 7 naming {field} and {value}: {e}"),
                    );
                }
            }
            let after = nft_ruleset(&w.node);
            f.check(after == before, || {
                format!(
                    "{what}: the node's ruleset changed:\n{}",
                    line_diff(&before, &after)
                )
            });
            if after != before {
                // Undo what the accepted ADD installed, so the next case starts from the same state.
                let _ = natguard_verb(&chain, "DEL", &conf, &att);
            }
        };
    let good = "10.244.0.200/24";
    let bad = [
        "0.0.0.0/24",
        "127.0.0.1/8",
        "224.0.0.1/24",
        "255.255.255.255/32",
        "169.254.169.254/16",
        "fd00:ec2::254/64",
        "::ffff:10.251.0.9/128",
        "::1/128",
        "ff02::1/64",
        "10.244.0.201/0",
        "fd00:10:244::201/0",
        // The node's own addresses: its primary address and the bridge's gateway address.
        "11.0.0.1/24",
        "2001:db8:bb::1/64",
        "10.244.0.1/24",
    ];
    for b in bad {
        let value = if b.ends_with("/0") {
            b
        } else {
            b.split('/').next().unwrap()
        };
        refused(&mut f, &ng, &[good, b], "prevResult.ips[1].address", value);
    }
    // Configs that would undo the policy.
    let cfgs: [(Value, &str, &str); 3] = [
        (
            json!({ "metadata": { "proxyIPv4": "169.254.169.254" } }),
            "metadata.proxyIPv4",
            "169.254.169.254",
        ),
        (
            json!({ "metadata": { "proxyIPv4": "10.244.0.9" } }),
            "metadata.proxyIPv4",
            "10.244.0.9",
        ),
        (
            json!({ "metadata": { "addresses": ["::ffff:169.254.169.254"] } }),
            "metadata.addresses",
            "::ffff:169.254.169.254",
        ),
    ];
    for (patch, field, value) in cfgs {
        let mut entry = ng.clone();
        merge(&mut entry, &patch);
        refused(&mut f, &entry, &["10.244.0.202/24"], field, value);
    }

    // Accepted: an IPv4 link-local pod address.
    let att = Attachment::new("cid-ll", &sandbox).k8s("default", "ll");
    let prev = prev_result(&["169.254.172.5/22"], &sandbox.path());
    let conf = natguard_conf(&ng, "addrs", "1.1.0", Some(&prev));
    match natguard_verb(&chain, "ADD", &conf, &att) {
        Ok(_) => {
            let _ = natguard_verb(&chain, "DEL", &conf, &att);
        }
        Err(e) => f.check(false, || {
            format!("ADD with the link-local pod address 169.254.172.5/22 was refused: {e}")
        }),
    }
    f.finish("addresses that are not a pod's");
}

// ---------------------------------------------------------------------------------------------
// 9. Round 2: paths the guard never listed. The guard admits only exempt pods on their own
//    interface (and natguard's proxy, and the node itself); everything below must be reset or
//    dropped although no rule names the path it takes.
// ---------------------------------------------------------------------------------------------

/// The MAC the node's neighbour table holds for `addr`, if any.
fn node_neighbour(w: &World, addr: IpAddr) -> Option<String> {
    neighbour_mac(&w.node, addr)
}

/// A bridge network with natguard exempting [`EXEMPT_NS`]: an exempt pod and a default pod
/// (the thief) on it, the exempt pod's metadata answered by the real server (the control).
fn exempt_and_thief(test: &str, list: &str) -> (World, Pod, Pod) {
    let w = real_world(test);
    let chain = w.chain(w.list(list, "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&chain, "thief", "default");
    control_metadata(
        &exempt,
        REAL,
        &format!("exempt pod before the attack ({test})"),
    );
    (w, exempt, thief)
}

/// A default pod claims the exempt pod's addresses in frames with VLAN tags (one priority tag,
/// or 802.1ad outside 802.1Q): ARP and neighbour advertisements to move the node's neighbour
/// entries to its MAC, and TCP from the exempt addresses to the metadata host. The kernel
/// strips a priority tag before the IP layer, so a guard reading the untagged ethertype would
/// never see these frames. Not one SYN may reach the metadata host and the node's neighbour
/// entries must keep the exempt pod's MAC, while the thief's untagged SYNs from its own
/// addresses arrive (the control).
#[test]
fn vlan_tagged_claims_of_the_exempt_identity_never_reach_real_metadata() {
    let (w, exempt, thief) = exempt_and_thief("sec-vlan-tags", "vlantags");
    vlan_tagged_claims(&w, &exempt, &thief).finish("VLAN-tagged claims");
}

/// The same claims, priority-tagged, from a pod natguard never saw on the exempt pod's bridge
/// (another conflist on the bridge): a priority tag is dropped from every port, since the
/// kernel strips it before the IP layer.
#[test]
fn vlan_tagged_claims_from_a_pod_natguard_never_saw_never_reach_real_metadata() {
    let w = real_world("sec-vlan-unseen");
    let chain = w.chain(w.list("vlanns", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    control_metadata(&exempt, REAL, "exempt pod before the attack");
    let thief = w.add_pod(&unguarded_on_cni0(&w), "thief", "default");
    vlan_tagged_claims(&w, &exempt, &thief)
        .finish("VLAN-tagged claims from a pod natguard never saw");
}

fn vlan_tagged_claims(w: &World, exempt: &Pod, thief: &Pod) -> Findings {
    let exempt_mac = mac_of(&exempt.ns, "eth0");
    let thief_mac = mac_of(&thief.ns, "eth0");
    let bridge_mac = mac_of(&w.node, "cni0");
    let (gw4, _) = gateways(thief);
    // The node learns the exempt pod's neighbour entries from real traffic first.
    control_network(exempt, "exempt pod");
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let counters = Counters::install(&w.h, &w.cloud, &claim_counters(exempt, thief));
    let mut f = Findings::new();
    const EACH: u64 = 3;
    for tags in ["q", "adq"] {
        let s = |v: &[&str]| -> Vec<String> { v.iter().map(|x| x.to_string()).collect() };
        send_frames(
            w,
            thief,
            &thief_mac,
            "ff:ff:ff:ff:ff:ff",
            tags,
            &s(&["arp", &exempt.v4.to_string(), &exempt.v4.to_string()]),
        );
        send_frames(
            w,
            thief,
            &thief_mac,
            &bridge_mac,
            tags,
            &s(&["arp", &exempt.v4.to_string(), &gw4.to_string()]),
        );
        send_frames(
            w,
            thief,
            &thief_mac,
            "33:33:00:00:00:01",
            tags,
            &s(&["na", &exempt.v6.to_string()]),
        );
        for (src, dst) in [
            (exempt.v4, META4),
            (exempt.v6, META6),
            (thief.v4, cloud4),
            (thief.v6, cloud6),
        ] {
            send_frames(
                w,
                thief,
                &thief_mac,
                &bridge_mac,
                tags,
                &s(&[
                    "syn",
                    &src.to_string(),
                    &dst.to_string(),
                    "80",
                    &EACH.to_string(),
                ]),
            );
        }
    }
    // The control: the same SYNs from the thief's own addresses, untagged, arrive.
    for (src, dst) in [(thief.v4, cloud4), (thief.v6, cloud6)] {
        send_segments(&w.h, &thief.ns, src, dst, 80, EACH as u32, &[0x02]);
    }
    counters.wait(
        &["own4"],
        EACH,
        "the thief's untagged IPv4 SYNs to the cloud",
    );
    counters.wait(
        &["own6"],
        EACH,
        "the thief's untagged IPv6 SYNs to the cloud",
    );
    std::thread::sleep(Duration::from_millis(200));
    for name in ["stolen4", "stolen6"] {
        let n = counters.packets(name);
        f.check(n == 0, || format!("{n} tagged SYN(s) from the exempt pod's address reached the metadata host ({name})"));
    }
    // The tagged ones may arrive too (the kernel strips a priority tag): the thief's own.
    for name in ["own4", "own6"] {
        let n = counters.packets(name);
        f.check(n >= EACH, || {
            format!("{name}: {n} SYNs arrived, expected at least the {EACH} untagged ones")
        });
    }
    for a in exempt.ips() {
        let got = node_neighbour(w, a);
        f.check(got.as_deref() == Some(exempt_mac.as_str()), || {
            format!("the node's neighbour entry for the exempt pod's {a} is {got:?}, not the exempt pod's {exempt_mac}")
        });
    }
    control_metadata(exempt, REAL, "exempt pod after the claims");
    f
}

/// The link-local IPv6 address of `pod`'s eth0.
fn link_local_of(pod: &Pod) -> String {
    let out = pod.ns.ip("-j -6 addr show dev eth0 scope link");
    let v: Value = serde_json::from_str(&out).expect("ip -j addr");
    v[0]["addr_info"]
        .as_array()
        .and_then(|a| a.iter().find_map(|i| i["local"].as_str()))
        .unwrap_or_else(|| panic!("control: the pod has no link-local address: {out}"))
        .to_string()
}

/// Two exempt pods on one bridge, and the second claims the first's addresses: gratuitous ARP
/// and ARP with them as sender, neighbour advertisements for them (from them, and from its own
/// link-local address), TCP from them. Being exempt is the attachment's right, not a licence to
/// be another exempt attachment: the node's neighbour entries for the first pod must keep its
/// MAC (or the first pod's metadata answers would go to the second), and not one SYN that the
/// second sends from the first's addresses may reach the metadata host, while both keep their
/// own exemption.
#[test]
fn an_exempt_pod_claiming_another_exempt_pods_addresses_never_holds_its_identity() {
    let w = real_world("sec-exempt-twin");
    let chain = w.chain(w.list("twins", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let first = w.add_pod(&chain, "sys", EXEMPT_NS);
    let second = w.add_pod(&chain, "sys2", EXEMPT_NS);
    control_metadata(&first, REAL, "the first exempt pod before the claims");
    control_metadata(&second, REAL, "the second exempt pod before the claims");
    control_network(&first, "the first exempt pod");
    let first_mac = mac_of(&first.ns, "eth0");
    let second_mac = mac_of(&second.ns, "eth0");
    for a in first.ips() {
        assert_eq!(
            node_neighbour(&w, a).as_deref(),
            Some(first_mac.as_str()),
            "control: the node learnt the first pod's neighbour entry for {a} from its traffic"
        );
    }
    let (gw4, gw6) = gateways(&second);
    let gw_macs = gateway_macs(&second.ns, [gw4, gw6]);
    let link_local = link_local_of(&second);
    claim_addresses(&second, &first, (gw4, gw6));
    second.ns.ip("neigh flush all");
    pin_gateways(&second.ns, &gw_macs);
    announce(&w.h, &second.ns, "eth0", first.v4, gw4, first.v6);
    // An advertisement claims its target: from the second pod's link-local address, and from
    // its own global one (a source its veth does mark).
    for src in [link_local, second.v6.to_string()] {
        let na = vec!["na".to_string(), first.v6.to_string(), src];
        send_frames(&w, &second, &second_mac, "33:33:00:00:00:01", "", &na);
    }

    let mut f = Findings::new();
    stolen_segments_never_arrive(&w, &first, &second, None, &mut f);
    for a in first.ips() {
        let got = node_neighbour(&w, a);
        f.check(got.as_deref() == Some(first_mac.as_str()), || {
            format!("the node's neighbour entry for the first exempt pod's {a} is {got:?}, not its {first_mac} (the second is {second_mac})")
        });
    }
    for t in metas() {
        let got = http_get(&first.ns, t);
        f.check(got == body(REAL), || {
            format!("after the claims the first exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
    }
    // The second keeps its own exemption: the claimed addresses go, its own routes come back.
    second.ns.ip(&format!("addr del {}/32 dev eth0", first.v4));
    second
        .ns
        .ip(&format!("-6 addr del {}/128 dev eth0", first.v6));
    route_metadata_from(&second, (gw4, gw6), (second.v4, second.v6));
    for t in metas() {
        let got = http_get(&second.ns, t);
        f.check(got == body(REAL), || {
            format!("after its claims the second exempt pod -> http://{t}/ from its own addresses got {got:?}, not REAL")
        });
    }
    f.finish("an exempt pod claiming another exempt pod's addresses");
}

/// A neighbour advertisement comes from the sender's link-local address, not from the address
/// it advertises: a default pod advertises the exempt pod's IPv6 address (override) from its
/// own link-local address and its own MAC, untagged, the way a real neighbour would. The node's
/// neighbour entry must keep the exempt pod's MAC, so replies meant for the exempt pod never
/// reach the thief; a guard that lets ordinary-looking IPv6 from ordinary sources through
/// unexamined would miss it.
#[test]
fn a_neighbour_advertisement_from_a_link_local_source_never_moves_the_exempt_pods_entry() {
    let (w, exempt, thief) = exempt_and_thief("sec-na-ll", "nall");
    control_network(&exempt, "exempt pod");
    let exempt_mac = mac_of(&exempt.ns, "eth0");
    let thief_mac = mac_of(&thief.ns, "eth0");
    let link_local = link_local_of(&thief);
    assert_eq!(
        node_neighbour(&w, exempt.v6).as_deref(),
        Some(exempt_mac.as_str()),
        "control: the node learnt the exempt pod's IPv6 neighbour entry from its traffic"
    );
    let na = vec!["na".to_string(), exempt.v6.to_string(), link_local];
    send_frames(&w, &thief, &thief_mac, "33:33:00:00:00:01", "", &na);
    // The control that such frames move the node's entries at all: the same advertisement
    // for the thief's own address, with a made-up MAC, moves the thief's entry to that MAC.
    control_network(&thief, "the thief");
    const MADE_UP: &str = "02:00:5e:00:53:99";
    let own = vec!["na".to_string(), thief.v6.to_string(), na[2].clone()];
    let start = Instant::now();
    loop {
        send_frames(&w, &thief, MADE_UP, "33:33:00:00:00:01", "", &own);
        std::thread::sleep(Duration::from_millis(100));
        if node_neighbour(&w, thief.v6).as_deref() == Some(MADE_UP) {
            break;
        }
        assert!(
            start.elapsed() < deadline(COUNTER_WAIT),
            "control: the node never took the thief's advertisement of its own address ({:?})",
            node_neighbour(&w, thief.v6)
        );
    }
    let got = node_neighbour(&w, exempt.v6);
    assert_eq!(
        got.as_deref(),
        Some(exempt_mac.as_str()),
        "the node's neighbour entry for the exempt pod's {} moved to {got:?} (the thief is {thief_mac})",
        exempt.v6
    );
    control_metadata(&exempt, REAL, "exempt pod after the advertisement");
}

/// A default pod takes the exempt pod's MAC without claiming any address: the bridge must not
/// learn it on the thief's port, so nothing sent to the exempt pod (its metadata answers
/// included) reaches the thief.
#[test]
fn mac_theft_on_a_bridge_overhears_nothing_sent_to_the_exempt_pod() {
    let (w, exempt, thief) = exempt_and_thief("sec-mac-theft", "mactheft");
    let overheard = Counters::install(
        &w.h,
        &thief.ns,
        &[
            ("to_exempt4", format!("ip daddr {}", exempt.v4)),
            ("to_exempt6", format!("ip6 daddr {}", exempt.v6)),
        ],
    );
    let exempt_mac = mac_of(&exempt.ns, "eth0");
    let bridge_mac = mac_of(&w.node, "cni0");
    thief.ns.ip(&format!("link set eth0 address {exempt_mac}"));
    // Frames of any ethertype with the stolen MAC as source, from the thief's port.
    let s = |v: &[&str]| -> Vec<String> { v.iter().map(|x| x.to_string()).collect() };
    for _ in 0..3 {
        send_frames(
            &w,
            &thief,
            &exempt_mac,
            &bridge_mac,
            "",
            &s(&["syn", &thief.v4.to_string(), "10.20.0.2", "9", "2"]),
        );
    }
    let mut f = Findings::new();
    // The bridge still forwards the exempt pod's MAC to the exempt pod's port (nothing the
    // exempt pod sent since could have taught it back).
    let port = host_veth(&exempt);
    let fdb = w.node.run(&["bridge", "fdb", "show", "br", "cni0"]);
    let entry = fdb
        .lines()
        .find(|l| l.starts_with(&exempt_mac))
        .unwrap_or_else(|| panic!("no forwarding entry for {exempt_mac}:\n{fdb}"));
    f.check(entry.contains(&format!(" dev {port} ")), || {
        format!("after the MAC theft the bridge forwards {exempt_mac} as {entry:?}, not to the exempt pod's port {port}")
    });
    // The node sends to the exempt pod (from its bridge addresses); the exempt pod gets it.
    let (gw4, gw6) = gateways(&exempt);
    let received = Counters::install(
        &w.h,
        &exempt.ns,
        &[
            ("from_node4", format!("ip saddr {gw4} tcp dport 9")),
            ("from_node6", format!("ip6 saddr {gw6} tcp dport 9")),
        ],
    );
    send_segments(&w.h, &w.node, gw4, exempt.v4, 9, 3, &[0x02]);
    send_segments(&w.h, &w.node, gw6, exempt.v6, 9, 3, &[0x02]);
    received.wait(
        &["from_node4"],
        3,
        "the node's IPv4 segments at the exempt pod",
    );
    received.wait(
        &["from_node6"],
        3,
        "the node's IPv6 segments at the exempt pod",
    );
    for name in ["to_exempt4", "to_exempt6"] {
        let n = overheard.packets(name);
        f.check(n == 0, || format!("the thief with the exempt pod's MAC overheard {n} packet(s) sent to the exempt pod ({name})"));
    }
    for t in metas() {
        let got = http_get(&exempt.ns, t);
        f.check(got == body(REAL), || {
            format!("after the MAC theft the exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
    }
    f.finish("MAC theft on a bridge");
}

/// The node has a VXLAN device (flannel.1 style). A default pod wraps metadata TCP in VXLAN to
/// the node, with an inner source of its own choosing: the inner packet enters on the tunnel
/// device, from an address natguard has never seen, and must be reset like any other. The
/// control: the same inner SYNs to the cloud's own address arrive there.
#[test]
fn vxlan_decapsulated_metadata_tcp_never_reaches_the_metadata_host() {
    let w = real_world("sec-vxlan");
    let chain = w.chain(w.list("vxlan", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let pod = w.add_pod(&chain, "pod", "default");
    let (gw4, _) = gateways(&pod);
    w.node.ip(&format!(
        "link add vxtest type vxlan id 42 dstport 4789 local {gw4} nolearning"
    ));
    w.node.addr("vxtest", "10.99.0.1/24");
    w.node.addr("vxtest", "fd00:99::1/64");
    w.node.ip("link set vxtest up");
    w.node.sysctl("net.ipv4.conf.vxtest.rp_filter", "0");
    w.node.sysctl("net.ipv4.conf.all.rp_filter", "0");
    let vx_mac = mac_of(&w.node, "vxtest");
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            (
                "inner4",
                format!("ip saddr 10.99.0.7 ip daddr {META4} tcp dport 80"),
            ),
            (
                "inner6",
                format!("ip6 saddr fd00:99::7 ip6 daddr {META6} tcp dport 80"),
            ),
            (
                "ctl4",
                format!("ip saddr 10.99.0.7 ip daddr {cloud4} tcp dport 80"),
            ),
            (
                "ctl6",
                format!("ip6 saddr fd00:99::7 ip6 daddr {cloud6} tcp dport 80"),
            ),
        ],
    );
    let send = |src: &str, dst: IpAddr| send_vxlan_syns(&w, &pod, gw4, &vx_mac, src, dst, 3);
    send("10.99.0.7", META4);
    send("fd00:99::7", META6);
    send("10.99.0.7", cloud4);
    send("fd00:99::7", cloud6);
    counters.wait(
        &["ctl4"],
        3,
        "decapsulated IPv4 SYNs to the cloud's own address",
    );
    counters.wait(
        &["ctl6"],
        3,
        "decapsulated IPv6 SYNs to the cloud's own address",
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut f = Findings::new();
    for name in ["inner4", "inner6"] {
        let n = counters.packets(name);
        f.check(n == 0, || {
            format!("{n} decapsulated metadata SYN(s) reached the metadata host ({name})")
        });
    }
    f.finish("VXLAN decapsulation");
}

/// A routed (ptp) network whose conflist has no natguard (a network added later, a runtime that
/// skipped the chain): its pods were never seen by natguard, yet once natguard guards the node
/// (here for another network) they get no answer from the real API. Before that, the same pod
/// does: the control that the test can fail.
#[test]
fn a_ptp_pod_natguard_never_saw_never_reaches_real_metadata() {
    let w = real_world("sec-unseen-ptp");
    let plain = ptp_without_natguard(&w, "unseen");
    let unseen = w.add_pod(&plain, "unseen", "default");
    control_metadata(
        &unseen,
        REAL,
        "a pod without natguard on a node without natguard",
    );
    let guarded = w.chain(w.list("guarded", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&guarded, "sys", EXEMPT_NS);
    control_metadata(&sys, REAL, "the guarded network's exempt pod");
    control_network(&unseen, "the unseen pod's ordinary traffic");
    let mut f = Findings::new();
    for t in metas() {
        f.not_real(
            &http_get(&unseen.ns, t),
            &format!("the ptp pod natguard never saw -> http://{t}/"),
        );
    }
    f.finish("unseen ptp pod");
}

/// A primary whose pod interface is not a veth (here Debian's host-device plugin moving a
/// VXLAN device into the pod; macvlan, ipvlan and SR-IOV VFs have the same shape): its traffic
/// never crosses the node's netfilter, so ADD is refused with code 7 saying why, and accepted
/// only with `metadata.acceptUnenforced`.
#[test]
fn a_primary_that_bypasses_the_node_is_refused_unless_accepted() {
    let w = real_world("sec-bypass");
    w.node
        .ip("link add hostdev0 type vxlan id 7 dstport 4790 local 10.20.0.1");
    let hostdev = json!({
        "type": "host-device",
        "device": "hostdev0",
        "ipam": {
            "type": "host-local",
            "dataDir": w.dir().join("ipam-hostdev"),
            "ranges": [[{ "subnet": "10.244.12.0/24" }]]
        }
    });
    let list = |patch: Value| json!({ "cniVersion": "1.0.0", "name": "bypass", "plugins": [hostdev.clone(), exempt_cfg(&w, patch)] });
    let refused = w.chain(list(json!({})));
    let ns = w.h.netns("byp");
    let att = Attachment::new("cid-byp", &ns).k8s("default", "byp");
    let err = refused
        .add(&att)
        .expect_err("ADD after a netfilter-bypassing primary must be refused");
    assert_eq!(err.code, Some(7), "{err}");
    for word in ["vxlan", "not a veth", "metadata.acceptUnenforced"] {
        assert!(
            error_text(&err).contains(word),
            "the error must say {word:?}: {err}"
        );
    }
    assert!(
        w.table().is_none_or(|t| !t.contains("10.244.12.")),
        "a refused ADD leaves nothing: {:?}",
        w.table()
    );
    let accepted = w.chain(list(json!({ "metadata": { "acceptUnenforced": true } })));
    let ns2 = w.h.netns("byp2");
    w.node
        .ip("link add hostdev1 type vxlan id 8 dstport 4791 local 10.20.0.1");
    let mut l = list(json!({ "metadata": { "acceptUnenforced": true } }));
    l["plugins"][0]["device"] = json!("hostdev1");
    let accepted2 = w.chain(l);
    drop(accepted);
    // Another network's exempt pod, on a bridge, before and after the accepted ADD: nothing of
    // the unenforced network (its device, the node's route to its pod) may reset its replies.
    let bridge = w.chain(w.list("bypbr", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let exempt = w.add_pod(&bridge, "sys", EXEMPT_NS);
    control_metadata(&exempt, REAL, "the bridge network's exempt pod, before");
    let att2 = Attachment::new("cid-byp2", &ns2).k8s("default", "byp2");
    accepted2
        .add(&att2)
        .unwrap_or_else(|e| panic!("with acceptUnenforced the ADD is accepted: {e}"));
    control_metadata(
        &exempt,
        REAL,
        "the bridge network's exempt pod, after an unenforced network's ADD",
    );
    control_network(&exempt, "the bridge network's exempt pod");
    let table = w.table().expect("natguard's table");
    assert!(
        !table.contains("\"hostdev1\""),
        "the unenforced network's device entered an interface set:\n{table}"
    );
}

/// Pod a sends metadata SYNs with pod b's address on a routed network: the per-pod reset
/// counters count by the interface the packet came in on and its source, so b is never blamed
/// for what a sent, and a's own attempts are a's.
#[test]
fn reset_counters_name_the_pod_that_sent_the_packet() {
    let w = real_world("sec-count-sender");
    let ptp = w.ptp("cnt", 10);
    let chain = w.chain(json!({
        "cniVersion": "1.0.0",
        "name": "cntsend",
        "plugins": [ptp, exempt_cfg(&w, json!({ "metadata": { "mode": "deny" } }))]
    }));
    let a = w.add_pod(&chain, "a", "default");
    let b = w.add_pod(&chain, "b", "default");
    a.ns.addr("eth0", &format!("{}/32", b.v4));
    send_segments(&w.h, &a.ns, b.v4, META4, 80, 5, &[0x02]);
    send_segments(&w.h, &a.ns, a.v4, META4, 80, 3, &[0x02]);
    std::thread::sleep(Duration::from_millis(300));
    let out = w
        .node
        .run(&[env!("CARGO_BIN_EXE_natguard"), "status", "--json"]);
    let doc: Value = serde_json::from_str(&out).expect("status --json");
    let pods = doc["networks"][0]["pods"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let reset_of = |p: &Pod| {
        pods.iter()
            .find(|x| {
                x["containerId"]
                    .as_str()
                    .is_some_and(|c| p.att.container_id.starts_with(c))
            })
            .map(|x| x["reset"].clone())
            .unwrap_or_else(|| panic!("no pod {} in {doc:#}", p.att.container_id))
    };
    assert_eq!(reset_of(&b), json!(0), "b sent nothing: {doc:#}");
    assert_eq!(reset_of(&a), json!(3), "a's own attempts are a's: {doc:#}");
}

/// Redirection to the proxy, its per-pod counter and the log of denied attempts act on the
/// identity a packet enters with (the host side it comes in on, and its source), never on the
/// source address alone. On one proxy network of routed veths, a pod sending with its
/// neighbour's address from its own veth is neither redirected nor counted as the neighbour
/// (it is reset); a pod of a network that does not log, sending with the address of a pod
/// whose network logs, is not logged as that pod. SYNs reaching the metadata host are counted
/// and must be none; the pods' own attempts are the controls.
#[test]
fn redirects_counters_and_logs_name_the_pod_that_sent_the_packet() {
    let w = real_world("sec-redir-sender");
    let list = |name: &str, ptp: Value, md: Value| {
        json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [ptp, w.natguard(json!({ "metadata": md }))]
        })
    };
    let proxied = w.chain(list("rdproxy", w.ptp("rdp", 11), json!({})));
    let loud = w.chain(list(
        "rdloud",
        w.ptp("rdl", 12),
        json!({ "mode": "deny", "logDenied": true }),
    ));
    let quiet = w.chain(list("rdquiet", w.ptp("rdq", 13), json!({ "mode": "deny" })));
    let victim = w.add_pod(&proxied, "victim", "default");
    let sibling = w.add_pod(&proxied, "sibling", "default");
    let logged = w.add_pod(&loud, "logged", "default");
    let other = w.add_pod(&quiet, "other", "default");
    sibling.ns.addr("eth0", &format!("{}/32", victim.v4));
    other.ns.addr("eth0", &format!("{}/32", logged.v4));
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[("real", format!("ip daddr {META4} tcp dport 80 {SYN}"))],
    );
    // The sibling as its neighbour, then as itself; the other network's pod as the logged pod,
    // then the logged pod as itself.
    send_segments(&w.h, &sibling.ns, victim.v4, META4, 80, 5, &[0x02]);
    send_segments(&w.h, &sibling.ns, sibling.v4, META4, 80, 3, &[0x02]);
    send_segments(&w.h, &other.ns, logged.v4, META4, 80, 4, &[0x02]);
    send_segments(&w.h, &logged.ns, logged.v4, META4, 80, 2, &[0x02]);
    std::thread::sleep(Duration::from_millis(300));

    let mut f = Findings::new();
    let n = counters.packets("real");
    f.check(n == 0, || {
        format!("{n} SYNs reached the real metadata host")
    });
    let out = w
        .node
        .run(&[env!("CARGO_BIN_EXE_natguard"), "status", "--json"]);
    let doc: Value = serde_json::from_str(&out).expect("status --json");
    let pod_of = |p: &Pod| {
        doc["networks"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|n| n["pods"].as_array().cloned().unwrap_or_default())
            .find(|x| {
                x["containerId"]
                    .as_str()
                    .is_some_and(|c| p.att.container_id.starts_with(c))
            })
            .unwrap_or_else(|| panic!("no pod {} in {doc:#}", p.att.container_id))
    };
    let got = pod_of(&victim)["proxied"].clone();
    f.check(got == json!(0), || {
        format!("the victim sent nothing, yet {got} of the sibling's SYNs were redirected as the victim's")
    });
    let got = pod_of(&sibling)["proxied"].clone();
    f.check(got == json!(3), || {
        format!("control: the sibling's own 3 SYNs are its own redirects, got {got}")
    });
    let judge = w
        .node
        .run(&["nft", "list", "chain", "inet", "natguard", "judge4"]);
    let logged_packets = judge
        .lines()
        .find(|l| l.contains("log prefix"))
        .and_then(|l| l.split("counter packets ").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no counted log rule in judge4:\n{judge}"));
    f.check(logged_packets == 2, || {
        format!(
            "{logged_packets} denied attempts logged; only the logged pod's own 2 should be (4 more came from another network's pod with its address)"
        )
    });
    f.finish("redirects, counters and logs by sender");
}

/// `nft flush ruleset` (a firewall reload) takes every pod's entries with it. The next ADD, of
/// any pod, restores every pod from the runtimes' result cache, as `natguard reconcile` does:
/// the pods ADDed before the flush are guarded again (the default pod proxied, the exempt pod
/// let through), not only the new one.
#[test]
fn after_a_flushed_ruleset_the_next_add_restores_every_pod() {
    let w = real_world("sec-flush-add");
    let chain = w.chain(w.list("flushadd", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let sys = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&pod, "proxy", "default pod before the flush");
    w.on_node("nft flush ruleset");
    // The control: the flush really opened the way (what the next ADD must close).
    control_metadata(&pod, REAL, "default pod right after the flush");
    let _late = w.add_pod(&chain, "late", "default");
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&pod.ns, t);
        f.check(got == body("proxy"), || {
            format!("after the flush and the next ADD, the earlier default pod -> http://{t}/ got {got:?}, not the proxy")
        });
        let got = http_get(&sys.ns, t);
        f.check(got == body(REAL), || {
            format!("after the flush and the next ADD, the earlier exempt pod -> http://{t}/ got {got:?}, not REAL")
        });
    }
    f.finish("flush, then ADD");
}

/// Another component empties natguard's chains one by one (no flush of the ruleset, the table
/// and every set stay) right after an ADD, when natguard has just found everything intact.
/// The next ADD must notice the rewrite (nf_tables' generation has moved on) rather than trust
/// what it found a moment earlier, and restore the policy for every pod.
#[test]
fn chains_emptied_between_two_adds_are_restored_by_the_second() {
    let w = real_world("sec-empty-chains");
    let chain = w.chain(w.list("emptychains", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let pod = w.add_pod(&chain, "pod", "default");
    control_metadata(&pod, "proxy", "default pod before the rewrite");
    let listed = w.on_node("nft list chains");
    let mut emptied = 0;
    let mut family = "";
    for line in listed.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("table ") {
            family = ["inet", "netdev", "arp"]
                .into_iter()
                .find(|f| rest.starts_with(&format!("{f} natguard")))
                .unwrap_or("");
        } else if let Some(name) = line
            .strip_prefix("chain ")
            .and_then(|l| l.split(' ').next())
        {
            if !family.is_empty() {
                w.on_node(&format!("nft flush chain {family} natguard {name}"));
                emptied += 1;
            }
        }
    }
    assert!(emptied >= 2, "no natguard chain found to empty:\n{listed}");
    // The control: the rewrite really opened the way (what the next ADD must close).
    control_metadata(
        &pod,
        REAL,
        "default pod right after its chains were emptied",
    );
    let _late = w.add_pod(&chain, "late", "default");
    let mut f = Findings::new();
    for t in metas() {
        let got = http_get(&pod.ns, t);
        f.check(got == body("proxy"), || {
            format!("after the chains were emptied and the next ADD, the earlier pod -> http://{t}/ got {got:?}, not the proxy")
        });
    }
    f.finish("chains emptied, then ADD");
}

/// Containers on a bridge no CNI network manages (docker0 style) are no pod natguard knows: the
/// guard resets their metadata TCP, until the operator lets that bridge through explicitly with
/// `metadata.allowInterfaces` (empty by default). Even then, pods keep being judged as before.
#[test]
fn a_bridge_no_network_manages_is_reset_until_allowed_explicitly() {
    let w = real_world("sec-allow-ifs");
    w.node.bridge("dock0");
    w.node.addr("dock0", "172.30.0.1/24");
    let ctr = w.h.netns("ctr");
    veth(&w.node, "dockp0", &ctr, "eth0");
    w.node.enslave("dockp0", "dock0");
    ctr.addr("eth0", "172.30.0.2/24");
    ctr.route("default", "172.30.0.1");
    let meta4 = sa(META4, HTTP_PORT);
    let plain = w.chain(w.list("allowifs", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let pod = w.add_pod(&plain, "pod", "default");
    let got = http_get(&ctr, meta4);
    assert!(
        !is_real(&got),
        "a container on an unmanaged bridge reached REAL: {got:?}"
    );
    let allowing = w.chain(w.list(
        "allowifs",
        "1.1.0",
        0,
        Some(exempt_cfg(
            &w,
            json!({ "metadata": { "allowInterfaces": ["dock0"] } }),
        )),
    ));
    let _second = w.add_pod(&allowing, "second", "default");
    assert_eq!(
        http_get(&ctr, meta4),
        body(REAL),
        "allowInterfaces lets dock0 through"
    );
    let got = http_get(&pod.ns, meta4);
    assert_eq!(got, body("proxy"), "the pods are still judged as before");
}

/// A prevResult whose host-side interface is not the pod's: `lo`, the node's uplink, another
/// pod's veth. The host side is established from the kernel (the veth whose peer is the pod's
/// interface, and its bridge), so each such ADD of an exempt pod is refused with code 7 naming
/// the interface, nothing of it enters `exempt4`/`exempt6`, and the pod's metadata SYNs never
/// reach the real server. With `acceptUnenforced` the claim is ignored: the pod is exempt on
/// its own port only. The control: the pod's true prevResult makes it exempt, and REAL answers.
#[test]
fn a_host_side_that_is_not_the_pods_veth_is_never_used() {
    let w = real_world("sec-hostside");
    let plain = w.chain(w.list("hostside", "1.1.0", 0, None));
    let ng = exempt_cfg(&w, json!({}));
    let guarded = w.chain(w.list("hostside", "1.1.0", 0, Some(ng.clone())));
    // A pod of the network that natguard saw, so the node's guard is in place.
    let other = w.add_pod(&guarded, "other", "default");
    let other_veth = other.result["interfaces"]
        .as_array()
        .and_then(|l| {
            l.iter()
                .filter(|i| i["sandbox"].is_null())
                .find_map(|i| i["name"].as_str().filter(|n| n.starts_with("veth")))
        })
        .unwrap_or_else(|| panic!("no host veth in {}", other.result))
        .to_string();
    // The exempt pod's interface and addresses come from the bridge plugin alone.
    let sys = w.add_pod(&plain, "sys", EXEMPT_NS);
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &syns_to_metadata(("syn4", "syn6"), (sys.v4, sys.v6)),
    );
    let claimed = |host: &str| {
        let mut prev = sys.result.clone();
        prev["interfaces"] = json!([
            { "name": host },
            { "name": "eth0", "sandbox": sys.ns.path() }
        ]);
        for ip in prev["ips"].as_array_mut().expect("ips") {
            ip["interface"] = json!(1);
        }
        prev
    };
    let exempt_sets = || {
        ["exempt4", "exempt6"]
            .iter()
            .map(|s| {
                w.node
                    .try_run(&["nft", "list", "set", "inet", "natguard", s])
                    .unwrap_or_default()
            })
            .collect::<String>()
    };
    let mut f = Findings::new();
    for host in ["lo", "to-rout", other_veth.as_str()] {
        let conf = natguard_conf(&ng, "hostside", "1.1.0", Some(&claimed(host)));
        match natguard_verb(&guarded, "ADD", &conf, &sys.att) {
            Ok(r) => f.check(false, || {
                format!("ADD of an exempt pod whose prevResult names {host} as its host side was accepted: {r:?}")
            }),
            Err(e) => f.check(
                e.code == Some(7) && error_text(&e).contains(&format!("\"{host}\"")),
                || format!("ADD naming {host} as the host side: expected code 7 naming it: {e}"),
            ),
        }
        let sets = exempt_sets();
        f.check(!sets.contains(&format!("\"{host}\" .")), || {
            format!("{host} entered an exempt set:\n{sets}")
        });
        for t in metas() {
            f.not_real(
                &http_get(&sys.ns, t),
                &format!("the exempt pod claimed on {host} -> http://{t}/"),
            );
        }
    }
    // Accepted regardless: the claim is ignored, the pod is keyed by its own port.
    let mut lax = ng.clone();
    merge(
        &mut lax,
        &json!({ "metadata": { "acceptUnenforced": true } }),
    );
    let conf = natguard_conf(&lax, "hostside", "1.1.0", Some(&claimed("lo")));
    if let Err(e) = natguard_verb(&guarded, "ADD", &conf, &sys.att) {
        f.check(false, || {
            format!("with acceptUnenforced, ADD naming lo must be accepted: {e}")
        });
    }
    let sets = exempt_sets();
    f.check(!sets.contains("\"lo\" ."), || {
        format!("with acceptUnenforced, lo entered an exempt set:\n{sets}")
    });
    std::thread::sleep(Duration::from_millis(300));
    for name in ["syn4", "syn6"] {
        let n = counters.packets(name);
        f.check(n == 0, || {
            format!("the real metadata server saw {n} SYN(s) ({name}) from the pod while its host side was claimed")
        });
    }
    f.finish("host side claimed by prevResult");
    // The control: the same pod with its true prevResult is exempt.
    let conf = natguard_conf(&ng, "hostside", "1.1.0", Some(&sys.result));
    natguard_verb(&guarded, "ADD", &conf, &sys.att)
        .unwrap_or_else(|e| panic!("ADD with the pod's own prevResult: {e}"));
    control_metadata(&sys, REAL, "the exempt pod with its own host side");
}

/// The guard's proxy allowance admits only what natguard's DNAT sent to a proxy, never a
/// destination by itself. A network whose proxy is a metadata endpoint (the documented
/// `addresses: ["169.254.170.2"]` with `proxyIPv4: "169.254.169.254"`, `proxyPort: 80`) is
/// refused with code 7 naming the field; and a proxy target that is the real API (planted here
/// in `proxies4`/`proxies6`, as such a network or any writer would) admits neither a pod
/// natguard never saw nor an address a pod gave itself: the real server counts no SYN from
/// them. The controls: before the plant nothing was let through either, the natguard pod is
/// still answered by its proxy, and the self-given address's SYNs reach the cloud elsewhere.
#[test]
fn a_proxy_target_admits_only_what_natguard_redirected() {
    let w = real_world("sec-proxy-target");
    let opened = w.chain(w.list(
        "pxyopen",
        "1.1.0",
        1,
        Some(w.natguard(json!({ "metadata": {
            "addresses": ["169.254.170.2"],
            "proxyIPv4": "169.254.169.254",
            "proxyPort": 80
        } }))),
    ));
    match w.try_add_pod(&opened, "opener", "default") {
        Ok(p) => panic!(
            "a network whose proxy is 169.254.169.254:80 was accepted: {}",
            p.result
        ),
        Err(e) => {
            assert_eq!(e.code, Some(7), "{e}");
            let text = error_text(&e);
            assert!(
                text.contains("metadata.proxyIPv4") && text.contains("169.254.169.254"),
                "the error must name the field and the value: {e}"
            );
        }
    }
    let plain = ptp_without_natguard(&w, "pxyunseen");
    let unseen = w.add_pod(&plain, "unseen", "default");
    let guarded = w.chain(w.list("pxy", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let pod = w.add_pod(&guarded, "pod", "default");
    control_metadata(&pod, "proxy", "the natguard pod");
    // An address the pod gives itself: in no natguard set, so never DNATed.
    let (self4, self6): (IpAddr, IpAddr) = (
        "10.244.0.200".parse().unwrap(),
        "fd00:10:244::c8".parse().unwrap(),
    );
    pod.ns.addr("eth0", &format!("{self4}/32"));
    pod.ns.ip(&format!("addr add {self6}/128 dev eth0 nodad"));
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            syns_to_metadata(("self4", "self6"), (self4, self6)).as_slice(),
            &syns_to_metadata(("unseen4", "unseen6"), (unseen.v4, unseen.v6)),
            &[
                ("ctl4", format!("ip saddr {self4} ip daddr {cloud4} {SYN}")),
                (
                    "ctl6",
                    format!("ip6 saddr {self6} ip6 daddr {cloud6} {SYN}"),
                ),
            ],
        ]
        .concat(),
    );
    w.on_node(&format!(
        "nft add element inet natguard proxies4 {{ {META4} . 80 }}"
    ));
    w.on_node(&format!(
        "nft add element inet natguard proxies6 {{ {META6} . 80 }}"
    ));
    let mut f = Findings::new();
    for t in metas() {
        f.not_real(
            &http_get(&unseen.ns, t),
            &format!("the pod natguard never saw -> http://{t}/ (a proxy target)"),
        );
    }
    send_segments(&w.h, &pod.ns, self4, META4, 80, 3, &[0x02]);
    send_segments(&w.h, &pod.ns, self6, META6, 80, 3, &[0x02]);
    // The controls go last: once they have arrived, so has everything sent before them.
    send_segments(&w.h, &pod.ns, self4, cloud4, 80, 1, &[0x02]);
    send_segments(&w.h, &pod.ns, self6, cloud6, 80, 1, &[0x02]);
    counters.wait(
        &["ctl4"],
        1,
        "the self-given IPv4 address's SYN to the cloud",
    );
    counters.wait(
        &["ctl6"],
        1,
        "the self-given IPv6 address's SYN to the cloud",
    );
    for name in ["self4", "self6", "unseen4", "unseen6"] {
        let n = counters.packets(name);
        f.check(n == 0, || {
            format!(
                "the real metadata server saw {n} SYN(s) ({name}) sent straight to a proxy target"
            )
        });
    }
    // The pod's own addresses again, so that its connections leave from them.
    pod.ns.ip(&format!("addr del {self4}/32 dev eth0"));
    pod.ns.ip(&format!("addr del {self6}/128 dev eth0"));
    control_metadata(&pod, "proxy", "the natguard pod after the plant");
    f.finish("a proxy target reached directly");
}
