#!/usr/bin/env bash
# Every output of this folder, from the repo root (a few minutes on a 2-core CPU).
set -euo pipefail
D=bench-results/2026-12-02-grid-host-price
export PYTHONPATH=$PWD
python $D/admit_ab.py 64 3 2>/dev/null | grep "^old\|^new" > $D/admit_ab.txt
for o in 1 ""; do
  for cell in "64 waiting" "32 waiting" "64 drain"; do
    echo "== OLD=$o $cell"
    OLD=$o python $D/drafting_prices.py $cell grid 2 2>/dev/null | grep -v "^$\|Writing"
  done
done > $D/drafting_prices.txt
python $D/outside.py 64 2>/dev/null | grep "^ar\|^grid" > $D/outside.txt
