#!/bin/bash
# scripts/e2e/podman.sh: natguard under rootful podman 4.3 with its CNI network backend.
#
# Podman runs inside the node netns (nsenter --net) and runs the CNI plugins there; its
# storage and run state live under the test's work dir, its network conflists in the real
# /etc/cni/net.d. `podman network create` writes the list (cniVersion 0.4.0: bridge with
# ipMasq, portmap, firewall, tuning); the test appends natguard. Podman validates every
# network on every command (VERSION of each plugin, with no config but cniVersion) and passes
# CNI_ARGS with only K8S_POD_NAME=<container name> (no namespace: a container named like an
# exempt namespace is still intercepted). The bridge's own iptables MASQUERADE must not
# override natguard's non-masquerade CIDRs.
. "$(dirname "$0")/../lib.sh"
e2e_init podman
need podman runc conmon flock /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap \
  /usr/lib/cni/firewall /usr/lib/cni/tuning
NET=ng-e2e-pod
LIST=/etc/cni/net.d/$NET.conflist

world_up
bin=$(natguard_bin)
mkdir -p "$W/cni-bin"
install -m 0755 "$bin" "$W/cni-bin/natguard"
# This sandbox may lack CAP_SYS_RESOURCE: podman's default RLIMIT_NOFILE (1048576) and the
# caller's RLIMIT_NPROC would make runc's setrlimit fail. crun 1.8 rejects hybrid cgroup
# layouts: use runc.
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
cat >"$W/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]
[network]
network_backend = "cni"
cni_plugin_dirs = ["/usr/lib/cni", "$W/cni-bin"]
network_config_dir = "/etc/cni/net.d"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$W/podman-events.log"
runtime = "runc"
tmp_dir = "$W/podman-tmp"
CONF
cat >"$W/storage.conf" <<CONF
[storage]
driver = "overlay"
runroot = "$W/podman-run"
graphroot = "$W/podman-root"
CONF
P() { in_node env CONTAINERS_CONF="$W/containers.conf" CONTAINERS_STORAGE_CONF="$W/storage.conf" podman "$@"; }
[ -e /etc/cni/net.d/cni.lock ] || defer "rm -f /etc/cni/net.d/cni.lock"
[ -e /dev/shm/libpod_lock ] || defer "rm -f /dev/shm/libpod_lock"
# containers/image keeps a blob-info cache in /var/lib/containers/cache whatever storage.conf says
[ -e /var/lib/containers ] || defer "rm -rf /var/lib/containers"
cgroup_track libpod_parent
cni_state_cleanup "$NET"
umount_under "$W"
defer "P rm -af -t 0"

P load -q -i "$(image_tar "$IMAGE_REF")" >/dev/null || fail "podman load"
P image exists "$IMAGE_REF" || fail "podman load did not name the image $IMAGE_REF: $(P images --format '{{.Repository}}:{{.Tag}}')"
[ -e "$LIST" ] && fail "$LIST exists already"
defer "rm -f '$LIST'"
P network create --subnet 10.244.5.0/24 "$NET" >/dev/null || fail "podman network create"
jq --argjson ng "$(natguard_conf)" '.plugins += [$ng]' "$LIST" >"$W/list" && cat "$W/list" >"$LIST" ||
  fail "append natguard to $LIST"
log "$LIST: cniVersion $(jq -r .cniVersion "$LIST"), plugins $(jq -c '[.plugins[].type]' "$LIST")"

# 1. a long-running container, probed with podman exec; removed with podman rm
cid=$(P run -d --name "$EXEMPT_NS" --network "$NET" "$IMAGE_REF" sleep 600) || fail "podman run -d: $cid"
out=$(P exec "$cid" sh -c "$PROBE") || fail "podman exec: $out"
ip=$(check_probe "$out" "container $EXEMPT_NS (K8S_POD_NAME only)") || exit 1
assert_pod_installed "$NET" "$ip" "$cid"
P rm -f -t 0 "$cid" >/dev/null || fail "podman rm"
assert_pod_gone "$NET" "$ip" "$cid"

# 2. podman run --rm: torn down by podman's own cleanup when the container exits
out=$(P run --rm --cidfile "$W/cid" --network "$NET" "$IMAGE_REF" sh -c "$PROBE") || fail "podman run --rm: $out"
ip=$(check_probe "$out" "podman run --rm") || exit 1
assert_pod_gone "$NET" "$ip" "$(cat "$W/cid")"
