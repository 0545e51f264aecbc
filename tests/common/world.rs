//! [`World`]: the standard topology of the datapath tests. A node with a bridge for the pods,
//! a cloud metadata server, a node-local proxy, and a remote host inside and one outside
//! `nonMasqueradeCIDRs`, both address families.

use super::*;

pub const META4: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254));
pub const META6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254));
/// A remote host inside the test's nonMasqueradeCIDRs, and the node's address towards it.
pub const REMOTE_IN4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 2));
pub const NODE_IN4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 1));
pub const REMOTE_IN6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0xaa, 0, 0, 0, 0, 0, 2));
pub const NODE_IN6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0xaa, 0, 0, 0, 0, 0, 1));
/// A remote host outside the nonMasqueradeCIDRs, and the node's address towards it (also the
/// node's primary address: the node's default routes point there).
pub const REMOTE_OUT4: IpAddr = IpAddr::V4(Ipv4Addr::new(11, 0, 0, 2));
pub const NODE_OUT4: IpAddr = IpAddr::V4(Ipv4Addr::new(11, 0, 0, 1));
pub const REMOTE_OUT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xbb, 0, 0, 0, 0, 2));
pub const NODE_OUT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xbb, 0, 0, 0, 0, 1));

pub const HTTP_PORT: u16 = 80;
pub const PROXY_PORT: u16 = 8181;
pub const WHOAMI_PORT: u16 = 7777;

/// The nonMasqueradeCIDRs the tests configure: natguard's IPv4 defaults plus fd00::/8 (covers
/// the IPv6 remote-in host and the pods' IPv6 range, not the remote-out host).
pub fn non_masq() -> Vec<&'static str> {
    let mut v = natguard::config::DEFAULT_NON_MASQUERADE_CIDRS.to_vec();
    v.push("fd00::/8");
    v
}

pub fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Pod IPv4 subnet of network number `index`.
pub fn pod_subnet4(index: u8) -> String {
    format!("10.244.{index}.0/24")
}

/// Pod IPv6 subnet of network number `index`.
pub fn pod_subnet6(index: u8) -> String {
    format!("fd00:10:244:{index}::/64")
}

/// A pod attached through a [`Chain`].
#[derive(Clone, Debug)]
pub struct Pod {
    pub ns: Netns,
    pub att: Attachment,
    pub result: Value,
    pub v4: IpAddr,
    pub v6: IpAddr,
}

impl Pod {
    pub fn ips(&self) -> [IpAddr; 2] {
        [self.v4, self.v6]
    }
}

/// The standard topology:
///
/// ```text
///  pods ── cni0 ┐                        ┌── cloud      169.254.169.254, fd00:ec2::254 ("cloud" on :80)
///  (bridge+     │ node  (proxy "proxy"   ├── remote-in  10.10.0.2, fd00:aa::2   (who-am-i :7777)
///   host-local) │        on :8181)       └── remote-out 11.0.0.2, 2001:db8:bb::2 (who-am-i :7777)
/// ```
/// The node's default routes point at remote-out, so its primary addresses are 11.0.0.1 and
/// 2001:db8:bb::1. Every host routes back through the node.
pub struct World {
    pub h: Harness,
    pub node: Netns,
    pub cloud: Netns,
    pub remote_in: Netns,
    pub remote_out: Netns,
    pub proxy: Server,
    pub cloud_http: Server,
}

