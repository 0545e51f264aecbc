#!/usr/bin/env bash
# scripts/demo.sh: natguard's main job, shown in throwaway network namespaces.
#
#   pod ──┐                      ┌── cloud       169.254.169.254, fd00:ec2::254  (answers "cloud";
#         │                      │               IMDSv2 for /latest/, tests/proxy/fake_aws.py)
#  exempt ┼─ cni0 ─ node ────────┼── remote-in   10.10.0.2  (inside nonMasqueradeCIDRs)
#   pod ──┘   (proxy on :8181,   └── remote-out  11.0.0.2, 2001:db8:bb::2  (outside)
#              answers "proxy")
#
# The story of a node: its network "demo" (Debian's bridge + host-local) runs a pod,
# default/legacy, whose client keeps a connection to the real metadata server open, before
# natguard is on the node at all (the startup race). Then `natguard install` puts the node-wide
# guard in place, adds natguard (built-in defaults; only exemptNamespaces is set) to the
# network's conflist and adopts the pod: its client is answered by the node-local proxy from
# then on. New pods start through the conflist the way a runtime (libcni) does it: the plugins in
# order, each result passed on as the next plugin's prevResult, the result cached, removed in
# reverse order at the end. The demo prints who answers their metadata requests, the source
# addresses remote hosts see, natguard's table, and what `natguard status` and `natguard
# metrics` say about it all. Last, `natguard install --watch` serves natguard's own metadata
# proxy in place of the stand-in: a default pod gets its region and zone over IMDSv2 and is
# refused the credentials, while the exempt pod still reaches the real API. The cloud here has
# no DMI strings, so the entry names the proxy's cloud (`metadata.proxyCloud: "aws"`).
# Run as root on Debian 12. It runs in a mount namespace of its own
# with a /run of its own, so nothing of the machine's (its /run/natguard, /etc/cni, /opt/cni,
# /var/lib/cni, root network namespace) is read or changed; everything goes on exit.
# NG_DEMO_SAMPLES=DIR: also save step 6's `status`, `status --json` and `metrics` in DIR
# (scripts/docs-samples.sh compares them with docs/operations.md's samples).
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

if [ -t 1 ]; then
  bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
else
  bold() { printf '\n== %s\n' "$*"; }
fi
lib_begin demo

# ---- what it needs -----------------------------------------------------------------------------
ensure_packages containernetworking-plugins nftables conntrack iproute2 util-linux jq socat busybox-static python3
ensure_cargo || fail "cargo is needed to build natguard"

if ! in_private_mounts; then
  bold "building natguard (cargo build --release)"
  cargo build --release
fi
# The rest in a mount namespace of its own, with a /run of its own: the node lock, the
# readiness file and the network namespaces' mounts live there, none on the machine.
private_mounts /run "$@"
BIN=$REPO/target/x86_64-unknown-linux-gnu/release/natguard
[ -x "$BIN" ] || BIN=$REPO/target/release/natguard
[ -x "$BIN" ] || fail "release binary not found under target/"
ls -l "$BIN"

# ---- throwaway namespaces ----------------------------------------------------------------------
P=ng-demo-$$
NODE=$P-node POD=$P-pod EXEMPT=$P-exempt CLOUD=$P-cloud RIN=$P-rin ROUT=$P-rout
LEGACY=$P-legacy
work_dir ng-demo
# The node's CNI directories, as a runtime and natguard's installer see them; the CNI driver
# (scripts/lib.sh) runs the node's conflist from them.
NETCONF=$W/net.d CNI_BIN_DIR=$W/bin CNI_CACHE=$W/cni-results CNI_NODE=$NODE
CNI_LIST=$NETCONF/10-demo.conflist
mkdir -p "$NETCONF" "$CNI_BIN_DIR" "$CNI_CACHE"

netns() {
  mk_ns "$1"
  in_ns "$1" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
}

whoami_server() { # NS: answers on TCP/UDP 7777 with the client's source address as it sees it
  local reply='SYSTEM:read -r request; echo $SOCAT_PEERADDR'
  serve "$1" socat TCP4-LISTEN:7777,reuseaddr,fork "$reply"
  serve "$1" socat TCP6-LISTEN:7777,reuseaddr,fork,ipv6only=1 "$reply"
  serve "$1" socat UDP4-RECVFROM:7777,reuseaddr,fork "$reply"
  serve "$1" socat UDP6-RECVFROM:7777,reuseaddr,fork,ipv6only=1 "$reply"
  wait_port "$1" tcp 7777 2
  wait_port "$1" udp 7777 2
}

