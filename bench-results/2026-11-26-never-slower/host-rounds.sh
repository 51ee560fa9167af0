#!/bin/bash
# Host work per step of a method that never drafts (draft-verify skipping every block of the
# 2-layer tiny model: its drafts are never right) against ar, before ($BEFORE, default /tmp/b0:
# `git worktree add /tmp/b0 b066835`) and after (/work/main), alternating, two rounds.
# Setup: `python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl
# --store /tmp/tiny-store` and the skip set {"num_layers": 2, "attn": [0, 1], "mlp": [0, 1]}
# in /tmp/tiny/skip-all.json. Raw tables host-{old,new}-{round}.md in this folder (or $OUT).
set -e
BEFORE=${BEFORE:-/tmp/b0}
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
for round in 1 2; do
  for code in old new; do
    dir=$BEFORE; [ $code = new ] && dir=/work/main
    (cd /tmp && PYTHONPATH=$dir /work/main/.venv/bin/python $dir/recipes/host_profile.py \
      --model /tmp/tiny --input /work/main/recipes/prompts/specbench128.jsonl \
      --store /tmp/tiny-store --skip-set /tmp/tiny/skip-all.json --batch-sizes 1,64 \
      --threads 1 --max-tokens 48 --prompts 128 --device cpu --methods ar,draft-verify \
      2>/dev/null | grep '^|' > $OUT/host-$code-$round.md)
  done
done
