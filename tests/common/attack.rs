//! Pieces for the attack tests (`tests/security.rs`, `tests/endpoints.rs`,
//! `tests/kernel_features.rs`): the exempt namespace, the positive controls and the networks
//! natguard never saw that they share, a "real" metadata server bound only to the metadata
//! addresses, a keep-alive client, hand-made TCP segments and neighbour announcements
//! sent from inside a pod, packet counters in another namespace, and a collector for several
//! findings of one test.
//!
//! The Python helpers are written into the test's directory and run inside a namespace with
//! `nsenter --net`; they use only the standard library (raw and packet sockets work as root).

use super::*;

/// The body the real metadata server answers with.
pub const REAL: &str = "REAL";

// ---------------------------------------------------------------------------------------------
// What every attack test shares: the exempt namespace, the controls, the pods' gateways and
// MACs, the networks natguard never saw, SYN counters at the metadata host
// ---------------------------------------------------------------------------------------------

/// The Kubernetes namespace the attack tests' natguard exempts.
pub const EXEMPT_NS: &str = "kube-system";

/// Upper bound for waiting on packet counters, stretched by [`deadline`] in the kernel layer's
/// VMs (a bound for failure reports, not an assertion on speed).
pub const COUNTER_WAIT: Duration = Duration::from_secs(20);

/// A SYN to port 80 as nft matches it: what a connect sends first, never an answer's RST or ACK.
pub const SYN: &str = "tcp dport 80 tcp flags & (syn | ack | rst) == syn";

/// The cloud namespace's own addresses, which are not metadata addresses: where controls go.
pub const CLOUD4: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 20, 0, 2));
pub const CLOUD6: IpAddr = IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xc1, 0, 0, 0, 0, 0, 2));

/// Both metadata addresses' HTTP endpoints.
pub fn metas() -> [SocketAddr; 2] {
    [sa(META4, HTTP_PORT), sa(META6, HTTP_PORT)]
}

/// natguard with [`EXEMPT_NS`] exempt and `patch` merged in.
pub fn exempt_cfg(w: &World, patch: Value) -> Value {
    let mut c = w.natguard(json!({ "metadata": { "exemptNamespaces": [EXEMPT_NS] } }));
    merge(&mut c, &patch);
    c
}

/// Hard control: the pod gets `want` from both metadata addresses.
pub fn control_metadata(pod: &Pod, want: &str, what: &str) {
    for t in metas() {
        assert_eq!(
            http_get(&pod.ns, t),
            body(want),
            "control ({what}): pod {} -> http://{t}/ should be answered by {want}",
            pod.att.container_id
        );
    }
}

/// Hard control: the pod reaches the remote host inside nonMasqueradeCIDRs on both families.
pub fn control_network(pod: &Pod, what: &str) {
    for (remote, me) in [(REMOTE_IN4, pod.v4), (REMOTE_IN6, pod.v6)] {
        assert_eq!(
            tcp_whoami(&pod.ns, sa(remote, WHOAMI_PORT)),
            Ok(me),
            "control ({what}): pod {} should reach {remote} with its own address",
            pod.att.container_id
        );
    }
}

/// The gateways of the pod's result (IPv4, IPv6).
pub fn gateways(pod: &Pod) -> (IpAddr, IpAddr) {
    let mut g4 = None;
    let mut g6 = None;
    for ip in pod.result["ips"].as_array().cloned().unwrap_or_default() {
        if let Some(g) = ip["gateway"].as_str() {
            let g: IpAddr = g.parse().expect("gateway");
            if g.is_ipv4() {
                g4.get_or_insert(g);
            } else {
                g6.get_or_insert(g);
            }
        }
    }
    (
        g4.unwrap_or_else(|| panic!("no IPv4 gateway in {}", pod.result)),
        g6.unwrap_or_else(|| panic!("no IPv6 gateway in {}", pod.result)),
    )
}

