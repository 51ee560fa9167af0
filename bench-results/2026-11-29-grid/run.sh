# The grid step's measurements (bench-results/2026-11-29-grid/README.md), from the repo root.
set -e
python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
# host work of a drafting step: every step drafts (fixed), the per-sequence path vs the grid
python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
    --store /tmp/tiny-store --batch-sizes 8,64 --threads 1 --max-tokens 48 --prompts 128 \
    --methods ar,self-draft:light:fixed,self-draft:grid:fixed --schedule cuda --repeats 3
# under auto on the host-charged clock (H200 table, host x3), requests waiting
for b in 8 32 64; do python bench-results/2026-11-29-grid/paired.py $b waiting 3; done
