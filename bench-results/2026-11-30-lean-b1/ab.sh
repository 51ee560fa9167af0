#!/bin/bash
# A/B of a lean step's host at b1 (and b64), every method against ar's (issue 52): OLD and NEW
# are git worktrees of two commits; recipes/host_profile.py is NEW's, run against each tree's
# specctl. ROUNDS alternating rounds (default 2), each row 3 repeats (the least host kept), in
# host_profile's two modes: run (the device's work on this thread) and core (on core 1).
# Usage: bash ab.sh OLD_TREE NEW_TREE OUT_FILE [BATCHES] [ROUNDS] [MODES]  (the tiny model at
# /tmp/tiny; MODES default "run core")
set -euo pipefail
old=$1 new=$2 out=$3 batches=${4:-1} rounds=${5:-2} modes=${6:-run core}
hp=$new/recipes/host_profile.py
args=(--model /tmp/tiny --input $new/recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
      --batch-sizes $batches --threads 1 --max-tokens 48 --prompts 128
      --methods ar,self-draft,draft-verify,kangaroo --schedule cuda --repeats 3
      --skip-set /tmp/tiny/skip.json --graphs)
for round in $(seq $rounds); do
  for tree in "$old" "$new"; do
    for mode in $modes; do
      extra=(); [ $mode = core ] && extra=(--device-core 1)
      echo "== round $round tree $(git -C "$tree" rev-parse --short HEAD)$(git -C "$tree" diff --quiet || echo +) mode $mode"
      (cd "$tree" && PYTHONPATH="$tree" python "$hp" "${args[@]}" "${extra[@]}" | grep '^| [a-z]')
    done
  done
done > "$out" 2>&1
