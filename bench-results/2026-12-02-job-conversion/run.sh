# Makes occ.txt, pred.txt, jobex.txt from the repo root (venv active); held-ab.txt is ab.sh's,
# margin.txt margin.py's with margin.diff applied.
set -e
D=bench-results/2026-12-02-job-conversion
PYTHONPATH=$PWD python $D/occ.py 32 2 2>&1 | grep -v Writing > $D/occ.txt
for i in 1 2; do PYTHONPATH=$PWD python $D/pred.py 32 2>&1 | grep -v Writing; done > $D/pred.txt
PYTHONPATH=$PWD python $D/jobex.py 8 trace,self-draft 2 2>&1 | grep -v Writing > $D/jobex.txt
