#!/bin/bash
# scripts/e2e/ctr.sh: natguard under `ctr run --cni` (containerd 1.6).
#
# ctr's CNI (go-cni + libcni) runs in the ctr client, with fixed paths: the first conflist by
# name in /etc/cni/net.d and plugins from [/opt/cni/bin /usr/lib/cni]. It passes no CNI_ARGS
# and, on DEL (after the task exited), an empty CNI_NETNS. The conflist is bridge +
# host-local + natguard (ctr has no port mappings, so no portmap).
# A container probes the world (see scripts/lib.sh) while it runs; after `ctr run --rm` returns,
# nothing of the pod may remain.
. "$(dirname "$0")/../lib.sh"
e2e_init ctr
need ctr flock /usr/lib/cni/bridge /usr/lib/cni/host-local
NET=ng-e2e-ctr
LIST=/etc/cni/net.d/00-$NET.conflist
NS=ng-e2e # containerd namespace: cgroup parent and CNI_CONTAINERID prefix
CID=ng-e2e-ctr-$$

world_up
bin=$(natguard_bin)
put_file "$bin" /opt/cni/bin/natguard 0755
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.3.0/24)" --argjson ng "$(natguard_conf)" \
  '{cniVersion: "1.0.0", name: $net, plugins: [$br, $ng]}' >"$W/list"
put_file "$W/list" "$LIST"
[ "$(first_conflist /etc/cni/net.d)" = "00-$NET.conflist" ] ||
  fail "ctr would not pick $LIST: the first conflist in /etc/cni/net.d is $(first_conflist /etc/cni/net.d)"
cni_state_cleanup "$NET"
cgroup_track "$NS"
containerd_up ""
ctd_import "$(image_tar "$IMAGE_REF")" "$NS"

mkdir -p "$W/sync"
log "ctr run --rm --cni $CID"
nsenter --net="/run/netns/$NODE" ctr --address "$CTD_SOCK" -n "$NS" run --rm --cni \
  --mount "type=bind,src=$W/sync,dst=/sync,options=rbind:rw" "$IMAGE_REF" "$CID" \
  sh -c "{ $PROBE; } >/sync/probe.tmp; mv /sync/probe.tmp /sync/probe; while [ ! -e /sync/done ]; do sleep 0.1; done" \
  >"$W/ctr.out" 2>&1 9>&- &
ctr_pid=$!
for _ in $(seq 300); do
  [ -e "$W/sync/probe" ] && break
  kill -0 $ctr_pid 2>/dev/null || break
  sleep 0.1
done
[ -e "$W/sync/probe" ] || fail "container produced no probe output: $(cat "$W/ctr.out")"
ip=$(check_probe "$(cat "$W/sync/probe")" "ctr container") || exit 1
# go-cni names the attachment <containerd namespace>-<container id>
assert_pod_installed "$NET" "$ip" "$NS-$CID"
touch "$W/sync/done"
wait $ctr_pid || fail "ctr run exited $?: $(cat "$W/ctr.out")"
assert_pod_gone "$NET" "$ip" "$NS-$CID"
