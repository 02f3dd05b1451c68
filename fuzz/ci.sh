#!/usr/bin/env bash
# Runs every fuzz target for a bounded time; exits non-zero on the first
# crash (libFuzzer leaves the input in fuzz/artifacts/<target>/).
#
#   fuzz/ci.sh                 # every target, FUZZ_SECONDS (default 40) each
#   FUZZ_SECONDS=300 fuzz/ci.sh decode
#   FUZZ_TARGET_DIR=/tmp/fuzz-target fuzz/ci.sh
#
# New inputs go to a scratch corpus seeded from the committed one, so a run
# never adds files to fuzz/corpus/.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

seconds="${FUZZ_SECONDS:-40}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(apply_oplog decode crash_recovery)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# The fuzz targets link arbor-sim, whose simulation modules use madsim's
# simulation API; cargo-fuzz appends RUSTFLAGS to its own flags.
export RUSTFLAGS="${RUSTFLAGS:-} --cfg madsim"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# FUZZ_TARGET_DIR moves the (large, instrumented) build out of fuzz/target.
build_args=(-s none)
if [ -n "${FUZZ_TARGET_DIR:-}" ]; then
    build_args+=(--target-dir "$FUZZ_TARGET_DIR")
fi

# Build once up front so the time budget below is spent fuzzing.
cargo fuzz build "${build_args[@]}"

status=0
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "corpus/$target"
    echo "=== fuzzing $target for ${seconds}s"
    log="$scratch/$target.log"
    rc=0
    cargo fuzz run "${build_args[@]}" "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        >"$log" 2>&1 || rc=$?
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        echo "!!! $target failed (exit $rc); log tail:"
        tail -n 60 "$log"
        status=1
    fi
done
exit $status
