#!/bin/bash
# scripts/e2e/upgrade.sh: a node with live pods upgraded from the previous release (0.1.0) to
# this one, downgraded back and upgraded again, every pod probed throughout.
#
# 0.1.0 is built (cargo build --release --locked, in a target dir under /tmp) from its git tag
# v0.1.0, or, in a checkout without the tag, from tests/fixtures/natguard-0.1.0-src.tar.gz (the
# tag's files: tests/conventions.rs checks they are the same); the log says which.
# NG_E2E_OLD_BIN=PATH uses a 0.1.0 binary built before instead; `upgrade.sh --build-old DIR`
# only builds it (in DIR) and prints its path, for a caller that builds before it runs the
# layers (scripts/test.sh). The node runs in a mount
# namespace of its own with empty tmpfs mounts on /etc/cni, /opt/cni, /var/lib/cni and /run/natguard, so
# natguard's default paths are the node's, as on a real node, and nothing of the machine's is
# read or changed. Pods are started and removed by libcni (tests/cnitool) through the active
# list, with whatever natguard binary the bin dir holds at that moment, on a bridge network.
# Each pod runs scripts/e2e/prober.py from its first probe until it is removed: new
# connections one after another, each to the metadata address and to a host inside and one
# outside the non-masquerade CIDRs; every probe must have the outcome the pod's policy gives
# (proxy or, exempt, the real server; its own address inside, the node's outside).
# 0. Reference: this release installed alone (`install --config` with the ConfigMap's entry),
#    two pods ADDed; natguard's tables (`nft -j`, without elements, counter values and
#    handles) and files are recorded; then everything is taken off again (`uninstall`).
# 1. 0.1.0 as it documents itself: `natguard install --exempt-namespace ...` (its DaemonSet's
#    way: flags, no ConfigMap); an intercepted and an exempt pod ADDed by 0.1.0.
# 2. Upgrade: `natguard install --config` of this release (the DaemonSet's new pod): binary and
#    entry replaced, the pods adopted. natguard's tables then equal the reference's, rule for
#    rule; the log names the objects removed, added and taken over, and the files are the
#    reference's. CHECK of 0.1.0's pods passes; new pods are ADDed; DEL removes everything
#    0.1.0's ADD created (nft, conntrack, IPAM, cache).
# 3. Downgrade, as docs/upgrade.md documents it: 0.1.0's `install` again. The list is 0.1.0's
#    byte for byte, every rule and set of 0.1.0 is back, and what stays of this release is
#    exactly its sets that 0.1.0 does not know, used by no rule of 0.1.0's table, and its netdev
#    and arp tables, which docs/upgrade.md tells the operator to delete. CHECK of this release's pods
#    passes under 0.1.0, new pods are ADDed by it, its DEL removes this release's pods whole.
# 4. Upgraded again: the tables equal the reference's again; DEL of 0.1.0's last pods.
# 5. Every probe of every pod is counted: all must be as the pod's policy says (a proxied pod's
#    metadata connection may be reset while 0.1.0's install downgrades the node, and only then).
. "$(dirname "$0")/../lib.sh"
set -euo pipefail
OLD_TAG=v0.1.0
OLD_VERSION=0.1.0
OLD_FALLBACK=$REPO/tests/fixtures/natguard-$OLD_VERSION-src.tar.gz
OLD_FILES=(src Cargo.toml Cargo.lock build.rs .cargo/config.toml)

# build_old DIR: builds 0.1.0 in DIR from its tag or the fixture; prints the binary's path.
build_old() {
  local build=$1 rev t0 bin v
  mkdir -p "$build/src"
  if command -v git >/dev/null && rev=$(git -C "$REPO" rev-parse -q --verify "$OLD_TAG^{commit}" 2>/dev/null); then
    git -C "$REPO" archive "$OLD_TAG" -- "${OLD_FILES[@]}" | tar -x -C "$build/src" ||
      fail "git archive $OLD_TAG"
    log "$OLD_VERSION's source: the git tag $OLD_TAG (commit ${rev:0:12})" >&2
  else
    [ -f "$OLD_FALLBACK" ] || fail "no git tag $OLD_TAG in $REPO and no $OLD_FALLBACK"
    tar -xzf "$OLD_FALLBACK" -C "$build/src" || fail "unpacking $OLD_FALLBACK"
    log "$OLD_VERSION's source: ${OLD_FALLBACK#"$REPO"/} (this checkout has no tag $OLD_TAG)" >&2
  fi
  t0=$(date +%s.%N)
  (cd "$build/src" && cargo build --release --locked --target-dir "$build/target") >"$build/build.log" 2>&1 ||
    fail "cargo build of $OLD_VERSION: $(tail -n 20 "$build/build.log")"
  bin=$build/target/x86_64-unknown-linux-gnu/release/natguard
  v=$("$bin" version) || fail "$bin version"
  [[ $v == "natguard $OLD_VERSION "* ]] || fail "the binary built from $OLD_VERSION's source says: $v"
  log "built $v in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')s" >&2
  echo "$bin"
}

