#!/usr/bin/env bash
# scripts/kernels.sh: the kernel test layer. Boots Debian's kernels for bullseye (5.10), bookworm
# (6.1) and trixie (6.12) under qemu (TCG) and runs natguard's root test binaries inside each VM,
# against that kernel's netfilter. See docs/kernels.md.
#
#   scripts/kernels.sh                 every kernel, the full test binaries (what a release needs)
#   scripts/kernels.sh --ci            every kernel, the subset CI runs (docs/kernels.md says which)
#   scripts/kernels.sh --kernels "bookworm" --tests "process security"
#   scripts/kernels.sh --kernels trixie --tests "" --bench "--only per-pod --pods 10 --ct 0"
#
# --bench ARGS also runs scripts/bench.sh ARGS in each VM, after the tests, with the host's
# release binary; the report is in the run's directory (<kernel>/bench/bench-results.md) and
# printed. Only ratios of one run mean anything there: TCG is 10-20x slower than the host.
# Prints one line per kernel and test binary (passed, failed, seconds); exits 1 if any kernel or
# binary failed. A kernel that cannot be fetched or booted is a failure with its reason.
# Must run as root. The host's apt sources, network namespaces and firewall are never touched:
# kernels are fetched with a temporary apt configuration and everything else happens in the VM.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
KERNELS_DIR=$REPO/scripts/kernels
export PATH=$PATH:/usr/sbin:/sbin

ALL_KERNELS="bullseye bookworm trixie"
ALL_TESTS="process datapath conntrack conntrack_scope recovery security endpoints kernel_features"
KERNELS=$ALL_KERNELS
TESTS=$ALL_TESTS
TEST_ARGS=""
CI_MODE=0
BENCH_ARGS=""
BENCH=0
# Deadlines inside the VM are this many times the host's (TCG runs 10-20x slower).
TIME_FACTOR=${NATGUARD_TEST_TIME_FACTOR:-15}
CACHE=${NATGUARD_KERNEL_CACHE:-/var/cache/natguard-kernels}
OUTROOT=""

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}
while (($#)); do
  case $1 in
  --ci) CI_MODE=1 ;;
  --kernels) KERNELS=$2 && shift ;;
  --tests) TESTS=$2 && shift ;;
  --out) OUTROOT=$2 && shift ;;
  --bench) BENCH=1 BENCH_ARGS=$2 && shift ;;
  -h | --help) usage ;;
  *) echo "scripts/kernels.sh: unknown argument $1" >&2 && usage ;;
  esac
  shift
done

die() {
  printf 'scripts/kernels.sh: %s\n' "$*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || die "must run as root (try: sudo $0)"

# shellcheck source=scripts/packages.sh
. "$REPO/scripts/packages.sh"
# shellcheck source=scripts/kernels/fetch.sh
. "$KERNELS_DIR/fetch.sh"
# shellcheck source=scripts/kernels/initramfs.sh
. "$KERNELS_DIR/initramfs.sh"
# shellcheck source=scripts/kernels/expect.sh
. "$KERNELS_DIR/expect.sh"
# shellcheck source=scripts/kernels/vm.sh
. "$KERNELS_DIR/vm.sh"

# The VM runs the host's binaries: the root tests' tools, and what only the kernel layer needs.
ensure_packages qemu-system-x86 busybox-static xz-utils ipvsadm \
  containernetworking-plugins nftables conntrack iptables iproute2 util-linux procps jq socat python3
ensure_cargo || die "cargo is needed"

suite_of() {
  case $1 in
  bullseye | 5.10) echo bullseye ;;
  bookworm | 6.1) echo bookworm ;;
  trixie | 6.12) echo trixie ;;
  *) die "unknown kernel $1 (bullseye, bookworm or trixie)" ;;
  esac
}

