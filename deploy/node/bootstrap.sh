#!/bin/sh
# deploy/node/bootstrap.sh [BINARY]: natguard on this node from its first pod. A cloud's node
# bootstrap (cloud-init, EKS/GKE/AKS user data, an image build) runs it before the container
# runtime and the kubelet start: it installs the binary as /usr/local/bin/natguard and the unit
# natguard.service beside this script, then starts the unit, which returns once natguard has
# put the node-wide metadata guard in place (Type=notify). From then on the runtime and the
# kubelet are ordered after it at every boot. docs/bootstrap.md says what it guards and when.
#
# BINARY: the natguard binary (default: ./natguard beside this script).
# NATGUARD_ARGS: more arguments for `natguard install --watch` (e.g. "--exempt-namespace
#   kube-system --cni-bin-dir /home/kubernetes/bin"), kept in /etc/default/natguard.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/natguard}
[ "$(id -u)" -eq 0 ] || { echo "bootstrap.sh: must run as root" >&2; exit 1; }
[ -x "$bin" ] || { echo "bootstrap.sh: $bin is not an executable natguard binary" >&2; exit 1; }
install -D -m 0755 "$bin" /usr/local/bin/natguard
install -D -m 0644 "$here/natguard.service" /etc/systemd/system/natguard.service
if [ -n "${NATGUARD_ARGS:-}" ]; then
  install -d -m 0755 /etc/default
  printf 'NATGUARD_ARGS=%s\n' "$NATGUARD_ARGS" >/etc/default/natguard
fi
systemctl daemon-reload
# Returns once the watcher says READY=1: the guard is in place.
systemctl enable --now natguard.service
/usr/local/bin/natguard status