if [ "${1:-}" = --build-old ]; then
  T=upgrade LOG_TAG="e2e upgrade"
  [ -n "${2:-}" ] || fail "usage: $0 --build-old DIR"
  need cargo tar
  build_old "$2"
  exit 0
fi

if [ "${NG_UPGRADE_INSIDE:-}" != 1 ]; then
  T=upgrade
  [ "$(id -u)" = 0 ] || fail "must run as root"
  need cargo tar unshare
  new_bin=$(natguard_bin)
  if [ -n "${NG_E2E_OLD_BIN:-}" ]; then
    v=$("$NG_E2E_OLD_BIN" version) || fail "$NG_E2E_OLD_BIN version"
    [[ $v == "natguard $OLD_VERSION "* ]] || fail "NG_E2E_OLD_BIN=$NG_E2E_OLD_BIN says: $v"
    log "$OLD_VERSION: NG_E2E_OLD_BIN=$NG_E2E_OLD_BIN ($v)"
    NG_UPGRADE_INSIDE=1 NATGUARD_BIN=$new_bin OLD_BIN=$NG_E2E_OLD_BIN "$0"
    exit $?
  fi
  BUILD=$(mktemp -d /tmp/ng-e2e-upgrade-build.XXXXXX)
  trap 'rm -rf "$BUILD"' EXIT
  old_bin=$(build_old "$BUILD")
  log "this release: $("$new_bin" version)"
  NG_UPGRADE_INSIDE=1 NATGUARD_BIN=$new_bin OLD_BIN=$old_bin "$0"
  exit $?
fi

# ---- inside: e2e_init gives the run a mount namespace of its own, with empty tmpfs mounts on
# /etc/cni, /opt/cni, /var/lib/cni and /run/natguard, so natguard's default paths are the node's
e2e_init upgrade
mkdir -p /etc/cni/net.d /opt/cni/bin /var/lib/cni
need python3 /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback
NET=ng-e2e-upgrade
NETCONF=/etc/cni/net.d
CNIBIN=/opt/cni/bin
LIST=$NETCONF/10-$NET.conflist
APPS_NS=ng-e2e-apps
old_bin=$OLD_BIN
new_bin=$(natguard_bin)
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

world_up
cnitool=$(cnitool_bin)
for p in bridge host-local loopback; do ln -s "/usr/lib/cni/$p" "$CNIBIN/$p"; done
jq -n --arg net "$NET" --argjson br "$(bridge_conf cni0 10.244.9.0/24)" \
  '{cniVersion: "1.0.0", name: $net, plugins: [$br]}' >"$W/template.conflist"
cp "$W/template.conflist" "$LIST"
# 0.2.0's entry as the DaemonSet gets it: the ConfigMap's (every field spelt out)
# masqueradeOutside: the operator keeps 0.1.0's masquerade of everything outside the CIDRs
# (install warns an entry that relies on the old default; docs/upgrade.md).
jq --arg ex "$EXEMPT_NS" '.metadata.exemptNamespaces = [$ex] | .masquerade.masqueradeOutside = true' \
  "$REPO/deploy/base/natguard.json" >"$W/natguard.json"

# lib: the runtime (libcni, through tests/cnitool): the list as it is now, the node's bin dir
# (natguard is whatever binary is there now) and libcni's cache in /var/lib/cni
lib() { in_node env CNI_PATH="$CNIBIN" "$cnitool" "$@"; }
cni_args() { echo "IgnoreUnknown=1;K8S_POD_UID=uid-$2;K8S_POD_NAME=$2;K8S_POD_NAMESPACE=$1"; }

