#!/usr/bin/env bash
# host_profile.py on the tiny model (recipes/tiny_model.py /tmp/tiny), each schedule; from the
# repo root: bash bench-results/2026-11-29-host-schedule/run.sh
set -euo pipefail
D=bench-results/2026-11-29-host-schedule
A=(--model /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
   --skip-set /tmp/tiny/skip.json --threads 1 --max-tokens 48 --prompts 128)
for s in cuda cpu; do
  python recipes/host_profile.py "${A[@]}" --batch-sizes 1,64 --repeats 5 \
    --methods ar,self-draft,kangaroo,draft-verify --schedule $s > $D/lean-$s.md
done
python recipes/host_profile.py "${A[@]}" --batch-sizes 8,64 --repeats 3 \
  --methods ar,self-draft:light:fixed,self-draft:fixed --schedule cuda > $D/drafting-cuda.md
