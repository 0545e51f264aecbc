#!/bin/bash
# scripts/e2e/install-live.sh: `natguard install` on a live node, under containerd's CRI.
#
# The node runs containerd's CRI with the stock paths (first conflist in /etc/cni/net.d,
# plugins in /opt/cni/bin) and a 0.4.0 list of bridge + host-local + portmap, without natguard.
# 1. Two pods start before natguard exists (one in an exempt namespace): their metadata
#    requests reach the cloud, and nothing masquerades them.
# 2. `natguard install` (run in the node netns, so its adopt acts there) copies the binary,
#    appends natguard to the active list, keeps its cniVersion, and adopts the running pods
#    from libcni's cache: the ordinary pod is now proxied and masqueraded; adopt leaves the
#    exempt one alone (it still reaches the cloud). Running install again changes nothing.
# 3. A pod started after install (once CRI has reloaded the list) is under policy from ADD.
# 4. `natguard install --watch`: the primary plugin's agent rewrites the list from its
#    template; natguard's entry comes back.
# 5. The pods removed while natguard is listed: nothing of them left (natguard's table,
#    conntrack, IPAM, the CNI cache).
# 6. `natguard uninstall`: the list loses natguard's entry and nothing else, the binary and the
#    nftables table go, and the runtime still starts and removes pods with the list
#    (metadata -> cloud, no IPAM or cache left).
. "$(dirname "$0")/lib.sh"
e2e_init live
need ctr flock /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap
NET=ng-e2e-live
LIST=/etc/cni/net.d/00-$NET.conflist

world_up
crictl=$(cri_client)
bin=$(natguard_bin)
link_plugin bridge host-local portmap loopback
track_file /opt/cni/bin/natguard
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.8.0/24)" \
  '{cniVersion: "0.4.0", name: $net, plugins: [$br, {type: "portmap", capabilities: {portMappings: true}}]}' \
  >"$W/template.conflist"
put_file "$W/template.conflist" "$LIST"
[ "$(first_conflist /etc/cni/net.d)" = "00-$NET.conflist" ] ||
  fail "CRI would not pick $LIST: the first conflist in /etc/cni/net.d is $(first_conflist /etc/cni/net.d)"
