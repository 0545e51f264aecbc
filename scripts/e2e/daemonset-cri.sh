#!/bin/bash
# scripts/e2e/daemonset-cri.sh: the DaemonSet as shipped, run through containerd's CRI as the
# kubelet runs it, and the bootstrap unit's command line as systemd runs it.
#
# deploy/base is rendered with `kubectl kustomize` (scripts/manifests.sh's pinned kubectl) and
# the DaemonSet's pod template translated, field by field, into CRI RunPodSandbox and
# CreateContainer requests (tests/cri-client runspec): hostNetwork, the image and its
# entrypoint with the template's args, runAsUser, privileged, allowPrivilegeEscalation,
# readOnlyRootFilesystem, capabilities (drop/add), the seccomp profile, every volumeMount with
# its readOnly and mountPropagation, the ConfigMap laid out as the kubelet lays it out. A field
# the translation does not know fails the test, so a manifest change is what gets tested. The
# host paths are this test's: the layer runs in a mount namespace of its own with tmpfs on
# /etc/cni, /opt/cni, /var/lib/cni and /run/natguard (scripts/lib.sh, e2e_init), and the
# pods' network namespaces are where containerd pins them (/run/netns, made a shared mount in
# that namespace, so HostToContainer propagation is real).
#
# containerd 1.6 (own root, state and socket, in the node netns) runs the pods with CNI
# (bridge + portmap, the "primary"'s list). Two pods start before natguard (one ordinary, one
# in the exempt namespace), two after. Checked, with the REAL metadata server in the cloud
# netns:
#   - adopt of the pods that predate natguard, under the shipped privileges (NET_ADMIN only);
#   - `nft flush ruleset` in the node netns and its repair: every pod's entries back (those
#     started after the container included), default pods proxied (the DNAT to the proxy
#     port), the exempt pod answered by the real server, masquerade sources as the ConfigMap
#     says;
#   - the readiness and liveness probes run as the kubelet runs them (ExecSync of their
#     commands): passing, failing once the watcher is frozen (SIGSTOP) and its heartbeat goes
#     stale and once natguard's table is deleted, passing again after SIGCONT and the repair;
#   - `natguard status` exits 0 while guarded and 1 while not;
#   - the scrape endpoint of deploy/overlays/metrics (which is what runs: deploy/base plus the
#     overlay's args, env and ports, checked to be nothing more) on the node's address: the node
#     scrapes it, a pod of the node gets 403 and no metric.
# Then the bootstrap unit: deploy/node/natguard.service's ExecStart with its environment, run
# as systemd would (root, the host's mounts), over a fresh set of pods: adopt, flush, repair.
#
# The lines starting with "RESULT" are the ones to quote.
#
# NG_DSCRI_ADD_CAPS=CAP[,CAP]: add capabilities to the translated container, to check this
# layer itself on a tree whose adopt needs more than the manifest grants; every RESULT line then
# says the privileges are NOT the shipped ones. Unset, the manifest's capabilities are used.
. "$(dirname "$0")/../lib.sh"
e2e_init dscri
need ctr flock jq /usr/bin/python3 /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap /usr/lib/cni/loopback
NET=ng-e2e-dscri
LIST=/etc/cni/net.d/10-$NET.conflist
NS_K8S=k8s.io
result() { printf 'RESULT %s\n' "$*"; }

# --- the manifest, rendered and translated ----------------------------------------------------
kubectl=$REPO/target/manifest-tools/bin/kubectl
[ -x "$kubectl" ] || "$REPO/scripts/manifests.sh" >/dev/null || true
[ -x "$kubectl" ] || fail "no kubectl at $kubectl (scripts/manifests.sh installs it)"
"$kubectl" kustomize "$REPO/deploy/base" >"$W/base.yaml" || fail "kubectl kustomize deploy/base"
"$kubectl" kustomize "$REPO/deploy/overlays/metrics" >"$W/rendered.yaml" ||
  fail "kubectl kustomize deploy/overlays/metrics"