/// A MAC address of interface `ifname` in `ns`.
pub fn mac_of(ns: &Netns, ifname: &str) -> String {
    let out = ns.ip(&format!("-j link show {ifname}"));
    let v: Value = serde_json::from_str(&out).expect("ip -j link");
    v[0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no MAC address for {ifname}: {out}"))
        .to_string()
}

/// The MAC address `ns`'s neighbour table holds for `addr`, if any.
pub fn neighbour_mac(ns: &Netns, addr: IpAddr) -> Option<String> {
    let out = ns.ip(&format!("-j neigh show {addr}"));
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    v.as_array()?
        .iter()
        .find_map(|n| n["lladdr"].as_str().map(str::to_string))
}

/// A routed (ptp) network `name` whose conflist has no natguard (pods in network 9's subnets,
/// 10.244.9.0/24 and fd00:10:244:9::/64): its pods are pods natguard never saw.
pub fn ptp_without_natguard(w: &World, name: &str) -> Chain {
    w.chain(json!({ "cniVersion": "1.0.0", "name": name, "plugins": [w.ptp(name, 9)] }))
}

/// A list without natguard on network 0's bridge `cni0`, from a range of its own (.200 to
/// .250): its pods are pods natguard never saw, on the same bridge as natguard's.
pub fn unguarded_on_cni0(w: &World) -> Chain {
    let mut bridge = w.bridge("unguarded", 0);
    bridge["ipam"]["ranges"] = json!([
        [{ "subnet": pod_subnet4(0), "rangeStart": "10.244.0.200", "rangeEnd": "10.244.0.250" }],
        [{ "subnet": pod_subnet6(0), "rangeStart": "fd00:10:244::200", "rangeEnd": "fd00:10:244::250" }]
    ]);
    w.chain(json!({ "cniVersion": "1.1.0", "name": "unguarded", "plugins": [bridge] }))
}

/// Counter rules (for [`Counters::install`] at the metadata host) of [`SYN`]s from `src`
/// (IPv4, IPv6) to the metadata addresses, named `names` (IPv4, IPv6).
pub fn syns_to_metadata(
    names: (&'static str, &'static str),
    src: (IpAddr, IpAddr),
) -> [(&'static str, String); 2] {
    [
        (
            names.0,
            format!("ip saddr {} ip daddr {META4} {SYN}", src.0),
        ),
        (
            names.1,
            format!("ip6 saddr {} ip6 daddr {META6} {SYN}", src.1),
        ),
    ]
}

/// Sends hand-made TCP segments: `segments.py SRC DST DPORT COUNT FLAGS...` (FLAGS as integers).
/// Each flag combination is sent COUNT times from a fresh random source port and sequence
/// number, with no payload. Prints nothing; exits non-zero if a send fails.
const SEGMENTS_PY: &str = r#"
import random, socket, struct, sys

src, dst, dport, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = [int(f) for f in sys.argv[5:]]
v6 = ":" in dst
fam = socket.AF_INET6 if v6 else socket.AF_INET

def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff

s = socket.socket(fam, socket.SOCK_RAW, socket.IPPROTO_TCP)
s.bind((src, 0))
sa, da = socket.inet_pton(fam, src), socket.inet_pton(fam, dst)
for f in flags:
    for _ in range(count):
        sport = random.randint(20000, 60000)
        seq = random.getrandbits(32)
        ack = random.getrandbits(32) if f & 0x10 else 0
        hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, f, 64240, 0,
                          1 if f & 0x20 else 0)
        if v6:
            pseudo = sa + da + struct.pack("!I3xB", len(hdr), 6)
        else:
            pseudo = sa + da + struct.pack("!xBH", 6, len(hdr))
        c = csum(pseudo + hdr)
        seg = hdr[:16] + struct.pack("!H", c) + hdr[18:]
        s.sendto(seg, (dst, 0))
"#;

/// Sends each hand-made TCP segment (no payload) as two IP fragments, the first carrying only
/// the first 8 bytes of the TCP header (ports and sequence number), the second the rest (flags
/// included): `fragments.py SRC DST DPORT COUNT FLAGS...`. IPv4 through a header-including raw
/// socket, IPv6 with a Fragment header.
const FRAGMENTS_PY: &str = r#"
import random, socket, struct, sys

src, dst, dport, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = [int(f) for f in sys.argv[5:]]
v6 = ":" in dst
fam = socket.AF_INET6 if v6 else socket.AF_INET
sa, da = socket.inet_pton(fam, src), socket.inet_pton(fam, dst)

def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff

s = socket.socket(fam, socket.SOCK_RAW, socket.IPPROTO_RAW)
for f in flags:
    for _ in range(count):
        sport = random.randint(20000, 60000)
        ack = random.getrandbits(32) if f & 0x10 else 0
        hdr = struct.pack("!HHIIBBHHH", sport, dport, random.getrandbits(32), ack, 5 << 4, f,
                          64240, 0, 1 if f & 0x20 else 0)
        if v6:
            pseudo = sa + da + struct.pack("!I3xB", len(hdr), 6)
        else:
            pseudo = sa + da + struct.pack("!xBH", 6, len(hdr))
        seg = hdr[:16] + struct.pack("!H", csum(pseudo + hdr)) + hdr[18:]
        ident = random.getrandbits(16 if not v6 else 32)
        parts = [(0, True, seg[:8]), (1, False, seg[8:])]
        for off, more, data in parts:
            if v6:
                fh = struct.pack("!BBHI", 6, 0, (off << 3) | (1 if more else 0), ident)
                ip = struct.pack("!IHBB", 6 << 28, len(fh) + len(data), 44, 64) + sa + da
                s.sendto(ip + fh + data, (dst, 0))
            else:
                fo = off | (0x2000 if more else 0)
                ip = struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(data), ident, fo, 64, 6, 0) + sa + da
                s.sendto(ip + data, (dst, 0))
