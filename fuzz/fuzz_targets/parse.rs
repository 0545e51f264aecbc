//! Arbitrary bytes through everything natguard parses from a runtime: the network configuration
//! on stdin (`cni::netconf::parse_netconf`), the prevResult in it (`cni::validate_prev_result`),
//! `CNI_ARGS` (`cni::CniArgs::parse`) and the rest of the environment (`cni::Env::from_lookup`),
//! and then the pure plan of what parsed (`plan::plan_shared`, `plan::plan_pod`).
//!
//! Besides "no panic", it checks properties the plugin relies on: parse errors carry the codes
//! the CNI spec gives them, plans are deterministic, and a pod's record in the kernel (its
//! comment) gives back exactly its addresses, which is what DEL without prevResult depends on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use natguard::cni::{self, CniArgs, Command, Env};
use natguard::config::{self, Cidr};
use natguard::plan::{self, NodeFacts, PodRef};
use serde_json::Value;
use std::net::IpAddr;

fn check_pod(cfg: &config::Config, network: &str, args: &CniArgs, ifname: &str, addrs: &[IpAddr]) {
    // The plugin refuses a pod whose addresses its record cannot hold (`plan::addrs_fit`);
    // every pod it accepts must have its addresses recorded whole.
    if !plan::addrs_fit(addrs) {
        return;
    }
    let host = plan::HostSide {
        iface: plan::IfName::new("cni0").unwrap(),
        port: plan::IfName::new("veth01234567"),
        mac: None,
        bridge: None,
    };
    let pod = PodRef {
        network,
        container_id: "0123456789abcdef",
        ifname,
        namespace: args.pod_namespace.as_deref(),
        pod_name: args.pod_name.as_deref(),
        netns: "/var/run/netns/cni-0123",
        annotations: Default::default(),
        host: Some(host),
    };
    let p = plan::plan_pod(cfg, &pod, addrs);
    assert_eq!(
        plan::parse_attach(&p.attach).host(),
        Some(host),
        "the attachment record must give back its host side: {:?}",
        p.attach
    );
    assert!(
        p.comment.len() <= plan::MAX_COMMENT,
        "comment too long: {:?}",
        p.comment
    );
    assert_eq!(
        plan::addrs_from_comment(&p.comment),
        addrs,
        "the pod record must give back its addresses: {:?}",
        p.comment
    );
    // Every address is placed in or out of each owned set: masq, the redirected set and its
    // count, the log set, the node-wide exempt and reset-count sets, the address on the pod's
    // own veth (`xsrc4/6`) and, for IPv4, the arp table's exempt and non-exempt identities; the
    // pod's own veth once (`xveths`).
    let v4 = addrs.iter().filter(|a| a.is_ipv4()).count();
    assert_eq!(p.present.len() + p.absent.len(), 7 * addrs.len() + 2 * v4 + 1);
}

fn netconf(data: &[u8]) {
    let conf = match cni::netconf::parse_netconf(data) {
        Ok(c) => c,
        Err(e) => {
            assert!(
                matches!(e.code(), 1 | 6 | 7),
                "parse error with code {}: {e}",
                e.code()
            );
            let reply = cni::error_reply(None, &e);
            assert_eq!(reply["code"], e.code());
            return;
        }
    };
    assert!(cni::netconf::is_network_name(&conf.name));
    let node = NodeFacts {
        proxy_v4: Some([10, 0, 0, 1].into()),
        proxy_v6: None,
    };
    let shared = plan::plan_shared(&conf.name, &conf.natguard, &node);
    let again = plan::plan_shared(&conf.name, &conf.natguard, &node);
    assert_eq!(shared, again, "plans must be deterministic");
    let _ = plan::render_shared(&shared);
    let none = plan::plan_shared(&conf.name, &conf.natguard, &NodeFacts::default());
    let _ = plan::render_shared(&none);
    if let Some(prev) = &conf.prev_result {
        if let Ok(addrs) = cni::validate_prev_result(prev, "eth0") {
            check_pod(
                &conf.natguard,
                &conf.name,
                &CniArgs::default(),
                "eth0",
                &addrs,
            );
            let out = cni::passthrough(prev, conf.cni_version);
            assert_eq!(out["cniVersion"], conf.cni_version.as_str());
        }
    }
}

fn text(s: &str) {
    if let Ok(a) = CniArgs::parse(s) {
        if let Some(ns) = &a.pod_namespace {
            assert!(config::is_dns_label(ns), "namespace {ns:?} accepted");
        }
    }
    if let Some(c) = Cidr::parse(s) {
        assert_eq!(
            Cidr::parse(&c.to_string()),
            Some(c),
            "CIDR {s:?} does not round-trip"
        );
        let (lo, hi) = c.range();
        assert!(lo <= hi);
    }
    // Lines as the environment of an ADD: container ID, ifname, netns, CNI_ARGS.
    let mut lines = s.split('\n');
    let vars: Vec<(&str, &str)> = ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_ARGS"]
        .into_iter()
        .zip(lines.by_ref())
        .collect();
    let get = |k: &str| {
        if k == "CNI_PATH" {
            return Some("/opt/cni/bin".to_string());
        }
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    for cmd in [Command::Add, Command::Del, Command::Gc] {
        match Env::from_lookup(cmd, &get) {
            Ok(env) => {
                if cmd != Command::Gc {
                    assert!(cni::is_container_id(&env.container_id));
                    assert!(cni::is_ifname(&env.ifname));
                }
            }
            Err(e) => assert_eq!(e.code(), 4, "{e}"),
        }
    }
    // The rest, if it is JSON, as a prevResult on its own.
    let rest: Vec<&str> = lines.collect();
    if let Ok(v) = serde_json::from_str::<Value>(&rest.join("\n")) {
        prev_result(&v, vars.get(1).map_or("eth0", |v| v.1));
    }
}

fn prev_result(v: &Value, ifname: &str) {
    match cni::validate_prev_result(v, ifname) {
        Ok(addrs) => {
            if cni::is_ifname(ifname) {
                let cfg = config::Config::default();
                check_pod(&cfg, "net", &CniArgs::default(), ifname, &addrs);
            }
        }
        // Code 7 only for an address that cannot be a pod's, named with its field.
        Err(e) => assert!(
            matches!(e.code(), 1 | 6)
                || (e.code() == 7
                    && e.to_string().contains("prevResult.ips[")
                    && e.to_string().contains("not a pod address")),
            "prevResult error code {}: {e}",
            e.code()
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    netconf(data);
    if let Ok(v) = serde_json::from_slice::<Value>(data) {
        prev_result(&v, "eth0");
    }
    text(&String::from_utf8_lossy(data));
});
