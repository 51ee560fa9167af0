"""rounds.py BATCH waiting|drain ROUNDS METHODS: one round at a time on the tests' host-charged
clock (test_host_clock.host_charged_ratios, rounds=1): each method's x ar, steps and drafting
steps, a line a round. From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-11-30-graph-staging/rounds.py 8 waiting 6 self-draft"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402
m, patch = script_model()
b, work, R, meth = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
n = 4 * b if work == "waiting" else b
for _ in range(R):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1, methods=meth)
    print({k: (round(v, 3), stats[k].steps, stats[k].controlled_steps - stats[k].lean_steps)
           for k, v in ratios.items()}, flush=True)