# assert_adopted WHAT OUTPUT POD...: install's adopt (OUTPUT) names each POD with its address
assert_adopted() {
  local what=$1 out=$2 p c
  shift 2
  for p in "$@"; do
    c=cid-$p
    grep -Eq "^adopted +$NET ${c:0:12}(\.\.\.)? eth0 \(${POD_K8S[$p]}/$p\): ${POD_IP[$p]}( |\$)" <<<"$out" ||
      fail "$what's adopt does not name pod $p"
  done
}

# turn_over FROM TO OLD NEW: the pods OLD-web and OLD-creds, ADDed by release FROM, pass CHECK
# under release TO (now installed); NEW-web and NEW-creds are ADDed by TO beside them and probed
# from their first probe on; then TO's DEL of the OLD pods (their containers stop first) leaves
# nothing of them
turn_over() {
  local from=$1 to=$2 old=$3 new=$4 p t
  for p in "$old-web" "$old-creds"; do check_pod "$p" "ADDed by $from, checked by $to"; done
  t=$(now)
  add_pod "$new-web" "$APPS_NS" proxy
  add_pod "$new-creds" "$EXEMPT_NS" cloud
  start_prober "$new-web"
  start_prober "$new-creds"
  wait_probes "$t" "$new-web" "$new-creds"
  for p in "$old-web" "$old-creds"; do
    stop_prober "$p"
    del_pod "$p"
    assert_pod_gone "$NET" "${POD_IP[$p]}" "cid-$p"
  done
  log "CHECK of $from's pods passed under $to, and its DEL left nothing of them"
}

declare -A POD_NETNS POD_K8S POD_IP POD_WANT POD_PROBER
PODS=()
# add_pod NAME K8S_NAMESPACE proxy|cloud: ADD through the list (by whichever natguard is
# installed), then one full probe (lib.sh's check_probe)
add_pod() {
  local name=$1 netns res
  bare_pod "$name" netns
  defer "CNI_ARGS='$(cni_args "$2" "$name")' lib del '$LIST' '' cid-$name"
  res=$(CNI_ARGS=$(cni_args "$2" "$name") lib add "$LIST" "$netns" "cid-$name") || fail "ADD $2/$name: $res"
  POD_NETNS[$name]=$netns POD_K8S[$name]=$2 POD_WANT[$name]=$3
  POD_IP[$name]=$(jq -r '.ips[0].address | sub("/.*"; "")' <<<"$res")
  check_probe "$(probe_in "$netns")" "pod $2/$name (cid-$name)" "$3" >/dev/null || exit 1
}
del_pod() {
  CNI_ARGS=$(cni_args "${POD_K8S[$1]}" "$1") lib del "$LIST" "${POD_NETNS[$1]}" "cid-$1" || fail "DEL ${POD_K8S[$1]}/$1"
}
check_pod() {
  CNI_ARGS=$(cni_args "${POD_K8S[$1]}" "$1") lib check "$LIST" "${POD_NETNS[$1]}" "cid-$1" ||
    fail "CHECK of ${POD_K8S[$1]}/$1 ($2)"
}

# --- the probers (scripts/e2e/prober.py): every pod, one probe after another ------------------
start_prober() {
  nsenter --net="${POD_NETNS[$1]}" python3 "$E2E_DIR/prober.py" "$W/probe-$1.log" 9>&- &
  POD_PROBER[$1]=$!
  PODS+=("$1")
  defer "kill ${POD_PROBER[$1]}"
}
# stop_prober NAME: stops the pod's prober and waits until its last flows are closed
# (quiet_flows), before the DEL whose deletion of them assert_pod_gone checks
stop_prober() {
  kill "${POD_PROBER[$1]}" && wait "${POD_PROBER[$1]}" || true
  quiet_flows "${POD_IP[$1]}"
}
# probes NAME [FROM [TO]]: the pod's probes that started at FROM or later (and before TO)
probes() { awk -v a="${2:-0}" -v b="${3:-9999999999}" '{ t = substr($3, 7) } t + 0 >= a + 0 && t + 0 < b + 0' "$W/probe-$1.log" 2>/dev/null; }
# in_flight NAME FROM TO: how many of the pod's probes were under way at some moment from FROM to TO
in_flight() { awk -v a="$2" -v b="$3" 'substr($3, 7) + 0 < b + 0 && substr($4, 5) + 0 > a + 0 { n++ } END { print n + 0 }' "$W/probe-$1.log"; }
# expected NAME: the outcome the pod's policy gives
expected() { echo "meta=${POD_WANT[$1]} in=${POD_IP[$1]} out=$NODE_IP"; }
# wait_probes FROM NAME...: wait (bounded: 20 s) until each pod has 3 probes that started at FROM
# or later
wait_probes() {
  local from=$1 p i
  shift
  for p in "$@"; do
    for i in $(seq 200); do
      [ "$(probes "$p" "$from" | wc -l)" -ge 3 ] && continue 2
      sleep 0.1
    done
    fail "pod $p: fewer than 3 probes since $from within 20 s: $(tail -n 3 "$W/probe-$p.log" 2>&1)"
  done
}

