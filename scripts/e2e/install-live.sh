#!/bin/bash
# scripts/e2e/install-live.sh: `natguard install` on a live node, under containerd's CRI.
#
# The node runs containerd's CRI with the stock paths (first conflist in /etc/cni/net.d,
# plugins in /opt/cni/bin) and a 0.4.0 list of bridge + host-local + portmap, without natguard.
# The proxy and the cloud keep HTTP/1.1 connections open (keepalive_servers), and the node
# has a conntrack-using forward rule, as kube-proxy gives every real node.
# 1. Two pods start before natguard exists, one in an exempt namespace. In each pod's netns a
#    client keeps one long-lived connection to 169.254.169.254:80 with a request every 0.5 s
#    (the startup race: the flow is ESTABLISHED in conntrack before any DNAT exists); both
#    are answered by the cloud, and nothing masquerades them.
# 2. `natguard install` (run in the node netns, so its adopt acts there) copies the binary,
#    appends natguard to the active list, keeps its cniVersion, and adopts the running pods
#    from libcni's cache; its report names the ordinary pod adopted and the exempt one skipped.
#    The ordinary pod's addresses are in natguard's table; adopt deleted its pre-install flow
#    to the metadata API; its long-lived client is answered by the proxy after at most one
#    reconnect and never again by the cloud, and the flow's conntrack entry shows the DNAT
#    (reply source = the proxy). The exempt pod's connection is untouched (same connection,
#    still the cloud). Running install again changes nothing.
# 3. `natguard install --watch`: the primary plugin's agent rewrites the list from its template
#    (atomically, without natguard, as aws-node and calico-node do); natguard's entry is back
#    within a bounded wait, and a pod started after that is under policy from its ADD.
#    The window between a rewrite and the re-insert, held open by stopping the watcher: a pod
#    started in it gets no ADD from natguard (not intercepted but reset by the fail-closed rule,
#    not masqueraded by natguard); the resumed watcher puts the entry back and its adopt brings
#    the pod under policy (in natguard's sets, answered by the proxy). Someone deletes
#    natguard's table: the watcher's self-repair restores every pod's entries (the exempt one's
#    too) and the next metadata connection is proxied. SIGTERM leaves the entry.
# 4. The ordinary pods are removed while natguard is listed: nothing of them is left
#    (natguard's table, conntrack, IPAM, the CNI cache). Then `install --watch
#    --cleanup-on-exit` and SIGTERM: the list is the original again, the binary and the table
#    stay, and a pod started then gets no ADD from natguard.
# 5. `natguard uninstall` with the exempt pod still running: the list is the original again
#    (byte for byte), the binary and the nftables table are gone, and the runtime still starts
#    and removes pods with the list (address, egress, metadata -> cloud, no IPAM or cache left).
# A conntrack leftover (adopt's or DEL's) does not change what the later steps test: it is
# recorded, the test goes on, and it fails at the end naming every such failure.
. "$(dirname "$0")/../lib.sh"
set -euo pipefail
e2e_init live
need ctr flock python3 socat /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap
NET=ng-e2e-live
NETCONF=/etc/cni/net.d
CNIBIN=/opt/cni/bin
CACHE=/var/lib/cni/results
LIST=$NETCONF/00-$NET.conflist
APPS_NS=ng-e2e-apps

world_up
keepalive_servers
# A real node's firewall (kube-proxy's KUBE-FORWARD, a hostPort's DNAT) makes conntrack track
# every flow; a fresh netns tracks nothing until some rule needs conntrack. Without this the
# node would not hold the pre-install flow's ESTABLISHED entry that the race is about.
in_node nft -f - <<'NFT' || fail "the node's stand-in for kube-proxy's filter rules"
table inet ng-e2e-node {
  chain forward {
    type filter hook forward priority 0; policy accept;
    ct state established,related counter accept
  }
}
NFT
crictl=$(cri_client)
bin=$(natguard_bin)
link_plugin bridge host-local portmap loopback
track_file "$CNIBIN/natguard"
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.8.0/24)" \
  '{cniVersion: "0.4.0", name: $net, plugins: [$br, {type: "portmap", capabilities: {portMappings: true}}]}' \
  >"$W/template.conflist"
