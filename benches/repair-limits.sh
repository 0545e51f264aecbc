#!/usr/bin/env bash
# benches/repair-limits.sh: how long self-repair takes on a node with many pods when the watcher
# runs under the CPU resources of natguard's DaemonSet (deploy/base/daemonset.yaml), and what a
# repair costs in CPU (docs/self-repair.md, "Under the DaemonSet's CPU resources").
#
#   benches/repair-limits.sh [--pods N] [--flushes N] [--cpu LIMIT/REQUEST,...]
#
# --cpu takes limit/request pairs in Kubernetes' units, `none` for no limit (for example
# `100m/5m,none/5m,none/100m`), measured one after the other on the same node; without it, the
# DaemonSet's own resources. Root only. It runs tests/repair_limits.rs with the static release
# binary: a world of network namespaces (tests/common), the watcher in a cpu cgroup made for
# the run and removed after, `nft flush ruleset` N times, and prints, per pair, the median and
# worst repair time (the watcher's clock and the pod's) and the watcher's CPU per repair. The
# root namespace's firewall, routes and cgroups are never touched. Wall times depend on how
# busy the machine is (check `uptime`); the CPU per repair does much less.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PODS=100 FLUSHES=15 CPU=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) PODS=$2; shift ;;
    --flushes) FLUSHES=$2; shift ;;
    --cpu) CPU=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "root only" >&2; exit 1; }
cd "$REPO"
cargo build --release
NATGUARD_BIN=$REPO/target/x86_64-unknown-linux-gnu/release/natguard \
NATGUARD_REPAIR_PODS=$PODS NATGUARD_REPAIR_FLUSHES=$FLUSHES NATGUARD_REPAIR_CPU=$CPU \
  cargo test --test repair_limits -- --nocapture
