"""paired.py with Accounting._held scaled by env HELD (0: held slots uncharged), N rounds: each method's median, range and job trips.
    HELD=0 python bench-results/2026-12-01-job-account/held_charge.py BATCH waiting|drain METHODS N"""
import os, statistics, sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.step import accounting as A
k = float(os.environ.get("HELD", "1"))
o = A.Accounting._held
A.Accounting._held = lambda self, n, h: k * o(self, n, h)
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
got = {}
for _ in range(int(sys.argv[4])):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","), rounds=1)
    for kk, v in ratios.items():
        if kk != "ar":
            got.setdefault(kk, []).append((v, stats[kk].guard_job_trips))
for kk, v in got.items():
    xs = sorted(x for x, _ in v)
    print(f"HELD={k} b{b} {sys.argv[2]} {kk}: median {statistics.median(xs):.3f} range {xs[0]:.3f}-{xs[-1]:.3f} jobtrips {[t for _, t in v]}")