"#;

/// Sends hand-made TCP segments from `src` to `dst`:`port`, each as two fragments that split
/// the TCP header (see [`FRAGMENTS_PY`]).
pub fn send_fragmented_segments(
    h: &Harness,
    ns: &Netns,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    count: u32,
    flags: &[u8],
) {
    run_crafter(
        h,
        ns,
        ("fragments.py", FRAGMENTS_PY),
        (src, dst, port),
        count,
        flags,
    );
}

/// Announces that this host owns addresses: `announce.py IFNAME V4 GW4 V6`. Sends gratuitous
/// ARP (request and reply with sender = target = V4), an ARP request for GW4 with sender V4,
/// and unsolicited neighbour advertisements (override flag) for V6 to all nodes, all with the
/// interface's own MAC address.
const ANNOUNCE_PY: &str = r#"
import socket, struct, sys

ifname, v4, gw4, v6 = sys.argv[1:5]
p = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
p.bind((ifname, 0))
mac = p.getsockname()[4]
bcast = b"\xff" * 6
ip4 = socket.inet_aton(v4)
def arp(op, spa, tha, tpa):
    return (bcast + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, op)
            + mac + spa + tha + tpa)
for _ in range(3):
    p.send(arp(1, ip4, b"\0" * 6, ip4))
    p.send(arp(2, ip4, bcast, ip4))
    p.send(arp(1, ip4, b"\0" * 6, socket.inet_aton(gw4)))

ip6 = socket.inet_pton(socket.AF_INET6, v6)
icmp = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
icmp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
icmp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
icmp.bind((v6, 0))
# type 136, code 0, checksum (the kernel fills it in), flags: override; target; TLLA option.
na = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + ip6 + b"\x02\x01" + mac
idx = socket.if_nametoindex(ifname)
for _ in range(3):
    icmp.sendto(na, ("ff02::1", 0, 0, idx))
"#;

/// One HTTP/1.0 GET over a kernel TCP socket that carries IP options or IPv6 extension headers
/// on every segment: `exthdr_get.py DST PORT KIND...` with KIND one of `ipopts` (record route),
/// `hopopts`, `dstopts` (each a PadN option). Prints `BODY <body>`,
/// `REFUSED`, `TIMEOUT` or `ERROR <text>`.
const EXTHDR_GET_PY: &str = r#"
import socket, sys

dst, port, kinds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
padn = bytes([0, 0, 1, 4, 0, 0, 0, 0])
for k in kinds:
    if k == "ipopts":
        s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, bytes([7, 7, 4, 0, 0, 0, 0, 0]))
    else:
        opt = {"hopopts": socket.IPV6_HOPOPTS, "dstopts": socket.IPV6_DSTOPTS}[k]
        s.setsockopt(socket.IPPROTO_IPV6, opt, padn)
s.settimeout(5)
try:
    s.connect((dst, port))
    s.sendall(b"GET / HTTP/1.0\r\nHost: metadata\r\n\r\n")
    data = b""
    while True:
        more = s.recv(4096)
        if not more:
            break
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1."):
        print("BODY", body.decode("latin-1").strip())
    else:
        print("ERROR not an HTTP response:", repr(data))
except (ConnectionRefusedError, ConnectionResetError):
    print("REFUSED")
except socket.timeout:
    print("TIMEOUT")
