//! Conntrack work acts on the attachment's network, not on the address: two natguard networks
//! on two bridges with overlapping pools, whose pods get the same addresses, never delete each
//! other's connections at ADD or DEL, while flushOnAdd still deletes every flow an address
//! carried before the pod's rules (a dead pod of the other network's included).
//!
//! Each test runs the real binary after Debian's reference plugins in namespaces of its own
//! (`common::World`). The connections are real: a pod's keep-alive HTTP connections to a host
//! outside the node, masqueraded with random ports, so a deleted entry is a reset connection
//! (its next segment is masqueraded anew, from another port the server does not know). Needs
//! root; never skips; nothing is asserted about time.

mod common;

use common::attack::*;
use common::*;
use serde_json::{json, Value};
use std::net::IpAddr;

/// The port of the keep-alive server on the remote host outside the node.
const OUT_PORT: u16 = 8080;

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

/// Networks `cta` (bridge `ctbra`) and `ctb` (bridge `ctbrb`): the same pool, which holds one
/// address per family, so each network's pod gets 10.252.0.10 and fd00:252::10. Both are
/// default natguard networks (they masquerade, so their connections carry their label bit).
fn overlapping(w: &World) -> (Chain, Chain) {
    let info = json!({ "logLevel": "info" });
    (
        overlapping_net(w, "cta", "ctbra", &info),
        overlapping_net(w, "ctb", "ctbrb", &info),
    )
}

/// One of [`overlapping`]'s networks, with `natguard` as its natguard entry's settings.
fn overlapping_net(w: &World, name: &str, bridge: &str, natguard: &Value) -> Chain {
    let v4 = json!({ "subnet": "10.252.0.0/24", "rangeStart": "10.252.0.10", "rangeEnd": "10.252.0.10", "gateway": "10.252.0.1" });
    let v6 = json!({ "subnet": "fd00:252::/64", "rangeStart": "fd00:252::10", "rangeEnd": "fd00:252::10", "gateway": "fd00:252::1" });
    w.chain(json!({
        "cniVersion": "1.1.0",
        "name": name,
        "plugins": [bridge_entry(w, name, bridge, v4, v6), w.natguard(natguard.clone())]
    }))
}

fn log_len(w: &World) -> usize {
    std::fs::read_to_string(w.dir().join("natguard.log")).map_or(0, |t| t.len())
}

/// The entry counts of the "conntrack: deleted N entries" lines logged after `from`.
fn deleted_since(w: &World, from: usize) -> Vec<u64> {
    let text = std::fs::read_to_string(w.dir().join("natguard.log")).unwrap_or_default();
    text.get(from..)
        .unwrap_or("")
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find("conntrack: deleted ")? + "conntrack: deleted ".len()..];
            rest.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// The node's conntrack entries whose original source is `addr` (as `conntrack -L` prints
