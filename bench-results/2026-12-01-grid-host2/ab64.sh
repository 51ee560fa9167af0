#!/bin/bash
# host_profile at b64 (ar and the grid step), two trees alternated:
#   bash ab64.sh /tmp/wt-old /work/main ROUNDS [extra host_profile args] > ab64.txt
OLD=$1 NEW=$2 ROUNDS=${3:-3}; shift 3
for r in $(seq $ROUNDS); do
 for d in $NEW $OLD; do
  echo "== $d round $r"
  (cd $d && PYTHONPATH=$d python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
      --store /tmp/tiny-store --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 \
      --methods ar,self-draft:grid:fixed --schedule cuda --repeats 3 \
      --skip-set /tmp/tiny/skip.json --graphs "$@" 2>&1 | grep "^| [a-z]" | grep -v "^| method")
 done
done
