#!/usr/bin/env bash
# Runs the walkthrough of a doc page: every ```sh block, in order, in one
# bash (so variables, the working directory and background jobs carry from
# block to block), stopping at the first command that fails. Blocks of any
# other language (```console, ```yaml) are output or files to read, not
# run. Background jobs left at the end are killed.
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
        /^```sh[[:space:]]*$/ { inside = 1; block += 1; printf "echo \"== %s, block %d\"\n", page, block; next }
        /^```/ { inside = 0; next }
        inside { print }
        END { if (block == 0) { print "echo \"run_doc: no sh block in " page "\" >&2; exit 2" } }
    ' "$page"
} >"$script"
bash "$script"
echo "run_doc: $page ran to the end"
