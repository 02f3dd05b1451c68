#!/usr/bin/env bash
# Measures Arbor's current figures and writes docs/results.md, plus the
# canary table of README.md (between its canaries markers), so that both
# come from one run. The shrink section also writes each canary's minimal
# capsule to sim-tests/regressions/, which `cargo test` replays.
#
#   scripts/results.sh                      # every section, full size
#   scripts/results.sh --quick              # smaller counts and durations
#   scripts/results.sh --only sweep,load    # re-measure some sections
#   scripts/results.sh --only scale --objects 10000000
#                                           # the scale bench at 10^7 objects
#   scripts/results.sh --list               # the sections and their commands
#   scripts/results.sh --only campaign --base-bin OLD/arbor-sim
#                                           # every profile at 1,000 seeds, and
#                                           # seeds/min beside an older build
#   scripts/results.sh --only mutants       # the mutation-testing sample (opt-in:
#                                           # not in the default set: it builds
#                                           # the engine once per mutant)
#
# A section that is not run keeps what docs/results.md already holds; each
# section names the commit, CPU and mode of the run that measured it.
# Run it on a quiet machine: timed figures measure the host as much as the
# code. Needs bash, git, jq and cargo; cargo-fuzz for the fuzz section.
set -euo pipefail

readonly SECTIONS=(sweep campaign claims canaries shrink bench compare crash profile fuzz load tls clean-rate grid grpc sim-load scale mutants)
# What a run without --only measures: every section but the opt-in ones.
readonly OPT_IN=(mutants)

usage() {
    sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    cat <<EOF

Options:
  --quick          smaller counts and durations; every command shown is the
                   one that ran, and the sections say they are quick
  --only LIST      comma-separated sections of: ${SECTIONS[*]}
                   (${OPT_IN[*]} only when named here)
  --sim-bin PATH   use this arbor-sim binary instead of building one
  --base-bin PATH  campaign: an arbor-sim built from an earlier commit; its
                   standard sweep alternates with this one's to compare
                   seeds per minute in one run
  --base-label TEXT
                   campaign: what --base-bin was built from (shown as given)
  --out FILE       where the results go (default docs/results.md)
  --readme FILE    whose canary table to rewrite (default README.md)
  --beside-in-process
                   clean-rate: search again with direct in-process calls
                   beside the TCP and TLS searches
  --objects N      scale: objects in the bucket (default 1000000, 100000
                   with --quick)
  --campaign-seeds N
                   campaign: seeds per profile (default 1000, 20 with --quick)
  --list           print the sections and their commands, run nothing
EOF
}

quick=0
beside=0
only=""
sim_bin=""
base_bin=""
base_label="an earlier build"
list=0
scale_objects=""
campaign_override=""
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/docs/results.md"
readme="$root/README.md"

while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) only="${2:?--only needs a list}"; shift ;;
        --sim-bin) sim_bin="${2:?--sim-bin needs a path}"; shift ;;
        --base-bin) base_bin="${2:?--base-bin needs a path}"; shift ;;
        --base-label) base_label="${2:?--base-label needs a text}"; shift ;;
        --out) out="${2:?--out needs a file}"; shift ;;
        --readme) readme="${2:?--readme needs a file}"; shift ;;
        --beside-in-process) beside=1 ;;
        --objects) scale_objects="${2:?--objects needs a count}"; shift ;;
        --campaign-seeds) campaign_override="${2:?--campaign-seeds needs a count}"; shift ;;
        --list) list=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

# ---------------------------------------------------------------------------
# Sizes: the full run and what --quick runs instead.

if [ "$quick" = 1 ]; then
    sweep_seeds=20
    campaign_seeds=20
    cost_seeds=20; cost_rounds=1
    canary_seeds=10
    bench_args=(-- --ops 20000 --reapply 20000)
    compare_args=(--ops 20000 --rounds 1)
    crash_args=(--crash-replay --ops 100000 --batch 100)
    profile_ops=20000
    profile_load=(--rate 20000 --duration 5s)
    fuzz_seconds=10
    load_duration=5s
    search_start=5000; search_duration=3s; search_probes=2
    grid_duration=3s
    grpc_profile_duration=8s; grpc_profile_delay_ms=4000
    grpc_goal_rounds=1
    sim_load_duration=1m
    scale_default=100000
    mutants_files=(engine/src/service/backoff.rs)
else
    sweep_seeds=200
    campaign_seeds=1000
    cost_seeds=200; cost_rounds=2
    canary_seeds=20
    bench_args=()
    compare_args=(--ops 100000 --rounds 2)
    crash_args=(--crash-replay --ops 1000000 --batch 100)
    profile_ops=100000
    profile_load=(--rate 28000 --duration 20s)
    fuzz_seconds=40
    load_duration=30s
    search_start=30000; search_duration=30s; search_probes=6
    grid_duration=30s
    grpc_profile_duration=30s; grpc_profile_delay_ms=10000
    grpc_goal_rounds=3
    sim_load_duration=15m
    scale_default=1000000
    mutants_files=(engine/src/service/backoff.rs engine/src/service/pull/epoch.rs engine/src/service/cursor.rs)
fi
if [ -n "$campaign_override" ]; then
    campaign_seeds="$campaign_override"
fi

scale_objects="${scale_objects:-$scale_default}"
case "$scale_objects" in
    ''|*[!0-9]*) echo "--objects needs a whole number" >&2; exit 2 ;;
esac

# The planted bugs (engine/src/canary.rs), the profile that reaches each,
# and what each does, in table order.
readonly CANARIES=(
    "ReplicationDropsOnFullQueue|push-only|replication drops ops when its queue is full"
    "SharedSyncCursor|sync-heavy|one sync cursor shared by all peers"
    "StaleUndoOnRedo|standard|redo keeps stale undo information"
    "OldOpWrongPosition|standard|an op older than the whole log applied at the wrong position"
    "FailedBatchHangs|storage-errors|a failed batch leaves its callers waiting"
    "SyncDropsTreeOnPeerError|sync-heavy|sync drops a tree on a transient peer error"
    "PathByArrivalOrder|standard|path resolution picks a duplicate directory by arrival order"
    "AuthorizationSkipped|standard|the service serves every caller everything"
    "PullCursorPastFailedPage|sync-only|a pull pass moves its cursor past a page that failed to apply"
    "PullCursorPersistedEarly|sync-only|the pull cursor is made durable before its page"
    "SubtreeDepthOffByOne|standard|GetSubTree descends one level too deep"
    "ResultsToWrongCallers|standard|two callers of one commit get each other's results"
    "MovesNoOp|standard|a move is logged but leaves its node where it was"
    "DefiniteFailureApplied|standard|a write refused for its input is applied anyway"
    "DropKeepsPullCursors|sync-heavy|a drop keeps the tree's pull cursors in memory"
    "DropForgetsMarks|sync-heavy|a tree created again after a drop restarts its counter and heights at zero"
    "PeerIdentityUnchecked|misconfig|sync pulls from a peer answering as another replica"
    "RejoinAcceptsWrites|replace|a node rejoining after its disk was replaced writes before it pulled its peers' logs"
    "JoinerStopsAfterFirstPage|members|a joining replica stops pulling a tree after its first page"
    "DropKeepsDirCache|sync-heavy|a drop keeps the directory cache and the tree created again takes back its number"
    "AckBeforeReplicas|replace|with ack_replicas 2 a write is answered before a peer holds it"
    "WalAckBeforeSync|standard|a write-ahead log record is answered before it is synced"
    "CheckpointWithoutPosition|standard|a checkpoint names an older log position than the database holds"
    "DirCacheKeptOnMove|standard|a directory moved away stays in the directory cache"
    "LatestPicksOldest|gateway|a latest-only lookup answers the oldest version of a key"
    "AnswerBudgetEighth|standard|node reads count their answers against an eighth of the byte budget"
    "WriterMayDrop|standard|Drop asks for the writer role instead of the owner's"
    "ReplicaOfAnyContainer|standard|a replica of any container counts as a replica of every one"
    "RemoveMissingDone|standard|Remove of a node the tree does not hold answers Done"
    "EvictedSlotKept|standard|a connection closed to make room keeps its connection slot"
    "RetriesAnyCall|standard|a write that failed on a pooled connection is sent again on a fresh one"
    "StreamSkipsPageStart|gateway|the gRPC GetSubTree stream loses the first node of every page after the first"
    "BrokenFrameKeepsBudget|standard|a frame whose connection breaks keeps the frame budget it reserved"
)
readonly PROFILES=(standard push-only sync-heavy storage-errors sync-only misconfig members replace gateway)

sweep_cmd() { echo "arbor-sim sweep --seeds $sweep_seeds --jobs $1"; }
campaign_cmd() { echo "arbor-sim sweep --seeds $campaign_seeds --jobs 2 --profile $1"; }
claims_cmd() { echo "arbor-sim sweep --seeds 40 --jobs 2 --check-claims --profile $1"; }
claims_small_cmd() { echo "arbor-sim sweep --seeds 20 --jobs 2 --check-claims --small --profile $1"; }
cost_cmd() { echo "arbor-sim sweep --seeds $cost_seeds --jobs 2"; }
canary_cmd() {
    echo "arbor-sim sweep --seeds $canary_seeds --small --jobs 2 --profile $1${2:+ --canary $2}"
}
shrink_cmd() {
    echo "arbor-sim shrink --seed $3 --small --jobs 2 --profile $1 --canary $2 --out sim-tests/regressions/canary-$2.json"
}
bench_cmd() { echo "cargo bench -p arbor-engine --bench engine ${bench_args[*]}" | sed 's/ *$//'; }
compare_cmd() { echo "cd benches-cmp && cargo run --release -- ${compare_args[*]}"; }
crash_cmd() { echo "cd benches-cmp && cargo run --release -- ${crash_args[*]}"; }
profile_cmd() {
    echo "perf record -F 4999 -o perf.data -- ENGINE_BENCH --only add_by_path --ops $profile_ops; perf report -i perf.data --no-children --sort sym --stdio"
}
profile_load_cmd() {
    echo "perf record -F 999 -g -o perf.data -- arbor-sim load --replicas 3 ${profile_load[*]} --no-progress; perf report -i perf.data --children --sort sym --stdio -g none"
}
fuzz_cmd() { echo "FUZZ_SECONDS=$fuzz_seconds fuzz/ci.sh"; }
load_cmd() { echo "arbor-sim load --rate 5000 --duration $load_duration --verify"; }
tls_cmd() {
    echo "arbor-sim load --replicas 3 --transport tcp,tls --rate $1 --duration $load_duration --verify"
}
# The gateway paths of the clean-rate search: plaintext TCP, the path users
# take, and mutual TLS (the replicas replicate over the same transport);
# with --beside-in-process direct calls beside them.
clean_rate_transport() { [ "$beside" = 1 ] && echo "tcp,tls,in-process" || echo "tcp,tls"; }
clean_rate_cmd() {
    echo "arbor-sim matrix --no-grid --replicas $1 --transport $(clean_rate_transport) --search-start $search_start --search-duration $search_duration --search-probes $search_probes"
}
grid_cmd() { echo "arbor-sim matrix --no-search --grid-duration $grid_duration"; }
grpc_cmd() {
    echo "arbor-sim matrix --no-search --replicas $1 --transport grpc,tcp --requests loader --grid-duration $grid_duration"
}
grpc_goal_cmd() {
    echo "arbor-sim load --replicas 3 --transport $1 --requests loader --rate 5000 --duration $grid_duration --sync 5m --no-progress"
}
grpc_profile_cmd() {
    echo "perf record -F 999 -D $grpc_profile_delay_ms -o perf.data -- arbor-sim load --replicas 3 --transport $1 --requests loader --rate 5000 --duration $grpc_profile_duration --no-progress; perf report -i perf.data --comms arbor-node --no-children --sort sym --stdio --percentage relative"
}
scale_cmd() { echo "cargo bench -p arbor-engine --bench scale -- --objects $scale_objects"; }
# The mutation sample runs in place: cargo-mutants' copy of the tree would
# rebuild every dependency (the copy's timestamps make them stale), while
# in place only the engine and its tests rebuild per mutant. Its seeds per
# profile are the campaign's default (scripts/mutants.sh).
mutants_seeds=2
mutants_cmd() {
    local f args=""
    for f in "${mutants_files[@]}"; do args+=" --file $f"; done
    echo "ARBOR_MUTANTS_SEEDS=$mutants_seeds scripts/mutants.sh --in-place$args"
}
sim_load_cmd() {
    echo "arbor-sim load --mode sim --replicas 3 --rate 1000 --sync 5m --duration $sim_load_duration --seed 7 --verify"
}

