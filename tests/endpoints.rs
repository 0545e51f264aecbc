//! Per-endpoint modes and cloud presets, with REAL servers bound to every endpoint address and
//! port of each preset (root; each test builds its own namespaces).
//!
//! The cloud namespace answers on each endpoint's own address and port only, with a body that
//! names it (`EP 168.63.129.16:32526`), so a body tells which server answered: natguard's
//! proxy on the node answers `proxy`. For each preset a default pod gets what its endpoint's
//! mode says (proxied, reset, or the real endpoint for `allow`), an exempt pod reaches every
//! endpoint, and SYN counters in the cloud show that a reset endpoint saw not one of the
//! default pod's SYNs. Azure's WireServer keeps its UDP 53 (the VM's DNS) open: only TCP is
//! judged. The guard's attacks (address theft on the bridge, a pod natguard never saw) are run
//! against the WireServer, not only against 169.254.169.254.
//!
//! Each test prints `RESULT <preset> <pod> <endpoint> -> <outcome>` lines (run with
//! `--nocapture` to see them).

mod common;

use common::attack::*;
use common::*;
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

const WIRESERVER: &str = "168.63.129.16";

/// What a default pod must get from an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Proxied,
    Reset,
    Reached,
}

/// One endpoint of a preset: address, port, what a default pod gets.
struct Ep {
    addr: &'static str,
    port: u16,
    want: Want,
}

const fn ep(addr: &'static str, port: u16, want: Want) -> Ep {
    Ep { addr, port, want }
}

fn body_of(addr: IpAddr, port: u16) -> String {
    format!("EP {}", sa(addr, port))
}

/// Binds a real server to each endpoint's address and port in the cloud namespace (the
/// addresses on its `lo`, routed there from the node, as the world does for
/// 169.254.169.254), and replaces the world's catch-all cloud server.
fn serve_endpoints(w: &mut World, eps: &[Ep]) {
    require_tools(&["python3"]);
    w.h.stop(&w.cloud_http);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/http_keepalive.py");
    let script = script.to_str().expect("utf-8 path");
    let mut added: Vec<IpAddr> = vec![META4, META6];
    let mut listeners = std::collections::BTreeMap::<u16, usize>::new();
    for e in eps {
        let a: IpAddr = e.addr.parse().unwrap();
        if !added.contains(&a) {
            if a.is_ipv4() {
                w.cloud.addr("lo", &format!("{a}/32"));
                w.node.route(&format!("{a}/32"), "10.20.0.2");
            } else {
                w.cloud.addr("lo", &format!("{a}/128"));
                w.node.route(&format!("{a}/128"), "fd00:c1::2");
            }
            added.push(a);
        }
        let label = format!("ep-{}-{}", e.addr.replace(':', "_"), e.port);
        w.h.spawn(
            &w.cloud,
            &label,
            &[
                "python3",
                "-u",
                script,
                &e.port.to_string(),
                &body_of(a, e.port),
                e.addr,
            ],
        );
        *listeners.entry(e.port).or_default() += 1;
    }
    for (port, n) in listeners {
        wait_listening(&w.cloud, "tcp", port, n);
    }
}

/// natguard with `preset`, `kube-system` exempt, and `patch` merged in.
fn preset_cfg(w: &World, preset: &str, patch: Value) -> Value {
    let mut c = w.natguard(json!({
        "metadata": { "preset": preset, "exemptNamespaces": [EXEMPT_NS] }
    }));
    merge(&mut c, &patch);
    c
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Body(b) if b.contains("proxy") => "proxied (the node's proxy answered)".into(),
        Outcome::Body(b) => format!("reached the endpoint ({})", b.trim()),
        Outcome::Refused => "reset".into(),
        other => format!("{other:?}"),
    }
}

