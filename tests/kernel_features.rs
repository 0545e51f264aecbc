//! Root tests that need what only real nodes' kernels have: IPVS (kube-proxy's IPVS mode),
//! tunnels (IPIP, GRE, SIT, ip6tnl, ip6gre), VLAN-filtering bridges; and the checks that
//! natguard takes, on each kernel the kernel test layer boots, the kernel-specific path that
//! kernel needs (conntrack delete, IPv6 filter, set counters, socket release).
//!
//! Not part of `cargo test` (`test = false` in Cargo.toml): scripts/kernels.sh builds and runs
//! this binary inside VMs of Debian's 5.10, 6.1 and 6.12 kernels, and tells it what to expect
//! of each in `NATGUARD_KERNEL_EXPECT` (docs/kernels.md). A missing feature or an expectation
//! that does not hold fails the test loudly; nothing is skipped. Run elsewhere (without
//! `NATGUARD_KERNEL_EXPECT`), the kernel-path tests fail and say so.
//!
//! The attack tests follow tests/security.rs: a REAL metadata server bound to 169.254.169.254
//! and fd00:ec2::254 in the "cloud" namespace must never answer a default pod, whatever path the
//! packets take through the node, and SYNs a pod sends from addresses it claims are counted at
//! the metadata host. Every attack has positive controls (the exempt pod reaches the real API,
//! a default pod's ordinary traffic and the same path to a non-metadata host work), so a failure
//! is the guard's, not the harness's.

mod common;

use common::attack::*;
use common::*;
use natguard::kernel::conntrack::wire::{put_tuple, CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, IPPROTO_TCP};
use natguard::kernel::conntrack::{self, Path as CtPath};
use natguard::kernel::netlink::{NfSocket, NFNL_SUBSYS_CTNETLINK, NLM_F_ACK};
use natguard::kernel::netlink::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// What the kernel test layer promises for `key` on this kernel; fails outside that layer.
fn expect(key: &str) -> String {
    kernel_expects(key).unwrap_or_else(|| {
        panic!(
            "NATGUARD_KERNEL_EXPECT has no {key}=...: this binary runs in the kernel test layer \
             (scripts/kernels.sh), which says what each kernel must do"
        )
    })
}

/// An address of the pod's own subnets that nobody has (host ID 0x200 / .200): what an attacker
/// gives itself as the inner source of a tunnel, so that the node routes the answers to it.
fn unused_in_subnet(pod: &Pod) -> (IpAddr, IpAddr) {
    let IpAddr::V4(v4) = pod.v4 else {
        unreachable!()
    };
    let IpAddr::V6(v6) = pod.v6 else {
        unreachable!()
    };
    let o = v4.octets();
    let mut s = v6.segments();
    s[7] = 0x200;
    (
        IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 200)),
        IpAddr::V6(Ipv6Addr::from(s)),
    )
}

/// Runs `ip ARGS` in `ns`; a failure says which kernel feature is missing.
fn need(ns: &Netns, args: &str, feature: &str) {
    if let Err(e) = ns.try_ip(args) {
        panic!(
            "this kernel lacks {feature}, which the kernel test layer promised ({}): {e}",
            std::env::var("NGK_KVER").unwrap_or_else(|_| "unknown kernel".into())
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The features this layer exists for
// ---------------------------------------------------------------------------------------------

#[test]
fn the_kernel_has_ipvs_vlan_filtering_and_tunnels() {
    require_root();
    require_tools(&["ipvsadm", "ip", "bridge"]);
    let h = Harness::new("kf-feat");
    let ns = h.netns("n");
    ns.ip("link add d0 type dummy");
    ns.ip("link set d0 up");
    need(
        &ns,
        "link add link d0 name d0.100 type vlan id 100",
        "8021q (VLAN devices)",
    );
    need(
        &ns,
        "link add link d0 name d0.ad type vlan proto 802.1ad id 100",
        "802.1ad (QinQ)",
    );
    need(
        &ns,
        "link add br0 type bridge vlan_filtering 1",
        "VLAN-filtering bridges",
    );
    need(
        &ns,
        "link add t4 type ipip local 10.0.0.1 remote 10.0.0.2",
        "ipip",
    );
    need(
        &ns,
        "link add g4 type gre local 10.0.0.1 remote 10.0.0.2",
        "ip_gre",
    );
    need(
        &ns,
        "link add s6 type sit local 10.0.0.1 remote 10.0.0.2",
        "sit",
    );
    need(
        &ns,
        "link add t6 type ip6tnl mode ip6ip6 local fd00::1 remote fd00::2",
        "ip6_tunnel",
    );
    need(
        &ns,
        "link add g6 type ip6gre local fd00::1 remote fd00::2",
        "ip6_gre",
    );
    need(&ns, "fou add port 5555 ipproto 4", "fou");
    need(
        &ns,
        "link add vx0 type vxlan id 42 dstport 4789 local 10.0.0.1",
        "vxlan",
    );
    if let Err(e) = ns.try_run(&["ipvsadm", "-A", "-t", "10.96.0.10:80", "-s", "rr"]) {
        panic!("this kernel lacks IPVS (ip_vs), which the kernel test layer promised: {e}");
    }
    ns.run(&["ipvsadm", "-A", "-t", "[fd00:96::10]:80", "-s", "rr"]);
    let list = ns.run(&["ipvsadm", "-Ln"]);
    assert!(
        list.contains("10.96.0.10:80") && list.contains("[fd00:96::10]:80"),
        "{list}"
    );
}

// ---------------------------------------------------------------------------------------------
// Kernel-specific paths: which one natguard takes here is what the layer promised
// ---------------------------------------------------------------------------------------------

const CT_NEW: u16 = (NFNL_SUBSYS_CTNETLINK as u16) << 8;
const CT_GET: u16 = ((NFNL_SUBSYS_CTNETLINK as u16) << 8) | 1;

/// Creates established TCP entries `src:40000+i -> dst:443` (calling thread's namespace).
fn create_flows(flows: &[(IpAddr, IpAddr)]) {
    let mut sock = NfSocket::open().unwrap();
    let mut b = sock.msgbuf();
    for (i, (s, d)) in flows.iter().enumerate() {
        let family = if s.is_ipv4() { 2 } else { 10 };
        let sp = 40000 + i as u16;
        b.begin(CT_NEW, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, family, 0);
        put_tuple(&mut b, CTA_TUPLE_ORIG, IPPROTO_TCP, *s, *d, sp, 443);
        put_tuple(&mut b, CTA_TUPLE_REPLY, IPPROTO_TCP, *d, *s, 443, sp);
        b.attr_u32_be(7, 3600);
        b.end();
    }
    sock.transact(&b, &|_| "create conntrack entry".into())
        .unwrap();
}

/// The original sources of the IPv6 entries a dump with an IPv6 source-address filter for
/// `addr` returns.
fn filtered_dump6(addr: Ipv6Addr) -> BTreeSet<IpAddr> {
    let mut sock = NfSocket::open().unwrap();
    let mut b = sock.msgbuf();
    b.begin(CT_GET, NLM_F_DUMP, 10, 0);
    let t = b.nest_begin(1); // CTA_TUPLE_ORIG
    let ip = b.nest_begin(1); // CTA_TUPLE_IP
    b.attr(3, &addr.octets()); // CTA_IP_V6_SRC
    b.nest_end(ip);
    b.nest_end(t);
    let f = b.nest_begin(25); // CTA_FILTER
    b.attr(1, &1u32.to_ne_bytes()); // CTA_FILTER_ORIG_FLAGS = CTA_FILTER_F_CTA_IP_SRC
    b.nest_end(f);
    b.end();
    let mut out = BTreeSet::new();
    for m in sock.request(&b, "filtered IPv6 dump").unwrap() {
        let a = m.nf_attrs();
        let ipa = a.get(1).unwrap().nested().get(1).unwrap().nested();
        let p = ipa.get(3).unwrap().payload;
        out.insert(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p).unwrap())));
    }
    out
}