put_file "$W/template.conflist" "$LIST"
[ "$(first_conflist "$NETCONF")" = "00-$NET.conflist" ] ||
  fail "CRI would not pick $LIST: the first conflist in $NETCONF is $(first_conflist "$NETCONF")"
cni_state_cleanup "$NET"
cgroup_track k8s.io
containerd_up "  sandbox_image = \"$PAUSE_REF\"
  # no CAP_SYS_RESOURCE in some CI sandboxes: runc could not lower the sandbox's oom_score_adj
  restrict_oom_score_adj = true
  [plugins.\"io.containerd.grpc.v1.cri\".cni]
    bin_dir = \"$CNIBIN\"
    conf_dir = \"$NETCONF\"
    max_conf_num = 1"
ctd_import "$(image_tar "$IMAGE_REF")" k8s.io
ctd_import "$(image_tar "$PAUSE_REF" '["/bin/sleep","2147483647"]')" k8s.io
cri() { CRI_SOCK=$CTD_SOCK CRI_LOG_DIR=$W/cri-logs "$crictl" "$@"; }
# the last cleanup of CRI: remove the pods still there (stopp + rmp run CNI DEL)
defer "for p in \$(cri lsp | cut -d' ' -f1); do cri stopp \$p; cri rmp \$p; done"
log "$(cri version)"
DIRS=(--cni-bin-dir "$CNIBIN" --netconf-dir "$NETCONF")
ng() { in_node "$bin" "$@"; }
defer "in_node '$bin' uninstall ${DIRS[*]} --ready-file '$W/ready'"

now() { date +%s.%N; }

# runp NAME NAMESPACE VAR_ID VAR_IP: RunPodSandbox; the pod's netns (CRI's bind mount) is
# removed at exit should the runtime not get to it
runp() {
  local id ip ns
  id=$(cri runp "$1" "$2" "uid-$1") || fail "RunPodSandbox $2/$1: $id"
  ip=$(cri ip "$id") || fail "PodSandboxStatus $id: $ip"
  ns=$(jq -r '.result.interfaces[]? | .sandbox // empty' "$CACHE/$NET-$id-eth0" 2>/dev/null | head -n1)
  [ -n "$ns" ] || fail "pod $2/$1 ($id): no netns in libcni's cache $CACHE/$NET-$id-eth0"
  defer "[ -e '$ns' ] && { umount '$ns'; rm -f '$ns'; }"
  printf -v "$3" '%s' "$id"
  printf -v "$4" '%s' "$ip"
  log "pod $2/$1: sandbox ${id:0:12}, $ip, netns $ns"
}

# sandbox_netns POD: /proc/<pid>/ns/net of the pod's sandbox (pause) process
sandbox_netns() {
  local pid
  pid=$(ctd -n k8s.io tasks ls | awk -v id="$1" '$1 == id { print $2 }')
  [ -n "$pid" ] && [ -e "/proc/$pid/ns/net" ] || fail "no running sandbox task for pod $1"
  echo "/proc/$pid/ns/net"
}

# probe POD_ID WHO EXPECT_META [unmasqueraded]: a container in the pod probes the world
probe() {
  local out ip
  out=$(cri run "$1" "$IMAGE_REF" sh -c "$PROBE") || fail "container in $2: $out"
  if [ "${4:-}" = unmasqueraded ]; then
    # without natguard's policy nothing masquerades (bridge ipMasq is off)
    ip=$(sed -n 's/^ip=//p' <<<"$out")
    [ -n "$ip" ] && grep -qx "meta=$3" <<<"$out" && grep -qx "in=$ip" <<<"$out" && grep -qx "out=$ip" <<<"$out" ||
      fail "$2: want an address, metadata -> $3 and egress without masquerade, got: $out"
    log "$2 ($ip): metadata -> $3, $REMOTE_IN and $REMOTE_OUT see the pod address (not masqueraded)"
  else
    check_probe "$out" "$2" "$3" >/dev/null || exit 1
  fi
}

# cri_loaded with|without: wait (bounded) until CRI has (re)loaded a list that does / does not
# name natguard
cri_loaded() {
  local i conf
  for i in $(seq 100); do
    conf=$(cri cniconfig) || fail "cri-client cniconfig: $conf"
    if grep -q natguard <<<"$conf"; then
      [ "$1" = with ] && return 0
    else
      [ "$1" = without ] && return 0
    fi
    sleep 0.1
  done
  fail "CRI did not load the list $1 natguard: $(cri cniconfig)"
}

# --- the long-lived clients' logs (scripts/e2e/keepalive.py) --------------------------------
# ka_events LOG FROM [TO]: "TIME KIND CONN LPORT" per event with FROM <= TIME < TO; KIND is
# connect, connect-error, error or answer=WORD
ka_events() {
  [ -e "$1" ] || return 0
  awk -v a="$2" -v b="${3:-9999999999}" '{
    t = ""; kind = $1; conn = "-"; lport = "-"
    for (i = 2; i <= NF; i++) {
      k = $i; sub(/=.*/, "", k); v = substr($i, length(k) + 2)
      if (k == "at" || k == "sent") t = v
      else if (k == "conn") conn = v
      else if (k == "lport") lport = v
      else if (k == "answer") kind = "answer=" v
      else if (k == "error" && kind == "req") kind = "error"
    }
    if (t != "" && t + 0 >= a + 0 && t + 0 < b + 0) print t, kind, conn, lport
  }' "$1"
}
# ka_count LOG KIND FROM [TO]
ka_count() { ka_events "$1" "$3" "${4:-}" | awk -v k="$2" '$2 == k { n++ } END { print n + 0 }'; }
# ka_wait LOG WORD N FROM: wait (bounded: 20 s) until N answers WORD were sent at FROM or later
ka_wait() {
  local i
  for i in $(seq 200); do
    [ "$(ka_count "$1" "answer=$2" "$4")" -ge "$3" ] && return 0
    sleep 0.1
  done
  fail "$1: fewer than $3 answers '$2' since $4 within 20 s; log: $(tail -n 20 "$1")"
}
# ka_lport LOG: local port of the client's current connection
ka_lport() { awk '$1 == "connect" { sub(/lport=/, "", $3); p = $3 } END { print p }' "$1"; }
# ka_others LOG WORD FROM [TO]: events other than answers WORD and connects
ka_others() { ka_events "$1" "$3" "${4:-}" | awk -v k="answer=$2" '$2 != k && $2 != "connect"'; }

