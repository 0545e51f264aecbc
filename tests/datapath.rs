//! Root integration tests: the real natguard binary chained after Debian's `bridge` +
//! `host-local`, driven like libcni drives a conflist, with real traffic in network namespaces
//! that each test creates (see `common::World` for the topology). Needs root; never skips.

mod common;

use common::*;
use serde_json::{json, Value};
use std::net::IpAddr;

// ---------------------------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------------------------

/// The pod's HTTP requests to both metadata addresses are answered by `who`.
fn assert_metadata(pod: &Pod, who: &str) {
    for meta in [META4, META6] {
        assert_eq!(
            http_get(&pod.ns, sa(meta, HTTP_PORT)),
            body(who),
            "pod {} ({}) -> http://{}/ should be answered by {who}",
            pod.att.container_id,
            pod.v4,
            sa(meta, HTTP_PORT)
        );
    }
}

/// The pod's TCP connections to both metadata addresses are refused (reset), never answered.
fn assert_metadata_refused(pod: &Pod) {
    for meta in [META4, META6] {
        assert_eq!(
            http_get(&pod.ns, sa(meta, HTTP_PORT)),
            Outcome::Refused,
            "pod {} -> http://{}/ should be refused at once (never reach the cloud, never hang)",
            pod.att.container_id,
            sa(meta, HTTP_PORT)
        );
    }
}

/// The who-am-i server at `remote` sees `expected` as the pod's source, over TCP and UDP.
fn assert_sees(pod: &Pod, remote: IpAddr, expected: IpAddr) {
    assert_eq!(
        tcp_whoami(&pod.ns, sa(remote, WHOAMI_PORT)),
        Ok(expected),
        "TCP from pod {} to {remote}: the remote should see {expected}",
        pod.att.container_id
    );
    assert_eq!(
        udp_whoami(&pod.ns, sa(remote, WHOAMI_PORT)),
        Ok(expected),
        "UDP from pod {} to {remote}: the remote should see {expected}",
        pod.att.container_id
    );
}

/// ip-masq-agent semantics for both families: remote-in sees the pod, remote-out sees the node.
fn assert_masquerade_policy(pod: &Pod) {
    assert_sees(pod, REMOTE_IN4, pod.v4);
    assert_sees(pod, REMOTE_IN6, pod.v6);
    assert_sees(pod, REMOTE_OUT4, NODE_OUT4);
    assert_sees(pod, REMOTE_OUT6, NODE_OUT6);
}

/// `nft list table inet natguard` mentions none of the pod's addresses nor its container ID.
fn assert_no_trace(w: &World, pod: &Pod) {
    let Some(table) = w.table() else { return };
    for ip in pod.ips() {
        assert!(
            !mentions(&table, &ip.to_string()),
            "after DEL the table still mentions {ip} of pod {}:\n{table}",
            pod.att.container_id
        );
    }
    assert!(
        !mentions(&table, &pod.att.container_id),
        "after DEL the table still mentions container {}:\n{table}",
        pod.att.container_id
    );
}

/// The table holds the pod's addresses.
fn assert_installed(w: &World, pod: &Pod) {
    let table = w.table().unwrap_or_else(|| {
        panic!(
            "no table inet natguard after ADD of {}",
            pod.att.container_id
        )
    });
    for ip in pod.ips() {
        assert!(
            mentions(&table, &ip.to_string()),
            "table does not mention {ip} of pod {}:\n{table}",
            pod.att.container_id
        );
    }
}