bold "creating namespaces $P-{node,pod,exempt,cloud,rin,rout}"
for ns in "$NODE" "$CLOUD" "$RIN" "$ROUT" "$POD" "$EXEMPT" "$LEGACY"; do netns "$ns"; done
in_ns "$NODE" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1

veth "$NODE" to-cloud "$CLOUD" eth0
ip -n "$NODE" addr add 10.20.0.1/30 dev to-cloud
ip -n "$NODE" addr add fd00:c1::1/64 dev to-cloud nodad
ip -n "$CLOUD" addr add 10.20.0.2/30 dev eth0
ip -n "$CLOUD" addr add fd00:c1::2/64 dev eth0 nodad
ip -n "$CLOUD" addr add 169.254.169.254/32 dev lo
ip -n "$CLOUD" addr add fd00:ec2::254/128 dev lo nodad
ip -n "$CLOUD" route add default via 10.20.0.1
ip -n "$CLOUD" -6 route add default via fd00:c1::1
ip -n "$NODE" route add 169.254.169.254/32 via 10.20.0.2
ip -n "$NODE" -6 route add fd00:ec2::254/128 via fd00:c1::2

veth "$NODE" to-rin "$RIN" eth0
ip -n "$NODE" addr add 10.10.0.1/24 dev to-rin
ip -n "$RIN" addr add 10.10.0.2/24 dev eth0
ip -n "$RIN" route add default via 10.10.0.1

veth "$NODE" to-rout "$ROUT" eth0
ip -n "$NODE" addr add 11.0.0.1/24 dev to-rout
ip -n "$NODE" addr add 2001:db8:bb::1/64 dev to-rout nodad
ip -n "$ROUT" addr add 11.0.0.2/24 dev eth0
ip -n "$ROUT" addr add 2001:db8:bb::2/64 dev eth0 nodad
ip -n "$ROUT" route add default via 11.0.0.1
ip -n "$ROUT" -6 route add default via 2001:db8:bb::1
# The node's default routes: its primary addresses (proxyIPv4/proxyIPv6 "auto") are 11.0.0.1
# and 2001:db8:bb::1.
ip -n "$NODE" route add default via 11.0.0.2
ip -n "$NODE" -6 route add default via 2001:db8:bb::2

# Another node component's firewall that tracks connections, as kube-proxy's does (its rules
# drop invalid packets): so the node has conntrack before natguard arrives.
in_ns "$NODE" nft -f - <<'NFT'
table inet node-agent {
  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state invalid drop
  }
}
NFT

# The "real metadata server": "cloud" at /, an IMDSv2 API (tokens required) under /latest/.
serve "$CLOUD" python3 -u "$REPO/tests/proxy/fake_aws.py" --port 80 --log "$W/cloud-requests.jsonl" \
  --banner cloud
wait_port "$CLOUD" tcp 80 1
# A stand-in for a node-local proxy until natguard's own is served (step 4).
keepalive_server "$NODE" 8181 proxy
STANDIN_PID=$SERVED_PID
whoami_server "$RIN"
whoami_server "$ROUT"

# ---- attaching pods like a runtime (libcni) does -----------------------------------------------
# The node's network: Debian's bridge + host-local. natguard is not in it yet.
jq -n --arg dir "$W/ipam" '{
  cniVersion: "1.0.0",
  name: "demo",
  plugins: [
    { type: "bridge", bridge: "cni0", isGateway: true, ipMasq: false, hairpinMode: true,
      ipam: { type: "host-local", dataDir: $dir,
              ranges: [[{ subnet: "10.244.0.0/24" }], [{ subnet: "fd00:10:244::/64" }]],
              routes: [{ dst: "0.0.0.0/0" }, { dst: "::/0" }] } }
  ]
}' >"$CNI_LIST"

