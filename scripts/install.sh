#!/bin/sh
# Installs natguard on this node: copies the binary into the CNI bin dir, appends natguard's
# entry to the active network list (the first *.conflist/*.conf/*.json in /etc/cni/net.d) and
# runs `natguard adopt` for pods that were already running. Every argument goes to
# `natguard install`, e.g.
#   scripts/install.sh --mode proxy --exempt-namespace kube-system
#   scripts/install.sh --watch            # keep the entry in place until SIGTERM (DaemonSet)
#   scripts/install.sh --check            # exit 0 iff natguard is installed
# See `natguard install --help` for every flag; `natguard uninstall` undoes it.
#
# NATGUARD_BIN: the natguard binary to run. Default: /natguard (the image), else this checkout's
# release build, else `natguard` on PATH.
set -eu
if [ -z "${NATGUARD_BIN:-}" ]; then
  repo=$(cd "$(dirname "$0")/.." && pwd)
  for b in /natguard "$repo/target/x86_64-unknown-linux-gnu/release/natguard"; do
    if [ -x "$b" ]; then NATGUARD_BIN=$b; break; fi
  done
fi
exec "${NATGUARD_BIN:-natguard}" install "$@"
