#!/usr/bin/env bash
# benches/tools/build.sh DIR: compiles the benchmark's three small tools into DIR, static and
# stripped: timeit (the spawner that reaps each measured process with wait4), netload (the
# datapath's load generator), both std only and built with plain rustc, and nfbench (conntrack
# entries and the nf_tables release profile through natguard's own kernel layer), a cargo
# example of the crate. scripts/bench.sh calls it, and scripts/kernels.sh --bench on the host,
# since the kernel layer's VMs have no compiler.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: benches/tools/build.sh DIR" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for t in timeit netload; do
  rustc -O -C target-feature=+crt-static -C panic=abort -C strip=symbols --edition 2021 \
    "$here/$t.rs" -o "$1/$t"
done
(cd "$here/../.." && cargo build --release --quiet --example nfbench)
cp "$here/../../target/x86_64-unknown-linux-gnu/release/examples/nfbench" "$1/nfbench"