# ct_flow IP LPORT: the conntrack entries of the pod's TCP flow from local port LPORT
ct_flow() { in_node conntrack -L -p tcp -s "$1" --sport "$2" 2>/dev/null || true; }
# reply_src ENTRY: the reply direction's source (address:port) of a conntrack entry
reply_src() { awk '{ n = 0; for (i = 1; i <= NF; i++) { if ($i ~ /^src=/) { n++; if (n == 2) a = substr($i, 5) } if ($i ~ /^sport=/) { m++; if (m == 2) p = substr($i, 7) } } print a ":" p; exit }' <<<"$1"; }

# Some failures do not change what the later steps test (state left behind by natguard's
# conntrack work): they are recorded, the test goes on, and it fails at the end naming them.
LATE_FAILS=()
late_fail() {
  LATE_FAILS+=("$1")
  log "FAIL (recorded; the test goes on and fails at the end): $1"
}

# ============================================================================================
# 1. pods before natguard, each with a long-lived metadata connection
runp ng-early "$APPS_NS" podA ipA
runp ng-creds "$EXEMPT_NS" podB ipB
probe "$podA" "pod $APPS_NS/ng-early before install" cloud unmasqueraded
probe "$podB" "pod $EXEMPT_NS/ng-creds before install" cloud unmasqueraded
kaA=$W/keepalive-A.log kaB=$W/keepalive-B.log
t_begin=$(now)
keepalive_client "$(sandbox_netns "$podA")" "$kaA"
kaA_pid=$KEEPALIVE_PID
keepalive_client "$(sandbox_netns "$podB")" "$kaB"
kaB_pid=$KEEPALIVE_PID
ka_wait "$kaA" cloud 4 "$t_begin"
ka_wait "$kaB" cloud 4 "$t_begin"
for ka in "$kaA" "$kaB"; do
  [ "$(ka_count "$ka" connect "$t_begin")" = 1 ] && [ -z "$(ka_others "$ka" cloud "$t_begin")" ] ||
    fail "before install, $ka: want one connection answered by the cloud only: $(cat "$ka")"