# --- natguard's kernel objects and files -------------------------------------------------------
# skeleton: natguard's tables as `nft -j` gives them, one object per line, without what pods
# and traffic change: set elements, counter values, handles, and the name of an exempt pod's
# veth that its netdev chain is named after and hooks (VETH). Chains and sets in name order; a
# chain's rules in their order.
skeleton() {
  in_node nft -j list ruleset | jq -c '
    def norm: walk(if type == "object" and (.counter | type) == "object" then .counter = {} else . end);
    def veth: if .key == "chain" and .value.family == "netdev" then .value.name = "VETH" | .value.dev = "VETH"
      elif .key == "rule" and .value.family == "netdev" then .value.chain = "VETH" else . end;
    [.nftables[] | to_entries[0] | select(.key != "metainfo")
      | select((if .key == "table" then .value.name else .value.table end) == "natguard") | veth] as $all
    | ([$all[] | select(.key != "rule") | {(.key): (.value | del(.handle, .elem))}] | sort_by(tostring))
      + [$all | map(select(.key == "rule") | .value | del(.handle)) | group_by([.family, .chain])[]
         | {rules: .}]
    | norm | .[]'
}
# objects SKELETON_FILE: "KIND FAMILY NAME" of each table, chain and set
objects() { jq -r 'to_entries[0] | select(.key != "rules") | "\(.key) \(.value.family) \(.value.name)"' "$1"; }
# node_files: natguard's files on the node (name, type, size for the binary)
node_files() {
  find /run/natguard "$CNIBIN" "$NETCONF" \( -path /run/natguard/ct -prune \) -o -printf '%p %y\n' | LC_ALL=C sort
}
# entry: natguard's entry in the list
entry() { jq -cS '.plugins[] | select(.type == "natguard")' "$LIST"; }

# ==============================================================================================
# 0. The reference: what a node that only ever ran this release has, with the same two kinds of
#    pod on the same bridge. Then it is taken off again.
in_node "$new_bin" install --config "$W/natguard.json" >"$W/ref-install.log" 2>&1 ||
  fail "reference: install of this release: $(cat "$W/ref-install.log")"
add_pod ref-web "$APPS_NS" proxy
add_pod ref-creds "$EXEMPT_NS" cloud
skeleton >"$W/skeleton-new"
node_files >"$W/files-new"
[ -s "$W/skeleton-new" ] || fail "reference: no natguard table after install and two ADDs"
del_pod ref-web
del_pod ref-creds
in_node "$new_bin" uninstall >"$W/ref-uninstall.log" 2>&1 || fail "reference: uninstall: $(cat "$W/ref-uninstall.log")"
cmp -s "$LIST" "$W/template.conflist" || fail "reference: uninstall left a list other than the original"
[ -z "$(skeleton)" ] || fail "reference: uninstall left natguard's objects: $(skeleton)"
log "reference (this release alone, two pods): $(objects "$W/skeleton-new" | grep -c .) tables, chains and sets; taken off again"

