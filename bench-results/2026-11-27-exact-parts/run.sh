#!/usr/bin/env bash
# --exact's cost against plain bf16 and its equality on held-out prompts (issue 44), this
# machine, at the commit it is run on. Usage (repo root, venv active):
#   bash bench-results/2026-11-27-exact-parts/run.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# 1. cost, the issue's command: 16 MT-bench questions, batch 1 and 8, 3 repeats after a warm-up
specctl bench recipes/prompts/mtbench16.jsonl --max-tokens 48 --methods ar,ar:exact \
  --batch-sizes 1,8 --repeats 3 --warmup 1 --device cpu --dtype bf16 > "$HERE/cost-mtbench16.txt"
# 2. cost at batch 8 past the drain: 64 prompts (8 x the batch)
head -n 64 recipes/prompts/specbench128.jsonl > /tmp/specbench64.jsonl
specctl bench /tmp/specbench64.jsonl --max-tokens 48 --methods ar,ar:exact \
  --batch-sizes 8 --repeats 3 --warmup 1 --device cpu --dtype bf16 > "$HERE/cost-specbench64-b8.txt"
# 3. equality on the 32 held-out prompts (no test reads them), every method, batch 1, 8, 16
tail -n 32 recipes/prompts/specbench128.jsonl > /tmp/heldout32.jsonl
specctl bench /tmp/heldout32.jsonl --max-tokens 48 \
  --methods ar,ar:exact,self-draft:fixed:exact,self-draft:auto:exact,draft-verify:fixed:exact,draft-verify:auto:exact \
  --batch-sizes 1,8,16 --repeats 1 --warmup 0 --device cpu --dtype bf16 \
  --skip-set recipes/gpu/skip-attn-16-20-24-28.json > "$HERE/equality-heldout32.txt"