# ---- build the test binaries on the host ------------------------------------------------------
targs=()
for t in $TESTS; do targs+=(--test "$t"); done
echo "==> building: cargo test --no-run ${targs[*]}"
json=$(cargo test --no-run --message-format=json "${targs[@]}") || die "cargo test --no-run failed"
declare -A BIN
for t in $TESTS; do
  BIN[$t]=$(jq -r --arg t "$t" 'select(.reason == "compiler-artifact" and .target.name == $t
    and (.target.kind | index("test")) and .executable != null) | .executable' <<<"$json" | tail -n1)
  [ -n "${BIN[$t]}" ] || die "cargo built no test binary $t"
done

# ---- with --bench: the release binary and the benchmark's tools, also built on the host ----
BENCH_BUDGET=0
if ((BENCH)); then
  echo "==> building: cargo build --release, the benchmark's tools"
  cargo build --release --quiet || die "cargo build --release failed"
  RELEASE=$REPO/target/x86_64-unknown-linux-gnu/release/natguard # .cargo/config.toml's target
  [ -x "$RELEASE" ] || die "no release binary after cargo build --release"
  TOOLS=$(mktemp -d /tmp/ngk-tools.XXXXXX)
  benches/tools/build.sh "$TOOLS" || die "cannot build the benchmark's tools (benches/tools)"
  BENCH_BUDGET=${NGK_BENCH_BUDGET:-1800}
fi

[ -n "$OUTROOT" ] || OUTROOT=$(mktemp -d /tmp/ngk-run.XXXXXX)
mkdir -p "$OUTROOT" "$CACHE"
echo "==> logs: $OUTROOT"

FAILED=()
SUMMARY=()
report() { # kernel test passed failed seconds status
  local l
  l=$(printf '%-9s %-16s %-4s passed %-4s failed %5ss  %s' "$@")
  SUMMARY+=("$l")
  echo "$l"
}

