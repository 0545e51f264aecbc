#!/bin/bash
# scripts/e2e/image-e2e.sh: natguard's image, run the way scripts/daemonset.yaml (deploy/base
# rendered, with the metrics overlay's port) runs it.
#
# 1. scripts/image.sh builds the image twice from the same binary: both archives must be byte
#    for byte the same; the layer holds /natguard alone and the entrypoint is
#    ["/natguard","install","--watch"]. The config's OCI labels name the binary's version and
#    git revision (this checkout's HEAD when the test built the binary), Apache-2.0 and the
#    source (IMAGE_SOURCE, which changes the digest like any other input).
# 2. `podman load` (throwaway storage) and `ctr images import` both name it
#    docker.io/library/natguard:0.2.0, which is what Kubernetes resolves "natguard:0.2.0" to.
# 3. containerd 1.6 (own root, state and socket, started inside the node netns) runs it as the
#    DaemonSet does: host network (the node netns), the node's CNI dirs bind-mounted at
#    /opt/cni/bin, /etc/cni/net.d, /var/lib/cni (read-only), /run/natguard and the pods' netns
#    dirs (read-only; the full translation of the pod template is daemonset-cri.sh), the ConfigMap
#    (laid out as the kubelet does, ..data symlink and all) read-only at /etc/natguard, the
#    DaemonSet's args and the metrics overlay's port, read-only root filesystem, every
#    capability dropped but NET_ADMIN, the runtime's default seccomp profile, no new
#    privileges. The "node's" dirs are directories of this test, never the real ones.
#    natguard must land in the node's conflist with the ConfigMap's entry, its binary in the
#    bin dir, the readiness file must appear and the readiness probe (as the DaemonSet writes
#    it, run with ctr exec) pass; GET /metrics must parse with the Prometheus client's parser;
#    a ConfigMap update must reach the conflist and a bad one be refused; after the conflist is
#    rewritten from its template the entry must come back; SIGTERM must end the container
#    with status 0.
# 4. `natguard uninstall` in the node netns takes everything off again.
. "$(dirname "$0")/../lib.sh"
e2e_init image
need ctr podman tar gzip readelf sha256sum jq flock /usr/bin/python3 curl
NS=ng-e2e-image # containerd namespace
CID=ng-e2e-natguard-$$
REF=docker.io/library/natguard:0.2.0

# --- 1. the image, reproducibly ---------------------------------------------------------------
bin=$(natguard_bin)
NATGUARD_BIN=$bin "$REPO/scripts/image.sh" "$W/image-a.tar" >&2 || fail "image.sh"
NATGUARD_BIN=$bin "$REPO/scripts/image.sh" "$W/image-b.tar" >&2 || fail "image.sh (second build)"
cmp -s "$W/image-a.tar" "$W/image-b.tar" || fail "two builds from the same binary differ"
mkdir -p "$W/layout"
tar -xf "$W/image-a.tar" -C "$W/layout"
manifest=$(jq -r '.manifests[0].digest | sub("sha256:"; "")' "$W/layout/index.json")
config=$(jq -r '.config.digest | sub("sha256:"; "")' "$W/layout/blobs/sha256/$manifest")
layer=$(jq -r '.layers[0].digest | sub("sha256:"; "")' "$W/layout/blobs/sha256/$manifest")
for d in "$manifest" "$config" "$layer"; do
  [ "$(sha256sum <"$W/layout/blobs/sha256/$d" | cut -d' ' -f1)" = "$d" ] || fail "blob $d does not match its digest"
done
files=$(tar -tzvf "$W/layout/blobs/sha256/$layer")
[ "$(wc -l <<<"$files")" = 1 ] && grep -Eq '^-rwxr-xr-x 0/0 .* natguard$' <<<"$files" ||
  fail "the layer should hold /natguard alone (0755, root): $files"
[ "$(jq -c .config.Entrypoint "$W/layout/blobs/sha256/$config")" = '["/natguard","install","--watch"]' ] ||
  fail "entrypoint: $(jq -c .config.Entrypoint "$W/layout/blobs/sha256/$config")"
log "image: reproducible (sha256 $(sha256sum <"$W/image-a.tar" | cut -c1-16)...), /natguard alone, entrypoint install --watch"