if [ "$list" = 1 ]; then
    echo "sweep:      $(sweep_cmd 1); $(sweep_cmd 2)"
    echo "campaign:   $(campaign_cmd P), for each profile; with --base-bin, $(cost_cmd) of both binaries, alternated, $cost_rounds round(s)"
    echo "claims:     $(claims_cmd P); $(claims_small_cmd P), for each profile"
    echo "canaries:   $(canary_cmd P C), for each canary; $(canary_cmd P), for each profile"
    echo "shrink:     $(shrink_cmd P C S), S the first failing seed of $(canary_cmd P C)"
    echo "bench:      $(bench_cmd)"
    echo "compare:    $(compare_cmd)"
    echo "crash:      $(crash_cmd)"
    echo "profile:    $(profile_cmd); $(profile_load_cmd) (only when perf is installed; ENGINE_BENCH is the binary cargo bench builds)"
    echo "fuzz:       $(fuzz_cmd) (only when cargo-fuzz is installed)"
    echo "load:       $(load_cmd)"
    echo "tls:        $(tls_cmd 5000); $(tls_cmd 1000)"
    echo "clean-rate: $(clean_rate_cmd 1); $(clean_rate_cmd 3)"
    echo "grid:       $(grid_cmd)"
    echo "grpc:       $(grpc_cmd 1); $(grpc_cmd 3); $grpc_goal_rounds round(s) of $(grpc_goal_cmd grpc) and of the same with tcp, alternated; $(grpc_profile_cmd grpc); the same with tcp (the profiles only when perf is installed)"
    echo "sim-load:   $(sim_load_cmd)"
    echo "scale:      $(scale_cmd)"
    echo "mutants:    $(mutants_cmd) (opt-in; only when cargo-mutants is installed)"
    exit 0
fi

wanted=()
if [ -z "$only" ]; then
    for name in "${SECTIONS[@]}"; do
        case " ${OPT_IN[*]} " in *" $name "*) ;; *) wanted+=("$name") ;; esac
    done
else
    IFS=',' read -r -a wanted <<<"$only"
    for name in "${wanted[@]}"; do
        case " ${SECTIONS[*]} " in
            *" $name "*) ;;
            *) echo "unknown section $name (one of: ${SECTIONS[*]})" >&2; exit 2 ;;
        esac
    done
fi
runs() { case " ${wanted[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

command -v jq >/dev/null || { echo "scripts/results.sh needs jq" >&2; exit 1; }
cd "$root"

# ---------------------------------------------------------------------------
# Provenance: which code, which machine, which mode.

commit="$(git rev-parse --short HEAD)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    commit="$commit (dirty)"
fi
cpu="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)"
if [ -z "$cpu" ] && command -v lscpu >/dev/null; then
    cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
fi
cpu="${cpu:-unknown CPU}"
cores="$(nproc 2>/dev/null || echo '?')"
mode_label() { [ "$quick" = 1 ] && echo "quick" || echo "full"; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log() { echo "[results] $*" >&2; }

# Runs a command, keeping its stdout in $work/$1.out and its stderr in
# $work/$1.err; returns the command's exit status without stopping.
capture() {
    local name="$1"; shift
    local rc=0
    "$@" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
    return $rc
}

# Wall time of a command in seconds, into $work/$1.wall.
timed() {
    local name="$1"; shift
    local start end rc=0
    start="$(date +%s%N)"
    capture "$name" "$@" || rc=$?
    end="$(date +%s%N)"
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", (b - a) / 1e9 }' >"$work/$name.wall"
    return $rc
}

needs_sim=0
for name in sweep campaign claims canaries shrink profile load tls clean-rate grid grpc sim-load; do
    runs "$name" && needs_sim=1
done
binary_note=""
if [ "$needs_sim" = 1 ]; then
    if [ -n "$sim_bin" ]; then
        [ -x "$sim_bin" ] || { echo "--sim-bin $sim_bin is not executable" >&2; exit 1; }
        binary_note="binary \`$sim_bin\` given with \`--sim-bin\` (not built by this run; its commit is not checked)"
    else
        log "building arbor-sim (release)"
        cargo build --release -p arbor-sim >&2
        sim_bin="${CARGO_TARGET_DIR:-target}/release/arbor-sim"
        binary_note="binary built by this run: \`cargo build --release -p arbor-sim\`"
    fi
fi
SIM() { "$sim_bin" "$@"; }

# The heading of each section.
title() {
    case "$1" in
        sweep) echo "Simulation sweep speed" ;;
        campaign) echo "Seed campaign over every profile" ;;
        claims) echo "What each profile reaches: its claims over seeds 1-40" ;;
        canaries) echo "Canaries" ;;
        shrink) echo "Shrinking each canary's first failure" ;;
        bench) echo "Engine bench" ;;
        compare) echo "Arbor beside pilorama's layout and Loro, durable AddByPath" ;;
        crash) echo "Opening a forest after a crash: what the write-ahead log replays" ;;
        profile) echo "Where the CPU goes: durable AddByPath, and three replicas over TCP" ;;
        fuzz) echo "Fuzzing speed" ;;
        load) echo "Load, real mode over TCP, 5000 requests/s" ;;
        tls) echo "Plaintext TCP and mutual TLS, 3 replicas, 5000 and 1000 requests/s" ;;
        clean-rate) echo "Highest clean rate, real mode over TCP and TLS, 1 and 3 replicas" ;;
        grid) echo "Reference grid, real mode over TCP" ;;
        grpc) echo "The reference loader's requests over gRPC beside the native protocol, 1 and 3 replicas" ;;
        sim-load) echo "Simulated load, 3 replicas" ;;
        scale) echo "A bucket at scale: ingest, storage, listing and catch-up of one large tree" ;;
        mutants) echo "Mutation testing: how many of a sample of the engine's mutants the checks catch" ;;
    esac
}

# The line under each section heading that says where its figures came from.
# The load average when the section starts says how quiet the machine was.
provenance() {
    local what="$1" load="$section_load"
    echo "<!-- results:mode=$(mode_label) -->"
    if [ "$quick" = 1 ]; then
        echo "**Quick run** (\`scripts/results.sh --quick\`: smaller counts and durations than the reference"
        echo "figures; the commands below are what ran)."
    fi
    echo "Commit $commit; $cpu, $cores cores, load average $load when the section started; $what."
    echo
}

# ---------------------------------------------------------------------------
# Sections. Each writes its markdown body to $work/<section>.md.

# Fields of the summary row a sweep prints (after its `|---:` line):
# runs failures seeds/min sent acked faults wall.
sweep_row() {
    { grep -A1 '^|-----:' "$1" || true; } | tail -n 1 | tr -d ' ' |
        awk -F'|' '{ print $2, $3, $4, $5, $6, $7, $8 }'
}

# What a section says when its command produced no result to read.
command_failed() {
    echo "**\`$2\` produced no result.** The end of its output:"
    echo
    echo '```'
    tail -q -n 20 "$work/$1.out" "$work/$1.err" 2>/dev/null
    echo '```'
    echo
}
sweep_fingerprint() { sed -n 's/.*trace fingerprint \([0-9a-f]*\).*/\1/p' "$1"; }
sweep_failing_seeds() { sed -n 's/^  seed \([0-9]*\): .*/\1/p' "$1"; }

section_sweep() {
    {
        echo "## $(title sweep)"
        echo
        provenance "$binary_note"
        echo "The standard scenario (3-4 replicas, 2,000 client ops over 60 simulated seconds, faults on),"
        echo "the same seeds on one and on two worker threads, one run right after the other."
        echo
        echo "| command | seeds/min | failures | ops sent | ops acked | faults | wall | trace fingerprint |"
        echo "|---|---:|---:|---:|---:|---:|---:|---|"
    } >"$work/sweep.md"
    local jobs rate1="" rate2="" print1="" print2=""
    for jobs in 1 2; do
        log "sweep, $jobs job(s)"
        # A failing seed makes the sweep exit non-zero; the table says so.
        capture "sweep$jobs" SIM sweep --seeds "$sweep_seeds" --jobs "$jobs" || true
        local runs failures rate sent acked faults wall print
        read -r runs failures rate sent acked faults wall <<<"$(sweep_row "$work/sweep$jobs.out")"
        print="$(sweep_fingerprint "$work/sweep$jobs.out")"
        if [ -z "$runs" ]; then
            echo "| \`$(sweep_cmd "$jobs")\` | no summary printed; see below | | | | | | |" >>"$work/sweep.md"
            command_failed "sweep$jobs" "$(sweep_cmd "$jobs")" >>"$work/sweep.tail"
            continue
        fi
        echo "| \`$(sweep_cmd "$jobs")\` | $rate | $failures of $runs | $sent | $acked | $faults | $wall | \`$print\` |" >>"$work/sweep.md"
        if [ "$jobs" = 1 ]; then rate1="$rate"; print1="$print"; else rate2="$rate"; print2="$print"; fi
    done
    if [ -s "$work/sweep.tail" ]; then
        { echo; cat "$work/sweep.tail"; } >>"$work/sweep.md"
    fi
    {
        echo
        if [ -n "$rate1" ] && [ -n "$rate2" ]; then
            awk -v a="$rate1" -v b="$rate2" 'BEGIN { if (a > 0) printf "Two threads against one: %.2fx the seeds per minute.", b / a }'
            if [ "$print1" = "$print2" ]; then
                echo " Both runs printed the same trace fingerprint: the same simulations ran."
            else
                echo " **The two runs printed different trace fingerprints**: a run is not deterministic."
            fi
            echo
        fi
        echo "\`arbor-sim\` is \`target/release/arbor-sim\` (\`cargo build --release -p arbor-sim\`);"
        echo "\`cargo run --release -p arbor-sim -- sweep --seeds 200\` runs the one-thread sweep."
    } >>"$work/sweep.md"
}