/// Every endpoint from a default pod and an exempt pod: what each got, checked against `eps`.
/// SYN counters in the cloud show a reset endpoint never saw the default pod's SYNs, and that
/// the exempt pod's did arrive.
fn check_preset(w: &World, preset: &str, chain: &Chain, eps: &[Ep]) -> (Findings, Pod, Pod) {
    let default = w.add_pod(chain, "web", "default");
    let exempt = w.add_pod(chain, "sys", EXEMPT_NS);
    // By destination alone: the pods' sources may be masqueraded on the way. Each pod's
    // attempt is counted as the difference it made.
    let syn = "tcp flags & (syn | ack | rst) == syn";
    let rules: Vec<(String, String)> = eps
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let a: IpAddr = e.addr.parse().unwrap();
            let fam = if a.is_ipv4() { "ip" } else { "ip6" };
            (
                format!("ep{i}"),
                format!("{fam} daddr {a} tcp dport {} {syn}", e.port),
            )
        })
        .collect();
    let named: Vec<(&str, String)> = rules.iter().map(|(n, m)| (n.as_str(), m.clone())).collect();
    let counters = Counters::install(&w.h, &w.cloud, &named);
    let settle = |name: &str, from: u64| {
        let start = Instant::now();
        while counters.packets(name) == from && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(50));
        }
        counters.packets(name)
    };
    let mut f = Findings::new();
    for (i, e) in eps.iter().enumerate() {
        let name = format!("ep{i}");
        let a: IpAddr = e.addr.parse().unwrap();
        let t: SocketAddr = sa(a, e.port);
        let real = body(&body_of(a, e.port));
        let c0 = counters.packets(&name);
        let got = http_get(&default.ns, t);
        println!("RESULT {preset} default {t} -> {}", describe(&got));
        let want = match e.want {
            Want::Proxied => body("proxy"),
            Want::Reset => Outcome::Refused,
            Want::Reached => real.clone(),
        };
        f.check(got == want, || {
            format!("{preset}: a default pod -> http://{t}/ got {got:?}, not {want:?}")
        });
        let c1 = settle(&name, c0);
        let want_syns = e.want == Want::Reached;
        f.check((c1 > c0) == want_syns, || {
            format!(
                "{preset}: {} of the default pod's SYNs to {t} arrived at the cloud (its mode: {:?})",
                c1 - c0,
                e.want
            )
        });
        let got = http_get(&exempt.ns, t);
        println!("RESULT {preset} exempt {t} -> {}", describe(&got));
        f.check(got == real, || {
            format!("{preset}: the exempt pod -> http://{t}/ got {got:?}, not the endpoint")
        });
        let c2 = settle(&name, c1);
        f.check(c2 > c1, || {
            format!("control: the exempt pod's SYN to {t} never arrived at the cloud")
        });
    }
    (f, default, exempt)
}

/// A UDP who-am-i server bound to the WireServer's address, port 53 (the VM's DNS): its
/// replies come from that address, as a connected client expects.
fn start_wireserver_dns(w: &World) {
    w.h.spawn(
        &w.cloud,
        "wireserver-dns",
        &[
            "socat",
            &format!("UDP4-RECVFROM:53,bind={WIRESERVER},reuseaddr,fork"),
            "SYSTEM:read -r request; echo $SOCAT_PEERADDR",
        ],
    );
    wait_listening(&w.cloud, "udp", 53, 1);
}

fn preset_world(test: &str, eps: &[Ep]) -> World {
    let mut w = World::new(test);
    serve_endpoints(&mut w, eps);
    w
}

const AZURE: &[Ep] = &[
    ep("169.254.169.254", 80, Want::Proxied),
    ep(WIRESERVER, 80, Want::Reset),
    ep(WIRESERVER, 32526, Want::Reset),
];