cm=$W/configmap
# The translation: one JSON document of what the CRI requests carry, or an error naming the
# field it does not know. What runs is deploy/overlays/metrics (the base with its scrape
# endpoint); the translation first checks that it is the base plus the overlay's args, env and
# ports and nothing else, so the base's every other field is what runs.
/usr/bin/python3 - "$W/rendered.yaml" "$cm" "$W/base.yaml" "$NODE_IP" >"$W/spec.json" <<'PY' || fail "translating the DaemonSet: $(cat "$W/spec.json")"
import copy, json, re, sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
cm_dir = sys.argv[2]
base_docs = list(yaml.safe_load_all(open(sys.argv[3])))
node_ip = sys.argv[4]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
pod = ds["spec"]["template"]["spec"]
def die(msg):
    print(msg)
    sys.exit(1)
base_ds = next(d for d in base_docs if d["kind"] == "DaemonSet")
stripped = copy.deepcopy(ds)
sc0 = stripped["spec"]["template"]["spec"]["containers"][0]
bc0 = base_ds["spec"]["template"]["spec"]["containers"][0]
if sc0.get("args", [])[:len(bc0.get("args", []))] != bc0.get("args", []):
    die("the metrics overlay changes the base's args instead of adding to them")
sc0["args"] = sc0.get("args", [])[:len(bc0.get("args", []))]
for k in ("env", "ports"):
    if k in bc0:
        die(f"the base has {k}, which this layer expects only from the metrics overlay")
    sc0.pop(k, None)
if stripped != base_ds:
    die("the metrics overlay's DaemonSet differs from deploy/base beyond its args, env and ports")
if [d["kind"] for d in docs] != [d["kind"] for d in base_docs]:
    die("the metrics overlay's objects differ from deploy/base's")
known_pod = {"hostNetwork", "priorityClassName", "nodeSelector", "tolerations",
             "automountServiceAccountToken", "enableServiceLinks",
             "terminationGracePeriodSeconds", "containers", "volumes"}
for k in pod:
    if k not in known_pod:
        die(f"pod template field {k} is not translated")
if len(pod["containers"]) != 1:
    die("more than one container")
c = pod["containers"][0]
known_c = {"name", "image", "imagePullPolicy", "args", "command", "securityContext", "resources",
           "readinessProbe", "livenessProbe", "volumeMounts", "env", "ports"}
for k in c:
    if k not in known_c:
        die(f"container field {k} is not translated")
sc = c.get("securityContext", {})
known_sc = {"runAsUser", "runAsGroup", "runAsNonRoot", "privileged", "allowPrivilegeEscalation",
            "readOnlyRootFilesystem", "capabilities", "seccompProfile", "seLinuxOptions"}
for k in sc:
    if k not in known_sc:
        die(f"securityContext field {k} is not translated")
# Host paths the node of this test has: the stock paths, in this layer's mount namespace.
host_ok = {"/etc/cni/net.d", "/opt/cni/bin", "/var/lib/cni", "/run/natguard", "/run/netns",
           "/var/run/netns"}
vols = {v["name"]: v for v in pod["volumes"]}
mounts = []
config = None
for m in c.get("volumeMounts", []):
    v = vols[m["name"]]
    prop = m.get("mountPropagation", "None")
    mode = "ro" if m.get("readOnly") else "rw"
    if "hostPath" in v:
        path = v["hostPath"]["path"]
        if path not in host_ok:
            die(f"hostPath {path} has no place on this test's node")
        mounts.append({"host": path, "ctr": m["mountPath"], "mode": mode, "prop": prop,
                       "type": v["hostPath"].get("type", "")})
    elif "configMap" in v:
        data = cms[v["configMap"]["name"]]["data"]
        config = data
        mounts.append({"host": cm_dir, "ctr": m["mountPath"], "mode": "ro", "prop": prop,
                       "type": "configMap"})
    else:
        die(f"volume {m['name']} is neither a hostPath nor a configMap")
