#!/bin/bash
# main at 579dca3 ("old": this folder's test stand-ins, tests/sim.py's TraceGrid, copied onto it)
# against the working tree ("new"), alternated, ROUNDS processes each (ratios.py, 2 rounds a
# process), for each cell; then medians of every process's x ar (summary.py)
#   bash bench-results/2026-12-01-trace-grid/ab_trees.sh ROUNDS > ab_trees.txt
cd "$(dirname "$0")/../.."
new=$PWD old=/tmp/specctl-579dca3
[ -d $old ] || git worktree add -f $old 579dca3 >/dev/null 2>&1
cp tests/sim.py tests/test_host_clock.py $old/tests/
mkdir -p $old/bench-results/2026-12-01-trace-grid
cp bench-results/2026-12-01-trace-grid/ratios.py $old/bench-results/2026-12-01-trace-grid/
echo "== new $(git rev-parse --short HEAD) + working tree, old 579dca3, $(date +%T)"
for cell in "64 waiting trace,trace-grid,self-draft,draft-verify,kangaroo" \
            "32 waiting trace,trace-grid,self-draft,draft-verify,kangaroo" \
            "8 waiting trace,self-draft" "64 drain trace,trace-grid,self-draft" \
            "32 drain trace,trace-grid,self-draft"; do
  set -- $cell
  for r in $(seq "${ROUNDS:-6}"); do
    for tree in old new; do
      dir=$old; [ $tree = new ] && dir=$new
      (cd $dir && PYTHONPATH=$dir python bench-results/2026-12-01-trace-grid/ratios.py $1 $2 2 $3 2>&1 \
        | grep "x ar" | sed "s/^/$tree /")
    done
  done
done
echo "== done $(date +%T)"
