# scripts/kernels/vm.sh: sourced by scripts/kernels.sh (and scripts/kernels/vm-test.sh). Boots one
# kernel's VM, watches it, and boots it again where the emulated machine, not a test, failed.
#
# The guest (scripts/kernels/guest.sh) writes into its output directory OUT: `heartbeat` (its
# uptime, every 5 s, from a process of its own), `current` (the test binary running and its
# deadline in seconds, empty between binaries) and `results` (a line per binary that ended). A
# guest booted again skips the binaries that have a line in `results`.
#
# Under TCG the emulated machine has been seen to stop: one vCPU stuck with interrupts off and the
# other spinning on it (RCU stalls, then soft lockups of 22 s over and over, for ever), or one CPU
# stuck in the kernel for minutes. Nothing runs in the guest any more, no deadline of its own can
# fire. The watchdog here ends such a VM within minutes instead of at the run's deadline:
#   frozen   no heartbeat for NGK_FROZEN seconds (180), or none NGK_BOOT_WAIT (600) after boot;
#   lockup   the guest kernel reports a CPU stuck for 120 s or more;
#   stalled  the running binary is NGK_OVERRUN (180) seconds past its deadline: the guest's
#            `timeout` could not end it (a task stuck in the kernel).
# Each is printed with the binary it happened in and the console's last lines, and the VM is
# booted again (NGK_ATTEMPTS boots in all, 3), resuming at the binary that did not end. A test
# that fails is never run again: only a VM that stopped answering is.

NGK_QEMU=${NGK_QEMU:-qemu-system-x86_64}
NGK_FROZEN=${NGK_FROZEN:-180}
NGK_BOOT_WAIT=${NGK_BOOT_WAIT:-600}
NGK_OVERRUN=${NGK_OVERRUN:-180}
NGK_ATTEMPTS=${NGK_ATTEMPTS:-3}
NGK_POLL=${NGK_POLL:-2}

# run_vm KDIR OUT DEADLINE: one boot, until the guest powers off, DEADLINE seconds pass or the
# watchdog stops it. Sets vm_end (done, frozen, lockup or stalled) and qrc (qemu's status).
run_vm() {
  local kdir=$1 out=$2 deadline=$3 pid t0 now hb last_hb="" hb_at cur last_cur="" cur_at
  nice -n 10 timeout --kill-after=10 "$deadline" "$NGK_QEMU" \
    -accel tcg -cpu max -m 2048 -smp 2 -nographic -no-reboot -nic none \
    -kernel "$kdir/vmlinuz" -initrd "$out/initramfs.gz" \
    -append "console=ttyS0 panic=-1 rdinit=/init loglevel=4 mitigations=off" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev local,id=ngkout,path="$out",security_model=none \
    -device virtio-9p-pci,fsdev=ngkout,mount_tag=ngkout \
    -device virtio-rng-pci \
    -serial file:"$out/console.log" -monitor none </dev/null >"$out/qemu.log" 2>&1 &
  pid=$!
  vm_end=done t0=$(date +%s)
  hb_at=$t0 cur_at=$t0
  while kill -0 "$pid" 2>/dev/null; do
    sleep "$NGK_POLL"
    now=$(date +%s)
    hb=$(cat "$out/heartbeat" 2>/dev/null || true)
    # (an empty read is the guest rewriting the file)
    if [ -n "$hb" ] && [ "$hb" != "$last_hb" ]; then last_hb=$hb hb_at=$now; fi
    cur=$(cat "$out/current" 2>/dev/null || true)
    if [ "$cur" != "$last_cur" ]; then last_cur=$cur cur_at=$now; fi
    if grep -qE 'soft lockup - CPU#[0-9]+ stuck for ([0-9]{4,}|[2-9][0-9]{2}|1[2-9][0-9])s' "$out/console.log" 2>/dev/null; then
      vm_end=lockup
    elif [ -z "$last_hb" ] && ((now - t0 > NGK_BOOT_WAIT)); then
      vm_end=frozen
    elif [ -n "$last_hb" ] && ((now - hb_at > NGK_FROZEN)); then
      vm_end=frozen
    elif [[ $cur =~ ^[a-z_]+\ [0-9]+$ ]] && ((now - cur_at > ${cur##* } + NGK_OVERRUN)); then
      vm_end=stalled
    fi
    if [ "$vm_end" != done ]; then
      pkill -KILL -P "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
  done
  set +e
  wait "$pid" 2>/dev/null
  qrc=$?
  set -e
}

# vm_end_reason OUT: what the watchdog saw, in words.
vm_end_reason() {
  local out=$1
  case $vm_end in
  frozen)
    if [ -s "$out/heartbeat" ]; then
      echo "froze (no heartbeat for ${NGK_FROZEN}s)"
    else
      echo "froze before its first heartbeat (${NGK_BOOT_WAIT}s)"
    fi
    ;;
  lockup) echo "locked up ($(grep -m1 -oE 'soft lockup - CPU#[0-9]+ stuck for [0-9]+s! \[[^]]*\]' "$out/console.log" 2>/dev/null || echo "a soft lockup"))" ;;
  stalled) echo "stalled (${NGK_OVERRUN}s past the deadline of the binary running)" ;;
  *) echo "ended" ;;
  esac
}

# boot_kernel SUITE KVER KDIR OUT DEADLINE: boots until the guest ends on its own or NGK_ATTEMPTS
# boots were stopped by the watchdog. Sets vm_end and qrc of the last boot, secs (all boots),
# boots and vm_history (what stopped the earlier boots, in words).
boot_kernel() {
  local suite=$1 kver=$2 kdir=$3 out=$4 deadline=$5 attempt start running reason f
  secs=0 boots=0 vm_history=""
  for ((attempt = 1; attempt <= NGK_ATTEMPTS; attempt++)); do
    echo "==> $suite: booting $kver (qemu, TCG, -m 2048 -smp 2)"
    : >"$out/current"
    rm -f "$out/heartbeat"
    start=$(date +%s)
    run_vm "$kdir" "$out" "$deadline"
    secs=$((secs + $(date +%s) - start)) boots=$attempt
    [ "$vm_end" != done ] || return 0
    running=$(cut -d' ' -f1 "$out/current" 2>/dev/null || true)
    reason="$(vm_end_reason "$out") after $(($(date +%s) - start))s, in ${running:-the boot}"
    vm_history+="${vm_history:+; }boot $attempt $reason"
    echo "==> $suite: $kver $reason; the console's last lines:"
    tail -n 12 "$out/console.log" 2>/dev/null | tr -cd '[:print:]\n' | sed 's/^/    /'
    mkdir -p "$out/boot-$attempt"
    for f in console.log qemu.log heartbeat current ${running:+"$running.log"}; do
      [ ! -e "$out/$f" ] || mv "$out/$f" "$out/boot-$attempt/"
    done
    if ((attempt < NGK_ATTEMPTS)); then
      echo "==> $suite: booting it again (logs of that boot in $out/boot-$attempt/); the binaries that ended keep their results"
    fi
  done
}
