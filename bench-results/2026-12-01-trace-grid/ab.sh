#!/bin/bash
# The accounting's learning overrun, old against new (ab_caught.py), over the cells
cd "$(dirname "$0")/../.."
echo "== $(git rev-parse --short HEAD) + working tree, $(date +%T)"
for cell in "64 waiting 12 trace,trace-grid,self-draft,draft-verify,kangaroo" \
            "32 waiting 12 trace,trace-grid,self-draft,draft-verify,kangaroo" \
            "8 waiting 12 trace,self-draft" "1 waiting 6 trace,self-draft" \
            "64 drain 12 trace,trace-grid,self-draft" "32 drain 12 trace,trace-grid,self-draft" \
            "8 drain 8 trace,self-draft" "1 drain 6 trace,self-draft"; do
  python bench-results/2026-12-01-trace-grid/ab_caught.py $cell 2>&1 | grep "x ar"
done
echo "== done $(date +%T)"
