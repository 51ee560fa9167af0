#!/bin/bash
# The draft forwards' host prior (StepCost.forward_host, Controller._untimed_forwards) against
# its parent (BASE: git worktree add /work/wt-base db39d15), alternating in one window:
# ../2026-11-29-host-clock-4/ab.sh's 2 x 2 rounds of paired.py, every batch size and workload.
H=$(cd "$(dirname "$0")/../.." && pwd)
for w in drain waiting; do
  for b in 1 8 32 64; do
    echo "== b$b $w"
    bash "$H/bench-results/2026-11-29-host-clock-4/ab.sh" $b $w kangaroo,draft-verify kangaroo,draft-verify
  done
done
