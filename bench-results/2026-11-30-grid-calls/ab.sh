#!/bin/bash
# A/B of a grid drafting step's host at b64 against ar's (issue 52): OLD and NEW are git
# worktrees of two commits; recipes/host_profile.py is this commit's (its --device-core is
# new) run against each tree's specctl. Three alternating rounds, each row 3 repeats (least host).
# Usage: bash ab.sh OLD_TREE NEW_TREE OUT_PREFIX   (from the repo root; the tiny model at /tmp/tiny)
set -euo pipefail
old=$1 new=$2 out=$3
hp=${HP:-$PWD/recipes/host_profile.py}   # (HP: another host_profile.py to run)
args=(--model /tmp/tiny --input $PWD/recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
      --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128
      --methods ar,self-draft:grid:fixed --schedule cuda --repeats 3 --skip-set /tmp/tiny/skip.json --graphs)
for round in 1 2 3; do
  for tree in "$old" "$new"; do
    for mode in run core; do
      extra=(); [ $mode = core ] && extra=(--device-core 1)
      echo "== round $round tree $(git -C "$tree" rev-parse --short HEAD) mode $mode"
      (cd "$tree" && PYTHONPATH="$tree" python "$hp" "${args[@]}" "${extra[@]}" | tail -2)
    done
  done
done > "$out.txt" 2>&1