except OSError as e:
    print("ERROR", e)
"#;

/// HTTP GET from inside `ns` with IP options / IPv6 extension headers `kinds` on every segment
/// (see [`EXTHDR_GET_PY`]).
pub fn http_get_with_headers(h: &Harness, ns: &Netns, dst: SocketAddr, kinds: &[&str]) -> Outcome {
    let path = script(h, "exthdr_get.py", EXTHDR_GET_PY);
    let ip = dst.ip().to_string();
    let port = dst.port().to_string();
    let mut args = vec!["python3", path.as_str(), ip.as_str(), port.as_str()];
    args.extend_from_slice(kinds);
    let out = ns.run(&args);
    let line = out.trim();
    if let Some(b) = line.strip_prefix("BODY") {
        Outcome::Body(b.trim().to_string())
    } else if line == "REFUSED" {
        Outcome::Refused
    } else if line == "TIMEOUT" {
        Outcome::TimedOut
    } else {
        Outcome::Error(line.to_string())
    }
}

/// Lines of `after` that are not in `before` (`+`) and the reverse (`-`): a short description
/// of how a ruleset changed.
pub fn line_diff(before: &str, after: &str) -> String {
    let b: Vec<&str> = before.lines().map(str::trim).collect();
    let a: Vec<&str> = after.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for l in &a {
        if !b.contains(l) {
            out.push(format!("+ {l}"));
        }
    }
    for l in &b {
        if !a.contains(l) {
            out.push(format!("- {l}"));
        }
    }
    out.join("\n")
}

/// A transparent TCP relay, as a node-level egress proxy runs behind a REDIRECT rule:
/// `relay.py PORT` listens on PORT (IPv4 and IPv6), reads each connection's original destination
/// (SO_ORIGINAL_DST) and relays the bytes to it, connecting from this host.
const RELAY_PY: &str = r#"
import socket, struct, sys, threading

port = int(sys.argv[1])
SO_ORIGINAL_DST = 80

def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def handle(c, v6):
    try:
        if v6:
            raw = c.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
            dst = (socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack("!H", raw[2:4])[0])
        else:
            raw = c.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            dst = (socket.inet_ntoa(raw[4:8]), struct.unpack("!H", raw[2:4])[0])
        u = socket.create_connection(dst, timeout=5)
        u.settimeout(None)
    except OSError:
        c.close()
        return
    t = threading.Thread(target=pipe, args=(u, c), daemon=True)
    t.start()
    pipe(c, u)
    t.join()
    c.close()
    u.close()

def listen(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, port))
    s.listen(128)
    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(c, fam == socket.AF_INET6), daemon=True).start()

