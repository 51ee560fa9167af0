#!/bin/bash
# A/B of a grid drafting step's host at b64 against ar's (issue 52): OLD and NEW are git
# worktrees of main (4aa8842) and the parked branch grid-device-plan (9fbee21); NEW's
# recipes/host_profile.py (which times GridStep.device_plan as device work) runs against each
# tree's specctl, made to skip device_plan where a tree has none. Three alternating rounds, each
# row 3 repeats (least host), with and without --device-core 1.
# Usage: bash ab.sh OLD_TREE NEW_TREE OUT_PREFIX   (the tiny model at /tmp/tiny)
set -euo pipefail
old=$1 new=$2 out=$3
hp=$(mktemp --suffix .py)
sed 's/^    GridStep.device_plan = \(timed\|there\)(GridStep.device_plan)/    if hasattr(GridStep, "device_plan"):\n        GridStep.device_plan = \1(GridStep.device_plan)/' \
    "$new/recipes/host_profile.py" > "$hp"
cd "$new"
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
