"""Tests' clock with the prefill forward priced at a fixed MS: pf.py MS ROUNDS cells"""
import statistics, sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
m, patch = script_model()
ms, R = float(sys.argv[1]), int(sys.argv[2])
for c in sys.argv[3].split(","):
    b, work = int(c.split(":")[0]), c.split(":")[1]
    n = 4 * b if work == "waiting" else b
    got = {}
    for _ in range(R):
        ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1, methods=["self-draft", "draft-verify", "kangaroo"],
                                                  prefill=(lambda p: ms) if ms > 0 else None)
        for k, v in ratios.items():
            got.setdefault(k, []).append((v, stats[k].prefill_forwards))
    print(ms, b, work, "ar prefill", ar.prefill_forwards, {k: (round(statistics.median(x for x, _ in v), 3), statistics.median(p for _, p in v)) for k, v in got.items()}, flush=True)