#[test]
fn the_ipv6_address_filter_of_ctnetlink_is_the_one_promised() {
    require_root();
    let want = expect("ipv6_filter");
    let h = Harness::new("kf-v6f");
    let ns = h.netns("n");
    let a: Ipv6Addr = "fd00:1::5".parse().unwrap();
    let b: Ipv6Addr = "fd00:1::6".parse().unwrap();
    let d: IpAddr = "fd00:99::1".parse().unwrap();
    let got = in_netns(&ns, move || {
        create_flows(&[(IpAddr::V6(a), d), (IpAddr::V6(b), d)]);
        filtered_dump6(a)
    });
    let kind = if got == BTreeSet::from([IpAddr::V6(a)]) {
        "exact"
    } else if got == BTreeSet::from([IpAddr::V6(b)]) {
        "inverted"
    } else {
        panic!("a dump filtered on source {a} returned {got:?}: neither exact nor inverted")
    };
    assert_eq!(
        kind, want,
        "this kernel's ctnetlink IPv6 address filter is {kind}, the layer promised {want}"
    );
}

#[test]
fn conntrack_flush_takes_the_path_this_kernel_needs_and_is_exact_in_ipv6() {
    require_root();
    let want = match expect("ct_delete").as_str() {
        "filtered" => "filtered+ipv6-dump",
        "dump" => "dump+delete+ipv6-dump",
        other => panic!("unknown ct_delete={other}"),
    };
    let h = Harness::new("kf-ct");
    let ns = h.netns("n");
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let (pod4, pod6) = (ip("10.1.0.5"), ip("fd00:1::5"));
    let (far4, far6) = (ip("11.0.0.1"), ip("fd00:99::1"));
    let pod = [(pod4, far4), (far4, pod4), (pod6, far6), (far6, pod6)];
    let keep = [
        (ip("10.1.0.6"), far4),
        (ip("fd00:1::6"), far6),
        (ip("fd00:1::5:0"), far6),
    ];
    let (report, left) = in_netns(&ns, move || {
        create_flows(&pod);
        create_flows(&keep);
        let r = conntrack::flush_addresses_with(&[pod4, pod6], CtPath::Auto).unwrap();
        (r, conntrack::count_entries().unwrap())
    });
    assert_eq!(
        report.path, want,
        "natguard's conntrack flush on this kernel: {report:?}"
    );
    assert_eq!(report.deleted, pod.len() as u64, "{report:?}");
    assert_eq!(
        left,
        keep.len() as u64,
        "only the pod's entries go (IPv6 included)"
    );
}

/// The block of `set NAME {` ... `}` in an nft listing.
fn set_block<'a>(table: &'a str, name: &str) -> Option<&'a str> {
    let start = table.find(&format!("set {name} {{"))?;
    let end = table[start..].find('}')?;
    Some(&table[start..start + end])
}