# The claims line of a sweep: "N of M reached" and what was not.
claims_of() {
    sed -n 's/^claims of profile [^:]*: //p' "$1" | head -n 1
}

section_claims() {
    {
        echo "## $(title claims)"
        echo
        provenance "$binary_note"
        echo "Each profile's claims (\`sim-tests/src/scenario/check/claims.rs\`): seeds 1-40 of the full-size"
        echo "scenario must reach all of them, seeds 1-20 of the test-size one (\`--small\`, what"
        echo "\`cargo test\` runs in \`tests/claims.rs\`) those marked as reached at that size."
        echo "\`--check-claims\` makes a missing claim exit 3."
        echo
        echo "| profile | full size, seeds 1-40 | failures | seeds/min | test size, seeds 1-20 | failures |"
        echo "|---|---|---:|---:|---|---:|"
    } >"$work/claims.md"
    local profile
    for profile in "${PROFILES[@]}"; do
        log "claims, profile $profile"
        capture "claims-$profile" SIM sweep --seeds 40 --jobs 2 --check-claims --profile "$profile" || true
        capture "claims-small-$profile" SIM sweep --seeds 20 --jobs 2 --check-claims --small --profile "$profile" || true
        local runs failures rate sent acked faults wall full small small_failures
        read -r runs failures rate sent acked faults wall <<<"$(sweep_row "$work/claims-$profile.out")"
        full="$(claims_of "$work/claims-$profile.out")"
        small="$(claims_of "$work/claims-small-$profile.out")"
        small_failures="$(sweep_row "$work/claims-small-$profile.out" | cut -d ' ' -f 2)"
        echo "| $profile | ${full:-no summary} | ${failures:-?} | ${rate:-?} | ${small:-no summary} | ${small_failures:-?} |" >>"$work/claims.md"
    done
    {
        echo
        echo "Commands: \`$(claims_cmd PROFILE)\` and \`$(claims_small_cmd PROFILE)\`."
    } >>"$work/claims.md"
}

# One sweep's table row for the campaign: its summary fields, or a note.
campaign_row() {
    local file="$1" label="$2" cmd="$3"
    local runs failures rate sent acked faults wall print
    read -r runs failures rate sent acked faults wall <<<"$(sweep_row "$file")"
    print="$(sweep_fingerprint "$file")"
    if [ -z "$runs" ]; then
        echo "| $label | no summary printed | | | | | | | \`$cmd\` |"
        return
    fi
    echo "| $label | $runs | $failures | $rate | $sent | $acked | $faults | $wall | \`$print\` | \`$cmd\` |"
}

