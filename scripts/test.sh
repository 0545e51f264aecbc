#!/usr/bin/env bash
# scripts/test.sh: installs what the tests need on a Debian 12 machine and runs every test layer:
#   1. cargo fmt --check
#   2. cargo clippy --all-targets -- -D warnings
#   3. cargo test --no-fail-fast (unit tests, config/protocol/plan tests without root, and the
#      root integration tests in network namespaces: tests/datapath.rs, ...)
#   4. the end-to-end layers in scripts/e2e/ (real runtimes: libcni, ctr, CRI, podman, image)
# Must run as root (network namespaces). Nothing in the root network namespace is changed.
# Exit status: 0 only if every layer passed. Nothing is skipped: a missing prerequisite fails.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD

say() { printf '\n==> %s\n' "$*"; }
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
# (tests/daemonset.rs) and of `natguard metrics` (tests/counters.rs).
PACKAGES=(
  containernetworking-plugins nftables conntrack iptables iproute2 util-linux procps
  jq socat busybox-static python3 python3-yaml python3-prometheus-client ca-certificates
  podman runc conmon containerd
  golang-go golang-github-appc-cni-dev protobuf-compiler binutils tar gzip
)
# shellcheck source=scripts/packages.sh
. "$REPO/scripts/packages.sh"
ensure_packages "${PACKAGES[@]}"
say "packages: ready"

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
say "cargo fmt --check"
cargo fmt --check || FAILED+=("cargo fmt --check")

say "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || FAILED+=("cargo clippy")

# ---- 3. cargo test (every Rust test layer, root tests included) --------------------------------
# --no-fail-fast: a failing test binary does not keep the later ones from running; cargo still
# exits non-zero if any of them failed.
say "cargo test --no-fail-fast"
log=$(mktemp /tmp/ng-cargo-test.XXXXXX)
trap 'rm -f "$log"' EXIT
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

# ---- 4. further layers --------------------------------------------------------------------------
# >>> Other test layers are called here. <<<
# An end-to-end layer is an executable scripts/e2e/*.sh that calls `e2e_init` (helpers such as
# lib.sh or busybox-image.sh are not layers). Each runs on its own and exits non-zero on failure.
# Add other kinds of layers (benchmarks with assertions, ...) below in the same way.
say "fuzz: scripts/fuzz.sh (bounded)"
FUZZ_SECONDS=${FUZZ_SECONDS:-60} scripts/fuzz.sh </dev/null || FAILED+=("fuzz (scripts/fuzz.sh)")

say "benchmark smoke run: scripts/bench.sh --quick (numbers are not checked, the run is)"
scripts/bench.sh --quick --out "$(mktemp -d /tmp/ng-bench-smoke.XXXXXX)" </dev/null >/dev/null ||
  FAILED+=("bench smoke (scripts/bench.sh --quick)")

say "kernels: scripts/kernels.sh --ci (Debian's 5.10, 6.1 and 6.12 under qemu; docs/kernels.md)"
scripts/kernels.sh --ci </dev/null || FAILED+=("kernels (scripts/kernels.sh --ci)")

say "end-to-end: scripts/e2e/run-all.sh"
scripts/e2e/run-all.sh </dev/null || FAILED+=("e2e (scripts/e2e/run-all.sh)")

# ---- result ------------------------------------------------------------------------------------
if ((${#FAILED[@]})); then
  say "FAILED: ${FAILED[*]}"
  exit 1
fi
say "all test layers passed"