impl World {
    pub fn new(test: &str) -> World {
        let h = Harness::new(test);
        require_tools(&[
            "nft",
            "conntrack",
            "busybox",
            "socat",
            "iptables-nft",
            "iptables-legacy",
        ]);
        let node = h.netns("node");
        node.sysctl("net.ipv4.ip_forward", "1");
        node.sysctl("net.ipv6.conf.all.forwarding", "1");

        let cloud = h.netns("cloud");
        veth(&node, "to-cloud", &cloud, "eth0");
        node.addr("to-cloud", "10.20.0.1/30");
        node.addr("to-cloud", "fd00:c1::1/64");
        cloud.addr("eth0", "10.20.0.2/30");
        cloud.addr("eth0", "fd00:c1::2/64");
        cloud.addr("lo", &format!("{META4}/32"));
        cloud.addr("lo", &format!("{META6}/128"));
        cloud.route("default", "10.20.0.1");
        cloud.route("default", "fd00:c1::1");
        node.route(&format!("{META4}/32"), "10.20.0.2");
        node.route(&format!("{META6}/128"), "fd00:c1::2");

        let remote_in = h.netns("rin");
        veth(&node, "to-rin", &remote_in, "eth0");
        node.addr("to-rin", &format!("{NODE_IN4}/24"));
        node.addr("to-rin", &format!("{NODE_IN6}/64"));
        remote_in.addr("eth0", &format!("{REMOTE_IN4}/24"));
        remote_in.addr("eth0", &format!("{REMOTE_IN6}/64"));
        remote_in.route("default", &NODE_IN4.to_string());
        remote_in.route("default", &NODE_IN6.to_string());

        let remote_out = h.netns("rout");
        veth(&node, "to-rout", &remote_out, "eth0");
        node.addr("to-rout", &format!("{NODE_OUT4}/24"));
        node.addr("to-rout", &format!("{NODE_OUT6}/64"));
        remote_out.addr("eth0", &format!("{REMOTE_OUT4}/24"));
        remote_out.addr("eth0", &format!("{REMOTE_OUT6}/64"));
        remote_out.route("default", &NODE_OUT4.to_string());
        remote_out.route("default", &NODE_OUT6.to_string());
        node.route("default", &REMOTE_OUT4.to_string());
        node.route("default", &REMOTE_OUT6.to_string());

        let cloud_http = h.http_server(&cloud, HTTP_PORT, "cloud");
        let proxy = h.http_server(&node, PROXY_PORT, "proxy");
        h.whoami_server(&remote_in, WHOAMI_PORT);
        h.whoami_server(&remote_out, WHOAMI_PORT);
        World {
            h,
            node,
            cloud,
            remote_in,
            remote_out,
            proxy,
            cloud_http,
        }
    }

    pub fn dir(&self) -> &Path {
        self.h.dir()
    }

    /// natguard's entry as the tests use it: `logFile` in the test dir, nonMasqueradeCIDRs
    /// [`non_masq`], everything else default, then `patch` merged in.
    pub fn natguard(&self, patch: Value) -> Value {
        let mut conf = json!({
            "type": "natguard",
            // natguard's own masquerade too, so the worlds' tests see both behaviours.
            "masquerade": { "nonMasqueradeCIDRs": non_masq(), "masqueradeOutside": true },
            "logFile": self.dir().join("natguard.log"),
        });
        merge(&mut conf, &patch);
        conf
    }