# ==============================================================================================
# 1. The node on 0.1.0, as 0.1.0 documents it: its DaemonSet runs `natguard install` with the
#    operator's flags (0.1.0 has no ConfigMap), which copies the binary into the bin dir and
#    appends its entry to the active list. Two pods ADDed by 0.1.0: one intercepted, one exempt.
out=$(in_node "$old_bin" install --exempt-namespace "$EXEMPT_NS" 2>&1) || fail "install of $OLD_VERSION: $out"
cmp -s "$old_bin" "$CNIBIN/natguard" || fail "$OLD_VERSION's install did not put its binary in $CNIBIN"
[ "$(jq -c '[.plugins[].type]' "$LIST")" = '["bridge","natguard"]' ] || fail "$OLD_VERSION's list: $(cat "$LIST")"
cp "$LIST" "$W/list-old"
log "$OLD_VERSION installed: $CNIBIN/natguard is $("$CNIBIN/natguard" version), its entry: $(entry)"
add_pod old-web "$APPS_NS" proxy
add_pod old-creds "$EXEMPT_NS" cloud
NG_REDIR_SET=meta4 assert_pod_installed "$NET" "${POD_IP[old-web]}" cid-old-web
NG_REDIR_SET=meta4 assert_pod_installed "$NET" "${POD_IP[old-creds]}" cid-old-creds exempt
skeleton >"$W/skeleton-old"
node_files >"$W/files-old"
t_probe=$(now)
start_prober old-web
start_prober old-creds
wait_probes "$t_probe" old-web old-creds

# ==============================================================================================
# 2. The upgrade, as the DaemonSet's new pod does it: `natguard install` of this release with
#    the ConfigMap's entry, which replaces the binary and the entry, converges the node and
#    adopts the running pods. Every pod is probed throughout.
t_up0=$(now)
out=$(in_node "$new_bin" install --config "$W/natguard.json" 2>&1) || fail "install of this release over $OLD_VERSION: $out"
t_up1=$(now)
printf '%s\n' "$out" | sed 's/^/    /' >&2
cmp -s "$new_bin" "$CNIBIN/natguard" || fail "the upgrade did not replace $CNIBIN/natguard"
# (install adds the capabilities natguard declares to the runtime)
[ "$(entry | jq -cS 'del(.capabilities)')" = "$(jq -cS . "$W/natguard.json")" ] ||
  fail "the list's entry after the upgrade is not the ConfigMap's: $(entry)"
assert_adopted "the upgrade" "$out" old-web old-creds
wait_probes "$t_up1" old-web old-creds
skeleton >"$W/skeleton-up"
node_files >"$W/files-up"
log "upgraded in $(secs "$t_up0" "$t_up1")s; probes in flight during it: old-web $(in_flight old-web "$t_up0" "$t_up1"), old-creds $(in_flight old-creds "$t_up0" "$t_up1")"
# the kernel objects: exactly what this release alone has, rules included
if ! diff "$W/skeleton-new" "$W/skeleton-up" >"$W/skeleton.diff"; then
  fail "after the upgrade natguard's tables differ from this release's own (< this release alone, > upgraded): $(cat "$W/skeleton.diff")"
fi
removed=$(comm -23 <(objects "$W/skeleton-old" | sort) <(objects "$W/skeleton-up" | sort) | awk '{ print $1 " " $3 }' | paste -sd, -)
added=$(comm -13 <(objects "$W/skeleton-old" | sort) <(objects "$W/skeleton-up" | sort) | awk '{ print $1 " " $3 }' | paste -sd, -)
kept=$(comm -12 <(objects "$W/skeleton-old" | sort) <(objects "$W/skeleton-up" | sort) | grep -c .)
rules_old=$(jq -s '[.[].rules // [] | length] | add' "$W/skeleton-old")
log "kernel objects: the upgraded node's tables equal this release's own, rule for rule ($rules_old rules of $OLD_VERSION rewritten); $kept tables, chains and sets taken over; removed: ${removed:-none}; added: ${added:-none}"
[ -n "$removed" ] || fail "the upgrade removed no object of $OLD_VERSION: expected its metadata sets to go"
diff "$W/files-new" "$W/files-up" >"$W/files.diff" ||
  fail "after the upgrade natguard's files differ from this release's own: $(cat "$W/files.diff")"
log "files: $(grep -c . "$W/files-up") paths in /run/natguard, $CNIBIN and $NETCONF, the same as this release's own; $CNIBIN/natguard and the entry replaced"
# the old pods under this release: CHECK passes, new pods beside them
assert_pod_installed "$NET" "${POD_IP[old-web]}" cid-old-web
assert_pod_installed "$NET" "${POD_IP[old-creds]}" cid-old-creds exempt
turn_over "$OLD_VERSION" "this release" old new