ts = [threading.Thread(target=listen, args=a, daemon=True)
      for a in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::"))]
for t in ts:
    t.start()
for t in ts:
    t.join()
"#;

/// Starts the transparent relay of [`RELAY_PY`] on `port` of `ns`.
pub fn start_transparent_relay(h: &Harness, ns: &Netns, port: u16) -> Server {
    let path = script(h, "relay.py", RELAY_PY);
    let label = format!("relay-{port}");
    let pid = h.spawn(ns, &label, &["python3", "-u", &path, &port.to_string()]);
    wait_listening(ns, "tcp", port, 2);
    Server {
        label,
        pids: vec![pid],
    }
}

/// Writes one of the helper scripts into the test's directory; returns its path.
fn script(h: &Harness, name: &str, text: &str) -> String {
    let path = h.dir().join(name);
    if !path.exists() {
        fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
    path.to_str().expect("utf-8 path").to_string()
}

/// Replaces the world's cloud HTTP server (which listens on every address of the cloud) with
/// the real metadata server: port 80 of 169.254.169.254 and fd00:ec2::254 only, body [`REAL`],
/// keep-alive capable. Another address of the cloud (10.20.0.2, fd00:c1::2) answers nothing.
pub fn start_real_metadata(w: &mut World) {
    require_tools(&["python3"]);
    w.h.stop(&w.cloud_http);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/http_keepalive.py");
    let path = path.to_str().expect("utf-8 path");
    let label = "real-metadata";
    let pid = w.h.spawn(
        &w.cloud,
        label,
        &[
            "python3",
            "-u",
            path,
            &HTTP_PORT.to_string(),
            REAL,
            &META4.to_string(),
            &META6.to_string(),
        ],
    );
    wait_listening(&w.cloud, "tcp", HTTP_PORT, 2);
    let listeners = w
        .cloud
        .run(&["ss", "-Hltn", &format!("sport = :{HTTP_PORT}")]);
    assert!(
        !listeners.contains("*:80") && !listeners.contains("0.0.0.0:80"),
        "the real metadata server must not listen on a wildcard address:\n{listeners}"
    );
    w.cloud_http = Server {
        label: label.to_string(),
        pids: vec![pid],
    };
}

/// The world with the real metadata server of [`start_real_metadata`].
pub fn real_world(test: &str) -> World {
    let mut w = World::new(test);
    start_real_metadata(&mut w);
    w
}

/// True if the real metadata server answered.
pub fn is_real(o: &Outcome) -> bool {
    match o {
        Outcome::Body(b) => b.contains(REAL),
        Outcome::Error(e) => e.contains(REAL),
        _ => false,
    }
}

/// Sends hand-made TCP segments from `src` (an address of `ns`) to `dst`:`port`, each flag
/// combination `count` times.
pub fn send_segments(
    h: &Harness,
    ns: &Netns,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    count: u32,
    flags: &[u8],
) {
    run_crafter(
        h,
        ns,
        ("segments.py", SEGMENTS_PY),
        (src, dst, port),
        count,
        flags,
    );
}

/// Runs one of the packet-crafting scripts in `ns`: `SCRIPT SRC DST PORT COUNT FLAGS...`.
fn run_crafter(
    h: &Harness,
    ns: &Netns,
    (name, body): (&str, &str),
    (src, dst, port): (IpAddr, IpAddr, u16),
    count: u32,
    flags: &[u8],
) {
    let path = script(h, name, body);
    let mut args = vec![
        "python3".to_string(),
        path,
        src.to_string(),
        dst.to_string(),
        port.to_string(),
        count.to_string(),
    ];
    args.extend(flags.iter().map(|f| f.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ns.run(&args);
}

/// Announces from inside `ns` (interface `ifname`) that it owns `v4` and `v6` (gratuitous ARP,
/// ARP for `gw4` with sender `v4`, unsolicited NA with the override flag).
pub fn announce(h: &Harness, ns: &Netns, ifname: &str, v4: IpAddr, gw4: IpAddr, v6: IpAddr) {
    let path = script(h, "announce.py", ANNOUNCE_PY);
    ns.run(&[
        "python3",
        &path,
        ifname,
        &v4.to_string(),
        &gw4.to_string(),
        &v6.to_string(),
    ]);
}

/// Named packet counters in table `inet ngcount` of a namespace, counting at the earliest
/// prerouting priority what arrives there.
pub struct Counters {
    ns: Netns,
}

impl Counters {
    /// `rules`: (counter name, match expression), e.g. `("pod4", "ip saddr 10.244.0.2 tcp dport 80")`.
    pub fn install(h: &Harness, ns: &Netns, rules: &[(&str, String)]) -> Counters {
        let mut text = String::from("table inet ngcount {\n");
        for (name, _) in rules {
            text.push_str(&format!("  counter {name} {{ }}\n"));
        }
        text.push_str(
            "  chain pre {\n    type filter hook prerouting priority -500; policy accept;\n",
        );
        for (name, m) in rules {
            text.push_str(&format!("    {m} counter name \"{name}\"\n"));
        }
        text.push_str("  }\n}\n");
        let path = h.dir().join(format!("counters-{}.nft", ns.name));
        fs::write(&path, &text).expect("write counters");
        ns.run(&["nft", "-f", path.to_str().expect("utf-8 path")]);
        Counters { ns: ns.clone() }
    }

    /// Waits until every counter of `names` has counted at least `n` packets (a bound for the
    /// failure report, [`COUNTER_WAIT`], not an assertion about speed).
    pub fn wait(&self, names: &[&str], n: u64, what: &str) {
        let start = Instant::now();
        while names.iter().any(|x| self.packets(x) < n) {
            assert!(
                start.elapsed() < deadline(COUNTER_WAIT),
                "control: {what} never all arrived ({:?} of {n})",
                names.iter().map(|x| self.packets(x)).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Packets counted so far by counter `name`.
    pub fn packets(&self, name: &str) -> u64 {
        let out = self
            .ns
            .run(&["nft", "-j", "list", "counter", "inet", "ngcount", name]);
        let v: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("nft -j list counter: not JSON ({e}): {out}"));
        v["nftables"]
            .as_array()
            .and_then(|a| a.iter().find_map(|o| o["counter"]["packets"].as_u64()))
            .unwrap_or_else(|| panic!("no packet count for counter {name} in {out}"))
    }
}

/// One HTTP/1.1 keep-alive connection opened from inside a namespace. The socket stays in the
/// namespace it was created in; requests are made from the calling thread.
pub struct KeepAlive {
    pub target: SocketAddr,
    pub local: SocketAddr,
    stream: TcpStream,
}

impl KeepAlive {
    pub fn open(ns: &Netns, target: SocketAddr) -> io::Result<KeepAlive> {
        let stream = in_netns(ns, move || TcpStream::connect_timeout(&target, IO_TIMEOUT))?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        let local = stream.local_addr()?;
        Ok(KeepAlive {
            target,
            local,
            stream,
        })
    }

    /// One request on this connection; the answer's body (trimmed), or what went wrong.
    pub fn get(&mut self) -> Outcome {
        let go = |s: &mut TcpStream, target: SocketAddr| -> io::Result<Outcome> {
            write!(
                s,
                "GET / HTTP/1.1\r\nHost: {target}\r\nConnection: keep-alive\r\n\r\n"
            )?;
            match super::clients::read_response(s) {
                Ok(body) => Ok(Outcome::Body(body)),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    Ok(Outcome::Error("closed by the peer".into()))
                }
                Err(e) => Err(e),
            }
        };
        let target = self.target;
        go(&mut self.stream, target).unwrap_or_else(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => Outcome::Refused,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::TimedOut,
            _ => Outcome::Error(e.to_string()),
        })
    }
}

/// natguard's stdin for one invocation of network `net`: its entry `entry` as libcni injects it
/// (name, cniVersion, prevResult).
pub fn natguard_conf(entry: &Value, net: &str, version: &str, prev: Option<&Value>) -> Value {
    let mut c = entry.clone();
    c["name"] = json!(net);
    c["cniVersion"] = json!(version);
    if let Some(p) = prev {
        c["prevResult"] = p.clone();
    }
    c
}

/// Runs natguard alone (`verb`) for `att` in the node namespace, with `conf` as stdin.
pub fn natguard_verb(
    chain: &Chain,
    verb: &str,
    conf: &Value,
    att: &Attachment,
) -> CniResult<Option<Value>> {
    chain.invoke("natguard", verb, conf, Some(att), None)
}

/// Several findings of one test, reported together so a failure shows everything that went
/// wrong, not only the first thing.
#[derive(Default)]
pub struct Findings {
    list: Vec<String>,
}

impl Findings {
    pub fn new() -> Findings {
        Findings::default()
    }

    /// Records `msg` unless `ok`.
    pub fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            let m = msg();
            eprintln!("finding: {m}");
            self.list.push(m);
        }
    }

    /// Records a finding if the real metadata server answered `what`.
    pub fn not_real(&mut self, got: &Outcome, what: &str) {
        self.check(!is_real(got), || {
            format!("REAL answered {what} (got {got:?})")
        });
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Panics with every finding, if there is any.
    #[track_caller]
    pub fn finish(self, test: &str) {
        assert!(
            self.list.is_empty(),
            "{test}: {} finding(s):\n  - {}",
            self.list.len(),
            self.list.join("\n  - ")
        );
    }
}

/// Sends Ethernet frames from `IFNAME` with source MAC `SRCMAC` to `DSTMAC`, with VLAN tags
/// (`TAGS`: "" none, "q" one 802.1Q tag of VLAN 0, "adq" 802.1ad outside 802.1Q, VLAN 0 both,
/// "q100" one 802.1Q tag of VLAN 100, "adq100" 802.1ad outside 802.1Q, VLAN 100 both),
/// carrying `KIND`:
///   syn SRC DST DPORT COUNT  - TCP SYNs (IPv4 or IPv6 by the addresses)
///   arp SPA TPA              - an ARP reply claiming SPA (gratuitous when SPA == TPA)
///   na TARGET [SRC]          - an unsolicited neighbour advertisement (override) for TARGET,
///                              sent from SRC (default: TARGET itself)
pub const FRAMES_PY: &str = r#"
import random, socket, struct, sys

ifname, srcmac, dstmac, tags, kind = sys.argv[1:6]
args = sys.argv[6:]
mac = lambda m: bytes(int(b, 16) for b in m.split(":"))
smac, dmac = mac(srcmac), mac(dstmac)

def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff

def eth(ethertype, payload):
    hdr = dmac + smac
    if tags == "adq":
        hdr += struct.pack("!HH", 0x88a8, 0)
    if tags == "adq100":
        hdr += struct.pack("!HH", 0x88a8, 100)
    if tags in ("q", "adq"):
        hdr += struct.pack("!HH", 0x8100, 0)
    if tags in ("q100", "adq100"):
        hdr += struct.pack("!HH", 0x8100, 100)
    return hdr + struct.pack("!H", ethertype) + payload

def ip4(src, dst, proto, payload):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), random.getrandbits(16), 0, 64,
                    proto, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", csum(h)) + h[12:] + payload

def ip6(src, dst, nh, payload, hops=64):
    return struct.pack("!IHBB", 6 << 28, len(payload), nh, hops) + \
        socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst) + payload

def pseudo6(src, dst, nh, n):
    return socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst) + \
        struct.pack("!I3xB", n, nh)

