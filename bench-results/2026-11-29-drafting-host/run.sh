#!/bin/bash
# Self-Draft x ar with its drafting host at 1, 1/2, 1/4 and 0 of today's, b8/32/64 waiting, twice.
H=$(cd "$(dirname "$0")/../.." && pwd)
for r in 1 2; do
  for b in 8 32 64; do
    for f in 1.0 0.5 0.25 0.0; do
      python "$H/bench-results/2026-11-29-drafting-host/whatif.py" $b $f 2>&1 | grep frac
    done
  done
done
