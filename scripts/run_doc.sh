#!/usr/bin/env bash
# Runs the walkthrough of a doc page: every ```sh block, in order, in one
# bash (so variables, the working directory and background jobs carry from
# block to block), stopping at the first command that fails. Blocks of any
# other language (```console, ```yaml) are output or files to read, not
# run. A block right after a line `<!-- run_doc: skip: WHY -->` is not run
# either (CI runs it elsewhere, or it takes too long); the reason is
# printed. Background jobs left at the end are killed.
#
#   scripts/run_doc.sh docs/grpc.md
#
# Runs from the repository's root, as a reader following the page would.
set -euo pipefail
page="${1:?usage: scripts/run_doc.sh PAGE.md}"
cd "$(dirname "$0")/.."
[ -f "$page" ] || { echo "run_doc: $page: no such page" >&2; exit 2; }
script="$(mktemp)"
trap 'rm -f "$script"' EXIT
{
    echo 'set -euo pipefail'
    echo 'trap '"'"'jobs -p | xargs -r kill 2>/dev/null || true'"'"' EXIT'
    awk -v page="$page" '
        /^<!-- run_doc: skip: .* -->[[:space:]]*$/ { why = $0; sub(/^<!-- run_doc: skip: /, "", why); sub(/ -->[[:space:]]*$/, "", why); skip = 1; next }
        /^```sh[[:space:]]*$/ && skip { inside = 2; block += 1; gsub(/"/, "\\\"", why); printf "echo \"== %s, block %d: not run (%s)\"\n", page, block, why; skip = 0; next }
        /^```sh[[:space:]]*$/ { inside = 1; block += 1; printf "echo \"== %s, block %d\"\n", page, block; next }
        /^```/ { inside = 0; next }
        inside == 1 { print }
        !inside && NF { skip = 0 }
        END { if (block == 0) { print "echo \"run_doc: no sh block in " page "\" >&2; exit 2" } }
    ' "$page"
} >"$script"
bash "$script"
echo "run_doc: $page ran to the end"