def syn(src, dst, dport):
    hdr = struct.pack("!HHIIBBHHH", random.randint(20000, 60000), dport, random.getrandbits(32),
                      0, 5 << 4, 0x02, 64240, 0, 0)
    if ":" in dst:
        c = csum(pseudo6(src, dst, 6, len(hdr)) + hdr)
        return eth(0x86dd, ip6(src, dst, 6, hdr[:16] + struct.pack("!H", c) + hdr[18:]))
    p = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!xBH", 6, len(hdr))
    c = csum(p + hdr)
    return eth(0x0800, ip4(src, dst, 6, hdr[:16] + struct.pack("!H", c) + hdr[18:]))

frames = []
if kind == "syn":
    src, dst, dport, count = args[0], args[1], int(args[2]), int(args[3])
    frames = [syn(src, dst, dport) for _ in range(count)]
elif kind == "arp":
    spa, tpa = args
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2) + smac + socket.inet_aton(spa) + \
        b"\xff" * 6 + socket.inet_aton(tpa)
    frames = [eth(0x0806, arp)] * 3
elif kind == "na":
    target = args[0]
    src = args[1] if len(args) > 1 else target
    body = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + \
        socket.inet_pton(socket.AF_INET6, target) + struct.pack("!BB", 2, 1) + smac
    c = csum(pseudo6(src, "ff02::1", 58, len(body)) + body)
    body = body[:2] + struct.pack("!H", c) + body[4:]
    frames = [eth(0x86dd, ip6(src, "ff02::1", 58, body, hops=255))] * 3
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
for f in frames:
    s.send(f)