done
lportA1=$(ka_lport "$kaA")
ctA1=$(ct_flow "$ipA" "$lportA1")
grep -q ESTABLISHED <<<"$ctA1" && [ "$(reply_src "$ctA1")" = "$METADATA_IP:80" ] ||
  fail "before install: want an ESTABLISHED flow $ipA:$lportA1 -> $METADATA_IP:80 without NAT in conntrack, got: ${ctA1:-nothing}"
log "before install: pod $ipA keeps connection $ipA:$lportA1 -> $METADATA_IP:80 (answers: cloud; conntrack: $ctA1)"
log "before install: exempt pod $ipB keeps connection $ipB:$(ka_lport "$kaB") -> $METADATA_IP:80 (answers: cloud)"

# ============================================================================================
# 2. install (and adopt)
natguard_conf >"$W/natguard.json"
t_install=$(now)
out=$(ng install "${DIRS[@]}" --cache-dir "$CACHE" --ready-file "$W/ready" --config "$W/natguard.json" 2>&1) ||
  fail "natguard install: $out"
t_installed=$(now)
# adopt deletes the adopted pod's flows to the metadata API that bypassed the DNAT: the
# pre-install flow is gone, or (its next packet made a new entry) DNATed
ctA1_adopted=$(ct_flow "$ipA" "$lportA1")
log "natguard install ($(awk -v a="$t_install" -v b="$t_installed" 'BEGIN { printf "%.2f", b - a }')s):"
sed 's/^/    /' <<<"$out" >&2
jq -e --arg v 0.4.0 '.cniVersion == $v and ([.plugins[].type] == ["bridge", "portmap", "natguard"])' "$LIST" >/dev/null ||
  fail "conflist after install: $(cat "$LIST")"
[ "$(jq -c '.plugins[:2]' "$LIST")" = "$(jq -c '.plugins' "$W/template.conflist")" ] ||
  fail "install changed the other plugins' entries: $(cat "$LIST")"
cmp -s "$bin" "$CNIBIN/natguard" || fail "$CNIBIN/natguard is not the binary installed"
[ -e "$W/ready" ] || fail "install did not create its ready file"
# the report: one line per attachment (adopt's); the exempt pod adopted without interception
grep -Eq "^adopted +$NET ${podA:0:12}(\.\.\.)? eth0 \($APPS_NS/ng-early\): $ipA\$" <<<"$out" ||
  fail "install's report does not name pod $APPS_NS/ng-early ($ipA) adopted"
grep -Eq "^adopted +$NET ${podB:0:12}(\.\.\.)? eth0 \($EXEMPT_NS/ng-creds\): $ipB \(namespace $EXEMPT_NS is exempt: not intercepted, flows untouched\)\$" <<<"$out" ||
  fail "install's report does not name pod $EXEMPT_NS/ng-creds adopted as exempt"
grep -Eq '^adopt: [1-9][0-9]* attachment\(s\) brought under policy, [0-9]+ skipped, 0 failed(; skipped: .*)?$' <<<"$out" ||
  fail "install's report has no successful adopt summary"
ct_deleted=$(sed -n 's/^conntrack: deleted \([0-9]*\) .*/\1/p' <<<"$out")
[ -n "$ct_deleted" ] || fail "install's report has no conntrack line"
assert_pod_installed "$NET" "$ipA" "$podA"
# adopt does not intercept pods of exempt namespaces: allowed, never in the metadata set
exempt4=$(in_node nft list set inet natguard exempt4 2>/dev/null || true)
redir4=$(in_node nft list set inet natguard "$NET-redir4" 2>/dev/null || true)
grep -Eq "$(ip_re "$ipB")" <<<"$exempt4" ||
  fail "adopt did not put the exempt pod $ipB in exempt4: $(nft_table)"