# ==============================================================================================
# 3. The downgrade, as docs/upgrade.md documents it: the previous release's DaemonSet comes
#    back and runs its `natguard install` with its flags.
cp "$LIST" "$W/list-new"
t_dn0=$(now)
out=$(in_node "$old_bin" install --exempt-namespace "$EXEMPT_NS" 2>&1) || fail "install of $OLD_VERSION over this release: $out"
t_dn1=$(now)
printf '%s\n' "$out" | sed 's/^/    /' >&2
cmp -s "$old_bin" "$CNIBIN/natguard" || fail "the downgrade did not put $OLD_VERSION's binary back"
cmp -s "$LIST" "$W/list-old" || fail "the list after the downgrade is not $OLD_VERSION's: $(diff "$W/list-old" "$LIST")"
assert_adopted "the downgrade" "$out" new-web new-creds
wait_probes "$t_dn1" new-web new-creds
skeleton >"$W/skeleton-down"
# what this release has and 0.1.0 does not know: its sets that 0.1.0 leaves behind
left=$(grep -vxFf "$W/skeleton-old" "$W/skeleton-down" || true)
missing=$(grep -vxFf "$W/skeleton-down" "$W/skeleton-old" || true)
[ -z "$missing" ] || fail "after the downgrade, $OLD_VERSION's own objects or rules are missing or differ: $missing"
# this release's own tables, which 0.1.0 does not know (their objects: the family of each)
own_family() { jq -r '(.[]? // empty) | if type == "array" then .[0].family else .family end' <<<"$1"; }
tables_left=""
while IFS= read -r o; do
  [ -z "$o" ] && continue
  grep -qxF -- "$o" "$W/skeleton-new" || fail "the downgrade left an object that is neither release's: $o"
  case $(own_family "$o") in
  netdev | arp)
    # docs/upgrade.md: the veth chains and the ARP guard stay until the operator deletes them
    tables_left="$tables_left $(own_family "$o")"
    continue
    ;;
  esac
  jq -e 'has("set")' <<<"$o" >/dev/null || fail "the downgrade left an object of this release that is not a set: $o"
  name=$(jq -r '.set.name' <<<"$o")
  grep -F '"rules"' "$W/skeleton-down" | grep -F '"inet"' | grep -qF "\"@$name\"" && fail "a rule after the downgrade uses this release's set $name"
  grep -F '"rules"' "$W/skeleton-down" | grep -F '"inet"' | grep -qF "\"$name\"" && fail "a rule after the downgrade names this release's set $name"
done <<<"$left"
for t in netdev arp; do
  grep -qw "$t" <<<"$tables_left" || fail "after the downgrade, this release's table $t natguard is gone: who took it?"
done
leftover=$(printf '%s\n' "$left" | jq -r 'select(.set) | select(.set.family == "inet") | .set.name' 2>/dev/null | paste -sd, -)
log "downgraded in $(secs "$t_dn0" "$t_dn1")s (probes in flight during it: new-web $(in_flight new-web "$t_dn0" "$t_dn1"), new-creds $(in_flight new-creds "$t_dn0" "$t_dn1")): $OLD_VERSION's binary, entry (the list is byte for byte $OLD_VERSION's) and every one of its rules and sets are back; this release's sets that $OLD_VERSION does not know stay, used by no rule: ${leftover:-none}"
# 0.1.0's DEL cannot reach the sets it does not know: what it leaves there is checked gone
# after the second upgrade
NG_IGNORE_SETS=$leftover
turn_over "this release" "$OLD_VERSION" new down
NG_IGNORE_SETS=

# ==============================================================================================
# 4. Upgraded again: this release takes its leftover sets back and the node is its own again.
t_re0=$(now)
out=$(in_node "$new_bin" install --config "$W/natguard.json" 2>&1) || fail "the second upgrade: $out"
t_re1=$(now)
cmp -s "$LIST" "$W/list-new" || fail "the list after the second upgrade is not this release's: $(diff "$W/list-new" "$LIST")"
wait_probes "$t_re1" down-web down-creds
skeleton >"$W/skeleton-re"
diff "$W/skeleton-new" "$W/skeleton-re" >"$W/skeleton.diff" ||
  fail "after the second upgrade natguard's tables differ from this release's own: $(cat "$W/skeleton.diff")"