#[test]
fn add_deletes_the_pods_entries_and_set_counters_are_the_ones_promised() {
    require_root();
    let counters = expect("set_counters");
    let ct = expect("ct_delete");
    let w = World::new("kf-add");
    let chain = w.chain(w.list(
        "kfadd",
        "1.0.0",
        0,
        Some(exempt_cfg(&w, json!({ "logLevel": "info" }))),
    ));
    // host-local hands out .2 / ::2 first: entries of a previous owner of those addresses.
    let old = [
        ("10.244.0.2".parse().unwrap(), REMOTE_IN4),
        ("fd00:10:244::2".parse().unwrap(), REMOTE_IN6),
    ];
    in_netns(&w.node, move || create_flows(&old));
    let pod = w.add_pod(&chain, "web", "default");
    assert_eq!(pod.ips(), old.map(|o| o.0), "host-local's first addresses");
    for a in pod.ips() {
        assert_eq!(
            conntrack_count(&w.node, &["-s", &a.to_string()]),
            0,
            "ADD left entries of {a}"
        );
    }
    let log = std::fs::read_to_string(w.dir().join("natguard.log")).unwrap_or_default();
    // Where the IPv6 filter is exact, the IPv6 addresses take filtered deletes too.
    let path = match (ct.as_str(), expect("ipv6_filter").as_str()) {
        ("dump", _) => "(dump+delete+ipv6-dump)",
        (_, "exact") => "(filtered)",
        _ => "(filtered+ipv6-dump)",
    };
    assert!(
        log.lines()
            .any(|l| l.contains("conntrack: deleted") && l.contains(path)),
        "ADD's conntrack cleanup should have taken {path} on this kernel; log:\n{log}"
    );
    let table = w.table().expect("natguard's table");
    let set = set_block(&table, "kfadd-redirc4")
        .unwrap_or_else(|| panic!("no set kfadd-redirc4 in\n{table}"));
    let refused = log.contains("refused counted sets");
    match counters.as_str() {
        "yes" => {
            assert!(!refused, "the kernel refused counted sets:\n{log}");
            assert!(set.contains("counter"), "set without counters:\n{set}");
        }
        "no" => {
            assert!(refused, "no fallback to plain sets logged:\n{log}");
            assert!(!set.contains("counter"), "set with counters:\n{set}");
        }
        other => panic!("unknown set_counters={other}"),
    }
    // Whatever the sets, the policy holds.
    control_metadata(&pod, "proxy", "default pod");
}

/// io_uring_setup(2) with one entry; Ok if the kernel gave a ring.
fn io_uring_available() -> Result<(), i32> {
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup writes into a buffer of the size of struct io_uring_params.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            1 as libc::c_long,
            params.as_mut_ptr(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: the ring fd was just created.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

#[test]
fn the_socket_release_has_what_it_needs_on_this_kernel() {
    require_root();
    let sysctl = expect("io_uring_sysctl");
    let exists = Path::new("/proc/sys/kernel/io_uring_disabled").exists();
    assert_eq!(
        if exists { "present" } else { "absent" },
        sysctl,
        "kernel.io_uring_disabled (from 6.6 on)"
    );
    // The hand-over of the netlink sockets needs a ring: every kernel of the layer has one.
    assert_eq!(io_uring_available(), Ok(()), "io_uring_setup refused");
    // And a verb still answers: natguard's release runs at the end of every ADD and DEL.
    let w = World::new("kf-rel");
    let chain = w.chain(w.list(
        "kfrel",
        "1.0.0",
        0,
        Some(exempt_cfg(&w, json!({ "logLevel": "info" }))),
    ));
    let pod = w.add_pod(&chain, "web", "default");
    chain.del(&pod.att).expect("DEL");
}

// ---------------------------------------------------------------------------------------------
// 1. kube-proxy's IPVS mode: a virtual service whose real server is the metadata address
// ---------------------------------------------------------------------------------------------

const VIP4: &str = "10.96.0.10";
const VIP6: &str = "fd00:96::10";
const VIP4_CTL: &str = "10.96.0.11";
const VIP6_CTL: &str = "fd00:96::11";

#[test]
fn ipvs_service_with_the_metadata_address_as_real_server_never_answers_a_default_pod() {
    require_root();
    require_tools(&["ipvsadm"]);
    let w = real_world("kf-ipvs");
    let chain = w.chain(w.list(
        "kfipvs",
        "1.0.0",
        0,
        Some(exempt_cfg(&w, json!({ "logLevel": "info" }))),
    ));
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "web", "default");
    control_metadata(&exempt, REAL, "exempt pod");
    control_metadata(&pod, "proxy", "default pod");
    control_network(&pod, "default pod");

    // What kube-proxy's IPVS mode sets up: the service addresses on a dummy device, conntrack
    // for IPVS, and masquerading-mode (NAT) real servers.
    let n = &w.node;
    n.ip("link add kube-ipvs0 type dummy");
    n.ip(&format!("addr add {VIP4}/32 dev kube-ipvs0"));
    n.ip(&format!("addr add {VIP4_CTL}/32 dev kube-ipvs0"));
    n.ip(&format!("addr add {VIP6}/128 dev kube-ipvs0 nodad"));
    n.ip(&format!("addr add {VIP6_CTL}/128 dev kube-ipvs0 nodad"));
    n.sysctl("net.ipv4.vs.conntrack", "1");
    let svc = |vip: String, real: String| {
        n.run(&["ipvsadm", "-A", "-t", &vip, "-s", "rr"]);
        n.run(&["ipvsadm", "-a", "-t", &vip, "-r", &real, "-m"]);
    };
    svc(format!("{VIP4}:80"), format!("{META4}:80"));
    svc(format!("[{VIP6}]:80"), format!("[{META6}]:80"));
    svc(
        format!("{VIP4_CTL}:{WHOAMI_PORT}"),
        format!("{REMOTE_IN4}:{WHOAMI_PORT}"),
    );
    svc(
        format!("[{VIP6_CTL}]:{WHOAMI_PORT}"),
        format!("[{REMOTE_IN6}]:{WHOAMI_PORT}"),
    );
    let vip = |s: &str, port: u16| sa(s.parse().unwrap(), port);

    // Controls: IPVS forwards a default pod's connections (to a non-metadata real server), and
    // the node's own processes reach the real API through the service.
    for (ctl, me) in [(VIP4_CTL, pod.v4), (VIP6_CTL, pod.v6)] {
        assert_eq!(
            tcp_whoami(&pod.ns, vip(ctl, WHOAMI_PORT)),
            Ok(me),
            "control: IPVS service {ctl} -> remote-in should work for the default pod\n{}",
            n.run(&["ipvsadm", "-Ln"])
        );
    }
    for v in [VIP4, VIP6] {
        assert_eq!(
            http_get(n, vip(v, 80)),
            body(REAL),
            "control: the node itself -> IPVS service {v} -> real metadata"
        );
    }

    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            ("pod4", format!("ip saddr {} {SYN}", pod.v4)),
            ("pod6", format!("ip6 saddr {} {SYN}", pod.v6)),
        ],
    );
    let mut f = Findings::new();
    for v in [VIP4, VIP6] {
        let got = http_get(&pod.ns, vip(v, 80));
        f.not_real(
            &got,
            &format!("the default pod -> IPVS service {v}:80 (real server: metadata)"),
        );
    }
    for (name, fam) in [("pod4", "IPv4"), ("pod6", "IPv6")] {
        let k = counters.packets(name);
        f.check(k == 0, || {
            format!("{k} SYN(s) of the default pod reached the {fam} metadata host through IPVS")
        });
    }
    // The output guard cannot tell which pod IPVS forwards for (the output hook has no input
    // interface), so it refuses metadata through a service for every pod, the exempt one
    // included (docs/guard.md); the exempt pod keeps the real API directly.
    for v in [VIP4, VIP6] {
        let got = http_get(&exempt.ns, vip(v, 80));
        f.check(got == Outcome::Refused, || {
            format!(
                "the exempt pod -> IPVS service {v}:80 got {got:?}, not the output guard's reset"
            )
        });
    }
    control_metadata(&exempt, REAL, "exempt pod after the attack");
    f.finish("IPVS");
}