grep -Eq "$(ip_re "$ipB")" <<<"$redir4" &&
  fail "adopt intercepts the exempt pod $ipB: $(nft_table)"
log "natguard's table holds $ipA (in $NET-redir4, $NET-masq4, owner ${podA:0:12}) and $ipB only in exempt4 and $NET-masq4"

# the long-lived connection: the proxy after at most one reconnect, never the cloud again
ka_wait "$kaA" proxy 3 "$t_installed"
cloud_after=$(ka_count "$kaA" answer=cloud "$t_installed")
reconnects=$(ka_count "$kaA" connect "$t_install")
[ "$cloud_after" = 0 ] || fail "pod $ipA: $cloud_after request(s) sent after install were answered by the cloud: $(cat "$kaA")"
[ "$reconnects" -le 1 ] || fail "pod $ipA: $reconnects reconnects after install (want at most one): $(cat "$kaA")"
lportA2=$(ka_lport "$kaA")
during=$(ka_events "$kaA" "$t_install" "$t_installed" | awk '{ print $2 }' | sort | uniq -c | tr -s ' \n' ' ')
first_err=$(awk -v a="$t_install" '/ error=/ { for (i = 2; i <= NF; i++) if ($i ~ /^(sent|at)=/) t = substr($i, index($i, "=") + 1); if (t + 0 >= a + 0) { print; exit } }' "$kaA")
log "pod $ipA after install: $reconnects reconnect(s), first error: ${first_err:-none}; during install: ${during:-no request}"
ctA2=$(ct_flow "$ipA" "$lportA2")
grep -q ESTABLISHED <<<"$ctA2" && [ "$(reply_src "$ctA2")" = "$NODE_IP:$PROXY_PORT" ] ||
  fail "pod $ipA: the flow from port $lportA2 does not show the DNAT to $NODE_IP:$PROXY_PORT in conntrack: ${ctA2:-nothing}"
log "pod $ipA: connection $ipA:$lportA2 is DNATed (conntrack: $ctA2)"
if [ "$lportA2" != "$lportA1" ]; then
  ctA1_now=$(ct_flow "$ipA" "$lportA1" | tr '\n' ' ')
  log "pod $ipA: the pre-install flow from port $lportA1 in conntrack now: ${ctA1_now:-nothing}"
fi
log "adopt reported $ct_deleted conntrack flow(s) deleted; the pre-install flow right after install: ${ctA1_adopted:-nothing}"
if [ -n "$ctA1_adopted" ] && [ "$(reply_src "$ctA1_adopted")" != "$NODE_IP:$PROXY_PORT" ]; then
  late_fail "adopt left the pre-install flow $ipA:$lportA1 -> $METADATA_IP:80 without DNAT in conntrack (report: deleted $ct_deleted)"
fi
# the exempt pod: same connection, still the cloud
ka_wait "$kaB" cloud 2 "$t_installed"
[ "$(ka_count "$kaB" connect "$t_begin")" = 1 ] && [ -z "$(ka_others "$kaB" cloud "$t_begin")" ] ||
  fail "exempt pod $ipB: its connection did not stay with the cloud: $(cat "$kaB")"
log "exempt pod $ipB: the same connection is still answered by the cloud"
probe "$podA" "pod $APPS_NS/ng-early, adopted" proxy
probe "$podB" "pod $EXEMPT_NS/ng-creds, adopted as exempt (masquerade policy, no interception)" cloud
# idempotent: a second run changes nothing (and its adopt leaves the proxied flow alone)
cp "$LIST" "$W/after-install"
out=$(ng install "${DIRS[@]}" --cache-dir "$CACHE" --ready-file "$W/ready" --config "$W/natguard.json" 2>&1) ||
  fail "second natguard install: $out"
