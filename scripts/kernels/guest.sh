#!/bin/bash
# scripts/kernels/guest.sh: runs as PID 1 inside a kernel layer VM (after scripts/kernels/init),
# in the host's filesystem under a tmpfs overlay. /ngk-out (the host's output directory for this
# kernel, writable) holds `env` (what to run) and receives one log per test binary, `results`
# (one line per binary: name, passed, failed, seconds, status), `facts`, and what the host's
# watchdog reads (scripts/kernels/vm.sh): `heartbeat` (the uptime, every 5 s) and `current` (the
# binary running and its deadline). A binary that has a line in `results` already (the VM was
# booted again after the emulated machine stopped) is not run again.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
. /ngk-out/env
OUT=/ngk-out

poweroff_now() {
  sync
  echo o >/proc/sysrq-trigger
  busybox poweroff -f
  sleep 60
}
trap poweroff_now EXIT
log() { echo "ngk-guest: [$(cut -d' ' -f1 /proc/uptime)s] $*" >/dev/console; }

log "root ready"
# The heartbeat: a process of its own, so that it stops only when the emulated machine does.
(while :; do cut -d' ' -f1 /proc/uptime >"$OUT/heartbeat"; sleep 5; done) &

# The root is the guest's own tmpfs (scripts/kernels/init): /run, /tmp and /var start empty,
# nothing of the host's /run/natguard, /var/lib/cni, ... is there.
mkdir -p /tmp /var/tmp /var/lib /var/log /run/lock
ln -s /run /var/run
chmod 1777 /tmp /var/tmp
mkdir -p /dev/pts /dev/shm /sys/fs/cgroup
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# What a systemd host delegates to its children (tests make pids cgroups).
for c in pids memory cpu; do echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; done
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
# The kernel's own modules where busybox's modprobe looks (the host has no kmod, and /lib is the
# host's, read-only): a small root on tmpfs with busybox and this kernel's modules, and a
# modprobe that runs there. It also serves the kernel's own module requests (nft expressions,
# conntrack helpers, ...).
mr=/run/ngk-modroot
mkdir -p "$mr/bin" "$mr/lib/modules/$NGK_KVER" /run/ngk-bin
cp /bin/busybox "$mr/bin/busybox"
mount --bind "$NGK_KDIR/root/lib/modules/$NGK_KVER" "$mr/lib/modules/$NGK_KVER"
printf '#!/bin/sh\nexec /usr/sbin/chroot %s /bin/busybox modprobe "$@"\n' "$mr" >/run/ngk-bin/modprobe
chmod 755 /run/ngk-bin/modprobe
echo /run/ngk-bin/modprobe >/proc/sys/kernel/modprobe
export PATH=/run/ngk-bin:$PATH
ip link set lo up
hostname "ngk-$NGK_SUITE"

log "loading modules"
# One modprobe for all of them (each call parses the module index, slow under emulation); then
# every name that is neither loaded nor built in is recorded as missing.
modprobe -a $NGK_MODULES 2>/dev/null
missing=()
for m in $NGK_MODULES; do
  m=${m//-/_}
  [ -d "/sys/module/$m" ] && continue
  grep -qE "/$m\.ko" "$mr/lib/modules/$NGK_KVER/modules.builtin" 2>/dev/null && continue
  missing+=("$m")
done
# The tests fill conntrack tables with 100,000 entries; a 2 GiB guest's default limit is lower.
sysctl -qw net.netfilter.nf_conntrack_max=1048576
{
  echo "kernel $(uname -r)"
  echo "modules_missing ${missing[*]:-none}"
  echo "io_uring_disabled $(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo absent)"
} >"$OUT/facts"

cd "$NGK_REPO"
export NATGUARD_TEST_TIME_FACTOR RUST_BACKTRACE=1 NGK_SUITE NGK_KVER
export NATGUARD_KERNEL_EXPECT="$NGK_EXPECT"
touch "$OUT/results"
for entry in $NGK_TESTS; do
  name=${entry%%=*} bin=${entry#*=}
  if grep -q "^$name " "$OUT/results"; then
    log "$name ended in an earlier boot"
    continue
  fi
  start=$(date +%s)
  log "running $name"
  filter_var=NGK_FILTER_$name timeout_var=NGK_TIMEOUT_$name
  echo "$name ${!timeout_var}" >"$OUT/current"
  # shellcheck disable=SC2086 # the filters are words
  timeout --kill-after=30 "${!timeout_var}" "$bin" ${!filter_var:-} >"$OUT/$name.log" 2>&1
  rc=$?
  : >"$OUT/current"
  secs=$(($(date +%s) - start))
  line=$(grep -E '^test result:' "$OUT/$name.log" | tail -n1)
  passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line")
  failed=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line")
  echo "$name ${passed:--} ${failed:--} $secs $rc" >>"$OUT/results"
  sync
done
if [ -n "${NGK_BENCH+x}" ] && [ ! -e "$OUT/bench.rc" ]; then
  log "running scripts/bench.sh $NGK_BENCH"
  start=$(date +%s)
  echo "bench $NGK_BENCH_TIMEOUT" >"$OUT/current"
  # shellcheck disable=SC2086 # the arguments are words
  NG_BENCH_TOOLS=$NGK_BENCH_TOOLS timeout "$NGK_BENCH_TIMEOUT" scripts/bench.sh \
    --bin "$NGK_BENCH_BIN" --out "$OUT/bench" $NGK_BENCH >"$OUT/bench.log" 2>&1
  echo $? >"$OUT/bench.rc"
  echo $(($(date +%s) - start)) >"$OUT/bench.secs"
  : >"$OUT/current"
  sync
fi
echo done >>"$OUT/results.done"
