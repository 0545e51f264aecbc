#!/usr/bin/env bash
# scripts/bench.sh: natguard's per-pod cost next to Debian's portmap (iptables-nft and
# iptables-legacy) and the naive `iptables -t nat -A` + `conntrack -D -s` path, bursts of ADDs,
# nodes with many interfaces, and what forwarded packets pay, in one run (docs/benchmarks.md).
#
#   scripts/bench.sh [--quick] [--profile] [--out DIR] [--runs N] [--pods 10,1000,10000]
#                    [--ct 0,100000] [--stacks v4,dual] [--bin PATH]
#                    [--only per-pod,burst,ifaces,datapath,proxy] [--dp-runs N] [--dp-secs S]
#                    [--dp-nets 1,3] [--dp-pods 2,1000]
#                    [--burst-runs N] [--burst-ct 0,100000] [--burst-stacks v4,dual]
#                    [--px-runs N] [--px-secs S] [--px-idle N]
#
# Root only. Installs what it needs (iptables, conntrack, containernetworking-plugins, python3,
# procps; nginx and wrk for the proxy cell), builds the release binary unless --bin is given,
# creates throwaway network namespaces
#   ng-bench-<pid>-node    natguard, the naive CLI path, the unrelated conntrack entries
#   ng-bench-<pid>-pmnft   portmap with iptables-nft    (PATH points `iptables` at it)
#   ng-bench-<pid>-pmleg   portmap with iptables-legacy
#   ng-bench-<pid>-ref     natguard with 10 pods: the flat-scaling reference
#   ng-bench-<pid>-if<N>   a node with N interfaces (12, 122, 512): the many-interface cell
#   ng-bench-<pid>-dp*     the datapath cell's nodes, pods and remote hosts (benches/datapath.py)
#   ng-bench-<pid>-px*     the proxy cell's node, pods and upstream (benches/proxy.py)
# and deletes them on exit. Everything runs in a private mount namespace with a tmpfs on /run,
# so natguard's lock and runtime files (/run/natguard) and the namespaces' mount points are the
# run's own and never the machine's. The root namespace's firewall and conntrack table are
# never touched.
# The measuring itself is benches/bench.py (see its header for the method).
#
# Output: a Markdown table on stdout and in DIR/bench-results.md (default DIR: /tmp), raw samples
# in DIR/bench-samples.tsv, the datapath cell's every round in DIR/bench-datapath-rounds.tsv. A full run takes 20 to 30 minutes on 2 cores; --quick (one per-pod
# cell: 10 pods, 1,000 conntrack entries, dual-stack, 5 runs; one IPv4 burst round at ~0
# entries; the interface cell; one datapath round of 0.3 s per measurement, 1 network, 2 pods;
# one proxy round of 1 s per measurement, 1,000 idle connections) about a minute. --profile adds a
# section on where natguard's wall time goes (strace, perf stat, callgrind instruction counts,
# and the cost of closing a netfilter socket right after an nf_tables commit); it installs
# strace and valgrind if they are missing. Wall times depend on how busy the machine is
# (check `uptime` first); CPU times and the ratios of the same run much less.
# The cells (--only picks some): per-pod (the table above), burst (32 ADDs released at once
# against one), ifaces (ADD and DEL on nodes with 12, 122 and 512 interfaces), datapath
# (packet rate and request/response latency through the node: benches/datapath.py) and proxy
# (natguard's metadata proxy against nginx with the same allow-list and against no proxy:
# requests/s, p50/p99 latency with wrk, RSS with 10,000 idle connections: benches/proxy.py).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=/tmp
RUNS=20
PODS=10,1000,10000
CT=0,100000
STACKS=v4,dual
BIN=""
PROFILE=""
ONLY=per-pod,burst,ifaces,datapath,proxy
DP_RUNS=7 DP_SECS=0.7 DP_NETS=1,3 DP_PODS=2,1000 BURST_RUNS=5 BURST_CT=0,100000 BURST_STACKS=v4,dual
PX_RUNS=5 PX_SECS=3 PX_IDLE=10000
ARGS=("$@")

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) RUNS=5 PODS=10 CT=1000 STACKS=dual DP_RUNS=1 DP_SECS=0.3 DP_NETS=1 DP_PODS=2 BURST_RUNS=1 BURST_CT=0 BURST_STACKS=v4 PX_RUNS=1 PX_SECS=1 PX_IDLE=1000 ;;
    --only) ONLY=$2; shift ;;
    --dp-runs) DP_RUNS=$2; shift ;;
    --dp-secs) DP_SECS=$2; shift ;;
    --dp-nets) DP_NETS=$2; shift ;;
    --dp-pods) DP_PODS=$2; shift ;;
    --burst-runs) BURST_RUNS=$2; shift ;;
    --burst-ct) BURST_CT=$2; shift ;;
    --burst-stacks) BURST_STACKS=$2; shift ;;
    --px-runs) PX_RUNS=$2; shift ;;
    --px-secs) PX_SECS=$2; shift ;;
    --px-idle) PX_IDLE=$2; shift ;;
    --profile) PROFILE=--profile ;;
    --out) OUT=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --pods) PODS=$2; shift ;;
    --ct) CT=$2; shift ;;
    --stacks) STACKS=$2; shift ;;
    --bin) BIN=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# shellcheck source=scripts/lib.sh
. "$REPO/scripts/lib.sh"
lib_begin bench

