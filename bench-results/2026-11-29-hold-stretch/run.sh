#!/bin/bash
# paired.py (medians of 7 rounds, requests waiting) at the commit before the change and at
# this checkout, each from its own tree; run from the repository root.
set -e
BEFORE=${BEFORE:-9de6d80}
rm -rf /tmp/hold-before && git worktree add -f -q /tmp/hold-before $BEFORE
P=bench-results/2026-11-29-host-clock-3/paired.py
for b in 8 32 64; do
  echo "== batch $b, before ($BEFORE)"
  (cd /tmp/hold-before && PYTHONPATH=. python $OLDPWD/$P $b waiting trace,self-draft,draft-verify,kangaroo 7 2>&1 | grep median)
  echo "== batch $b, after"
  PYTHONPATH=. python $P $b waiting trace,self-draft,draft-verify,kangaroo 7 2>&1 | grep median
done
git worktree remove --force /tmp/hold-before
