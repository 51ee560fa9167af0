#!/bin/bash
# The prediction: ar and every method, prefill eager then in pieces, each round (see predict_pieces.py)
cd "$(dirname "$0")/../.."
for cell in "8 64 3" "32 256 3" "64 512 2"; do
  set -- $cell
  echo "== b$1 $(date +%T) ($(git rev-parse --short HEAD) + working tree)"
  python bench-results/2026-12-01-prefill-pieces/predict_pieces.py $1 $2 $3 2>&1 | grep -v "Writing model"
done
echo "== done $(date +%T)"