/// Azure in one node: IMDS proxied and the WireServer's TCP 80 and 32526 reset for a default
/// pod, every endpoint reached by the exempt pod, and UDP 53 to the WireServer (the VM's DNS)
/// answered for both.
#[test]
fn azure_preset_proxies_imds_resets_the_wireserver_and_keeps_its_dns() {
    let w = preset_world("ep-azure", AZURE);
    let wire: IpAddr = WIRESERVER.parse().unwrap();
    start_wireserver_dns(&w);
    let chain = w.chain(w.list(
        "azure",
        "1.1.0",
        0,
        Some(preset_cfg(&w, "azure", json!({}))),
    ));
    let (mut f, default, exempt) = check_preset(&w, "azure", &chain, AZURE);
    for (who, pod) in [("default", &default), ("exempt", &exempt)] {
        let got = udp_whoami(&pod.ns, sa(wire, 53));
        println!("RESULT azure {who} udp {wire}:53 -> {got:?}");
        f.check(got.is_ok(), || {
            format!("UDP 53 to the WireServer from the {who} pod got {got:?}: only TCP is judged")
        });
    }
    f.finish("azure preset");
}

const AWS: &[Ep] = &[
    ep("169.254.169.254", 80, Want::Proxied),
    ep("fd00:ec2::254", 80, Want::Proxied),
    ep("169.254.170.23", 80, Want::Reached),
    ep("fd00:ec2::23", 80, Want::Reached),
];

/// AWS: IMDS proxied on both families, the EKS Pod Identity agent reachable (`allow`) from a
/// default pod, and from a pod annotated `deny` too (the annotation tightens what natguard
/// judges; an `allow` endpoint is not judged), whose IMDS is reset.
#[test]
fn aws_preset_proxies_imds_and_leaves_the_pod_identity_agent_reachable() {
    let w = preset_world("ep-aws", AWS);
    let mut entry = preset_cfg(&w, "aws", json!({}));
    entry["capabilities"] = json!({ "io.kubernetes.cri.pod-annotations": true });
    let chain = w.chain(w.list("aws", "1.1.0", 0, Some(entry)));
    let (mut f, ..) = check_preset(&w, "aws", &chain, AWS);
    let ns = w.h.netns("strict");
    let mut att = Attachment::new("cid-strict", &ns).k8s("default", "strict");
    att.cap_args.insert(
        "io.kubernetes.cri.pod-annotations".into(),
        json!({ "natguard.io/metadata": "deny" }),
    );
    let strict = w
        .try_attach(&chain, ns, att)
        .unwrap_or_else(|e| panic!("ADD of the annotated pod: {e}"));
    for e in AWS {
        let a: IpAddr = e.addr.parse().unwrap();
        let t = sa(a, e.port);
        let got = http_get(&strict.ns, t);
        println!("RESULT aws annotated-deny {t} -> {}", describe(&got));
        let want = match e.want {
            Want::Reached => body(&body_of(a, e.port)),
            _ => Outcome::Refused,
        };
        f.check(got == want, || {
            format!("a pod annotated deny -> http://{t}/ got {got:?}, not {want:?}")
        });
    }
    f.finish("aws preset");
}

const GCP: &[Ep] = &[
    ep("169.254.169.254", 80, Want::Proxied),
    ep("fd20:ce::254", 80, Want::Proxied),
    ep("169.254.169.252", 988, Want::Reached),
    ep("169.254.169.252", 987, Want::Reached),
];

/// GCP: the metadata server proxied on both families (a default pod of this dual-stack network
/// never reaches the real server at [fd20:ce::254]:80: not one SYN arrives there), GKE's
/// node-local metadata server (988, 987) left to the pods, as Workload Identity redirects them
/// there.
#[test]
fn gcp_preset_proxies_the_metadata_server_and_leaves_gke_s_own_reachable() {
    let w = preset_world("ep-gcp", GCP);
    let chain = w.chain(w.list("gcp", "1.1.0", 0, Some(preset_cfg(&w, "gcp", json!({})))));
    check_preset(&w, "gcp", &chain, GCP).0.finish("gcp preset");
}

const ALIBABA: &[Ep] = &[ep("100.100.100.200", 80, Want::Proxied)];

#[test]
fn alibaba_preset_proxies_its_metadata_address() {
    let w = preset_world("ep-alibaba", ALIBABA);
    let chain = w.chain(w.list(
        "alibaba",
        "1.1.0",
        0,
        Some(preset_cfg(&w, "alibaba", json!({}))),
    ));
    check_preset(&w, "alibaba", &chain, ALIBABA)
        .0
        .finish("alibaba preset");
}

