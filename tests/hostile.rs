//! Hostile pods and hostile input: pods must never reach the real metadata server (not from a
//! namespace whose name merely resembles the exempt one, not from a source address natguard did
//! not record); ambiguous namespaces in CNI_ARGS are refused; a symlink planted at `logFile` is
//! not followed and shell syntax in CNI_ARGS runs nothing; look-alike tables, chains and sets of
//! others, some with natguard's own names, are never touched; a DEL whose prevResult names the
//! node's own or the metadata addresses flushes only the pod's conntrack entries.
//!
//! The tests that need real traffic use the standard topology of `common::World` (bridge +
//! host-local pods, a metadata server, a node-local proxy). The others run the real binary with
//! synthetic pods (`common::synthetic`, `common::run`) in a namespace of their own.
//!
//! Needs root (network namespaces, nf_tables); never skips. See also `tests/security.rs`, the
//! attacks on the metadata promise.

mod common;

use common::run::Natguard;
use common::synthetic::*;
use common::*;
use serde_json::json;
use std::fs;

/// From its first packet, a pod never reaches the real metadata server: not through either
/// configured port, not over IPv6, not while the proxy is down (refused instead), and not from
/// a namespace whose name merely resembles the exempt one. Namespace names that would be
/// ambiguous are refused at ADD. The exempt namespace itself does reach the server, which shows
/// the negative results are the policy's doing.
#[test]
fn pods_never_reach_the_real_metadata_server() {
    let w = World::new("sec-meta");
    w.h.http_server(&w.cloud, 8080, "cloud");
    let ng = w.natguard(json!({
        "metadata": { "ports": [80, 8080], "exemptNamespaces": ["kube-system"] }
    }));
    let chain = w.chain(w.list("ngnet", "1.1.0", 0, Some(ng.clone())));
    let targets = [
        sa(META4, 80),
        sa(META4, 8080),
        sa(META6, 80),
        sa(META6, 8080),
    ];
    let expect = |pod: &Pod, want: &Outcome, when: &str| {
        for t in targets {
            let got = http_get(&pod.ns, t);
            assert_eq!(
                &got, want,
                "{when}: pod {} (namespace {}) -> http://{t}/",
                pod.att.container_id, pod.att.args[3].1
            );
        }
    };
    // While the proxy is down, a brand-new pod's very first connections are refused.
    w.stop_proxy();
    let early = w.add_pod(&chain, "early", "default");
    expect(&early, &Outcome::Refused, "proxy down, first packets");
    let control = w.add_pod(&chain, "sys", "kube-system");
    expect(&control, &body("cloud"), "exempt namespace");
    let lookalikes: Vec<Pod> = ["kube-system-x", "kube-syste", "xkube-system", "default"]
        .iter()
        .enumerate()
        .map(|(i, ns)| w.add_pod(&chain, &format!("look{i}"), ns))
        .collect();
    for p in &lookalikes {
        expect(p, &Outcome::Refused, "proxy down");
    }
    // Proxy back up: the proxy answers, never the cloud.
    let proxy = w.h.http_server(&w.node, PROXY_PORT, "proxy");
    for p in lookalikes.iter().chain([&early]) {
        expect(p, &body("proxy"), "proxy up");
    }
    w.h.stop(&proxy);
    for p in lookalikes.iter().chain([&early]) {
        expect(p, &Outcome::Refused, "proxy down again");
    }

    // Ambiguous or invalid namespaces are refused (code 4) and change nothing.
    let before = w.table().expect("table");
    let ruleset_before = nft_ruleset(&w.node);
    let prev = json!({
        "cniVersion": "1.1.0",
        "interfaces": [{ "name": "eth0", "sandbox": "/run/netns/x" }],
        "ips": [{ "address": "10.244.0.200/24", "interface": 0 }]
    });
    let mut conf = ng.clone();
    conf["name"] = json!("ngnet");
    conf["cniVersion"] = json!("1.1.0");
    conf["prevResult"] = prev;
    let bad_args = [
        "K8S_POD_NAMESPACE=KUBE-SYSTEM;K8S_POD_NAME=p",
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAMESPACE=default",
        "K8S_POD_NAMESPACE=default;K8S_POD_NAMESPACE=kube-system",
        "K8S_POD_NAMESPACE=kube-system ;K8S_POD_NAME=p",
        "K8S_POD_NAMESPACE= kube-system",
        "K8S_POD_NAMESPACE=kube-system\n",
        "K8S_POD_NAMESPACE=kube_system",
    ];
    for args in bad_args {
        let att = Attachment {
            container_id: "cid-bad".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: Vec::new(),
            cap_args: Default::default(),
        };
        let mut env = Chain::env("ADD", Some(&att), None);
        for (k, v) in env.iter_mut() {
            if k == "CNI_ARGS" {
                *v = args.to_string();
            }
        }
        let e = chain
            .exec("natguard", &conf, env)
            .expect_err(&format!("ADD with CNI_ARGS {args:?} must be refused"));
        assert_eq!(e.code, Some(4), "CNI_ARGS {args:?}: {e}");
        assert!(
            e.details.contains("K8S_POD_NAMESPACE"),
            "CNI_ARGS {args:?}: the error should name K8S_POD_NAMESPACE: {e}"
        );
    }
    assert_eq!(w.table().as_deref(), Some(before.as_str()));
    assert_eq!(nft_ruleset(&w.node), ruleset_before);
    for p in lookalikes.iter().chain([&early, &control]) {
        chain.del(&p.att).unwrap_or_else(|e| panic!("DEL: {e}"));
    }
}