for k in $KERNELS; do
  suite=$(suite_of "$k")
  kdir=$CACHE/$suite
  out=$OUTROOT/$suite
  rm -rf "$out" && mkdir -p "$out"
  echo "==> $suite: fetching the kernel (cache: $kdir)"
  if ! fetch_kernel "$suite" "$kdir" >"$out/fetch.log" 2>&1; then
    cat "$out/fetch.log" >&2
    report "$suite" "(kernel)" - - 0 "FAILED: cannot fetch Debian $suite's kernel (see $out/fetch.log)"
    FAILED+=("$suite")
    continue
  fi
  kver=$(cat "$kdir/version")
  if ! make_initramfs "$kdir" "$out/initramfs.gz" >"$out/initramfs.log" 2>&1; then
    report "$suite" "(kernel)" - - 0 "FAILED: cannot build the initramfs for $kver (see $out/initramfs.log)"
    FAILED+=("$suite")
    continue
  fi
  # With --ci, the binaries CI runs on this kernel (ci_runs); otherwise every one asked for.
  KTESTS=""
  for t in $TESTS; do
    if ((CI_MODE == 0)) || ci_runs "$suite" "$t"; then KTESTS+=" $t"; fi
  done
  tests="" budget=0
  for t in $KTESTS; do
    tests+=" $t=${BIN[$t]}"
    budget=$((budget + $(test_budget "$t")))
  done
  {
    printf 'NGK_SUITE=%q\nNGK_KVER=%q\nNGK_KDIR=%q\nNGK_REPO=%q\n' "$suite" "$kver" "$kdir" "$REPO"
    printf 'NGK_GUEST=%q\n' "$KERNELS_DIR/guest.sh"
    printf 'NGK_TESTS=%q\n' "$tests"
    for t in $KTESTS; do
      if ((CI_MODE)); then printf 'NGK_FILTER_%s=%q\n' "$t" "$(ci_filter "$t")"; fi
    done
    printf 'NGK_MODULES=%q\n' "${GUEST_MODULES[*]}"
    printf 'NGK_EXPECT=%q\n' "$(kernel_expect "$suite")"
    printf 'NATGUARD_TEST_TIME_FACTOR=%q\n' "$TIME_FACTOR"
    for t in $KTESTS; do printf 'NGK_TIMEOUT_%s=%q\n' "$t" "$(($(test_budget "$t") * 2))"; done
    if ((BENCH)); then
      printf 'NGK_BENCH=%q\nNGK_BENCH_BIN=%q\nNGK_BENCH_TOOLS=%q\nNGK_BENCH_TIMEOUT=%q\n' \
        "$BENCH_ARGS" "$RELEASE" /ngk-out/tools "$BENCH_BUDGET"
    fi
  } >"$out/env"
  # The guest's /tmp is its own: the tools reach it in its output directory (/ngk-out).
  if ((BENCH)); then mkdir -p "$out/tools" && cp "$TOOLS"/* "$out/tools/"; fi
  deadline=$((budget * 2 + BENCH_BUDGET + 300))
  boot_kernel "$suite" "$kver" "$kdir" "$out" "$deadline"
  console=$out/console.log
  [ "$vm_end" = done ] || console=$out/boot-$boots/console.log
  if [ "$vm_end" != done ]; then
    report "$suite" "(kernel)" - - "$secs" "FAILED: $boots boots stopped by the watchdog ($vm_history; see $out/boot-*/console.log)"
    FAILED+=("$suite")
  elif [ -n "$vm_history" ]; then
    report "$suite" "(kernel)" - - "$secs" "ok on boot $boots ($vm_history; see $out/boot-*/console.log)"
  fi
  if [ ! -f "$out/results" ]; then
    reason=$(grep -m1 -E 'ngk-init:|Kernel panic|not syncing' "$console" 2>/dev/null || true)
    report "$suite" "(kernel)" - - "$secs" "FAILED: $kver did not boot to the tests (qemu status $qrc${reason:+; $reason}; see $console)"
    FAILED+=("$suite")
    continue
  fi
  for t in $KTESTS; do
    read -r _ passed failed tsecs rc < <(grep -E "^$t " "$out/results" || echo "$t - - 0 none")
    if [ "$rc" = 0 ]; then
      status=ok
    elif [ "$rc" = none ]; then
      status="FAILED: did not run (the VM stopped first; see $console)"
    elif [ "$rc" = 124 ]; then
      status="FAILED: killed at its deadline (see $out/$t.log)"
    else
      status="FAILED (exit $rc; see $out/$t.log)"
    fi
    report "$suite" "$t" "$passed" "$failed" "$tsecs" "$status"
    if [ "$status" != ok ]; then
      FAILED+=("$suite/$t")
      # What failed, where CI's output shows it: each panic with the assertion's lines.
      grep -A8 -E 'panicked at' "$out/$t.log" 2>/dev/null | grep -v -E '^ +[0-9]+: |^ +at ' |
        head -n 80 | sed 's/^/    | /' || true
    fi
  done
  if ((BENCH)); then
    brc=$(cat "$out/bench.rc" 2>/dev/null || echo none)
    if [ "$brc" = 0 ] && [ -f "$out/bench/bench-results.md" ]; then
      report "$suite" "(bench)" - - "$(cat "$out/bench.secs")" "ok: $out/bench/bench-results.md"
      sed "s/^/    $suite: /" "$out/bench/bench-results.md"
    else
      report "$suite" "(bench)" - - 0 "FAILED (status $brc; see $out/bench.log)"
      FAILED+=("$suite/bench")
    fi
  fi
  report "$suite" "(whole VM)" - - "$secs" "$kver, boot + tests"
  if [ -f "$out/facts" ]; then sed "s/^/    $suite: /" "$out/facts"; fi
done

echo
echo "==> kernel layer summary"
printf '%s\n' "${SUMMARY[@]}"
if ((${#FAILED[@]})); then
  echo "==> kernel layer FAILED: ${FAILED[*]}"
  exit 1
fi
echo "==> kernel layer passed"