// ---------------------------------------------------------------------------------------------
// 2. Tunnels on the node: a default pod encapsulates metadata TCP with an inner source it gave
//    itself (an unused address of its own subnet, so that the node routes the answers to it)
// ---------------------------------------------------------------------------------------------

/// One tunnel kind: the node's fallback device (which accepts this encapsulation from anyone),
/// and the pod's device towards the node.
struct Tunnel {
    name: &'static str,
    node_dev: &'static str,
    /// `ip link add t0 ...` arguments after the name, with {pod} and {gw} filled in.
    pod_args: &'static str,
    /// Which inner family it carries.
    inner_v6: bool,
    /// Which outer family it uses.
    outer_v6: bool,
}

const TUNNELS: [Tunnel; 5] = [
    Tunnel {
        name: "IPIP",
        node_dev: "tunl0",
        pod_args: "type ipip local {pod} remote {gw}",
        inner_v6: false,
        outer_v6: false,
    },
    Tunnel {
        name: "GRE",
        node_dev: "gre0",
        pod_args: "type gre local {pod} remote {gw}",
        inner_v6: false,
        outer_v6: false,
    },
    Tunnel {
        name: "SIT (IPv6 in IPv4)",
        node_dev: "sit0",
        pod_args: "type sit local {pod} remote {gw}",
        inner_v6: true,
        outer_v6: false,
    },
    Tunnel {
        name: "ip6tnl (IPv6 in IPv6)",
        node_dev: "ip6tnl0",
        pod_args: "type ip6tnl mode ip6ip6 local {pod} remote {gw}",
        inner_v6: true,
        outer_v6: true,
    },
    Tunnel {
        name: "ip6gre",
        node_dev: "ip6gre0",
        pod_args: "type ip6gre local {pod} remote {gw}",
        inner_v6: true,
        outer_v6: true,
    },
];

/// The control of one tunnel: a connection through it to `dst` (remote-in) is answered and
/// seen from the inner source `src`. Up to three connections, each bounded by a third of the
/// deadline: each one is a new flow (a new source port), so one handshake lost under emulation
/// does not hold the next back for the rest of the deadline. Each failed one is reported with
/// what the node and the pod saw of the tunnel; three failures fail the test.
fn tunnel_control(w: &World, pod: &Pod, dst: SocketAddr, src: IpAddr, t: &Tunnel) {
    let per = deadline(IO_TIMEOUT) / 3;
    let mut seen = Vec::new();
    for attempt in 1..=3 {
        let got = tcp_whoami_within(&pod.ns, dst, per);
        if got == Ok(src) {
            return;
        }
        let show = |ns: &Netns, args: &[&str]| ns.try_run(args).unwrap_or_else(|e| e);
        eprintln!(
            "control: {} attempt {attempt} from {src} to {dst}: {got:?}\n\
             node: ip -s link show {}\n{}node: conntrack -L\n{}node: ip neigh\n{}\
             pod: ip -s link\n{}pod: ip neigh\n{}",
            t.name,
            t.node_dev,
            show(&w.node, &["ip", "-s", "link", "show", t.node_dev]),
            show(&w.node, &["conntrack", "-L"]),
            show(&w.node, &["ip", "neigh"]),
            show(&pod.ns, &["ip", "-s", "link"]),
            show(&pod.ns, &["ip", "neigh"]),
        );
        seen.push(got);
    }
    panic!(
        "control: {} from the default pod to {dst}, inner source {src}: three connections \
         failed: {seen:?}",
        t.name
    );
}

