# shellcheck shell=bash
# scripts/lib.sh: the one shell library of natguard's scripts (sourced, not run): every
# end-to-end layer (scripts/e2e/*.sh), scripts/demo.sh and scripts/bench.sh build their worlds
# and drive CNI with these functions, so each piece exists once.
#
#   basics          log, fail, defer (cleanup at exit, in reverse order), a work dir
#   prerequisites   need (a missing one fails, never skips); ensure_packages and ensure_cargo
#                   come from scripts/packages.sh, which test.sh and kernels.sh source alone
#   private mounts  private_mounts: the script again in a mount namespace of its own, with a
#                   tmpfs on each directory that must not be the machine's (/run for the demo
#                   and the benchmark; the CNI directories and /run/natguard for e2e layers)
#   namespaces      mk_ns (deleted at exit), in_ns, veth
#   servers         serve (a process in a namespace, stopped at exit), wait_port,
#                   keepalive_server (tests/common/http_keepalive.py: the metadata server and
#                   the node-local proxy)
#   the CNI driver  cni_add / cni_del: a conflist's plugins run as a runtime (libcni) runs
#                   them, CNI_* environment, prevResult threaded through, the result cached
#   e2e             the e2e world (world_up), probes, natguard's kernel state, files on the
#                   node, containerd, runtimes' clients
#
# The e2e world builds the same small world out of network namespaces and never touches the
# root netns's firewall, routes or conntrack:
#
#   ng-<t>-node    the node: runs the container runtime (nsenter --net), the CNI plugins
#                  (bridge cni0 + host-local [+ portmap] + natguard) and the node-local
#                  metadata proxy (HTTP on :8181 answering "proxy").
#                  up0 172.31.250.1/24 -> remote (default route), cl0 172.31.251.1/30 -> cloud
#   ng-<t>-remote  the outside world: 10.200.0.2 (inside nonMasqueradeCIDRs' 10.0.0.0/8) and
#                  11.0.0.2 (outside the list), HTTP :80 /cgi-bin/src answers the source
#                  address it sees.
#   ng-<t>-cloud   169.254.169.254, HTTP :80 answering "cloud" (the real metadata API).
#
# A pod's request to 169.254.169.254 must reach the proxy (natguard's DNAT), an exempt
# namespace's pod must reach the cloud, 10.200.0.2 must see the pod's address and 11.0.0.2
# the node's (masquerade). Each e2e layer runs in a mount namespace of its own whose
# /etc/cni, /opt/cni, /var/lib/cni and /run/natguard are empty tmpfs: runtimes find their
# stock paths, and the machine's own CNI state is never read or changed.
#
# Environment:
#   NATGUARD_BIN  plugin binary (default: target/x86_64-unknown-linux-gnu/release/natguard,
#                 brought up to date with `cargo build --release`)
#   NG_E2E_KEEP=1 on failure, keep everything for inspection until $W/.keep is removed
set -u -o pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E2E_DIR=$SCRIPTS_DIR/e2e
REPO=$(cd "$SCRIPTS_DIR/.." && pwd)
# shellcheck source=scripts/packages.sh
. "$SCRIPTS_DIR/packages.sh"
NODE_IP=172.31.250.1
REMOTE_GW=172.31.250.2
CLOUD_LINK_NODE=172.31.251.1
CLOUD_LINK_CLOUD=172.31.251.2
METADATA_IP=169.254.169.254
REMOTE_IN=10.200.0.2
REMOTE_OUT=11.0.0.2
PROXY_PORT=8181
EXEMPT_NS=ng-e2e-exempt
IMAGE_REF=docker.io/library/ng-e2e-busybox:1
PAUSE_REF=docker.io/library/ng-e2e-pause:1

LOG_TAG=""    # what log lines start with: "e2e <t>", "demo", "bench"
T=""          # e2e test name, set by e2e_init
NODE="" CLOUD="" REMOTE=""
W=""          # work dir of this run
CLEANUP=()    # commands run in reverse order on exit
SERVED=()     # pids of serve's processes (process group leaders)
T0=0

# --- basics ---------------------------------------------------------------------------------

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}
# defer CMD: run CMD (a string, eval'ed) at exit, after everything deferred later.
defer() { CLEANUP+=("$*"); }

