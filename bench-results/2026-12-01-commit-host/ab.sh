#!/bin/bash
# A/B of two commits at ONE path (issue 52): the same worktree checked out at each commit in
# turn, as two worktrees at two paths read ~10% apart on the same commit (README). Rounds
# alternate the commits; each run is parts.py (a b64 host_profile with its parts' medians).
# Usage: bash ab.sh TREE OLD NEW ROUNDS OUT   (TREE: a git worktree of this repo; from anywhere)
set -euo pipefail
tree=$1 old=$2 new=$3 rounds=$4 out=$5
here=$(cd "$(dirname "$0")" && pwd)
for round in $(seq "$rounds"); do
  for c in "$old" "$new"; do
    git -C "$tree" checkout -q --detach "$c"
    echo "== round $round commit $(git -C "$tree" rev-parse --short HEAD) path $tree"
    (cd "$tree" && PYTHONPATH="$tree:$tree/recipes" python "$here/parts.py" 2>&1 |
      grep -E "^(commit|verify|Planner)|\| (ar|self-draft)")
  done
done > "$out" 2>&1