/// A pod that sends from an address of its subnet that natguard did not record (a second
/// address on its interface: any pod with NET_ADMIN, or NET_RAW and a userspace stack) must
/// not reach the real metadata server either: it is not DNATed (interception matches the
/// recorded pod addresses, `iifname . ip saddr @NET-redir4`), and the fail-closed rules reset it because
/// it comes from one of the network's pod interfaces.
#[test]
fn pod_with_an_unrecorded_source_address_never_reaches_metadata() {
    let w = World::new("sec-spoof");
    let entry = w.natguard(json!({}));
    let chain = w.chain(w.list("ngnet", "1.1.0", 0, Some(entry.clone())));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_eq!(http_get(&pod.ns, sa(META4, 80)), body("proxy"));
    // The pod adds an unused address of its own subnet and uses it towards the metadata server.
    let gw4 = "10.244.0.1";
    let gw6 = "fd00:10:244::1";
    pod.ns.addr("eth0", "10.244.0.250/24");
    pod.ns.addr("eth0", "fd00:10:244::fa/64");
    pod.ns.ip(&format!(
        "route replace {META4}/32 via {gw4} src 10.244.0.250"
    ));
    pod.ns.ip(&format!(
        "-6 route replace {META6}/128 via {gw6} src fd00:10:244::fa"
    ));
    for meta in [META4, META6] {
        let got = http_get(&pod.ns, sa(meta, 80));
        assert_ne!(
            got,
            body("cloud"),
            "a pod sending from an unrecorded address of its subnet reached the real metadata server at {meta}"
        );
    }
    // Positive control: the hostile routes do carry the request. natguard's DEL alone (the
    // pod's veth and addresses stay) changes nothing: the node-wide guard still admits no
    // such source. With natguard's tables gone, the same request from the same unrecorded
    // address reaches the real server: the refusals above were natguard's, not a broken
    // route's.
    let conf = common::attack::natguard_conf(&entry, "ngnet", "1.1.0", Some(&pod.result));
    common::attack::natguard_verb(&chain, "DEL", &conf, &pod.att)
        .unwrap_or_else(|e| panic!("natguard's DEL: {e}"));
    for meta in [META4, META6] {
        let got = http_get(&pod.ns, sa(meta, 80));
        assert_ne!(
            got,
            body("cloud"),
            "after natguard's DEL, {meta} is still guarded"
        );
    }
    w.on_node("nft delete table inet natguard");
    for meta in [META4, META6] {
        let got = http_get(&pod.ns, sa(meta, 80));
        assert_eq!(
            got,
            body("cloud"),
            "control: without natguard's entries the unrecorded address should reach {meta}"
        );
    }
    chain.del(&pod.att).unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// `logFile` is opened without following a symlink planted in its place (to an existing file
/// or to a path that does not exist yet); a plain path is written. Shell syntax in CNI_ARGS
/// runs nothing.
#[test]
fn log_file_symlink_is_not_followed_and_args_reach_no_shell() {
    let (h, ns) = synthetic_node("sec-log");
    let dir = h.dir();
    let outside = dir.join("outside");
    fs::create_dir_all(&outside).unwrap();
    let target = outside.join("precious");
    fs::write(&target, "precious\n").unwrap();
    let link = dir.join("natguard.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let missing_target = outside.join("created-by-natguard");
    let dangling = dir.join("dangling.log");
    std::os::unix::fs::symlink(&missing_target, &dangling).unwrap();
    let plain = dir.join("plain.log");
    let marker = dir.join("pwned");
    let m = marker.to_str().unwrap();
    for (i, log) in [&link, &dangling, &plain].iter().enumerate() {
        let mut cfg = cfg_a();
        cfg["logFile"] = json!(log);
        // The ADD lines checked below are info lines; the default level writes warnings only.
        cfg["logLevel"] = json!("info");
        let mut p = SynPod::numbered("l", i as u32 + 1, 0);
        p.name = format!("$(touch${{IFS}}{m})`touch${{IFS}}{m}`");
        for verb in ["ADD", "CHECK", "DEL"] {
            p.invocation(verb, &cfg).run_in(&ns).succeeded();
        }
    }
    assert_eq!(
        fs::read_to_string(&target).unwrap(),
        "precious\n",
        "natguard wrote through the symlink planted at logFile"
    );
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the planted symlink was replaced"
    );
    assert!(
        !missing_target.exists(),
        "natguard created the target of a dangling symlink at logFile"
    );
    let text = fs::read_to_string(&plain).expect("a plain logFile is written");
    assert!(text.contains("ADD"), "log: {text}");
    assert!(!marker.exists(), "CNI_ARGS reached a shell");
}

/// Foreign tables, chains and sets, some with natguard's own object names, in `table inet
/// other`, `table ip nat`, `table ip natguard` and `table ip6 natguard` are byte-identical
/// after ADD, DEL, CHECK, GC, STATUS, a config change, churn, a restore after `nft delete
/// table inet natguard`, and reconcile.
#[test]
fn foreign_tables_are_never_touched() {
    let (h, ns) = synthetic_node("sec-foreign");
    let cfg = cfg_a();
    let p0 = SynPod::numbered("o", 1, 0);
    let script = format!(
        r#"
table inet other {{
    set {net}-pods {{ type ifname; elements = {{ "{owner}" comment "foreign" }} }}
    set {net}-redir4 {{ type ipv4_addr; elements = {{ {v4} comment "{owner}" }} }}
    chain {net}-dnat {{
        type nat hook prerouting priority -110; policy accept;
        ip daddr 169.254.169.254 tcp dport 80 dnat ip to 10.0.0.9:81 comment "natguard {net} 0000000000000000"
    }}
    chain plain {{ ip saddr @{net}-redir4 accept; }}
}}
table ip nat {{
    set keep {{ type ipv4_addr; flags interval; elements = {{ 10.0.0.0/8 }} }}
    chain PREROUTING {{ type nat hook prerouting priority dstnat; policy accept; }}
    chain POSTROUTING {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr 10.64.0.0/16 ip daddr != @keep masquerade
    }}
}}
table ip natguard {{
    set {net}-redir4 {{ type ipv4_addr; elements = {{ {v4} }} }}
    chain {net}-dnat {{
        type nat hook prerouting priority -110; policy accept;
        ip saddr @{net}-redir4 return comment "natguard {net} 0000000000000000"
    }}
}}
table ip6 natguard {{
    set {net}-pods {{ type ifname; elements = {{ "{owner}" }} }}
    chain {net}-fwd {{ type filter hook forward priority -10; policy accept; }}
}}
"#,
        net = NET,
        // An ifname key holds at most 15 characters in nft's syntax.
        owner = &p0.owner()[..15],
        v4 = p0.v4
    );
    let file = h.dir().join("foreign.nft");
    fs::write(&file, script).unwrap();
    ns.run(&["nft", "-f", file.to_str().unwrap()]);
    let tables = [
        ["inet", "other"],
        ["ip", "nat"],
        ["ip", "natguard"],
        ["ip6", "natguard"],
    ];
    let snapshot = || -> Vec<String> {
        tables
            .iter()
            .map(|[f, t]| ns.run(&["nft", "list", "table", f, t]))
            .collect()
    };
    let before = snapshot();
    let assert_same = |when: &str| {
        let now = snapshot();
        for (i, [f, t]) in tables.iter().enumerate() {
            assert_eq!(
                before[i], now[i],
                "{when}: natguard changed the foreign table {f} {t}"
            );
        }
    };

    let pods: Vec<SynPod> = (1..=10).map(|i| SynPod::numbered("o", i, 0)).collect();
    for p in &pods {
        add(&ns, &cfg, p).succeeded();
    }
    check(&ns, &cfg, &pods[0]).succeeded();
    status(&ns, &cfg, None).succeeded();
    assert_same("after ADD, CHECK, STATUS");
    add(&ns, &cfg_b(), &SynPod::numbered("ob", 1, 2)).succeeded();
    add(&ns, &cfg, &SynPod::numbered("ob", 2, 2)).succeeded();
    assert_same("after config changes");
    for p in &pods[..4] {
        del(&ns, &cfg, p).succeeded();
    }
    del_bare(&ns, &cfg, &pods[4]).succeeded();
    let valid: Vec<&SynPod> = pods[5..8].iter().collect();
    gc(&ns, &cfg, &valid).succeeded();
    assert_pods_exactly(&must_state(&ns), &pods[5..8], "after GC");
    assert_same("after DEL and GC");
    let churn: Vec<Op> = (0..200)
        .flat_map(|i| {
            let p = SynPod::numbered("oc", i, 1);
            [Op::Add(p.clone()), Op::DelBare(p)]
        })
        .collect();
    // ADDs and DELs of the same pod may run in either order here; only the foreign tables
    // matter, and a final DEL of each cleans up.
    run_ops(&ns, &cfg, churn);
    run_ops(
        &ns,
        &cfg,
        (0..200)
            .map(|i| Op::Del(SynPod::numbered("oc", i, 1)))
            .collect(),
    );
    assert_same("after churn");
    ns.run(&["nft", "delete", "table", "inet", "natguard"]);
    add(&ns, &cfg, &pods[9]).succeeded();
    let cached: Vec<(SynPod, String)> = pods[5..8].iter().map(|p| (p.clone(), ns.path())).collect();
    let (cache, netconf) = write_cni_cache(h.dir(), &cfg, &cached);
    reconcile(&ns, &cache, &netconf).succeeded();
    gc(&ns, &cfg, &[]).succeeded();
    assert_pods_exactly(&must_state(&ns), &[], "after GC of everything");
    assert_same("after restore, reconcile and GC");
}