const OPENSTACK: &[Ep] = &[ep("169.254.169.254", 80, Want::Proxied)];

#[test]
fn openstack_preset_proxies_the_metadata_service() {
    let w = preset_world("ep-openstack", OPENSTACK);
    let chain = w.chain(w.list(
        "openstack",
        "1.1.0",
        0,
        Some(preset_cfg(&w, "openstack", json!({}))),
    ));
    check_preset(&w, "openstack", &chain, OPENSTACK)
        .0
        .finish("openstack preset");
}

const ORACLE: &[Ep] = &[
    ep("169.254.169.254", 80, Want::Proxied),
    ep("fd00:c1::a9fe:a9fe", 80, Want::Proxied),
];

/// Oracle Cloud: IMDS proxied on both families; a default pod never reaches the real server at
/// [fd00:c1::a9fe:a9fe]:80.
#[test]
fn oracle_preset_proxies_imds_on_both_families() {
    check_one_preset("ep-oracle", "oracle", ORACLE);
}

/// One preset in a world of its own: every endpoint of `eps` from a default and an exempt pod.
fn check_one_preset(test: &str, preset: &str, eps: &[Ep]) {
    let w = preset_world(test, eps);
    let chain = w.chain(w.list(preset, "1.1.0", 0, Some(preset_cfg(&w, preset, json!({})))));
    check_preset(&w, preset, &chain, eps)
        .0
        .finish(&format!("{preset} preset"));
}

/// Scaleway: its own metadata addresses (not 169.254.169.254), proxied on both families.
#[test]
fn scaleway_preset_proxies_its_metadata_addresses() {
    check_one_preset(
        "ep-scaleway",
        "scaleway",
        &[
            ep("169.254.42.42", 80, Want::Proxied),
            ep("fd00:42::42", 80, Want::Proxied),
        ],
    );
}

/// Tencent Cloud: metadata.tencentyun.com's 169.254.0.23, proxied.
#[test]
fn tencent_preset_proxies_its_metadata_address() {
    check_one_preset(
        "ep-tencent",
        "tencent",
        &[ep("169.254.0.23", 80, Want::Proxied)],
    );
}

/// Akamai (Linode): the metadata service proxied on both families, its IPv6 address too.
#[test]
fn akamai_preset_proxies_the_metadata_service_on_both_families() {
    check_one_preset(
        "ep-akamai",
        "akamai",
        &[
            ep("169.254.169.254", 80, Want::Proxied),
            ep("fd00:a9fe:a9fe::1", 80, Want::Proxied),
        ],
    );
}

/// IBM Cloud VPC: one address, two treatments by port. HTTP (80) is proxied; the secure
/// protocol's HTTPS (443), which no node-local proxy can answer for, is reset.
#[test]
fn ibm_preset_proxies_http_and_resets_https() {
    check_one_preset(
        "ep-ibm",
        "ibm",
        &[
            ep("169.254.169.254", 80, Want::Proxied),
            ep("169.254.169.254", 443, Want::Reset),
        ],
    );
}

/// Exoscale: the metadata server proxied, its password server (8080, same address) reset.
#[test]
fn exoscale_preset_proxies_metadata_and_resets_the_password_server() {
    check_one_preset(
        "ep-exoscale",
        "exoscale",
        &[
            ep("169.254.169.254", 80, Want::Proxied),
            ep("169.254.169.254", 8080, Want::Reset),
        ],
    );
}

/// The clouds whose only documented endpoint is 169.254.169.254:80 (and `linode`, Akamai's
/// preset under its former name): each preset proxies it, each in a world of its own.
#[test]
fn presets_of_clouds_with_one_metadata_address_proxy_it() {
    for preset in ["digitalocean", "hetzner", "vultr", "huawei", "linode"] {
        check_one_preset(
            &format!("ep-{preset}"),
            preset,
            &[ep("169.254.169.254", 80, Want::Proxied)],
        );
    }
}