section_campaign() {
    local profile failing=""
    local kept="${CARGO_TARGET_DIR:-target}/results-campaign"
    {
        echo "## $(title campaign)"
        echo
        provenance "$binary_note"
        echo "Every profile at full size (2,000 client ops over 60 simulated seconds), seeds"
        echo "1-$campaign_seeds on two worker threads, one profile after another. A failing seed is"
        echo "listed below the table; its capsule, as it ran, is kept in \`$kept/PROFILE\`."
        echo
        echo "| profile | seeds | failures | seeds/min | ops sent | ops acked | faults | wall | trace fingerprint | command |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
    } >"$work/campaign.md"
    for profile in "${PROFILES[@]}"; do
        log "campaign, profile $profile"
        mkdir -p "$kept/$profile"
        capture "campaign-$profile" SIM sweep --seeds "$campaign_seeds" --jobs 2 --profile "$profile" \
            --keep-failures "$kept/$profile" --shrink-trials 0 || true
        campaign_row "$work/campaign-$profile.out" "$profile" "$(campaign_cmd "$profile")" >>"$work/campaign.md"
        local seed
        for seed in $(sweep_failing_seeds "$work/campaign-$profile.out" | sort -n | head -n 10); do
            failing+="- $profile seed $seed: \`arbor-sim replay --seed $seed --profile $profile\`"$'\n'
        done
    done
    {
        echo
        if [ -n "$failing" ]; then
            echo "Failing seeds (at most ten per profile):"
            echo
            printf '%s' "$failing"
        else
            echo "No seed failed."
        fi
        echo
        echo "### What the checkers cost"
        echo
    } >>"$work/campaign.md"
    if [ -z "$base_bin" ]; then
        echo "Not measured in this run: it needs \`--base-bin\`, an \`arbor-sim\` built from an earlier commit." >>"$work/campaign.md"
        return
    fi
    if [ ! -x "$base_bin" ]; then
        echo "Not measured: \`--base-bin $base_bin\` is not executable." >>"$work/campaign.md"
        return
    fi
    {
        echo "The standard sweep \`$(cost_cmd)\` of this run's binary and of \`$base_bin\`"
        echo "($base_label), alternated, $cost_rounds round(s), one right after the other."
        echo "The earlier build's scenario is its own (fewer checks, and the workload of its time)."
        echo
        echo "| binary | round | seeds | failures | seeds/min | ops sent | ops acked | faults | wall | trace fingerprint | command |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    } >>"$work/campaign.md"
    local round side bin runs wall base_totals="" this_totals=""
    for round in $(seq 1 "$cost_rounds"); do
        for side in base this; do
            bin="$sim_bin"; [ "$side" = base ] && bin="$base_bin"
            log "campaign cost, $side, round $round"
            capture "cost-$side-$round" "$bin" sweep --seeds "$cost_seeds" --jobs 2 || true
            campaign_row "$work/cost-$side-$round.out" "$side | $round" "$(cost_cmd)" >>"$work/campaign.md"
            read -r runs _ _ _ _ _ wall <<<"$(sweep_row "$work/cost-$side-$round.out")"
            [ -n "$runs" ] || continue
            # Seeds and wall seconds of each sweep, summed below.
            if [ "$side" = base ]; then base_totals+=" $runs ${wall%s}"; else this_totals+=" $runs ${wall%s}"; fi
        done
    done
    {
        echo
        awk -v base="$base_totals" -v this="$this_totals" '
        function per_minute(pairs,    n, f, i, seeds, seconds) {
            n = split(pairs, f, " ")
            for (i = 1; i < n; i += 2) { seeds += f[i]; seconds += f[i + 1] }
            return seconds > 0 ? 60 * seeds / seconds : 0
        }
        BEGIN {
            b = per_minute(base); t = per_minute(this)
            if (b > 0 && t > 0) {
                printf "Over every round: the earlier build %.1f seeds/min, this one %.1f seeds/min, %.2fx (%.0f %% %s).\n",
                    b, t, t / b, (t < b ? 100 * (b - t) / b : 100 * (t - b) / b), (t < b ? "slower" : "faster")
            } else {
                print "A sweep printed no summary: no ratio."
            }
        }'
    } >>"$work/campaign.md"
}

# First failing seed and failure count of one canary sweep; "-" when none.
canary_outcome() {
    local file="$1" first count kind
    first="$(sweep_failing_seeds "$file" | sort -n | head -n 1)"
    count="$(sweep_row "$file" | awk '{ print $2 }' || true)"
    kind="$(sed -n "s/^  seed ${first:-x}: \([^:]*\):.*/\1/p" "$file" | head -n 1)"
    echo "${first:--}|${count:-?}|${kind:--}"
}

section_canaries() {
    local entry name profile what first count kind
    local readme_rows="" rows=""
    for entry in "${CANARIES[@]}"; do
        IFS='|' read -r name profile what <<<"$entry"
        log "canary $name"
        capture "canary-$name" SIM sweep --seeds "$canary_seeds" --small --jobs 2 \
            --profile "$profile" --canary "$name" || true
        IFS='|' read -r first count kind <<<"$(canary_outcome "$work/canary-$name.out")"
        rows+="| \`$name\`: $what | $profile | $first | $count | $kind | \`$(canary_cmd "$profile" "$name")\` |"$'\n'
        readme_rows+="| $what | $profile | $first | $count |"$'\n'
    done
    local control="" off_total=0 off_unread=0 off
    for profile in "${PROFILES[@]}"; do
        log "canaries off, profile $profile"
        capture "control-$profile" SIM sweep --seeds "$canary_seeds" --small --jobs 2 \
            --profile "$profile" || true
        off="$(sweep_row "$work/control-$profile.out" | awk '{ print $2 }' || true)"
        if [ -n "$off" ]; then off_total=$((off_total + off)); else off_unread=$((off_unread + 1)); fi
        control+="| $profile | ${off:-?} | \`$(canary_cmd "$profile")\` |"$'\n'
    done
    {
        echo "## $(title canaries)"
        echo
        provenance "$binary_note"
        echo "Each planted bug switched on alone, seeds 1-$canary_seeds of the test-sized scenario (300 ops,"
        echo "15 simulated seconds, the size \`cargo test\` runs) in the profile that reaches it."
        echo "\"Caught as\" is the failure kind of the first failing seed."
        echo
        echo "| canary | profile | first failing seed | seeds of 1-$canary_seeds that fail | caught as | command |"
        echo "|---|---|---:|---:|---|---|"
        printf '%s' "$rows"
        echo
        echo "The same seeds with every canary off, in the same run:"
        echo
        echo "| profile | seeds of 1-$canary_seeds that fail | command |"
        echo "|---|---:|---|"
        printf '%s' "$control"
    } >"$work/canaries.md"
    {
        echo "| canary | profile | first failing seed | seeds of 1-$canary_seeds that fail |"
        echo "|---|---|---:|---:|"
        printf '%s' "$readme_rows"
        echo
        if [ "$quick" = 1 ]; then
            echo "Written by \`scripts/results.sh --quick\` (seeds 1-$canary_seeds only) at commit $commit;"
        else
            echo "Written by \`scripts/results.sh\` at commit $commit;"
        fi
        if [ "$off_unread" = 0 ]; then
            echo "with every canary off the same seeds gave $off_total failures over the ${#PROFILES[@]} profiles."
        else
            echo "with every canary off, $off_unread of the ${#PROFILES[@]} control sweeps printed no summary (see \`docs/results.md\`)."
        fi
        echo "Commands and details: \`docs/results.md\`, \"Canaries\"."
    } >"$work/readme-canaries.md"
}

# Fields of a shrink's "| before |" or "| after |" row: faults, clients,
# client ops, replicas, workload ms.
shrink_row() {
    { grep "^| $2 |" "$1" || true; } | head -n 1 | tr -d ' ' |
        awk -F'|' '{ sub(/ms$/, "", $7); print $3, $4, $5, $6, $7 }'
}

# Percent of a before count an after count is, or "-" for a zero before.
percent() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f %%", 100 * a / b; else print "-" }'; }

section_shrink() {
    local entry name profile what seed rows=""
    local bf bc bo br bw af ac ao ar aw trials
    for entry in "${CANARIES[@]}"; do
        IFS='|' read -r name profile what <<<"$entry"
        log "shrink $name: finding its first failing seed"
        capture "find-$name" SIM sweep --seeds "$canary_seeds" --small --jobs 2 \
            --profile "$profile" --canary "$name" || true
        seed="$(sweep_failing_seeds "$work/find-$name.out" | sort -n | head -n 1)"
        if [ -z "$seed" ]; then
            rows+="| \`$name\` | $profile | - | not caught by seeds 1-$canary_seeds | | | | | |"$'\n'
            continue
        fi
        log "shrink $name seed $seed"
        timed "shrink-$name" SIM shrink --seed "$seed" --small --jobs 2 --profile "$profile" \
            --canary "$name" \
            --out "sim-tests/regressions/canary-$name.json" || true
        read -r bf bc bo br bw <<<"$(shrink_row "$work/shrink-$name.out" before)"
        read -r af ac ao ar aw <<<"$(shrink_row "$work/shrink-$name.out" after)"
        trials="$(sed -n 's/.* in \([0-9]*\) trials.*/\1/p' "$work/shrink-$name.out")"
        kind="$(sed -n 's/^shrunk seed [0-9]* (\(.*\)) in .*/\1/p' "$work/shrink-$name.out")"
        rows+="| \`$name\` | $profile | $seed | ${kind:-?} | ${bf:-?} → ${af:-?} ($(percent "${af:-0}" "${bf:-0}")) | ${bo:-?} → ${ao:-?} ($(percent "${ao:-0}" "${bo:-0}")) | ${bc:-?} → ${ac:-?} | ${br:-?} → ${ar:-?}, ${bw:-?} → ${aw:-?} ms | ${trials:-?} | $(cat "$work/shrink-$name.wall") s |"$'\n'
    done
    {
        echo "## $(title shrink)"
        echo
        provenance "$binary_note"
        echo "For each canary, the first failing seed of \`$(canary_cmd PROFILE CANARY)\`, shrunk by"
        echo "\`$(shrink_cmd PROFILE CANARY SEED)\`: faults, clients and each client's"
        echo "op budget by delta debugging, then duration, replicas and batch size, keeping a step only"
        echo "when the same failure kind fires. Client ops count the ops after each client's opening"
        echo "burst (2 or 3 writes per client that every run makes). Wall time is the whole shrink on"
        echo "2 threads; trials are whole deterministic runs."
        echo
        echo "| canary | profile | seed | failure kind | faults | client ops | clients | replicas, workload | trials | wall |"
        echo "|---|---|---:|---|---|---|---|---|---:|---:|"
        printf '%s' "$rows"
    } >"$work/shrink.md"
}

section_bench() {
    log "engine bench"
    local status="ran"
    capture bench cargo bench -p arbor-engine --bench engine ${bench_args[@]+"${bench_args[@]}"} ||
        status="failed"
    {
        echo "## $(title bench)"
        echo
        provenance "built by \`cargo bench\` in this run"
        echo "Command: \`$(bench_cmd)\`. Each scenario opens a fresh redb file and commits"
        echo "durably (one fsync per batch); \`docs/engine-bench.md\` explains the scenarios and columns."
        echo
        if [ "$status" = ran ]; then
            sed -n 's/^\(ops=.*\)$/Parameters: `\1`./p' "$work/bench.out"
            echo
            grep '^|' "$work/bench.out"
        else
            echo "**The bench failed**; the end of its output:"
            echo
            echo '```'
            tail -n 20 "$work/bench.err"
            echo '```'
        fi
    } >"$work/bench.md"
}

# Runs the benches-cmp binary (its own workspace, built by cargo run) with
# the given arguments, its output kept as `capture` keeps it under $1.
benches_cmp() {
    local name="$1"; shift
    capture "$name" cargo run --release --manifest-path benches-cmp/Cargo.toml -- "$@"
}
readonly benches_cmp_note="built by \`cargo run --release\` in \`benches-cmp/\` (a workspace of its own) in this run"

section_crash() {
    log "open after a crash"
    local status="ran"
    benches_cmp crash "${crash_args[@]}" || status="failed"
    {
        echo "## $(title crash)"
        echo
        provenance "$benches_cmp_note"
        echo "Command: \`$(crash_cmd)\`. A child process adds the objects by path (7 meta fields)"
        echo "to a durable forest on its write-ahead log, in batches, asking for a checkpoint every"
        echo "\`pilorama.checkpoint_interval\` as the batcher does (the forest also makes one every"
        echo "\`pilorama.checkpoint_bytes\` of log), then aborts: no destructor runs, so redb holds"
        echo "its last checkpoint and the log the batches after it. The parent times redb's own"
        echo "recovery of the file (a database not closed cleanly is checked and its allocator"
        echo "state rebuilt), then the forest's open: the replay of the log after the last"
        echo "checkpoint, and a checkpoint. Defaults otherwise."
        echo
        if [ "$status" = ran ]; then
            echo '```'
            cat "$work/crash.out"
            echo '```'
            awk '
                /^child:/ { records = $7; checkpoints = $10 }
                /^crash replay:/ {
                    for (i = 1; i <= NF; i++) if ($i == "replaying") replayed = $(i + 1)
                }
                END {
                    if (checkpoints > 0) {
                        per = records / checkpoints
                        printf "\nThe log records between two checkpoints: %.0f on average; replayed after the crash: %d (%s one interval).\n", per, replayed, (replayed <= per ? "within" : "more than")
                    }
                }
            ' "$work/crash.out"
        else
            command_failed crash "$(crash_cmd)"
        fi
    } >"$work/crash.md"
}

section_compare() {
    log "Arbor, pilorama layout, Loro"
    local status="ran"
    benches_cmp compare "${compare_args[@]}" || status="failed"
    {
        echo "## $(title compare)"
        echo
        provenance "$benches_cmp_note"
        echo "Command: \`$(compare_cmd)\`. The same AddByPath workload as the engine bench (7 meta"
        echo "fields, 2-3 directories) on three sides, one after the other in each round: Arbor's forest"
        echo "durable on its write-ahead log (one record and one fsync per batch, a checkpoint every"
        echo "\`pilorama.checkpoint_interval\` as the batcher asks, and a final one, all timed), durable"
        echo "with one redb transaction per batch (\`pilorama.wal: false\`), and with non-durable commits"
        echo "(\`no_sync\`); pilorama's key layout re-created on redb"
        echo "(durable, same batches; \`benches-cmp/src/pilorama.rs\` says what it stores) and Loro's"
        echo "movable tree in memory (no file, no durability). CPU is the bench thread's; KiB/commit and"
        echo "B/op count what redb handed to its file plus the log's records and preallocated segments; fsyncs/s counts both files'"
        echo "syncs; checkpoints is their count x the mean time of the batch (or final call) that made"
        echo "each. The last column is ops/s over Arbor's log run in the same round."
        echo
        if [ "$status" = ran ]; then
            sed -n 's/^\(ops=.*\)$/Parameters: `\1`./p' "$work/compare.out"
            echo
            grep '^|' "$work/compare.out"
        else
            command_failed compare "$(compare_cmd)"
        fi
    } >"$work/compare.md"
}

# Self time of each sampled function, grouped by the code it belongs to:
# the kernel ([k]), Arbor (a name naming arbor::), redb, the allocator,
# libc's memory copies and compares, Rust's core/alloc/std, the rest.
profile_groups() {
    awk '
        /^#/ || !/%/ { next }
        {
            pct = $1; sub(/%/, "", pct); pct += 0
            line = $0; sub(/^ *[0-9.]+% +/, "", line)
            if (line ~ /^\[k\]/) g = "kernel: file writes, fsync, page faults"
            else if (line ~ /arbor(_engine_sim)?::/) g = "Arbor: forest logic, record encoding, key comparison"
            else if (line ~ /redb::/) g = "redb: B-tree descent, copy-on-write pages, commit"
            else if (line ~ /^\[\.\] engine::/) g = "the bench itself: building requests"
            else if (line ~ /(^|[^a-z_])(_?mi_|malloc|free|realloc|calloc|_int_|tcache|unlink_chunk|__rdl_|__rust_(alloc|dealloc|realloc|no_alloc))/) g = "allocator"
            else if (line ~ /mem(cpy|move|set|cmp)|__memcmp|__memmove|__memset|__memcpy|bcmp/) g = "libc memory copies and compares"
            else if (line ~ /xxh/) g = "xxh3 checksums and digests"
            else if (line ~ /(core|alloc|std|hashbrown)::/) g = "Rust core, alloc and std (hash maps, sorting, vectors)"
            else g = "other (libc system-call wrappers, unresolved)"
            total[g] += pct
            all += pct
        }
        END {
            for (g in total) printf "| %s | %.1f %% |\n", g, total[g] * 100 / all
        }
    ' "$1" | sort -t'|' -k3 -rn
}

# Where three replicas and the generator spend the machine near the
# highest clean rate: the kernel's work by the system call (or fault) that
# entered it, inclusive; user code by self time, grouped as above plus the
# generator, tokio and the wire's encoding.
profile_load_part() {
    echo "### Three replicas over TCP"
    echo
    if ! capture profile-load perf record -F 999 -g -o "$work/perf-load.data" -- \
            "$sim_bin" load --replicas 3 "${profile_load[@]}" --no-progress ||
        ! capture profile-load-report perf report -i "$work/perf-load.data" --children --sort sym \
            --stdio -g none; then
        command_failed profile-load "$(profile_load_cmd)"
        return
    fi
    echo "Command: \`$(profile_load_cmd)\`. The generator, three nodes and their replication in"
    echo "one process on this machine, sampled 999 times a second with kernel call chains. The"
    echo "run itself (perf adds its own cost):"
    echo
    echo '```'
    awk '/^  scenario / { on = ($2 == "user") } on && /scenario user|iterations\.\.\.|latency\.\.\./ { print }
        /peak RSS/ { print }' "$work/profile-load.out" | sed 's/^ *//'
    echo '```'
    echo
    echo "Kernel work by what entered the kernel, inclusive (a send over loopback includes the"
    echo "receiving side's protocol work; a page fault on fresh memory includes zeroing the page):"
    echo
    echo "| entered by | share of CPU samples |"
    echo "|---|---:|"
    awk '
        $4 == "asm_exc_page_fault" { printf "| page faults (fresh memory: zeroing, mapping) | %s |\n", $1 }
        $4 == "__x64_sys_sendto" { printf "| socket sends (sendto) | %s |\n", $1 }
        $4 == "__x64_sys_recvfrom" { printf "| socket receives (recvfrom) | %s |\n", $1 }
        $4 == "__x64_sys_pwrite64" { printf "| file writes (pwrite) | %s |\n", $1 }
        $4 == "__x64_sys_fdatasync" { printf "| fsync (fdatasync) | %s |\n", $1 }
        $4 == "__x64_sys_epoll_wait" { printf "| epoll_wait | %s |\n", $1 }
        $4 == "__x64_sys_futex" { printf "| futex | %s |\n", $1 }
    ' "$work/profile-load-report.out"
    echo
    echo "User code by self time:"
    echo
    echo "| code | share of CPU samples |"
    echo "|---|---:|"
    capture profile-load-self perf report -i "$work/perf-load.data" --no-children --sort sym --stdio -g none || true
    grep -v '\[k\]' "$work/profile-load-self.out" | awk '
        /^#/ || !/%/ { next }
        {
            pct = $1; sub(/%/, "", pct); pct += 0
            line = $0; sub(/^ *[0-9.]+% +/, "", line)
            if (line ~ /arbor_sim::/) g = "the generator itself (arbor-sim load; its calls run in the Arbor client)"
            else if (line ~ /arbor(_engine_sim)?::(proto|tcp)|serde|postcard/) g = "Arbor: wire framing and encoding"
            else if (line ~ /arbor(_engine_sim)?::/) g = "Arbor: service, forest, replication"
            else if (line ~ /redb::/) g = "redb"
            else if (line ~ /tokio::|mio::/) g = "tokio"
            else if (line ~ /(^|[^a-z_])(_?mi_|malloc|free|realloc|calloc|__rdl_|__rust_(alloc|dealloc|realloc))/) g = "allocator"
            else if (line ~ /mem(cpy|move|set|cmp)|bcmp/) g = "libc memory copies and compares"
            else if (line ~ /(core|alloc|std|hashbrown)::/) g = "Rust core, alloc and std"
            else g = "other"
            total[g] += pct
        }
        END { for (g in total) printf "| %s | %.1f %% |\n", g, total[g] }
    ' | sort -t'|' -k3 -rn
}

section_profile() {
    log "profile of durable AddByPath"
    {
        echo "## $(title profile)"
        echo
        provenance "built by \`cargo bench --no-run\` in this run, sampled by \`perf record\`"
        if ! command -v perf >/dev/null; then
            echo "**Not measured**: perf is not installed on the machine that ran this section."
            return
        fi
        local bin
        capture profile-build cargo bench -p arbor-engine --bench engine --no-run || true
        bin="$(sed -n 's/.*Executable benches\/engine.rs (\(.*\))$/\1/p' "$work/profile-build.err" | tail -n 1)"
        if [ -z "$bin" ] || [ ! -x "$bin" ] ||
            ! capture profile-run perf record -F 4999 -o "$work/perf.data" -- \
                "$bin" --only add_by_path --ops "$profile_ops" ||
            ! capture profile perf report -i "$work/perf.data" --no-children --sort sym --stdio; then
            command_failed profile-run "$(profile_cmd)"
            return
        fi
        echo "### Durable AddByPath"
        echo
        echo "Command: \`$(profile_cmd)\`. The \`add_by_path\` scenario of the engine bench (durable,"
        echo "batches of 100; the Arbor side of the comparison above) sampled 4999 times a second. Self"
        echo "time of every sampled function, grouped by whose code it is: a function whose name mentions"
        echo "\`arbor::\` is Arbor's (this includes Arbor's key comparators that redb calls), else one"
        echo "naming \`redb::\` is redb's. Share of all samples of the process, setup included:"
        echo
        grep '^|' "$work/profile-run.out" | sed -n '3p' | sed 's/^/Bench row: /'
        echo
        echo "The \`not durable\` row of the comparison above is the same bench's work with non-durable commits,"
        echo "which write nothing to the file: beside the durable row it is the share of Arbor's time"
        echo "that durability costs."
        echo
        echo "| code | share of CPU samples |"
        echo "|---|---:|"
        profile_groups "$work/profile.out"
        echo
        echo "The 15 functions with the most self time:"
        echo
        echo "| function | self |"
        echo "|---|---:|"
        awk '/^#/ || !/%/ { next } { pct = $1; line = $0; sub(/^ *[0-9.]+% +/, "", line);
            gsub(/\|/, "\\|", line); if (length(line) > 110) line = substr(line, 1, 107) "...";
            printf "| `%s` | %s |\n", line, pct; if (++n == 15) exit }' "$work/profile.out"
        echo
        profile_load_part
    } >"$work/profile.md"
}