# ---- what it shows -----------------------------------------------------------------------------
get() { # NS URL: the body, or what went wrong
  in_ns "$1" timeout 5 busybox wget -qO- "$2" 2>&1 || echo "(no answer: $?)"
}
get_from() { # NS SRC ADDR: GET http://ADDR/ from source address SRC, one connection attempt
  in_ns "$1" timeout 5 python3 -c '
import socket, sys
src, dst = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
s.settimeout(3)
s.bind((src, 0))
try:
    s.connect((dst, 80))
    s.sendall(b"GET / HTTP/1.0\r\nHost: metadata\r\n\r\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    print(data.split(b"\r\n\r\n", 1)[-1].decode().strip())
except ConnectionRefusedError:
    print("(refused: a TCP reset)")
except OSError as e:
    print(f"(no answer: {e})")
' "$2" "$3" 2>&1 || echo "(no answer: $?)"
}
whoami() { # NS PROTO(TCP|UDP) ADDR: the source address the remote host saw
  local out
  out=$(echo who | in_ns "$1" timeout 5 socat -t 2 - "$2:$3:7777" 2>&1) || out="(no answer)"
  out=${out#[}
  out=${out%]}
  if [[ $out == *:* ]] && command -v python3 >/dev/null; then
    out=$(python3 -c 'import ipaddress,sys; print(ipaddress.ip_address(sys.argv[1]))' "$out" 2>/dev/null || echo "$out")
  fi
  echo "$out"
}

# A client that keeps ONE keep-alive connection to the metadata server and asks every 200 ms,
# as cloud SDKs do; it reconnects when the connection breaks.
KEEPALIVE_CLIENT='
import socket, sys, time

def recv(s):
    data = s.recv(4096)
    if not data:
        raise ConnectionError("closed by the server")
    return data

def answer(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += recv(s)
    head, body = buf.split(b"\r\n\r\n", 1)
    length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")][0]
    while len(body) < length:
        body += recv(s)
    return body.decode().strip()

n, s = 0, None
while True:
    if s is None:
        try:
            s = socket.create_connection((sys.argv[1], 80), timeout=5)
        except OSError as e:
            print(f"  connect failed: {e}", flush=True)
            time.sleep(0.2)
            continue
        n += 1
        print(f"  connection #{n} opened (local port {s.getsockname()[1]})", flush=True)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: metadata\r\nConnection: keep-alive\r\n\r\n")
        body = answer(s)
    except OSError as e:
        print(f"  connection #{n} lost: {e}", flush=True)
        s.close()
        s = None
        continue
    now = time.strftime("%H:%M:%S")
    print(f"  {now} request on connection #{n}: answered by {body}", flush=True)
    time.sleep(0.2)
'

# wait_answers FILE FROM_LINE COUNT BODY: until COUNT answers by BODY follow line FROM_LINE of
# FILE (bounded: 20 s)
wait_answers() {
  local i
  for ((i = 0; i < 200; i++)); do
    [ "$(tail -n +"$(($2 + 1))" "$1" | grep -c "answered by $4\$" || true)" -ge "$3" ] && return 0
    sleep 0.1
  done
  cat "$1" >&2
  fail "the pod's client got fewer than $3 answers by $4"
}

bold "1. the startup race: a pod that was running before natguard came to the node"
echo "the node's conflist $(basename "$CNI_LIST") (bridge + host-local; natguard is not on this node yet):"
jq -c '.plugins[] | {type, bridge}' "$CNI_LIST" | sed 's/^/  /'
echo "natguard's tables on the node: $(in_ns "$NODE" nft list tables | grep -c natguard || true)"
cni_add cid-legacy "$LEGACY" default legacy
LEGACY4=$(cni_pod_ip cid-legacy 4)
echo "pod default/legacy $LEGACY4; its client keeps ONE keep-alive connection to http://169.254.169.254/:"
CLIENT_LOG=$W/client.log
setsid nsenter --net="/run/netns/$LEGACY" -- python3 -u -c "$KEEPALIVE_CLIENT" 169.254.169.254 \
  </dev/null >"$CLIENT_LOG" 2>&1 &
CLIENT_PID=$!
SERVED+=("$CLIENT_PID")
defer "kill -- -$CLIENT_PID"
wait_answers "$CLIENT_LOG" 0 3 cloud
head -n 4 "$CLIENT_LOG"
echo "the node's conntrack entry of that connection (not DNATed: the reply comes from 169.254.169.254):"
in_ns "$NODE" conntrack -L -p tcp -s "$LEGACY4" --orig-dst 169.254.169.254 2>/dev/null | sed 's/^/  /'

bold "2. natguard install: the guard, natguard in the conflist, the running pods adopted"
MARK=$(wc -l <"$CLIENT_LOG")
# The demo's cloud has no DMI strings for metadata.preset "auto": the entry names the API that
# natguard's proxy speaks (step 4).
echo '{"metadata": {"proxyCloud": "aws"}, "masquerade": {"masqueradeOutside": true}}' >"$W/natguard-config.json"
echo "natguard's entry sets metadata.proxyCloud \"aws\" (this stand-in cloud has no DMI strings to detect)"
echo "and masquerade.masqueradeOutside true (step 5 shows both sides of the masquerade policy)"
in_ns "$NODE" "$BIN" install --netconf-dir "$NETCONF" --cni-bin-dir "$CNI_BIN_DIR" --cache-dir "$CNI_CACHE" \
  --ready-file "$W/ready" --exempt-namespace kube-system --config "$W/natguard-config.json" 2>&1 | sed 's/^/  /'
echo "the conflist now ends with natguard's entry:"
jq -c '.plugins[] | {type} + (if .type == "natguard" then . else {} end)' "$CNI_LIST" | sed 's/^/  /'
wait_answers "$CLIENT_LOG" "$MARK" 3 proxy
echo "the same client, from the moment install started (the guard resets the old connection, adopt"
echo "DNATs the pod's metadata traffic to the node-local proxy, the client reconnects):"
tail -n +"$((MARK + 1))" "$CLIENT_LOG" | grep -v '^  connect failed' | head -n 6
echo "  ($(tail -n +"$((MARK + 1))" "$CLIENT_LOG" | grep -c 'answered by cloud' || true) answer(s) by cloud after install started)"
echo "the node's conntrack entries of the pod now (DNATed: the reply comes from 11.0.0.1:8181):"
in_ns "$NODE" conntrack -L -p tcp -s "$LEGACY4" --orig-dst 169.254.169.254 2>/dev/null | sed 's/^/  /'

bold "3. new pods start through the conflist with natguard: who answers http://169.254.169.254/ ?"
cni_add cid-web "$POD" default web
cni_add cid-creds "$EXEMPT" kube-system creds
POD4=$(cni_pod_ip cid-web 4) POD6=$(cni_pod_ip cid-web 6)
EX4=$(cni_pod_ip cid-creds 4)
echo "pod default/web      $POD4  $POD6"
echo "pod kube-system/creds $EX4  $(cni_pod_ip cid-creds 6)   (kube-system is in exemptNamespaces)"
printf '  %-28s -> %-26s answered by: %s\n' \
  "default/web ($POD4)" "http://169.254.169.254/" "$(get "$POD" http://169.254.169.254/)" \
  "default/web ($POD6)" "http://[fd00:ec2::254]/" "$(get "$POD" 'http://[fd00:ec2::254]/')" \
  "kube-system/creds ($EX4)" "http://169.254.169.254/" "$(get "$EXEMPT" http://169.254.169.254/)"
echo "  (\"proxy\" = the node-local proxy on the node's port 8181; \"cloud\" = the real metadata server)"
# An address natguard never saw for any pod, taken by the pod itself: fails closed.
STOLEN=10.244.0.250
ip -n "$POD" addr add "$STOLEN/24" dev eth0
printf '  %-28s -> %-26s answered by: %s\n' \
  "default/web (from $STOLEN)" "http://169.254.169.254/" "$(get_from "$POD" "$STOLEN" 169.254.169.254)"
echo "  ($STOLEN is an address default/web added to its own eth0; natguard knows no pod with it)"

bold "4. natguard's own metadata proxy (natguard install --watch), in place of the stand-in"
kill -- "-$CLIENT_PID" "-$STANDIN_PID" 2>/dev/null || true
for ((i = 0; i < 50; i++)); do
  in_ns "$NODE" ss -Hltn "sport = :8181" | grep -q . || break
  sleep 0.1
done
serve "$NODE" "$BIN" install --watch --netconf-dir "$NETCONF" --cni-bin-dir "$CNI_BIN_DIR" \
  --cache-dir "$CNI_CACHE" --exempt-namespace kube-system --config "$W/natguard-config.json"
for ((i = 0; i < 100; i++)); do
  grep -q '"11.0.0.1:8181"' /run/natguard/proxy.json 2>/dev/null && break
  sleep 0.1
done
grep -q '"11.0.0.1:8181"' /run/natguard/proxy.json 2>/dev/null ||
  fail "natguard's proxy does not serve on 11.0.0.1:8181 ($(tail -n 5 "$W/servers.log"))"
imds() { # NS ADDR PATH: an IMDSv2 session (token PUT, then GET PATH): "STATUS BODY"
  in_ns "$1" timeout 10 python3 -c '
import http.client, sys
addr, path = sys.argv[1], sys.argv[2]
def ask(method, path, headers):
    c = http.client.HTTPConnection(addr, 80, timeout=5)
    c.request(method, path, headers=headers)
    r = c.getresponse()
    return r.status, r.read().decode(errors="replace").strip().splitlines()
st, body = ask("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
if st != 200:
    print(f"token PUT {st} {body[:1]}")
    sys.exit()
st, body = ask("GET", path, {"X-aws-ec2-metadata-token": body[0]})
print(st, body[0] if body else "")
' "$2" "$3" 2>&1 || echo "(no answer: $?)"
}
for who in "default/web ($POD4)|$POD|169.254.169.254" "default/web ($POD6)|$POD|fd00:ec2::254" \
  "kube-system/creds ($EX4)|$EXEMPT|169.254.169.254"; do
  IFS='|' read -r label ns addr <<<"$who"
  for path in /latest/meta-data/placement/region /latest/meta-data/placement/availability-zone \
    /latest/meta-data/iam/security-credentials/; do
    printf '  %-28s -> %-46s answered: %s\n' "$label" "$path" "$(imds "$ns" "$addr" "$path")"
  done
done
echo "  (each over IMDSv2: a token PUT, then the GET with it; default/web's token is minted by"
echo "   natguard's proxy, which fetched the node's own token from the cloud: hop limit 1 suffices)"

bold "5. masquerade: which source address does a remote host see? (the entry sets masqueradeOutside)"
printf '  %-52s sees: %s\n' \
  "remote-in  10.10.0.2  (inside nonMasqueradeCIDRs), TCP" "$(whoami "$POD" TCP4 10.10.0.2)" \
  "remote-in  10.10.0.2  (inside nonMasqueradeCIDRs), UDP" "$(whoami "$POD" UDP4 10.10.0.2)" \
  "remote-out 11.0.0.2   (outside), TCP" "$(whoami "$POD" TCP4 11.0.0.2)" \
  "remote-out 11.0.0.2   (outside), UDP" "$(whoami "$POD" UDP4 11.0.0.2)" \
  "remote-out 2001:db8:bb::2 (outside), TCP" "$(whoami "$POD" TCP6 '[2001:db8:bb::2]')"
echo "  (the pod is $POD4 / $POD6; the node is 11.0.0.1 / 2001:db8:bb::1 towards remote-out)"
echo "  (outside is masqueraded because this demo asked for it: masquerade.masqueradeOutside"
echo "   true; by default natguard only keeps the pod's address"
echo "   towards nonMasqueradeCIDRs and leaves everything else to the primary plugin)"

bold "6. nft list table inet natguard (in the node namespace)"
in_ns "$NODE" nft list table inet natguard

bold "7. natguard status: what is installed, and what natguard's counters say about steps 1-5"
in_ns "$NODE" "$BIN" status
bold "   natguard metrics (Prometheus text; install --watch --metrics-file keeps it in a file)"
in_ns "$NODE" "$BIN" metrics
# The samples docs/operations.md shows (scripts/docs-samples.sh): the same three outputs, saved.
if [ -n "${NG_DEMO_SAMPLES:-}" ]; then
  mkdir -p "$NG_DEMO_SAMPLES"
  in_ns "$NODE" "$BIN" status >"$NG_DEMO_SAMPLES/status.txt"
  in_ns "$NODE" "$BIN" status --json | jq . >"$NG_DEMO_SAMPLES/status.json"
  in_ns "$NODE" "$BIN" metrics >"$NG_DEMO_SAMPLES/metrics.txt"
fi

bold "cleaning up (DEL in reverse order, namespaces removed)"
stop_servers
cni_del_attached || fail "DEL failed"
echo "after DEL: $(for t in inet arp; do in_ns "$NODE" nft list table "$t" natguard; done | grep -cwF -e "$POD4" -e "$EX4" -e "$LEGACY4" || true) lines of the table mention the pods"
