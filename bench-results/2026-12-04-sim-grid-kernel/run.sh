#!/bin/bash
# The host-charged clock's cells before and after b61f68b (a grid step's device work charged as
# CUDA launches it; the clock's own pricing and counting off the host), alternating trees.
#   git worktree add /tmp/wt-before 84ff375
#   TREES="/tmp/wt-before $PWD" bash bench-results/2026-12-04-sim-grid-kernel/run.sh > out.txt
set -e
R=bench-results/2026-12-01-trace-grid/ratios.py   # (the same script in both trees)
for b in 8 32 64; do for h in 0 3; do for tree in $TREES; do
  echo "== $tree b$b waiting host x$h"
  (cd $tree && HOSTX=$h PYTHONPATH=$tree python $R $b waiting 2 trace,trace-grid,self-draft 2>&1 | grep "^b")
done; done; done
# where a grid step's host goes, guard on and off, host x0 and x3 (this tree)   -> split.txt
#   for b in 8 32 64; do for g in on off; do for h in 0 3; do
#     GUARD=$g HOSTX=$h PYTHONPATH=$PWD python $D/split.py $b waiting 1 trace-grid; done; done; done
# the controller's cuts, b61f68b (/tmp/wt-sim) against a9f1981 alternating, 3 rounds
#   -> controller-parts.txt (parts.py: ctl.decide, ctl._search, ctl.prefetch, under_forward)
#   -> controller-ab.txt (split.py at HOSTX=0, 2 rounds)
