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
    targets=(apply_oplog decode crash_recovery sim)
fi

# libFuzzer flags per target.
# - max_len: the structured targets ignore bytes past their caps (MAX_OPS,
#   MAX_BATCHES, MAX_STEPS), so longer inputs only waste mutations.
# - entropic=0: the entropic schedule's per-feature bookkeeping costs ~30%
#   of an apply_oplog/crash_recovery run (redb makes every run hit ~10k
#   features); the plain schedule buys that much more runs.
# - no use_memcmp=0: this libFuzzer has no such flag (it only printed
#   "unrecognized flag"); its memcmp hooks stay on for every target.
# - reload=0 (all targets, below): no other process writes to the scratch
#   corpus, and rereading it every second was 4% of an apply_oplog run.
# - sim: madsim replaces the clock while a simulation runs, which confuses
#   libFuzzer's per-input timeout (hangs are caught by the simulation's own
#   time limit instead); len_control=0 lets inputs grow to full scripts at
#   once instead of staying at a few bytes while the seed alone finds
#   "new" coverage.
target_flags() {
    case "$1" in
        apply_oplog) echo "-max_len=400 -entropic=0 -timeout=10" ;;
        crash_recovery) echo "-max_len=1024 -entropic=0 -timeout=10" ;;
        sim) echo "-max_len=512 -len_control=0 -timeout=0" ;;
        *) echo "-timeout=10" ;;
    esac
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# The fuzz targets link arbor-sim, whose simulation modules use madsim's
# simulation API; cargo-fuzz appends RUSTFLAGS to its own flags.
export RUSTFLAGS="${RUSTFLAGS:-} --cfg madsim"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# FUZZ_TARGET_DIR moves the (large, instrumented) build out of fuzz/target.
# No compare tracing: it cost ~40% of every apply_oplog run (redb's page
# and key comparisons), and the structured targets map bytes onto tiny
# spaces where compare hints buy little; memcmp hooks still guide decode.
# -O: dependencies without debug assertions; our crates keep them (see
# the profile overrides in fuzz/Cargo.toml).
build_args=(-s none -O --no-trace-compares)
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
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 -reload=0 \
        $(target_flags "$target") \
        >"$log" 2>&1 || rc=$?
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        echo "!!! $target failed (exit $rc); log tail:"
        tail -n 60 "$log"
        status=1
    fi
done
exit $status
