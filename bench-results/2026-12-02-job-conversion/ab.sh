# held.diff against the code as committed, alternated, 6 rounds (run from the repo root, its
# venv active): held-ab.txt. Leaves accounting.py as committed.
set -e
D=bench-results/2026-12-02-job-conversion
for i in 1 2 3 4 5 6; do
  git apply $D/held.diff; echo -n "new "; PYTHONPATH=$PWD python $D/pred.py 32 2>&1 | tail -1
  git checkout -q specctl/runtime/step/accounting.py; echo -n "old "; PYTHONPATH=$PWD python $D/pred.py 32 2>&1 | tail -1
done