#[test]
fn metadata_tcp_tunnelled_to_the_node_never_reaches_real_metadata() {
    require_root();
    let w = real_world("kf-tun");
    let chain = w.chain(w.list(
        "kftun",
        "1.0.0",
        0,
        Some(exempt_cfg(&w, json!({ "logLevel": "info" }))),
    ));
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let pod = w.add_pod(&chain, "web", "default");
    control_metadata(&exempt, REAL, "exempt pod");
    control_metadata(&pod, "proxy", "default pod");
    control_network(&pod, "default pod");
    let (gw4, gw6) = gateways(&pod);
    let (in4, in6) = unused_in_subnet(&pod);
    // The inner sources live on the pod's eth0 (so it answers ARP and neighbour solicitations
    // for them); its tunnel devices only carry the routes.
    pod.ns.addr("eth0", &format!("{in4}/32"));
    pod.ns.ip(&format!("addr add {in6}/128 dev eth0 nodad"));
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &[
            ("in4", format!("ip saddr {in4} {SYN}")),
            ("in6", format!("ip6 saddr {in6} {SYN}")),
        ],
    );
    let mut f = Findings::new();
    for (i, t) in TUNNELS.iter().enumerate() {
        need(&w.node, &format!("link set {} up", t.node_dev), t.name);
        let dev = format!("t{i}");
        let (local, remote) = if t.outer_v6 {
            (pod.v6, gw6)
        } else {
            (pod.v4, gw4)
        };
        let args = t
            .pod_args
            .replace("{pod}", &local.to_string())
            .replace("{gw}", &remote.to_string());
        need(&pod.ns, &format!("link add {dev} {args}"), t.name);
        pod.ns.ip(&format!("link set {dev} up"));
        let (meta, remote_in, src, fam) = if t.inner_v6 {
            (META6, REMOTE_IN6, in6, "-6 ")
        } else {
            (META4, REMOTE_IN4, in4, "")
        };
        for dst in [meta, remote_in] {
            pod.ns
                .ip(&format!("{fam}route replace {dst} dev {dev} src {src}"));
        }
        // Control: the tunnel works, to a host that is not the metadata server.
        tunnel_control(&w, &pod, sa(remote_in, WHOAMI_PORT), src, t);
        let name = if t.inner_v6 { "in6" } else { "in4" };
        let before = counters.packets(name);
        let got = http_get(&pod.ns, sa(meta, HTTP_PORT));
        f.not_real(
            &got,
            &format!(
                "the default pod -> {} tunnel -> http://{meta}/ from {src}",
                t.name
            ),
        );
        let k = counters.packets(name) - before;
        f.check(k == 0, || {
            format!(
                "{k} SYN(s) from {src} through the {} tunnel reached the metadata host",
                t.name
            )
        });
        for dst in [meta, remote_in] {
            pod.ns.ip(&format!("{fam}route del {dst} dev {dev}"));
        }
        pod.ns.ip(&format!("link del {dev}"));
    }
    pod.ns.ip(&format!("addr del {in4}/32 dev eth0"));
    pod.ns.ip(&format!("addr del {in6}/128 dev eth0"));
    control_metadata(&exempt, REAL, "exempt pod after the attacks");
    control_network(&pod, "default pod after the attacks");
    f.finish("tunnels");
}

// ---------------------------------------------------------------------------------------------
// 3. A VLAN-filtering bridge network: tagged claims of the exempt pod's address, MAC theft
// ---------------------------------------------------------------------------------------------

const VLAN: u16 = 100;

/// The world with one bridge network whose bridge filters VLANs (the bridge plugin's `vlan`).
fn vlan_world(test: &str) -> (World, Chain) {
    let w = real_world(test);
    let mut list = w.list(
        "kfvlan",
        "1.0.0",
        0,
        Some(exempt_cfg(&w, json!({ "logLevel": "info" }))),
    );
    list["plugins"][0]["vlan"] = json!(VLAN);
    let chain = w.chain(list);
    (w, chain)
}