fn ok<T>(r: CniResult<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A world with one network `ngnet` (bridge + host-local + natguard with `patch`).
fn world(test: &str, version: &str, patch: Value) -> (World, Chain) {
    let w = World::new(test);
    let list = w.list("ngnet", version, 0, Some(w.natguard(patch)));
    let chain = w.chain(list);
    (w, chain)
}

// ---------------------------------------------------------------------------------------------
// The harness itself (no natguard involved)
// ---------------------------------------------------------------------------------------------

/// Without natguard the topology reaches the real metadata server, keeps the pod's source
/// everywhere, and another component's MASQUERADE rule (iptables-nft and iptables-legacy)
/// really rewrites traffic to remote-in: so the natguard tests below can tell the difference.
#[test]
fn baseline_topology_without_natguard() {
    let w = World::new("baseline");
    let chain = w.chain(w.list("plain", "1.0.0", 0, None));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_metadata(&pod, "cloud");
    assert_sees(&pod, REMOTE_OUT4, pod.v4);
    assert_sees(&pod, REMOTE_OUT6, pod.v6);
    assert_sees(&pod, REMOTE_IN4, pod.v4);
    assert_eq!(w.table(), None, "no natguard here");

    w.on_node("iptables-nft -t nat -A POSTROUTING ! -d 10.244.0.0/16 -j MASQUERADE");
    w.on_node("ip6tables-nft -t nat -A POSTROUTING ! -d fd00:10:244::/48 -j MASQUERADE");
    assert_sees(&pod, REMOTE_IN4, NODE_IN4);
    assert_sees(&pod, REMOTE_IN6, NODE_IN6);
    // With a nat rule loaded, the node tracks the pod's flows (conntrack_count works).
    let flows = conntrack_count(&w.node, &["-s", &pod.v4.to_string()]);
    assert!(
        flows >= 2,
        "expected the pod's flows in the node's conntrack, got {flows}"
    );
    assert_eq!(conntrack_count(&w.node, &["-s", "192.0.2.99"]), 0);
    w.on_node("iptables-nft -t nat -F POSTROUTING");
    w.on_node("ip6tables-nft -t nat -F POSTROUTING");

    w.on_node("iptables-legacy -t nat -A POSTROUTING ! -d 10.244.0.0/16 -j MASQUERADE");
    w.on_node("ip6tables-legacy -t nat -A POSTROUTING ! -d fd00:10:244::/48 -j MASQUERADE");
    assert_sees(&pod, REMOTE_IN4, NODE_IN4);
    assert_sees(&pod, REMOTE_IN6, NODE_IN6);

    ok(chain.check(&pod.att), "CHECK");
    ok(chain.del(&pod.att), "DEL");
    assert!(!chain.cache_path(&pod.att).exists(), "DEL leaves the cache");
}

/// Dropping the harness (also while unwinding from a panic) kills its processes and deletes its
/// namespaces.
#[test]
fn harness_cleans_up_even_on_panic() {
    type Seen = (String, u32, std::path::PathBuf);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None::<Seen>));
    let inner = seen.clone();
    let r = std::panic::catch_unwind(move || {
        let h = Harness::new("cleanup");
        let ns = h.netns("a");
        let server = h.http_server(&ns, 8080, "x");
        *inner.lock().unwrap() = Some((ns.path(), server.pids[0], h.dir().to_path_buf()));
        panic!("deliberate");
    });
    assert!(r.is_err());
    let (path, pid, dir) = seen.lock().unwrap().clone().expect("harness ran");
    assert!(!std::path::Path::new(&path).exists(), "{path} still exists");
    // SAFETY: signal 0 only checks for existence.
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    assert!(!alive, "server {pid} still running");
    // The test files are kept after a failure, for inspection.
    assert!(dir.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Metadata interception
// ---------------------------------------------------------------------------------------------

#[test]
fn proxy_mode_sends_metadata_to_node_local_proxy() {
    let (w, chain) = world("proxy", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_installed(&w, &pod);
    assert_metadata(&pod, "proxy");
    // Other traffic is not intercepted.
    assert_sees(&pod, REMOTE_IN4, pod.v4);
    ok(chain.del(&pod.att), "DEL");
    assert_no_trace(&w, &pod);
}

#[test]
fn exempt_namespace_reaches_real_metadata_server() {
    let (w, chain) = world(
        "exempt",
        "1.0.0",
        json!({ "metadata": { "exemptNamespaces": ["kube-system"] } }),
    );
    let exempt = w.add_pod(&chain, "sys", "kube-system");
    let normal = w.add_pod(&chain, "app", "default");
    assert_metadata(&exempt, "cloud");
    assert_metadata(&normal, "proxy");
    // Masquerade policy still applies to exempt pods.
    assert_masquerade_policy(&exempt);
    ok(chain.del(&exempt.att), "DEL exempt");
    ok(chain.del(&normal.att), "DEL normal");
    assert_no_trace(&w, &exempt);
    assert_no_trace(&w, &normal);
}

#[test]
fn deny_mode_resets_metadata_connections() {
    let (w, chain) = world("deny", "1.0.0", json!({ "metadata": { "mode": "deny" } }));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_metadata_refused(&pod);
    assert_sees(&pod, REMOTE_IN4, pod.v4);
    ok(chain.del(&pod.att), "DEL");
    assert_no_trace(&w, &pod);
}

#[test]
fn off_mode_leaves_metadata_alone() {
    let (w, chain) = world("off", "1.0.0", json!({ "metadata": { "mode": "off" } }));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_metadata(&pod, "cloud");
    assert_masquerade_policy(&pod);
    ok(chain.del(&pod.att), "DEL");
    assert_no_trace(&w, &pod);
}

/// With the proxy down, the connection is refused by the node; it never falls through to the
/// real metadata server.
#[test]
fn proxy_down_is_refused_never_cloud() {
    let (w, chain) = world("proxydown", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_metadata(&pod, "proxy");
    w.stop_proxy();
    assert_metadata_refused(&pod);
    ok(chain.del(&pod.att), "DEL");
}

// ---------------------------------------------------------------------------------------------
// Masquerade policy
// ---------------------------------------------------------------------------------------------

#[test]
fn masquerade_keeps_pod_source_inside_and_masquerades_outside() {
    let (w, chain) = world("masq", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_masquerade_policy(&pod);
    ok(chain.del(&pod.att), "DEL");
    assert_no_trace(&w, &pod);
}

#[test]
fn masquerade_disabled_keeps_pod_source_everywhere() {
    let (w, chain) = world(
        "nomasq",
        "1.0.0",
        json!({ "masquerade": { "enabled": false } }),
    );
    let pod = w.add_pod(&chain, "pod", "default");
    assert_sees(&pod, REMOTE_OUT4, pod.v4);
    assert_sees(&pod, REMOTE_OUT6, pod.v6);
    assert_metadata(&pod, "proxy");
    ok(chain.del(&pod.att), "DEL");
}

/// natguard's shipped default (`masqueradeOutside` false): it changes no pod's egress beyond
/// the exceptions. Outside nonMasqueradeCIDRs the pod keeps its address while nothing else
/// masquerades, and gets the other component's masquerade where one does; towards
/// nonMasqueradeCIDRs it keeps its address even where the other component would masquerade it.
#[test]
fn by_default_natguard_masquerades_nothing_the_primary_would_not() {
    let (w, chain) = world(
        "masq-default",
        "1.0.0",
        json!({ "masquerade": { "masqueradeOutside": false } }),
    );
    let pod = w.add_pod(&chain, "pod", "default");
    assert_sees(&pod, REMOTE_OUT4, pod.v4);
    assert_sees(&pod, REMOTE_OUT6, pod.v6);
    assert_sees(&pod, REMOTE_IN4, pod.v4);
    assert_sees(&pod, REMOTE_IN6, pod.v6);
    assert_metadata(&pod, "proxy");
    // Another component masquerades everything outside the pod network.
    other_masquerade(&w, "iptables-nft", "ip6tables-nft");
    let late = w.add_pod(&chain, "late", "default");
    for p in [&pod, &late] {
        assert_sees(p, REMOTE_OUT4, NODE_OUT4);
        assert_sees(p, REMOTE_OUT6, NODE_OUT6);
        assert_sees(p, REMOTE_IN4, p.v4);
        assert_sees(p, REMOTE_IN6, p.v6);
    }
    let table = w.table().unwrap();
    assert!(
        !table.contains("counter masquerade"),
        "natguard's own MASQUERADE:\n{table}"
    );
    ok(chain.del(&late.att), "DEL");
    ok(chain.del(&pod.att), "DEL");
}

/// The host-side veth of `pod` in the node namespace: the peer index its `eth0` names.
fn host_veth(w: &World, pod: &Pod) -> String {
    let line = pod.ns.run(&["ip", "-o", "link", "show", "eth0"]);
    let peer = line
        .split("@if")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or_else(|| panic!("no peer index in {line:?}"));
    let links = w.node.run(&["ip", "-o", "link", "show"]);
    links
        .lines()
        .find(|l| l.starts_with(&format!("{peer}: ")))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|n| n.split('@').next())
        .unwrap_or_else(|| panic!("no interface {peer} in the node:\n{links}"))
        .to_string()
}

/// natguard's ADD alone for `pod`, attached before by a list without it.
fn natguard_add(w: &World, pod: &Pod, network: &str, patch: Value) -> common::run::Invocation {
    natguard_verb(w, "ADD", pod, network, patch)
}

/// natguard's `verb` alone for `pod`, with its result as prevResult.
fn natguard_verb(
    w: &World,
    verb: &str,
    pod: &Pod,
    network: &str,
    patch: Value,
) -> common::run::Invocation {
    let mut conf = w.natguard(patch);
    conf["cniVersion"] = json!("1.0.0");
    conf["name"] = json!(network);
    conf["prevResult"] = pod.result.clone();
    common::run::Natguard::cni(
        &Chain::env(verb, Some(&pod.att), None),
        &serde_json::to_vec(&conf).unwrap(),
    )
    .run_in(&w.node)
}

/// A primary that steers the pod's packets in tc on its host-side veth (a u32 filter with a `mirred` redirect,
/// what a BPF datapath's `bpf` filter with direct action does too) takes them around the
/// node's netfilter: ADD refuses the pod with code 7 naming the filter, hook and interface,
/// unless `metadata.acceptUnenforced`; CHECK refuses it the same way, and warns when accepted.
#[test]
fn a_tc_redirect_on_the_host_veth_is_refused_unless_accepted() {
    let w = World::new("tc-steer");
    let chain = w.chain(w.list("steer", "1.0.0", 0, None));
    let pod = w.add_pod(&chain, "pod", "default");
    let veth = host_veth(&w, &pod);
    // Without a filter natguard's ADD is accepted and status says guarded: the control.
    natguard_add(&w, &pod, "steer", json!({})).succeeded();
    let clean = status_of(&w, &[]);
    assert_eq!(clean.exit, Some(0), "{clean}");
    assert!(!clean.stdout.contains("UNENFORCED"), "{clean}");
    w.node.run(&["tc", "qdisc", "add", "dev", &veth, "clsact"]);
    w.node.run(&[
        "tc", "filter", "add", "dev", &veth, "ingress", "u32", "match", "u32", "0", "0", "action",
        "mirred", "egress", "redirect", "dev", "to-cloud",
    ]);
    let inv = natguard_add(&w, &pod, "steer", json!({}));
    inv.fails_with(
        7,
        &[
            &veth,
            "a u32 filter with a mirred action on its tc ingress hook",
            "acceptUnenforced",
        ],
    );
    // A second filter, on egress, is named too.
    w.node.run(&[
        "tc", "filter", "add", "dev", &veth, "egress", "u32", "match", "u32", "0", "0", "action",
        "mirred", "egress", "mirror", "dev", "to-cloud",
    ]);
    natguard_add(&w, &pod, "steer", json!({}))
        .fails_with(7, &["on its tc ingress hook", "on its tc egress hook"]);
    let accepted = natguard_add(
        &w,
        &pod,
        "steer",
        json!({ "metadata": { "acceptUnenforced": true } }),
    )
    .succeeded();
    assert!(
        accepted.stderr.contains("accepted unguarded") && accepted.stderr.contains(&veth),
        "{accepted}"
    );
    // CHECK reports the pod: refused without acceptUnenforced, warned about with it.
    natguard_verb(&w, "CHECK", &pod, "steer", json!({}))
        .fails_with(7, &[&veth, "mirred action on its tc ingress hook"]);
    let checked = natguard_verb(
        &w,
        "CHECK",
        &pod,
        "steer",
        json!({ "metadata": { "acceptUnenforced": true } }),
    )
    .succeeded();
    assert!(checked.stderr.contains("accepted unguarded"), "{checked}");
    // status names the accepted pod, its host veth and both filters, and says not guarded.
    let st = status_of(&w, &[]);
    assert_eq!(st.exit, Some(1), "{st}");
    let named: Vec<&str> = st
        .stdout
        .lines()
        .filter(|l| l.starts_with("UNENFORCED "))
        .collect();
    assert_eq!(named.len(), 1, "{st}");
    for needle in [
        "UNENFORCED default/pod ",
        &format!("({veth})"),
        "a u32 filter with a mirred action on its tc ingress hook",
        "a u32 filter with a mirred action on its tc egress hook",
    ] {
        assert!(named[0].contains(needle), "{needle:?} not in {st}");
    }
    assert!(st.stdout.contains("unenforced: 1 pod(s)"), "{st}");
    let js = status_of(&w, &["--json"]);
    assert_eq!(js.exit, Some(1), "{js}");
    let doc: Value = serde_json::from_str(&js.stdout).unwrap();
    let u = &doc["unenforced"];
    assert_eq!(u.as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(u[0]["pod"], "default/pod", "{doc}");
    assert_eq!(u[0]["network"], "steer", "{doc}");
    assert_eq!(u[0]["interface"], veth.as_str(), "{doc}");
    assert_eq!(u[0]["found"].as_array().map(Vec::len), Some(2), "{doc}");
    // Once the filters are gone the pod is enforced again, and status says so.
    w.node.run(&["tc", "qdisc", "del", "dev", &veth, "clsact"]);
    let st = status_of(&w, &[]);
    assert_eq!(st.exit, Some(0), "{st}");
    assert!(!st.stdout.contains("UNENFORCED"), "{st}");
    assert!(!st.stdout.contains("unenforced:"), "{st}");
    let js = status_of(&w, &["--json"]).succeeded();
    let doc: Value = serde_json::from_str(&js.stdout).unwrap();
    assert_eq!(doc.get("unenforced"), None, "{doc}");
}

/// `natguard status ARGS` on the node, over a directory of the test as `/run/natguard` (no
/// watcher's record, the machine's untouched).
fn status_of(w: &World, args: &[&str]) -> common::run::Invocation {
    let run = w.dir().join("run-natguard");
    std::fs::create_dir_all(&run).unwrap();
    let mut all = vec!["status"];
    all.extend_from_slice(args);
    common::run::Natguard::new()
        .args(&all)
        .bind_mount(&run, "/run/natguard", common::run::Access::ReadWrite)
        .run_in(&w.node)
}

fn other_masquerade(w: &World, v4: &str, v6: &str) {
    w.on_node(&format!(
        "{v4} -t nat -A POSTROUTING ! -d 10.244.0.0/16 -j MASQUERADE"
    ));
    w.on_node(&format!(
        "{v6} -t nat -A POSTROUTING ! -d fd00:10:244::/48 -j MASQUERADE"
    ));
}

/// kubenet-style `! -d <x> -j MASQUERADE` in iptables-nft, installed before and after natguard.
#[test]
fn identity_snat_beats_iptables_nft_masquerade() {
    let (w, chain) = world("ipt-nft", "1.0.0", json!({}));
    other_masquerade(&w, "iptables-nft", "ip6tables-nft");
    let pod = w.add_pod(&chain, "pod", "default");
    other_masquerade(&w, "iptables-nft", "ip6tables-nft");
    assert_masquerade_policy(&pod);
    ok(chain.del(&pod.att), "DEL");
}

/// The same rule in iptables-legacy (xtables, not nf_tables).
#[test]
fn identity_snat_beats_iptables_legacy_masquerade() {
    let (w, chain) = world("ipt-legacy", "1.0.0", json!({}));
    other_masquerade(&w, "iptables-legacy", "ip6tables-legacy");
    let pod = w.add_pod(&chain, "pod", "default");
    assert_masquerade_policy(&pod);
    ok(chain.del(&pod.att), "DEL");
}

/// The bridge plugin's own `ipMasq` (its CNI-xxxx chain masquerades everything but the subnet).
#[test]
fn identity_snat_beats_bridge_ipmasq() {
    let w = World::new("bridge-ipmasq");
    let mut list = w.list("ngnet", "1.0.0", 0, Some(w.natguard(json!({}))));
    list["plugins"][0]["ipMasq"] = json!(true);
    let chain = w.chain(list);
    let pod = w.add_pod(&chain, "pod", "default");
    assert!(
        w.on_node("iptables-nft-save -t nat").contains("MASQUERADE"),
        "bridge ipMasq installed no MASQUERADE rule"
    );
    assert_masquerade_policy(&pod);
    ok(chain.del(&pod.att), "DEL");
    assert_no_trace(&w, &pod);
}

/// Traffic kube-proxy marked for masquerade (0x4000) is masqueraded even towards
/// nonMasqueradeCIDRs; unmarked traffic to the same host keeps the pod source, although another
/// component's MASQUERADE rule would rewrite it.
#[test]
fn kube_proxy_masquerade_mark_is_not_exempted() {
    let (w, chain) = world("kp-mark", "1.0.0", json!({}));
    // Another component masquerades everything (so unmarked traffic keeps the pod source only
    // thanks to natguard), and kube-proxy masquerades what it marked.
    other_masquerade(&w, "iptables-nft", "ip6tables-nft");
    let pod = w.add_pod(&chain, "pod", "default");
    let port = WHOAMI_PORT.to_string();
    for (ipt, remote, pod_ip) in [
        ("iptables-nft", REMOTE_IN4, pod.v4),
        ("ip6tables-nft", REMOTE_IN6, pod.v6),
    ] {
        let (src, dst) = (pod_ip.to_string(), remote.to_string());
        // KUBE-MARK-MASQ for TCP only, then KUBE-POSTROUTING's MASQUERADE of marked packets.
        w.on_node(&format!("{ipt} -t nat -A PREROUTING -s {src} -d {dst} -p tcp --dport {port} -j MARK --set-xmark 0x4000/0x4000"));
        w.on_node(&format!(
            "{ipt} -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE"
        ));
    }
    for (remote, node_ip, pod_ip) in [
        (REMOTE_IN4, NODE_IN4, pod.v4),
        (REMOTE_IN6, NODE_IN6, pod.v6),
    ] {
        assert_eq!(
            tcp_whoami(&pod.ns, sa(remote, WHOAMI_PORT)),
            Ok(node_ip),
            "marked TCP to {remote} must be masqueraded"
        );
        assert_eq!(
            udp_whoami(&pod.ns, sa(remote, WHOAMI_PORT)),
            Ok(pod_ip),
            "unmarked UDP to {remote} must keep the pod source"
        );
    }
    ok(chain.del(&pod.att), "DEL");
}

// ---------------------------------------------------------------------------------------------
// CNI versions and verbs
// ---------------------------------------------------------------------------------------------

/// ADD, traffic, CHECK, STATUS, DEL for one cniVersion, with libcni's prevResult rules.
fn lifecycle(version: &str) {
    let (w, chain) = world(
        &format!("v{}", version.replace('.', "")),
        version,
        json!({}),
    );
    let pod = w.add_pod(&chain, "pod", "default");

    let add = chain
        .last_call("natguard", "ADD", &pod.att.container_id)
        .expect("natguard ADD call");
    let printed: Value = serde_json::from_str(&add.stdout).expect("natguard ADD output is JSON");
    assert_eq!(
        printed, add.stdin["prevResult"],
        "natguard must print its prevResult unchanged"
    );
    assert_eq!(printed["cniVersion"], json!(version));

    assert_installed(&w, &pod);
    assert_metadata(&pod, "proxy");
    assert_masquerade_policy(&pod);
    if version_at_least(version, "0.4.0") {
        ok(chain.check(&pod.att), "CHECK");
    }
    if version_at_least(version, "1.1.0") {
        ok(chain.status(), "STATUS");
    }

    ok(chain.del(&pod.att), "DEL");
    let del = chain
        .last_call("natguard", "DEL", &pod.att.container_id)
        .expect("natguard DEL call");
    assert_eq!(
        del.stdin.get("prevResult").is_some(),
        version_at_least(version, "0.4.0"),
        "libcni sends prevResult on DEL only from 0.4.0 on"
    );
    assert_no_trace(&w, &pod);
}

#[test]
fn cni_version_0_3_0() {
    lifecycle("0.3.0");
}

#[test]
fn cni_version_0_3_1() {
    lifecycle("0.3.1");
}

#[test]
fn cni_version_0_4_0() {
    lifecycle("0.4.0");
}

#[test]
fn cni_version_1_0_0() {
    lifecycle("1.0.0");
}

#[test]
fn cni_version_1_1_0() {
    lifecycle("1.1.0");
}

/// natguard's ADD repeated for the same attachment (a runtime retry) is harmless, and one DEL
/// removes everything.
#[test]
fn add_twice_then_del_leaves_nothing() {
    let (w, chain) = world("add-twice", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    let add = chain
        .last_call("natguard", "ADD", &pod.att.container_id)
        .expect("natguard ADD call");
    let again = ok(chain.replay(&add), "second ADD of natguard");
    assert_eq!(again.as_ref(), Some(&add.stdin["prevResult"]));
    assert_metadata(&pod, "proxy");
    assert_masquerade_policy(&pod);
    ok(chain.del(&pod.att), "DEL");
    assert_no_trace(&w, &pod);
}

/// DEL twice, and CRI's pair: DEL with the netns, then DEL with `CNI_NETNS=""`.
#[test]
fn del_twice_succeeds() {
    let (w, chain) = world("del-twice", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_installed(&w, &pod);
    let cached = chain.cached_result(&pod.att).expect("cached result");
    ok(chain.del(&pod.att), "first DEL");
    assert_no_trace(&w, &pod);
    // The cache is gone after the first DEL; a runtime may still send the result it kept.
    ok(
        chain.del_with(
            &pod.att,
            &DelOpts {
                prev_result: PrevResult::Given(cached),
                netns: None,
            },
        ),
        "second DEL with prevResult",
    );
    ok(
        chain.del_with(
            &pod.att,
            &DelOpts {
                prev_result: PrevResult::Libcni,
                netns: Some(String::new()),
            },
        ),
        "third DEL (CNI_NETNS empty)",
    );
    assert_no_trace(&w, &pod);
}

/// DEL without prevResult (0.3.x lists, lost cache) still removes exactly the pod's entries.
#[test]
fn del_without_prev_result_removes_pod() {
    let (w, chain) = world("del-noprev", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    let other = w.add_pod(&chain, "other", "default");
    ok(
        chain.del_with(
            &pod.att,
            &DelOpts {
                prev_result: PrevResult::Omit,
                netns: None,
            },
        ),
        "DEL without prevResult",
    );
    let del = chain
        .last_call("natguard", "DEL", &pod.att.container_id)
        .expect("natguard DEL call");
    assert!(del.stdin.get("prevResult").is_none());
    assert_no_trace(&w, &pod);
    assert_installed(&w, &other);
    assert_metadata(&other, "proxy");
    ok(chain.del(&other.att), "DEL other");
}

/// DEL with `CNI_NETNS=""` (containerd's second DEL, ctr's only DEL) removes the pod's entries.
#[test]
fn del_with_empty_netns_removes_pod() {
    let (w, chain) = world("del-nonetns", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_installed(&w, &pod);
    ok(
        chain.del_with(
            &pod.att,
            &DelOpts {
                prev_result: PrevResult::Libcni,
                netns: Some(String::new()),
            },
        ),
        "DEL with empty CNI_NETNS",
    );
    assert_no_trace(&w, &pod);
}

/// DEL with the netns already gone and no prevResult (the worst case a runtime produces).
#[test]
fn del_without_prev_result_and_netns_removes_pod() {
    let (w, chain) = world("del-nothing", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    assert_installed(&w, &pod);
    w.h.delete_netns(&pod.ns);
    ok(
        chain.del_with(
            &pod.att,
            &DelOpts {
                prev_result: PrevResult::Omit,
                netns: Some(String::new()),
            },
        ),
        "DEL without prevResult and netns",
    );
    assert_no_trace(&w, &pod);
}

/// ADD A (IP X), ADD B (IP X), DEL A: B keeps its policy.
#[test]
fn same_ip_add_a_add_b_del_a_keeps_b() {
    let w = World::new("same-ip");
    let list_a = w.list("ngnet", "1.0.0", 0, Some(w.natguard(json!({}))));
    let mut list_b = list_a.clone();
    // A second IPAM store hands out the same first address again (as after a leaked reservation).
    list_b["plugins"][0]["ipam"]["dataDir"] = json!(w.dir().join("ipam-ngnet-b"));
    let chain_a = w.chain(list_a);
    let chain_b = w.chain(list_b);
    let a = w.add_pod(&chain_a, "poda", "default");
    let b = w.add_pod(&chain_b, "podb", "default");
    assert_eq!(
        (a.v4, a.v6),
        (b.v4, b.v6),
        "the test needs both pods on the same addresses"
    );

    ok(chain_a.del(&a.att), "DEL A");
    // A's neighbour entries on the bridge are stale now; B answers for the addresses.
    w.node.ip("-4 neigh flush dev cni0");
    w.node.ip("-6 neigh flush dev cni0");

    let table = w.table().expect("table after DEL A");
    assert!(
        !table.contains(&a.att.container_id),
        "A is still listed:\n{table}"
    );
    assert_installed(&w, &b);
    assert_metadata(&b, "proxy");
    assert_masquerade_policy(&b);
    ok(chain_b.del(&b.att), "DEL B");
    assert_no_trace(&w, &b);
}

/// Two networks with different configs on one node: neither ADD nor DEL of one disturbs the
/// other.
#[test]
fn two_networks_do_not_clobber_each_other() {
    let w = World::new("two-nets");
    let a = w.chain(w.list("net-a", "1.0.0", 0, Some(w.natguard(json!({})))));
    let b = w.chain(w.list(
        "net-b",
        "1.0.0",
        1,
        Some(w.natguard(json!({
            "metadata": { "mode": "deny" },
            "masquerade": { "enabled": false },
            "logFile": w.dir().join("natguard-b.log"),
        }))),
    ));
    let pa = w.add_pod(&a, "pa", "default");
    let pb = w.add_pod(&b, "pb", "default");
    let check = |pa: &Pod, pb: &Pod| {
        assert_metadata(pa, "proxy");
        assert_sees(pa, REMOTE_OUT4, NODE_OUT4);
        assert_sees(pa, REMOTE_IN4, pa.v4);
        assert_metadata_refused(pb);
        assert_sees(pb, REMOTE_OUT4, pb.v4);
        assert_sees(pb, REMOTE_OUT6, pb.v6);
    };
    check(&pa, &pb);

    // Each ADD converges its own network's shared objects only.
    let pa2 = w.add_pod(&a, "pa2", "default");
    let pb2 = w.add_pod(&b, "pb2", "default");
    check(&pa, &pb);
    check(&pa2, &pb2);
    ok(a.check(&pa.att), "CHECK a");
    ok(b.check(&pb.att), "CHECK b");

    ok(a.del(&pa.att), "DEL pa");
    ok(a.del(&pa2.att), "DEL pa2");
    assert_no_trace(&w, &pa);
    assert_no_trace(&w, &pa2);
    assert_installed(&w, &pb);
    assert_metadata_refused(&pb);
    ok(b.check(&pb.att), "CHECK b after DEL of every pod of a");
    ok(b.del(&pb.att), "DEL pb");
    ok(b.del(&pb2.att), "DEL pb2");
    assert_no_trace(&w, &pb);
}

/// A config change takes effect at the next ADD, for running pods too, without removing them.
#[test]
fn config_change_takes_effect_at_next_add() {
    let w = World::new("reconfig");
    let _proxy2 = w.h.http_server(&w.node, 8282, "proxy2");
    let v1 = w.chain(w.list("ngnet", "1.0.0", 0, Some(w.natguard(json!({})))));
    let p1 = w.add_pod(&v1, "p1", "default");
    assert_metadata(&p1, "proxy");
    let v2 = w.chain(w.list(
        "ngnet",
        "1.0.0",
        0,
        Some(w.natguard(json!({ "metadata": { "proxyPort": 8282 } }))),
    ));
    let p2 = w.add_pod(&v2, "p2", "default");
    assert_metadata(&p2, "proxy2");
    assert_metadata(&p1, "proxy2");
    assert_installed(&w, &p1);
    ok(v2.check(&p1.att), "CHECK p1 against the new config");
    ok(v2.del(&p1.att), "DEL p1");
    ok(v2.del(&p2.att), "DEL p2");
    assert_no_trace(&w, &p1);
    assert_no_trace(&w, &p2);
}

/// CHECK reads the kernel back: it fails when shared objects or the table are gone, and DEL
/// still succeeds afterwards (nothing to delete).
#[test]
fn check_fails_when_kernel_state_is_missing() {
    let (w, chain) = world("check", "1.0.0", json!({}));
    let pod = w.add_pod(&chain, "pod", "default");
    ok(chain.check(&pod.att), "CHECK after ADD");

    w.on_node("nft flush chain inet natguard ngnet-dnat");
    let e = chain
        .check(&pod.att)
        .expect_err("CHECK must fail when the dnat chain was flushed");
    assert_eq!(e.plugin, "natguard", "{e}");
    assert!(
        e.code.is_some() && !e.msg.is_empty(),
        "not a CNI error: {e}"
    );

    w.on_node("nft delete table inet natguard");
    let e = chain
        .check(&pod.att)
        .expect_err("CHECK must fail when the table is gone");
    assert_eq!(e.plugin, "natguard", "{e}");

    ok(chain.del(&pod.att), "DEL with nothing left to delete");
}

/// GC removes every attachment that is not in `cni.dev/valid-attachments`, and keeps the rest.
#[test]
fn gc_removes_attachments_not_listed_as_valid() {
    let (w, chain) = world("gc", "1.1.0", json!({}));
    let gone = w.add_pod(&chain, "gone", "default");
    let kept = w.add_pod(&chain, "kept", "default");
    if let Err(errs) = chain.gc_plugins(&[&kept.att]) {
        panic!(
            "GC failed: {}",
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_no_trace(&w, &gone);
    assert_installed(&w, &kept);
    assert_metadata(&kept, "proxy");
    ok(chain.check(&kept.att), "CHECK kept");
    // libcni's full GC then DELs the stale cached attachment through the whole chain.
    if let Err(errs) = chain.gc(&[&kept.att]) {
        panic!(
            "GC failed: {}",
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_installed(&w, &kept);
    ok(chain.del(&kept.att), "DEL kept");
    assert_no_trace(&w, &kept);
}

/// STATUS succeeds in a node namespace where nf_tables works, before and after pods exist.
#[test]
fn status_succeeds_where_nftables_works() {
    let (w, chain) = world("status", "1.1.0", json!({}));
    ok(chain.status(), "STATUS on a fresh node");
    let pod = w.add_pod(&chain, "pod", "default");
    ok(chain.status(), "STATUS with a pod");
    ok(chain.del(&pod.att), "DEL");
}

/// The example conflists for bridge and ptp work as written (only IPAM state is moved into
/// the test directory).
#[test]
fn example_conflists_work() {
    let w = World::new("examples");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conflist");
    for (file, role) in [
        ("bridge-host-local.conflist", "bridge"),
        ("ptp.conflist", "ptp"),
    ] {
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut list: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let plugins = list["plugins"].as_array_mut().expect("plugins");
        for p in plugins.iter_mut() {
            if p["ipam"].is_object() {
                p["ipam"]["dataDir"] = json!(w.dir().join(format!("ipam-{role}")));
            }
            if p["type"] == "natguard" {
                p["logFile"] = json!(w.dir().join(format!("natguard-{role}.log")));
            }
        }
        let chain = w.chain(list);
        let pod = w.add_pod(&chain, role, "default");
        assert_installed(&w, &pod);
        assert_metadata(&pod, "proxy");
        assert_sees(&pod, REMOTE_OUT4, NODE_OUT4);
        ok(chain.check(&pod.att), &format!("CHECK {file}"));
        ok(chain.del(&pod.att), &format!("DEL {file}"));
        assert_no_trace(&w, &pod);
    }
}
