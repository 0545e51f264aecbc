#!/usr/bin/env python3
"""natguard's per-pod cost next to the tools operators use today, measured in the same run.

Started by scripts/bench.sh inside the node namespace it created (`ip netns exec`); never run it
in the root namespace (it refuses to). What it measures, and how:

* Every plugin is fork/exec'd the way a runtime does it: CNI_* environment, the network config
  with prevResult on a stdin pipe, stdout and stderr captured. A small static reaper
  (tools/timeit.rs) spawns it and reaps it with wait4, so a sample is exactly one process
  tree: wall time from spawn to reap, CPU = user+sys of the process and every child it waited
  for. Peak RSS comes from separate untimed runs traced to their exit (VmHWM of the process
  itself, and ru_maxrss of its tree).
* Alternatives, alternated within each run (the order rotates every run, so drift of the
  machine hits all of them alike):
    natguard            the release binary, default config (conntrack.flushOnAdd true)
    natguard-noflush    the same with conntrack.flushOnAdd false: the nf_tables cost alone
    portmap-nft         Debian's portmap 1.1.1 chained the same way, iptables-nft by PATH
    portmap-legacy      the same with iptables-legacy
    naive               what agents and init containers do: `iptables -t nat -A` of a DNAT rule
                        per pod address (iptables-nft, Debian's default) then
                        `conntrack -D -s <pod address>`; DEL is `iptables -t nat -D`.
* Axes: pods already on the node, unrelated conntrack entries, single or dual stack.
  Each ADD is followed by the DEL of the same pod, so the node stays at N pods.
* State. natguard's N pods come from its own ADD (flushOnAdd off, six at a time). The naive
  path's N rules and portmap's N pods are loaded with iptables-restore: portmap's from a
  template learnt by diffing iptables-save around one real portmap ADD, so the chains, rules
  and comments are the ones portmap itself writes. portmap runs only up to PORTMAP_MAX pods:
  each of its ADDs dumps the whole nat table four times, so 10,000 pods would cost seconds
  per sample and blow the run's time budget (the table says so where it is absent).
* Unrelated conntrack entries are created in bulk over ctnetlink by tools/nfbench.rs, a helper
  built from natguard's own kernel layer (batched IPCTNL_MSG_CT_NEW, about 1 s per 100,000; the
  `conntrack -I` CLI takes about 190 s), in the node namespace.
* Kernel floor: one ctnetlink IPCTNL_MSG_CT_DELETE with CTA_FILTER on an address that has no
  entry, timed by nfbench around send+ACK from an already open socket: the cost of one filtered
  walk of the conntrack table, the least any cleanup of a pod's flows can cost.
* ADD minus its conntrack kernel calls, paired: extra natguard ADDs with a logFile, back to back,
  their DELs after the last; natguard's log line gives the time its conntrack kernel calls took,
  so each ADD's wall time less that is what the ADD costs besides them, from one process (see
  natguard_minus_walks for why no DEL runs between them).

* Bursts (`burst`): 32 natguard ADDs started, blocked reading their stdin, and released at
  once, against one ADD released the same way in the same round (see burst_cell).
* Many interfaces (`ifaces`): ADD and DEL on nodes with 12, 122 and 512 interfaces, alternated
  (see ifaces_setup, ifaces_cell). The datapath cell is benches/datapath.py.

Output: a Markdown report on stdout and in OUT/bench-results.md, raw samples in
OUT/bench-samples.tsv.
"""

import argparse
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

NETWORK = "benchnet"
NODE_V4, NODE_V6 = "10.250.0.1", "fd00:250::1"
METADATA_V4, METADATA_V6 = "169.254.169.254", "fd00:ec2::254"
PROXY_PORT = 8181
PORTMAP_MAX = 1000
CNI_PATH = "/opt/cni/bin:/usr/lib/cni"

REF = "natguard@10"  # natguard in a second node namespace that keeps 10 pods (flat-scaling reference)
ALTS = ["natguard", "natguard-noflush", "portmap-nft", "portmap-legacy", "naive", REF]
DELETES_CT = ("natguard", "naive", REF)


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(f"FAILED: {msg}")
    sys.exit(1)


# --------------------------------------------------------------------------------------------
# Network namespaces
# --------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def netns_id(path="/proc/self/ns/net"):
    return os.stat(path).st_ino


class Netns:
    """A namespace created by bench.sh; `with ns:` runs the block inside it."""

    def __init__(self, name, root_ino):
        self.name = name
        self.fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(self.fd).st_ino == root_ino:
            die(f"netns {name} is the root namespace")
        self.root_ino = root_ino
        self.stack = []

    def enter(self):
        back = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if _libc.setns(self.fd, CLONE_NEWNET) != 0:
            die(f"setns {self.name}: {os.strerror(ctypes.get_errno())}")
        if netns_id() == self.root_ino:
            die("entered the root namespace")
        self.stack.append(back)

    def leave(self):
        back = self.stack.pop()
        if _libc.setns(back, CLONE_NEWNET) != 0:
            die(f"setns back from {self.name}: {os.strerror(ctypes.get_errno())}")
        os.close(back)

    def __enter__(self):
        self.enter()
        return self

    def __exit__(self, *a):
        self.leave()


# --------------------------------------------------------------------------------------------
# Spawning and timing
# --------------------------------------------------------------------------------------------


class Sample:
    """One process (tree): wall and CPU time, ru_maxrss of the tree, and in --hwm mode the
    process's own peak RSS (VmHWM at exit)."""

    __slots__ = ("wall_us", "cpu_us", "rss_kb", "hwm_kb", "anon_kb", "file_kb")

    def __init__(self, wall_us, cpu_us, rss_kb, hwm_kb=0, anon_kb=0, file_kb=0):
        self.wall_us, self.cpu_us, self.rss_kb = wall_us, cpu_us, rss_kb
        self.hwm_kb, self.anon_kb, self.file_kb = hwm_kb, anon_kb, file_kb

    @staticmethod
    def chain(samples):
        """A sequence of processes run one after the other (the naive path)."""
        big = max(samples, key=lambda s: s.hwm_kb)
        return Sample(
            sum(s.wall_us for s in samples),
            sum(s.cpu_us for s in samples),
            max(s.rss_kb for s in samples),
            big.hwm_kb,
            big.anon_kb,
            big.file_kb,
        )


_OUT_FD = os.memfd_create("bench-stdout", os.MFD_CLOEXEC)
_ERR_FD = os.memfd_create("bench-stderr", os.MFD_CLOEXEC)


def _read_fd(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks).decode(errors="replace")


TIMEIT = None  # path of the tools/timeit.rs binary, set in main()
_RES_FD = os.memfd_create("bench-result", os.MFD_CLOEXEC)


def spawn(argv, env, stdin=b"", ok_codes=(0,)):
    """fork/exec argv with env and stdin on a pipe, through timeit (see tools/timeit.rs);
    returns (Sample, stdout, stderr)."""
    if len(stdin) > 60000:
        die("stdin larger than a pipe buffer")
    r, w = os.pipe()
    os.write(w, stdin)
    os.close(w)
    for fd in (_OUT_FD, _ERR_FD, _RES_FD):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    actions = [
        (os.POSIX_SPAWN_DUP2, r, 0),
        (os.POSIX_SPAWN_DUP2, _OUT_FD, 1),
        (os.POSIX_SPAWN_DUP2, _ERR_FD, 2),
        (os.POSIX_SPAWN_DUP2, _RES_FD, 3),
    ]
    pre = [TIMEIT, "--hwm"] if HWM_MODE[0] else [TIMEIT]
    pid = os.posix_spawn(TIMEIT, pre + argv, env, file_actions=actions)
    _, status, _ = os.wait4(pid, 0)
    os.close(r)
    code = os.waitstatus_to_exitcode(status)
    out, err = _read_fd(_OUT_FD), _read_fd(_ERR_FD)
    res = _read_fd(_RES_FD).split()
    if code not in ok_codes or len(res) != 7:
        die(f"{' '.join(argv)} exited {code}\nstdout: {out[:2000]}\nstderr: {err[:2000]}")
    wall_ns, cpu_us, rss_kb, own_kb, hwm_kb, anon_kb, file_kb = (int(x) for x in res)
    RSS_FLOOR[0] = max(RSS_FLOOR[0], own_kb)
    return Sample(wall_ns / 1000.0, cpu_us, rss_kb, hwm_kb, anon_kb, file_kb), out, err


RSS_FLOOR = [0]  # timeit's own peak RSS (kB): ru_maxrss of a child cannot show less
HWM_MODE = [False]  # spawn through `timeit --hwm` (ptrace): for the untimed RSS runs only


def run(argv, stdin=None, check=True):
    """Untimed helper command."""
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if check and p.returncode != 0:
        die(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[:2000]}")
    return p.stdout


def which(name, path=None):
    for d in (path or os.environ.get("PATH", "")).split(":"):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    die(f"{name} not found in PATH")


# --------------------------------------------------------------------------------------------
# Conntrack entries and the kernel's floor, through tools/nfbench.rs (natguard's own kernel layer)
# --------------------------------------------------------------------------------------------

