#!/bin/bash
# scripts/e2e/gc-status.sh: natguard's GC and STATUS (CNI spec 1.1.0), invoked directly as a
# 1.1 runtime would. Debian's libcni (1.1.2) and plugins (1.1.1) stop at spec 1.0.0, so the
# pods are attached through libcni with a 1.0.0 list (bridge + host-local + natguard); then the
# same network's list is upgraded to cniVersion 1.1.0 and natguard alone gets what a 1.1
# runtime sends it: VERSION, STATUS, GC with cni.dev/valid-attachments.
# Checks: VERSION lists 1.1.0; STATUS succeeds, and fails with code 50 where nf_tables cannot
# be used (no CAP_NET_ADMIN); GC of another network touches nothing of this one; GC keeps the
# valid attachment (its traffic still proxied) and removes every entry of the stale one.
. "$(dirname "$0")/../lib.sh"
e2e_init gc
need flock setpriv /usr/lib/cni/bridge /usr/lib/cni/host-local
NET=ng-e2e-gc

world_up
cnitool=$(cnitool_bin)
bin=$(natguard_bin)
mkdir -p "$W/cni-bin"
install -m 0755 "$bin" "$W/cni-bin/natguard"
ng=$(natguard_conf)
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.7.0/24)" --argjson ng "$ng" \
  '{cniVersion: "1.0.0", name: $net, plugins: [$br, $ng]}' >"$W/$NET.conflist"
cni_state_cleanup "$NET"
lib() { in_node env CNI_PATH="/usr/lib/cni:$W/cni-bin" "$cnitool" "$@"; }
bare_pod keep pod_keep
bare_pod stale pod_stale
export CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=ng-e2e-apps;K8S_POD_NAME=gc"
defer "lib del '$W/$NET.conflist' '' gc1-ng-e2e"
defer "lib del '$W/$NET.conflist' '' gc2-ng-e2e"
ip_keep=$(lib add "$W/$NET.conflist" "$pod_keep" gc1-ng-e2e | jq -r '.ips[0].address | sub("/.*"; "")') || fail "ADD gc1"
ip_stale=$(lib add "$W/$NET.conflist" "$pod_stale" gc2-ng-e2e | jq -r '.ips[0].address | sub("/.*"; "")') || fail "ADD gc2"
assert_pod_installed "$NET" "$ip_keep" gc1-ng-e2e
assert_pod_installed "$NET" "$ip_stale" gc2-ng-e2e

# natguard as a plugin of a 1.1.0 list: the runtime injects name and cniVersion
conf11() { jq -c --arg net "$1" '. + {cniVersion: "1.1.0", name: $net}' <<<"$ng"; }
# direct VERB STDIN [ENV...]: natguard as a 1.1 runtime runs it (GC and STATUS: no container)
direct() {
  local verb=$1 in=$2
  shift 2
  in_node env -i PATH="$PATH" CNI_COMMAND="$verb" CNI_PATH="/usr/lib/cni:$W/cni-bin" "$@" "$W/cni-bin/natguard" <<<"$in"
}

out=$(direct VERSION '{"cniVersion":"1.1.0"}') || fail "VERSION: $out"
jq -e '.supportedVersions | index("1.1.0") != null' <<<"$out" >/dev/null || fail "VERSION does not list 1.1.0: $out"

out=$(direct STATUS "$(conf11 "$NET")") || fail "STATUS on a working node failed: $out"
[ -z "$out" ] || fail "STATUS succeeded but printed: $out"
# root without CAP_NET_ADMIN (dropped from the bounding set before exec)
out=$(in_node env -i PATH="$PATH" CNI_COMMAND=STATUS CNI_PATH=/usr/lib/cni \
  setpriv --bounding-set=-net_admin --inh-caps=-net_admin "$W/cni-bin/natguard" <<<"$(conf11 "$NET")" 2>/dev/null)
rc=$?
[ "$rc" -ne 0 ] && [ "$(jq -r .code <<<"$out" 2>/dev/null)" = 50 ] ||
  fail "STATUS without CAP_NET_ADMIN: want exit != 0 and code 50, got exit $rc: $out"
log "VERSION lists 1.1.0; STATUS: ok with nf_tables, code 50 without CAP_NET_ADMIN"

# gc NET VALID_ATTACHMENTS_JSON
# GC of another network with no valid attachment leaves this network alone
gc() { direct GC "$(jq -c --argjson valid "$2" '. + {"cni.dev/valid-attachments": $valid}' <<<"$(conf11 "$1")")"; }
out=$(gc ng-e2e-gc-other '[]') || fail "GC of another network: $out"
assert_pod_installed "$NET" "$ip_keep" gc1-ng-e2e
assert_pod_installed "$NET" "$ip_stale" gc2-ng-e2e
# GC with only gc1 valid: gc2's entries go, gc1's stay and still work
out=$(gc "$NET" '[{"containerID": "gc1-ng-e2e", "ifname": "eth0"}]') || fail "GC: $out"
assert_pod_installed "$NET" "$ip_keep" gc1-ng-e2e
t=$(nft_table)
grep -Eq "$(ip_re "$ip_stale")" <<<"$t" && fail "GC left entries of the stale attachment $ip_stale: $(grep -E "$(ip_re "$ip_stale")" <<<"$t")"
[ "$(check_probe "$(probe_in "$pod_keep")" "valid attachment after GC")" = "$ip_keep" ] || exit 1
log "GC: stale attachment $ip_stale removed, valid $ip_keep kept and still proxied"
# a second GC is a no-op
out=$(gc "$NET" '[{"containerID": "gc1-ng-e2e", "ifname": "eth0"}]') || fail "second GC: $out"
assert_pod_installed "$NET" "$ip_keep" gc1-ng-e2e

lib del "$W/$NET.conflist" "$pod_stale" gc2-ng-e2e || fail "DEL gc2 after GC"
lib del "$W/$NET.conflist" "$pod_keep" gc1-ng-e2e || fail "DEL gc1"
assert_pod_gone "$NET" "$ip_keep" gc1-ng-e2e
assert_pod_gone "$NET" "$ip_stale" gc2-ng-e2e
