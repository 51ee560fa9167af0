#!/bin/bash
# The same commit at two paths, alternating (issue 52): does a worktree's path alone move
# host_profile's figures? Usage: bash paths.sh COMMIT ROUNDS OUT
set -euo pipefail
c=$1 rounds=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
for p in /tmp/wt-path-a /tmp/wt-path-bb; do
  git -C "$repo" worktree add -q --detach "$p" "$c"
done
for round in $(seq "$rounds"); do
  for p in /tmp/wt-path-a /tmp/wt-path-bb; do
    echo "== round $round commit $c path $p"
    (cd "$p" && PYTHONPATH="$p:$p/recipes" python "$here/parts.py" 2>&1 |
      grep -E "^(commit|verify|Planner)|\| (ar|self-draft)")
  done
done > "$out" 2>&1
for p in /tmp/wt-path-a /tmp/wt-path-bb; do git -C "$repo" worktree remove --force "$p"; done