# --- what it needs
need=()
command -v iptables-nft >/dev/null || need+=(iptables)
command -v iptables-legacy >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
[ -x /usr/lib/cni/portmap ] || need+=(containernetworking-plugins)
[ -x /usr/bin/python3 ] || need+=(python3)
command -v ip >/dev/null || need+=(iproute2)
command -v sysctl >/dev/null || need+=(procps)
case ",$ONLY," in
  *,proxy,*)
    command -v nginx >/dev/null || need+=(nginx)
    command -v wrk >/dev/null || need+=(wrk)
    ;;
esac
if [ -n "$PROFILE" ]; then
  command -v strace >/dev/null || need+=(strace)
  command -v valgrind >/dev/null || need+=(valgrind)
fi
[ ${#need[@]} -eq 0 ] || ensure_packages "${need[@]}" >/dev/null
modprobe -a nf_conntrack nf_conntrack_netlink nf_tables ip_tables ip6_tables iptable_nat ip6table_nat 2>/dev/null || true

BUILT=${NG_BENCH_BUILT:-}
if in_private_mounts; then
  BIN=$NG_BENCH_BIN # built (or given) before entering the private mount namespace
elif [ -z "$BIN" ]; then
  BUILT=1
  BIN=$REPO/target/x86_64-unknown-linux-gnu/release/natguard
  log "building the release binary"
  (cd "$REPO" && cargo build --release --quiet)
fi
[ -x "$BIN" ] || fail "no natguard binary at $BIN"

# --- a private mount namespace with /run of its own (see the header), entered once
export NG_BENCH_BIN=$BIN NG_BENCH_BUILT=$BUILT
private_mounts /run "${ARGS[@]}"

# --- throwaway namespaces and PATH directories that pick the iptables backend
TAG=ng-bench-$$
NODE=$TAG-node PMNFT=$TAG-pmnft PMLEG=$TAG-pmleg REFNS=$TAG-ref
work_dir ng-bench
# the datapath cell's namespaces are benches/datapath.py's; whatever of them is left goes too
defer "for ns in \$(ip netns list | awk -v t='$TAG-' 'index(\$1, t) == 1 {print \$1}'); do ip netns del \$ns; done"
# the benchmark's tools (benches/tools/build.sh), compiled here or, when NG_BENCH_TOOLS names a
# directory holding them, taken from there (scripts/kernels.sh --bench builds them on the host:
# its VMs have no compiler on their PATH).
if [ -n "${NG_BENCH_TOOLS:-}" ]; then
  cp "$NG_BENCH_TOOLS/timeit" "$NG_BENCH_TOOLS/netload" "$NG_BENCH_TOOLS/nfbench" "$W/"
else
  "$REPO/benches/tools/build.sh" "$W"
fi
for b in nft legacy; do
  mkdir -p "$W/bin-$b"
  for t in iptables ip6tables; do
    for s in "" -save -restore; do ln -s "/usr/sbin/$t-$b$s" "$W/bin-$b/$t$s"; done
  done
done
ROOT_INO=$(stat -L -c %i /proc/self/ns/net) # the namespace we were started in: never measured in
for ns in "$NODE" "$PMNFT" "$PMLEG" "$REFNS" "$TAG-if12" "$TAG-if122" "$TAG-if512"; do mk_ns "$ns"; done
mkdir -p "$OUT"

if [ -n "$BUILT" ]; then
  COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "?")
  if [ -n "$(git -C "$REPO" status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ]; then
    COMMIT="$COMMIT+dirty"
  fi
else
  COMMIT="unknown: prebuilt binary given with --bin"
fi
log "pods=$PODS ct=$CT stacks=$STACKS runs=$RUNS out=$OUT (load: $(cut -d' ' -f1-3 /proc/loadavg))"
# The driver runs inside the node namespace; it enters the portmap namespaces by setns(2).
ip netns exec "$NODE" /usr/bin/python3 "$REPO/benches/bench.py" \
  --natguard "$BIN" --ns-pmnft "$PMNFT" --ns-pmlegacy "$PMLEG" --ns-ref "$REFNS" \
  --ns-ifaces "$TAG-if12,$TAG-if122,$TAG-if512" --only "$ONLY" \
  --burst-runs "$BURST_RUNS" --burst-ct "$BURST_CT" --burst-stacks "$BURST_STACKS" \
  --bin-nft "$W/bin-nft" --bin-legacy "$W/bin-legacy" --root-netns-ino "$ROOT_INO" \
  --out "$OUT" --pods "$PODS" --ct "$CT" --stacks "$STACKS" --runs "$RUNS" --commit "$COMMIT" \
  --timeit "$W/timeit" --nfbench "$W/nfbench" $PROFILE
case ",$ONLY," in
  *,datapath,*)
    log "datapath: networks $DP_NETS, pods $DP_PODS, $DP_RUNS rounds of $DP_SECS s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    /usr/bin/python3 "$REPO/benches/datapath.py" --natguard "$BIN" --netload "$W/netload" \
      --tag "$TAG-dp" --work "$W" --root-netns-ino "$ROOT_INO" --out "$OUT" \
      --nets "$DP_NETS" --pods "$DP_PODS" --runs "$DP_RUNS" --secs "$DP_SECS"
    cat "$OUT/bench-datapath.md" >>"$OUT/bench-results.md"
    ;;
esac
case ",$ONLY," in
  *,proxy,*)
    log "proxy: $PX_RUNS rounds of $PX_SECS s, $PX_IDLE idle connections (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    /usr/bin/python3 "$REPO/benches/proxy.py" --natguard "$BIN" --tag "$TAG-px" --work "$W" \
      --root-netns-ino "$ROOT_INO" --out "$OUT" --runs "$PX_RUNS" --secs "$PX_SECS" --idle "$PX_IDLE"
    cat "$OUT/bench-proxy.md" >>"$OUT/bench-results.md"
    ;;
esac
