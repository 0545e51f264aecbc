#!/usr/bin/env python3
"""natguard's metadata proxy next to nginx (what an operator would pick instead) and next to no
proxy at all, in one run (scripts/bench.sh --only proxy; docs/benchmarks.md).

Started by scripts/bench.sh (root, inside its private mount namespace, with /run its own); it
creates every namespace it uses under the prefix given with --tag and bench.sh deletes them on
exit. Nothing runs in the root namespace: every command is `ip -n`, `ip netns exec` or a
setns(2) into a namespace whose inode is checked against the root one.

Topology:

    client pod  (default)     ┐                         ┌ cloud: 169.254.169.254 on lo,
    direct pod  (kube-system) ┴ pxbr0 10.70.0.0/24 ─ node ┤  the upstream on :80
                                                          └ (up0 10.250.1.1 ─ up1 10.250.1.2)

Pods are real network namespaces attached by Debian's bridge plugin with host-local IPAM, then
by natguard (preset "aws", kube-system exempt), as a runtime chains them. The node runs
`natguard install --watch`, which serves natguard's proxy on its address at port 8181.

The upstream is nginx serving files (the AWS paths the benchmark asks for, and a token PUT
answered with `return 200`), in the cloud namespace: fast, event-driven, and measured on its
own (the `direct` row), so that it is not what limits the proxies.

The alternatives, all with the same keep-alive clients:

    natguard  the client pod asks http://169.254.169.254/...: natguard's DNAT sends it to
              natguard's proxy, which decides on its AWS allow-list and forwards to the
              original destination with the node's IMDSv2 token (the pod's token is one the
              proxy minted)
    nginx     the client pod asks http://10.71.0.254/..., which one iptables-nft rule of the
              node DNATs to nginx on the node (10.70.0.1:8282), as kube2iam's rule sends pods
              to its proxy: Debian's nginx as a reverse proxy with the same allow-list
              (benches/nginx_allowlist.py: allowed paths pass, everything else 403), HTTP/1.1
              keep-alive to the upstream
    direct    the exempt pod asks the upstream itself (routed by the node, no proxy)

Before measuring, each path must answer the region (200) and, for the two proxies, refuse the
role's credentials (403) where `direct` gets them: the allow-lists are equivalent on what is
measured, and a run that measures a broken proxy fails.

Cores (`placement`): the servers run on the lower half of the cores, wrk on the upper half with a
thread per core it has, so a tail measures the server and not which of wrk's threads and the
server the scheduler ran.

Measurements: wrk (Debian) for --secs seconds at 1 and at 64 keep-alive connections on
/latest/meta-data/placement/region with an IMDSv2 token header: requests per second and p50
and p99 latency (wrk --latency); then 64 connections paced (each waits 2 ms after an answer
before its next request, wrk's `delay()`), which offers every alternative the same load below
its saturation: at saturation the latency also measures what else shares the cores with wrk. Each cell starts with one untimed round of each alternative (a warm-up), then the
alternatives run in a rotated order for --runs rounds;
ratios (natguard/nginx: rates, and nginx's latency over natguard's, so above 1 is natguard
better) are the median of the rounds' ratios. Then each proxy's RSS (VmRSS; nginx: master
and workers summed; natguard: the whole watcher process, proxy included) with --idle
connections open and idle (tools: idle_clients in this file, run in the client pod with its
own RLIMIT_NOFILE raised), each connection having made one request first.

Targets (natguard's issue): throughput ≥ nginx's, p99 ≤ nginx's, RSS ≤ 32 MiB.
"""

import argparse
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Netns, cni_env, die, log  # noqa: E402
import nginx_allowlist  # noqa: E402

ALTS = ["natguard", "nginx", "direct"]
META = "169.254.169.254"
NODE_BR = "10.70.0.1"
NGINX_PORT = 8282
# Where the client pod asks nginx: an address the node DNATs to nginx (one iptables-nft rule, as
# kube2iam sends pods to its proxy), so both proxies' packets pay a NAT translation.
NGINX_VIP = "10.71.0.254"
PROXY_PORT = 8181
REGION_PATH = "/latest/meta-data/placement/region"
CRED_PATH = "/latest/meta-data/iam/security-credentials/bench-role"
# The cells: (label, keep-alive connections, each connection's pause in ms between an answer and
# its next request). The targets are on the first two (wrk at saturation); the paced one offers
# both proxies the same load below their saturation, so its latencies compare the proxies and
# not what else the two cores run (informative, not a target).
CELLS = (("1", 1, 0), ("64", 64, 0), ("64 paced 2 ms", 64, 2))
# Connections per pod in the idle cell: under natguard's per-source share (128, src/proxy).
PER_POD = 100
TARGET_RSS_MIB = 32


