#!/usr/bin/env bash
# A mutation-testing campaign over engine/src with cargo-mutants
# (.cargo/mutants.toml holds the test command: the engine's unit tests
# and a short sweep of every simulator profile).
#
#   scripts/mutants.sh                          # every mutant (hours)
#   scripts/mutants.sh --shard 3/16             # one shard of 16 (a CI matrix job)
#   scripts/mutants.sh --file engine/src/forest/query.rs --file 'engine/src/service/pull/*.rs'
#   ARBOR_MUTANTS_SEEDS=4 scripts/mutants.sh ...  # more seeds per profile
#   scripts/mutants.sh --in-place ...           # mutate this tree (warm target/)
#
# No baseline run: cargo-mutants tests the baseline with the mutated
# package alone, where the sweep test of arbor-sim does not exist, so the
# test timeout is given instead: MUTANTS_TIMEOUT seconds (default 300; the
# unmutated test command takes well under a minute), and the build timeout
# MUTANTS_BUILD_TIMEOUT (default 1200).
#
# Writes mutants.out/ (cargo-mutants' own outcome files: caught.txt,
# missed.txt, timeout.txt, unviable.txt, outcomes.json) under
# MUTANTS_OUT (default target/mutants). Exits 0 when no mutant was missed,
# 2 when some were (their list is printed), as cargo-mutants does.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${MUTANTS_OUT:-target/mutants}"
mkdir -p "$out"
if ! cargo mutants --version >/dev/null 2>&1; then
    cargo install cargo-mutants --locked
fi
export ARBOR_MUTANTS_SEEDS="${ARBOR_MUTANTS_SEEDS:-2}"
status=0
cargo mutants --package arbor-engine --output "$out" --no-shuffle \
    --baseline=skip --timeout "${MUTANTS_TIMEOUT:-300}" \
    --build-timeout "${MUTANTS_BUILD_TIMEOUT:-1200}" "$@" || status=$?
if [ -s "$out/mutants.out/missed.txt" ]; then
    echo "== missed mutants ($out/mutants.out/missed.txt):"
    cat "$out/mutants.out/missed.txt"
fi
exit "$status"