    /// A bridge + host-local (dual stack) entry for network number `index` (bridge
    /// `cni<index>`, subnets [`pod_subnet4`]/[`pod_subnet6`]); IPAM state in the test dir.
    pub fn bridge(&self, name: &str, index: u8) -> Value {
        json!({
            "type": "bridge",
            "bridge": format!("cni{index}"),
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir().join(format!("ipam-{name}")),
                "ranges": [
                    [{ "subnet": pod_subnet4(index) }],
                    [{ "subnet": pod_subnet6(index) }]
                ],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
            }
        })
    }

    /// The `ptp` entry (a routed veth per pod, no bridge) of network `index`'s subnets.
    pub fn ptp(&self, name: &str, index: u8) -> Value {
        json!({
            "type": "ptp",
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir().join(format!("ipam-{name}")),
                "ranges": [
                    [{ "subnet": pod_subnet4(index) }],
                    [{ "subnet": pod_subnet6(index) }]
                ],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
            }
        })
    }

    /// A conflist: the bridge entry of network `index`, then natguard (if given).
    pub fn list(&self, name: &str, version: &str, index: u8, natguard: Option<Value>) -> Value {
        let mut plugins = vec![self.bridge(name, index)];
        plugins.extend(natguard);
        json!({ "cniVersion": version, "name": name, "plugins": plugins })
    }

    /// A chain driver for `list`, run in the node namespace, its result cache where natguard
    /// in the node sees the runtimes' (`/var/lib/cni/results`, see [`super::run::node_dir`]).
    pub fn chain(&self, list: Value) -> Chain {
        Chain::new(&self.node, list, &self.cache_dir())
    }

    /// The node's `/var/lib/cni` as its invocations see it.
    pub fn cache_dir(&self) -> std::path::PathBuf {
        super::run::node_dir(&self.node).join("var-lib/cni")
    }

    /// Creates pod namespace `role` and ADDs it (container ID `cid-<role>`, CNI_ARGS of a
    /// Kubernetes pod in `k8s_namespace`).
    pub fn try_add_pod(&self, chain: &Chain, role: &str, k8s_namespace: &str) -> CniResult<Pod> {
        let ns = self.h.netns(role);
        let att = Attachment::new(&format!("cid-{role}"), &ns).k8s(k8s_namespace, role);
        self.try_attach(chain, ns, att)
    }

    /// ADDs an existing namespace with a given attachment.
    pub fn try_attach(&self, chain: &Chain, ns: Netns, att: Attachment) -> CniResult<Pod> {
        let result = chain.add(&att)?;
        let ips = result_ips(&result, &att.ifname);
        let v4 = *ips
            .iter()
            .find(|i| i.is_ipv4())
            .unwrap_or_else(|| panic!("no IPv4 address in result {result}"));
        let v6 = *ips
            .iter()
            .find(|i| i.is_ipv6())
            .unwrap_or_else(|| panic!("no IPv6 address in result {result}"));
        Ok(Pod {
            ns,
            att,
            result,
            v4,
            v6,
        })
    }

    /// Like [`World::try_add_pod`]; panics with the plugin's error.
    pub fn add_pod(&self, chain: &Chain, role: &str, k8s_namespace: &str) -> Pod {
        self.try_add_pod(chain, role, k8s_namespace)
            .unwrap_or_else(|e| panic!("ADD of pod {role} failed: {e}"))
    }

    /// `nft list table inet natguard` in the node namespace.
    pub fn table(&self) -> Option<String> {
        nft_table(&self.node)
    }

    /// Runs a command line (split on whitespace) in the node namespace, e.g. an iptables rule
    /// of another component.
    pub fn on_node(&self, cmdline: &str) -> String {
        let args: Vec<&str> = cmdline.split_whitespace().collect();
        self.node.run(&args)
    }

    /// Stops the node-local proxy.
    pub fn stop_proxy(&self) {
        self.h.stop(&self.proxy);
    }

    /// Replaces the cloud metadata server and the node-local proxy with keep-alive servers
    /// ([`Harness::keepalive_http_server`]; same bodies "cloud" and "proxy", same ports), for
    /// tests whose clients reuse one connection.
    pub fn use_keepalive_servers(&mut self) {
        self.h.stop(&self.cloud_http);
        self.h.stop(&self.proxy);
        self.cloud_http = self
            .h
            .keepalive_http_server(&self.cloud, HTTP_PORT, "cloud");
        self.proxy = self
            .h
            .keepalive_http_server(&self.node, PROXY_PORT, "proxy");
    }

    fn dump(&self) {
        let sh = |ns: &Netns, args: &[&str]| -> String {
            match ns.try_run(args) {
                Ok(s) => s,
                Err(e) => e,
            }
        };
        eprintln!(
            "==== node: nft list ruleset ====\n{}",
            sh(&self.node, &["nft", "list", "ruleset"])
        );
        eprintln!(
            "==== node: iptables-legacy-save ====\n{}",
            sh(&self.node, &["iptables-legacy-save"])
        );
        eprintln!(
            "==== node: ip addr ====\n{}",
            sh(&self.node, &["ip", "-br", "addr"])
        );
        eprintln!(
            "==== node: ip route ====\n{}",
            sh(&self.node, &["ip", "route"])
        );
        eprintln!(
            "==== node: ip -6 route ====\n{}",
            sh(&self.node, &["ip", "-6", "route"])
        );
        eprintln!(
            "==== node: conntrack -L ====\n{}",
            sh(&self.node, &["conntrack", "-L"])
        );
        // Every namespace of the test (pods, servers): what it holds and what it resolved.
        for ns in self.h.netns_list() {
            if ns.name == self.node.name {
                eprintln!(
                    "==== {}: ip neigh ====\n{}",
                    ns.name,
                    sh(&ns, &["ip", "neigh"])
                );
                continue;
            }
            eprintln!(
                "==== {} ====\n{}{}{}{}",
                ns.name,
                sh(&ns, &["ip", "-br", "addr"]),
                sh(&ns, &["ip", "route"]),
                sh(&ns, &["ip", "-6", "route"]),
                sh(&ns, &["ip", "neigh"])
            );
        }
        if let Ok(entries) = fs::read_dir(self.dir()) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = fs::read_to_string(&p).unwrap_or_default();
                    if !text.trim().is_empty() {
                        eprintln!("==== {} ====\n{text}", p.display());
                    }
                }
            }
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
    }
}