cmp -s "$LIST" "$W/after-install" || fail "a second install changed the list: $(diff "$W/after-install" "$LIST")"
grep -q "natguard is already in $LIST" <<<"$out" || fail "second install does not say natguard is already there: $out"
log "a second install changed nothing"

# ============================================================================================
# 3. --watch restores the entry after the agent rewrites the list
nsenter --net="/run/netns/$NODE" "$bin" install --watch "${DIRS[@]}" --cache-dir "$CACHE" \
  --ready-file "$W/ready" --config "$W/natguard.json" >"$W/watch.log" 2>&1 9>&- &
watch_pid=$!
defer "kill $watch_pid"
cp "$W/template.conflist" "$LIST.agent-tmp" && mv "$LIST.agent-tmp" "$LIST"
t_rewrite=$(now)
back=0
for _ in $(seq 50); do
  if jq -e '[.plugins[].type] | index("natguard") != null' "$LIST" >/dev/null 2>&1; then
    back=1
    break
  fi
  kill -0 $watch_pid 2>/dev/null || break
  sleep 0.1
done
t_back=$(now)
[ "$back" = 1 ] && jq -e '[.plugins[].type] == ["bridge", "portmap", "natguard"]' "$LIST" >/dev/null ||
  fail "install --watch did not restore the entry within 5 s: $(cat "$LIST"); $(cat "$W/watch.log")"
cmp -s "$LIST" "$W/after-install" || fail "the restored list differs from the installed one: $(diff "$W/after-install" "$LIST")"
[ -e "$W/ready" ] || fail "install --watch: no ready file with natguard in the list"
ng install --check "${DIRS[@]}" >/dev/null || fail "install --check: not ready after the restore"
log "install --watch: natguard is back in the rewritten list after $(awk -v a="$t_rewrite" -v b="$t_back" 'BEGIN { printf "%.2f", b - a }')s (polled every 0.1 s)"
# a pod started now is under policy from its ADD
cri_loaded with
runp ng-late "$APPS_NS" podC ipC
assert_pod_installed "$NET" "$ipC" "$podC"
probe "$podC" "pod $APPS_NS/ng-late (after the restore)" proxy

# The window between a rewrite and the re-insert, held open: the watcher is stopped (SIGSTOP),
# the agent rewrites the list, the runtime loads it and a pod starts without natguard's ADD.
kill -STOP $watch_pid
cp "$W/template.conflist" "$LIST.agent-tmp" && mv "$LIST.agent-tmp" "$LIST"
cri_loaded without
runp ng-window "$APPS_NS" podE ipE
set_has "$NET" redir4 "$ipE" && fail "pod $ipE started without natguard in the list, yet is in $NET-redir4"
out=$(cri run "$podE" "$IMAGE_REF" sh -c "$PROBE") || fail "container in pod ng-window: $out"
metaE=$(sed -n 's/^meta=//p' <<<"$out") outE=$(sed -n 's/^out=//p' <<<"$out")
# not intercepted, but the fail-closed reset covers its address (inside a pod prefix natguard
# has seen); natguard's masquerade policy does not apply to it yet
[ "$metaE" != cloud ] && [ "$metaE" != proxy ] ||
  fail "pod $ipE, started in the window: metadata answered by '$metaE', want the fail-closed reset"
[ "$outE" = "$ipE" ] || fail "pod $ipE, started in the window: $REMOTE_OUT saw '$outE', want the pod address"
log "pod $ipE started in the window: metadata -> '$metaE' (fail-closed reset), $REMOTE_OUT sees $outE (natguard's masquerade not applied)"
adopts=$(grep -c 'natguard adopt: done' "$W/watch.log" || true)
kill -CONT $watch_pid
for _ in $(seq 100); do
  [ "$(grep -c 'natguard adopt: done' "$W/watch.log" || true)" -gt "$adopts" ] && break
  sleep 0.1
done
has_entry() { jq -e '[.plugins[].type] == ["bridge", "portmap", "natguard"]' "$LIST" >/dev/null 2>&1; }
has_entry || fail "the resumed watcher did not put natguard back: $(cat "$LIST"); $(cat "$W/watch.log")"
grep -Eq "^adopted +$NET ${podE:0:12}(\.\.\.)? eth0 \($APPS_NS/ng-window\): $ipE\$" "$W/watch.log" ||
  fail "the watcher's adopt after the re-insert did not adopt pod $ipE: $(cat "$W/watch.log")"