NFBENCH = None  # path of the tools/nfbench.rs binary, set in main()
ROOT_INO = None  # the root namespace's inode: nfbench refuses to change its conntrack table


def nfbench(args, stdin="", netns=False):
    """Runs nfbench with args in the current namespace (netns=True: in a new, empty one, for
    the nf_tables experiments, which create a scratch table); returns its stdout."""
    argv = (["unshare", "--net"] if netns else []) + [NFBENCH] + args
    env = dict(os.environ, NFBENCH_ROOT_NETNS_INO=str(ROOT_INO))
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        die(f"nfbench {' '.join(args)}: {p.stderr.strip()[:2000]}")
    return p.stdout


def _flows(entries):
    return "".join(f"{s} {d} {sp} {dp}\n" for s, d, sp, dp in entries)


class Ctnl:
    """The conntrack table of the namespace that was current when this was made: every call
    runs nfbench there, whichever namespace the driver is in at the time."""

    def __init__(self):
        self.fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.ino = os.fstat(self.fd).st_ino

    def _run(self, args, stdin=""):
        if netns_id() == self.ino:
            return nfbench(args, stdin)
        back = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if _libc.setns(self.fd, CLONE_NEWNET) != 0:
            die(f"setns: {os.strerror(ctypes.get_errno())}")
        try:
            return nfbench(args, stdin)
        finally:
            if _libc.setns(back, CLONE_NEWNET) != 0:
                die(f"setns back: {os.strerror(ctypes.get_errno())}")
            os.close(back)

    def create(self, entries):
        """Creates (src, dst, sport, dport) ESTABLISHED TCP entries; any failure is fatal."""
        self._run(["ct-create"], _flows(entries))

    def walks(self, ip, reps):
        """`reps` filtered deletes of every entry whose original source is ip, each timed around
        send+ACK from an open socket. Returns ms each, or None where the kernel refuses
        CTA_FILTER on a delete (EINVAL: 5.10 and 6.1)."""
        out = self._run(["ct-walk", ip, str(reps)]).split()
        return None if out == ["refused"] else [float(x) for x in out]

    def delete_tuples(self, entries):
        """Deletes entries by exact original tuple (a hash lookup, no walk); gone ones are fine."""
        self._run(["ct-delete"], _flows(entries))

    def flush(self):
        """Deletes every entry of this namespace."""
        self._run(["ct-flush"])


def ct_count():
    with open("/proc/sys/net/netfilter/nf_conntrack_count") as f:
        return int(f.read())


def ct_machine_wide():
    """Conntrack entries in every namespace (nf_conntrack slab objects): the hash table is shared
    by all namespaces, so other namespaces' entries lengthen our walks too."""
    try:
        with open("/proc/slabinfo") as f:
            for line in f:
                if line.startswith("nf_conntrack "):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def unrelated_entries(n):
    """n distinct IPv4 TCP flows 10.200.0.0/16 -> 10.201.0.1:443, none touching a pod address."""
    return [
        (f"10.200.{(i >> 8) & 255}.{i & 255}", "10.201.0.1", 10000 + (i >> 16), 443) for i in range(n)
    ]


def pod_entries(addrs):
    """Flows a pod's address left behind, in both directions, for each address."""
    out = []
    for a in addrs:
        peer = "10.99.0.1" if ":" not in a else "fd00:99::1"
        peer2 = "10.99.0.2" if ":" not in a else "fd00:99::2"
        out.append((a, peer, 40000, 80))  # original source = the pod
        out.append((peer2, a, 40001, 8080))  # reply source = the pod
    return out


# --------------------------------------------------------------------------------------------
# Pods and configs
# --------------------------------------------------------------------------------------------


def cni_env(command, cid, netns, pod, path, more_args="", cni_path=CNI_PATH, namespace="default"):
    """The environment a runtime gives a CNI plugin (the benchmarks' one CNI driver: bench.py's
    pods and datapath.py's): pod `pod` of `namespace`, interface eth0."""
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}{more_args}",
        "CNI_PATH": cni_path,
        "PATH": path,
    }


class Pod:
    """Pod i of a range: state pods (range 244) stay, bench pods (range 245) come and go."""

    def __init__(self, rng, i, dual):
        self.cid = f"ngb{rng}{i:06d}" + hashlib.sha256(f"{rng}-{i}".encode()).hexdigest()[:52]
        self.name = f"pod-{rng}-{i}"
        self.v4 = f"10.{rng}.{i // 250}.{i % 250 + 2}"
        self.v6 = f"fd00:10:{rng}::{i + 2:x}" if dual else None
        self.host_port = 20000 + i
        self.addrs = [self.v4] + ([self.v6] if self.v6 else [])

    def prev_result(self):
        ips = [{"interface": 2, "address": f"{self.v4}/16", "gateway": f"{self.v4.rsplit('.', 2)[0]}.0.1"}]
        routes = [{"dst": "0.0.0.0/0"}]
        if self.v6:
            ips.append({"interface": 2, "address": f"{self.v6}/64", "gateway": self.v6.split("::")[0] + "::1"})
            routes.append({"dst": "::/0"})
        return {
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "0a:58:0a:f4:00:01"},
                {"name": "veth" + self.cid[-8:], "mac": "0a:58:0a:f4:00:02"},
                {"name": "eth0", "mac": "0a:58:0a:f4:00:03", "sandbox": f"/var/run/netns/cni-{self.cid[:8]}"},
            ],
            "ips": ips,
            "routes": routes,
            "dns": {},
        }

    def env(self, command, path):
        return cni_env(command, self.cid, f"/var/run/netns/cni-{self.cid[:8]}", self.name, path,
                       f";K8S_POD_INFRA_CONTAINER_ID={self.cid};"
                       f"K8S_POD_UID=00000000-0000-0000-0000-{self.cid[-12:]}")


def natguard_conf(pod, flush, log_file=None):
    c = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "natguard",
        "metadata": {"mode": "proxy", "proxyPort": PROXY_PORT, "exemptNamespaces": ["kube-system"]},
        "masquerade": {"enabled": True},
        "conntrack": {"flushOnAdd": flush},
        "prevResult": pod.prev_result(),
    }
    if log_file:
        # The conntrack report is an info line.
        c["logFile"] = log_file
        c["logLevel"] = "info"
    return json.dumps(c).encode()


def portmap_conf(pod):
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "portmap",
            "capabilities": {"portMappings": True},
            "snat": True,
            "runtimeConfig": {"portMappings": [{"hostPort": pod.host_port, "containerPort": 80, "protocol": "tcp"}]},
            "prevResult": pod.prev_result(),
        }
    ).encode()


def naive_rule(addr):
    if ":" in addr:
        return ["-s", f"{addr}/128", "-d", f"{METADATA_V6}/128", "-p", "tcp", "--dport", "80",
                "-j", "DNAT", "--to-destination", f"[{NODE_V6}]:{PROXY_PORT}"]
    return ["-s", f"{addr}/32", "-d", f"{METADATA_V4}/32", "-p", "tcp", "--dport", "80",
            "-j", "DNAT", "--to-destination", f"{NODE_V4}:{PROXY_PORT}"]


