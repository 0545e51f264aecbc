#!/bin/bash
# scripts/e2e/containerd-cri.sh: natguard under containerd 1.6's CRI plugin, driven through
# the CRI gRPC API as kubelet drives it (tests/cri-client).
#
# The CRI plugin runs CNI from the containerd daemon, so containerd runs in the node netns.
# It reads the first conflist in /etc/cni/net.d (bridge + host-local + portmap + natguard,
# cniVersion 0.3.1 as Calico and Flannel write it: no prevResult on DEL) and passes
# kubelet's CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME, ... in random order). It calls DEL at
# StopPodSandbox and again, with an empty CNI_NETNS, at RemovePodSandbox.
# Pods: one in an ordinary namespace (metadata -> proxy) and one in an exempt namespace
# (metadata -> the cloud); both keep their address towards 10.0.0.0/8 and are masqueraded
# elsewhere; after stopp + rmp nothing of either remains. Then pod annotations, which CRI
# passes in runtimeConfig because natguard's entry declares io.kubernetes.cri.pod-annotations:
# natguard.io/metadata=deny in the ordinary namespace (metadata -> reset) and
# natguard.io/metadata=proxy in the exempt one (metadata -> proxy, not the cloud); and a
# misspelt natguard annotation makes RunPodSandbox fail with natguard's code-7 message.
. "$(dirname "$0")/../lib.sh"
e2e_init cri
need ctr flock /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap
NET=ng-e2e-cri
LIST=/etc/cni/net.d/00-$NET.conflist

world_up
crictl=$(cri_client)
bin=$(natguard_bin)
# CRI 1.6 takes a single bin_dir: Debian's plugins and natguard side by side
mkdir -p "$W/cni-bin"
ln -s /usr/lib/cni/* "$W/cni-bin/"
install -m 0755 "$bin" "$W/cni-bin/natguard"
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.4.0/24)" --argjson ng "$(natguard_conf)" \
  '{cniVersion: "0.3.1", name: $net,
    plugins: [$br, {type: "portmap", capabilities: {portMappings: true}}, $ng]}' >"$W/list"
put_file "$W/list" "$LIST"
[ "$(first_conflist /etc/cni/net.d)" = "00-$NET.conflist" ] ||
  fail "CRI would not pick $LIST: the first conflist in /etc/cni/net.d is $(first_conflist /etc/cni/net.d)"
cni_state_cleanup "$NET"
cgroup_track k8s.io
containerd_up "  sandbox_image = \"$PAUSE_REF\"
  # no CAP_SYS_RESOURCE in some CI sandboxes: runc could not lower the sandbox's oom_score_adj
  restrict_oom_score_adj = true
  [plugins.\"io.containerd.grpc.v1.cri\".cni]
    bin_dir = \"$W/cni-bin\"
    conf_dir = \"/etc/cni/net.d\"
    max_conf_num = 1"
ctd_import "$(image_tar "$IMAGE_REF")" k8s.io
ctd_import "$(image_tar "$PAUSE_REF" '["/bin/sleep","2147483647"]')" k8s.io
cri() { CRI_SOCK=$CTD_SOCK CRI_LOG_DIR=$W/cri-logs "$crictl" "$@"; }
# the last cleanup of CRI: remove the pods still there (stopp + rmp run CNI DEL)
defer "for p in \$(cri lsp | cut -d' ' -f1); do cri stopp \$p; cri rmp \$p; done"
log "$(cri version)"

# run_pod NAME NAMESPACE EXPECT_META [exempt]: RunPodSandbox, probe from a container,
# check natguard's entries; prints "SANDBOX_ID IP"
run_pod() {
  local name=$1 ns=$2 want=$3 exempt=${4:-} id ip out
  id=$(cri runp "$name" "$ns" "uid-$name" 18080:80 "${ANNOTATIONS[@]}") || fail "RunPodSandbox $ns/$name"
  ip=$(cri ip "$id") || fail "PodSandboxStatus $id"
  out=$(cri run "$id" "$IMAGE_REF" sh -c "$PROBE") || fail "container in $ns/$name: $out"
  [ "$(check_probe "$out" "pod $ns/$name" "$want")" = "$ip" ] || fail "pod $ns/$name: probe address differs from CRI's $ip"
  assert_pod_installed "$NET" "$ip" "$id" $exempt
  echo "$id $ip"
}
ANNOTATIONS=()
read -r pod1 ip1 < <(run_pod ng-web ng-e2e-apps proxy) && [ -n "${ip1:-}" ] || exit 1
read -r pod2 ip2 < <(run_pod ng-creds "$EXEMPT_NS" cloud exempt) && [ -n "${ip2:-}" ] || exit 1
# annotated pods: stricter than their network and namespace, never looser
ANNOTATIONS=(natguard.io/metadata=deny io.kubernetes.other=x)
read -r pod3 ip3 < <(run_pod ng-denied ng-e2e-apps reset deny) && [ -n "${ip3:-}" ] || exit 1
ANNOTATIONS=(natguard.io/metadata=proxy)
read -r pod4 ip4 < <(run_pod ng-sysproxy "$EXEMPT_NS" proxy) && [ -n "${ip4:-}" ] || exit 1
status=$(in_node "$bin" status) || fail "natguard status: $status"
grep -q "metadata policy: deny (the pod's annotation natguard.io/metadata)" <<<"$status" ||
  fail "status does not show the annotated deny: $status"
grep -q "metadata policy: proxy (the pod's annotation natguard.io/metadata)" <<<"$status" ||
  fail "status does not show the annotated proxy: $status"
log "status names each pod's policy and its source"
# a misspelt natguard annotation: the sandbox is refused with natguard's message
if out=$(cri runp ng-typo ng-e2e-apps uid-ng-typo natguard.io/metdata=deny 2>&1); then
  fail "RunPodSandbox with natguard.io/metdata was accepted: $out"
fi
grep -q 'natguard.io/metdata' <<<"$out" || fail "RunPodSandbox failed without naming the annotation: $out"
log "a misspelt natguard annotation is refused: $(tr '\n' ' ' <<<"$out" | cut -c1-200)"

for p in "$pod1 $ip1" "$pod2 $ip2" "$pod3 $ip3" "$pod4 $ip4"; do
  set -- $p
  cri stopp "$1" || fail "StopPodSandbox $1"
  cri rmp "$1" || fail "RemovePodSandbox $1"
  assert_pod_gone "$NET" "$2" "$1"
done