def sh(argv, check=True, env=None, timeout=120):
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        die(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[:2000]}")
    return p.stdout


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except OSError:
                pass
    return out


class Bench:
    def __init__(self, a):
        self.a = a
        self.tag, self.work = a.tag, os.path.join(a.work, "proxy")
        os.makedirs(self.work, exist_ok=True)
        self.root_ino = int(a.root_netns_ino)
        self.natguard = os.path.abspath(a.natguard)
        self.created, self.procs = [], []
        self.node_name, self.cloud_name = f"{self.tag}-node", f"{self.tag}-cloud"
        self.direct_name = f"{self.tag}-exempt"
        self.watcher = self.nginx = self.upstream = None
        self.server_cpus, self.wrk_cpus = placement()
        self.raw = []  # every wrk output, in the order run (bench-proxy-wrk.txt)

    # ---- topology ----------------------------------------------------------------------------
    def netns(self, name):
        sh(["ip", "netns", "add", name])
        self.created.append(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        return Netns(name, self.root_ino)

    def popen(self, ns, argv, log_name, setup=None, **kw):
        """A server of the run, started on the servers' cores (`placement`)."""
        out = open(os.path.join(self.work, log_name), "w")
        cpus = self.server_cpus

        def pre():
            if cpus:
                os.sched_setaffinity(0, cpus)
            if setup:
                setup()

        p = subprocess.Popen(["ip", "netns", "exec", ns] + argv, stdout=out, stderr=subprocess.STDOUT,
                             preexec_fn=pre, **kw)
        self.procs.append(p)
        return p

    def build(self):
        n, c = self.node_name, self.cloud_name
        self.node = self.netns(n)
        self.netns(c)
        sh(["ip", "-n", n, "link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", c])
        sh(["ip", "-n", n, "addr", "add", "10.250.1.1/24", "dev", "up0"])
        sh(["ip", "-n", c, "addr", "add", "10.250.1.2/24", "dev", "up1"])
        sh(["ip", "-n", c, "addr", "add", f"{META}/32", "dev", "lo"])
        for ns, dev in ((n, "up0"), (c, "up1")):
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
        sh(["ip", "-n", n, "route", "add", "default", "via", "10.250.1.2"])
        sh(["ip", "-n", c, "route", "add", "10.70.0.0/24", "via", "10.250.1.1"])
        sh(["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        # Room for the idle connections (per namespace: the node's ports, the pods' ports).
        for ns in (n, c):
            sh(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.core.somaxconn=65535"])
        self.start_upstream()
        self.entry = {"type": "natguard", "metadata": {"preset": "aws", "exemptNamespaces": ["kube-system"]},
                      "masquerade": {"enabled": False}, "conntrack": {"flushOnAdd": False}}
        self.bridge = {"cniVersion": "1.0.0", "name": "pxnet", "type": "bridge", "bridge": "pxbr0",
                       "isGateway": True, "ipMasq": False,
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.70.0.0/24"}]],
                                "routes": [{"dst": "0.0.0.0/0"}], "dataDir": os.path.join(self.work, "ipam")}}
        # natguard's proxy takes at most PER_POD connections from one pod (a share each), so the
        # idle connections come from as many pods as that takes; wrk runs in the first.
        self.clients = [f"{self.tag}-pod{i}" for i in range(max(1, -(-self.a.idle // PER_POD)))]
        self.client_name = self.clients[0]
        for name in self.clients:
            self.pod(name, "default")
        self.pod(self.direct_name, "kube-system")
        self.start_watcher()
        self.start_nginx()

    def pod(self, name, namespace):
        self.netns(name)
        env = cni_env("ADD", f"px{name}", f"/run/netns/{name}", name, "/usr/sbin:/usr/bin:/sbin:/bin",
                      cni_path="/usr/lib/cni", namespace=namespace)
        prev = self.plugin("/usr/lib/cni/bridge", self.bridge, env)
        conf = dict(self.entry, cniVersion="1.0.0", name="pxnet", prevResult=prev)
        self.plugin(self.natguard, conf, env)
        return prev["ips"][0]["address"].split("/")[0]

    def plugin(self, binary, conf, env):
        with self.node:
            p = subprocess.run([binary], input=json.dumps(conf), capture_output=True, text=True, env=env)
        if p.returncode != 0:
            die(f"{binary} ADD exited {p.returncode}: {p.stdout[:1000]} {p.stderr[:1000]}")
        return json.loads(p.stdout)

    def start_upstream(self):
        root = os.path.join(self.work, "upstream")
        files = {
            REGION_PATH: "eu-west-3",
            "/latest/meta-data/placement/availability-zone": "eu-west-3b",
            "/latest/meta-data/instance-id": "i-0a1b2c3d4e5f67890",
            CRED_PATH: json.dumps({"Code": "Success", "AccessKeyId": "ASIABENCH", "SecretAccessKey": "x",
                                   "Token": "x", "Expiration": "2030-01-01T00:00:00Z"}),
        }
        for path, body in files.items():
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            with open(root + path, "w") as f:
                f.write(body)
        conf = os.path.join(self.work, "upstream.conf")
        with open(conf, "w") as f:
            # As many workers as cores: the upstream must not be what limits the proxies.
            f.write(nginx_allowlist.upstream_conf(self.work, root, self.a.idle, workers="auto"))
        self.upstream = self.popen(self.cloud_name, ["nginx", "-p", self.work, "-e", os.path.join(self.work, "upstream-error.log"),
                                                       "-c", conf], "upstream.log")
        self.wait_port(self.cloud_name, 80, "the upstream (nginx serving files)", self.upstream)

    def start_nginx(self):
        conf = os.path.join(self.work, "nginx-proxy.conf")
        with open(conf, "w") as f:
            f.write(nginx_allowlist.proxy_conf(self.work, f"{NODE_BR}:{NGINX_PORT}", f"{META}:80", self.a.idle))
        self.nginx = self.popen(self.node_name, ["nginx", "-p", self.work, "-e", os.path.join(self.work, "nginx-proxy-error.log"),
                                                     "-c", conf], "nginx-proxy.log")
        self.wait_port(self.node_name, NGINX_PORT, "nginx (the reverse proxy)", self.nginx)
        sh(["ip", "netns", "exec", self.node_name, "iptables-nft", "-t", "nat", "-A", "PREROUTING", "-d", NGINX_VIP,
            "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", f"{NODE_BR}:{NGINX_PORT}"])

    def start_watcher(self):
        netd, bindir, cache = (os.path.join(self.work, d) for d in ("net.d", "bin", "cache"))
        for d in (netd, bindir, cache):
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(netd, "10-pxnet.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "pxnet", "plugins": [self.bridge, self.entry]}, f)
        entry = os.path.join(self.work, "natguard-entry.json")
        with open(entry, "w") as f:
            json.dump(self.entry, f)
        limit = nginx_allowlist.nofile(self.a.idle)

        def nofile():  # the proxy holds a descriptor per connection (and one upstream)
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.watcher = self.popen(self.node_name, [
            self.natguard, "install", "--watch", "--cni-bin-dir", bindir, "--netconf-dir", netd,
            "--cache-dir", cache, "--config", entry], "watcher.log", setup=nofile)
        self.wait_port(self.node_name, PROXY_PORT, "natguard's proxy (natguard install --watch, "
                       "metadata.serveProxy defaults to true)", self.watcher)

    def wait_port(self, ns, port, what, proc, secs=15):
        end = time.time() + secs
        while time.time() < end:
            if proc.poll() is not None:
                break
            if sh(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"]).strip():
                return
            time.sleep(0.05)
        logs = sorted(f for f in os.listdir(self.work) if f.endswith(".log"))
        tail = ""
        for name in logs:
            with open(os.path.join(self.work, name), errors="replace") as f:
                tail += f"\n--- {name}\n" + f.read()[-1500:]
        die(f"nothing listens on port {port} in {ns} after {secs} s: {what} is not serving{tail}")

    # ---- the paths ---------------------------------------------------------------------------
    def target(self, alt):
        """(the pod's namespace, the base URL) of an alternative."""
        if alt == "natguard":
            return self.client_name, f"http://{META}"
        if alt == "nginx":
            return self.client_name, f"http://{NGINX_VIP}"
        return self.direct_name, f"http://{META}"

    def request(self, alt, method, path, headers):
        ns, base = self.target(alt)
        with Netns(ns, self.root_ino):
            req = urllib.request.Request(base + path, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status, r.read().decode(errors="replace")
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode(errors="replace")
            except OSError as e:
                return 0, str(e)

    def check(self):
        """Tokens for each alternative, and the allow-lists equivalent on what is measured."""
        self.tokens = {}
        for alt in ALTS:
            code, token = self.request(alt, "PUT", "/latest/api/token",
                                       {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
            if code != 200 or not token.strip():
                die(f"{alt}: PUT /latest/api/token answered {code}: {token[:300]}")
            self.tokens[alt] = token.strip()
            h = {"X-aws-ec2-metadata-token": self.tokens[alt]}
            code, body = self.request(alt, "GET", REGION_PATH, h)
            if (code, body.strip()) != (200, "eu-west-3"):
                die(f"{alt}: GET {REGION_PATH} answered {code}: {body[:300]}")
            code, body = self.request(alt, "GET", CRED_PATH, h)
            want = 200 if alt == "direct" else 403
            if code != want:
                die(f"{alt}: GET {CRED_PATH} answered {code} (expected {want}): {body[:300]}")
        log("proxy: every path answers the region; both proxies refuse the credentials")

    # ---- measurements ------------------------------------------------------------------------
    def wrk(self, alt, conns, secs, pause=0, warmup=False):
        ns, base = self.target(alt)
        # One wrk thread per core wrk has: two threads on one core take turns by the scheduler's
        # slices, and a response that arrives for the thread not running waits its turn, which
        # is the tail wrk would then report.
        threads = min(conns, len(self.wrk_cpus) or 2)
        paced = []
        if pause:
            script = os.path.join(self.work, f"pause-{pause}.lua")
            with open(script, "w") as f:
                f.write(f"function delay()\n  return {pause}\nend\n")
            paced = ["-s", script]
        pin = ["taskset", "-c", ",".join(map(str, sorted(self.wrk_cpus)))] if self.wrk_cpus else []
        out = sh(pin + ["ip", "netns", "exec", ns, "wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(secs))}s", "--latency"] + paced + [
                  "-H", f"X-aws-ec2-metadata-token: {self.tokens[alt]}", base + REGION_PATH],
                 timeout=secs + 60)
        self.raw.append(f"## {alt}, {conns} connection(s), pause {pause} ms{', warm-up (not counted)' if warmup else ''}\n{out}")
        rps = lat50 = lat99 = None
        errors = 0
        for line in out.splitlines():
            w = line.split()
            if line.startswith("Requests/sec:"):
                rps = float(w[1])
            elif len(w) == 2 and w[0] == "50%":
                lat50 = us(w[1])
            elif len(w) == 2 and w[0] == "99%":
                lat99 = us(w[1])
            elif "Non-2xx or 3xx responses" in line:
                errors += int(w[-1])
            elif line.strip().startswith("Socket errors"):
                errors += sum(int(x.rstrip(",")) for x in w if x.rstrip(",").isdigit())
        if rps is None or lat50 is None or lat99 is None:
            die(f"wrk against {alt}: no result in\n{out}")
        if errors:
            die(f"wrk against {alt}: {errors} errors or non-2xx answers:\n{out}")
        return rps, lat50, lat99

    def idle_rss(self, alt, n):
        """RSS (KiB) of the proxy before and with `n` idle keep-alive connections, and how many
        were open at the time."""
        if alt == "natguard":
            # The watcher's processes are those running the binary under test (`--bin` may
            # name it anything); none found is an error, never an RSS of 0.
            exe = os.path.realpath(self.natguard)
            pids = [self.watcher.pid] + children(self.watcher.pid)
            pids = [p for p in pids if os.path.realpath(f"/proc/{p}/exe") == exe]
            if not pids:
                die(f"no process of the watcher runs {exe}: its RSS cannot be read")
        else:
            master = [p for p in children(self.nginx.pid)] + [self.nginx.pid]
            pids = set()
            for p in master:
                if os.path.basename(os.readlink(f"/proc/{p}/exe")) == "nginx":
                    pids.add(p)
                    pids.update(children(p))
        before = sum(rss_kib(p) for p in pids)
        ns, base = self.target(alt)
        host, port = base[len("http://"):].split(":") if base.count(":") > 1 else (base[len("http://"):], "80")
        if alt != "natguard":
            ns = self.client_name
        per = -(-n // len(self.clients))
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, os.path.abspath(__file__), "--idle-client",
                              host, port, str(per), str(self.root_ino), ",".join(self.clients)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().split()
        if len(line) != 2 or line[0] != "open":
            p.kill()
            die(f"idle client against {alt}: {line}")
        time.sleep(0.5)  # let the proxy settle (allocations of the last accepts)
        with_idle = sum(rss_kib(x) for x in pids)
        p.stdin.close()
        p.wait(timeout=60)
        return before, with_idle, int(line[1])

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for n in reversed(self.created):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def placement():
    """(the servers' cores, wrk's cores): the lower half of the cores this run may use for the
    servers (natguard's watcher, nginx, the upstream), the upper half for wrk. Left to the
    scheduler, wrk's threads and a server share both cores of a small machine, and a tail at
    saturation measures which of them the scheduler ran when; apart, it measures the server.
    One core: no placement (empty sets)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(), set()
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def us(s):
    """wrk's latency ("812.00us", "1.23ms", "1.01s") in µs."""
    for unit, f in (("us", 1), ("ms", 1e3), ("s", 1e6)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * f
    return float(s)


def idle_client(host, port, per, root_ino, pods):
    """From each pod of `pods` (entered with setns), `per` connections to host:port, each making
    one keep-alive request for the region with that pod's IMDSv2 token (one PUT per pod: the
    proxy's tokens are the pod's); reports `open <k>` (how many are still open once all are
    answered), then holds them until stdin closes. RLIMIT_NOFILE is raised for this process
    only."""
    n = per * len(pods)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, n + 256))
    socks = []
    ep = select.epoll()
    state = {}
    for name in pods:
        with Netns(name, root_ino):
            c = socket.create_connection((host, int(port)), timeout=10)
            c.sendall((f"PUT /latest/api/token HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                       "X-aws-ec2-metadata-token-ttl-seconds: 21600\r\nConnection: close\r\n\r\n").encode())
            resp = b""
            while True:
                d = c.recv(4096)
                if not d:
                    break
                resp += d
            c.close()
            head, _, token = resp.decode(errors="replace").partition("\r\n\r\n")
            if " 200 " not in head.split("\r\n")[0]:
                die(f"idle client: the token PUT from {name} answered {head[:200]}")
            req = (f"GET {REGION_PATH} HTTP/1.1\r\nHost: {host}\r\n"
                   f"X-aws-ec2-metadata-token: {token.strip()}\r\n\r\n").encode()
            for _ in range(per):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex((host, int(port)))
                socks.append(s)
                state[s.fileno()] = [s, b"", False, req]
                ep.register(s.fileno(), select.EPOLLOUT)
    end = time.time() + 60
    while state and time.time() < end:
        for fd, ev in ep.poll(1):
            st = state[fd]
            if ev & (select.EPOLLERR | select.EPOLLHUP) and not ev & select.EPOLLIN:
                ep.unregister(fd)
                del state[fd]
            else:
                try:
                    if not st[2]:
                        st[0].send(st[3])
                        st[2] = True
                        ep.modify(fd, select.EPOLLIN)
                        continue
                    data = st[0].recv(4096)
                except OSError:  # refused or reset: not open, counted below
                    data = b""
                st[1] += data
                if not data or st[1].endswith(b"eu-west-3"):
                    ep.unregister(fd)
                    del state[fd]
    alive = sum(1 for s in socks if alive_socket(s))
    print(f"open {alive}", flush=True)
    sys.stdin.read()
    for s in socks:
        s.close()


def alive_socket(s):
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def ratio(vals, alt, ref, higher_better):
    per = [(a / r if higher_better else r / a) for a, r in zip(vals[alt], vals[ref])]
    return statistics.median(per)


def report(results, rss, runs, secs, idle, cores):
    L = ["## Metadata proxy", ""]
    p = L.append
    p(f"natguard's metadata proxy, Debian's nginx with the same AWS allow-list, and the upstream asked "
      f"directly (benches/proxy.py): wrk, {runs} round(s) of {secs:g} s per alternative and "
      "connection count (after one untimed round of each), alternated, on /latest/meta-data/placement/region with an IMDSv2 token. "
      "Medians of the rounds; natguard/nginx is the median of the rounds' ratios (requests/s: "
      "natguard's over nginx's; latency: nginx's over natguard's), so above 1 is natguard ahead. "
      "The upstream is nginx serving files; `direct` shows what it gives without a proxy. "
      "`64 paced 2 ms`: each connection waits 2 ms after an answer before its next request, so "
      "the alternatives get the same load below their saturation (informative, not a target). "
      + (f"Cores: the servers on {cores[0]}, wrk on {cores[1]}." if cores[0] else
         "One core: servers and wrk share it."))
    p("")
    p("| connections | metric | natguard | nginx | direct | natguard/nginx |")
    p("|---|---|---|---|---|---|")
    verdicts = []
    for (label, _, pause), vals in results:
        for k, (name, hb, fmt) in enumerate((("requests/s", True, "{:,.0f}"), ("p50 µs", False, "{:,.0f}"),
                                               ("p99 µs", False, "{:,.0f}"))):
            col = {a: [v[k] for v in vals[a]] for a in ALTS}
            m = {a: statistics.median(col[a]) for a in ALTS}
            r = ratio(col, "natguard", "nginx", hb)
            if k != 1 and not pause:
                verdicts.append(r >= 1)
            p(f"| {label} | {name} | {fmt.format(m['natguard'])} | {fmt.format(m['nginx'])} | "
              f"{fmt.format(m['direct'])} | {r:.2f} |")
    p("")
    if rss:
        p(f"RSS with {idle:,} idle keep-alive connections (each made one request first):")
        p("")
        p("| proxy | RSS before | RSS with the idle connections | connections open |")
        p("|---|---|---|---|")
        for alt, (before, with_idle, alive) in rss.items():
            p(f"| {alt} | {before / 1024:.1f} MiB | {with_idle / 1024:.1f} MiB | {alive:,} of {idle:,} |")
        p("")
        ng = rss.get("natguard")
        if ng:
            verdicts.append(ng[1] / 1024 <= TARGET_RSS_MIB)
    p(f"Targets (throughput ≥ nginx, p99 ≤ nginx, RSS ≤ {TARGET_RSS_MIB} MiB): "
      + ("**met**" if verdicts and all(verdicts) else f"**missed** ({verdicts.count(False)} of {len(verdicts)})"))
    p("")
    return "\n".join(L)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--idle-client":
        host, port, per, root_ino, pods = sys.argv[2:7]
        idle_client(host, port, int(per), int(root_ino), pods.split(","))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--natguard", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--root-netns-ino", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.stat("/proc/self/ns/net").st_ino != int(a.root_netns_ino):
        die("proxy.py starts in the namespace bench.sh was started in and creates its own")
    b = Bench(a)
    results, rss = [], {}
    try:
        b.build()
        b.check()
        for cell in CELLS:
            label, conns, pause = cell
            vals = {alt: [] for alt in ALTS}
            # One untimed round of each alternative first: the cell's first measured round was
            # the slowest of its alternative in most runs (what the setup, or the cell before,
            # left the machine doing), and the rotation always starts with natguard.
            for alt in ALTS:
                b.wrk(alt, conns, a.secs, pause, warmup=True)
            for r in range(a.runs):
                for alt in ALTS[r % len(ALTS):] + ALTS[: r % len(ALTS)]:
                    vals[alt].append(b.wrk(alt, conns, a.secs, pause))
            results.append((cell, vals))
            m = {alt: statistics.median(v[0] for v in vals[alt]) for alt in ALTS}
            m99 = {alt: statistics.median(v[2] for v in vals[alt]) for alt in ALTS}
            log(f"proxy {label} connection(s): " + ", ".join(f"{alt} {m[alt]:,.0f} req/s p99 {m99[alt]:,.0f} µs" for alt in ALTS))
        for alt in ("natguard", "nginx"):
            rss[alt] = b.idle_rss(alt, a.idle)
            log(f"proxy {alt}: RSS {rss[alt][0] / 1024:.1f} MiB, {rss[alt][1] / 1024:.1f} MiB with "
                f"{rss[alt][2]:,} idle connections")
    finally:
        b.close()
        with open(os.path.join(a.out, "bench-proxy-wrk.txt"), "w") as f:
            f.write("\n".join(b.raw))
    cores = tuple(",".join(map(str, sorted(c))) for c in placement())
    md = report(results, rss, a.runs, a.secs, a.idle, cores)
    with open(os.path.join(a.out, "bench-proxy.md"), "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