# the elements 0.1.0's DEL left of this release's pods in the sets it does not know: gone with
# the stale sets, which the second upgrade emptied and filled with the live pods again
for p in new-web new-creds; do
  assert_pod_gone "$NET" "${POD_IP[$p]}" "cid-$p"
done
set_has "$NET" redir4 "${POD_IP[down-web]}" || fail "after the second upgrade, ${POD_IP[down-web]} is not in $NET-redir4"
check_pod down-web "ADDed by $OLD_VERSION after the downgrade, checked by this release"
check_pod down-creds "ADDed by $OLD_VERSION after the downgrade, checked by this release"
for p in down-web down-creds; do
  stop_prober "$p"
  del_pod "$p"
  assert_pod_gone "$NET" "${POD_IP[$p]}" "cid-$p"
done
log "upgraded again in $(secs "$t_re0" "$t_re1")s: natguard's tables equal this release's own again"

# ==============================================================================================
# 5. Every probe of every pod, from its first to its last
bad=0
for p in "${PODS[@]}"; do
  want=$(expected "$p")
  total=$(probes "$p" | wc -l)
  good=$(probes "$p" | awk -v w="$want" '{ $1 = $2 = $3 = $4 = ""; sub(/^ +/, "") } $0 == w' | wc -l)
  # A connection opened in the instant this release's install converges another release's
  # objects, and that leaves without natguard's masquerade (the primary's SNAT applies), is
  # counted apart: install plans the list it writes with the entry it writes from its first
  # converge on, so there must be none (an earlier release's install left one per pod and
  # install: its first converge read the old entry with this release's defaults).
  lapse=$(probes "$p" | awk -v w="$want" -v a1="$t_up0" -v b1="$t_up1" -v a2="$t_re0" -v b2="$t_re1" '{
      s = substr($3, 7) + 0; e = substr($4, 5) + 0; l = $0
      $1 = $2 = $3 = $4 = ""; sub(/^ +/, "")
      if ($0 == w) next
      split(w, ww, " "); split($0, got, " ")
      if (got[1] != ww[1] || got[2] != ww[2] || substr(got[3], 5) != substr(got[2], 4)) next
      if ((s < b1 + 0.05 && e > a1 - 0.05) || (s < b2 + 0.05 && e > a2 - 0.05)) n++
    } END { print n + 0 }')
  # A proxied pod's metadata connection opened while 0.1.0's install downgrades the node may be
  # reset (fail closed, never the real server): 0.1.0 creates its address-keyed redirect set
  # anew, empty (this release keys it by interface, under another name), and fills it in its
  # adopt, a transaction later. Counted apart, and only in that window.
  reset=$(probes "$p" | awk -v w="$want" -v a="$t_dn0" -v b="$t_dn1" '{
      s = substr($3, 7) + 0; e = substr($4, 5) + 0
      $1 = $2 = $3 = $4 = ""; sub(/^ +/, "")
      split(w, ww, " "); split($0, got, " ")
      if (ww[1] != "meta=proxy" || got[1] != "meta=error:ConnectionRefusedError") next
      if (got[2] != ww[2] || got[3] != ww[3]) next
      if (s < b + 0.05 && e > a - 0.05) n++
    } END { print n + 0 }')
  span=$(probes "$p" | awk 'NR == 1 { a = substr($3, 7) } { b = substr($4, 5) } END { printf "%.1f", b - a }')
  log "pod ${POD_K8S[$p]}/$p: $total probes over ${span}s, $good as its policy says ($want), $lapse unmasqueraded during an install over another release, $reset reset during the downgrade, $((total - good - lapse - reset)) other"
  if [ "$lapse" -gt 0 ]; then
    fail "pod $p: $lapse probe(s) without natguard's masquerade during the installs"
  fi
  if [ "$((good + lapse + reset))" != "$total" ]; then
    probes "$p" | grep -vF " $want" | sed -n '1,5s/^/    /p' >&2
    bad=1
  fi
done
[ "$bad" = 0 ] || fail "a pod's probe had another outcome than its policy gives (above)"
