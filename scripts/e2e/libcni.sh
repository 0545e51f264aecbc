#!/bin/bash
# scripts/e2e/libcni.sh: natguard under libcni's list semantics (Debian's libcni 1.1.2, the
# library inside podman 4 and containerd 1.6), driven by tests/cnitool in the node netns.
#
# List (cniVersion 1.0.0): bridge + host-local, portmap, natguard, tuning. tuning after
# natguard proves that natguard's ADD output is a valid prevResult for the next plugin.
# libcni runs ADD in order, threading prevResult; caches the final result in
# /var/lib/cni/results; feeds the cached result to CHECK and DEL; runs DEL in reverse.
# Checks: traffic of an ordinary and an exempt pod; the cached result is the bridge's result
# passed through natguard unchanged; CHECK passes, and fails once natguard's kernel state of
# the pod is gone; DEL with an empty netns (a runtime's late DEL), DEL again (no cache left:
# no prevResult), and nothing left behind. Pod annotations through libcni's runtimeConfig
# (CAP_ARGS, filtered by natguard's declared io.kubernetes.cri.pod-annotations capability):
# natguard.io/metadata=deny resets an ordinary pod's metadata, natguard.io/metadata=proxy
# intercepts a pod of the exempt namespace, and CHECK passes for both.
. "$(dirname "$0")/../lib.sh"
e2e_init libcni
need flock /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap /usr/lib/cni/tuning
NET=ng-e2e-libcni

world_up
cnitool=$(cnitool_bin)
bin=$(natguard_bin)
mkdir -p "$W/cni-bin"
install -m 0755 "$bin" "$W/cni-bin/natguard"
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.6.0/24)" --argjson ng "$(natguard_conf)" \
  '{cniVersion: "1.0.0", name: $net,
    plugins: [$br, {type: "portmap", capabilities: {portMappings: true}}, $ng, {type: "tuning"}]}' \
  >"$W/$NET.conflist"
cni_state_cleanup "$NET"
# lib: cnitool in the node netns with Debian's plugins + natguard
lib() { in_node env CNI_PATH="/usr/lib/cni:$W/cni-bin" "$cnitool" "$@"; }
args() { echo "IgnoreUnknown=1;K8S_POD_UID=uid-$2;K8S_POD_NAME=$2;K8S_POD_NAMESPACE=$1"; }

caps=$(lib validate "$W/$NET.conflist") || fail "libcni ValidateNetworkList (VERSION of each plugin)"
log "ValidateNetworkList: every plugin answers VERSION for 1.0.0 (capabilities: $caps)"

bare_pod pod1 pod1
bare_pod pod2 pod2
# the runtime's last cleanup: DEL whatever is still attached
defer "CNI_ARGS='$(args ng-e2e-apps web)' lib del '$W/$NET.conflist' '' lc1-ng-e2e"
defer "CNI_ARGS='$(args "$EXEMPT_NS" creds)' lib del '$W/$NET.conflist' '' lc2-ng-e2e"

res1=$(CNI_ARGS=$(args ng-e2e-apps web) CAP_ARGS='{"portMappings":[{"hostPort":18081,"containerPort":80,"protocol":"tcp"}]}' \
  lib add "$W/$NET.conflist" "$pod1" lc1-ng-e2e) || fail "ADD pod1: $res1"
res2=$(CNI_ARGS=$(args "$EXEMPT_NS" creds) lib add "$W/$NET.conflist" "$pod2" lc2-ng-e2e) || fail "ADD pod2: $res2"
ip1=$(jq -r '.ips[0].address | sub("/.*"; "")' <<<"$res1")
ip2=$(jq -r '.ips[0].address | sub("/.*"; "")' <<<"$res2")
# the list's result is the bridge's result threaded through portmap, natguard and tuning
jq -e '.cniVersion == "1.0.0" and ([.interfaces[].name] | index("eth0") != null and index("cni0") != null)
       and (.ips | length == 1) and .ips[0].gateway == "10.244.6.1" and (.routes | length == 1)' <<<"$res1" >/dev/null ||
  fail "ADD result is not the bridge's result passed through: $res1"
[ "$(CNI_ARGS=$(args ng-e2e-apps web) lib cached "$W/$NET.conflist" lc1-ng-e2e | jq -cS .)" = "$(jq -cS . <<<"$res1")" ] ||
  fail "libcni's cached result differs from the ADD result"

[ "$(check_probe "$(probe_in "$pod1")" "pod1 ng-e2e-apps/web")" = "$ip1" ] || exit 1
[ "$(check_probe "$(probe_in "$pod2")" "pod2 $EXEMPT_NS/creds" cloud)" = "$ip2" ] || exit 1
assert_pod_installed "$NET" "$ip1" lc1-ng-e2e
assert_pod_installed "$NET" "$ip2" lc2-ng-e2e exempt