"#;

/// Sends `count` SYNs to `dst`:80 with inner source `src`, wrapped in VXLAN (id 42, port 4789)
/// from `pod` to `node` (an address of the node's VXLAN device's `local`), with FRAMES_PY's
/// frame builders; `inner_dmac` is the VXLAN device's MAC.
pub fn send_vxlan_syns(
    w: &World,
    pod: &Pod,
    node: IpAddr,
    inner_dmac: &str,
    src: &str,
    dst: IpAddr,
    count: u32,
) {
    let inner = Inner {
        vni: 42,
        dmac: inner_dmac,
        tags: "",
    };
    send_vxlan_frames(w, pod, node, &inner, src, dst, count);
}

/// The inner frame of [`send_vxlan_frames`]: the VXLAN network id, the destination MAC and
/// FRAMES_PY's tags.
pub struct Inner<'a> {
    pub vni: u32,
    pub dmac: &'a str,
    pub tags: &'a str,
}

/// Sends `count` SYNs to `dst`:80 with inner source `src` in frames shaped by `inner`, wrapped
/// in VXLAN (port 4789) from `pod` to `node`.
pub fn send_vxlan_frames(
    w: &World,
    pod: &Pod,
    node: IpAddr,
    inner: &Inner<'_>,
    src: &str,
    dst: IpAddr,
    count: u32,
) {
    script(&w.h, "frames.py", FRAMES_PY);
    let vxlan_py = format!(
        r#"
import socket, sys
sys.argv = ["frames.py", "lo", "02:00:00:00:00:07", "{dmac}", "{tags}", "none"]
exec(open("{dir}/frames.py").read().split("frames = []")[0])
node, src, dst, count, vni = __import__("os").environ["VX"].split()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(count)):
    u.sendto(bytes([8, 0, 0, 0]) + int(vni).to_bytes(3, "big") + bytes([0]) + syn(src, dst, 80), (node, 4789))
"#,
        dmac = inner.dmac,
        tags = inner.tags,
        dir = w.dir().display()
    );
    let path = script(
        &w.h,
        &format!("vxlan-{}-{}.py", pod.att.container_id, inner.vni),
        &vxlan_py,
    );
    let mut c = pod.ns.cmd("env");
    c.arg(format!("VX={node} {src} {dst} {count} {}", inner.vni))
        .args(["python3", &path]);
    super::run(&mut c);
}