section_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        log "cargo-fuzz is not installed: fuzz section skipped"
        {
            echo "## $(title fuzz)"
            echo
            echo "Not measured: cargo-fuzz was not installed on the machine of the run at commit $commit"
            echo "(\`cargo install cargo-fuzz --locked\`, then \`scripts/results.sh --only fuzz\`)."
        } >"$work/fuzz.md"
        return
    fi
    {
        echo "## $(title fuzz)"
        echo
        provenance "built by \`fuzz/ci.sh\` in this run"
    } >"$work/fuzz.md"
    log "fuzzing, ${fuzz_seconds}s per target"
    local status="passed"
    FUZZ_SECONDS="$fuzz_seconds" capture fuzz bash fuzz/ci.sh || status="failed"
    {
        echo "Command: \`$(fuzz_cmd)\` (each target for $fuzz_seconds s, from the committed corpus,"
        echo "with the flags \`fuzz/ci.sh\` gives it). Outcome: $status."
        echo
        echo "| target | runs | runs/s |"
        echo "|---|---:|---:|"
        awk '
            /^=== fuzzing / { target = $3 }
            /^stat::number_of_executed_units/ { runs[target] = $2 }
            /^stat::average_exec_per_sec/ { rate[target] = $2; order[++n] = target }
            END { for (i = 1; i <= n; i++) printf "| `%s` | %s | %s |\n", order[i], runs[order[i]], rate[order[i]] }
        ' "$work/fuzz.out"
    } >>"$work/fuzz.md"
}

# One scenario's figures from a load report: avg med p99 max errors dropped.
scenario_figures() {
    jq -r --arg name "$2" '.scenarios[] | select(.name == $name) |
        "\(.latency.avg_ms) \(.latency.med_ms) \(.latency.p99_ms) \(.latency.max_ms) \(.errors) \(.dropped)"' "$1"
}
ms() { awk -v v="$1" 'BEGIN { printf "%.2f ms", v }'; }

# The path a load report says it took: "real/single, gateway tcp, 1 replica(s)".
load_path() { jq -r '"\(.mode), gateway \(.gateway), \(.replicas) replica(s)"' "$1"; }

load_rows() {
    local json="$1" scenario avg med p99 max errors dropped
    echo "| scenario | avg | median | p99 | max | errors | dropped |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for scenario in user system; do
        read -r avg med p99 max errors dropped <<<"$(scenario_figures "$json" "$scenario")"
        echo "| $scenario | $(ms "$avg") | $(ms "$med") | $(ms "$p99") | $(ms "$max") | $errors | $dropped |"
    done
    echo
    jq -r '"Every acknowledged write read back: \(.verification.found) of \(.verification.acked) on \(.verification.replicas_checked) replica(s). Service: \(.service.writes_committed) writes in \(.service.batches_committed) commits (\(.service.batch_size_avg * 10 | round / 10) per commit), \(.service.writes_rejected_overload) refused as overloaded."' "$json"
}

section_load() {
    log "load, 5000/s for $load_duration"
    local status=0
    capture load SIM load --rate 5000 --duration "$load_duration" --verify --no-progress \
        --json "$work/load.json" --html "$work/load.html" || status=$?
    {
        echo "## $(title load)"
        echo
        provenance "$binary_note"
        echo "Command: \`$(load_cmd)\`: one node reached over loopback TCP, a durable redb file,"
        echo "the reference configuration; the user scenario (AddByPath, 7 meta fields) at 5000/s and"
        echo "the system scenario (Add) at 10/s. Latencies are wall-clock; exit status $status."
        echo
        if [ -s "$work/load.json" ]; then
            echo "Path: $(load_path "$work/load.json")."
            echo
            load_rows "$work/load.json"
        else
            command_failed load "$(load_cmd)"
        fi
    } >"$work/load.md"
}

# Each path of a report with paths beside it, scenario by scenario:
# | scenario | gateway | achieved/target | avg | p99 | max | errors | dropped |.
path_rows() {
    echo "| scenario | gateway | achieved / target | avg | p99 | max | errors | dropped |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
    jq -r '
        ([{gateway, scenarios: [.scenarios[] | {name, target_rate, achieved_rate,
            avg_ms: .latency.avg_ms, p99_ms: .latency.p99_ms, max_ms: .latency.max_ms,
            errors, dropped}]}] + .beside) as $paths
        | [$paths[0].scenarios[].name] as $names
        | $names[] as $name
        | $paths[] | .gateway as $gateway | .scenarios[] | select(.name == $name)
        | "| \(.name) | \($gateway) | \(.achieved_rate * 10 | round / 10) / \(.target_rate) /s | \(.avg_ms * 100 | round / 100) ms | \(.p99_ms * 100 | round / 100) ms | \(.max_ms * 100 | round / 100) ms | \(.errors) | \(.dropped) |"
    ' "$1"
    echo
    jq -r '([{gateway, verification}] + .beside)[] | select(.verification != null)
        | "Over \(.gateway): every acknowledged write read back: \(.verification.found) of \(.verification.acked) on \(.verification.replicas_checked) replica(s), \(.verification.missing) missing."' "$1"
}