/// The node's device the route to `pod` leaves by, its MAC and its IPv6 link-local address.
fn node_ip_device(w: &World, pod: IpAddr) -> (String, String, String) {
    let out = w.node.ip(&format!("-j route get {pod}"));
    let v: Value = serde_json::from_str(&out).expect("ip -j route get");
    let dev = v[0]["dev"]
        .as_str()
        .unwrap_or_else(|| panic!("no device in the node's route to {pod}: {out}"))
        .to_string();
    let out = w.node.ip(&format!("-6 -j addr show dev {dev} scope link"));
    let v: Value = serde_json::from_str(&out).expect("ip -j addr");
    let ll = v[0]["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|a| a["local"].as_str())
        .unwrap_or_else(|| panic!("no link-local address on the node's {dev}: {out}"))
        .to_string();
    let mac = mac_of(&w.node, &dev);
    (dev, mac, ll)
}

#[test]
fn tagged_claims_of_the_exempt_address_on_a_vlan_bridge_never_reach_the_metadata_host() {
    require_root();
    let (w, chain) = vlan_world("kf-vtag");
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&chain, "thief", "default");
    let vf = w.node.run(&["ip", "-d", "link", "show", "cni0"]);
    assert!(
        vf.contains("vlan_filtering 1"),
        "the bridge does not filter VLANs:\n{vf}"
    );
    control_metadata(&exempt, REAL, "exempt pod");
    control_metadata(&thief, "proxy", "default pod");
    control_network(&thief, "default pod");
    let (gw4, _) = gateways(&thief);
    // The node's IP device for the pod (`cni0.VLAN`): its MAC and IPv6 link-local address are
    // the thief's next hop on every tagged interface, with static neighbour entries so that the
    // tagged frames are really sent (neighbour discovery on them would be dropped first).
    let (node_dev, node_mac, node_ll) = node_ip_device(&w, exempt.v4);
    let table = w.table().expect("natguard's table");
    let key = format!("\"{node_dev}\" . {}", exempt.v4);
    assert!(
        node_dev != "cni0" && set_block(&table, "exempt4").is_some_and(|b| b.contains(&key)),
        "the exempt pod should be keyed by the bridge's IP device {node_dev} ({key}) in\n{table}"
    );

    // The thief's tagged interfaces: VLAN 0 (priority tag), the network's VLAN, and 802.1ad
    // outside 802.1Q; each carries the exempt pod's addresses.
    need(
        &thief.ns,
        "link add link eth0 name v0 type vlan id 0",
        "8021q",
    );
    need(
        &thief.ns,
        &format!("link add link eth0 name v{VLAN} type vlan id {VLAN}"),
        "8021q",
    );
    need(
        &thief.ns,
        &format!("link add link eth0 name qa type vlan proto 802.1ad id {VLAN}"),
        "802.1ad",
    );
    need(
        &thief.ns,
        &format!("link add link qa name qq type vlan id {VLAN}"),
        "8021q",
    );
    let devs = ["v0".to_string(), format!("v{VLAN}"), "qq".to_string()];
    for d in ["v0", &format!("v{VLAN}"), "qa", "qq"] {
        thief.ns.ip(&format!("link set {d} up"));
    }
    let counters = Counters::install(
        &w.h,
        &w.cloud,
        &syns_to_metadata(("stolen4", "stolen6"), (exempt.v4, exempt.v6)),
    );
    // Control: the exempt pod's own SYNs are counted.
    send_segments(&w.h, &exempt.ns, exempt.v4, META4, 80, 3, &[0x02]);
    send_segments(&w.h, &exempt.ns, exempt.v6, META6, 80, 3, &[0x02]);
    counters.wait(&["stolen4", "stolen6"], 3, "the exempt pod's own SYNs");
    std::thread::sleep(Duration::from_millis(200));

    let mut f = Findings::new();
    for d in &devs {
        let base = [counters.packets("stolen4"), counters.packets("stolen6")];
        thief.ns.ip(&format!("addr add {}/32 dev {d}", exempt.v4));
        thief
            .ns
            .ip(&format!("addr add {}/128 dev {d} nodad", exempt.v6));
        thief
            .ns
            .ip(&format!("neigh replace {gw4} lladdr {node_mac} dev {d}"));
        thief.ns.ip(&format!(
            "-6 neigh replace {node_ll} lladdr {node_mac} dev {d}"
        ));
        thief.ns.ip(&format!(
            "route replace {META4}/32 via {gw4} dev {d} onlink src {}",
            exempt.v4
        ));
        thief.ns.ip(&format!(
            "-6 route replace {META6}/128 via {node_ll} dev {d} src {}",
            exempt.v6
        ));
        // Full connections (the node's neighbour entries may point at the thief now) ...
        for t in metas() {
            let got = http_get(&thief.ns, t);
            f.not_real(
                &got,
                &format!("the thief on {d} claiming the exempt pod's address -> http://{t}/"),
            );
        }
        // ... and bare SYNs, counted at the metadata host.
        send_segments(&w.h, &thief.ns, exempt.v4, META4, 80, 3, &[0x02]);
        send_segments(&w.h, &thief.ns, exempt.v6, META6, 80, 3, &[0x02]);
        std::thread::sleep(Duration::from_millis(500));
        for (i, fam) in ["4", "6"].iter().enumerate() {
            let k = counters.packets(&format!("stolen{fam}")) - base[i];
            f.check(k == 0, || {
                format!("{k} packet(s) the thief sent on {d} from the exempt pod's IPv{fam} address reached the metadata host")
            });
        }
        thief.ns.ip(&format!("route del {META4}/32"));
        thief.ns.ip(&format!("-6 route del {META6}/128"));
        thief.ns.ip(&format!("addr del {}/32 dev {d}", exempt.v4));
        thief.ns.ip(&format!("addr del {}/128 dev {d}", exempt.v6));
    }
    f.finish("tagged claims on a VLAN-filtering bridge");
}

