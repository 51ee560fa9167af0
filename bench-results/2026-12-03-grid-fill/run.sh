#!/bin/bash
# A/B of a grid drafting step's host against ar's at b64 (host_profile, the 2-layer tiny model,
# CUDA's schedule and the graph path's staging). TREES: checkouts (git worktrees) of the commits
# compared, each run with its own tree first on the path; rounds alternate them.
#   python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
#   git worktree add /tmp/before 771f587; git worktree add /tmp/fill 64cab0f
#   TREES="/tmp/before /tmp/fill $PWD" bash bench-results/2026-12-03-grid-fill/run.sh
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ARGS="--model /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
  --skip-set /tmp/tiny/skip.json --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128
  --schedule cuda --graphs --repeats 3"
for r in 1 2 3; do for tree in $TREES; do
  echo "== $tree round $r"
  (cd $tree && PYTHONPATH=$tree python recipes/host_profile.py $ARGS --methods ar,self-draft:grid:fixed | tail -2)
done; done                                                                   # -> ab3.txt
# in-run parts (us a step) of each method alone, each tree (parts.py wraps named functions)
for m in ar self-draft:grid:fixed; do for tree in $TREES; do
  echo "== $tree $m"
  (cd $tree && PYTHONPATH=$tree python $HERE/parts.py $ARGS --methods $m | tail -16 | grep -v '^|---')
done; done                                                                   # -> parts.txt