section_tls() {
    local rate status
    {
        echo "## $(title tls)"
        echo
        provenance "$binary_note"
        echo "Three nodes replicating over loopback, the gateway reaching them over plaintext TCP,"
        echo "then the same load on a fresh cluster where every connection (gateway and replication)"
        echo "is mutual TLS 1.3 with certificates made for the run: one invocation per rate, the two"
        echo "paths one after the other. The user scenario (AddByPath) at the rate, the system scenario"
        echo "(Add) at 10/s. Latencies are wall-clock."
    } >"$work/tls.md"
    for rate in 5000 1000; do
        log "plaintext and TLS, 3 replicas, $rate/s for $load_duration each"
        status=0
        capture "tls-$rate" SIM load --replicas 3 --transport tcp,tls --rate "$rate" \
            --duration "$load_duration" --verify --no-progress \
            --json "$work/tls-$rate.json" --html "$work/tls-$rate.html" || status=$?
        {
            echo
            echo "Command: \`$(tls_cmd "$rate")\`; exit status $status."
            echo
            if [ -s "$work/tls-$rate.json" ]; then
                path_rows "$work/tls-$rate.json"
            else
                command_failed "tls-$rate" "$(tls_cmd "$rate")"
            fi
        } >>"$work/tls.md"
    done
}

# The highest clean rate of every path of a matrix report, as table rows:
# | replicas | gateway | highest clean rate | probes |.
clean_rate_rows() {
    jq -r '.replicas as $r | .paths[] |
        "| \($r) | \(.gateway) | \(if .highest_clean_rate then "**\(.highest_clean_rate) requests/s**" else "none" end) | \(.search | length) |"' "$1"
}

# Every probe of every path of a matrix report, one table per path.
clean_rate_probes() {
    jq -r '.replicas as $r | .paths[] |
        "", "Probes with \($r) replica(s), gateway \(.gateway):", "",
        "| probe rate | achieved | avg | p99 | errors | dropped | clean |",
        "|---:|---:|---:|---:|---:|---:|---|",
        (.search[] | "| \(.rate) | \(.achieved_rate | round) | \(.avg_ms * 100 | round / 100) ms | \(.p99_ms * 100 | round / 100) ms | \(.errors) | \(.dropped) | \(if .clean then "yes" else "no" end) |")' "$1"
}

