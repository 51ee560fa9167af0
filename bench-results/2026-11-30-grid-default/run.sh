# The measurements of README.md, from the repo root (this 2-core EPYC, nothing else running).
set -e
# the host-charged clock: per-sequence steps against the grid, under auto (after the change)
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/paths.py 3 32:waiting,64:waiting
# the demo model on the same clock, Self-Draft's default settings on the grid (two rounds each)
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/demo_grid.py 32 128 2 2 self-draft:dgrid
PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/demo_grid.py 64 256 2 2 self-draft:dgrid
