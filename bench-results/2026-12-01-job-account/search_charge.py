"""N rounds of one workload of tests/test_host_clock.py with the job account told nothing of the
excess reported at once for lean steps (env NOSEARCH=1: their searches in vain, and their held
slots too): each method's median x ar, and each round's (x ar, trips).
    NOSEARCH=1 python bench-results/2026-12-01-job-account/search_charge.py BATCH waiting|drain METHODS N"""
import os, statistics, sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control import guard as G
off = os.environ.get("NOSEARCH") == "1"
oj = G.Guard.job
import inspect
def job(self, excess, ms, steps=1):
    # lean steps' at-once calls have steps=0; drop their excess when NOSEARCH (held is also in them; approx)
    if off and steps == 0 and ms and excess > 0:
        excess = 0.0
    return oj(self, excess, ms, steps)
G.Guard.job = job
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
got = {}
for _ in range(int(sys.argv[4])):
    ratios, stats, _ = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","), rounds=1)
    for k, st in stats.items():
        if k != "ar": got.setdefault(k, []).append((round(ratios[k], 3), st.guard_trips))
for k, v in got.items():
    print("NOSEARCH" if off else "base", sys.argv[1], sys.argv[2], k, "median", statistics.median(x for x, _ in v), v)