cni_state_cleanup "$NET"
cgroup_track k8s.io
containerd_up "  sandbox_image = \"$PAUSE_REF\"
  restrict_oom_score_adj = true
  [plugins.\"io.containerd.grpc.v1.cri\".cni]
    bin_dir = \"/opt/cni/bin\"
    conf_dir = \"/etc/cni/net.d\"
    max_conf_num = 1"
ctd_import "$(image_tar "$IMAGE_REF")" k8s.io
ctd_import "$(image_tar "$PAUSE_REF" '["/bin/sleep","2147483647"]')" k8s.io
cri() { CRI_SOCK=$CTD_SOCK CRI_LOG_DIR=$W/cri-logs "$crictl" "$@"; }
defer "for p in \$(cri lsp | cut -d' ' -f1); do cri stopp \$p; cri rmp \$p; done"
ng() { in_node "$bin" "$@"; }
defer "in_node '$bin' uninstall"

# probe POD_ID WHO EXPECT_META [EXPECT_OUT]: a container in the pod probes the world
probe() {
  local out
  out=$(cri run "$1" "$IMAGE_REF" sh -c "$PROBE") || fail "container in $2: $out"
  if [ "${4:-}" = unmasqueraded ]; then
    # before natguard: nothing masquerades (bridge ipMasq is off)
    grep -qx "meta=$3" <<<"$out" && [ "$(sed -n 's/^out=//p' <<<"$out")" = "$(sed -n 's/^ip=//p' <<<"$out")" ] ||
      fail "$2: want metadata -> $3 and no masquerade, got: $out"
    log "$2: metadata -> $3, $REMOTE_OUT sees the pod address (not masqueraded)"
  else
    check_probe "$out" "$2" "$3" >/dev/null || exit 1
  fi
}
# cri_loaded WORD: wait (bounded) until CRI has (re)loaded a list that does / does not name natguard
cri_loaded() {
  local i
  for i in $(seq 100); do
    if cri cniconfig | grep -q natguard; then
      [ "$1" = with ] && return 0
    else
      [ "$1" = without ] && return 0
    fi
    sleep 0.1
  done
  fail "CRI did not load the list $1 natguard: $(cri cniconfig)"
}

# 1. pods before natguard
podA=$(cri runp ng-early ng-e2e-apps uid-early) || fail "RunPodSandbox ng-early"
podB=$(cri runp ng-creds "$EXEMPT_NS" uid-creds) || fail "RunPodSandbox ng-creds"
ipA=$(cri ip "$podA") ipB=$(cri ip "$podB")
probe "$podA" "pod ng-e2e-apps/ng-early before install" cloud unmasqueraded
probe "$podB" "pod $EXEMPT_NS/ng-creds before install" cloud unmasqueraded

# 2. install (and adopt)
natguard_conf >"$W/natguard.json"
out=$(ng install --config "$W/natguard.json" 2>&1) || fail "natguard install: $out"
log "natguard install:"
sed 's/^/    /' <<<"$out" >&2
jq -e --arg v 0.4.0 '.cniVersion == $v and ([.plugins[].type] == ["bridge", "portmap", "natguard"])' "$LIST" >/dev/null ||
  fail "conflist after install: $(cat "$LIST")"
[ "$(jq -c '.plugins[:2]' "$LIST")" = "$(jq -c '.plugins' "$W/template.conflist")" ] ||
  fail "install changed the other plugins' entries: $(cat "$LIST")"
cmp -s "$bin" /opt/cni/bin/natguard || fail "/opt/cni/bin/natguard is not the binary installed"
cp "$LIST" "$W/after-install"
out=$(ng install --config "$W/natguard.json" 2>&1) || fail "second natguard install: $out"
cmp -s "$LIST" "$W/after-install" || fail "a second install changed the list: $(diff "$W/after-install" "$LIST")"
assert_pod_installed "$NET" "$ipA" "$podA"
# adopt does nothing to pods of exempt namespaces (issue 3): no entry, traffic unchanged
nft_table | grep -Eq "$(ip_re "$ipB")" && fail "adopt installed entries for the exempt pod $ipB: $(nft_table | grep -E "$(ip_re "$ipB")")"
probe "$podA" "pod ng-e2e-apps/ng-early, adopted" proxy
probe "$podB" "pod $EXEMPT_NS/ng-creds, left alone by adopt" cloud unmasqueraded

# 3. a pod started after install
cri_loaded with
podC=$(cri runp ng-late ng-e2e-apps uid-late) || fail "RunPodSandbox ng-late"
ipC=$(cri ip "$podC")
assert_pod_installed "$NET" "$ipC" "$podC"
probe "$podC" "pod ng-e2e-apps/ng-late (after install)" proxy

# 4. --watch restores the entry after the agent rewrites the list
nsenter --net="/run/netns/$NODE" "$bin" install --watch --no-adopt --config "$W/natguard.json" \
  >"$W/watch.log" 2>&1 9>&- &
watch_pid=$!
defer "kill $watch_pid"
cp "$W/template.conflist" "$LIST.agent-tmp" && mv "$LIST.agent-tmp" "$LIST"
for _ in $(seq 100); do
  jq -e '[.plugins[].type] | index("natguard") != null' "$LIST" >/dev/null 2>&1 && break
  kill -0 $watch_pid 2>/dev/null || break
  sleep 0.1
done
jq -e '[.plugins[].type] == ["bridge", "portmap", "natguard"]' "$LIST" >/dev/null ||
  fail "install --watch did not restore the entry: $(cat "$LIST"); $(cat "$W/watch.log")"
log "install --watch: natguard is back in the rewritten list"
kill -TERM $watch_pid
wait $watch_pid || fail "install --watch exited $? on SIGTERM: $(cat "$W/watch.log")"

# 5. remove the pods natguard knows: nothing of them left
for p in "$podA $ipA" "$podB $ipB" "$podC $ipC"; do
  set -- $p
  cri stopp "$1" || fail "StopPodSandbox $1"
  cri rmp "$1" || fail "RemovePodSandbox $1"
  assert_pod_gone "$NET" "$2" "$1"
done

# 6. uninstall
out=$(ng uninstall 2>&1) || fail "natguard uninstall: $out"
[ "$(jq -cS . "$LIST")" = "$(jq -cS . "$W/template.conflist")" ] ||
  fail "uninstall left a list other than the original: $(cat "$LIST")"
[ -e /opt/cni/bin/natguard ] && fail "uninstall left /opt/cni/bin/natguard"
nft_table >/dev/null && fail "uninstall left natguard's table: $(nft_table | head -20)"
cri_loaded without
podD=$(cri runp ng-after ng-e2e-apps uid-after) || fail "RunPodSandbox after uninstall"
ipD=$(cri ip "$podD")
probe "$podD" "pod ng-e2e-apps/ng-after (after uninstall)" cloud unmasqueraded
cri stopp "$podD" || fail "StopPodSandbox $podD"
cri rmp "$podD" || fail "RemovePodSandbox $podD"
# natguard is gone: its table and conntrack are not its business any more; the primary
# plugin's state and libcni's cache must still be cleaned by the runtime
assert_cni_state_gone "$NET" "$ipD" "$podD"
log "after uninstall the runtime starts and removes pods with the list"
