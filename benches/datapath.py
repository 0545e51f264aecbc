#!/usr/bin/env python3
"""What natguard's tables cost every forwarded packet, next to the same node without them and
next to a node with a single kube2iam-style DNAT rule, measured side by side in one run.

Started by scripts/bench.sh (root, inside its private mount namespace); it creates every
namespace it uses under the prefix given with --tag and bench.sh deletes them on exit. Nothing
runs in the root namespace: every command is `ip -n`, `ip netns exec` or a setns(2) into a
namespace whose inode is checked against the root one.

Topology, built five times (one copy per alternative, identical addresses):

    remote ── up1 10.250.0.2 │ up0 10.250.0.1 ── node ── dpbr0 (bridge, 10.60.0.0/24) ── 3 pods
                                                      ├─ ptp veths   (10.61.0.0/24)   ── 2 pods
                                                      └─ dpbr2 (bridge, 10.62.0.0/24) ── 3 pods

The third pod of a bridge is of namespace kube-system and never sends: it exists in every copy
(its port is on the bridge) and only the `awake` copy's natguard ADDs it, as an exempt pod.

Pods are real network namespaces attached by Debian's bridge or ptp plugin with host-local IPAM
(ipMasq off), then, in the natguard copy, by natguard with the prevResult the primary plugin
returned, as a runtime chains them. With 1 network only the bridge network exists; with 3, all
three. The alternatives:

    none      the primary plugins only
    natguard  the same, then natguard ADD of every pod but the bridges' third (proxy mode,
              masquerade off, kube-system exempt, so the only difference is the metadata
              guard); no exempt pod on a bridge. The 1,000-pod
              cells add synthetic attachments up to 1,000 (natguard ADD with a prevResult of
              addresses no interface holds and a netns path that does not exist: what matters
              is the size of the ruleset)
    awake     natguard too, and natguard ADD of each bridge's exempt third pod: what a node with
              an exempt pod on a bridge pays (its veth gets a chain that marks its frames;
              0.2.0 and earlier hooked a bridge guard that every bridged frame passed)
    anchor    the primary plugins, then one rule in the node namespace:
              iptables-nft -t nat -A PREROUTING -d 169.254.169.254 -p tcp --dport 80 -j DNAT
              (what kube2iam installs): the cost of conntrack plus a nat hook
    conntrack the primary plugins, then one nft rule in the node namespace that only turns
              conntrack on (`ct state new counter` at prerouting): what any NAT rule, and
              kube-proxy on every node, makes each packet pay before natguard adds anything

Measurements, from one pod of the network: to the other pod (bridged or routed by the node) and
to the remote namespace (forwarded by the node):

    udp   64-byte datagrams, one sending socket as fast as it goes (tools/netload.rs), packets
          per second delivered to the receiving socket
    tcp   one connection, 1-byte request and response back to back: p50 latency (µs)

Each measurement runs the four alternatives in a rotated order, for --runs rounds; the report
gives medians and natguard/none, anchor/none and natguard/conntrack as rates (for
latency, none's p50 over the alternative's p50), so below 1 is slower. A ratio is the median
of the rounds' ratios, not the ratio of two medians: the alternatives of one round run within
seconds of each other, so what slows the machine for a while (a neighbour on the host, a
frequency step) slows both sides of a round's ratio. Target: natguard
≥ 0.98× for every path, test, network count and pod count.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Netns, cni_env, die, log  # noqa: E402

ALTS = ["none", "natguard", "awake", "anchor", "conntrack"]
NATGUARD = ("natguard", "awake")
EXEMPT_NS = "kube-system"
NETS = [
    ("dpbr", "bridge", "dpbr0", "10.60.0.0/24"),
    ("dpptp", "ptp", None, "10.61.0.0/24"),
    ("dpbr2", "bridge", "dpbr2", "10.62.0.0/24"),
]
REMOTE = "10.250.0.2"
UDP_PORT, TCP_PORT = 5001, 5002
TARGET = 0.98


def sh(argv, check=True, env=None):
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if check and p.returncode != 0:
        die(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[:2000]}")
    return p.stdout


class Topo:
    """One copy of the topology for one alternative."""

    def __init__(self, d, alt, nets):
        self.d, self.alt, self.nets = d, alt, nets
        p = f"{d.tag}-{alt[:2]}{nets}"
        self.node_name, self.remote_name = f"{p}-node", f"{p}-rem"
        self.pods = {}  # network name -> [(netns name, ip)]: the two that send and receive
        self.servers = []
        self.synthetic = 0
        for n in (self.node_name, self.remote_name):
            sh(["ip", "netns", "add", n])
            d.created.append(n)
        self.node = Netns(self.node_name, d.root_ino)
        self.netns = {}
        self._wire()
        for net in NETS[:nets]:
            self.pods[net[0]] = [self._pod(net, i) for i in range(2)]
            if net[2]:
                self._pod(net, 2, exempt=True)
        self.real = sum(len(p) for p in self.pods.values()) + (self.bridges() if alt == "awake" else 0)
        if alt in NATGUARD:
            d.guards[alt] = self._bridge_guard()
        if alt == "conntrack":
            with self.node:
                sh(["nft", "add table inet ngbench; add chain inet ngbench pre "
                    "{ type filter hook prerouting priority 0; }; add rule inet ngbench pre ct state new counter"])
        if alt == "anchor":
            with self.node:
                sh(["iptables-nft", "-t", "nat", "-A", "PREROUTING", "-d", "169.254.169.254", "-p", "tcp",
                    "--dport", "80", "-j", "DNAT", "--to-destination", "10.250.0.1:8181"])
        for ns, _ in [p for ps in self.pods.values() for p in ps] + [(self.remote_name, REMOTE)]:
            self.servers.append(self.popen(ns, [d.netload, "tcp-echo", str(TCP_PORT)], stdout=subprocess.DEVNULL))

    def _wire(self):
        n, r = self.node_name, self.remote_name
        for ns in (n, r):
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        sh(["ip", "-n", n, "link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", r])
        sh(["ip", "-n", n, "addr", "add", "10.250.0.1/24", "dev", "up0"])
        sh(["ip", "-n", r, "addr", "add", f"{REMOTE}/24", "dev", "up1"])
        sh(["ip", "-n", n, "link", "set", "up0", "up"])
        sh(["ip", "-n", r, "link", "set", "up1", "up"])
        sh(["ip", "-n", n, "route", "add", "default", "via", REMOTE])
        sh(["ip", "-n", r, "route", "add", "10.60.0.0/14", "via", "10.250.0.1"])
        sh(["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1"])

    def _conf(self, net, extra=None):
        name, kind, bridge, subnet = net
        c = {"cniVersion": "1.0.0", "name": name, "type": kind, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": os.path.join(self.d.work, f"ipam-{self.node_name}")}}
        if bridge:
            c.update({"bridge": bridge, "isGateway": True})
        return c

    def _bridge_guard(self):
        """What the copy measured, for the report: a bridge guard (0.2.0 and earlier),
        hooked or dormant, or none and how many exempt veths mark their frames."""
        out = sh(["ip", "netns", "exec", self.node_name, "nft", "list", "tables"])
        if "table bridge natguard" in out:
            t = sh(["ip", "netns", "exec", self.node_name, "nft", "list", "table", "bridge", "natguard"])
            return "bridge guard " + ("asleep" if "flags dormant" in t else "awake")
        if "table netdev natguard" not in out:
            return "no bridge guard, no exempt veth"
        t = sh(["ip", "netns", "exec", self.node_name, "nft", "list", "table", "netdev", "natguard"])
        n = sum(1 for line in t.splitlines() if line.strip().startswith("chain "))
        return f"no bridge guard, {n} exempt veth chain(s)"

    def bridges(self):
        return sum(1 for net in NETS[: self.nets] if net[2])

    def ng_conf(self, net_name, prev):
        return {"cniVersion": "1.0.0", "name": net_name, "type": "natguard",
                "metadata": {"mode": "proxy", "proxyPort": 8181, "exemptNamespaces": [EXEMPT_NS]},
                "masquerade": {"enabled": False},
                "conntrack": {"flushOnAdd": False}, "prevResult": prev}

    def _env(self, cid, netns, namespace="default"):
        return cni_env("ADD", cid, netns, cid, "/usr/sbin:/usr/bin:/sbin:/bin", cni_path="/usr/lib/cni",
                       namespace=namespace)

    def _plugin(self, binary, conf, env):
        with self.node:
            p = subprocess.run([binary], input=json.dumps(conf), capture_output=True, text=True, env=env)
        if p.returncode != 0:
            die(f"{binary} ADD exited {p.returncode}: {p.stdout[:1000]} {p.stderr[:1000]}")
        return json.loads(p.stdout)

    def _pod(self, net, i, exempt=False):
        ns = f"{self.node_name[:-5]}-{net[0]}{i}"
        sh(["ip", "netns", "add", ns])
        self.d.created.append(ns)
        Netns(ns, self.d.root_ino)  # refuses the root namespace
        cid = f"dp{ns}"
        env = self._env(cid, f"/run/netns/{ns}", EXEMPT_NS if exempt else "default")
        res = self._plugin(f"/usr/lib/cni/{net[1]}", self._conf(net), env)
        if self.alt == "awake" or (self.alt == "natguard" and not exempt):
            res = self._plugin(self.d.natguard, self.ng_conf(net[0], res), env)
        ip = res["ips"][0]["address"].split("/")[0]
        return ns, ip

    def grow(self, total):
        """natguard's copies only: synthetic attachments until natguard holds `total` pods."""
        if self.alt not in NATGUARD:
            return
        real = self.real
        if total <= real + self.synthetic:
            return
        t0 = time.time()
        procs = []
        for k in range(real + self.synthetic, total):
            i = k - real
            net = NETS[i % self.nets][0]
            cid = f"syn{i:05d}" + "0" * 40
            v4 = f"10.64.{i // 250}.{i % 250 + 2}"
            prev = {"cniVersion": "1.0.0",
                    "interfaces": [{"name": "synbr0"}, {"name": f"vsyn{i:05d}"},
                                   {"name": "eth0", "sandbox": f"/var/run/netns/syn-{i}"}],
                    "ips": [{"interface": 2, "address": f"{v4}/16"}], "routes": [{"dst": "0.0.0.0/0"}]}
            with self.node:
                p = subprocess.Popen([self.d.natguard], env=self._env(cid, f"/var/run/netns/syn-{i}"),
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            p.stdin.write(json.dumps(self.ng_conf(net, prev)).encode())
            p.stdin.close()
            procs.append(p)
            while len(procs) >= 6:
                self._reap(procs.pop(0))
        for p in procs:
            self._reap(p)
        self.synthetic = total - real
        log(f"datapath {self.alt}/{self.nets} nets: {total} pods ({self.synthetic} synthetic) in {time.time() - t0:.1f} s")

    @staticmethod
    def _reap(p):
        err = p.stderr.read()
        if p.wait() != 0:
            die(f"natguard synthetic ADD failed: {err.decode(errors='replace')[:1000]}")

    def popen(self, ns, argv, **kw):
        return subprocess.Popen(["ip", "netns", "exec", ns] + argv, **kw)

    def udp(self, src, dst_ns, dst_ip, secs):
        r = self.popen(dst_ns, [self.d.netload, "udp-recv", str(UDP_PORT), str(secs)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.05)
        s = self.popen(src, [self.d.netload, "udp-send", dst_ip, str(UDP_PORT), str(secs + 0.8)])
        out, _ = r.communicate(timeout=secs + 30)
        s.wait(timeout=secs + 30)
        v = float(out.strip() or 0)
        if v <= 0:
            die(f"datapath {self.alt}: no UDP packet from {src} reached {dst_ip}")
        return v

    def tcp(self, src, dst_ip, secs):
        out = sh(["ip", "netns", "exec", src, self.d.netload, "tcp-rr", dst_ip, str(TCP_PORT), str(secs)])
        return float(out.split()[0])

    def paths(self):
        out = []
        for net in NETS[: min(self.nets, 2)]:
            (a, _), (_, b_ip) = self.pods[net[0]]
            b_ns = self.pods[net[0]][1][0]
            out.append((f"{net[1]} pod→pod", a, b_ns, b_ip))
            out.append((f"{net[1]} pod→remote", a, self.remote_name, REMOTE))
        return out

    def close(self):
        for s in self.servers:
            s.kill()
            s.wait()


class Driver:
    def __init__(self, a):
        self.tag, self.work = a.tag, a.work
        self.root_ino = int(a.root_netns_ino)
        self.natguard, self.netload = os.path.abspath(a.natguard), os.path.abspath(a.netload)
        self.created = []
        self.out = a.out
        self.results = []  # (nets, pods, path, test, {alt: [values]}, load)
        self.guards = {}  # natguard's copies: their bridge guard, or their exempt veth chains


def run_cell(d, topos, pods, runs, secs):
    for t in topos.values():
        t.grow(pods)
    ref = topos["none"]
    pods = max(pods, 2 * ref.nets)  # the real pods: 2 per network
    for k, (label, _, _, _) in enumerate(ref.paths()):
        for test in ("udp", "tcp"):
            load0 = os.getloadavg()[0]
            vals = {a: [] for a in ALTS}
            for r in range(runs):
                order = ALTS[r % len(ALTS):] + ALTS[: r % len(ALTS)]
                for alt in order:
                    t = topos[alt]
                    _, src, dst_ns, dst_ip = t.paths()[k]
                    vals[alt].append(t.udp(src, dst_ns, dst_ip, secs) if test == "udp" else t.tcp(src, dst_ip, secs))
            d.results.append((ref.nets, pods, label, test, vals, load0))
            with open(os.path.join(d.out, "bench-datapath.md"), "w") as f:
                f.write(report(d, runs, secs)[0] + "\n")
            # Every round's value of every alternative, for ratios pooled over runs.
            rounds = os.path.join(d.out, "bench-datapath-rounds.tsv")
            new = not os.path.exists(rounds)
            with open(rounds, "a") as f:
                if new:
                    f.write("nets\tpods\tpath\ttest\tround\t" + "\t".join(ALTS) + "\n")
                for r in range(runs):
                    f.write(f"{ref.nets}\t{pods}\t{label}\t{test}\t{r}\t"
                            + "\t".join(f"{vals[a][r]:g}" for a in ALTS) + "\n")
            m = {a: statistics.median(v) for a, v in vals.items()}
            log(f"datapath {ref.nets} nets {pods} pods {label} {test}: " + ", ".join(f"{a} {m[a]:.1f}" for a in ALTS))


def ratio(test, vals, alt, ref="none"):
    """The median of the rounds' ratios: each round measures every alternative back to back, so
    a slow second of the machine (another VM on the host, a frequency step) is on both sides of
    the round's ratio instead of on one median. For tcp, ref's p50 over alt's."""
    per = [(a / r if test == "udp" else r / a) for a, r in zip(vals[alt], vals[ref])]
    return statistics.median(per)


def report(d, runs, secs):
    L = ["## Datapath", ""]
    p = L.append
    p(f"Pods' traffic through the node, side by side (see benches/datapath.py): {runs} rounds of "
      f"{secs:g} s per alternative and measurement, alternated. udp: 64-byte datagrams per second "
      "delivered (median); tcp: 1-byte request/response p50 in µs (median of the rounds' p50). "
      "Ratio: as a rate against `none` (for tcp, none's p50 / the alternative's), below 1 is slower, "
      "the median of the rounds' ratios (a round measures the alternatives back to back); "
      "the last two ratios are natguard, asleep and awake, against `conntrack only` (conntrack on, "
      "nothing else), the same way. `natguard`: no exempt pod on a bridge; "
      "`awake`: an exempt pod on each bridge (it never sends). "
      "The target is against `none`.")
    p("")
    if d.guards:
        p("As measured: " + "; ".join(f"`{a}` copy: {g}" for a, g in sorted(d.guards.items())) + ".")
        p("")
    p("| networks | pods | path | test | none | natguard | awake | anchor (1 DNAT rule) | conntrack only "
      "| natguard ratio | anchor ratio | natguard / conntrack only | awake / conntrack only | load1 |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    oks, worst = [], None
    for nets, pods, label, test, vals, load in d.results:
        m = {a: statistics.median(v) for a, v in vals.items()}
        rn, ra = ratio(test, vals, "natguard"), ratio(test, vals, "anchor")
        rc = ratio(test, vals, "natguard", "conntrack")
        rw = ratio(test, vals, "awake", "conntrack")
        oks.append(rn >= TARGET)
        if worst is None or rn < worst[0]:
            worst = (rn, f"{nets} nets/{pods} pods/{label}/{test}")
        unit = "" if test == "udp" else " µs"
        p(f"| {nets} | {pods:,} | {label} | {test} | {m['none']:,.0f}{unit} | {m['natguard']:,.0f}{unit} | "
          f"{m['awake']:,.0f}{unit} | {m['anchor']:,.0f}{unit} | {m['conntrack']:,.0f}{unit} | "
          f"{rn:.3f} | {ra:.3f} | {rc:.3f} | {rw:.3f} | {load:.2f} |")
    p("")
    verdict = "**met**" if oks and all(oks) else "**missed**"
    p(f"Target: natguard ≥ {TARGET}× of none everywhere: {verdict} "
      f"(met in {sum(oks)} of {len(oks)} rows; lowest {worst[0]:.3f} at {worst[1]})." if worst else "Target: not measured.")
    p("")
    return "\n".join(L), verdict, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--natguard", required=True)
    ap.add_argument("--netload", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--root-netns-ino", required=True)
    ap.add_argument("--nets", default="1,3")
    ap.add_argument("--pods", default="2,1000")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--secs", type=float, default=0.7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.stat("/proc/self/ns/net").st_ino != int(a.root_netns_ino):
        die("datapath.py starts in the namespace bench.sh was started in and creates its own")
    d = Driver(a)
    rounds = os.path.join(a.out, "bench-datapath-rounds.tsv")
    if os.path.exists(rounds):
        os.remove(rounds)  # an earlier run's
    for nets in [int(x) for x in a.nets.split(",")]:
        topos = {alt: Topo(d, alt, nets) for alt in ALTS}
        try:
            for pods in [int(x) for x in a.pods.split(",")]:
                run_cell(d, topos, pods, a.runs, a.secs)
        finally:
            for t in topos.values():
                t.close()
        for n in list(d.created):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
            d.created.remove(n)
    md, _, _ = report(d, a.runs, a.secs)
    with open(os.path.join(a.out, "bench-datapath.md"), "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