_run_cleanup() {
  local rc=$? i
  trap - EXIT
  trap '' INT TERM # a second Ctrl-C must not cut the cleanup short
  if [ "$rc" -ne 0 ] && [ "${NG_E2E_KEEP:-0}" = 1 ] && [ -n "$W" ]; then
    touch "$W/.keep"
    log "NG_E2E_KEEP=1: everything is left in place for inspection; rm $W/.keep to clean up"
    while [ -e "$W/.keep" ]; do sleep 1; done
  fi
  for ((i = ${#CLEANUP[@]} - 1; i >= 0; i--)); do
    eval "${CLEANUP[i]}" >/dev/null 2>&1 || true
  done
  if [ -z "$T" ]; then
    :
  elif [ "$rc" -eq 0 ]; then
    log "PASS ($(elapsed)s)"
  else
    log "FAILED (exit $rc, $(elapsed)s)"
  fi
  exit "$rc"
}

elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# lib_begin TAG: log lines tagged TAG, root required, the exit trap that runs what was deferred.
lib_begin() {
  LOG_TAG=$1
  T0=$(date +%s.%N)
  [ "$(id -u)" = 0 ] || fail "must run as root: it creates network namespaces (try: sudo $0)"
  trap _run_cleanup EXIT
  trap 'exit 130' INT TERM
}

# work_dir PREFIX: a fresh directory /tmp/PREFIX.XXXXXX in W, removed at exit.
work_dir() {
  W=$(mktemp -d "/tmp/$1.XXXXXX")
  defer "rm -rf '$W'"
}

# e2e_init NAME: names, a mount namespace of its own, work dir, one-at-a-time lock, exit trap.
e2e_init() {
  T=$1
  NODE=ng-$T-node CLOUD=ng-$T-cloud REMOTE=ng-$T-remote
  lib_begin "e2e $T"
  private_mounts "/etc/cni /opt/cni /var/lib/cni /run/natguard"
  # The e2e tests share the cgroup tree and the runtimes' fixed paths: one at a time.
  exec 9>/run/ng-e2e.lock
  flock -w 600 9 || fail "another e2e test holds /run/ng-e2e.lock"
  work_dir "ng-e2e-$T"
}

# need CMD...: every prerequisite must be there; a missing one is a failure, never a skip.
need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || fail "prerequisite missing: $c (scripts/test.sh installs every prerequisite)"
  done
}

# --- a mount namespace of its own ---------------------------------------------------------------

# in_private_mounts: true in the process private_mounts re-ran.
in_private_mounts() { [ "${NG_PRIVATE_MOUNTS:-}" = "$$" ]; }

# private_mounts "DIR..." [ARG...]: unless already there, runs the calling script again ($0,
# with ARGs) in a mount namespace of its own (the exec keeps the pid, which marks it); there,
# mounts an empty tmpfs on each DIR (created if missing, and removed again at exit), so what
# is written there stays in this run and the machine's own is neither read nor changed.
# Network namespaces created afterwards are mounted under /run/netns in this namespace only.
private_mounts() {
  local dirs=$1 d
  shift
  if ! in_private_mounts; then
    exec unshare --mount --propagation private -- env NG_PRIVATE_MOUNTS=$$ "$0" "$@"
  fi
  for d in $dirs; do
    mkdir_tracked "$d"
    mount -t tmpfs -o mode=0755 "ng-private-$(basename "$d")" "$d" || fail "mount a tmpfs on $d"
    defer "umount -l '$d'"
  done
}

# --- network namespaces -------------------------------------------------------------------------

# mk_ns NAME: a network namespace with lo up, deleted at exit (a leftover of an interrupted
# run of the same name goes first).
mk_ns() {
  if [ -e "/run/netns/$1" ]; then ip netns del "$1"; fi
  ip netns add "$1" || fail "ip netns add $1"
  defer "ip netns del '$1'"
  ip -n "$1" link set lo up
}

# in_ns NS CMD...: run CMD in the netns only (not `ip netns exec`: that remounts /sys, hiding
# the cgroup mounts that runc and podman need).
# (fd 9 holds the e2e lock: daemons started from here must not inherit it)
in_ns() {
  local ns=$1
  shift
  nsenter --net="/run/netns/$ns" -- "$@" 9>&-
}
in_node() { in_ns "$NODE" "$@"; }

# veth NS_A IF_A NS_B IF_B: a veth pair between two namespaces, both ends up
veth() {
  ip -n "$1" link add "$2" type veth peer name "$4" netns "$3" || fail "veth $1/$2 - $3/$4"
  ip -n "$1" link set "$2" up
  ip -n "$3" link set "$4" up
}

# --- servers --------------------------------------------------------------------------------------

# serve NS CMD...: CMD in namespace NS, in a process group of its own (a forking server's
# children go with it), its output appended to $W/servers.log; stopped at exit or by
# stop_servers. Its pid goes to SERVED_PID.
SERVED_PID=""
serve() {
  local ns=$1
  shift
  setsid nsenter --net="/run/netns/$ns" -- "$@" </dev/null >>"$W/servers.log" 2>&1 9>&- &
  SERVED_PID=$!
  SERVED+=("$SERVED_PID")
  defer "kill -- -$SERVED_PID"
}

# stop_servers: stops every process serve started.
stop_servers() {
  local p
  for p in "${SERVED[@]}"; do kill -- "-$p" 2>/dev/null || true; done
  SERVED=()
}

# wait_port NS tcp|udp PORT COUNT: until COUNT sockets listen on PORT in NS (bounded: 10 s)
wait_port() {
  local flag=-Hltn i
  [ "$2" = udp ] && flag=-Hlun
  for ((i = 0; i < 200; i++)); do
    [ "$(in_ns "$1" ss $flag "sport = :$3" | grep -c .)" -ge "$4" ] && return 0
    sleep 0.05
  done
  fail "no listener on $2 port $3 in $1"
}

# keepalive_server NS PORT WORD: an HTTP/1.1 keep-alive server answering WORD on PORT in NS,
# as cloud metadata APIs and node-local proxies do (tests/common/http_keepalive.py, shared with
# the root tests); returns once it listens.
keepalive_server() {
  need python3
  serve "$1" python3 -u "$REPO/tests/common/http_keepalive.py" "$2" "$3"
  wait_port "$1" tcp "$2" 1
}

# --- the CNI driver -------------------------------------------------------------------------------
# A conflist's plugins run the way a runtime (libcni) runs them: in order at ADD, each result
# passed on as the next plugin's prevResult, the result cached as libcni caches it (where
# `natguard adopt` and the watcher's self-repair find pods), in reverse order at DEL with the
# cached result. Set before use: CNI_NODE (the node's netns), CNI_LIST (the conflist, read at
# each ADD and DEL as it is then), CNI_BIN_DIR (the node's plugin dir, searched before
# Debian's /usr/lib/cni), CNI_CACHE (the result cache dir).
CNI_NODE="" CNI_LIST="" CNI_BIN_DIR="" CNI_CACHE=""
CNI_ATTACHED=() # "CID NETNS K8S_NAMESPACE K8S_POD" of each attachment not yet deleted

# cni_plugin TYPE VERB CID NETNS CNI_ARGS CONF: one plugin, in the node namespace
cni_plugin() {
  local bin=/usr/lib/cni/$1
  [ -x "$CNI_BIN_DIR/$1" ] && bin=$CNI_BIN_DIR/$1
  printf '%s' "$6" | CNI_COMMAND=$2 CNI_CONTAINERID=$3 CNI_NETNS=$4 CNI_IFNAME=eth0 CNI_ARGS=$5 \
    CNI_PATH=$CNI_BIN_DIR:/usr/lib/cni in_ns "$CNI_NODE" "$bin"
}

# cni_plugin_conf LIST INDEX PREV: plugin INDEX of the list with name, cniVersion and prevResult
cni_plugin_conf() {
  jq -c --argjson i "$2" --argjson prev "$3" \
    '.plugins[$i] + {name: .name, cniVersion: .cniVersion}
     + (if $prev == null then {} else {prevResult: $prev} end)' "$1"
}

# cni_add CID POD_NS K8S_NAMESPACE K8S_POD: ADD through the list; the result goes to
# $W/result-CID and to the cache. Attachments still there at exit are deleted then.
cni_add() {
  local prev=null n i conf type out list net
  local args="IgnoreUnknown=1;K8S_POD_NAMESPACE=$3;K8S_POD_NAME=$4"
  list=$W/list-$1
  cp "$CNI_LIST" "$list"
  net=$(jq -r .name "$list")
  n=$(jq '.plugins | length' "$list")
  ((${#CNI_ATTACHED[@]})) || defer "cni_del_attached"
  for ((i = 0; i < n; i++)); do
    conf=$(cni_plugin_conf "$list" "$i" "$prev")
    type=$(jq -r .type <<<"$conf")
    out=$(cni_plugin "$type" ADD "$1" "/run/netns/$2" "$args" "$conf") ||
      fail "ADD of $4 failed in $type: $out"
    prev=$out
  done
  printf '%s\n' "$prev" >"$W/result-$1"
  CNI_ATTACHED+=("$1 $2 $3 $4")
  jq -n --arg cid "$1" --arg ns "/run/netns/$2" --rawfile conf "$list" --arg pns "$3" --arg pod "$4" \
    --arg net "$net" --slurpfile result "$W/result-$1" '{
      kind: "cniCacheV1", containerId: $cid, config: ($conf | @base64), ifName: "eth0",
      networkName: $net, netns: $ns, result: $result[0],
      cniArgs: [["IgnoreUnknown", "1"], ["K8S_POD_NAMESPACE", $pns], ["K8S_POD_NAME", $pod]]
    }' >"$CNI_CACHE/$net-$1-eth0"
}

# cni_del CID POD_NS K8S_NAMESPACE K8S_POD: DEL in reverse order through the list as it is
# now, with the cached result
cni_del() {
  local prev n i conf type net a
  local args="IgnoreUnknown=1;K8S_POD_NAMESPACE=$3;K8S_POD_NAME=$4"
  prev=$(cat "$W/result-$1" 2>/dev/null || echo null)
  net=$(jq -r .name "$CNI_LIST")
  n=$(jq '.plugins | length' "$CNI_LIST")
  for ((i = n - 1; i >= 0; i--)); do
    conf=$(cni_plugin_conf "$CNI_LIST" "$i" "$prev")
    type=$(jq -r .type <<<"$conf")
    cni_plugin "$type" DEL "$1" "/run/netns/$2" "$args" "$conf" || return 1
  done
  rm -f "$W/result-$1" "$CNI_CACHE/$net-$1-eth0"
  for i in "${!CNI_ATTACHED[@]}"; do
    a=${CNI_ATTACHED[i]}
    if [ "${a%% *}" = "$1" ]; then unset 'CNI_ATTACHED[i]'; fi
  done
  CNI_ATTACHED=("${CNI_ATTACHED[@]}")
}

# cni_del_attached: DEL of every attachment not deleted yet, in the order they were added.
cni_del_attached() {
  local a
  for a in "${CNI_ATTACHED[@]}"; do
    # shellcheck disable=SC2086
    cni_del $a || return 1
  done
}

# cni_pod_ip CID FAMILY(4|6): the pod's first address of that family in its ADD result
cni_pod_ip() {
  jq -r --arg f "$2" '.ips[].address | select(if $f == "4" then contains(".") else contains(":") end)
    | split("/")[0]' "$W/result-$1" | head -n1
}

# --- e2e: natguard under test -----------------------------------------------------------------

# natguard_bin: path of the plugin binary under test: $NATGUARD_BIN, or the release build
# (cargo build --release first: a no-op when up to date, and never a stale binary)
natguard_bin() {
  if [ -n "${NATGUARD_BIN:-}" ]; then
    [ -x "$NATGUARD_BIN" ] || fail "NATGUARD_BIN=$NATGUARD_BIN is not executable"
    echo "$NATGUARD_BIN"
    return
  fi
  need cargo
  (cd "$REPO" && cargo build --release -q) >&2 || fail "cargo build --release"
  [ -x "$REPO/target/x86_64-unknown-linux-gnu/release/natguard" ] || fail "no release binary after cargo build"
  echo "$REPO/target/x86_64-unknown-linux-gnu/release/natguard"
}

# natguard_conf [EXTRA_JSON]: natguard's entry for a conflist (defaults plus an exempt namespace,
# and masqueradeOutside: the layers' bridges masquerade nothing, and check_probe checks both
# sides of natguard's masquerade policy).
natguard_conf() {
  jq -cn --arg log "$W/natguard.log" --arg ex "$EXEMPT_NS" --argjson extra "${1:-{\}}" \
    '{type: "natguard", capabilities: {"io.kubernetes.cri.pod-annotations": true},
      metadata: {mode: "proxy", exemptNamespaces: [$ex]}, masquerade: {masqueradeOutside: true},
      logFile: $log} * $extra'
}

# bridge_conf BRIDGE SUBNET [IPMASQ]: Debian's bridge + host-local (default IPAM dir).
bridge_conf() {
  jq -cn --arg br "$1" --arg sn "$2" --argjson masq "${3:-false}" '{
    type: "bridge", bridge: $br, isGateway: true, ipMasq: $masq, hairpinMode: true,
    ipam: {type: "host-local", ranges: [[{subnet: $sn}]], routes: [{dst: "0.0.0.0/0"}]}}'
}

# --- the world ------------------------------------------------------------------------------

# world_up: node, cloud and remote netns, their links, routes and HTTP servers.
world_up() {
  need ip nsenter busybox jq nft conntrack
  mk_ns "$NODE"
  mk_ns "$CLOUD"
  mk_ns "$REMOTE"
  # node <-> remote
  ip -n "$NODE" link add up0 type veth peer name eth0 netns "$REMOTE" || fail "veth node-remote"
  ip -n "$NODE" addr add "$NODE_IP/24" dev up0
  ip -n "$NODE" link set up0 up
  ip -n "$REMOTE" addr add "$REMOTE_GW/24" dev eth0
  ip -n "$REMOTE" addr add "$REMOTE_IN/32" dev lo
  ip -n "$REMOTE" addr add "$REMOTE_OUT/32" dev lo
  ip -n "$REMOTE" link set eth0 up
  ip -n "$NODE" route add default via "$REMOTE_GW"
  ip -n "$REMOTE" route add default via "$NODE_IP"
  # node <-> cloud (the metadata API's address is routed from the node to the cloud netns)
  ip -n "$NODE" link add cl0 type veth peer name eth0 netns "$CLOUD" || fail "veth node-cloud"
  ip -n "$NODE" addr add "$CLOUD_LINK_NODE/30" dev cl0
  ip -n "$NODE" link set cl0 up
  ip -n "$CLOUD" addr add "$CLOUD_LINK_CLOUD/30" dev eth0
  ip -n "$CLOUD" addr add "$METADATA_IP/32" dev lo
  ip -n "$CLOUD" link set eth0 up
  ip -n "$NODE" route add "$METADATA_IP/32" via "$CLOUD_LINK_CLOUD"
  ip -n "$CLOUD" route add default via "$CLOUD_LINK_NODE"
  in_node sysctl -qw net.ipv4.ip_forward=1 || fail "ip_forward in $NODE"

  # HTTP servers (busybox httpd)
  mkdir -p "$W/www-proxy" "$W/www-cloud" "$W/www-remote/cgi-bin"
  echo proxy >"$W/www-proxy/index.html"
  echo cloud >"$W/www-cloud/index.html"
  printf '#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n%%s\\n" "$REMOTE_ADDR"\n' >"$W/www-remote/cgi-bin/src"
  chmod +x "$W/www-remote/cgi-bin/src"
  _serve "$NODE" "0.0.0.0:$PROXY_PORT" "$W/www-proxy"
  _serve "$CLOUD" 0.0.0.0:80 "$W/www-cloud"
  _serve "$REMOTE" 0.0.0.0:80 "$W/www-remote"
  # wait until all three answer (bounded)
  local i ok
  for i in $(seq 50); do
    ok=1
    [ "$(in_node timeout 2 busybox wget -q -O- "http://$NODE_IP:$PROXY_PORT/" 2>/dev/null)" = proxy ] || ok=0
    [ "$(in_node timeout 2 busybox wget -q -O- "http://$METADATA_IP/" 2>/dev/null)" = cloud ] || ok=0
    [ "$(in_node timeout 2 busybox wget -q -O- "http://$REMOTE_IN/cgi-bin/src" 2>/dev/null)" = "$NODE_IP" ] || ok=0
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  [ "$ok" = 1 ] || fail "world: servers do not answer from the node"
  log "world up: $NODE (proxy $NODE_IP:$PROXY_PORT), $CLOUD ($METADATA_IP), $REMOTE ($REMOTE_IN, $REMOTE_OUT)"
}

_serve() { serve "$1" busybox httpd -f -p "$2" -h "$3"; }

# The shell snippet a container runs to probe the world; prints four lines:
#   ip=<its eth0 IPv4>  meta=<who answered 169.254.169.254>  in=<source seen by 10.200.0.2>
#   out=<source seen by 11.0.0.2>
# (busybox wget -T crashes in busybox 1.35: bound every request with timeout instead.)
PROBE='echo "ip=$(ip -4 -o addr show dev eth0 | sed "s/.*inet \([0-9.]*\).*/\1/")"
echo "meta=$(timeout 5 wget -q -O- http://169.254.169.254/ 2>&1)"
echo "in=$(timeout 5 wget -q -O- http://10.200.0.2/cgi-bin/src 2>&1)"
echo "out=$(timeout 5 wget -q -O- http://11.0.0.2/cgi-bin/src 2>&1)"'

# check_probe OUTPUT WHO [EXPECT_META]: assert on PROBE's output; WHO names the pod in messages.
# Prints the pod's IP.
check_probe() {
  local out=$1 who=$2 want_meta=${3:-proxy} ip meta in outv
  ip=$(sed -n 's/^ip=//p' <<<"$out")
  meta=$(sed -n 's/^meta=//p' <<<"$out")
  in=$(sed -n 's/^in=//p' <<<"$out")
  outv=$(sed -n 's/^out=//p' <<<"$out")
  [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "$who: no pod address in probe output: $out"
  if [ "$want_meta" = reset ]; then
    # a TCP reset: busybox wget says "Connection refused" (or "reset"), never a body
    [[ $meta =~ (refused|reset) ]] ||
      fail "$who ($ip): 169.254.169.254 answered '$meta', want a TCP reset"
  else
    [ "$meta" = "$want_meta" ] || fail "$who ($ip): 169.254.169.254 answered '$meta', want '$want_meta'"
  fi
  [ "$in" = "$ip" ] || fail "$who ($ip): $REMOTE_IN (non-masquerade CIDR) saw source '$in', want the pod address"
  [ "$outv" = "$NODE_IP" ] || fail "$who ($ip): $REMOTE_OUT saw source '$outv', want the node's $NODE_IP (masquerade)"
  log "$who ($ip): metadata -> $meta, $REMOTE_IN sees $in, $REMOTE_OUT sees $outv"
  echo "$ip"
}

# --- natguard's kernel state -----------------------------------------------------------------

nft_table() { in_node nft list table inet natguard 2>/dev/null; }

# ip_re IP: an extended regex matching IP as a whole address
ip_re() { printf '(^|[^0-9.])%s([^0-9]|$)' "${1//./\\.}"; }

# set_has NET SET IP: the network's set NET-SET holds IP; with an empty NET, the node-wide
# set SET (the guard's allow-lists, shared by every network: exempt4, exempt6, ...)
set_has() {
  local out name=${1:+$1-}$2
  out=$(in_node nft list set inet natguard "$name" 2>&1) || fail "nft list set inet natguard $name: $out"
  grep -Eq "$(ip_re "$3")" <<<"$out"
}

# set_holds NET SET IP: set_has for a condition that is waited for: false, never a failure,
# while the set does not exist (natguard's table can exist before a network's sets: install
# puts the node-wide guard in place first). A predicate that calls `fail` would end the script
# from inside the wait, with the wait's stderr (and so the message) thrown away.
set_holds() {
  local out name=${1:+$1-}$2
  out=$(in_node nft list set inet natguard "$name" 2>/dev/null) || return 1
  grep -Eq "$(ip_re "$3")" <<<"$out"
}

# assert_pod_installed NET IP CID [exempt|deny]: natguard has the pod under policy (deny: the
# pod asked for it with natguard.io/metadata). NG_REDIR_SET names the set of intercepted pods
# for a release that calls it otherwise (0.1.0: meta4).
assert_pod_installed() {
  local net=$1 ip=$2 cid=$3 exempt=${4:-} redir=${NG_REDIR_SET:-redir4}
  nft_table >/dev/null || fail "no nftables table inet natguard in $NODE"
  set_has "$net" masq4 "$ip" || fail "pod $ip is not in $net-masq4"
  if [ "$exempt" = exempt ]; then
    set_has "$net" "$redir" "$ip" && fail "exempt pod $ip is in $net-$redir"
    set_has "" exempt4 "$ip" || fail "exempt pod $ip is not in the node-wide exempt4"
  elif [ "$exempt" = deny ]; then
    # natguard.io/metadata: deny in a proxy network: neither DNATed nor exempt
    set_has "$net" "$redir" "$ip" && fail "pod $ip (annotated deny) is in $net-$redir"
    set_has "" exempt4 "$ip" && fail "pod $ip (annotated deny) is in the node-wide exempt4"
    in_node nft list set inet natguard "$net-pods" 2>/dev/null | grep -E "$(ip_re "$ip")" | grep -F -- "pol=deny" >/dev/null ||
      fail "pod $ip (annotated deny): its owner entry does not record pol=deny"
  else
    set_has "$net" "$redir" "$ip" || fail "pod $ip is not in $net-$redir"
  fi
  # owner entry: its comment names the pod's addresses and (a prefix of) the container ID
  in_node nft list set inet natguard "$net-pods" 2>/dev/null | grep -E "$(ip_re "$ip")" | grep -F -- "${cid:0:12}" >/dev/null ||
    fail "no owner entry for $ip / container $cid in $net-pods: $(in_node nft list set inet natguard "$net-pods" 2>&1)"
}

# quiet_flows IP: wait (bounded: 5 s) until none of the pod's TCP flows is still open (closed on
# both sides: TIME_WAIT or CLOSE), so no peer's late FIN brings a flow back into conntrack after
# a DEL deleted the pod's flows
quiet_flows() {
  local i flows
  for i in $(seq 50); do
    flows=$(in_node conntrack -L -p tcp -s "$1" 2>/dev/null) || true
    [ -n "$(grep -Ev 'TIME_WAIT|CLOSE|^$' <<<"$flows")" ] || return 0
    sleep 0.1
  done
  fail "pod $1: TCP flows still open: $(in_node conntrack -L -p tcp -s "$1" 2>/dev/null)"
}

# assert_pod_gone NET IP CID: nothing of the pod remains in natguard's table, in conntrack,
# in host-local's IPAM store or in libcni's result cache. NG_IGNORE_SETS (comma-separated set
# names) are left out of the table: sets a release's DEL cannot know (another release's).
assert_pod_gone() {
  local net=$1 ip=$2 cid=$3 t ct
  t=$(nft_table | awk -v skip=",${NG_IGNORE_SETS:-}," '
    /^\tset / { s = index(skip, "," $2 ",") > 0 }
    !s { print }
    /^\t}/ { s = 0 }')
  if grep -Eq "$(ip_re "$ip")" <<<"$t"; then
    fail "natguard's table still holds pod $ip: $(grep -E "$(ip_re "$ip")" <<<"$t")"
  fi
  # natguard's comments name the container by a prefix of its ID
  grep -qF -- "${cid:0:12}" <<<"$t" && fail "natguard's table still holds container $cid: $(grep -F -- "${cid:0:12}" <<<"$t")"
  ct=$({
    in_node conntrack -L -s "$ip" 2>/dev/null
    in_node conntrack -L -d "$ip" 2>/dev/null
    in_node conntrack -L --reply-src "$ip" 2>/dev/null
    in_node conntrack -L --reply-dst "$ip" 2>/dev/null
  } | sort -u)
  assert_cni_state_gone "$net" "$ip" "$cid"
  [ -z "$ct" ] || fail "conntrack still holds flows of pod $ip (natguard's DEL must delete them): $ct"
  log "pod $ip ($cid) left nothing behind: nft, conntrack, IPAM, CNI cache"
}

# assert_cni_state_gone NET IP CID: host-local and libcni keep nothing of the pod
assert_cni_state_gone() {
  local net=$1 ip=$2 cid=$3 f
  [ -e "/var/lib/cni/networks/$net/$ip" ] && fail "host-local still reserves $ip (/var/lib/cni/networks/$net/$ip)"
  if [ -d "/var/lib/cni/networks/$net" ] && grep -rlq -- "$cid" "/var/lib/cni/networks/$net"; then
    fail "host-local still holds container $cid in /var/lib/cni/networks/$net"
  fi
  for f in /var/lib/cni/results/"$net"-*; do
    [ -e "$f" ] || continue
    case $f in *"$cid"*) fail "CNI cache still holds $f" ;; esac
  done
}

# --- files on the real root filesystem --------------------------------------------------------

# mkdir_tracked DIR: create DIR (and missing parents); remove the ones we created at exit
# (only if empty again).
mkdir_tracked() {
  local d=$1 missing=()
  while [ ! -e "$d" ]; do
    missing+=("$d")
    d=$(dirname "$d")
  done
  # outermost first, so that the innermost is removed first at exit
  local i
  for ((i = ${#missing[@]} - 1; i >= 0; i--)); do defer "rmdir '${missing[i]}'"; done
  [ ${#missing[@]} -eq 0 ] || mkdir -p "$1"
}

# track_file PATH: at exit, put back what PATH is now (or remove PATH if it does not exist now)
track_file() {
  local dst=$1 saved
  mkdir_tracked "$(dirname "$dst")"
  if [ -e "$dst" ] || [ -L "$dst" ]; then
    saved="$W/saved.$(echo "$dst" | tr / _)"
    cp -a "$dst" "$saved"
    defer "mv -f '$saved' '$dst'"
  else
    defer "rm -f '$dst'"
  fi
}

# put_file SRC DEST [MODE]: install SRC as DEST; at exit restore what DEST was (or remove it).
put_file() {
  local src=$1 dst=$2 mode=${3:-0644}
  track_file "$dst"
  install -m "$mode" "$src" "$dst.ng-tmp" && mv -f "$dst.ng-tmp" "$dst" || fail "install $dst"
}

# link_plugin NAME...: make Debian's plugin NAME available in /opt/cni/bin (a symlink, removed
# at exit) unless the node has one there already
link_plugin() {
  local n
  mkdir_tracked /opt/cni/bin
  for n in "$@"; do
    [ -e "/opt/cni/bin/$n" ] && continue
    ln -s "/usr/lib/cni/$n" "/opt/cni/bin/$n" || fail "ln -s /usr/lib/cni/$n /opt/cni/bin/$n"
    defer "rm -f '/opt/cni/bin/$n'"
  done
}

# cni_state_cleanup NET: at exit, remove what host-local and libcni keep for network NET.
cni_state_cleanup() {
  mkdir_tracked /var/lib/cni/networks
  mkdir_tracked /var/lib/cni/results
  defer "rm -rf '/var/lib/cni/networks/$1'; rm -f /var/lib/cni/results/'$1'-*"
}

# first_conflist DIR: the file kubelet/containerd/ctr would pick (first *.conf* by name)
first_conflist() {
  find "$1" -maxdepth 1 -type f \( -name '*.conflist' -o -name '*.conf' -o -name '*.json' \) -printf '%f\n' |
    LC_ALL=C sort | head -n1
}

# image_tar NAME: build (once per test) the busybox OCI archive; prints its path.
image_tar() {
  local ref=$1 entry=${2:-'["/bin/sh"]'} out
  out="$W/$(echo "$ref" | tr '/:' '__').tar"
  [ -f "$out" ] || "$E2E_DIR/busybox-image.sh" "$out" "$ref" "$entry" >/dev/null || fail "busybox-image.sh $ref"
  echo "$out"
}

# cgroup_cleanup NAME...: at exit, remove empty cgroup parents runtimes leave behind.
cgroup_cleanup() {
  local n
  for n in "$@"; do
    defer "for d in /sys/fs/cgroup/*/'$n' /sys/fs/cgroup/'$n'; do [ -d \"\$d\" ] && find \"\$d\" -depth -type d -exec rmdir {} \\; ; done"
  done
}

# umount_under DIR: at exit, unmount everything mounted below DIR (deepest first).
umount_under() {
  defer "awk -v d='$1/' 'index(\$2, d) == 1 { print \$2 }' /proc/self/mounts | sort -r | xargs -r -n1 umount -l"
}

# --- containerd ---------------------------------------------------------------------------------

CTD_SOCK=""
# ctd CTR_ARGS...: ctr against this test's containerd
ctd() { ctr --address "$CTD_SOCK" "$@"; }

# track_run_containerd: containerd 1.6 keeps shim sockets, runc state and ctr's fifos under
# the fixed /run/containerd whatever its config says: remove what we add there.
track_run_containerd() {
  if [ -e /run/containerd ]; then
    defer "for d in /run/containerd/runc/* /run/containerd/fifo/* /run/containerd/s /run/containerd/runc /run/containerd/fifo; do rmdir \"\$d\"; done"
  else
    defer "find /run/containerd -depth -type d -empty -delete"
  fi
}

# cgroup_track NAME...: at exit, remove the cgroup parents NAME that runc creates (only those
# that did not exist before, and only when empty).
cgroup_track() {
  local n d
  for n in "$@"; do
    for d in /sys/fs/cgroup/*/"$n" /sys/fs/cgroup/"$n"; do
      [ -e "$d" ] && continue 2
    done
    defer "for d in /sys/fs/cgroup/*/'$n' /sys/fs/cgroup/'$n'; do [ -d \"\$d\" ] && find \"\$d\" -depth -type d -exec rmdir {} + ; done"
  done
}

# containerd_up CRI_TOML: start containerd (own root, state and socket under $W) inside the
# node netns. CRI_TOML: the [plugins."io.containerd.grpc.v1.cri"] body, or "" to disable CRI.
containerd_up() {
  need containerd ctr runc containerd-shim-runc-v2
  local d=$W/containerd i
  mkdir -p "$d"
  CTD_SOCK=$d/containerd.sock
  track_run_containerd
  {
    echo 'version = 2'
    echo "root = \"$d/root\""
    echo "state = \"$d/state\""
    if [ -z "$1" ]; then
      echo 'disabled_plugins = ["io.containerd.grpc.v1.cri"]'
    fi
    echo '[grpc]'
    echo "  address = \"$CTD_SOCK\""
    echo '[plugins."io.containerd.internal.v1.opt"]'
    echo "  path = \"$d/opt\""
    if [ -n "$1" ]; then
      echo '[plugins."io.containerd.grpc.v1.cri"]'
      echo "$1"
    fi
  } >"$d/config.toml"
  umount_under "$d"
  # Last of containerd's cleanups (run first): stop what is left of its tasks and itself.
  # nsenter directly, not in_node: a backgrounded function is a subshell, and $! its pid
  nsenter --net="/run/netns/$NODE" containerd --config "$d/config.toml" >"$d/containerd.log" 2>&1 9>&- &
  local pid=$!
  defer "_containerd_down $pid"
  for i in $(seq 100); do
    [ -S "$CTD_SOCK" ] && ctd version >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  ctd version >/dev/null 2>&1 || fail "containerd did not start: $(tail -5 "$d/containerd.log")"
}

_containerd_down() {
  local pid=$1 ns c p
  for ns in $(ctd namespaces ls -q 2>/dev/null); do
    for c in $(ctd -n "$ns" tasks ls -q 2>/dev/null); do
      ctd -n "$ns" tasks kill -s KILL "$c"
      ctd -n "$ns" tasks rm -f "$c"
    done
    for c in $(ctd -n "$ns" containers ls -q 2>/dev/null); do ctd -n "$ns" containers rm "$c"; done
  done
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  # shims started by this containerd carry its socket in their command line
  for p in $(pgrep -f -- "-address $CTD_SOCK" 2>/dev/null); do kill -9 "$p"; done
}

# ctd_import TAR [NAMESPACE]
ctd_import() { ctd -n "${2:-default}" images import "$1" >/dev/null || fail "ctr images import $1"; }

# cri_client: path of tests/cri-client's binary (cargo build: a no-op when up to date)
cri_client() {
  local dir=$REPO/tests/cri-client b
  need cargo protoc
  (cd "$dir" && cargo build --release -q) >&2 || fail "cargo build tests/cri-client"
  for b in "$dir"/target/x86_64-unknown-linux-gnu/release/cri-client "$dir"/target/release/cri-client; do
    [ -x "$b" ] && { echo "$b"; return; }
  done
  fail "tests/cri-client built, but no binary found"
}

# cnitool: path of tests/cnitool's binary (built into $W; Go in GOPATH mode, offline)
cnitool_bin() {
  local src=/usr/share/gocode/src/github.com/containernetworking/cni/libcni
  need go
  [ -d "$src" ] || fail "prerequisite missing: $src (apt-get install golang-github-appc-cni-dev)"
  if [ ! -x "$W/cnitool" ]; then
    (cd "$REPO/tests/cnitool" && GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= \
      GOCACHE="$W/gocache" go build -o "$W/cnitool" .) >&2 || fail "go build tests/cnitool"
  fi
  echo "$W/cnitool"
}

# --- pods without a runtime (libcni driver, direct invocation) ------------------------------------

# bare_pod NAME VAR: an empty pod netns ng-<t>-NAME (deleted at exit); its path goes to VAR
# (not printed: a defer inside $(...) would be lost with the subshell)
bare_pod() {
  local ns=ng-$T-$1
  mk_ns "$ns"
  printf -v "$2" '%s' "/run/netns/$ns"
}

# probe_in NETNS_PATH: run PROBE in a pod netns with busybox's applets (the host's tools may
# be missing or differ)
probe_in() {
  local a
  if [ ! -d "$W/bb" ]; then
    mkdir -p "$W/bb"
    for a in sh ip sed wget timeout; do ln -s "$(command -v busybox)" "$W/bb/$a"; done
  fi
  nsenter --net="$1" env PATH="$W/bb" sh -c "$PROBE" 9>&-
}

# --- long-lived connections (HTTP/1.1 keep-alive) ------------------------------------------------

# keepalive_servers: replace the world's proxy (node :8181) and cloud (:80) servers, busybox
# httpd that closes every connection after one answer, by keep-alive HTTP/1.1 servers that
# answer the same words (keepalive_server), for clients that keep one connection open across
# a change of policy. Call after world_up.
keepalive_servers() {
  need python3 socat
  _keepalive_server "$NODE" "0.0.0.0:$PROXY_PORT" proxy "$NODE_IP:$PROXY_PORT"
  _keepalive_server "$CLOUD" 0.0.0.0:80 cloud "$METADATA_IP:80"
  log "proxy and cloud servers keep connections open (HTTP/1.1 keep-alive)"
}

# _keepalive_server NS ADDR:PORT WORD CHECK_ADDR:PORT
_keepalive_server() {
  local ns=$1 spec=$2 word=$3 check=$4 p i n
  # world_up's busybox httpd for this port (it runs alone in its netns with that command line)
  for p in $(ip netns pids "$ns"); do
    if [[ "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" == *"httpd -f -p $spec "* ]]; then
      kill "$p"
      for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$p" 2>/dev/null && fail "busybox httpd $p ($ns $spec) did not stop"
    fi
  done
  keepalive_server "$ns" "${spec##*:}" "$word"
  # two requests on one connection, two answers (bounded)
  for i in $(seq 50); do
    n=$(printf 'GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n' |
      in_node timeout 3 socat -t 1 - "TCP:$check" 2>/dev/null | grep -c "^$word" || true)
    [ "$n" = 2 ] && return 0
    sleep 0.1
  done
  fail "keep-alive server $ns $spec: no two answers '$word' on one connection from the node ($(cat "$W/servers.log"))"
}

# keepalive_client NETNS_PATH LOG: scripts/e2e/keepalive.py's client in a pod's netns, keeping
# one connection to 169.254.169.254:80 (a request every 0.5 s; see keepalive.py for LOG's
# format); stopped at exit. Its pid goes to KEEPALIVE_PID.
KEEPALIVE_PID=""
keepalive_client() {
  need python3
  nsenter --net="$1" python3 "$E2E_DIR/keepalive.py" client "$METADATA_IP:80" "$2" \
    >>"$2.stderr" 2>&1 9>&- &
  KEEPALIVE_PID=$!
  defer "kill $KEEPALIVE_PID"
}