# The OCI labels: the binary's version and git revision, the license, the source.
labels=$(jq -cS '.config.Labels' "$W/layout/blobs/sha256/$config")
bin_version=$("$bin" --version) || fail "$bin --version"
crate_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/Cargo.toml" | head -n1)
revision=$(sed -n 's/.*(revision \([^)]*\))$/\1/p' <<<"$bin_version")
[ "$bin_version" = "natguard $crate_version (revision $revision)" ] && grep -Eq '^([0-9a-f]{12}(-dirty)?|unknown)$' <<<"$revision" ||
  fail "natguard --version should name the crate version and a 12-digit git revision: $bin_version"
if [ -z "${NATGUARD_BIN:-}" ]; then
  # natguard_bin built it from this checkout just now: the revision is this checkout's HEAD
  # (or unknown, built outside a git checkout).
  if head=$(git -C "$REPO" rev-parse --short=12 HEAD 2>/dev/null); then
    [ "${revision%-dirty}" = "$head" ] || fail "the binary names revision $revision, the checkout is at $head"
  else
    [ "$revision" = unknown ] || fail "built outside a git checkout, the binary names revision $revision"
  fi
fi
# The source label is Cargo.toml's repository unless IMAGE_SOURCE says otherwise.
source=$(sed -n 's/^repository = "\(.*\)"$/\1/p' "$REPO/Cargo.toml")
[ -n "$source" ] || fail "Cargo.toml names no repository"
want=$(jq -cnS --arg v "$crate_version" --arg r "$revision" --arg s "$source" '{
  "org.opencontainers.image.licenses": "Apache-2.0", "org.opencontainers.image.revision": $r,
  "org.opencontainers.image.source": $s, "org.opencontainers.image.title": "natguard",
  "org.opencontainers.image.version": $v}')
[ "$labels" = "$want" ] || fail "image labels: $labels, want $want"
# The source label is an input like the binary: it changes the config, and so the digest.
IMAGE_SOURCE=https://example.invalid/natguard NATGUARD_BIN=$bin "$REPO/scripts/image.sh" "$W/image-c.tar" >&2 ||
  fail "image.sh with IMAGE_SOURCE"