# --------------------------------------------------------------------------------------------
# The alternatives
# --------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, a):
        self.a = a
        self.root_ino = int(a.root_netns_ino)
        if netns_id() == self.root_ino:
            die("bench.py runs in the node namespace that bench.sh creates, not in the root one")
        self.node_path = "/usr/sbin:/usr/bin:/sbin:/bin"
        self.ns = {
            "node": None,  # the current namespace
            "portmap-nft": Netns(a.ns_pmnft, self.root_ino),
            "portmap-legacy": Netns(a.ns_pmlegacy, self.root_ino),
            REF: Netns(a.ns_ref, self.root_ino),
        }
        self.pm_path = {
            "portmap-nft": f"{a.bin_nft}:{self.node_path}",
            "portmap-legacy": f"{a.bin_legacy}:{self.node_path}",
        }
        self.natguard = os.path.abspath(a.natguard)
        self.portmap = a.portmap
        self.ipt = which("iptables-nft", self.node_path)
        self.ip6t = which("ip6tables-nft", self.node_path)
        self.conntrack = which("conntrack", self.node_path)
        self.ct = Ctnl()
        with self.ns[REF]:
            self.ct_ref = Ctnl()
        self.bench_i = 0
        self.state_n = {"natguard": 0, "naive": 0, "portmap-nft": 0, "portmap-legacy": 0}
        self.templates = {}
        self.rows = []  # raw samples
        self.cells = []  # per-cell summaries
        self.bursts = []  # burst cells
        self.ifaces = None  # the many-interface cell

    # ---- node setup
    def setup(self):
        for ns in [None, self.ns["portmap-nft"], self.ns["portmap-legacy"], self.ns[REF]]:
            if ns:
                ns.enter()
            run(["ip", "link", "set", "lo", "up"])
            # the node's uplink: a veth pair (no dummy module on every kernel)
            run(["ip", "link", "add", "name", "ngb0", "type", "veth", "peer", "name", "ngb1"])
            run(["ip", "link", "set", "ngb1", "up"])
            run(["ip", "addr", "add", f"{NODE_V4}/24", "dev", "ngb0"])
            run(["ip", "addr", "add", f"{NODE_V6}/64", "dev", "ngb0", "nodad"])
            run(["ip", "link", "set", "ngb0", "up"])
            run(["ip", "route", "add", "default", "via", "10.250.0.254", "dev", "ngb0"])
            run(["ip", "-6", "route", "add", "default", "via", "fd00:250::fe", "dev", "ngb0"])
            if ns:
                ns.leave()
        # the naive path's chain, jumped to from PREROUTING; nat hooks also turn conntrack on here
        for t in (self.ipt, self.ip6t):
            run([t, "-t", "nat", "-N", "NAIVE-META"])
            run([t, "-t", "nat", "-A", "PREROUTING", "-j", "NAIVE-META"])
        # the reference node: natguard with 10 pods, whatever the main node holds
        with self.ns[REF]:
            for i in range(10):
                pod = Pod(244, i, True)
                spawn([self.natguard], pod.env("ADD", self.node_path), natguard_conf(pod, False))

    # ---- one ADD or DEL of each alternative; returns a Sample
    def natguard_op(self, op, pod, flush=True, log_file=None):
        s, out, _ = spawn([self.natguard], pod.env(op, self.node_path), natguard_conf(pod, flush, log_file))
        if op == "ADD":
            reply = json.loads(out)
            if reply.get("ips") != pod.prev_result()["ips"]:
                die(f"natguard ADD did not pass prevResult through: {out[:500]}")
        return s

    def portmap_op(self, alt, op, pod):
        with self.ns[alt]:
            s, _, _ = spawn([self.portmap], pod.env(op, self.pm_path[alt]), portmap_conf(pod))
        return s

    def naive_op(self, op, pod):
        env = {"PATH": self.node_path}
        samples = []
        flag = "-A" if op == "ADD" else "-D"
        for a in pod.addrs:
            t = self.ip6t if ":" in a else self.ipt
            samples.append(spawn([t, "-t", "nat", flag, "NAIVE-META"] + naive_rule(a), env)[0])
        if op == "ADD":
            for a in pod.addrs:
                # exits 1 when nothing matched; each address has an entry, but do not insist
                samples.append(spawn([self.conntrack, "-D", "-s", a], env, ok_codes=(0, 1))[0])
        return Sample.chain(samples)

    def op(self, alt, op, pod):
        if alt == REF:
            with self.ns[REF]:
                return self.natguard_op(op, pod, True)
        if alt == "natguard":
            return self.natguard_op(op, pod, True)
        if alt == "natguard-noflush":
            return self.natguard_op(op, pod, False)
        if alt.startswith("portmap"):
            return self.portmap_op(alt, op, pod)
        return self.naive_op(op, pod)

    # ---- state: N pods already on the node
    def grow_natguard(self, n):
        have = self.state_n["natguard"]
        if have >= n:
            return
        t0 = time.time()
        procs = []
        env_base = None
        for i in range(have, n):
            pod = Pod(244, i, True)
            env_base = pod.env("ADD", self.node_path)
            p = subprocess.Popen([self.natguard], env=env_base, stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            p.stdin.write(natguard_conf(pod, False))
            p.stdin.close()
            procs.append((i, p))
            while len(procs) >= 6:  # they mostly sleep (see the report): overlap them
                self._reap(procs.pop(0))
        for x in procs:
            self._reap(x)
        self.state_n["natguard"] = n
        log(f"natguard: {n - have} pods added through its own ADD (6 at a time) in {time.time() - t0:.1f} s")

    @staticmethod
    def _reap(x):
        i, p = x
        err = p.stderr.read()
        if p.wait() != 0:
            die(f"natguard prefill ADD {i} failed: {err.decode(errors='replace')[:1000]}")

    def grow_naive(self, n):
        have = self.state_n["naive"]
        if have >= n:
            return
        t0 = time.time()
        for fam, tool in (("4", self.ipt), ("6", self.ip6t)):
            lines = ["*nat"]
            for i in range(have, n):
                pod = Pod(244, i, True)
                a = pod.v4 if fam == "4" else pod.v6
                lines.append("-A NAIVE-META " + " ".join(naive_rule(a)))
            lines.append("COMMIT\n")
            run([tool.replace("tables-nft", "tables-nft-restore"), "--noflush"], stdin="\n".join(lines))
        self.state_n["naive"] = n
        log(f"naive: {n - have} pods' DNAT rules (both families) restored in {time.time() - t0:.1f} s")

    def learn_portmap(self, alt):
        """Two real portmap ADDs (state pods 0 and 1); the iptables-save diff of the second is the
        template of one pod, in both families."""
        saves = {"4": "iptables-save", "6": "ip6tables-save"}
        path = self.pm_path[alt]
        with self.ns[alt]:
            self.portmap_op_noswitch(alt, "ADD", Pod(244, 0, True))
            before = {f: run([which(t, path), "-t", "nat"]).splitlines() for f, t in saves.items()}
            pod = Pod(244, 1, True)
            self.portmap_op_noswitch(alt, "ADD", pod)
            after = {f: run([which(t, path), "-t", "nat"]).splitlines() for f, t in saves.items()}
        tmpl = {}
        for f in saves:
            old = set(before[f])
            new = [l for l in after[f] if l not in old and not l.startswith("#") and l not in ("COMMIT", "*nat")]
            if not any(pod.cid in l for l in new):
                die(f"{alt}: could not learn portmap's rules from iptables-save (IPv{f}):\n" + "\n".join(new))
            tmpl[f] = "\n".join(new)
        self.templates[alt] = (pod, tmpl)
        self.state_n[alt] = 2

    def portmap_op_noswitch(self, alt, op, pod):
        spawn([self.portmap], pod.env(op, self.pm_path[alt]), portmap_conf(pod))

    @staticmethod
    def _subst(text, pod, new):
        chains = sorted(set(re.findall(r"CNI-[A-Z]+-[0-9a-f]{8,}", text)))
        for k, c in enumerate(chains):
            text = text.replace(c, f"@CHAIN{k}@")
        text = text.replace(pod.cid, "@CID@").replace(pod.name, "@NAME@")
        text = re.sub(r"(?<![0-9a-f:])" + re.escape(pod.v6) + r"(?![0-9a-f:])", "@V6@", text)
        text = re.sub(r"(?<![0-9.])" + re.escape(pod.v4) + r"(?![0-9])", "@V4@", text)
        text = re.sub(r"(?<![0-9])" + str(pod.host_port) + r"(?![0-9])", "@PORT@", text)
        for k, c in enumerate(chains):
            prefix = c.rsplit("-", 1)[0] + "-"
            h = hashlib.sha512(f"{c}{new.cid}".encode()).hexdigest()
            text = text.replace(f"@CHAIN{k}@", prefix + h[: len(c) - len(prefix)])
        text = text.replace("@CID@", new.cid).replace("@NAME@", new.name)
        text = text.replace("@V6@", new.v6).replace("@V4@", new.v4).replace("@PORT@", str(new.host_port))
        return text

    def grow_portmap(self, alt, n):
        if alt not in self.templates:
            self.learn_portmap(alt)
        have = self.state_n[alt]
        if have >= n:
            return
        t0 = time.time()
        tpod, tmpl = self.templates[alt]
        path = self.pm_path[alt]
        with self.ns[alt]:
            for f, tool in (("4", "iptables-restore"), ("6", "ip6tables-restore")):
                decls, rules = [], []
                for i in range(have, n):
                    for line in self._subst(tmpl[f], tpod, Pod(244, i, True)).splitlines():
                        (decls if line.startswith(":") else rules).append(line)
                text = "*nat\n" + "\n".join(decls + rules) + "\nCOMMIT\n"
                run([which(tool, path), "--noflush"], stdin=text)
            nrules = len(run([which("iptables", path), "-t", "nat", "-S"]).splitlines())
        self.state_n[alt] = n
        log(f"{alt}: {n - have} pods restored from portmap's own rules in {time.time() - t0:.1f} s "
            f"(IPv4 nat table now {nrules} lines)")

    # ---- unrelated conntrack entries
    def set_background(self, n, with_ref=True):
        """n unrelated entries in the node namespace and as many in the reference node's. The
        hash table is one for all namespaces, so either namespace's walks visit both sets; but a
        namespace without entries of its own skips its walks altogether (the kernel checks the
        namespace's count first), so a reference node without them would compare a DEL that
        walks with one that does not. The cells that do not use the reference node
        (`with_ref=False`) leave it empty, so the machine holds n entries, not 2n."""
        t0 = time.time()
        for ct, ns in ((self.ct, None), (self.ct_ref, self.ns[REF])):
            ct.flush()
            if n and (ns is None or with_ref):
                ct.create(unrelated_entries(n))
            if ns:
                with ns:
                    got = ct_count()
            else:
                got = ct_count()
            want = n if (ns is None or with_ref) else 0
            if got != want:
                die(f"conntrack: {got} entries in {ns.name if ns else 'the node namespace'}, wanted {want}")
        if n:
            log(f"conntrack: {n} unrelated entries created in the node namespace"
                f"{' and in the reference one' if with_ref else ''} in {time.time() - t0:.2f} s")

    def ctnl_for(self, alt):
        return self.ct_ref if alt == REF else self.ct

    # ---- floors
    def kernel_walk(self, reps):
        """Median and p90 (ms) of one filtered conntrack delete that matches nothing, with the
        namespace holding at least one entry (an empty table is skipped without a walk)."""
        marker = [("10.98.0.1", "10.98.0.2", 1, 1)]
        self.ct.create(marker)
        xs = self.ct.walks("10.97.0.1", reps)
        self.ct.delete_tuples(marker)
        # A kernel that refuses filtered deletes has no such floor: reported as not measured.
        return xs or []

    def cli_walk(self, reps):
        env = {"PATH": self.node_path}
        marker = [("10.98.0.1", "10.98.0.2", 1, 1)]
        self.ct.create(marker)
        xs = [spawn([self.conntrack, "-D", "-s", "10.97.0.1"], env, ok_codes=(0, 1))[0].wall_us / 1e3
              for _ in range(reps)]
        self.ct.delete_tuples(marker)
        return xs

    def natguard_walks(self, dual):
        """Runs one untimed ADD and DEL with a logFile and reads how many kernel walks the
        conntrack cleanup did, and by which path."""
        lf = os.path.join(self.a.out, "natguard-probe.log")
        if os.path.exists(lf):
            os.unlink(lf)
        pod = self.next_pod(dual)
        self.ct.create(pod_entries(pod.addrs))
        spawn([self.natguard], pod.env("ADD", self.node_path), natguard_conf(pod, True, lf))
        spawn([self.natguard], pod.env("DEL", self.node_path), natguard_conf(pod, True, lf))
        self.ct.delete_tuples(pod_entries(pod.addrs))
        with open(lf) as f:
            text = f.read()
        os.unlink(lf)
        res = {}
        for verb in ("ADD", "DEL"):
            m = re.search(rf" {verb} .*conntrack: deleted (\d+) entries in (\d+) kernel walks \(([^)]*)\)", text)
            res[verb] = (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None
        return res

    def natguard_minus_walks(self, dual, reps):
        """`reps` ADDs with a logFile, each pod with its conntrack entries: for each ADD, its
        wall time minus the time its log line says its conntrack kernel calls took. Returns
        [(wall ms, kernel ms)].

        The ADDs run back to back and their DELs (untimed) only after the last one. A DEL
        deletes elements, and the release of its socket, in a kernel worker after it exited,
        holds the commit mutex until nf_tables has freed them after an RCU grace period; an ADD
        right after a DEL would wait for that in its commit, 5 to 28 ms in about a third of the
        samples: the kernel's behaviour (docs/kernel-bug-nftables-release-stall.md, measured
        by --profile), not natguard's work, which is what this figure is about. The ADDs of
        this bridge network still replace the bridge's pod count (a delete and an add), so a
        few of them wait the same way: those are the outliers the median leaves out."""
        lf = os.path.join(self.a.out, "natguard-paired.log")
        out, pods = [], []
        for _ in range(reps):
            if os.path.exists(lf):
                os.unlink(lf)
            pod = self.next_pod(dual)
            pods.append(pod)
            self.ct.create(pod_entries(pod.addrs))
            s = self.natguard_op("ADD", pod, True, log_file=lf)
            with open(lf) as f:
                text = f.read()
            m = re.search(r" ADD .*conntrack: deleted \d+ entries in \d+ kernel walks .*; ([0-9.]+) ms in the kernel", text)
            if not m:
                die(f"natguard's ADD log has no conntrack line with its kernel time:\n{text[:2000]}")
            out.append((s.wall_us / 1e3, float(m.group(1))))
        for pod in pods:
            self.natguard_op("DEL", pod, True)
            self.ct.delete_tuples(pod_entries(pod.addrs))
        if os.path.exists(lf):
            os.unlink(lf)
        return out

    def next_pod(self, dual):
        self.bench_i += 1
        return Pod(245, self.bench_i, dual)

    # ---- one cell
    def cell(self, n, ct, dual, runs, warmup=2):
        alts = [x for x in ALTS if not (x.startswith("portmap") and n > PORTMAP_MAX) and not (x == REF and n <= 10)]
        stack = "dual" if dual else "v4"
        walks = self.natguard_walks(dual)
        floor = self.kernel_walk(max(runs, 20))
        load0 = os.getloadavg()[0]
        ct_all0 = ct_machine_wide()
        t0 = time.time()
        data = {x: {"ADD": [], "DEL": []} for x in alts}
        for r in range(-warmup, runs):
            k = r % len(alts)
            for alt in alts[k:] + alts[:k]:
                pod = self.next_pod(dual)
                deletes_ct = alt in DELETES_CT
                if deletes_ct:
                    self.ctnl_for(alt).create(pod_entries(pod.addrs))
                a = self.op(alt, "ADD", pod)
                d = self.op(alt, "DEL", pod)
                if deletes_ct:  # whatever the alternative left of them goes, untimed, by exact tuple
                    self.ctnl_for(alt).delete_tuples(pod_entries(pod.addrs))
                if r < 0:
                    continue
                for o, s in (("ADD", a), ("DEL", d)):
                    data[alt][o].append(s)
                    self.rows.append((n, ct, stack, alt, r, o, round(s.wall_us), round(s.cpu_us), s.rss_kb))
        # ADD minus its own conntrack kernel calls, paired per ADD: natguard ADDs with a log
        # file, each giving its wall time and (in its log line) the ms its conntrack kernel calls
        # took; the log write is in the wall time, so the difference errs high, never low.
        minus = self.natguard_minus_walks(dual, max(5, min(runs, 15)))
        # peak RSS: 3 more untimed ADD+DEL of each alternative, traced to read VmHWM at exit
        HWM_MODE[0] = True
        for _ in range(3):
            for alt in alts:
                pod = self.next_pod(dual)
                deletes_ct = alt in DELETES_CT
                if deletes_ct:
                    self.ctnl_for(alt).create(pod_entries(pod.addrs))
                data[alt].setdefault("RSS", []).extend([self.op(alt, "ADD", pod), self.op(alt, "DEL", pod)])
                if deletes_ct:
                    self.ctnl_for(alt).delete_tuples(pod_entries(pod.addrs))
        HWM_MODE[0] = False
        got = ct_count()
        if abs(got - ct) > 2:
            die(f"conntrack: {got} entries after the cell, expected {ct}: the background was disturbed")
        c = {"n": n, "ct": ct, "stack": stack, "runs": runs, "data": data, "walks": walks, "paired": minus,
             "floor": floor, "load": (load0, os.getloadavg()[0]), "secs": time.time() - t0,
             "ct_all": (ct_all0, ct_machine_wide())}
        self.cells.append(c)
        ng = statistics.median(s.wall_us for s in data["natguard"]["ADD"]) / 1e3
        log(f"cell pods={n} ct={ct} {stack}: {runs} runs in {c['secs']:.1f} s; natguard ADD median {ng:.2f} ms")
        return c



# --------------------------------------------------------------------------------------------
# Bursts (32 ADDs released at once) and many-interface nodes
# --------------------------------------------------------------------------------------------

BURST = 32


def release(b, pods, dual):
    """Starts one natguard ADD per pod, each blocked reading its stdin, then writes every stdin at
    once (the release) and reaps them in the order they exit. Returns the ms from the release to
    each exit, sorted. The processes are started before the release so that what is measured is
    natguard's work and its waits, not 32 exec(2)s."""
    kids = {}
    for pod in pods:
        r, w = os.pipe()
        out = os.memfd_create("burst-out", os.MFD_CLOEXEC)
        pid = os.posix_spawn(b.natguard, [b.natguard], pod.env("ADD", b.node_path),
                             file_actions=[(os.POSIX_SPAWN_DUP2, r, 0), (os.POSIX_SPAWN_DUP2, out, 1),
                                           (os.POSIX_SPAWN_DUP2, out, 2)])
        os.close(r)
        kids[pid] = (pod, w, out)
    time.sleep(0.3 + 0.01 * len(pods))  # every child is blocked in read(0)
    confs = [(w, natguard_conf(pod, True)) for pod, w, _ in kids.values()]
    t0 = time.perf_counter()
    for w, c in confs:
        os.write(w, c)
        os.close(w)
    done, cpu = [], []
    while len(done) < len(kids):
        pid, status, ru = os.wait4(-1, 0)
        t = (time.perf_counter() - t0) * 1e3
        pod, _, out = kids[pid]
        if os.waitstatus_to_exitcode(status) != 0:
            die(f"burst ADD of {pod.name} failed: {_read_fd(out)[:2000]}")
        os.close(out)
        done.append(t)
        cpu.append((ru.ru_utime + ru.ru_stime) * 1e3)
    release.cpu = cpu  # user+sys ms of each process, exec included
    return sorted(done)


def startup_cpu(b, n):
    """CPU ms (user+sys) of n natguard VERSION processes, one after another: exec and the C
    library's start-up, which a burst's processes spend before the release."""
    env = {"PATH": b.node_path, "CNI_COMMAND": "VERSION"}
    ver = json.dumps({"cniVersion": "1.0.0"}).encode()
    return sum(spawn([b.natguard], env, ver)[0].cpu_us for _ in range(n)) / 1e3


def burst_cell(b, ct, dual, runs):
    """`runs` rounds of: one ADD alone, then BURST ADDs released at once (each pod with its 2
    conntrack entries per address), then the DELs, untimed, then BURST VERSION processes for
    their start-up CPU. Returns the cell's summary."""
    stack = "dual" if dual else "v4"
    load0 = os.getloadavg()[0]
    single, last, mid, cpu1, cpus, starts = [], [], [], [], [], []
    for r in range(-1, runs):
        one = [b.next_pod(dual)]
        b.ct.create(pod_entries(one[0].addrs))
        s = release(b, one, dual)[0]
        c1 = release.cpu[0]
        b.ct.delete_tuples(pod_entries(one[0].addrs))
        pods = [b.next_pod(dual) for _ in range(BURST)]
        b.ct.create(pod_entries([a for p in pods for a in p.addrs]))
        ts = release(b, pods, dual)
        cs = sum(release.cpu)
        left = b.ct  # every pod's entries must be gone before its ADD replied
        for pod in one + pods:
            b.natguard_op("DEL", pod)
        left.delete_tuples(pod_entries([a for p in pods for a in p.addrs]))
        st = startup_cpu(b, BURST)
        if r < 0:
            continue
        single.append(s)
        last.append(ts[-1])
        mid.append(statistics.median(ts))
        cpu1.append(c1)
        cpus.append(cs)
        starts.append(st)
    c = {"ct": ct, "stack": stack, "runs": runs, "single": single, "last": last, "mid": mid,
         "cpu1": cpu1, "cpus": cpus, "starts": starts,
         "pods": b.state_n["natguard"],
         "load": (load0, os.getloadavg()[0])}
    log(f"burst ct={ct} {stack}: single {med(single):.1f} ms, all {BURST} replied {med(last):.1f} ms, "
        f"median {med(mid):.1f} ms")
    return c


def ifaces_setup(b, names):
    """A node namespace per interface count: lo, the uplink pair and its addresses as on the
    bench node, then veth pairs (both ends up, an IPv4 /32 on one end, IPv6 link-local on
    both), and a bridge for an odd count, until the namespace has N interfaces."""
    out = []
    for name in names:
        n = int(name.rsplit("-if", 1)[1])
        ns = Netns(name, b.root_ino)
        with ns:
            run(["ip", "link", "set", "lo", "up"])
            run(["ip", "link", "add", "name", "ngb0", "type", "veth", "peer", "name", "ngb1"])
            run(["ip", "link", "set", "ngb1", "up"])
            run(["ip", "addr", "add", f"{NODE_V4}/24", "dev", "ngb0"])
            run(["ip", "addr", "add", f"{NODE_V6}/64", "dev", "ngb0", "nodad"])
            run(["ip", "link", "set", "ngb0", "up"])
            run(["ip", "route", "add", "default", "via", "10.250.0.254", "dev", "ngb0"])
            run(["ip", "-6", "route", "add", "default", "via", "fd00:250::fe", "dev", "ngb0"])
            lines = []
            for k in range((n - 3) // 2):
                lines += [f"link add name hv{k} type veth peer name hp{k}",
                          f"addr add 10.251.{k // 250}.{k % 250 + 1}/32 dev hv{k}",
                          f"link set hv{k} up", f"link set hp{k} up"]
            if (n - 3) % 2:
                lines += ["link add name hbr0 type bridge"]
            run(["ip", "-batch", "-"], stdin="\n".join(lines) + "\n")
            got = len(run(["ip", "-o", "link"]).splitlines())
            if got != n:
                die(f"{name}: {got} interfaces, wanted {n}")
            naddr = len(run(["ip", "-o", "addr"]).splitlines())
        out.append((n, ns, naddr))
    return out


def ifaces_cell(b, nodes, runs):
    """ADD then DEL of a new IPv4 pod (with its conntrack entries) on each node, rotated."""
    data = {n: {"ADD": [], "DEL": [], "ADD cpu": [], "DEL cpu": []} for n, _, _ in nodes}
    load0 = os.getloadavg()[0]
    cts = {}
    for n, ns, _ in nodes:
        with ns:
            cts[n] = Ctnl()
    for r in range(-2, runs):
        k = r % len(nodes)
        for n, ns, _ in nodes[k:] + nodes[:k]:
            pod = b.next_pod(False)
            with ns:
                cts[n].create(pod_entries(pod.addrs))
                a = b.natguard_op("ADD", pod)
                d = b.natguard_op("DEL", pod)
                cts[n].delete_tuples(pod_entries(pod.addrs))
            if r >= 0:
                for o, x in (("ADD", a), ("DEL", d)):
                    data[n][o].append(x.wall_us / 1e3)
                    data[n][o + " cpu"].append(x.cpu_us / 1e3)
    c = {"nodes": [(n, naddr) for n, _, naddr in nodes], "data": data, "runs": runs,
         "load": (load0, os.getloadavg()[0])}
    log("ifaces: " + ", ".join(f"{n}: ADD {med(data[n]['ADD']):.2f} DEL {med(data[n]['DEL']):.2f}" for n in data))
    return c


def report_extra(b):
    """The burst and many-interface sections, with their targets; returns (markdown, targets)."""
    L, T = [], []
    p = L.append
    if b.bursts:
        p("## Bursts")
        p("")
        p(f"{BURST} natguard ADDs on the node ({b.bursts[0]['pods']:,} pods already there), each new pod "
          "with 2 conntrack entries per address, all started and "
          "blocked on their stdin, then released at once; against one ADD released the same way in the "
          "same round. ms from the release to each process's exit (its reply). all replied = the "
          f"last of the {BURST}; median = the median of the {BURST}; max = the worst round's last. "
          "CPU = user+sys of the processes (exec included): of the single ADD, and of all "
          f"{BURST} summed; start-up = the CPU of {BURST} natguard VERSION processes (exec and the C "
          "library's start-up), which the burst's processes spend before the release; CPU floor = "
          f"CPU all minus start-up, over the machine's {os.cpu_count()} CPUs: the soonest all could "
          "reply after the release if nothing waited at all.")
        p("")
        p("| ct entries | stack | rounds | single ADD | all replied | median ADD | max | all/single | median/single | CPU single | CPU all | start-up | CPU floor | floor/single | load1 start/end |")
        p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        oks_all, oks_mid, ms = [], [], []
        for c in b.bursts:
            s, l, m = med(c["single"]), med(c["last"]), med(c["mid"])
            c1, cs, st = med(c["cpu1"]), med(c["cpus"]), med(c["starts"])
            floor = max(cs - st, 0.0) / (os.cpu_count() or 1)
            p(f"| {c['ct']:,} | {c['stack']} | {c['runs']} | {s:.1f} | {l:.1f} | {m:.1f} | {max(c['last']):.1f} | "
              f"{l / s:.1f}× | {m / s:.1f}× | {c1:.1f} | {cs:.1f} | {st:.1f} | {floor:.1f} | {floor / s:.1f}× | "
              f"{c['load'][0]:.2f}/{c['load'][1]:.2f} |")
            big = c["ct"] >= 100000
            oks_all.append(l / s <= (8 if big else 6))
            oks_mid.append(m / s <= (6 if big else 3))
            ms.append(f"{c['ct']:,}/{c['stack']}: {l / s:.1f}× / {m / s:.1f}×")
        p("")
        T.append((f"{BURST} simultaneous ADDs: all replied ≤ 6× one ADD (~0 entries) and ≤ 8× (100,000); "
                  "median ≤ 3× and ≤ 6× (all/single / median/single per ct/stack)", "; ".join(ms),
                  "**met**" if all(oks_all + oks_mid) else "**missed**"))
    if b.ifaces:
        c = b.ifaces
        p("## Many interfaces")
        p("")
        p("natguard ADD and DEL of a new IPv4 pod on nodes with 12, 122 and 512 interfaces (veth "
          f"pairs, up, one IPv4 /32 on one end), alternated in the same cell, {c['runs']} runs, "
          f"medians in ms; load1 {c['load'][0]:.2f}/{c['load'][1]:.2f}. Wall time and CPU time "
          "(user+sys of the process). The work that could grow with the node (asking the kernel "
          "about interfaces and addresses) is CPU work of the process and of the kernel on its "
          "behalf, so CPU time shows it even when other load on the machine makes wall time "
          "noisy; the target is judged on CPU time, wall ratios are shown beside it.")
        p("")
        p("| interfaces | addresses | ADD wall | DEL wall | ADD CPU | DEL CPU | ADD CPU / 12 | DEL CPU / 12 | ADD wall / 12 | DEL wall / 12 |")
        p("|---|---|---|---|---|---|---|---|---|---|")
        base = c["nodes"][0][0]
        m = {n: {k: med(v) for k, v in c["data"][n].items()} for n, _ in c["nodes"]}
        b0 = m[base]
        oks, ms = [], []
        for n, naddr in c["nodes"]:
            x = m[n]
            ra, rd = x["ADD cpu"] / b0["ADD cpu"], x["DEL cpu"] / b0["DEL cpu"]
            p(f"| {n} | {naddr} | {x['ADD']:.2f} | {x['DEL']:.2f} | {x['ADD cpu']:.2f} | {x['DEL cpu']:.2f} | "
              f"{ra:.2f}× | {rd:.2f}× | {x['ADD'] / b0['ADD']:.2f}× | {x['DEL'] / b0['DEL']:.2f}× |")
            if n != base:
                oks += [ra <= 1.1, rd <= 1.1]
                ms.append(f"{n}: ADD {ra:.2f}×, DEL {rd:.2f}× (wall {x['ADD'] / b0['ADD']:.2f}×, {x['DEL'] / b0['DEL']:.2f}×)")
        p("")
        T.append((f"ADD and DEL at 122 and 512 interfaces ≤ 1.1× of {base} (CPU time)", "; ".join(ms),
                  "**met**" if all(oks) else "**missed**"))
    return "\n".join(L), T

# --------------------------------------------------------------------------------------------
# Profile (--profile): where natguard's wall time goes
# --------------------------------------------------------------------------------------------


def nft_commit_then_close(delay_ms, reps):
    """`reps` times: a tiny nf_tables batch (add and delete a scratch table) committed on a
    fresh socket, a pause of delay_ms, then how long close() of that socket takes (ms). On
    kernels whose netlink release notifier flushes nf_tables' deferred destroy work (which runs
    synchronize_rcu), a close soon after a commit waits for the rest of an RCU grace period.
    nfbench, in a namespace of its own."""
    return [float(x) for x in nfbench(["nft-close", str(delay_ms), str(reps)], netns=True).split()]


def commit_after_release(delete, n):
    """`n` commits, each on a fresh netfilter socket that is then released on another thread
    (as the kernel worker releases natguard's handed-over sockets), 2 ms apart, as invocations
    run one after another. Each commit adds one element to a scratch set, or deletes one.
    Returns each commit's ms: how long the commit waited behind the previous socket's release.
    nfbench, in a namespace of its own."""
    how = "delete" if delete else "add"
    return [float(x) for x in nfbench(["nft-release", how, str(n)], netns=True).split()]


def profile(b, runs):
    """strace, perf stat and callgrind of natguard's ADD and DEL, and the close-after-commit
    experiment; returns Markdown."""
    L = ["## Profile of natguard", ""]
    p = L.append
    tools = {t: shutil.which(t, path=b.node_path) for t in ("strace", "perf", "valgrind")}

    def one(prefix, op, dual=True, flush=True):
        """ADD then DEL of a new pod; `prefix` wraps the `op` one. Returns that one's stderr."""
        pod = b.next_pod(dual)
        b.ct.create(pod_entries(pod.addrs))
        conf = natguard_conf(pod, flush)
        errs = {}
        for verb in ("ADD", "DEL"):
            argv = (prefix if verb == op else []) + [b.natguard]
            errs[verb] = spawn(argv, pod.env(verb, b.node_path), conf)[2]
        b.ct.delete_tuples(pod_entries(pod.addrs))
        return errs[op]

    if tools["strace"]:
        for op in ("ADD", "DEL"):
            err = one([tools["strace"], "-f", "-w", "-c", "-o", "/dev/stderr"], op)
            p(f"`strace -f -w -c` of one natguard {op} (dual-stack, 10 pods; wall time per syscall):")
            p("")
            p("```")
            L.extend(line for line in err.splitlines() if line.strip() and "natguard[" not in line)
            p("```")
            p("")
        closes = []
        for _ in range(runs):
            err = one([tools["strace"], "-T", "-e", "trace=close", "-o", "/dev/stderr"], "ADD")
            xs = [float(x) for x in re.findall(r"close\(\d+\)\s+= 0 <([0-9.]+)>", err)]
            closes.append(max(xs) * 1e3 if xs else float("nan"))
        p(f"`strace -T -e trace=close`: the slowest close() per ADD (a netfilter socket's, after the commit), {runs} ADDs: "
          f"median {med(closes):.2f} ms, p90 {q(closes, 0.9):.2f} ms, min {min(closes):.2f} ms.")
        p("")
    else:
        p("strace is not installed: skipped.")
        p("")
    if tools["perf"]:
        err = one([tools["perf"], "stat", "-e", "task-clock,context-switches,cpu-migrations,page-faults", "-o", "/dev/stderr", "--"], "ADD")
        p("`perf stat` of one natguard ADD (hardware counters are not available in every VM):")
        p("")
        p("```")
        L.extend(line for line in err.splitlines() if line.strip() and "natguard[" not in line and not line.startswith("#"))
        p("```")
        p("")
    if tools["valgrind"]:
        p("Instructions executed in user space (callgrind `Ir`; stable on a noisy machine):")
        p("")
        p("| invocation | Ir |")
        p("|---|---|")
        for label, op, dual, flush in (("ADD dual-stack", "ADD", True, True), ("ADD IPv4", "ADD", False, True),
                                       ("ADD dual-stack, flushOnAdd false", "ADD", True, False), ("DEL dual-stack", "DEL", True, True)):
            err = one([tools["valgrind"], "--tool=callgrind", "--callgrind-out-file=/dev/null"], op, dual, flush)
            m = re.search(r"Collected : (\d+)", err)
            p(f"| {label} | {int(m.group(1)):,} |" if m else f"| {label} | ? |")
        venv = {"PATH": b.node_path, "CNI_COMMAND": "VERSION"}
        err = spawn([tools["valgrind"], "--tool=callgrind", "--callgrind-out-file=/dev/null", b.natguard], venv, b'{"cniVersion":"1.0.0"}')[2]
        m = re.search(r"Collected : (\d+)", err)
        p(f"| VERSION (process start floor) | {int(m.group(1)):,} |" if m else "| VERSION | ? |")
        p("")
    xs = {}
    for delay in (0, 2, 5, 10, 20):
        xs[delay] = nft_commit_then_close(delay, max(5, runs // 2))
        time.sleep(0.05)
    p("close() of a netfilter netlink socket after an nf_tables commit, from benches/tools/nfbench in a "
      "network namespace of its own (no natguard process involved), by the pause between the commit's "
      "ACK and the close:")
    p("")
    p("| pause after commit ms | close() median ms | p90 ms |")
    p("|---|---|---|")
    for d, v in xs.items():
        p(f"| {d} | {med(v):.2f} | {q(v, 0.9):.2f} |")
    p("")
    p("A commit right after another netfilter socket's release, from benches/tools/nfbench in a network "
      "namespace of its own (no natguard process involved): "
      "40 commits 2 ms apart, each on a fresh socket released on another thread, as the kernel worker "
      "releases natguard's handed-over sockets. The release waits, holding the commit mutex, for the "
      "destroy work that deleted objects leave pending (an RCU grace period); added elements leave none:")
    p("")
    p("| each commit | commit median ms | p90 ms | max ms | commits over 1 ms |")
    p("|---|---|---|---|---|")
    for label, delete in (("adds one element", False), ("deletes one element", True)):
        v = commit_after_release(delete, 40)
        p(f"| {label} | {med(v):.2f} | {q(v, 0.9):.2f} | {max(v):.2f} | {sum(x > 1 for x in v)} of {len(v)} |")
        time.sleep(0.05)
    p("")
    return "\n".join(L)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def q(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    # nearest-rank percentile
    k = max(0, min(len(xs) - 1, int(-(-p * len(xs) // 1)) - 1))
    return xs[k]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(v, d=1):
    return "–" if v != v else f"{v:.{d}f}"


def stats(samples):
    w = [s.wall_us / 1e3 for s in samples]
    c = [s.cpu_us / 1e3 for s in samples]
    return {"med": med(w), "p90": q(w, 0.9), "cpu": med(c)}


def rss(c, alt):
    """(own VmHWM, tree ru_maxrss, anon at exit, file-backed at exit) in MiB: the largest over
    the traced runs of a cell."""
    xs = c["data"][alt]["RSS"]
    big = max(xs, key=lambda s: s.hwm_kb)
    return (big.hwm_kb / 1024, max(s.rss_kb for s in xs) / 1024, big.anon_kb / 1024, big.file_kb / 1024)


def report(b, meta, elapsed, started):
    L = []
    p = L.append
    p("# natguard benchmark")
    p("")
    p(f"Run {started} UTC, {elapsed:.0f} s. " + meta["machine"])
    p("")
    p("Versions: " + meta["versions"])
    p("")
    p(f"Static binary: `{meta['binary']}`, {meta['size']:,} bytes ({meta['size'] / 2**20:.2f} MiB), {meta['linkage']}.")
    p("")
    p("Each cell: the alternatives take turns within every run (order rotated each run), after "
      "2 untimed warm-up runs. ADD of a new pod, then DEL of the same pod. Wall = spawn to reap; "
      "CPU = user+sys of the process and the children it waited for (wait4). Peak RSS, from 3 "
      "more untimed ADD+DEL per alternative: *own* = the process's VmHWM read at its exit "
      "(ptrace), the largest of the sequence for the naive path; *tree* = ru_maxrss, which for "
      "portmap includes the iptables processes it forks (spawned from a small static reaper "
      f"whose own {RSS_FLOOR[0] / 1024:.1f} MiB is the floor of that column). ms unless said. "
      "Ratio = natguard median / alternative median, same cell.")
    p("")
    p(f"`{REF}` is natguard in a second node namespace that always holds 10 pods, alternated with "
      "the others: its ratio column is natguard at N pods over natguard at 10 pods, measured side "
      "by side. It holds as many unrelated conntrack entries of its own as the node, so both "
      "namespaces' walks are the same walk of the shared hash table.")
    p("")
    p("Pods on the node are dual-stack; the new pod is IPv4 (v4) or dual-stack (dual). Before each "
      "ADD of natguard and of the naive path, the new pod's addresses get 2 conntrack entries each "
      "(one with the pod as original source, one as reply source); the naive path's "
      "`conntrack -D -s` removes the first kind only.")
    p("")
    p(f"portmap runs only up to {PORTMAP_MAX:,} pods on the node: each portmap ADD dumps the whole nat "
      "table four times (`iptables -t nat -S`), which at 10,000 pods (~50,000 rules) takes seconds "
      "per sample. Its state is restored from its own rules (iptables-save diff around one real ADD).")
    p("")
    p("## Floors")
    p("")
    p("| what | median | p90 |")
    p("|---|---|---|")
    for k, xs in meta["floors"]:
        p(f"| {k} | {fmt(med(xs), 2)} | {fmt(q(xs, 0.9), 2)} |")
    p("")
    if b.cells:
        p("## Results")
        p("")
        p("| pods | ct entries | stack | alternative | ADD wall med | ADD p90 | ADD CPU | DEL wall med | DEL p90 | DEL CPU | peak RSS own / tree MiB (anon + file) | ratio ADD | ratio DEL |")
        p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in b.cells:
            ng = {o: stats(c["data"]["natguard"][o]) for o in ("ADD", "DEL")}
            for alt in ALTS:
                if alt not in c["data"]:
                    if alt.startswith("portmap"):
                        p(f"| {c['n']:,} | {c['ct']:,} | {c['stack']} | {alt} | not run (> {PORTMAP_MAX:,} pods) ||||||||")
                    continue
                st = {o: stats(c["data"][alt][o]) for o in ("ADD", "DEL")}
                ra = "" if alt == "natguard" else fmt(ng["ADD"]["med"] / st["ADD"]["med"], 3)
                rd = "" if alt == "natguard" else fmt(ng["DEL"]["med"] / st["DEL"]["med"], 3)
                name = f"**{alt}**" if alt == "natguard" else alt
                p(f"| {c['n']:,} | {c['ct']:,} | {c['stack']} | {name} | {fmt(st['ADD']['med'], 2)} | {fmt(st['ADD']['p90'], 2)} | "
                  f"{fmt(st['ADD']['cpu'], 2)} | {fmt(st['DEL']['med'], 2)} | {fmt(st['DEL']['p90'], 2)} | {fmt(st['DEL']['cpu'], 2)} | "
                  f"{fmt(rss(c, alt)[0], 2)} / {fmt(rss(c, alt)[1], 2)} ({fmt(rss(c, alt)[2], 2)} + {fmt(rss(c, alt)[3], 2)}) | {ra} | {rd} |")
        p("")
        p("Per cell: natguard's conntrack work (from its log, one untimed probe ADD/DEL), the kernel's "
          "filtered walk at that conntrack size, and natguard's ADD minus its conntrack kernel calls, paired: "
          "extra ADDs run back to back with a logFile (their DELs after the last), and each one's wall time less "
          "the time its own log line gives for its conntrack kernel calls (median, and the ADDs' median wall "
          "and kernel time); the log write stays in. The column \"ADD − walks × floor\" is the older estimate (the timed ADDs' median minus "
          "the walk count times the kernel walk floor), which mixes two measurements. The conntrack hash "
          "table is shared by all namespaces: entries of other namespaces on the machine (column "
          "\"machine-wide\", from the nf_conntrack slab) lengthen every walk, and a busy machine "
          "(load1 above the core count) lengthens RCU grace periods, which every nf_tables commit "
          "followed by closing its netlink socket waits for (see the profile section of `--profile`).")
        p("")
        p("| pods | ct entries | stack | runs | secs | load1 start/end | ct entries machine-wide start/end | ADD: deleted / walks / path | DEL: walks | kernel walk med (p90) | **ADD − its kernel calls (paired)** | paired ADD / kernel | ADD − walks × floor | noflush ADD |")
        p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in b.cells:
            w = c["walks"]
            add_w = w["ADD"][1] if w["ADD"] else 0
            fl = med(c["floor"])
            ng = med([s.wall_us / 1e3 for s in c["data"]["natguard"]["ADD"]])
            nf = med([s.wall_us / 1e3 for s in c["data"]["natguard-noflush"]["ADD"]])
            wa = f"{w['ADD'][0]} / {w['ADD'][1]} / {w['ADD'][2]}" if w["ADD"] else "no conntrack log line"
            wd = str(w["DEL"][1]) if w["DEL"] else "–"
            est = ng - add_w * fl
            pr = c["paired"]
            c["minus"] = med([w - k for w, k in pr])
            p(f"| {c['n']:,} | {c['ct']:,} | {c['stack']} | {c['runs']} | {c['secs']:.0f} | {c['load'][0]:.2f}/{c['load'][1]:.2f} | "
              f"{c['ct_all'][0]:,}/{c['ct_all'][1]:,} | {wa} | {wd} | {fmt(fl, 2)} ({fmt(q(c['floor'], 0.9), 2)}) | "
              f"**{fmt(c['minus'], 2)}** ({len(pr)}) | {fmt(med([w for w, _ in pr]), 2)} / {fmt(med([k for _, k in pr]), 2)} | "
              f"{fmt(est, 2)} | {fmt(nf, 2)} |")
        p("")
    extra, extra_targets = report_extra(b)
    if extra:
        p(extra)
    p("## Targets")
    p("")
    p("| target | measured | verdict |")
    p("|---|---|---|")
    for t, m, v in targets(b, meta) + extra_targets:
        p(f"| {t} | {m} | {v} |")
    p("")
    return "\n".join(L)


def targets(b, meta):
    out = []
    if not b.cells:
        return out

    def cellmed(c, alt, o="ADD"):
        return med([s.wall_us / 1e3 for s in c["data"][alt][o]]) if alt in c["data"] else float("nan")

    def verdict(ok_list):
        if not ok_list:
            return "not measured in this run"
        return "**met**" if all(ok_list) else "**missed**"

    # 1. ADD at 1,000 pods <= 1/10 portmap
    ms, oks = [], []
    for c in b.cells:
        if c["n"] != 1000:
            continue
        for alt in ("portmap-nft", "portmap-legacy"):
            r = cellmed(c, "natguard") / cellmed(c, alt)
            ms.append(f"{c['ct']:,}/{c['stack']}/{alt.split('-')[1]}: {r:.3f}")
            oks.append(r <= 0.1)
    out.append(("ADD at 1,000 pods ≤ 1/10 of portmap's wall (ratio per ct/stack/backend)", "; ".join(ms) or "–", verdict(oks)))
    # 2. flat scaling: natguard at N against natguard@10 alternated in the same cell (drift of the
    # machine cancels); the ratio across cells run minutes apart is shown for information
    for o in ("ADD", "DEL"):
        ms, oks, cross = [], [], []
        for cb in b.cells:
            if cb["n"] != 10000 or REF not in cb["data"]:
                continue
            r = cellmed(cb, "natguard", o) / cellmed(cb, REF, o)
            ms.append(f"{cb['ct']:,}/{cb['stack']}: {r:.2f}× ({cellmed(cb, REF, o):.2f}→{cellmed(cb, 'natguard', o):.2f})")
            oks.append(r <= 1.2)
            for c10 in b.cells:
                if c10["n"] == 10 and c10["ct"] == cb["ct"] and c10["stack"] == cb["stack"]:
                    cross.append(f"{cb['ct']:,}/{cb['stack']}: {cellmed(cb, 'natguard', o) / cellmed(c10, 'natguard', o):.2f}×")
        m = "; ".join(ms) or "–"
        if cross:
            m += " (10,000-pod cell / 10-pod cell, run minutes apart: " + "; ".join(cross) + ")"
        out.append((f"{o} at 10,000 pods ≤ 1.2× {o} at 10 (natguard vs {REF}, alternated in the same cell, per ct/stack)", m, verdict(oks)))
    # 3. 100k conntrack entries vs naive
    ms, oks = [], []
    for c in b.cells:
        if c["ct"] < 100000:
            continue
        r = cellmed(c, "natguard") / cellmed(c, "naive")
        ms.append(f"{c['n']:,}/{c['stack']}: {r:.3f}")
        oks.append(r <= 0.25)
    out.append(("ADD with 100,000 conntrack entries ≤ 1/4 of the naive CLI path (ratio per pods/stack)", "; ".join(ms) or "–", verdict(oks)))
    # 4. ADD minus kernel walks
    ms = [f"{c['n']:,}/{c['ct']:,}/{c['stack']}: {c['minus']:.2f}" for c in b.cells]
    oks = [c["minus"] < 2.0 for c in b.cells]
    out.append(("natguard ADD minus its own conntrack kernel calls < 2 ms, paired per ADD (pods/ct/stack)", "; ".join(ms), verdict(oks)))
    # 5. RSS
    ms, oks = [], []
    for n in sorted({c["n"] for c in b.cells}):
        cs = [c for c in b.cells if c["n"] == n]
        pms = [rss(c, alt) for c in cs for alt in ("portmap-nft", "portmap-legacy") if alt in c["data"]]
        if not pms:
            continue
        ngx = max((rss(c, "natguard") for c in cs), key=lambda x: x[0])
        pmx = min(pms, key=lambda x: x[0])
        r = ngx[0] / pmx[0]
        ms.append(f"{n:,} pods: natguard {ngx[0]:.2f} MiB ({ngx[2]:.2f} anon + {ngx[3]:.2f} file) vs portmap "
                  f"{pmx[0]:.2f} MiB ({pmx[2]:.2f} + {pmx[3]:.2f}): {r:.3f} (anon alone {ngx[2] / pmx[2]:.3f})")
        oks.append(r <= 0.25)
    out.append(("peak RSS ≤ 1/4 of portmap's (natguard's largest VmHWM vs portmap's smallest, per pods on the node)",
                "; ".join(ms) or "–", verdict(oks)))
    out.append(("static binary < 5 MB", f"{meta['size']:,} bytes, {meta['linkage']}", verdict([meta["size"] < 5_000_000 and meta["static"]])))
    return out


def elf_is_static(path):
    """True for a 64-bit ELF that names no dynamic loader."""
    with open(path, "rb") as f:
        h = f.read(64)
        if h[:4] != b"\x7fELF" or h[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", h, 32)
        phentsize, phnum = struct.unpack_from("<HH", h, 54)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
    types = {struct.unpack_from("<I", ph, i * phentsize)[0] for i in range(phnum)}
    return 3 not in types  # PT_INTERP: no dynamic loader (static-pie keeps PT_DYNAMIC for self-relocation)


def first_line(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except (OSError, IndexError):
        return "?"


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 2**20
    try:
        with open("/etc/os-release") as f:
            osr = dict(l.rstrip().split("=", 1) for l in f if "=" in l).get("PRETTY_NAME", "?").strip('"')
    except OSError:
        osr = "?"
    with open("/proc/sys/net/netfilter/nf_conntrack_buckets") as f:
        buckets = int(f.read())
    hz = kernel_config("CONFIG_HZ")
    return (f"Machine: {osr}, kernel {platform.release()}, {os.cpu_count()} CPU ({cpu}), {mem:.0f} GiB, "
            f"nf_conntrack_buckets {buckets:,}, CONFIG_HZ {hz}, load1 at start {os.getloadavg()[0]:.2f}.")


def kernel_config(key):
    """A kernel build option from /proc/config.gz or /boot/config-<release>, or "?"."""
    import gzip
    for path, opener in (("/proc/config.gz", gzip.open), (f"/boot/config-{platform.release()}", open)):
        try:
            with opener(path, "rt") as f:
                for line in f:
                    if line.startswith(key + "="):
                        return line.split("=", 1)[1].strip()
        except OSError:
            continue
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--natguard", required=True)
    ap.add_argument("--portmap", default="/usr/lib/cni/portmap")
    ap.add_argument("--ns-pmnft", required=True)
    ap.add_argument("--ns-pmlegacy", required=True)
    ap.add_argument("--ns-ref", required=True)
    ap.add_argument("--bin-nft", required=True)
    ap.add_argument("--bin-legacy", required=True)
    ap.add_argument("--root-netns-ino", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pods", default="10,1000,10000")
    ap.add_argument("--ct", default="0,100000")
    ap.add_argument("--stacks", default="v4,dual")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--timeit", required=True)
    ap.add_argument("--nfbench", required=True)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ns-ifaces", default="")
    ap.add_argument("--only", default="per-pod,burst,ifaces")
    ap.add_argument("--burst-runs", type=int, default=5)
    ap.add_argument("--burst-ct", default="0,100000")
    ap.add_argument("--burst-stacks", default="v4,dual")
    a = ap.parse_args()
    only = set(a.only.split(","))
    global TIMEIT, NFBENCH, ROOT_INO
    TIMEIT = os.path.abspath(a.timeit)
    NFBENCH = os.path.abspath(a.nfbench)
    ROOT_INO = int(a.root_netns_ino)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    t_start = time.time()
    pods = [int(x) for x in a.pods.split(",")]
    cts = [int(x) for x in a.ct.split(",")]
    stacks = [x == "dual" for x in a.stacks.split(",")]
    if sorted(pods) != pods:
        die("--pods must be ascending: state only grows")

    b = Bench(a)
    b.setup()
    size = os.path.getsize(b.natguard)
    static = elf_is_static(b.natguard)
    meta = {
        "machine": machine(),
        "versions": "; ".join([
            f"natguard {first_line([b.natguard, 'version'])} (commit {a.commit})",
            f"portmap: {first_line(['dpkg-query', '-W', '-f', '${Version}', 'containernetworking-plugins'])} (Debian containernetworking-plugins)",
            first_line([b.ipt, "--version"]),
            first_line(["/usr/sbin/iptables-legacy", "--version"]),
            first_line([b.conntrack, "--version"]),
        ]),
        "binary": os.path.relpath(b.natguard, os.getcwd()) if b.natguard.startswith(os.getcwd()) else b.natguard,
        "size": size,
        "static": static,
        "linkage": "statically linked (no ELF interpreter)" if static else "DYNAMICALLY linked",
        "floors": [],
    }
    reps = max(a.runs, 20)
    env = {"PATH": b.node_path}
    ver = json.dumps({"cniVersion": "1.0.0"}).encode()
    venv = dict(env, CNI_COMMAND="VERSION", CNI_CONTAINERID="x", CNI_NETNS="/x", CNI_IFNAME="eth0", CNI_PATH=CNI_PATH)
    meta["floors"].append(("process start: natguard VERSION (wall)", [spawn([b.natguard], venv, ver)[0].wall_us / 1e3 for _ in range(reps)]))
    meta["floors"].append(("process start: portmap VERSION (wall)", [spawn([b.portmap], venv, ver)[0].wall_us / 1e3 for _ in range(reps)]))

    floors_done = set()
    if "per-pod" not in only:
        pods = []
    for n in pods:
        b.grow_natguard(n)
        b.grow_naive(n)
        for alt in ("portmap-nft", "portmap-legacy"):
            if n <= PORTMAP_MAX:
                b.grow_portmap(alt, n)
        for ct in cts:
            b.set_background(ct)
            tag = f"{ct:,} entries"
            if ct not in floors_done:
                floors_done.add(ct)
                meta["floors"].append((f"kernel: one filtered ctnetlink delete, {tag}", b.kernel_walk(reps)))
                meta["floors"].append((f"CLI: `conntrack -D -s <unused ip>` (process + dump), {tag}", b.cli_walk(reps)))
            for dual in stacks:
                b.cell(n, ct, dual, a.runs)
    if "burst" in only:
        b.grow_natguard(max(10, b.state_n["natguard"]))
        for ct in [int(x) for x in a.burst_ct.split(",")]:
            b.set_background(ct, with_ref=False)
            for dual in [x == "dual" for x in a.burst_stacks.split(",")]:
                b.bursts.append(burst_cell(b, ct, dual, a.burst_runs))
    b.set_background(0)
    if "ifaces" in only and a.ns_ifaces:
        b.ifaces = ifaces_cell(b, ifaces_setup(b, a.ns_ifaces.split(",")), a.runs)
    prof = profile(b, a.runs) if a.profile else ""

    elapsed = time.time() - t_start
    md = report(b, meta, elapsed, started) + ("\n" + prof if prof else "")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench-results.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(a.out, "bench-samples.tsv"), "w") as f:
        f.write("pods\tct\tstack\talternative\trun\top\twall_us\tcpu_us\tmaxrss_kb\n")
        for r in b.rows:
            f.write("\t".join(str(x) for x in r) + "\n")
    print(md)
    log(f"done in {elapsed:.0f} s; report in {os.path.join(a.out, 'bench-results.md')}")


if __name__ == "__main__":
    main()