section_clean_rate() {
    local replicas json reports=() bar=""
    for replicas in 1 3; do
        log "highest clean rate, $replicas replica(s)"
        json="$work/clean-rate-$replicas.json"
        capture "clean-rate-$replicas" SIM matrix --no-grid --replicas "$replicas" \
            --transport "$(clean_rate_transport)" --search-start "$search_start" \
            --search-duration "$search_duration" --search-probes "$search_probes" --no-progress \
            --json "$json" || true
        if [ -s "$json" ]; then
            reports+=("$json")
            bar="$(jq -r '.clean' "$json")"
        fi
    done
    {
        echo "## $(title clean-rate)"
        echo
        provenance "$binary_note"
        echo "Commands: \`$(clean_rate_cmd 1)\` and \`$(clean_rate_cmd 3)\`, one after the other."
        echo "The generator reaches the nodes over loopback TCP, as users do, plaintext and then mutual"
        echo "TLS (certificates made for the run); with 3 replicas they replicate to each other over the"
        echo "same transport. Each search runs after the previous one on the same machine. Clean: \`${bar:-p(99)<=100ms, rate==0, dropped==0}\`"
        echo "in both the user and the system scenario, and no iteration stuck. The search doubles the"
        echo "rate while probes are clean, then bisects between the best clean and the lowest unclean"
        echo "rate (one probe per rate)."
        echo
        if [ ${#reports[@]} -gt 0 ]; then
            echo "| replicas | gateway | highest clean rate | probes |"
            echo "|---:|---|---:|---:|"
            for json in "${reports[@]}"; do
                clean_rate_rows "$json"
            done
            for json in "${reports[@]}"; do
                clean_rate_probes "$json"
            done
            echo
        fi
        for replicas in 1 3; do
            if [ ! -s "$work/clean-rate-$replicas.json" ]; then
                command_failed "clean-rate-$replicas" "$(clean_rate_cmd "$replicas")"
            fi
        done
    } >"$work/clean-rate.md"
}

section_grid() {
    log "reference grid"
    capture grid SIM matrix --no-search --grid-duration "$grid_duration" --no-progress \
        --json "$work/grid.json" || true
    {
        echo "## $(title grid)"
        echo
        provenance "$binary_note"
        echo "Command: \`$(grid_cmd)\`: one node reached over loopback TCP, durable, user scenario"
        echo "at each rate with background sync every 5 minutes and off. The last column is the average"
        echo "the reference implementation reported for that rate (a constant in \`load/matrix.rs\`,"
        echo "not measured here)."
        echo
        if [ ! -s "$work/grid.json" ]; then
            command_failed grid "$(grid_cmd)"
            return
        fi
        echo "| gateway | rate | sync | avg | p90 | p99 | max | errors | dropped | reference avg |"
        echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
        jq -r '.paths[] | .gateway as $g | .grid[] | "| \($g) | \(.rate) | \(.sync) | \(.avg_ms * 100 | round / 100) ms | \(.p90_ms * 100 | round / 100) ms | \(.p99_ms * 100 | round / 100) ms | \(.max_ms * 100 | round / 100) ms | \(.errors) | \(.dropped) | \(if .reference_avg_ms then "\(.reference_avg_ms) ms" else "-" end) |"' \
            "$work/grid.json"
    } >"$work/grid.md"
}

# The grid of a matrix report over gRPC and TCP, one row per path and cell:
# | replicas | gateway | rate | sync | achieved | avg | p99 | errors | dropped | nodes' CPU | generator's CPU |.
grpc_grid_rows() {
    jq -r '.replicas as $r | .paths[] | .gateway as $g | .grid[] |
        "| \($r) | \($g) | \(.rate) | \(.sync) | \(.achieved_rate | round) | \(.avg_ms * 100 | round / 100) ms | \(.p99_ms * 100 | round / 100) ms | \(.errors) | \(.dropped) | \(if .nodes_cpu_us_per_request then "\(.nodes_cpu_us_per_request | round) µs" else "-" end) | \(if .generator_cpu_us_per_request then "\(.generator_cpu_us_per_request | round) µs" else "-" end) |"' "$1"
}

# Per cell, the nodes' CPU per request over gRPC and over TCP and their
# ratio, as "replicas rate sync grpc_us tcp_us ratio avg_ms p99_ms errors
# delivered" (avg, p99 and errors of the gRPC cell; delivered: "yes" when
# both paths took the whole load, no error, no dropped iteration, 99 % of
# the rate achieved, else which path did not), one line per cell.
grpc_ratios() {
    jq -r '.replicas as $r
        | ([.paths[] | select(.gateway == "grpc") | .grid[]]) as $g
        | ([.paths[] | select(.gateway == "tcp") | .grid[]]) as $t
        | range(0; [$g, $t] | map(length) | min) as $i
        | $g[$i] as $a | $t[$i] as $b
        | select($a.nodes_cpu_us_per_request != null and $b.nodes_cpu_us_per_request != null and $b.nodes_cpu_us_per_request > 0)
        | def whole: .errors == 0 and .dropped == 0 and .achieved_rate >= 0.99 * .rate;
          ([if ($a | whole) then empty else "grpc" end, if ($b | whole) then empty else "tcp" end]) as $short
        | "\($r) \($a.rate) \($a.sync) \($a.nodes_cpu_us_per_request) \($b.nodes_cpu_us_per_request) \($a.nodes_cpu_us_per_request / $b.nodes_cpu_us_per_request) \($a.avg_ms) \($a.p99_ms) \($a.errors) \(if ($short | length) == 0 then "yes" else "no-" + ($short | join("+")) end)"' "$1"
}

# Self time of the node threads' functions (a perf report filtered to
# them, relative), grouped by whose work it is.
node_profile_groups() {
    awk '
        /^#/ || !/%/ { next }
        {
            pct = $1; sub(/%/, "", pct); pct += 0
            line = $0; sub(/^ *[0-9.]+% +/, "", line)
            if (line ~ /p256::|primeorder::|elliptic_curve::|grpc::(comb|sign)::|sha2::|[Ss]ha512/) g = "signature verification (ECDSA P-256, SHA-512)"
            else if (line ~ /\[k\]/) g = "kernel: sockets, file writes, fsync, scheduling"
            else if (line ~ /h2::|hyper::|tonic::|prost::|tower::|http::|hpack|httparse/) g = "gRPC and HTTP/2 (tonic, hyper, h2, prost)"
            else if (line ~ /arbor(_engine_sim)?::grpc::/) g = "the gRPC front (translation)"
            else if (line ~ /arbor(_engine_sim)?::(proto|tcp)|serde|postcard/) g = "the native wire (framing, postcard)"
            else if (line ~ /redb::/) g = "redb"
            else if (line ~ /arbor(_engine_sim)?::/) g = "Arbor: service, forest, replication"
            else if (line ~ /tokio::|mio::/) g = "tokio"
            else if (line ~ /(^|[^a-z_])(_?mi_|malloc|free|realloc|calloc|__rdl_|__rust_(alloc|dealloc|realloc))/) g = "allocator"
            else if (line ~ /mem(cpy|move|set|cmp)|bcmp/) g = "libc memory copies and compares"
            else if (line ~ /(core|alloc|std|hashbrown)::/) g = "Rust core, alloc and std"
            else g = "other (libc, unresolved)"
            total[g] += pct
        }
        END { for (g in total) printf "%s|%.1f\n", g, total[g] }
    ' "$1" | sort -t'|' -k2 -rn
}

# perf of one 3-replica run at 5000/s over $1, node threads only: its
# report in $work/grpc-profile-$1.out, the run's JSON beside it.
grpc_profile_run() {
    local path="$1"
    capture "grpc-profile-run-$path" perf record -F 999 -D "$grpc_profile_delay_ms" -o "$work/perf-grpc-$path.data" -- \
        "$sim_bin" load --replicas 3 --transport "$path" --requests loader --rate 5000 \
        --duration "$grpc_profile_duration" --no-progress --json "$work/grpc-profile-$path.json" \
        --html "$work/grpc-profile-$path.html" &&
        capture "grpc-profile-$path" perf report -i "$work/perf-grpc-$path.data" --comms arbor-node \
            --no-children --sort sym --stdio --percentage relative
}

# The CPU goal's cell again, in alternated rounds of gRPC and TCP (the
# order swapped each round): one cell of the grid is one sample, and cells
# differ by 10-20 % from run to run on a shared host.
grpc_goal_part() {
    local round path order ratios=()
    echo "### The CPU goal's cell in $grpc_goal_rounds alternated round(s)"
    echo
    echo "Commands: \`$(grpc_goal_cmd grpc)\` and the same with \`--transport tcp\`, in each round"
    echo "one after the other, the order swapped from one round to the next, each on fresh nodes."
    echo
    echo "| round | first | gRPC | TCP | gRPC / TCP | gRPC avg | gRPC p99 | errors |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|"
    for round in $(seq 1 "$grpc_goal_rounds"); do
        if [ $((round % 2)) = 1 ]; then order="grpc tcp"; else order="tcp grpc"; fi
        for path in $order; do
            log "grpc: goal cell, round $round, $path"
            capture "grpc-goal-$round-$path" SIM load --replicas 3 --transport "$path" --requests loader \
                --rate 5000 --duration "$grid_duration" --sync 5m --no-progress \
                --json "$work/grpc-goal-$round-$path.json" || true
        done
        if [ -s "$work/grpc-goal-$round-grpc.json" ] && [ -s "$work/grpc-goal-$round-tcp.json" ]; then
            jq -r -s --arg round "$round" --arg first "${order%% *}" '
                .[0] as $g | .[1] as $t
                | ($g.scenarios[] | select(.name == "user")) as $u
                | "| \($round) | \($first) | \($g.cpu.nodes_us_per_request | round) µs | \($t.cpu.nodes_us_per_request | round) µs | \($g.cpu.nodes_us_per_request / $t.cpu.nodes_us_per_request * 100 | round / 100)x | \($u.latency.avg_ms * 100 | round / 100) ms | \($u.latency.p99_ms * 100 | round / 100) ms | \([$g.scenarios[].errors, $t.scenarios[].errors] | add) |"' \
                "$work/grpc-goal-$round-grpc.json" "$work/grpc-goal-$round-tcp.json"
        else
            echo "| $round | ${order%% *} | failed | | | | | |"
        fi
    done
    echo
    jq -r -s '
        [range(0; length; 2) as $i | .[$i].cpu.nodes_us_per_request / .[$i + 1].cpu.nodes_us_per_request] as $r
        | if ($r | length) == 0 then "No round measured both paths: not judged."
          else ($r | add / length) as $m
            | "The mean of the rounds'"'"' ratios: \($m * 1000 | round / 1000)x against the goal of at most 1.3x: **\(if $m <= 1.3 then "met" else "missed" end)**."
          end' $(for round in $(seq 1 "$grpc_goal_rounds"); do
            if [ -s "$work/grpc-goal-$round-grpc.json" ] && [ -s "$work/grpc-goal-$round-tcp.json" ]; then
                echo "$work/grpc-goal-$round-grpc.json" "$work/grpc-goal-$round-tcp.json"
            fi
        done) </dev/null
    echo
}

grpc_profile_part() {
    echo "### Where the nodes' CPU goes, gRPC and TCP, 3 replicas at 5000/s"
    echo
    if ! command -v perf >/dev/null; then
        echo "**Not measured**: perf is not installed on the machine that ran this section."
        return
    fi
    local path
    for path in grpc tcp; do
        log "grpc: profile over $path"
        if ! grpc_profile_run "$path"; then
            command_failed "grpc-profile-run-$path" "$(grpc_profile_cmd "$path")"
            return
        fi
        node_profile_groups "$work/grpc-profile-$path.out" >"$work/grpc-groups-$path.txt"
    done
    echo "Commands: \`$(grpc_profile_cmd grpc)\`, then the same with \`--transport tcp\`, one after the"
    echo "other. Samples of the node threads only (the nodes' runtime names its threads \`arbor-node\`;"
    echo "the generator's, \`arbor-load\`, are left out), self time grouped by whose code it is. On"
    echo "the node threads only the front verifies signatures (the generator signs on its own), so"
    echo "the first group is what verification costs the nodes. perf starts sampling"
    echo "$((grpc_profile_delay_ms / 1000)) s into each run (\`-D\`), after the nodes have started and built the load key's"
    echo "verification table, so that only the load is sampled. The runs themselves (perf adds its"
    echo "own cost; CPU per request is over the whole load):"
    echo
    echo "| gateway | user avg | user p99 | errors | nodes' CPU per request | verification's share | verification per request |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for path in grpc tcp; do
        local share
        share="$(awk -F'|' '/^signature verification/ { print $2 }' "$work/grpc-groups-$path.txt")"
        jq -r --arg path "$path" --arg share "${share:-0}" '
            (.scenarios[] | select(.name == "user")) as $u
            | "| \($path) | \($u.latency.avg_ms * 100 | round / 100) ms | \($u.latency.p99_ms * 100 | round / 100) ms | \([.scenarios[].errors] | add) | \(.cpu.nodes_us_per_request | round) µs | \($share) % | \(.cpu.nodes_us_per_request * ($share | tonumber) / 100 | round) µs |"' \
            "$work/grpc-profile-$path.json"
    done
    echo
    echo "| code (node threads) | gRPC | TCP |"
    echo "|---|---:|---:|"
    awk -F'|' '
        FNR == NR { grpc[$1] = $2; order[++n] = $1; next }
        { tcp[$1] = $2; if (!($1 in grpc)) order[++n] = $1 }
        END { for (i = 1; i <= n; i++) printf "| %s | %s %% | %s %% |\n", order[i], (order[i] in grpc ? grpc[order[i]] : "0.0"), (order[i] in tcp ? tcp[order[i]] : "0.0") }
    ' "$work/grpc-groups-grpc.txt" "$work/grpc-groups-tcp.txt"
}

section_grpc() {
    local replicas json reports=()
    for replicas in 1 3; do
        log "gRPC beside TCP, $replicas replica(s), grid of $grid_duration cells"
        json="$work/grpc-$replicas.json"
        capture "grpc-$replicas" SIM matrix --no-search --replicas "$replicas" --transport grpc,tcp \
            --requests loader --grid-duration "$grid_duration" --no-progress --json "$json" || true
        [ -s "$json" ] && reports+=("$json")
    done
    {
        echo "## $(title grpc)"
        echo
        provenance "$binary_note"
        echo "Commands: \`$(grpc_cmd 1)\` and \`$(grpc_cmd 3)\`, one after the other. The reference"
        echo "loader's requests (container all zeros; \`system\`: Add under the root with the same seven"
        echo "meta pairs at 10/s; \`user\`: AddByPath of \`test/only/path/N\`, seven meta fields, at the"
        echo "rate; 5 s deadline; constant arrival rate), sent by the generator over the gRPC front"
        echo "(\`tree.TreeService\`, every call signed, 2 HTTP/2 channels per node) and over the native"
        echo "protocol (TCP), each cell on fresh nodes, the two paths alternated cell by cell (gRPC first"
        echo "on one cell, TCP first on the next). The replicas replicate over TCP on both paths."
        echo "Latencies are the user scenario's, wall-clock; errors and dropped iterations are both"
        echo "scenarios'. CPU per request: the CPU time of the nodes' threads (services, servers,"
        echo "replication, commits) and of the generator's threads while the load ran, divided by the"
        echo "requests answered (\`docs/load.md\`, \"CPU per request\")."
        echo
        if [ ${#reports[@]} -gt 0 ]; then
            echo "| replicas | gateway | rate | sync | achieved | avg | p99 | errors | dropped | nodes' CPU per request | generator's CPU per request |"
            echo "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
            for json in "${reports[@]}"; do
                grpc_grid_rows "$json"
            done
            echo
            echo "The nodes' CPU per request over gRPC against the native protocol, cell by cell. A cell"
            echo "compares like with like only when both paths took the whole load (no error, no dropped"
            echo "iteration, 99 % of the rate achieved): a path that falls behind fails requests at their"
            echo "deadline and counts the work of the ones it dropped nowhere."
            echo
            echo "| replicas | rate | sync | gRPC | TCP | gRPC / TCP | both took the whole load |"
            echo "|---:|---:|---|---:|---:|---:|---|"
            for json in "${reports[@]}"; do
                grpc_ratios "$json"
            done | awk '{ d = $10; if (d != "yes") { sub(/^no-/, "", d); d = "no: " d " fell behind" }
                printf "| %s | %s | %s | %.0f µs | %.0f µs | %.2fx | %s |\n", $1, $2, $3, $4, $5, $6, d }'
            echo
            echo "### Goals"
            echo
            for json in "${reports[@]}"; do
                grpc_ratios "$json"
            done | awk '
                $2 == 5000 && $1 == 3 {
                    n++
                    cells = cells sprintf("%s%.2fx (sync %s%s)", n > 1 ? ", " : "", $6, $3,
                        $10 == "yes" ? "" : "; " substr($10, 4) " fell behind")
                    if ($10 == "yes") { judged++; sum += $6 }
                }
                $2 == 5000 {
                    clean = ($7 <= 10 && $8 <= 25 && $9 == 0)
                    c = c sprintf("- The 5000/s cell over gRPC, %s replica(s), sync %s: avg %.2f ms, p99 %.2f ms, %d errors: **%s**%s.\n",
                        $1, $3, $7, $8, $9, clean ? "clean" : "not clean",
                        clean ? "" : sprintf(" (the goal: avg <= 10 ms, p99 <= 25 ms, 0 errors; avg %.1fx and p99 %.1fx the bounds)", $7 / 10, $8 / 25))
                }
                END {
                    if (judged > 0) {
                        mean = sum / judged
                        printf "- The nodes'\'' CPU per request over gRPC at 5000/s, 3 replicas: %s of the native protocol'\''s; mean of the cells where both took the load %.2fx against the goal of at most 1.3x: **%s**%s.\n",
                            cells, mean, mean <= 1.3 ? "met" : "missed",
                            mean <= 1.3 ? "" : sprintf(" by %.0f %%", 100 * (mean / 1.3 - 1))
                    } else if (n > 0) {
                        printf "- The nodes'\'' CPU per request over gRPC at 5000/s, 3 replicas: %s of the native protocol'\''s, but in no cell did both paths take the whole load: **not judged** (see the cells above).\n", cells
                    } else {
                        print "- No 5000/s cell with 3 replicas measured both paths: the CPU goal is not judged."
                    }
                    printf "%s", c
                }'
            echo
        fi
        for replicas in 1 3; do
            if [ ! -s "$work/grpc-$replicas.json" ]; then
                command_failed "grpc-$replicas" "$(grpc_cmd "$replicas")"
            fi
        done
        grpc_goal_part
        grpc_profile_part
    } >"$work/grpc.md"
}

section_sim_load() {
    log "sim-mode load for $sim_load_duration (simulated)"
    local status=0
    timed sim-load SIM load --mode sim --replicas 3 --rate 1000 --sync 5m \
        --duration "$sim_load_duration" --seed 7 --verify --no-progress \
        --json "$work/sim-load.json" --html "$work/sim-load.html" || status=$?
    {
        echo "## $(title sim-load)"
        echo
        provenance "$binary_note"
        echo "Command: \`$(sim_load_cmd)\`: three replicas inside the simulator on the"
        echo "calibrated disk model, $sim_load_duration of simulated time, called by the simulated"
        echo "in-process gateway. \`--verify\` then runs the simulator's heal-and-check (convergence"
        echo "by sync and by push, acknowledged writes present, the tree invariant, nobody waiting)"
        echo "and reads every acknowledged write back on every replica; exit status $status."
        echo
        echo "Wall time of the whole command: **$(cat "$work/sim-load.wall") s**."
        echo "Latencies below are simulated time."
        echo
        if [ ! -s "$work/sim-load.json" ]; then
            command_failed sim-load "$(sim_load_cmd)"
            return
        fi
        echo "Path: $(load_path "$work/sim-load.json")."
        echo
        load_rows "$work/sim-load.json"
        jq -r '"Ops pushed \(.service.ops_pushed), pulled by sync \(.service.ops_pulled), sync rounds \(.service.sync_rounds)."' \
            "$work/sim-load.json"
    } >"$work/sim-load.md"
}

section_scale() {
    log "scale bench at $scale_objects objects"
    local status="ran"
    timed scale cargo bench -p arbor-engine --bench scale -- --objects "$scale_objects" ||
        status="failed"
    {
        echo "## $(title scale)"
        echo
        provenance "built by \`cargo bench\` in this run"
        echo "Command: \`$(scale_cmd)\` (wall time $(cat "$work/scale.wall") s). One durable forest on its"
        echo "write-ahead log holds one bucket: S3-like keys with 7 meta fields, half of them under"
        echo "scrambled names in one flat directory, half spread over 10,000 prefixes, added by path in"
        echo "batches of 100 as the batcher commits them (a checkpoint every"
        echo "\`pilorama.checkpoint_interval\` or \`pilorama.checkpoint_bytes\` of log, at their defaults;"
        echo "\`--checkpoint-bytes N\` sets the second). Ingest: one row per 10 % of the objects, ops/s of that"
        echo "segment and its ratio to the first segment's, commit latency, CPU, file bytes per object,"
        echo "redb's reads and written bytes per op, the log's bytes per op (records and new segments'"
        echo "zeros), checkpoints. Storage: the pages in use at full size per"
        echo "table and per kind of row, against the ops' encoded size (ids, items, timestamp). Then"
        echo "lookups by path, the flat directory listed whole by name in pages of 1,000 (after the"
        echo "writes and after a reopen, with the growth of the resident memory), the reopen, and an"
        echo "empty replica catching up the whole log over loopback TCP in one sync round."
        echo "\`engine/benches/scale/main.rs\` explains each column."
        echo
        if [ "$status" = ran ]; then
            awk '
                /^\|/ { print; table = 1; next }
                table { print ""; table = 0 }
                /^(scale|ingest|storage|lookups|listing|reopen|catch-up)/ { print; print "" }
            ' "$work/scale.out"
        else
            echo "**The bench failed**; the end of its output:"
            echo
            echo '```'
            tail -n 20 "$work/scale.err"
            echo '```'
        fi
    } >"$work/scale.md"
}

# The reason recorded for a missed mutant in .cargo/mutants-missed.txt
# (lines `MUTANT<TAB>KIND<TAB>REASON`; the file says what each KIND means,
# and only `equivalent` ones are left out of the score), as "KIND: REASON",
# or nothing.
mutant_reason() {
    awk -F '\t' -v m="$1" '$1 == m { print $2 ": " $3; exit }' .cargo/mutants-missed.txt 2>/dev/null || true
}

section_mutants() {
    if ! cargo mutants --version >/dev/null 2>&1; then
        log "cargo-mutants is not installed: mutants section skipped"
        {
            echo "## $(title mutants)"
            echo
            echo "Not measured: cargo-mutants was not installed on the machine of the run at commit $commit"
            echo "(\`cargo install cargo-mutants --locked\`, then \`scripts/results.sh --only mutants\`)."
        } >"$work/mutants.md"
        return
    fi
    log "mutation sample: ${mutants_files[*]}"
    local args=() f status=0
    for f in "${mutants_files[@]}"; do args+=(--file "$f"); done
    # Exit status 2: some mutant was missed, which the table reports.
    MUTANTS_OUT="$work/mutants" ARBOR_MUTANTS_SEEDS="$mutants_seeds" \
        timed mutants scripts/mutants.sh --in-place "${args[@]}" || status=$?
    local dir="$work/mutants/mutants.out"
    mutants_count() { if [ -f "$dir/$1.txt" ]; then grep -c . "$dir/$1.txt" || true; else echo 0; fi; }
    local caught missed unviable timeout total equivalent=0 line reason
    caught="$(mutants_count caught)"; missed="$(mutants_count missed)"
    unviable="$(mutants_count unviable)"; timeout="$(mutants_count timeout)"
    total=$((caught + missed + unviable + timeout))
    if [ -f "$dir/missed.txt" ]; then
        while IFS= read -r line; do
            case "$(mutant_reason "$line")" in equivalent:*) equivalent=$((equivalent + 1)) ;; esac
        done <"$dir/missed.txt"
    fi
    {
        echo "## $(title mutants)"
        echo
        provenance "$(cargo mutants --version), the engine and the tests built in debug by it"
        echo "Command: \`$(mutants_cmd)\` (wall time $(cat "$work/mutants.wall") s; exit status $status)."
        echo "Files mutated: $(printf '`%s` ' "${mutants_files[@]}" | sed 's/ $//; s/` `/`, `/g')."
        echo "Each mutant (a function body replaced by a default value, an operator swapped, a match"
        echo "guard forced) is built into the engine, which must then fail the test command of"
        echo "\`.cargo/mutants.toml\`: \`cargo test -p arbor-engine -p arbor-sim --lib --test mutants_sweep\`,"
        echo "the engine's and the simulator's unit tests and $mutants_seeds seeds of the test-sized scenario"
        echo "under every profile with every checker on. Unviable: the mutant does not build. Timeout: the"
        echo "tests ran past ${MUTANTS_TIMEOUT:-300} s."
        echo
        if [ "$total" = 0 ]; then
            command_failed mutants "$(mutants_cmd)"
            return
        fi
        echo "| mutants | caught | missed | of them equivalent | unviable | timeout | wall per mutant | score |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
        awk -v t="$total" -v c="$caught" -v m="$missed" -v e="$equivalent" -v u="$unviable" \
            -v o="$timeout" -v w="$(cat "$work/mutants.wall")" 'BEGIN {
                d = c + m - e
                printf "| %d | %d | %d | %d | %d | %d | %.0f s | %s |\n", t, c, m, e, u, o, w / t,
                    (d > 0) ? sprintf("**%.1f %%** (%d/%d)", 100 * c / d, c, d) : "n/a"
            }'
        echo
        echo "Score: caught / (caught + missed), the missed counted without the equivalent ones (mutants"
        echo "that behave as the real code does, so that no check can tell them apart)."
        if [ "$missed" != 0 ]; then
            echo
            echo "Each missed mutant and its reason (\`.cargo/mutants-missed.txt\`):"
            echo
            echo "| missed mutant | reason |"
            echo "|---|---|"
            while IFS= read -r line; do
                reason="$(mutant_reason "$line")"
                echo "| \`$line\` | ${reason:-none recorded: a gap in the checks} |"
            done <"$dir/missed.txt"
        fi
        if [ "$timeout" != 0 ]; then
            echo
            echo "Timed out (counted apart from the score): $(sed 's/.*/`&`/' "$dir/timeout.txt" | paste -sd ';' | sed 's/;/; /g')."
        fi
    } >"$work/mutants.md"
}

