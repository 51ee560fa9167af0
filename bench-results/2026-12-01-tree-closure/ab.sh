#!/bin/bash
# host_profile A/B, alternated: OLD and NEW are two worktrees (e.g. git worktree add /tmp/wt-old 1189659~1).
#   bash ab.sh /tmp/wt-old /work/main ROUNDS > ab.txt
# b1/b8: the per-sequence steps (fixed: every step drafts); b64: the grid step (Self-Draft's default there).
OLD=$1 NEW=$2 ROUNDS=${3:-3}
for r in $(seq $ROUNDS); do
 for d in $NEW $OLD; do
  echo "== $d round $r"
  (cd $d && PYTHONPATH=$d python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
      --store /tmp/tiny-store --batch-sizes 1,8 --threads 1 --max-tokens 48 --prompts 32 \
      --methods ar,self-draft:fixed --schedule cuda --repeats 3 \
      --skip-set /tmp/tiny/skip.json --graphs 2>&1 | grep "^| [a-z]")
  (cd $d && PYTHONPATH=$d python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
      --store /tmp/tiny-store --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 \
      --methods ar,self-draft:grid:fixed --schedule cuda --repeats 3 \
      --skip-set /tmp/tiny/skip.json --graphs 2>&1 | grep "^| [a-z]")
 done
done
