#!/bin/bash
# The session's start (BASE, a worktree: git worktree add /work/wt-base 24e5ce9) against this
# tree (HEAD), alternating: 2 x 2 rounds of paired.py (2026-11-29-host-clock-3) each, one
# window. ab.sh BATCH waiting|drain METHODS_BASE METHODS_HEAD (Self-Draft at the base had the
# job cache: its 'self-draft' is HEAD's 'self-draft:job')
BASE=${BASE:-/work/wt-base}
HEAD=${HEAD:-$(cd "$(dirname "$0")/../.." && pwd)}
P=$HEAD/bench-results/2026-11-29-host-clock-3/paired.py
for r in 1 2; do
  (cd "$BASE" && PYTHONPATH=$BASE python "$P" "$1" "$2" "$3" 2 2>&1 | grep median | sed 's/^/base /')
  (cd "$HEAD" && PYTHONPATH=$HEAD python "$P" "$1" "$2" "$4" 2 2>&1 | grep median | sed 's/^/head /')
done
