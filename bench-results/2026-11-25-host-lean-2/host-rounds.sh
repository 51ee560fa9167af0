#!/bin/bash
# Host work per step, before (/tmp/old: 0398a37; or the checkout $BEFORE) and after
# (/work/main), alternating, same recipe file (the after one), tiny model and store
# (`python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store
# /tmp/tiny-store`); raw tables host-{old,new}-{round}.md in this folder (or $OUT)
set -e
BEFORE=${BEFORE:-/tmp/old}
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
M="ar,draft-verify:fixed,draft-verify,self-draft:fixed,self-draft:light:fixed,self-draft,self-draft:light,kangaroo:fixed,kangaroo"
for round in 1 2; do
  for code in old new; do
    dir=$BEFORE; [ $code = new ] && dir=/work/main
    (cd /tmp && PYTHONPATH=$dir /work/main/.venv/bin/python /work/main/recipes/host_profile.py \
      --model /tmp/tiny --input /work/main/recipes/prompts/specbench128.jsonl --store /tmp/tiny-store \
      --skip-set /tmp/tiny/skip.json --batch-sizes 1,64 --threads 1 --max-tokens 48 --prompts 128 \
      --device cpu --methods $M 2>/dev/null | grep '^|' > $OUT/host-$code-$round.md)
  done
done
