#!/bin/bash
# The drain prior (issue 52), 2026-11-30. From the repo root, with the venv active. BASE: a
# worktree of the commit before (git worktree add /tmp/wt-base <commit>).
set -e
D=bench-results/2026-11-30-drain-prior
M=self-draft,draft-verify,kangaroo
CELLS=1:waiting,8:waiting,32:waiting,64:waiting,1:drain,8:drain,32:drain,64:drain
# the tests' clock, every cell, medians of 3 rounds: before and after
(cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python $OLDPWD/bench-results/2026-11-30-tree-gain/cells.py 3 $M $CELLS) > $D/cells-before.txt
PYTHONPATH=$PWD python bench-results/2026-11-30-tree-gain/cells.py 3 $M $CELLS > $D/cells-after.txt
# what a drain's first drafting steps cost and saved (before: in the worktree)
for b in 32 64; do for m in trace self-draft; do
  (cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python $OLDPWD/$D/drainwhy.py $b $m); done; done > $D/drainwhy-before.txt
for b in 1 8 32 64; do (cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python $OLDPWD/bench-results/2026-11-30-grid-default/stephost.py $b drain trace); done > $D/stephost-trace-before.txt
(cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python $OLDPWD/$D/spans.py 64 self-draft 8) > $D/spans-b64-before.txt
PYTHONPATH=$PWD python $D/fixedspans.py 64 > $D/fixedspans-b64.txt
for b in 32 64; do for m in trace self-draft; do PYTHONPATH=$PWD python $D/drainwhy.py $b $m; done; done > $D/drainwhy-after.txt
# the demo model on the same clock, a pure drain (64 prompts at batch 64), two rounds each
(cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python $OLDPWD/bench-results/2026-11-29-host-clock-5/demo_clock.py 64 64 2 2 self-draft) > $D/demo-b64-drain-before.txt
PYTHONPATH=$PWD python bench-results/2026-11-29-host-clock-5/demo_clock.py 64 64 2 2 self-draft > $D/demo-b64-drain-after.txt
# the held-out CPU default bench (issue 52's >= 0.95x check)
python -m specctl bench recipes/prompts/mtbench16.jsonl --max-tokens 48 \
    --methods ar,self-draft,self-draft:light,draft-verify --batch-sizes 1,8 --repeats 3 \
    --warmup 1 --device cpu --dtype fp32 --skip-set recipes/gpu/skip-attn-16-20-24-28.json > $D/heldout-cpu-default.txt
# small pure drains on the demo model (prompts = batch), three rounds each
for cfg in "1 1" "2 2" "4 4" "8 8"; do b=${cfg% *}
  (cd /tmp/wt-base && PYTHONPATH=/tmp/wt-base python $OLDPWD/bench-results/2026-11-29-host-clock-5/demo_clock.py $cfg 2 3 self-draft) > $D/demo-b$b-drain-before.txt
  PYTHONPATH=$PWD python bench-results/2026-11-29-host-clock-5/demo_clock.py $cfg 2 3 self-draft > $D/demo-b$b-drain-after.txt
done