/// Sends frames from `pod`'s eth0 (see [`FRAMES_PY`]).
pub fn send_frames(w: &World, pod: &Pod, srcmac: &str, dstmac: &str, tags: &str, what: &[String]) {
    let path = script(&w.h, "frames.py", FRAMES_PY);
    let mut args: Vec<&str> = vec!["python3", &path, "eth0", srcmac, dstmac, tags];
    args.extend(what.iter().map(String::as_str));
    pod.ns.run(&args);
}

/// Routes the metadata addresses from `thief` with `exempt`'s addresses as its sources, which it
/// takes on its eth0: the shape of every theft of an exempt identity.
pub fn claim_addresses(thief: &Pod, exempt: &Pod, gws: (IpAddr, IpAddr)) {
    thief.ns.addr("eth0", &format!("{}/32", exempt.v4));
    thief.ns.addr("eth0", &format!("{}/128", exempt.v6));
    route_metadata_from(thief, gws, (exempt.v4, exempt.v6));
}

/// Routes the metadata addresses from `pod` through its gateways `gws` with `srcs` as sources.
pub fn route_metadata_from(pod: &Pod, gws: (IpAddr, IpAddr), srcs: (IpAddr, IpAddr)) {
    pod.ns.ip(&format!(
        "route replace {META4}/32 via {} src {}",
        gws.0, srcs.0
    ));
    pod.ns.ip(&format!(
        "-6 route replace {META6}/128 via {} src {}",
        gws.1, srcs.1
    ));
}

/// The host side of a pod's veth on a bridge, from the bridge plugin's result (the interface
/// without a sandbox that is not the bridge).
pub fn host_veth(pod: &Pod) -> String {
    pod.result["interfaces"]
        .as_array()
        .expect("interfaces in the result")
        .iter()
        .filter(|i| i.get("sandbox").is_none())
        .filter_map(|i| i["name"].as_str())
        .find(|n| !n.starts_with("cni"))
        .unwrap_or_else(|| panic!("no host veth in {}", pod.result))
        .to_string()
}

/// The names of the chains of natguard's netdev table on the node: the exempt pods' veths that
/// mark their frames.
pub fn veth_chains(w: &World) -> Vec<String> {
    w.node
        .run(&["nft", "list", "table", "netdev", "natguard"])
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("chain ")
                .map(|c| c.trim_end_matches(" {").to_string())
        })
        .collect()
}

/// Counters at the metadata host for SYNs from `exempt`'s addresses to the metadata addresses
/// (`stolen4/6`), and at the cloud's other address for those of `thief`'s own to port 80
/// (`own4/6`).
pub fn claim_counters(exempt: &Pod, thief: &Pod) -> [(&'static str, String); 4] {
    [
        (
            "stolen4",
            format!("ip saddr {} ip daddr {META4} tcp dport 80", exempt.v4),
        ),
        (
            "stolen6",
            format!("ip6 saddr {} ip6 daddr {META6} tcp dport 80", exempt.v6),
        ),
        (
            "own4",
            format!("ip saddr {} ip daddr {CLOUD4} tcp dport 80", thief.v4),
        ),
        (
            "own6",
            format!("ip6 saddr {} ip6 daddr {CLOUD6} tcp dport 80", thief.v6),
        ),
    ]
}

/// What [`send_frames`] sends for `n` SYNs from `src` to `dst` port 80.
pub fn syn_frames(src: IpAddr, dst: IpAddr, n: u64) -> [String; 5] {
    [
        "syn".to_string(),
        src.to_string(),
        dst.to_string(),
        "80".to_string(),
        n.to_string(),
    ]
}
