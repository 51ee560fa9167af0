# The measurements of README.md, from the repo root (this 2-core EPYC, nothing else running).
# "before": a tree at the parent commit (git stash the change, or a worktree); "after": this one.
set -e
D=bench-results/2026-11-30-tree-gain
C=bench-results/2026-11-29-host-clock-5/demo_clock.py
# the demo clock (the demo model, ShareGPT prompts cut to 96 tokens, H200 tables, host x3)
python $C 1 8 2 3 self-draft > $D/demo-b1-after.txt
python $C 8 32 2 3 self-draft > $D/demo-b8-after.txt
python $C 32 128 2 2 self-draft > $D/demo-b32-after.txt
# per drafting step: budgets, nodes found, accepted expected and verified, the pool's rates
python $D/demo_steps.py 32 128 2 1 self-draft > $D/steps-b32-after.txt
# the tests' clock (tiny model, real-text traces), Self-Draft, 4 rounds a cell, medians
python $D/cells.py 4 self-draft,self-draft:job 1:waiting,8:waiting,32:waiting,64:waiting,8:drain,32:drain,64:drain > $D/tests-clock-after.txt
python bench-results/2026-11-30-tree-gain/b8.py 8 > bench-results/2026-11-30-tree-gain/b8-tests-clock.txt   # (after; before: the same in a worktree at the parent)
python $C 64 256 2 1 self-draft > $D/demo-b64-after.txt   # (twice; before: in a worktree at 74afa77)
# the cold-rule variant (not kept): git apply cold-rule.patch, then the same commands into cold-rule-*.txt
