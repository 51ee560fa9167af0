"""What Controller.decide costs on the step's critical path, on the host-charged clock (thread
CPU time of each call, none of it under a forward): its median, p90 and max over a workload of
tests/test_host_clock.py, for calls over at least half the batch. A search inside decide is
counted apart (after this session's changes there is none past Controller.warm).

    python bench-results/2026-11-29-host-clock-4/decide_cost.py BATCH waiting|drain METHODS
"""
import statistics
import sys
import time

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402
from specctl.runtime.control import policy  # noqa: E402
from specctl.runtime.control.controller import Controller  # noqa: E402

calls, searched = [], [0]
decide, search = Controller.decide, policy.search


def timed(self, keys, *a, **kw):
    s0, t = searched[0], time.thread_time()
    try:
        return decide(self, keys, *a, **kw)
    finally:
        calls.append(((time.thread_time() - t) * 1e6, searched[0] > s0, len(keys)))


def counted(*a, **kw):
    searched[0] += 1
    return search(*a, **kw)


Controller.decide, policy.search = timed, counted
m, patch = script_model()
b = int(sys.argv[1])
n = 4 * b if sys.argv[2] == "waiting" else b
ratios, _, _ = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","), rounds=1)
print({k: round(v, 3) for k, v in ratios.items()})
for flag, name in ((False, "without a search"), (True, "with a search")):
    xs = sorted(t for t, s, k in calls if s == flag and k >= b // 2)
    if xs:
        print(f"decide {name}: {len(xs)} calls, median {statistics.median(xs):.0f} us, "
              f"p90 {xs[int(0.9 * len(xs))]:.0f}, max {xs[-1]:.0f}")
