"""One workload of tests/test_host_clock.py, N rounds, with the guard's first hold (HOLD),
credit (CREDIT) and, where the tree has it, first balance (START, in drafting steps' time) set
from the environment: each method's median x ar and each round's (x ar, trips).
    HOLD=32 python bench-results/2026-12-01-guard-hold/trips_var.py BATCH waiting|drain METHODS N"""
import sys, os, statistics
sys.path.insert(0, "tests")
from specctl.runtime.control import guard as G
hold = int(os.environ.get("HOLD", G.GUARD_HOLD)); credit = float(os.environ.get("CREDIT", G.GUARD_CREDIT))
d = list(G.Guard.__init__.__defaults__)  # credit, eps, hold, max_hold, active
d[0], d[2] = credit, hold
if len(d) > 5 and "START" in os.environ:   # (credit, eps, hold, max_hold, active, start)
    d[5] = float(os.environ["START"])
G.Guard.__init__.__defaults__ = tuple(d)
import test_host_clock as T
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
got = {}
for _ in range(int(sys.argv[4])):
    ratios, stats, _ = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","), rounds=1)
    for k, st in stats.items():
        if k != "ar": got.setdefault(k, []).append((round(ratios[k], 3), st.guard_trips))
for k, v in got.items():
    print(k, "median", statistics.median(x for x, _ in v), v)