assert_pod_installed "$NET" "$ipE" "$podE"
probe "$podE" "pod $APPS_NS/ng-window, adopted by the watcher after the re-insert" proxy
# self-repair: someone deletes natguard's tables; the watcher puts the shared objects and every
# cached pod back with one batch, and new metadata connections are proxied again
in_node nft delete table inet natguard || fail "could not delete natguard's table"
for _ in $(seq 100); do
  grep -q 'self-repair: nft (pid' "$W/watch.log" && in_node nft list table inet natguard >/dev/null 2>&1 && break
  sleep 0.05
done
grep -q 'self-repair: nft (pid' "$W/watch.log" ||
  fail "the watcher did not repair natguard's deleted table within 5 s: $(cat "$W/watch.log")"
assert_pod_installed "$NET" "$ipA" "$podA"
assert_pod_installed "$NET" "$ipE" "$podE"
set_has "" exempt4 "$ipB" || fail "exempt pod $ipB is not back in exempt4 after the repair"
probe "$podE" "pod $APPS_NS/ng-window, after the watcher's repair" proxy
jq -e '.repairs >= 1' "$W/repair.json" >/dev/null || fail "the watcher's record counts no repair: $(cat "$W/repair.json" 2>&1)"
log "$(grep 'self-repair: nft (pid' "$W/watch.log" | tail -n 1 | cut -d' ' -f4-)"
kill -TERM $watch_pid
wait $watch_pid || fail "install --watch exited $? on SIGTERM: $(cat "$W/watch.log")"
has_entry || fail "install --watch without --cleanup-on-exit took the entry out on SIGTERM: $(cat "$LIST")"
# the long-lived connections over all of this
[ "$(ka_count "$kaA" answer=cloud "$t_installed")" = 0 ] && [ "$(ka_count "$kaA" connect "$t_install")" -le 1 ] ||
  fail "pod $ipA: after install, cloud answers or more than one reconnect: $(cat "$kaA")"
[ "$(ka_count "$kaB" connect "$t_begin")" = 1 ] && [ -z "$(ka_others "$kaB" cloud "$t_begin")" ] ||
  fail "exempt pod $ipB: its connection did not stay with the cloud: $(cat "$kaB")"
log "pod $ipA: $(ka_count "$kaA" answer=proxy "$t_installed") proxy answers since install, 0 from the cloud; exempt $ipB: $(ka_count "$kaB" answer=cloud "$t_begin") cloud answers on one connection"

# ============================================================================================
# 4. remove the ordinary pods while natguard is listed: nothing of them left
kill "$kaA_pid"
quiet_flows "$ipA"
for p in "$podA $ipA" "$podC $ipC" "$podE $ipE"; do
  set -- $p
  cri stopp "$1" || fail "StopPodSandbox $1"
  cri rmp "$1" || fail "RemovePodSandbox $1"
  # (a subshell: fail exits it, not the test)
  (assert_pod_gone "$NET" "$2" "$1") || late_fail "removing pod $2 (${1:0:12}) while natguard was listed left state behind (above)"
done

# ============================================================================================
# 4b. install --watch --cleanup-on-exit: SIGTERM takes the entry out (the binary and natguard's
# table stay), and a pod started then gets no ADD from natguard: no interception, no masquerade
# (the guard, which stays, still resets its metadata TCP)
nsenter --net="/run/netns/$NODE" "$bin" install --watch --cleanup-on-exit "${DIRS[@]}" --cache-dir "$CACHE" \
  --ready-file "$W/ready" --config "$W/natguard.json" >"$W/watch-cleanup.log" 2>&1 9>&- &
watch_pid=$!
defer "kill $watch_pid"
for _ in $(seq 100); do
  grep -q 'nothing to write' "$W/watch-cleanup.log" && break
  sleep 0.1
