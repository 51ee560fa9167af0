#!/bin/bash
# The host-charged clock's cells (bench-results/2026-11-30-clock-status/run.sh: 3 rounds a
# cell, each method's median x ar) and the trace at b1 (trips.py, 10 rounds: each round's x ar
# and the guard's trips), two trees alternated, ROUNDS times:
#   bash ab.sh OLD NEW ROUNDS > ab.txt
OLD=$1 NEW=$2 ROUNDS=${3:-2}
for r in $(seq $ROUNDS); do
 for d in $NEW $OLD; do
  echo "== $d round $r"
  (cd $d && for w in waiting drain; do echo "-- trace b1 $w"; PYTHONPATH=$d python bench-results/2026-11-29-host-clock-4/trips.py 1 $w trace 10 2>&1 | grep "^trace"; done)
  (cd $d && PYTHONPATH=$d bash bench-results/2026-11-30-clock-status/run.sh 2>&1)
 done
done
