#!/usr/bin/env bash
# Fuzzes natguard's parsers of runtime input (network configuration, prevResult, CNI_ARGS and
# the CNI_* environment) and the plan built from what parses, for a bounded time.
# Fails on any crash, panic, failed assertion or sanitizer report.
#
#   scripts/fuzz.sh            # 60 seconds per target
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#
# Needs cargo-fuzz (installed from crates.io if missing) and a nightly compiler for the
# sanitizer flags: the nightly toolchain if rustup has one, otherwise the installed toolchain
# with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=(parse)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

toolchain=()
if rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
    toolchain=(+nightly)
else
    echo "fuzz.sh: no nightly toolchain; using $(rustc --version) with RUSTC_BOOTSTRAP=1" >&2
    export RUSTC_BOOTSTRAP=1
fi

# The crate's .cargo/config.toml links the plugin statically; sanitizers need the dynamic
# runtime, and cargo-fuzz sets its own RUSTFLAGS, which take precedence over the config's.
for t in "${targets[@]}"; do
    corpus=fuzz/corpus/$t
    mkdir -p "$corpus"
    log=$(mktemp)
    echo "fuzz.sh: fuzzing $t for ${seconds}s" >&2
    set +e
    cargo "${toolchain[@]}" fuzz run "$t" "$corpus" "fuzz/seeds/$t" -- \
        -max_total_time="$seconds" -dict="fuzz/$t.dict" -max_len=65536 \
        -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1
    status=$?
    set -e
    grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|Done |SUMMARY)' "$log" || true
    if [ "$status" -ne 0 ]; then
        echo "fuzz.sh: target $t FAILED (exit $status); last lines:" >&2
        tail -n 60 "$log" >&2
        echo "fuzz.sh: reproduce with: cargo ${toolchain[*]} fuzz run $t fuzz/artifacts/$t/<crash file>" >&2
        rm -f "$log"
        exit 1
    fi
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    rm -f "$log"
    echo "fuzz.sh: $t: ${runs:-?} executions in ${seconds}s, no crash"
done