# The kubelet's env: plain values, and the node's address for status.hostIP.
env = {}
for e in c.get("env", []):
    if "value" in e:
        env[e["name"]] = e["value"]
    elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.hostIP":
        env[e["name"]] = node_ip
    else:
        die(f"env {e['name']} is neither a plain value nor status.hostIP")
# The kubelet expands $(VAR) in command and args from the container's env.
expand = lambda a: re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
caps = sc.get("capabilities", {})
print(json.dumps({
    "name": c["name"], "image": c["image"], "hostNetwork": bool(pod.get("hostNetwork")),
    "command": [expand(a) for a in c.get("command", [])],
    "args": [expand(a) for a in c.get("args", [])],
    "env": [f"{k}={v}" for k, v in env.items()],
    "metricsPort": next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == "metrics"), None),
    "runAsUser": sc.get("runAsUser", 0), "privileged": bool(sc.get("privileged")),
    "noNewPrivs": sc.get("allowPrivilegeEscalation") is False,
    "readOnlyRoot": bool(sc.get("readOnlyRootFilesystem")),
    "seccomp": sc.get("seccompProfile", {}).get("type", "-"),
    "capAdd": caps.get("add", []), "capDrop": caps.get("drop", []),
    "mounts": mounts, "configMap": config,
    "readiness": c["readinessProbe"]["exec"]["command"],
    "liveness": c["livenessProbe"]["exec"]["command"],
    "limits": c.get("resources", {}).get("limits", {}),
}))
PY
spec() { jq -c "$@" "$W/spec.json"; }
log "DaemonSet translated: $(spec '{image, hostNetwork, args, capAdd, capDrop, seccomp, readOnlyRoot, noNewPrivs, privileged}')"
extra_caps=${NG_DSCRI_ADD_CAPS:-}
if [ -n "$extra_caps" ]; then
  result() { printf 'RESULT [NOT the shipped privileges: +%s] %s\n' "$extra_caps" "$*"; }
fi
result "shipped privileges: capabilities add $(spec .capAdd) drop $(spec .capDrop), privileged $(spec .privileged), no_new_privs $(spec .noNewPrivs), read-only root $(spec .readOnlyRoot), seccomp $(spec -r .seccomp), mounts $(spec '[.mounts[] | "\(.ctr):\(.mode)\(if .prop != "None" then ":" + .prop else "" end)"] | join(" ")')"

# The ConfigMap volume as the kubelet lays it out.
mkdir -p "$cm/..v1"
spec -r '.configMap | to_entries[] | @base64' | while read -r kv; do
  k=$(base64 -d <<<"$kv" | jq -r .key)
  base64 -d <<<"$kv" | jq -j .value >"$cm/..v1/$k"
  ln -s "..data/$k" "$cm/$k"
done
ln -s ..v1 "$cm/..data"
CONFIG_JSON=$(cat "$cm/..v1/natguard.json") || fail "the ConfigMap has no natguard.json"
# natguard masquerades outside nonMasqueradeCIDRs only where the ConfigMap asks for it
# (masquerade.masqueradeOutside, false by default): otherwise the remote sees the pod.
masq=$(jq -r '(.masquerade.enabled != false) and (.masquerade.masqueradeOutside == true)' <<<"$CONFIG_JSON")
jq -e --arg ns "$EXEMPT_NS" '.metadata.exemptNamespaces | index($ns)' <<<"$CONFIG_JSON" >/dev/null &&
  fail "the ConfigMap already names $EXEMPT_NS"
# The test's exempt namespace: the ConfigMap as an operator edits it (one field added).
CONFIG_JSON=$(jq -c --arg ns "$EXEMPT_NS" '.metadata.exemptNamespaces += [$ns]' <<<"$CONFIG_JSON")
printf '%s' "$CONFIG_JSON" >"$cm/..v1/natguard.json"

