#!/usr/bin/env bash
# scripts/kernels/vm-test.sh: the kernel layer's watchdog and resume (scripts/kernels/vm.sh),
# checked against scripts/kernels/fake-qemu: a VM that freezes, locks up, overruns a binary's
# deadline or never boots is stopped and booted again, resuming at the binary that did not end;
# a binary that fails is never run again; three stopped boots fail the kernel. The cases run side
# by side, about 20 s; no root, no qemu. Prints one line per case; exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
KERNELS_DIR=$PWD/scripts/kernels
NGK_QEMU=$KERNELS_DIR/fake-qemu NGK_POLL=1 NGK_FROZEN=3 NGK_BOOT_WAIT=4 NGK_OVERRUN=2 NGK_ATTEMPTS=3
# shellcheck source=scripts/kernels/vm.sh
. "$KERNELS_DIR/vm.sh"

TMP=$(mktemp -d /tmp/ngk-vmtest.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$TMP"' EXIT
FAILS=0

# case NAME PLAN EXPECT_END EXPECT_BOOTS EXPECT_RESULTS EXPECT_RAN: boots the fake VM of three
# binaries a, b and c with FAKE_QEMU_PLAN=PLAN and compares: vm_end, the number of boots, the
# results (name:status, in order) and every run (name:boot, in order).
case_() {
  local name=$1 plan=$2 want_end=$3 want_boots=$4 want_results=$5 want_ran=$6 out got_results got_ran
  out=$TMP/$name
  mkdir -p "$out"
  printf 'NGK_TESTS=%q\nNGK_TIMEOUT_a=1\nNGK_TIMEOUT_b=1\nNGK_TIMEOUT_c=1\n' " a=/bin/a b=/bin/b c=/bin/c" >"$out/env"
  export FAKE_QEMU_PLAN=$plan
  boot_kernel fake fake-1.0 "$TMP" "$out" 60 >"$out/report" 2>&1
  set +e
  got_results=$(awk '{printf "%s%s:%s", (NR > 1 ? " " : ""), $1, $5}' "$out/results" 2>/dev/null)
  got_ran=$(awk '{printf "%s%s:%s", (NR > 1 ? " " : ""), $1, $2}' "$out/fake-ran" 2>/dev/null)
  if [ "$vm_end" = "$want_end" ] && [ "$boots" = "$want_boots" ] &&
    [ "$got_results" = "$want_results" ] && [ "$got_ran" = "$want_ran" ]; then
    echo "ok   $name: $vm_end after $boots boot(s)${vm_history:+ ($vm_history)}"
  else
    echo "FAIL $name: vm_end $vm_end (want $want_end), boots $boots (want $want_boots)," \
      "results '$got_results' (want '$want_results'), ran '$got_ran' (want '$want_ran')"
    sed 's/^/     | /' "$out/report"
    return 1
  fi
}

# Each case in a subshell of its own (boot_kernel's results are globals), side by side.
n=0
side_by_side() {
  (case_ "$@") >"$TMP/case-$n" 2>&1 &
  n=$((n + 1))
}
side_by_side clean "" done 1 "a:0 b:0 c:0" "a:1 b:1 c:1"
side_by_side freeze-once "b:freeze:1" done 2 "a:0 b:0 c:0" "a:1 b:1 b:2 c:2"
side_by_side lockup-once "c:lockup:1" done 2 "a:0 b:0 c:0" "a:1 b:1 c:1 c:2"
side_by_side overrun-once "a:overrun:1" done 2 "a:0 b:0 c:0" "a:1 a:2 b:2 c:2"
side_by_side no-boot-once "-:noboot:1" done 2 "a:0 b:0 c:0" "a:2 b:2 c:2"
side_by_side a-failing-binary-runs-once "b:fail:any" done 1 "a:0 b:1 c:0" "a:1 b:1 c:1"
side_by_side freezing-each-boot "b:freeze:any" frozen 3 "a:0" "a:1 b:1 b:2 b:3"
side_by_side a-new-freeze-each-boot "a:freeze:1 b:freeze:2 c:lockup:3" lockup 3 "a:0 b:0" "a:1 a:2 b:2 b:3 c:3"
for ((i = 0; i < n; i++)); do wait -n || FAILS=$((FAILS + 1)); done
cat "$TMP"/case-*

# What a stopped boot leaves: its console and the log of the binary it stopped in, moved aside.
out=$TMP/freeze-once
if [ -f "$out/boot-1/console.log" ] && [ ! -e "$out/boot-2" ] && grep -q "froze (no heartbeat for 3s) after [0-9]*s, in b" "$out/report"; then
  echo "ok   a stopped boot's console is kept in boot-1/ and the report names the binary"
else
  echo "FAIL a stopped boot's console is kept in boot-1/ and the report names the binary"
  sed 's/^/     | /' "$out/report"
  ls -R "$out" | sed 's/^/     | /'
  FAILS=$((FAILS + 1))
fi

((FAILS == 0)) || {
  echo "scripts/kernels/vm-test.sh: $FAILS case(s) failed"
  exit 1
}
echo "scripts/kernels/vm-test.sh: every case passed"
