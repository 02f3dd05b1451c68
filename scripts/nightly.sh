#!/usr/bin/env bash
# A continuous seed campaign on one machine: each round pulls main, builds
# the simulator, sweeps a fresh range of seeds for every profile, appends
# one JSON line per seed to a ledger and keeps the records of failing seeds
# apart, with their capsules (as they ran, and shrunk) in DIR/failures/capsules. Seeds never repeat across rounds: the next free seed is kept in a
# state file, so weeks of rounds cover an ever longer range.
#
#   scripts/nightly.sh [--rounds N] [--seeds-per-round N] [--dir DIR]
#
# Every failing seed's record carries its replay command. Stop with Ctrl-C;
# a round in progress is not counted and its range is swept again.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=1
seeds_per_round=2000
dir=nightly
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --seeds-per-round) seeds_per_round="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        *) echo "usage: $0 [--rounds N] [--seeds-per-round N] [--dir DIR]" >&2; exit 2 ;;
    esac
done
mkdir -p "$dir/failures"
state="$dir/next-seed"
[ -f "$state" ] || echo 1000000 > "$state"

for ((round = 1; round <= rounds; round++)); do
    if git rev-parse --abbrev-ref HEAD | grep -qx main; then
        git pull --ff-only --quiet || echo "nightly: git pull failed; sweeping the checked-out commit" >&2
    fi
    commit=$(git rev-parse --short HEAD)
    cargo build --release --quiet -p arbor-sim --bin arbor-sim
    start=$(cat "$state")
    status=0
    for profile in standard push-only sync-heavy storage-errors; do
        records="$dir/round-$commit-$start-$profile.jsonl"
        target/release/arbor-sim sweep --seeds "$seeds_per_round" --seed-start "$start" \
            --profile "$profile" --jobs "$(nproc)" --jsonl "$records" \
            --keep-failures "$dir/failures/capsules" \
            || status=$?
        [ "$status" -le 1 ] || { echo "nightly: sweep could not run (exit $status)" >&2; exit "$status"; }
        cat "$records" >> "$dir/ledger.jsonl"
        grep -v '"verdict":"pass"' "$records" >> "$dir/failures/records.jsonl" || true
        rm -f "$records"
    done
    echo $((start + seeds_per_round)) > "$state"
    echo "nightly: round $round at $commit, seeds $start..$((start + seeds_per_round - 1)), exit $status"
done