/// Explicit entries: the same WireServer denied on one port and allowed on another, in one
/// network, the per-port mode holding for a default pod.
#[test]
fn explicit_endpoints_keep_a_mode_per_port() {
    let eps = &[
        ep(WIRESERVER, 80, Want::Reset),
        ep(WIRESERVER, 32526, Want::Reached),
        ep("169.254.169.254", 80, Want::Proxied),
    ];
    let w = preset_world("ep-explicit", eps);
    let cfg = w.natguard(json!({ "metadata": {
        "exemptNamespaces": [EXEMPT_NS],
        "endpoints": [
            { "address": WIRESERVER, "ports": [80], "mode": "deny" },
            { "address": WIRESERVER, "ports": [32526], "mode": "allow" },
            { "address": "169.254.169.254" }
        ]
    }}));
    let chain = w.chain(w.list("explicit", "1.1.0", 0, Some(cfg)));
    check_preset(&w, "explicit", &chain, eps)
        .0
        .finish("explicit endpoints");
}

// ---------------------------------------------------------------------------------------------
// The guard's attacks, against the WireServer
// ---------------------------------------------------------------------------------------------

fn wire_targets() -> [SocketAddr; 2] {
    let a: IpAddr = WIRESERVER.parse().unwrap();
    [sa(a, 80), sa(a, 32526)]
}