done
grep -q 'nothing to write' "$W/watch-cleanup.log" || fail "install --watch --cleanup-on-exit did not start: $(cat "$W/watch-cleanup.log")"
kill -TERM $watch_pid
wait $watch_pid || fail "install --watch --cleanup-on-exit exited $? on SIGTERM: $(cat "$W/watch-cleanup.log")"
cmp -s "$LIST" "$W/template.conflist" || fail "--cleanup-on-exit left a list other than the original: $(diff "$W/template.conflist" "$LIST")"
[ -e "$W/ready" ] && fail "--cleanup-on-exit left the ready file"
cmp -s "$bin" "$CNIBIN/natguard" || fail "--cleanup-on-exit removed the binary"
nft_table >/dev/null || fail "--cleanup-on-exit removed natguard's table"
cri_loaded without
runp ng-open "$APPS_NS" podF ipF
set_has "$NET" redir4 "$ipF" && fail "pod $ipF started after --cleanup-on-exit, yet is in $NET-redir4"
out=$(cri run "$podF" "$IMAGE_REF" sh -c "$PROBE") || fail "container in pod ng-open: $out"
metaF=$(sed -n 's/^meta=//p' <<<"$out") outF=$(sed -n 's/^out=//p' <<<"$out")
[ "$metaF" != proxy ] && [ "$outF" = "$ipF" ] ||
  fail "pod $ipF, started after --cleanup-on-exit: want no interception and no masquerade by natguard, got: $out"
log "after --cleanup-on-exit: the list is the original, binary and table stay; pod $ipF: metadata -> '$metaF', $REMOTE_OUT sees $outF"
cri stopp "$podF" || fail "StopPodSandbox $podF"
cri rmp "$podF" || fail "RemovePodSandbox $podF"
assert_cni_state_gone "$NET" "$ipF" "$podF"

# ============================================================================================
# 5. uninstall (the exempt pod still runs)
t_uninstall=$(now)
out=$(ng uninstall "${DIRS[@]}" --ready-file "$W/ready" 2>&1) || fail "natguard uninstall: $out"
log "natguard uninstall:"
sed 's/^/    /' <<<"$out" >&2
cmp -s "$LIST" "$W/template.conflist" ||
  fail "uninstall left a list other than the original: $(diff "$W/template.conflist" "$LIST")"
[ -e "$CNIBIN/natguard" ] && fail "uninstall left $CNIBIN/natguard"
[ -e "$W/ready" ] && fail "uninstall left the ready file"
nft_table >/dev/null && fail "uninstall left natguard's table: $(nft_table | head -20)"
log "uninstall: the list is the original byte for byte; binary, ready file and table are gone"
ka_wait "$kaB" cloud 2 "$(now)"
[ "$(ka_count "$kaB" connect "$t_begin")" = 1 ] && [ -z "$(ka_others "$kaB" cloud "$t_begin")" ] ||
  fail "exempt pod $ipB: its connection did not survive uninstall: $(cat "$kaB")"
cri_loaded without
runp ng-after "$APPS_NS" podD ipD
probe "$podD" "pod $APPS_NS/ng-after (after uninstall)" cloud unmasqueraded
kill "$kaB_pid"
quiet_flows "$ipB"
for p in "$podB $ipB" "$podD $ipD"; do
  set -- $p
  cri stopp "$1" || fail "StopPodSandbox $1"
  cri rmp "$1" || fail "RemovePodSandbox $1"
  # natguard is gone: its table and conntrack are not its business any more; the primary
  # plugin's state and libcni's cache must still be cleaned by the runtime
  assert_cni_state_gone "$NET" "$2" "$1"
done
[ -z "$(cri lsp)" ] || fail "pods left: $(cri lsp)"
log "after uninstall the runtime starts and removes pods with the list ($(awk -v a="$t_uninstall" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')s)"
if [ ${#LATE_FAILS[@]} -gt 0 ]; then
  log "every other check passed; recorded failures:"
  printf '    %s\n' "${LATE_FAILS[@]}" >&2
  fail "${#LATE_FAILS[@]} recorded failure(s)"
fi
