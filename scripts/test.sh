#!/usr/bin/env bash
# scripts/test.sh: installs what the tests need on a Debian 12 machine and runs every test layer:
#   first the Debian packages, the cloud SDKs the proxy's tests drive (boto3, google-auth and
#   azure-identity from PyPI into target/sdk-venv: scripts/sdk-venv.sh) and the Rust toolchain;
#   then the layers:
#   1. cargo fmt --check
#   2. cargo clippy --all-targets -- -D warnings
#   3. kernel layer watchdog: scripts/kernels/vm-test.sh (the VM watchdog and resume of
#      scripts/kernels/vm.sh, against a fake qemu)
#   4. demo: scripts/demo.sh, its output checked for every claim the README makes of it, and
#      docs/operations.md's sample outputs compared with it (scripts/docs-samples.sh)
#   5. fuzz: scripts/fuzz.sh, bounded
#   6. benchmark smoke run: scripts/bench.sh --quick (the run is checked, not the numbers)
#   7. builds for the root tests and the end-to-end layers (the test binaries, this release,
#      the CRI client, the previous release)
#   8. cargo test --no-fail-fast (unit tests, config/protocol/plan tests without root, and the
#      root integration tests in network namespaces: tests/datapath.rs, ...)
#   9. end-to-end: scripts/e2e/run-all.sh (real runtimes: libcni, ctr, CRI, podman, the image,
#      the rendered DaemonSet through containerd's CRI and the bootstrap unit)
#  10. manifests: deploy/base and its overlays rendered with kubectl kustomize and validated
#      strictly against Kubernetes 1.29 to 1.35 (scripts/manifests.sh)
#  11. kernels: scripts/kernels.sh --ci (Debian's 5.10, 6.1 and 6.12 under qemu), started in the
#      background after 7 and waited for after 10
#   Each layer's time is printed at the end.
# Must run as root (network namespaces). Nothing in the root network namespace is changed.
# Exit status: 0 only if every layer passed. Nothing is skipped: a missing prerequisite fails.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD

say() { printf '\n==> %s\n' "$*"; }
# layer TITLE: says TITLE and starts its clock; the previous layer's time is kept for the summary
# printed at the end (one line per layer, in seconds).
TIMES=() LAYER="" LAYER_T0=$SECONDS
layer() {
  [ -z "$LAYER" ] || TIMES+=("$(printf '%6ss  %s' "$((SECONDS - LAYER_T0))" "$LAYER")")
  LAYER=${1%%:*} LAYER_T0=$SECONDS
  [ -z "$1" ] || say "$1"
}
die() {
  printf 'scripts/test.sh: %s\n' "$*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] ||
  die "must run as root: the root integration tests and the e2e layers create network namespaces (try: sudo $0)"

# ---- packages ----------------------------------------------------------------------------------
# Root tests: reference CNI plugins, nft/conntrack/iptables CLIs (tests only read state with them or
# play another component), busybox httpd and socat as servers. E2E layers: the runtimes, Go and
# Debian's libcni source for the libcni driver, protoc for the CRI client, readelf for the image.
# python3-yaml and python3-prometheus-client: independent parsers of scripts/daemonset.yaml
# (tests/daemonset.rs) and of `natguard metrics` (tests/counters.rs); curl scrapes the image's
# metrics port. python3-venv: scripts/manifests.sh installs kubectl and kubernetes-validate
# from PyPI into a virtualenv, scripts/sdk-venv.sh the cloud SDKs of tests/proxy_sdks.rs.
# nginx and wrk: the metadata proxy's benchmark (scripts/bench.sh --only proxy, in the smoke run).
# qemu-system-x86, xz-utils and ipvsadm: the kernel layer's (installed here, before it runs
# beside the end-to-end layers).
PACKAGES=(
  containernetworking-plugins nftables conntrack iptables iproute2 util-linux procps
  jq socat busybox-static python3 python3-yaml python3-prometheus-client ca-certificates systemd
  podman runc conmon containerd
  golang-go golang-github-appc-cni-dev protobuf-compiler binutils tar gzip
  python3-venv curl nginx wrk
  qemu-system-x86 xz-utils ipvsadm
)
# shellcheck source=scripts/packages.sh
. "$REPO/scripts/packages.sh"
layer "set-up: Debian packages, the cloud SDKs, the Rust toolchain"
ensure_packages "${PACKAGES[@]}"
say "packages: ready"

# The real cloud SDKs (boto3, google-auth, azure-identity) from PyPI, pinned, in a virtualenv
# under target/ that later runs reuse (tests/proxy_sdks.rs runs them inside pods).
scripts/sdk-venv.sh >/dev/null || die "scripts/sdk-venv.sh: the cloud SDKs could not be installed"
say "cloud SDKs: ready (target/sdk-venv)"

# ---- Rust toolchain ----------------------------------------------------------------------------
ensure_cargo || die "cargo is needed"
for pair in fmt:rustfmt clippy:clippy; do
  sub=${pair%%:*} component=${pair#*:}
  if ! cargo "$sub" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || die "cargo $sub is missing and there is no rustup to add $component"
    say "adding toolchain component $component"
    rustup component add "$component"
  fi
done
cargo --version

export RUST_BACKTRACE=1
FAILED=()

# ---- 1-2. format and lints ---------------------------------------------------------------------
layer "cargo fmt --check"
cargo fmt --check || FAILED+=("cargo fmt --check")

layer "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || FAILED+=("cargo clippy")

layer "kernel layer watchdog: scripts/kernels/vm-test.sh (a fake qemu)"
scripts/kernels/vm-test.sh || FAILED+=("kernel layer watchdog (scripts/kernels/vm-test.sh)")

# ---- the demo: the README's first command, checked line by line ---------------------------------
# Each check is a claim the README makes of the demo's output; a demo that exits 0 but no longer
# shows one of them fails here.
layer "demo: scripts/demo.sh (and the claims its output carries)"
demo_log=$(mktemp /tmp/ng-demo-out.XXXXXX)
check_demo() { # LOG: every claim, one line each; non-zero if one is missing
  local log=$1 bad=0 claim pattern
  while IFS='|' read -r claim pattern; do
    if grep -Eq -- "$pattern" "$log"; then
      printf '  ok   %s\n' "$claim"
    else
      printf '  FAIL %s (no line matches %s)\n' "$claim" "$pattern"
      bad=1
    fi
  done <<'CLAIMS'
before natguard, the legacy pod's client is answered by the real server|request on connection #1: answered by cloud$
install puts the node-wide guard in place|the node-wide metadata guard is in place
install adopts the pod that predates natguard|^  adopted  demo cid-legacy eth0 \(default/legacy\)
adopt deletes the flow that bypassed the DNAT|conntrack: deleted [1-9][0-9]* metadata flow
after install, the same client is answered by the proxy (the race healed)|request on connection #[2-9][0-9]*: answered by proxy$
a default pod's IPv4 metadata request goes to the proxy|default/web \(10\.244\.0\.[0-9]+\) +-> http://169\.254\.169\.254/ +answered by: proxy$
a default pod's IPv6 metadata request goes to the proxy|default/web \(fd00:10:244::[0-9a-f]+\) +-> http://\[fd00:ec2::254\]/ +answered by: proxy$
the exempt pod is answered by the real server|kube-system/creds \(10\.244\.0\.[0-9]+\) +-> http://169\.254\.169\.254/ +answered by: cloud$
an address a pod gave itself is reset (fail closed)|default/web \(from 10\.244\.0\.250\) +-> http://169\.254\.169\.254/ +answered by: \(refused: a TCP reset\)$
inside nonMasqueradeCIDRs, TCP keeps the pod's source|remote-in .*, TCP +sees: 10\.244\.0\.[0-9]+$
inside nonMasqueradeCIDRs, UDP keeps the pod's source|remote-in .*, UDP +sees: 10\.244\.0\.[0-9]+$
outside, TCP is masqueraded to the node|remote-out 11\.0\.0\.2 .*TCP +sees: 11\.0\.0\.1$
outside, UDP is masqueraded to the node|remote-out 11\.0\.0\.2 .*UDP +sees: 11\.0\.0\.1$
outside, IPv6 TCP is masqueraded to the node|remote-out 2001:db8:bb::2 .*TCP +sees: 2001:db8:bb::1$
status says the node is guarded|^natguard: guarding \(the node-wide metadata guard is in place
status says the exempt pod's veth marks its frames|^exempt veths: 1 \(each exempt pod's own veth marks its frames
status reports the network|^network demo: mode proxy
a default pod gets its region over IMDSv2 from natguard's proxy|default/web \(10\.244\.0\.[0-9]+\) +-> /latest/meta-data/placement/region +answered: 200 eu-west-3$
a default pod gets its zone over IMDSv2 from natguard's proxy|default/web \(10\.244\.0\.[0-9]+\) +-> /latest/meta-data/placement/availability-zone +answered: 200 eu-west-3b$
over IPv6 too|default/web \(fd00:10:244::[0-9a-f]+\) +-> /latest/meta-data/placement/region +answered: 200 eu-west-3$
a default pod is refused the credentials with natguard's 403|default/web \(10\.244\.0\.[0-9]+\) +-> /latest/meta-data/iam/security-credentials/ +answered: 403 natguard: concealed
the exempt pod gets the real API|kube-system/creds \(10\.244\.0\.[0-9]+\) +-> /latest/meta-data/iam/security-credentials/ +answered: 200 natguard-node-role$
status says natguard's proxy serves|^metadata proxy \(pid [0-9]+\): serving aws
DEL leaves nothing of the pods behind|^after DEL: 0 lines of the table mention the pods$
CLAIMS
  return "$bad"
}
demo_samples=$(mktemp -d /tmp/ng-demo-samples.XXXXXX)
if NG_DEMO_SAMPLES=$demo_samples scripts/demo.sh </dev/null >"$demo_log" 2>&1; then
  check_demo "$demo_log" || {
    tail -n 60 "$demo_log"
    FAILED+=("demo (scripts/demo.sh: a claim is missing from its output)")
  }
  # docs/operations.md's samples are this run's output (normalised numbers aside).
  NG_DEMO_SAMPLES_DIR=$demo_samples scripts/docs-samples.sh ||
    FAILED+=("demo (docs/operations.md's samples differ: scripts/docs-samples.sh --write)")
else
  tail -n 60 "$demo_log"
  FAILED+=("demo (scripts/demo.sh exited non-zero)")
fi
rm -rf "$demo_log" "$demo_samples"

# ---- 4. further layers --------------------------------------------------------------------------
# >>> Other test layers are called here. <<<
# An end-to-end layer is an executable scripts/e2e/*.sh that calls `e2e_init` (helpers such as
# scripts/lib.sh or busybox-image.sh are not layers). Each runs on its own and exits non-zero on failure.
# Add other kinds of layers (benchmarks with assertions, ...) below in the same way.
layer "fuzz: scripts/fuzz.sh (bounded)"
FUZZ_SECONDS=${FUZZ_SECONDS:-60} scripts/fuzz.sh </dev/null || FAILED+=("fuzz (scripts/fuzz.sh)")

layer "benchmark smoke run: scripts/bench.sh --quick (numbers are not checked, the run is)"
scripts/bench.sh --quick --out "$(mktemp -d /tmp/ng-bench-smoke.XXXXXX)" </dev/null >/dev/null ||
  FAILED+=("bench smoke (scripts/bench.sh --quick)")

# The kernel layer keeps both cores busy under emulation for about twenty minutes, while the
# root tests and the end-to-end layers mostly wait for namespaces, runtimes and daemons: they
# run side by side. Everything they build (the test binaries, this release, the CRI client, the
# previous release for the upgrade layer) is built first, so no compiler competes with the VMs;
# the VMs run at a lower priority (nice 10, scripts/kernels.sh), so the tests beside them keep
# their pace.
layer "builds for the root tests and the end-to-end layers (before the kernel layer starts beside them)"
old_release=$(mktemp -d /tmp/ng-old-release.XXXXXX)
if cargo test --no-run -q && cargo build --release -q && (cd tests/cri-client && cargo build --release -q) &&
  NG_E2E_OLD_BIN=$(scripts/e2e/upgrade.sh --build-old "$old_release"); then
  export NG_E2E_OLD_BIN
else
  FAILED+=("builds for the end-to-end layers")
fi

say "kernels: scripts/kernels.sh --ci started in the background (its report follows the manifests)"
log=$(mktemp /tmp/ng-cargo-test.XXXXXX)
kernels_log=$(mktemp /tmp/ng-kernels.XXXXXX)
kernels_t0=$SECONDS
scripts/kernels.sh --ci </dev/null >"$kernels_log" 2>&1 &
kernels_pid=$!
trap 'rm -f "$log"; kill "$kernels_pid" 2>/dev/null || true' EXIT
# cargo holds its build lock while `cargo test` runs: the kernel layer first finds its (already
# built) test binaries, then it says where its logs go; only then does cargo test start (bounded).
for _ in $(seq 600); do
  grep -q '^==> logs:' "$kernels_log" && break
  kill -0 "$kernels_pid" 2>/dev/null || break
  sleep 0.5
done

# ---- 4. cargo test (every Rust test layer, root tests included) --------------------------------
# --no-fail-fast: a failing test binary does not keep the later ones from running; cargo still
# exits non-zero if any of them failed.
layer "cargo test --no-fail-fast"
set +e
cargo test --no-fail-fast 2>&1 | tee "$log"
cargo_status=${PIPESTATUS[0]}
set -e

say "cargo test summary"
# One line per test binary: its name and cargo's "test result:" line, or a note when a binary
# ended without one (it crashed or was killed); then cargo's list of failed targets, if any.
awk '
  function flush() { if (name != "" && !seen) printf "%-45s %s\n", name, "(no test result: the binary crashed or was killed)" }
  /^ *Running / { flush(); name = ($2 == "unittests") ? "unit tests " $3 : $2; seen = 0; next }
  /^ *Doc-tests / { flush(); name = "doc-tests " $2; seen = 0; next }
  /^test result:/ { printf "%-45s %s\n", name, $0; n++; seen = 1 }
  /^error: [0-9]+ targets? failed:/ { failed = 1 }
  failed && /^ +`/ { sub(/^ +/, ""); print "failed target: " $0 }
  END { flush(); if (n == 0) print "(no test results: the build failed)" }
' "$log"
[ "$cargo_status" -eq 0 ] || FAILED+=("cargo test")

layer "end-to-end: scripts/e2e/run-all.sh"
scripts/e2e/run-all.sh </dev/null || FAILED+=("e2e (scripts/e2e/run-all.sh)")

layer "manifests: scripts/manifests.sh (kubectl kustomize, kubernetes-validate --strict, 1.29-1.35)"
scripts/manifests.sh </dev/null || FAILED+=("manifests (scripts/manifests.sh)")

layer "kernels: scripts/kernels.sh --ci (Debian's 5.10, 6.1 and 6.12 under qemu; docs/kernels.md)"
kernels_status=0
wait "$kernels_pid" || kernels_status=$?
cat "$kernels_log"
rm -f "$kernels_log"
rm -rf "$old_release"
((kernels_status == 0)) || FAILED+=("kernels (scripts/kernels.sh --ci)")
say "kernels: $((SECONDS - kernels_t0)) s from its start, beside cargo test, the end-to-end and manifests layers"

# ---- result ------------------------------------------------------------------------------------
layer ""
say "time per layer (the whole run: $((SECONDS / 60)) min $((SECONDS % 60)) s)"
printf '%s\n' "${TIMES[@]}"
if ((${#FAILED[@]})); then
  say "FAILED: ${FAILED[*]}"
  exit 1
fi
say "all test layers passed"