/// them, one a line).
fn entries_from(w: &World, addr: IpAddr) -> Vec<String> {
    let family = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
    let a = addr.to_string();
    w.node
        .run(&["conntrack", "-L", "-f", family, "-s", &a])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Opens a keep-alive connection from `pod` to the remote host outside, on each family, and
/// checks that each answers twice.
fn keepalives(pod: &Pod) -> Vec<KeepAlive> {
    [REMOTE_OUT4, REMOTE_OUT6]
        .into_iter()
        .map(|r| {
            let mut c = KeepAlive::open(&pod.ns, sa(r, OUT_PORT))
                .unwrap_or_else(|e| panic!("control: connect to {r}:{OUT_PORT}: {e}"));
            for _ in 0..2 {
                let got = c.get();
                assert_eq!(
                    got,
                    body("out"),
                    "control: {} -> {} answers over one connection",
                    c.local,
                    c.target
                );
            }
            c
        })
        .collect()
}

/// Records a finding for each connection that no longer answers.
fn still_answer(f: &mut Findings, conns: &mut [KeepAlive], after: &str) {
    for c in conns.iter_mut() {
        for i in 1..=3 {
            let got = c.get();
            f.check(got == body("out"), || {
                format!(
                    "after {after}, request {i} on A's keep-alive connection {} -> {} got {got:?}: its conntrack entry was deleted",
                    c.local, c.target
                )
            });
            if got != body("out") {
                break;
            }
        }
    }
}

/// The setup: network B's ADD and then DEL of a pod with A's pod's addresses never
/// reset A's pod's masqueraded keep-alive connections, and B's DEL, which has no flow of its
/// own, deletes nothing. A's own DEL still deletes A's flows.
#[test]
fn overlapping_networks_never_reset_each_others_connections() {
    let w = real_world("ct-overlap");
    let _out = w.h.keepalive_http_server(&w.remote_out, OUT_PORT, "out");
    let (a, b) = overlapping(&w);
    let poda = w.add_pod(&a, "ctpoda", "default");
    let mut conns = keepalives(&poda);
    for addr in poda.ips() {
        assert!(
            !entries_from(&w, addr).is_empty(),
            "control: the node tracks A's pod's connections from {addr}"
        );
    }
    let mut f = Findings::new();

    let at = log_len(&w);
    let podb = w.add_pod(&b, "ctpodb", "default");
    assert_eq!(
        podb.ips(),
        poda.ips(),
        "control: B's pod has A's pod's addresses"
    );
    let n = deleted_since(&w, at);
    f.check(n.len() == 1, || {
        format!("B's ADD logged {n:?} conntrack deletions, expected one line")
    });
    still_answer(&mut f, &mut conns, "B's ADD");

    let at = log_len(&w);
    b.del(&podb.att)
        .unwrap_or_else(|e| panic!("DEL of B's pod: {e}"));
    let n = deleted_since(&w, at);
    f.check(n == vec![0], || {
        format!("B's DEL, with no flow of its own, logged {n:?} deleted entries, expected [0]")
    });
    still_answer(&mut f, &mut conns, "B's DEL");

    // A's own DEL (natguard's alone, so the pod keeps its interface) deletes A's flows.
    let entry = a.plugins()[1].clone();
    let conf = natguard_conf(&entry, "cta", "1.1.0", Some(&poda.result));
    let at = log_len(&w);
    natguard_verb(&a, "DEL", &conf, &poda.att).unwrap_or_else(|e| panic!("A's DEL: {e}"));
    let n = deleted_since(&w, at);
    f.check(n.len() == 1 && n[0] >= 2, || {
        format!("A's DEL logged {n:?} deleted entries, expected at least its 2 connections'")
    });
    for addr in poda.ips() {
        let left = entries_from(&w, addr);
        f.check(left.is_empty(), || {
            format!("after A's DEL, entries from A's pod's {addr} are left: {left:?}")
        });
    }
    f.finish("conntrack of overlapping networks");
}

/// Both networks' pods live, each with flows from the same addresses (B's pod's connection
/// attempts get no answer: the node routes the shared prefix to A's bridge, the first): B's DEL
/// deletes B's flows and no connection of A's pod.
#[test]
fn a_del_deletes_its_own_flows_and_not_the_other_networks() {
    let w = real_world("ct-del-own");
    let _out = w.h.keepalive_http_server(&w.remote_out, OUT_PORT, "out");
    let (a, b) = overlapping(&w);
    let poda = w.add_pod(&a, "ctowna", "default");
    let podb = w.add_pod(&b, "ctownb", "default");
    assert_eq!(
        podb.ips(),
        poda.ips(),
        "control: B's pod has A's pod's addresses"
    );
    let mut conns = keepalives(&poda);
    let before: Vec<usize> = poda
        .ips()
        .iter()
        .map(|a| entries_from(&w, *a).len())
        .collect();
    for r in [REMOTE_OUT4, REMOTE_OUT6] {
        // A SYN that leaves B's pod starts a flow labelled B; the answer is lost.
        let _ = in_netns(&podb.ns, move || {
            std::net::TcpStream::connect_timeout(
                &sa(r, OUT_PORT),
                std::time::Duration::from_secs(1),
            )
        });
    }
    for (addr, n) in poda.ips().iter().zip(&before) {
        let now = entries_from(&w, *addr).len();
        assert!(
            now > *n,
            "control: B's pod's attempts from {addr} are tracked ({n} entries before, {now} after)"
        );
    }
    let mut f = Findings::new();
    let entry = b.plugins()[1].clone();
    let conf = natguard_conf(&entry, "ctb", "1.1.0", Some(&podb.result));
    let at = log_len(&w);
    natguard_verb(&b, "DEL", &conf, &podb.att).unwrap_or_else(|e| panic!("B's DEL: {e}"));
    let n = deleted_since(&w, at);
    f.check(n == vec![2], || {
        format!("B's DEL logged {n:?} deleted entries, expected [2]: its own two attempts")
    });
    for (addr, n) in poda.ips().iter().zip(&before) {
        let now = entries_from(&w, *addr).len();
        f.check(now == *n, || {
            format!("after B's DEL, {now} entries from {addr} are left, expected A's {n}")
        });
    }
    still_answer(&mut f, &mut conns, "B's DEL");
    f.finish("DEL of one of two overlapping networks");
}

/// IP reuse across networks: A's pod vanishes without a DEL (its sandbox's name is gone, its
/// records stay) leaving flows from 10.252.0.10 and fd00:252::10 that carry A's label; B's ADD of a pod
/// with those addresses deletes them (flushOnAdd), because no live attachment of A holds them.
#[test]
fn ip_reuse_across_networks_flushes_a_gone_pods_flows_at_add() {
    let w = real_world("ct-reuse");
    let _out = w.h.keepalive_http_server(&w.remote_out, OUT_PORT, "out");
    let (a, b) = overlapping(&w);
    let gone = w.add_pod(&a, "ctgone", "default");
    // Held open: their entries stay established, whatever the namespace's name does.
    let _conns = keepalives(&gone);
    for addr in gone.ips() {
        assert!(
            !entries_from(&w, addr).is_empty(),
            "control: the node tracks A's pod's flows from {addr}"
        );
    }
    w.h.delete_netns(&gone.ns);
    // What B's ADD finds: the flows as they are just before it (the kernel may end one of them
    // meanwhile; at least one must be there, or the ADD has nothing to prove).
    let present: usize = gone.ips().iter().map(|a| entries_from(&w, *a).len()).sum();
    assert!(
        present >= 1,
        "control: the gone pod's flows are still tracked before B's ADD"
    );

    let mut f = Findings::new();
    let at = log_len(&w);
    let podb = w.add_pod(&b, "ctreuse", "default");
    assert_eq!(
        podb.ips(),
        gone.ips(),
        "control: B's pod has the gone pod's addresses"
    );
    // The log's count is how much the table shrank over the flush (the kernel's filtered
    // deletes do not say what they removed), so a flow that starts meanwhile (the new pod's
    // own neighbour traffic) lowers it: what is asserted exactly is that none is left.
    let n = deleted_since(&w, at);
    f.check(n.len() == 1 && n[0] >= 1, || {
        format!("B's ADD logged {n:?} deleted entries, expected a flush of the {present} flow(s) of the gone pod tracked just before it")
    });
    for addr in gone.ips() {
        let left = entries_from(&w, addr);
        f.check(left.is_empty(), || {
            format!("after B's ADD, the gone pod's flows from {addr} are left: {left:?}")
        });
    }
    f.finish("IP reuse across networks");
}

/// Network B in `deny` mode has a pod with A's pod's addresses; B's adopt deletes the metadata
/// flows of its pods that bypassed its proxy (it has none), and never A's pod's proxied
/// connections, which carry A's label: they keep being answered by A's proxy. With loose
/// pickup off (as on nodes that set `nf_conntrack_tcp_loose=0`), a deleted flow is not picked
/// up again by its next packet: A's connection would be cut.
#[test]
fn another_networks_adopt_in_deny_keeps_the_proxied_connections_of_a_pod_with_the_same_addresses() {
    let mut w = real_world("ct-adopt-deny");
    w.use_keepalive_servers();
    w.node.sysctl("net.netfilter.nf_conntrack_tcp_loose", "0");
    let a = overlapping_net(&w, "cta", "ctbra", &json!({ "logLevel": "info" }));
    let deny = json!({ "logLevel": "info", "metadata": { "mode": "deny" } });
    let b = overlapping_net(&w, "ctb", "ctbrb", &deny);
    let poda = w.add_pod(&a, "ctkeepa", "default");
    let podb = w.add_pod(&b, "ctkeepb", "default");
    assert_eq!(
        (podb.v4, podb.v6),
        (poda.v4, poda.v6),
        "control: the same addresses"
    );
    let mut conns: Vec<KeepAlive> = [META4, META6]
        .into_iter()
        .map(|m| {
            let mut c = KeepAlive::open(&poda.ns, sa(m, HTTP_PORT))
                .unwrap_or_else(|e| panic!("control: connect to {m}: {e}"));
            assert_eq!(c.get(), body("proxy"), "control: A's pod is proxied ({m})");
            c
        })
        .collect();
    // Control: B denies (its reset may not reach it where the kernel routes the reset by
    // address, to A's bridge: 5.10, 6.1 and 6.12; it never gets an answer).
    let got = http_get(&podb.ns, sa(META4, HTTP_PORT));
    assert!(
        matches!(got, Outcome::Refused | Outcome::TimedOut),
        "control: B denies: {got:?}"
    );
    // B's adopt, as the watcher runs it after a change of B's list.
    let netd = w.dir().join("netd-ctb");
    std::fs::create_dir_all(&netd).unwrap();
    std::fs::write(netd.join("10-ctb.conflist"), b.list.to_string()).unwrap();
    let cache = b.cache_path(&podb.att);
    let out = common::run::Natguard::new()
        .args(&[
            std::ffi::OsStr::new("adopt"),
            "--cache-dir".as_ref(),
            cache.parent().unwrap().as_os_str(),
            "--netconf-dir".as_ref(),
            netd.as_os_str(),
        ])
        .run_in(&w.node);
    assert_eq!(out.exit, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("adopted  ctb"), "{}", out.stdout);
    let mut f = Findings::new();
    for c in conns.iter_mut() {
        let got = c.get();
        f.check(got == body("proxy"), || {
            format!(
                "after B's adopt, A's pod's proxied connection {} -> {} got {got:?}",
                c.local, c.target
            )
        });
    }
    f.finish("another network's adopt");
}
