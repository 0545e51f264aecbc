#!/usr/bin/env bash
# benches/tools/build.sh DIR: compiles the benchmark's two small tools into DIR, static and
# stripped: timeit (the spawner that reaps each measured process with wait4) and netload (the
# datapath's load generator). scripts/bench.sh calls it, and scripts/kernels.sh --bench on the
# host, since the kernel layer's VMs have no compiler.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: benches/tools/build.sh DIR" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for t in timeit netload; do
  rustc -O -C target-feature=+crt-static -C panic=abort -C strip=symbols --edition 2021 \
    "$here/$t.rs" -o "$1/$t"
done