# --- the node ------------------------------------------------------------------------------------
world_up
crictl=$(cri_client)
bin=$(natguard_bin)
# The pods' namespaces: containerd pins them under /var/run/netns; in this mount namespace the
# directory becomes a shared mount (HostToContainer needs a shared or slave source).
mkdir -p /run/netns
mountpoint -q /run/netns || { mount --bind /run/netns /run/netns && defer "umount -l /run/netns"; }
mount --make-rshared /run/netns || fail "mount --make-rshared /run/netns"
[ -e /var/run/netns ] || fail "/var/run/netns does not exist"
# containerd checks the mount a HostToContainer path is on without resolving symlinks:
# /var/run/netns (/var/run -> /run) is "on /". A systemd host's / is shared; in this layer's
# mount namespace it is made so too (this namespace only, not recursively).
mount --make-shared / || fail "mount --make-shared / (in this layer's mount namespace)"
link_plugin bridge host-local portmap loopback
mkdir_tracked /run/natguard
jq -n --argjson br "$(bridge_conf cni0 10.244.7.0/24)" --arg net "$NET" \
  '{cniVersion: "0.4.0", name: $net, plugins: [$br, {type: "portmap", capabilities: {portMappings: true}}]}' >"$W/primary.conflist"
put_file "$W/primary.conflist" "$LIST"
cni_state_cleanup "$NET"
cgroup_track k8s.io
containerd_up "  sandbox_image = \"$PAUSE_REF\"
  restrict_oom_score_adj = true
  [plugins.\"io.containerd.grpc.v1.cri\".cni]
    bin_dir = \"/opt/cni/bin\"
    conf_dir = \"/etc/cni/net.d\"
    max_conf_num = 1"
NATGUARD_BIN=$bin "$REPO/scripts/image.sh" "$W/natguard-image.tar" >&2 || fail "scripts/image.sh"
ctd_import "$W/natguard-image.tar" "$NS_K8S"
ctd_import "$(image_tar "$IMAGE_REF")" "$NS_K8S"
ctd_import "$(image_tar "$PAUSE_REF" '["/bin/sleep","2147483647"]')" "$NS_K8S"
cri() { CRI_SOCK=$CTD_SOCK CRI_LOG_DIR=$W/cri-logs "$crictl" "$@"; }
defer "for p in \$(cri lsp | cut -d' ' -f1); do cri stopp \$p; cri rmp \$p; done"
log "$(cri version)"

# pod NAME NAMESPACE: RunPodSandbox and a long-running container; prints "SANDBOX IP"
pod() {
  local id ip
  id=$(cri runp "$1" "$2" "uid-$1") || fail "RunPodSandbox $2/$1"
  ip=$(cri ip "$id") || fail "PodSandboxStatus $id"
  echo "$id $ip"
}
# probe_pod ID NAME WANT_META [primary]: the world's probe from a container in the pod; checks
# metadata (proxy, cloud) and the two sources (masquerade as the ConfigMap says; with
# "primary", as the primary alone does it: no masquerade, natguard is not there yet).
probe_pod() {
  local id=$1 who=$2 want=$3 out ip meta in outv want_out
  out=$(cri run "$id" "$IMAGE_REF" sh -c "$PROBE") || fail "probe in $who: $out"
  ip=$(sed -n 's/^ip=//p' <<<"$out") meta=$(sed -n 's/^meta=//p' <<<"$out")
  in=$(sed -n 's/^in=//p' <<<"$out") outv=$(sed -n 's/^out=//p' <<<"$out")
  [ "$masq" = true ] && [ "${4:-}" != primary ] && want_out=$NODE_IP || want_out=$ip
  [ "$meta" = "$want" ] || fail "$who ($ip): 169.254.169.254 answered '$meta', want '$want'"
  [ "$in" = "$ip" ] || fail "$who ($ip): $REMOTE_IN saw '$in', want the pod's address"
  [ "$outv" = "$want_out" ] || fail "$who ($ip): $REMOTE_OUT saw '$outv', want '$want_out'"
  echo "$who ($ip): metadata -> $meta, $REMOTE_IN sees $in, $REMOTE_OUT sees $outv"
}

# --- pods before natguard --------------------------------------------------------------------
read -r podA ipA < <(pod ng-before-web ng-e2e-apps)
read -r podB ipB < <(pod ng-before-creds "$EXEMPT_NS")
[ -n "${ipA:-}" ] && [ -n "${ipB:-}" ] || fail "the pods before natguard did not start"
out=$(probe_pod "$podA" ng-e2e-apps/ng-before-web cloud primary) || fail "before natguard: $out"
log "before natguard: $out"

# --- the DaemonSet's container ----------------------------------------------------------------
runspec=(runspec "$(spec -r .name)" kube-system uid-natguard "$(spec .hostNetwork)" "$(spec -r .image)"
  "$(spec .readOnlyRoot)" "$(spec .noNewPrivs)" "$(spec .privileged)" "$(spec .runAsUser)" "$(spec -r .seccomp)"
  "$(spec -r --arg x "$extra_caps" '.capAdd + ($x | split(",") | map(select(. != ""))) | if length == 0 then "-" else join(",") end')"
  "$(spec -r '.capDrop | if length == 0 then "-" else join(",") end')")
while read -r m; do runspec+=(--mount "$m"); done < <(spec -r '.mounts[] | "\(.host):\(.ctr):\(.mode):\(.prop)"')
while read -r e; do [ -n "$e" ] && runspec+=(--env "$e"); done < <(spec -r '.env[]')
runspec+=(--)
while read -r a; do [ -n "$a" ] && runspec+=("$a"); done < <(spec -r '.command[]')
runspec+=(--)
while read -r a; do [ -n "$a" ] && runspec+=("$a"); done < <(spec -r '.args[]')
read -r ng_pod ng_ctr < <(cri "${runspec[@]}") || true
[ -n "${ng_ctr:-}" ] || fail "CreateContainer of the DaemonSet's container failed"
log "natguard container $ng_ctr in sandbox $ng_pod"
ng_pid=$(cri pid "$ng_ctr") || fail "the container's pid"
capeff=$(awk '/^CapEff:/ { print $2 }' "/proc/$ng_pid/status")
result "the container runs with CapEff=$capeff (NET_ADMIN alone is 0000000000001000), NoNewPrivs=$(awk '/^NoNewPrivs:/ { print $2 }' "/proc/$ng_pid/status"), Seccomp=$(awk '/^Seccomp:/ { print $2 }' "/proc/$ng_pid/status")"
ctr_log() { cat "$W/cri-logs/kube-system_$(spec -r .name)_uid-natguard/$(spec -r .name).log" 2>/dev/null | cut -d' ' -f4-; }

# probe KIND: the probe's command as ExecSync (the kubelet's exec probe); prints its output, and
# returns its exit code
probe() {
  local cmd
  mapfile -t cmd < <(spec -r ".$1[]")
  cri exec "$ng_ctr" 5 "${cmd[@]}" 2>&1
}
# wait_for WHAT DEADLINE_S CMD...: polls CMD until it succeeds (the deadline only stops a broken
# build from hanging)
wait_for() {
  local what=$1 end=$(($(date +%s) + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || fail "gave up waiting for $what; natguard's log: $(ctr_log | tail -20)"
    sleep 0.2
  done
}
both_probes_pass() { probe readiness >/dev/null && probe liveness >/dev/null; }
wait_for "the probes to pass" 60 both_probes_pass
result "readiness probe (ExecSync) passes: $(probe readiness)"

# Adopted: the pods that predate natguard are under policy.
adopted=$(ctr_log | grep -E 'adopt' | tail -5)
log "natguard's adopt: $adopted"
check_all() { # LABEL: every pod under policy, as its namespace says
  probe_pod "$podA" ng-e2e-apps/ng-before-web proxy
  probe_pod "$podB" "$EXEMPT_NS/ng-before-creds" cloud
  if [ -n "${podC:-}" ]; then
    probe_pod "$podC" ng-e2e-apps/ng-after-web proxy
    probe_pod "$podD" "$EXEMPT_NS/ng-after-creds" cloud
  fi
}
out=$(check_all) || fail "adopt: $out"
result "adopt under the shipped privileges: the pods that predate natguard are under policy:"
sed 's/^/RESULT   /' <<<"$out"

# --- the metrics overlay's scrape endpoint, on the node's address ------------------------------
mport=$(spec -r .metricsPort)
[ "$mport" != null ] || fail "the metrics overlay's container has no port named metrics"
scrape_node() { in_node timeout 5 busybox wget -q -O- "http://$NODE_IP:$mport/metrics" 2>&1; }
wait_for "the scrape endpoint on $NODE_IP:$mport" 30 scrape_node
body=$(scrape_node) || fail "scraping $NODE_IP:$mport from the node: $body"
grep -qx 'natguard_guarded 1' <<<"$body" ||
  fail "the node's scrape has no 'natguard_guarded 1': $(head -5 <<<"$body")"
grep -q '^natguard_pod_' <<<"$body" &&
  fail "the scrape lists pods' series though the overlay does not ask for them (--metrics-pod-labels)"
result "scrape endpoint (the metrics overlay, --metrics-address=\$(NODE_IP) as the kubelet expands it): the node scrapes $NODE_IP:$mport: $(grep -c '^natguard_' <<<"$body") series, no per-pod ones"
# A pod of the node asks the same address and port: refused before anything is collected.
out=$(cri run "$podA" "$IMAGE_REF" sh -c "timeout 5 wget -q -O- http://$NODE_IP:$mport/metrics 2>&1; echo exit=\$?") ||
  fail "the scrape from a pod did not run: $out"
grep -q 'natguard_' <<<"$out" && fail "a pod of the node read the metrics: $(head -3 <<<"$out")"
grep -q '403' <<<"$out" || fail "a pod of the node's scrape was not refused with 403: $out"
result "the scrape endpoint refuses a pod of the node ($ipA): $(tr '\n' ' ' <<<"$out")"

# --- pods after natguard ---------------------------------------------------------------------
jq -e '[.plugins[].type] | index("natguard")' "$LIST" >/dev/null || fail "natguard is not in $LIST"
read -r podC ipC < <(pod ng-after-web ng-e2e-apps)
read -r podD ipD < <(pod ng-after-creds "$EXEMPT_NS")
[ -n "${ipC:-}" ] && [ -n "${ipD:-}" ] || fail "the pods after natguard did not start"

# --- a flush and its repair ------------------------------------------------------------------
in_node nft flush ruleset || fail "nft flush ruleset"
repaired() { set_holds "$NET" masq4 "$ipA" && set_holds "$NET" masq4 "$ipC" &&
  set_holds "" exempt4 "$ipB" && set_holds "" exempt4 "$ipD"; }
wait_for "the repair of every pod's entries" 30 repaired
out=$(check_all) || fail "after the flush: $out; natguard's log: $(ctr_log | tail -20)"
result "nft flush ruleset repaired under the shipped privileges: $(ctr_log | grep -E 'self-repair: .*restored' | tail -1)"
sed 's/^/RESULT   /' <<<"$out"
# CRI's loopback attachments are skipped by design (their network does not list natguard);
# any other skip is a pod left without its entries.
repair_skips=$(ctr_log | grep -E '^skipped|skipped ' | grep -v 'its network does not list natguard' | grep -v ' skipped, ' || true)
[ -z "$repair_skips" ] || fail "natguard skipped pods: $repair_skips"

# --- status's exit codes, the probes failing and recovering ----------------------------------
status_code() { in_node "$bin" status >"$W/status.out" 2>&1; echo $?; }
code=$(status_code)
[ "$code" = 0 ] || fail "natguard status exits $code on the guarded node: $(cat "$W/status.out")"
result "natguard status on the guarded node: exit $code ($(head -1 "$W/status.out"))"
kill -STOP "$ng_pid" || fail "SIGSTOP $ng_pid"
defer "kill -CONT $ng_pid"
frozen() { ! probe liveness >/dev/null; }
wait_for "the probes to see the frozen watcher" 120 frozen
result "watcher frozen (SIGSTOP): liveness probe exit 1: $(probe liveness)"
in_node nft delete table inet natguard || fail "nft delete table inet natguard"
out=$(probe readiness) && fail "the readiness probe passed with natguard's table deleted: $out"
result "table deleted, watcher frozen: readiness probe exit 1: $out"
code=$(status_code)
[ "$code" = 1 ] || fail "natguard status exits $code on the unguarded node: $(cat "$W/status.out")"
result "natguard status on the unguarded node: exit $code ($(head -1 "$W/status.out"))"
in_node "$bin" status --nonsense >/dev/null 2>&1
code=$?
[ "$code" = 2 ] || fail "natguard status --nonsense exits $code, want 2"
result "natguard status with a usage error: exit $code"
kill -CONT "$ng_pid"
wait_for "the probes to pass after SIGCONT" 60 both_probes_pass
wait_for "the repair of every pod's entries" 30 repaired
out=$(check_all) || fail "after SIGCONT: $out"
result "after SIGCONT: readiness probe passes again: $(probe readiness)"
code=$(status_code)
[ "$code" = 0 ] || fail "natguard status exits $code after the repair"
result "natguard status after the repair: exit $code"

# --- stop the DaemonSet's pod, uninstall, then the bootstrap unit ----------------------------
cri stopp "$ng_pod" && cri rmp "$ng_pod" || fail "removing the natguard pod"
in_node "$bin" uninstall --netconf-dir /etc/cni/net.d --cni-bin-dir /opt/cni/bin >/dev/null 2>&1 || fail "natguard uninstall"
in_node nft list table inet natguard >/dev/null 2>&1 && fail "uninstall left natguard's table"
log "DaemonSet pod removed, natguard uninstalled; now the bootstrap unit"

unit=$REPO/deploy/node/natguard.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
envfile=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$unit")
[ "$envfile" = /etc/default/natguard ] || fail "the unit reads its environment from $envfile"
[ "${exec_start%% *}" = /usr/local/bin/natguard ] || fail "ExecStart runs ${exec_start%% *}"
# What bootstrap.sh writes into /etc/default/natguard for NATGUARD_ARGS, read as systemd reads
# it: $NATGUARD_ARGS split on whitespace into the command line.
NATGUARD_ARGS="--exempt-namespace $EXEMPT_NS"
printf 'NATGUARD_ARGS=%s\n' "$NATGUARD_ARGS" >"$W/default-natguard"
# systemd's EnvironmentFile: the value is the rest of the line, spaces and all.
NATGUARD_ARGS=$(sed -n 's/^NATGUARD_ARGS=//p' "$W/default-natguard")
read -r -a unit_cmd <<<"${exec_start//\$NATGUARD_ARGS/$NATGUARD_ARGS}"
unit_cmd[0]=$bin
log "bootstrap unit: ${unit_cmd[*]}"
# nsenter directly, not in_node: $! of a backgrounded function is its subshell, not the unit
nsenter --net="/run/netns/$NODE" -- "${unit_cmd[@]}" >"$W/unit.log" 2>&1 9>&- &
unit_pid=$!
defer "kill $unit_pid"
wait_for "the unit's watcher to adopt" 60 repaired || fail "the unit's log: $(tail -20 "$W/unit.log")"
out=$(check_all) || fail "bootstrap unit, adopt: $out; its log: $(tail -20 "$W/unit.log")"
result "bootstrap unit (${exec_start}): adopt of the running pods:"
sed 's/^/RESULT   /' <<<"$out"
in_node nft flush ruleset || fail "nft flush ruleset"
wait_for "the unit's repair" 30 repaired
out=$(check_all) || fail "bootstrap unit, after the flush: $out"
result "bootstrap unit: nft flush ruleset repaired: $(grep -E 'self-repair: .*restored' "$W/unit.log" | tail -1)"
sed 's/^/RESULT   /' <<<"$out"
kill "$unit_pid"
wait "$unit_pid" 2>/dev/null
log "passed in $(elapsed) s"
