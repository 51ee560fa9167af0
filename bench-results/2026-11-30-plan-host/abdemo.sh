#!/bin/bash
# abdemo.sh BATCH PROMPTS ROUNDS_OUTER TREES...: the demo clock (one round a run), trees alternating
P=$(cd "$(dirname "$0")/../.." && pwd)/bench-results/2026-11-29-host-clock-5/demo_clock.py
B=$1; N=$2; R=$3; shift 3
for r in $(seq 1 $R); do
  for t in "$@"; do
    (cd $t && PYTHONPATH=$t python "$P" "$B" "$N" 2 1 self-draft 2>&1 | grep -E "round 1:|  self-draft:" | sed "s|^|$(basename $t) |")
  done
done
