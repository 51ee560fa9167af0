#!/bin/bash
# ab.sh BATCH waiting|drain METHODS ROUNDS TREES...: tests/test_host_clock.py's workload, each tree in
# turn (2 rounds of ../2026-11-29-host-clock-3/paired.py a run), ROUNDS times; a tree is a
# worktree (git worktree add /tmp/wt-base COMMIT)
P=$(cd "$(dirname "$0")/../.." && pwd)/bench-results/2026-11-29-host-clock-3/paired.py
B=$1; W=$2; M=$3; R=$4; shift 4
for r in $(seq 1 $R); do
  for t in "$@"; do
    (cd $t && PYTHONPATH=$t python "$P" "$B" "$W" "$M" 2 2>&1 | grep median | sed "s|^|$(basename $t) $B $W |")
  done
done
