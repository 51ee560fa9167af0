# The measurements of README.md, from the repo root (this 2-core EPYC, nothing else running).
set -e
python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
# host work of a drafting step: every step drafts (fixed), the per-sequence path vs the grid
python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
    --store /tmp/tiny-store --batch-sizes 8,64 --threads 1 --max-tokens 48 --prompts 128 \
    --methods ar,self-draft:light:fixed,self-draft:grid:fixed --schedule cuda --repeats 3
# the demo model on the host-charged clock (H200 table, host x3), b8, 32 ShareGPT prompts
python bench-results/2026-11-29-host-clock-5/demo_clock.py 8 32 2 3 self-draft:grid
python bench-results/2026-11-29-host-clock-5/demo_clock.py 8 32 2 3 self-draft
# the session's start (a worktree at 81e471e in /tmp/base) against this tree, tests' clock
for w in "32 waiting" "1 waiting" "8 waiting" "64 drain"; do
  echo "== $w"; BASE=/tmp/base bash bench-results/2026-11-29-host-clock-4/ab.sh $w self-draft self-draft
done
# where Self-Draft's b32 run pays its prefill forwards
python bench-results/2026-11-29-grid-device/admissions.py 32
# the grid under auto against the per-sequence light path, tests' clock
for b in 8 32; do python bench-results/2026-11-29-grid/paired.py $b waiting 3; done