# pod annotations, as containerd and CRI-O pass them (libcni's runtimeConfig from CAP_ARGS)
bare_pod pod3 pod3
bare_pod pod4 pod4
bare_pod pod5 pod5
defer "CNI_ARGS='$(args ng-e2e-apps denied)' lib del '$W/$NET.conflist' '' lc3-ng-e2e"
defer "CNI_ARGS='$(args "$EXEMPT_NS" sysproxy)' lib del '$W/$NET.conflist' '' lc4-ng-e2e"
ann() { echo "{\"io.kubernetes.cri.pod-annotations\":{\"natguard.io/metadata\":\"$1\",\"other.io/x\":\"y\"}}"; }
res3=$(CNI_ARGS=$(args ng-e2e-apps denied) CAP_ARGS=$(ann deny) lib add "$W/$NET.conflist" "$pod3" lc3-ng-e2e) ||
  fail "ADD pod3 (natguard.io/metadata=deny): $res3"
res4=$(CNI_ARGS=$(args "$EXEMPT_NS" sysproxy) CAP_ARGS=$(ann proxy) lib add "$W/$NET.conflist" "$pod4" lc4-ng-e2e) ||
  fail "ADD pod4 (natguard.io/metadata=proxy): $res4"
ip3=$(jq -r '.ips[0].address | sub("/.*"; "")' <<<"$res3")
ip4=$(jq -r '.ips[0].address | sub("/.*"; "")' <<<"$res4")
[ "$(check_probe "$(probe_in "$pod3")" "pod3 ng-e2e-apps/denied (annotated deny)" reset)" = "$ip3" ] || exit 1
[ "$(check_probe "$(probe_in "$pod4")" "pod4 $EXEMPT_NS/sysproxy (annotated proxy)" proxy)" = "$ip4" ] || exit 1
assert_pod_installed "$NET" "$ip3" lc3-ng-e2e deny
assert_pod_installed "$NET" "$ip4" lc4-ng-e2e
CNI_ARGS=$(args ng-e2e-apps denied) CAP_ARGS=$(ann deny) lib check "$W/$NET.conflist" "$pod3" lc3-ng-e2e ||
  fail "CHECK of the annotated deny pod failed"
if out=$(CNI_ARGS=$(args ng-e2e-apps typo) CAP_ARGS=$(ann Deny) lib add "$W/$NET.conflist" "$pod5" lc5-ng-e2e 2>&1); then
  fail "ADD with natguard.io/metadata=Deny was accepted: $out"
fi
grep -q '"Deny" is not one of' <<<"$out" || fail "ADD with an unknown value did not name it: $out"
CNI_ARGS=$(args ng-e2e-apps typo) lib del "$W/$NET.conflist" "$pod5" lc5-ng-e2e || fail "DEL of the refused ADD"
CNI_ARGS=$(args ng-e2e-apps denied) lib del "$W/$NET.conflist" "$pod3" lc3-ng-e2e || fail "DEL pod3"
CNI_ARGS=$(args "$EXEMPT_NS" sysproxy) lib del "$W/$NET.conflist" "$pod4" lc4-ng-e2e || fail "DEL pod4"
assert_pod_gone "$NET" "$ip3" lc3-ng-e2e
assert_pod_gone "$NET" "$ip4" lc4-ng-e2e
log "annotations via libcni's runtimeConfig: deny -> reset, proxy in $EXEMPT_NS -> proxy, a bad value refused"

# CHECK gets the cached result as prevResult (portMappings left out: portmap 1.1.1's CHECK
# fails for IPv4-only pods with mappings, containernetworking/plugins#819)
CNI_ARGS=$(args "$EXEMPT_NS" creds) lib check "$W/$NET.conflist" "$pod2" lc2-ng-e2e ||
  fail "CHECK of a healthy pod failed"
in_node nft delete element inet natguard "$NET-masq4" "{ $ip2 }" || fail "could not remove $ip2 from $NET-masq4"
if out=$(CNI_ARGS=$(args "$EXEMPT_NS" creds) lib check "$W/$NET.conflist" "$pod2" lc2-ng-e2e 2>&1); then
  fail "CHECK passed although natguard's entry of $ip2 in $NET-masq4 is gone"
fi
log "CHECK with natguard's entry removed fails: $out"

# DEL: pod1 as a runtime's late DEL (empty netns; libcni still passes the cached result),
# then again with nothing cached (no prevResult); pod2 with its netns.
CNI_ARGS=$(args ng-e2e-apps web) lib del "$W/$NET.conflist" "" lc1-ng-e2e || fail "DEL pod1 with empty netns"
CNI_ARGS=$(args ng-e2e-apps web) lib del "$W/$NET.conflist" "" lc1-ng-e2e || fail "second DEL pod1 (nothing cached)"
CNI_ARGS=$(args "$EXEMPT_NS" creds) lib del "$W/$NET.conflist" "$pod2" lc2-ng-e2e || fail "DEL pod2"
assert_pod_gone "$NET" "$ip1" lc1-ng-e2e
assert_pod_gone "$NET" "$ip2" lc2-ng-e2e
