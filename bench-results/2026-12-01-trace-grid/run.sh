#!/bin/bash
# Real text's acceptance, TraceChains (a stand-in's per-sequence chains) against TraceGrid (the
# product's grid step), on the host-charged clock (HOST, the default), then forwards only
# (HOSTX=0) and this CPU's own host (HOSTX=1) where the grid is Self-Draft's default (b32, b64)
cd "$(dirname "$0")/../.."
echo "== $(git rev-parse --short HEAD) + working tree, $(date +%T)"
for cell in "1 waiting" "8 waiting" "32 waiting" "64 waiting" "1 drain" "8 drain" "32 drain" "64 drain"; do
  python bench-results/2026-12-01-trace-grid/ratios.py $cell 3 2>&1 | grep "x ar"
done
for h in 0 1; do
  echo "== HOSTX=$h (the host charged at $h x this CPU's)"
  for cell in "32 waiting" "64 waiting"; do
    HOSTX=$h python bench-results/2026-12-01-trace-grid/ratios.py $cell 2 2>&1 | grep "x ar"
  done
done
echo "== done $(date +%T)"