/// A DEL whose prevResult names addresses that are not the pod's (the node's own, a metadata
/// address, loopback, a prefix-0 network) flushes only the pod's conntrack entries: the node's
/// own flows, its flows to the metadata server and the neighbours' flows stay. The prevResult of
/// DEL comes from a runtime's cache, which a pod cannot write, but a broken cache or a confused
/// runtime must not make natguard tear down the node's connections.
#[test]
fn forged_prev_result_at_del_flushes_only_the_pods_flows() {
    let (_h, ns) = synthetic_node("hostile-del-forged");
    ns.bridge("n0");
    ns.addr("n0", "11.0.0.1/24");
    ns.addr("n0", "2001:db8:bb::1/64");
    let cfg = cfg_a();
    let p = SynPod::numbered("df", 1, 1);
    let inv = add(&ns, &cfg, &p);
    assert_eq!(inv.exit, Some(0), "{inv}");
    let pod4 = p.v4.to_string();
    let insert = |args: &[&str]| conntrack_insert(&ns, args);
    let udp = |s: &str, d: &str, sport: &str| {
        insert(&[
            "-p", "udp", "-s", s, "-d", d, "--sport", sport, "--dport", "53",
        ])
    };
    let tcp = |s: &str, d: &str, sport: &str| {
        insert(&[
            "-p",
            "tcp",
            "-s",
            s,
            "-d",
            d,
            "--sport",
            sport,
            "--dport",
            "80",
            "--state",
            "ESTABLISHED",
        ])
    };
    udp(&pod4, "11.0.0.1", "40000");
    // The node's flows: its own address, its metadata connection, a neighbour in 11.0.0.0/24,
    // and loopback.
    udp("11.0.0.1", "11.0.0.9", "40001");
    tcp("11.0.0.1", "169.254.169.254", "40002");
    tcp("2001:db8:bb::1", "fd00:ec2::254", "40003");
    udp("11.0.0.9", "11.0.0.7", "40004");
    udp("127.0.0.1", "127.0.0.1", "40005");
    let mut forged = p.result();
    forged["ips"] = json!([
        { "address": format!("{pod4}/16"), "interface": 1 },
        { "address": "11.0.0.1/24", "interface": 1 },
        { "address": "2001:db8:bb::1/64", "interface": 1 },
        { "address": "169.254.169.254/32", "interface": 1 },
        { "address": "fd00:ec2::254/128", "interface": 1 },
        { "address": "127.0.0.1/8", "interface": 1 },
        { "address": "11.0.0.9/0", "interface": 1 }
    ]);
    let inv = Natguard::cni(&p.env("DEL"), &stdin_of(&cfg, &p.net, Some(forged))).run_in(&ns);
    assert_eq!(inv.exit, Some(0), "DEL must succeed: {inv}");
    assert!(
        conntrack_list(&ns, &["-s", &pod4]).is_empty(),
        "the pod's flow must be flushed"
    );
    for (src, dst, what) in [
        ("11.0.0.1", "11.0.0.9", "the node's own flow"),
        (
            "11.0.0.1",
            "169.254.169.254",
            "the node's metadata connection",
        ),
        (
            "2001:db8:bb::1",
            "fd00:ec2::254",
            "the node's IPv6 metadata connection",
        ),
        ("11.0.0.9", "11.0.0.7", "a neighbour's flow"),
        ("127.0.0.1", "127.0.0.1", "loopback"),
    ] {
        assert_eq!(
            conntrack_list(&ns, &["-s", src, "-d", dst]).len(),
            1,
            "{what} ({src} -> {dst}) must survive a DEL naming its address: {:?}",
            conntrack_list(&ns, &[])
        );
    }
}