/// A port natguard never saw on the VLAN-filtering bridge trunks the network's VLAN (a VXLAN
/// device here; a VM's tap or a bonded uplink have the same shape, and none is a veth). Frames
/// from it tagged with the network's VLAN id that claim the exempt pod's addresses would leave
/// the bridge untagged at the node's IP device of that VLAN, where those addresses are exempt:
/// not one SYN may reach the metadata host, single-tagged or with an 802.1ad tag outside.
/// Controls: the exempt pod's own SYNs arrive, and the same tagged SYNs from an address of the
/// subnet that nobody holds, to the cloud's own address, arrive (the trunk delivers).
#[test]
fn tagged_claims_from_a_trunk_port_natguard_never_saw_never_reach_the_metadata_host() {
    require_root();
    let (w, chain) = vlan_world("kf-vtrunk");
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let sender = w.add_pod(&chain, "sender", "default");
    control_metadata(&exempt, REAL, "exempt pod");
    control_network(&exempt, "exempt pod");
    control_network(&sender, "default pod");
    let (gw4, _) = gateways(&sender);
    let (node_dev, node_mac, _) = node_ip_device(&w, exempt.v4);
    w.node.ip(&format!(
        "link add vxtrunk type vxlan id 43 dstport 4789 local {gw4} nolearning"
    ));
    w.node.ip("link set vxtrunk master cni0");
    w.node.ip("link set vxtrunk up");
    w.node.run(&[
        "bridge",
        "vlan",
        "add",
        "dev",
        "vxtrunk",
        "vid",
        &VLAN.to_string(),
    ]);
    let (free4, free6) = unused_in_subnet(&exempt);
    let (cloud4, cloud6) = (CLOUD4, CLOUD6);
    let mut rules = syns_to_metadata(("stolen4", "stolen6"), (exempt.v4, exempt.v6)).to_vec();
    rules.push((
        "ctl4",
        format!("ip saddr {free4} ip daddr {cloud4} tcp dport 80"),
    ));
    rules.push((
        "ctl6",
        format!("ip6 saddr {free6} ip6 daddr {cloud6} tcp dport 80"),
    ));
    let counters = Counters::install(&w.h, &w.cloud, &rules);
    send_segments(&w.h, &exempt.ns, exempt.v4, META4, 80, 3, &[0x02]);
    send_segments(&w.h, &exempt.ns, exempt.v6, META6, 80, 3, &[0x02]);
    counters.wait(&["stolen4", "stolen6"], 3, "the exempt pod's own SYNs");
    std::thread::sleep(Duration::from_millis(200));
    let base = [counters.packets("stolen4"), counters.packets("stolen6")];

    const EACH: u32 = 3;
    let mut f = Findings::new();
    for tags in ["q100", "adq100"] {
        let inner = Inner {
            vni: 43,
            dmac: &node_mac,
            tags,
        };
        let send = |src: IpAddr, dst: IpAddr| {
            send_vxlan_frames(&w, &sender, gw4, &inner, &src.to_string(), dst, EACH)
        };
        send(exempt.v4, META4);
        send(exempt.v6, META6);
        if tags == "q100" {
            send(free4, cloud4);
            send(free6, cloud6);
            counters.wait(
                &["ctl4", "ctl6"],
                u64::from(EACH),
                &format!(
                    "tagged SYNs from the trunk to the cloud's own address, through {node_dev}"
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(500));
        for (i, fam) in ["4", "6"].iter().enumerate() {
            let k = counters.packets(&format!("stolen{fam}")) - base[i];
            f.check(k == 0, || {
                format!("{k} SYN(s) tagged {tags} from the trunk with the exempt pod's IPv{fam} address reached the metadata host")
            });
        }
    }
    control_metadata(&exempt, REAL, "exempt pod after the attack");
    f.finish("tagged claims from a trunk port natguard never saw");
}

/// The pod's bridge port: the host-side interface of its result that is not the bridge.
fn exempt_port(pod: &Pod) -> String {
    let ifs = pod.result["interfaces"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ifs.iter()
        .filter(|i| i.get("sandbox").is_none())
        .filter_map(|i| i["name"].as_str())
        .find(|n| *n != "cni0")
        .unwrap_or_else(|| panic!("no bridge port in {}", pod.result))
        .to_string()
}

#[test]
fn mac_theft_of_the_exempt_pod_on_a_vlan_bridge_overhears_nothing() {
    require_root();
    let (w, chain) = vlan_world("kf-vmac");
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&chain, "thief", "default");
    control_metadata(&exempt, REAL, "exempt pod");
    control_network(&exempt, "exempt pod");
    control_metadata(&thief, "proxy", "default pod");
    let (gw4, gw6) = gateways(&thief);
    let mac = mac_of(&exempt.ns, "eth0");
    let overheard = Counters::install(
        &w.h,
        &thief.ns,
        &[
            ("to4", format!("ip daddr {}", exempt.v4)),
            ("to6", format!("ip6 daddr {}", exempt.v6)),
        ],
    );
    // The thief takes the exempt pod's MAC and sends frames with it, untagged and tagged.
    let own_mac = mac_of(&thief.ns, "eth0");
    thief.ns.ip(&format!("link set eth0 address {mac}"));
    need(
        &thief.ns,
        &format!("link add link eth0 name v{VLAN} type vlan id {VLAN}"),
        "8021q",
    );
    thief.ns.ip(&format!("link set v{VLAN} up"));
    let mut f = Findings::new();
    for dev in ["eth0".to_string(), format!("v{VLAN}")] {
        let _ = thief.ns.try_run(&[
            "ping",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "1",
            "-I",
            &dev,
            &gw4.to_string(),
        ]);
        let _ = thief.ns.try_run(&[
            "ping",
            "-6",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "1",
            "-I",
            &dev,
            &gw6.to_string(),
        ]);
        // What the node sends to the exempt pod now: the cloud's answers, the node's pings.
        let _ = w.node.try_run(&[
            "ping",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            &exempt.v4.to_string(),
        ]);
        let _ = w.node.try_run(&[
            "ping",
            "-6",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            &exempt.v6.to_string(),
        ]);
        let fdb = w.node.run(&["bridge", "fdb", "show", "br", "cni0"]);
        let port = exempt_port(&exempt);
        for line in fdb.lines().filter(|l| l.starts_with(&mac)) {
            f.check(line.contains(&format!("dev {port} ")), || {
                format!("after frames from the thief on {dev}, the bridge learnt the exempt pod's MAC elsewhere: {line}")
            });
        }
        for (name, fam) in [("to4", "IPv4"), ("to6", "IPv6")] {
            let k = overheard.packets(name);
            f.check(k == 0, || {
                format!("the thief ({dev}) overheard {k} packet(s) sent to the exempt pod's {fam} address")
            });
        }
    }
    // Back to its own MAC, the thief is an ordinary pod again (frames with the exempt pod's MAC
    // from its port stay dropped, so the control needs the thief's own MAC).
    thief.ns.ip(&format!("link del v{VLAN}"));
    thief.ns.ip(&format!("link set eth0 address {own_mac}"));
    thief.ns.ip("neigh flush dev eth0");
    control_metadata(&thief, "proxy", "default pod after the attack");
    f.finish("MAC theft on a VLAN-filtering bridge");
}

/// An exempt identity holds only for what crossed the exempt pod's own veth, on this kernel:
/// the veth's netdev ingress chain marks its frames, and the mark survives the bridge into the
/// IP layer. A pod on the exempt pod's bridge that takes its address never reaches the REAL
/// server; a pod natguard never saw, on another bridge, that holds the same address keeps its
/// frames (they reach the node on its bridge) and is reset at the metadata address like any
/// pod; the exempt pod's own SYNs reach the metadata host. No bridge table is written.
#[test]
fn an_exempt_identity_holds_only_for_what_crossed_its_own_veth() {
    require_root();
    let w = real_world("kf-veth");
    let list = w.list("kfveth", "1.0.0", 0, Some(exempt_cfg(&w, json!({}))));
    let own_bridge = list["plugins"][0]["bridge"].as_str().unwrap().to_string();
    let chain = w.chain(list);
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&chain, "thief", "default");
    let tables = w.node.run(&["nft", "list", "tables"]);
    assert!(
        tables.contains("table netdev natguard") && !tables.contains("table bridge natguard"),
        "{tables}"
    );
    control_metadata(&exempt, REAL, "exempt pod");
    // A bridge of a network that does not list natguard, and a pod on it.
    let list = w.list("kfvethother", "1.0.0", 1, None);
    let other_bridge = list["plugins"][0]["bridge"].as_str().unwrap().to_string();
    let other = w.chain(list);
    let stranger = w.add_pod(&other, "stranger", "default");
    let (other_gw, _) = gateways(&stranger);
    let x = exempt.v4;
    let (gw4, _) = gateways(&thief);
    // The thief's gateway, pinned: the node answers no ARP that claims the exempt address.
    let bridge_mac = mac_of(&w.node, &own_bridge);
    thief.ns.ip(&format!(
        "neigh replace {gw4} lladdr {bridge_mac} dev eth0 nud permanent"
    ));
    for pod in [&thief, &stranger] {
        pod.ns.addr("eth0", &format!("{x}/32"));
    }
    thief
        .ns
        .ip(&format!("route replace {META4}/32 via {gw4} src {x}"));
    stranger
        .ns
        .ip(&format!("route replace {META4}/32 via {other_gw} src {x}"));
    let counters = Counters::install(
        &w.h,
        &w.node,
        &[(
            "other",
            format!("iifname \"{other_bridge}\" ip saddr {x} tcp dport 80 {SYN}"),
        )],
    );
    let at_meta = Counters::install(
        &w.h,
        &w.cloud,
        &[(
            "stolen",
            format!("ip saddr {x} ip daddr {META4} tcp dport 80 {SYN}"),
        )],
    );
    const EACH: u32 = 3;
    let mut f = Findings::new();
    for pod in [&thief, &stranger] {
        send_segments(&w.h, &pod.ns, x, META4, 80, EACH, &[0x02]);
    }
    send_segments(&w.h, &stranger.ns, x, other_gw, 80, EACH, &[0x02]);
    counters.wait(
        &["other"],
        u64::from(EACH),
        "the stranger's SYNs to its own bridge's address",
    );
    std::thread::sleep(Duration::from_millis(500));
    let n = at_meta.packets("stolen");
    f.check(n == 0, || {
        format!("{n} SYNs with the exempt pod's address from pods that are not it reached the metadata host")
    });
    send_segments(&w.h, &exempt.ns, x, META4, 80, EACH, &[0x02]);
    at_meta.wait(&["stolen"], u64::from(EACH), "the exempt pod's own SYNs");
    control_metadata(&exempt, REAL, "exempt pod after the claims");
    f.finish("an exempt identity on its own veth");
}

/// A pod natguard never saw on the exempt pod's bridge sends frames tagged with VLAN id 100 to
/// the node: SYNs from the exempt pod's addresses to the metadata addresses. The node has a
/// VLAN device of that id on the bridge, so the frames reach its IP layer there, and from there
/// a route to the metadata host. None arrives: they never crossed the exempt pod's veth, so
/// wherever they enter they carry no exemption. Control: the same tagged frames from the
/// thief's own addresses to the cloud's other address do arrive (the path is open), and the
/// exempt pod keeps its own.
#[test]
fn vlan_tagged_frames_with_an_id_from_a_pod_natguard_never_saw_never_reach_real_metadata() {
    require_root();
    let w = real_world("kf-vlan-id");
    let chain = w.chain(w.list("vlanid", "1.1.0", 0, Some(exempt_cfg(&w, json!({})))));
    let exempt = w.add_pod(&chain, "sys", EXEMPT_NS);
    let thief = w.add_pod(&unguarded_on_cni0(&w), "thief", "default");
    for cmd in [
        "ip link add link cni0 name cni0.100 type vlan id 100",
        "ip addr add 10.199.0.1/24 dev cni0.100",
        "ip -6 addr add fd00:199::1/64 dev cni0.100 nodad",
        "ip link set cni0.100 up",
    ] {
        w.on_node(cmd);
    }
    let counters = Counters::install(&w.h, &w.cloud, &claim_counters(&exempt, &thief));
    const EACH: u64 = 3;
    let mac = mac_of(&thief.ns, "eth0");
    let bridge_mac = mac_of(&w.node, "cni0");
    for (src, dst) in [
        (exempt.v4, META4),
        (exempt.v6, META6),
        (thief.v4, CLOUD4),
        (thief.v6, CLOUD6),
    ] {
        let args = syn_frames(src, dst, EACH);
        send_frames(&w, &thief, &mac, &bridge_mac, "q100", &args);
    }
    counters.wait(&["own4"], EACH, "the thief's tagged IPv4 SYNs to the cloud");
    counters.wait(&["own6"], EACH, "the thief's tagged IPv6 SYNs to the cloud");
    std::thread::sleep(Duration::from_millis(200));
    let mut f = Findings::new();
    for name in ["stolen4", "stolen6"] {
        let n = counters.packets(name);
        f.check(n == 0, || {
            format!("{n} SYN(s) tagged with VLAN id 100 from the exempt pod's address reached the metadata host ({name})")
        });
    }
    control_metadata(&exempt, REAL, "the exempt pod after the tagged frames");
    f.finish("frames tagged with a VLAN id from a pod natguard never saw");
}