/// Priority-tagged SYNs (one 802.1Q tag of VLAN 0, or 802.1ad outside it) from the exempt pod's
/// address to the WireServer's TCP ports, sent by a default natguard pod and by a pod natguard
/// never saw on the same bridge: the kernel strips a priority tag before the IP layer, and not
/// one SYN may reach the WireServer (none crossed the exempt pod's veth). Untagged SYNs from
/// each sender's own address to another cloud address are the control that the senders' frames
/// do arrive, and the same tags on their own SYNs that tagged frames reach the IP layer.
#[test]
fn tagged_claims_never_reach_the_wireserver() {
    let w = preset_world("ep-tags", AZURE);
    let chain = w.chain(w.list("tags", "1.1.0", 0, Some(preset_cfg(&w, "azure", json!({})))));
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let natpod = w.add_pod(&chain, "web", "default");
    let unseen = w.add_pod(&unguarded_on_cni0(&w), "unseen", "default");
    let cloud4 = CLOUD4;
    const SYN: &str = "tcp flags & (syn | ack | rst) == syn";
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            (
                "stolen",
                format!(
                    "ip saddr {} ip daddr {WIRESERVER} tcp dport {{ 80, 32526 }} {SYN}",
                    exempt.v4
                ),
            ),
            (
                "own",
                format!(
                    "ip saddr {{ {}, {} }} ip daddr {cloud4} tcp dport 80 {SYN}",
                    natpod.v4, unseen.v4
                ),
            ),
            (
                "tagged",
                format!(
                    "ip saddr {{ {}, {} }} ip daddr {cloud4} tcp dport 81 {SYN}",
                    natpod.v4, unseen.v4
                ),
            ),
        ],
    );
    let bridge_mac = {
        let out = w.node.ip("-j link show cni0");
        let v: Value = serde_json::from_str(&out).unwrap();
        v[0]["address"].as_str().unwrap().to_string()
    };
    const EACH: u64 = 3;
    let mut own = 0;
    for thief in [&natpod, &unseen] {
        let thief_mac = {
            let out = thief.ns.ip("-j link show eth0");
            let v: Value = serde_json::from_str(&out).unwrap();
            v[0]["address"].as_str().unwrap().to_string()
        };
        for tags in ["q", "adq"] {
            for port in ["80", "32526"] {
                let what: Vec<String> = ["syn", &exempt.v4.to_string(), WIRESERVER, port, "3"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                send_frames(&w, thief, &thief_mac, &bridge_mac, tags, &what);
            }
            // The same tags on the sender's own SYNs to another cloud address: the control that
            // tagged frames get to the node's IP layer at all.
            let what: Vec<String> = ["syn", &thief.v4.to_string(), "10.20.0.2", "81", "3"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            send_frames(&w, thief, &thief_mac, &bridge_mac, tags, &what);
        }
        send_segments(&w.h, &thief.ns, thief.v4, cloud4, 80, EACH as u32, &[0x02]);
        own += EACH;
        let start = Instant::now();
        while counters.packets("own") < own {
            assert!(
                start.elapsed() < deadline(Duration::from_secs(20)),
                "control: the untagged SYNs of {} to the cloud never arrived",
                thief.att.container_id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let stolen = counters.packets("stolen");
    let tagged = counters.packets("tagged");
    println!(
        "RESULT azure tagged claims of the exempt address -> {stolen} SYN(s) at the WireServer, {tagged} tagged SYN(s) of the senders' own at the cloud"
    );
    assert!(
        tagged >= 2 * EACH,
        "control: only {tagged} of the senders' own priority-tagged SYNs reached the cloud"
    );
    assert_eq!(
        stolen, 0,
        "tagged SYNs from the exempt pod's address reached the WireServer"
    );
    let got = http_get(&exempt.ns, sa(WIRESERVER.parse().unwrap(), 80));
    assert_eq!(
        got,
        body(&body_of(WIRESERVER.parse().unwrap(), 80)),
        "the exempt pod after"
    );
}

/// The node has a VXLAN device (flannel.1 style). A default pod wraps SYNs to the WireServer's
/// TCP 80 in VXLAN with an inner source of its own choosing: decapsulated, they enter on the
/// tunnel device from an address natguard never saw, and must be reset as at any endpoint. The
/// control: the same inner SYNs to the cloud's own address arrive there.
#[test]
fn vxlan_decapsulated_tcp_never_reaches_the_wireserver() {
    let w = preset_world("ep-vxlan", AZURE);
    let chain = w.chain(w.list(
        "vxlan",
        "1.1.0",
        0,
        Some(preset_cfg(&w, "azure", json!({}))),
    ));
    let pod = w.add_pod(&chain, "pod", "default");
    let (gw4, _) = gateways(&pod);
    w.node.ip(&format!(
        "link add vxtest type vxlan id 42 dstport 4789 local {gw4} nolearning"
    ));
    w.node.addr("vxtest", "10.99.0.1/24");
    w.node.ip("link set vxtest up");
    w.node.sysctl("net.ipv4.conf.vxtest.rp_filter", "0");
    w.node.sysctl("net.ipv4.conf.all.rp_filter", "0");
    let vx_mac = {
        let out = w.node.ip("-j link show vxtest");
        let v: Value = serde_json::from_str(&out).unwrap();
        v[0]["address"].as_str().unwrap().to_string()
    };
    let cloud4 = CLOUD4;
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            (
                "inner",
                format!("ip saddr 10.99.0.7 ip daddr {WIRESERVER} tcp dport 80"),
            ),
            (
                "ctl",
                format!("ip saddr 10.99.0.7 ip daddr {cloud4} tcp dport 80"),
            ),
        ],
    );
    let wire: IpAddr = WIRESERVER.parse().unwrap();
    send_vxlan_syns(&w, &pod, gw4, &vx_mac, "10.99.0.7", wire, 3);
    send_vxlan_syns(&w, &pod, gw4, &vx_mac, "10.99.0.7", cloud4, 3);
    let start = Instant::now();
    while counters.packets("ctl") < 3 {
        assert!(
            start.elapsed() < deadline(Duration::from_secs(20)),
            "control: the decapsulated SYNs to the cloud's own address never arrived"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    let n = counters.packets("inner");
    println!("RESULT azure vxlan-decapsulated SYNs to {WIRESERVER}:80 -> {n} at the WireServer");
    assert_eq!(n, 0, "decapsulated SYNs reached the WireServer");
}

/// A pod natguard never saw on the exempt pod's bridge (another list on `cni0` without
/// natguard) takes the exempt pod's IPv4 address and opens TCP to the WireServer from it: it
/// never reaches the WireServer, and the exempt pod still does.
#[test]
fn address_theft_on_the_bridge_never_reaches_the_wireserver() {
    let w = preset_world("ep-theft", AZURE);
    let chain = w.chain(w.list(
        "theft",
        "1.1.0",
        0,
        Some(preset_cfg(&w, "azure", json!({}))),
    ));
    let unguarded = unguarded_on_cni0(&w);
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&unguarded, "thief", "default");
    let mut f = Findings::new();
    for t in wire_targets() {
        let want = body(&body_of(t.ip(), t.port()));
        assert_eq!(
            http_get(&exempt.ns, t),
            want,
            "control: the exempt pod -> {t}"
        );
        let got = http_get(&thief.ns, t);
        f.check(got == Outcome::Refused, || {
            format!("control: a pod natguard never saw -> {t} got {got:?}, not a reset")
        });
        println!("RESULT azure never-seen {t} -> {}", describe(&got));
    }
    let (gw4, _) = gateways(&thief);
    let gw_mac = neighbour_mac(&thief.ns, gw4)
        .unwrap_or_else(|| panic!("control: no neighbour entry for {gw4}"));
    thief.ns.addr("eth0", &format!("{}/32", exempt.v4));
    thief.ns.addr("eth0", &format!("{}/128", exempt.v6));
    thief.ns.ip(&format!(
        "route replace {WIRESERVER}/32 via {gw4} src {}",
        exempt.v4
    ));
    thief.ns.ip("neigh flush all");
    thief.ns.ip(&format!(
        "neigh replace {gw4} lladdr {gw_mac} dev eth0 nud permanent"
    ));
    announce(&w.h, &thief.ns, "eth0", exempt.v4, gw4, exempt.v6);
    for t in wire_targets() {
        let got = http_get(&thief.ns, t);
        println!(
            "RESULT azure thief-with-exempt-address {t} -> {}",
            describe(&got)
        );
        f.check(
            !matches!(&got, Outcome::Body(b) if b.starts_with("EP")),
            || format!("the thief from the exempt pod's address reached the WireServer at {t}"),
        );
        let got = http_get(&exempt.ns, t);
        f.check(got == body(&body_of(t.ip(), t.port())), || {
            format!("after the theft the exempt pod -> {t} got {got:?}")
        });
    }
    f.finish("address theft against the WireServer");
}

/// A ptp pod of a network without natguard, on the azure node: reset at the WireServer's TCP
/// ports and at IMDS, its WireServer DNS still answered.
#[test]
fn a_pod_natguard_never_saw_never_reaches_the_wireserver() {
    let w = preset_world("ep-unseen", AZURE);
    start_wireserver_dns(&w);
    let guarded = w.chain(w.list(
        "guarded",
        "1.1.0",
        0,
        Some(preset_cfg(&w, "azure", json!({}))),
    ));
    let sys = w.add_pod(&guarded, "sys", EXEMPT_NS);
    let plain = ptp_without_natguard(&w, "unseen");
    let unseen = w.add_pod(&plain, "unseen", "default");
    let mut f = Findings::new();
    for t in wire_targets().into_iter().chain([sa(META4, 80)]) {
        let want = body(&body_of(t.ip(), t.port()));
        assert_eq!(http_get(&sys.ns, t), want, "control: the exempt pod -> {t}");
        let got = http_get(&unseen.ns, t);
        println!("RESULT azure never-seen-ptp {t} -> {}", describe(&got));
        f.check(got == Outcome::Refused, || {
            format!("the ptp pod natguard never saw -> {t} got {got:?}, not a reset")
        });
    }
    let got = udp_whoami(&unseen.ns, sa(WIRESERVER.parse().unwrap(), 53));
    f.check(got.is_ok(), || {
        format!("UDP 53 to the WireServer from the never-seen pod got {got:?}")
    });
    f.finish("a pod natguard never saw, against the WireServer");
}
