#!/bin/bash
# scripts/e2e/run-all.sh [NAME...]: natguard's end-to-end tests through real CNI consumers,
# one after the other (they share /etc/cni/net.d, /opt/cni/bin and /var/lib/cni). NAME is a
# script of this directory without .sh; default: every one that calls e2e_init.
# Prints one line per test, "e2e NAME: PASS (Ns)" or "e2e NAME: FAIL (Ns)" followed by the
# end of its log, then "N passed, M failed". Exit status 0 only if every test passed.
# Needs root. Builds natguard (cargo build --release) and tests/cri-client first.
# Env: NATGUARD_BIN (see scripts/lib.sh), NG_E2E_LOG_DIR (default: a temp dir; logs of every test).
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# Every executable scripts/e2e/*.sh that calls e2e_init is a test: these first, in this
# order, then any other in name order.
ORDER="libcni gc-status ctr containerd-cri daemonset-cri podman install-live upgrade"
found=$(for f in "$HERE"/*.sh; do
  [ -x "$f" ] && grep -q '^e2e_init ' "$f" && basename "$f" .sh
done)
ALL=$(for t in $ORDER; do grep -qx "$t" <<<"$found" && echo "$t"; done
  grep -vxF "$(tr ' ' '\n' <<<"$ORDER")" <<<"$found")
TESTS=${*:-$ALL}
LOGS=${NG_E2E_LOG_DIR:-$(mktemp -d /tmp/ng-e2e-logs.XXXXXX)}
mkdir -p "$LOGS"

passed=0 failed=0
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Build once, outside the tests' timings. A failed build fails every test (no skipping).
t0=$(now)
build_ok=1
if [ -z "${NATGUARD_BIN:-}" ]; then
  (cd "$REPO" && cargo build --release -q) >"$LOGS/build.log" 2>&1 || build_ok=0
fi
(cd "$REPO/tests/cri-client" && cargo build --release -q) >>"$LOGS/build.log" 2>&1 || build_ok=0
echo "e2e: built natguard and tests/cri-client in $(secs "$t0")s (logs in $LOGS, kept if a test fails)"

for t in $TESTS; do
  t0=$(now)
  if [ "$build_ok" = 1 ] && [ -x "$HERE/$t.sh" ] && "$HERE/$t.sh" </dev/null >"$LOGS/$t.log" 2>&1; then
    echo "e2e $t: PASS ($(secs "$t0")s)"
    passed=$((passed + 1))
  else
    echo "e2e $t: FAIL ($(secs "$t0")s)"
    if [ "$build_ok" != 1 ]; then
      sed 's/^/    /' "$LOGS/build.log" | tail -20
    elif [ ! -x "$HERE/$t.sh" ]; then
      echo "    no such test: $HERE/$t.sh"
    else
      grep -v ' warn ' "$LOGS/$t.log" | tail -15 | cut -c1-400 | sed 's/^/    /'
    fi
    failed=$((failed + 1))
  fi
done
# keep the logs of a failed run (or when asked to); a clean run leaves nothing behind
if [ "$failed" -eq 0 ] && [ -z "${NG_E2E_LOG_DIR:-}" ]; then
  rm -rf "$LOGS"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
