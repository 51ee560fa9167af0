#!/bin/bash
cd "$(dirname "$0")/../.."
for cell in "1 waiting" "1 drain" "8 waiting" "8 drain" "32 waiting" "32 drain" "64 waiting" "64 drain"; do
  set -- $cell
  echo "== b$1 $2 $(date +%T)"
  python bench-results/2026-11-29-host-clock-3/paired.py $1 $2 trace,draft-verify,kangaroo,self-draft 3 2>&1 | grep median
done
echo "== done $(date +%T)"
