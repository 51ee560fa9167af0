# The measurements of README.md, from the repo root (this 2-core EPYC, nothing else running).
set -e
# the host-charged clock: per-sequence steps against the grid, under auto (after the change)
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/paths.py 3 32:waiting,64:waiting
# the demo model on the same clock, Self-Draft's default settings on the grid (two rounds each)
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/demo_grid.py 32 128 2 2 self-draft:dgrid
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/demo_grid.py 64 256 2 2 self-draft:dgrid
# the drains' loss split into device and host (after 3626ce4; DB=1: the per-sequence steps)
for b in 64 32; do PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/lean_over.py $b drain 3 - self-draft; done
for b in 64 32; do DB=1 PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/lean_over.py $b drain 3 - self-draft; done
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/paths.py 3 32:waiting,64:waiting,32:drain,64:drain
# the same drains before the change (a worktree at a66d55b in /tmp/wt-before), for lean-over.txt
(cd /tmp/wt-before && PYTHONPATH=/tmp/wt-before python /work/main/bench-results/2026-11-30-grid-default/lean_over.py 64 drain 3 - self-draft)
# b64 waiting, 4 rounds of each tree back to back (b64-waiting-truncation.txt)
(cd /tmp/wt-before && PYTHONPATH=/tmp/wt-before python /work/main/bench-results/2026-11-30-grid-default/paths.py 4 64:waiting)
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/paths.py 4 64:waiting
# each step's CPU by kind, ar and the trace oracle, a b64 drain (stephost.txt)
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/stephost.py 64 drain trace
# the demo clock after the change, b32 (demo-b32-after.txt)
PYTHONPATH=$PWD python bench-results/2026-11-29-host-clock-5/demo_clock.py 32 128 2 2 self-draft
# before-paths.txt: paths.py in a worktree at 35075a2 (/tmp/wt-base), before the default (its
# forerunner named the two `self-draft` and `sd-grid`)
(cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python /work/main/bench-results/2026-11-30-grid-default/paths.py 3 32:waiting,64:waiting,8:waiting,64:drain)
(cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python /work/main/bench-results/2026-11-30-grid-default/paths.py 3 16:waiting,32:drain)
# the demo clock at b32, three rounds after (this tree) and before (a66d55b) the truncation
PYTHONPATH=$PWD python bench-results/2026-11-29-host-clock-5/demo_clock.py 32 128 2 3 self-draft
(cd /tmp/wt-before && PYTHONPATH=/tmp/wt-before python bench-results/2026-11-29-host-clock-5/demo_clock.py 32 128 2 3 self-draft)
# and at b64 after it (demo-b64-after.txt)
PYTHONPATH=$PWD python bench-results/2026-11-29-host-clock-5/demo_clock.py 64 256 2 2 self-draft
# host work a step at b64 (host_profile.md)
python recipes/tiny_model.py /tmp/tiny --input recipes/prompts/specbench128.jsonl --store /tmp/tiny-store
python recipes/host_profile.py --model /tmp/tiny --input recipes/prompts/specbench128.jsonl \
    --store /tmp/tiny-store --batch-sizes 64 --threads 1 --max-tokens 48 --prompts 128 \
    --methods ar,self-draft,self-draft:no-grid,self-draft:grid:fixed,draft-verify --schedule cuda \
    --repeats 3 --skip-set /tmp/tiny/skip.json
# the demo clock at 8, 16 and 32, both paths, three rounds each
for spec in "16 64 self-draft" "16 64 self-draft:dgrid" "8 32 self-draft" "8 32 self-draft:dgrid" "32 128 self-draft:no-grid"; do
  set -- $spec; PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/demo_grid.py $1 $2 2 3 $3
done