for name in "${wanted[@]}"; do
    section_load="$(cut -d ' ' -f 1 /proc/loadavg 2>/dev/null || echo '?')"
    "section_${name//-/_}"
done

# ---------------------------------------------------------------------------
# Assemble: new sections replace old ones; the others are kept.

old_section() {
    [ -f "$out" ] || return 0
    awk -v begin="<!-- results:$1:begin -->" -v end="<!-- results:$1:end -->" '
        $0 == end { inside = 0 }
        inside { print }
        $0 == begin { inside = 1 }
    ' "$out"
}

for name in "${SECTIONS[@]}"; do
    if runs "$name"; then
        continue
    fi
    old_section "$name" >"$work/$name.md"
    if [ ! -s "$work/$name.md" ]; then
        printf '## %s\n\nNot measured yet: `scripts/results.sh --only %s`.\n' \
            "$(title "$name")" "$name" >"$work/$name.md"
    fi
done

run_args=""
[ "$quick" = 1 ] && run_args+=" --quick"
[ -n "$only" ] && run_args+=" --only $only"
[ "$beside" = 1 ] && run_args+=" --beside-in-process"
runs scale && [ "$scale_objects" != "$scale_default" ] && run_args+=" --objects $scale_objects"
quick_sections=()
for name in "${SECTIONS[@]}"; do
    grep -q '^<!-- results:mode=quick -->$' "$work/$name.md" && quick_sections+=("$name")
done

{
    echo "# Measured results"
    echo
    echo "Generated by \`scripts/results.sh\`; do not edit by hand. The last run was"
    echo "\`scripts/results.sh$run_args\`"
    echo "at commit $commit on $cpu, $cores cores. Each section says which run measured it"
    echo "(commit, CPU, cores, mode) and gives the exact command of every figure; \`arbor-sim\` is"
    echo "\`target/release/arbor-sim\` from \`cargo build --release -p arbor-sim\`."
    echo
    if [ ${#quick_sections[@]} -gt 0 ]; then
        echo "**Quick-run figures** in: ${quick_sections[*]}. Those sections come from \`--quick\` runs"
        echo "(smaller counts and durations, as their commands show), not from the full measurement."
        echo
    fi
    echo "Timed figures depend on the machine as much as on the code: compare them only within"
    echo "one section, where both sides of a comparison ran in the same run."
    for name in "${SECTIONS[@]}"; do
        echo
        echo "<!-- results:$name:begin -->"
        cat "$work/$name.md"
        echo "<!-- results:$name:end -->"
    done
} >"$work/results.md"
mkdir -p "$(dirname "$out")"
cp "$work/results.md" "$out"
log "wrote $out"

if runs canaries && [ -f "$readme" ]; then
    if grep -q '^<!-- canaries:begin -->$' "$readme" && grep -q '^<!-- canaries:end -->$' "$readme"; then
        awk -v table="$work/readme-canaries.md" '
            /^<!-- canaries:end -->$/ { while ((getline line < table) > 0) print line; inside = 0 }
            !inside { print }
            /^<!-- canaries:begin -->$/ { inside = 1 }
        ' "$readme" >"$work/readme.md"
        cp "$work/readme.md" "$readme"
        log "rewrote the canary table of $readme"
    else
        log "$readme has no canaries markers: its table was not touched"
    fi
fi