mkdir -p "$W/layout-c"
tar -xf "$W/image-c.tar" -C "$W/layout-c"
config_c=$(jq -r '.manifests[0].digest | sub("sha256:"; "")' "$W/layout-c/index.json")
config_c=$(jq -r '.config.digest | sub("sha256:"; "")' "$W/layout-c/blobs/sha256/$config_c")
[ "$(jq -r '.config.Labels["org.opencontainers.image.source"]' "$W/layout-c/blobs/sha256/$config_c")" = https://example.invalid/natguard ] ||
  fail "IMAGE_SOURCE did not reach the source label"
[ "$config_c" != "$config" ] || fail "a different source label gave the same config digest"
log "image labels: version $crate_version, revision $revision, licenses Apache-2.0, source from IMAGE_SOURCE"

# --- 2. podman load -------------------------------------------------------------------------
mkdir -p "$W/podman"
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\nrunroot = "%s"\n' "$W/podman/graph" "$W/podman/run" >"$W/podman/storage.conf"
pm() { CONTAINERS_STORAGE_CONF=$W/podman/storage.conf podman --log-level=error "$@"; }
defer "CONTAINERS_STORAGE_CONF='$W/podman/storage.conf' podman rmi -a -f"
out=$(pm load -i "$W/image-a.tar" 2>&1) || fail "podman load: $out"
grep -q "Loaded image: $REF" <<<"$out" || fail "podman load named it otherwise: $out"
[ "$(pm image inspect natguard:0.2.0 --format '{{.RepoTags}}')" = "[$REF]" ] ||
  fail "podman does not find natguard:0.2.0 as $REF"
log "podman load: $REF"

# --- 3. under containerd, as the DaemonSet runs it --------------------------------------------
# What is run below must be what scripts/daemonset.yaml (deploy/base rendered) asks for, plus
# the metrics overlay's flags; read with PyYAML into one JSON line per fact.
ds=$REPO/scripts/daemonset.yaml
facts=$(/usr/bin/python3 - "$ds" <<'PY'
import json, sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
ds = next(d for d in docs if d["kind"] == "DaemonSet")
cm = next(d for d in docs if d["kind"] == "ConfigMap")
pod = ds["spec"]["template"]["spec"]
c = pod["containers"][0]
vols = {v["name"]: v for v in pod["volumes"]}
mounts = sorted(
    [m["mountPath"], "configMap" if "configMap" in vols[m["name"]] else "hostPath", bool(m.get("readOnly"))]
    for m in c["volumeMounts"])
print(json.dumps({
    "image": c["image"], "hostNetwork": pod["hostNetwork"], "args": c["args"],
    "command": c.get("command"), "probe": c["readinessProbe"]["exec"]["command"],
    "securityContext": c["securityContext"], "mounts": mounts,
    "nodeSelector": pod["nodeSelector"], "config": cm["data"]["natguard.json"]}))
PY
) || fail "reading $ds"
fact() { jq -c "$1" <<<"$facts"; }
[ "$(fact .image)" = '"natguard:0.2.0"' ] || fail "image $(fact .image)"
[ "$(fact .hostNetwork)" = true ] || fail "hostNetwork $(fact .hostNetwork)"
[ "$(fact .command)" = null ] || fail "the DaemonSet replaces the entrypoint: $(fact .command)"
[ "$(fact .args)" = '["--config","/etc/natguard/natguard.json"]' ] || fail "args $(fact .args)"
[ "$(fact .probe)" = '["/natguard","install","--check","--health","--config","/etc/natguard/natguard.json"]' ] ||
  fail "probe $(fact .probe)"
[ "$(fact '.securityContext | {capabilities, readOnlyRootFilesystem, allowPrivilegeEscalation, privileged, seccompProfile}')" = \
  '{"capabilities":{"add":["NET_ADMIN"],"drop":["ALL"]},"readOnlyRootFilesystem":true,"allowPrivilegeEscalation":false,"privileged":false,"seccompProfile":{"type":"RuntimeDefault"}}' ] ||
  fail "securityContext $(fact .securityContext)"
[ "$(fact .mounts)" = '[["/etc/cni/net.d","hostPath",false],["/etc/natguard","configMap",true],["/opt/cni/bin","hostPath",false],["/run/natguard","hostPath",false],["/run/netns","hostPath",true],["/var/lib/cni","hostPath",true],["/var/run/netns","hostPath",true]]' ] ||
  fail "scripts/daemonset.yaml mounts $(fact .mounts); this test mounts those below"
[ "$(fact .nodeSelector)" = '{"kubernetes.io/arch":"amd64","kubernetes.io/os":"linux"}' ] ||
  fail "nodeSelector $(fact .nodeSelector)"
ip netns add "$NODE" || fail "ip netns add $NODE"
defer "ip netns del '$NODE'"
ip -n "$NODE" link set lo up
host=$W/node # the node's filesystem, as far as the DaemonSet mounts it
mkdir -p "$host/opt/cni/bin" "$host/etc/cni/net.d" "$host/var/lib/cni/results" "$host/run/natguard" "$host/run/netns"
# The ConfigMap volume as the kubelet lays it out: natguard.json -> ..data/natguard.json,
# ..data -> a timestamped directory; an update swaps ..data.
cm=$W/configmap
cm_version=0
cm_update() { # TEXT: what the kubelet does when the ConfigMap changes
  cm_version=$((cm_version + 1))
  mkdir -p "$cm/..v$cm_version"
  printf '%s' "$1" >"$cm/..v$cm_version/natguard.json"
  ln -sfn "..v$cm_version" "$cm/..data_tmp"
  mv -T "$cm/..data_tmp" "$cm/..data"
}
mkdir -p "$cm"
cm_update "$(jq -r .config <<<"$facts")"
ln -s ..data/natguard.json "$cm/natguard.json"
METRICS_PORT=9118
LIST=$host/etc/cni/net.d/10-bridge.conflist
jq -n --argjson br "$(bridge_conf cni0 10.244.9.0/24)" \
  '{cniVersion: "0.4.0", name: "ng-e2e-image", plugins: [$br, {type: "portmap", capabilities: {portMappings: true}}]}' \
  >"$W/template.conflist"
cp "$W/template.conflist" "$LIST"

cgroup_track "$NS"
containerd_up ""
ctd_import "$W/image-a.tar" "$NS"
defer "ctd namespaces rm $NS"
defer "ctd -n $NS images rm $REF"
ctd -n "$NS" images ls -q | grep -x "$REF" >/dev/null || fail "ctr import did not name the image $REF: $(ctd -n "$NS" images ls -q)"
log "ctr images import: $REF"

has_natguard() { jq -e '[.plugins[] | select(.type == "natguard")] | length == 1' "$LIST" >/dev/null 2>&1; }
# wait_until DESCRIPTION CMD...: bounded wait (the bound only stops a broken build from hanging)
wait_until() {
  local what=$1 i
  shift
  for i in $(seq 300); do
    "$@" && return 0
    kill -0 "$ctr_pid" 2>/dev/null || fail "the container exited while waiting for $what: $(cat "$W/ctr.out")"
    sleep 0.1
  done
  fail "gave up waiting for $what; container output: $(cat "$W/ctr.out")"
}

caps=()
for c in CHOWN DAC_OVERRIDE FSETID FOWNER MKNOD NET_RAW SETGID SETUID SETFCAP SETPCAP NET_BIND_SERVICE SYS_CHROOT KILL AUDIT_WRITE; do
  caps+=(--cap-drop "CAP_$c")
done
mount_opt() { echo "type=bind,src=$1,dst=$2,options=rbind:$3"; }
# ctr's arguments replace the entrypoint (Kubernetes' args are appended to it): the entrypoint
# is given whole, then the DaemonSet's args and the metrics overlay's (on the node's loopback).
entrypoint=$(jq -r '.config.Entrypoint | join(" ")' "$W/layout/blobs/sha256/$config")
read -r -a run_args <<<"$entrypoint $(jq -r '.args | join(" ")' <<<"$facts") --metrics-port=$METRICS_PORT --metrics-address=127.0.0.1"
log "ctr run $REF ${run_args[*]} (host network of $NODE, hostPath mounts, the ConfigMap, NET_ADMIN only, read-only rootfs)"
nsenter --net="/run/netns/$NODE" ctr --address "$CTD_SOCK" -n "$NS" run --net-host --read-only --seccomp \
  "${caps[@]}" --cap-add CAP_NET_ADMIN \
  --mount "$(mount_opt "$host/opt/cni/bin" /opt/cni/bin rw)" \
  --mount "$(mount_opt "$host/etc/cni/net.d" /etc/cni/net.d rw)" \
  --mount "$(mount_opt "$host/var/lib/cni" /var/lib/cni ro)" \
  --mount "$(mount_opt "$host/run/natguard" /run/natguard rw)" \
  --mount "$(mount_opt "$cm" /etc/natguard ro)" \
  --mount "$(mount_opt "$host/run/netns" /run/netns ro)" \
  --mount "$(mount_opt "$host/run/netns" /var/run/netns ro)" \
  "$REF" "$CID" "${run_args[@]}" \
  >"$W/ctr.out" 2>&1 9>&- &
ctr_pid=$!
defer "kill $ctr_pid"

wait_until "natguard in the node's conflist" has_natguard
wait_until "the readiness file" test -e "$host/run/natguard/ready"
want=$(jq -c --argjson c "$(jq -r .config <<<"$facts")" -n '{type: "natguard", capabilities: {"io.kubernetes.cri.pod-annotations": true}} + ($c | del(.type))')
[ "$(jq -c '.plugins[-1]' "$LIST")" = "$want" ] ||
  fail "natguard's entry: $(jq -c '.plugins[-1]' "$LIST"), want the ConfigMap's $want"
[ "$(jq -c '[.plugins[].type]' "$LIST")" = '["bridge","portmap","natguard"]' ] || fail "list: $(cat "$LIST")"
[ "$(jq -r .cniVersion "$LIST")" = 0.4.0 ] || fail "cniVersion changed: $(cat "$LIST")"
cmp -s "$bin" "$host/opt/cni/bin/natguard" || fail "the bin dir does not hold the image's binary"
[ "$(stat -c %a "$host/opt/cni/bin/natguard")" = 755 ] || fail "binary mode $(stat -c %a "$host/opt/cni/bin/natguard")"
log "natguard is in the node's conflist, its binary in the bin dir, ready file written"

# The container's process has NET_ADMIN and nothing else, and runs in the node netns.
pid=$(ctd -n "$NS" tasks ls | awk -v c="$CID" '$1 == c { print $2 }')
[ -n "$pid" ] || fail "no task for $CID"
capeff=$(awk '/^CapEff:/ { print $2 }' "/proc/$pid/status")
[ "$capeff" = 0000000000001000 ] || fail "container capabilities CapEff=$capeff, want NET_ADMIN only (0000000000001000)"
[ "$(stat -L -c %i "/proc/$pid/ns/net")" = "$(stat -L -c %i "/run/netns/$NODE")" ] || fail "the container is not on the node's network"
log "container: CapEff=$capeff (NET_ADMIN), host network of $NODE"

# The readiness probe of the DaemonSet.
read -r -a probe_cmd <<<"$(jq -r '.probe | join(" ")' <<<"$facts")"
probe=$(ctd -n "$NS" tasks exec --exec-id probe1 "$CID" "${probe_cmd[@]}" 2>&1) ||
  fail "readiness probe failed: $probe"
log "readiness probe: $probe"

# The scrape endpoint, read by the Prometheus client's parser.
scrape=$(in_node curl -fsS --max-time 10 "http://127.0.0.1:$METRICS_PORT/metrics") || fail "scraping :$METRICS_PORT/metrics"
up=$(/usr/bin/python3 -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
for f in text_string_to_metric_families(sys.stdin.read()):
    for s in f.samples:
        if s.name == "natguard_up":
            print(int(s.value))
' <<<"$scrape") || fail "the Prometheus parser rejects the scrape: $scrape"
[ "$up" = 1 ] || fail "natguard_up is '$up' in the scrape"
code=$(in_node curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$METRICS_PORT/") || fail "curl /"
[ "$code" = 404 ] || fail "GET / answered $code"
log "scrape endpoint: GET /metrics parsed (natguard_up 1), GET / is 404"

# A ConfigMap update: the watcher puts the new entry into the list, and the probe follows.
cm_update '{"metadata":{"mode":"deny"}}'
entry_mode() { [ "$(jq -r '.plugins[-1].metadata.mode // empty' "$LIST")" = "$1" ]; }
wait_until "the ConfigMap's new entry in the conflist" entry_mode deny
probe=$(ctd -n "$NS" tasks exec --exec-id probe2 "$CID" "${probe_cmd[@]}" 2>&1) ||
  fail "readiness probe after the update failed: $probe"
cm_update '{"metadata":{"mode":"nonsense"}}'
for _ in $(seq 50); do grep -q 'keeping natguard.s entry as it is' "$W/ctr.out" && break; sleep 0.1; done
grep -q 'keeping natguard.s entry as it is' "$W/ctr.out" || fail "a bad config was not reported: $(cat "$W/ctr.out")"
entry_mode deny || fail "a bad config changed the entry: $(jq -c '.plugins[-1]' "$LIST")"
ctd -n "$NS" tasks exec --exec-id probe3 "$CID" "${probe_cmd[@]}" >/dev/null 2>&1 &&
  fail "the probe passed on a config the watcher refused"
cm_update "$(jq -r .config <<<"$facts")"
wait_until "the ConfigMap's first entry back" entry_mode proxy
log "ConfigMap updates: a new entry applied, a bad one refused and reported, the probe follows"

# The primary plugin's agent rewrites its list from the template: natguard comes back.
cp "$W/template.conflist" "$LIST.agent-tmp"
mv "$LIST.agent-tmp" "$LIST"
wait_until "natguard back in the rewritten conflist" has_natguard
log "after a rewrite from the template, natguard is back: $(jq -c '[.plugins[].type]' "$LIST")"

# SIGTERM ends it cleanly.
ctd -n "$NS" tasks kill -s SIGTERM "$CID" || fail "ctr tasks kill"
for _ in $(seq 300); do kill -0 "$ctr_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$ctr_pid" 2>/dev/null && fail "the container ignored SIGTERM"
wait "$ctr_pid"
rc=$?
[ "$rc" = 0 ] || fail "the container exited $rc after SIGTERM: $(cat "$W/ctr.out")"
ctd -n "$NS" containers rm "$CID" >/dev/null 2>&1
log "SIGTERM: exit 0; container log:"
sed 's/^/    /' "$W/ctr.out" >&2

# --- 4. uninstall on the node ------------------------------------------------------------------
# The binary the container put into the bin dir removes natguard again: the entry (the list is
# byte for byte the agent's template again), the binary, the readiness file and the nftables
# table (created here if adopt found nothing to put in it), in the node netns.
in_node nft list table inet natguard >/dev/null 2>&1 || in_node nft add table inet natguard || fail "nft add table"
cp "$host/opt/cni/bin/natguard" "$W/natguard-installed"
out=$(in_node "$W/natguard-installed" uninstall --netconf-dir "$host/etc/cni/net.d" \
  --cni-bin-dir "$host/opt/cni/bin" --ready-file "$host/run/natguard/ready" 2>&1) || fail "uninstall: $out"
cmp -s "$LIST" "$W/template.conflist" || fail "after uninstall the list differs from the template: $(cat "$LIST")"
[ -e "$host/opt/cni/bin/natguard" ] && fail "uninstall left the binary"
[ -e "$host/run/natguard/ready" ] && fail "uninstall left the readiness file"
in_node nft list table inet natguard >/dev/null 2>&1 && fail "uninstall left natguard's nftables table"
log "uninstall: list back to the template, binary, readiness file and nftables table gone"
