"""cells.py ROUNDS METHODS cells -> median x ar per method"""
import statistics, sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
m, patch = script_model()
R = int(sys.argv[1]); meth = sys.argv[2].split(",")
for c in sys.argv[3].split(","):
    b, work = int(c.split(":")[0]), c.split(":")[1]
    n = 4 * b if work == "waiting" else b
    got = {}
    for _ in range(R):
        ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1, methods=meth)
        for k, v in ratios.items():
            got.setdefault(k, []).append((v, stats[k].steps, stats[k].controlled_steps - stats[k].lean_steps))
    print(b, work, {k: (round(statistics.median(x for x, _, _ in v), 3), round(min(x for x, _, _ in v), 3), round(max(x for x, _, _ in v), 3), statistics.median(s for _, s, _ in v), statistics.median(d for _, _, d in v)) for k, v in got.items()}, flush=True)
