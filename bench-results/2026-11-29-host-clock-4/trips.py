"""One workload of tests/test_host_clock.py, N separate rounds: each method's x ar, steps and
the guard's trips in each round (the trace at batch 1 is bimodal: the guard trips once on its
first misses and holds the short run to ar, or never trips).

    python bench-results/2026-11-29-host-clock-4/trips.py BATCH waiting|drain METHODS N
"""
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402

m, patch = script_model()
b = int(sys.argv[1])
n = 4 * b if sys.argv[2] == "waiting" else b
for _ in range(int(sys.argv[4])):
    ratios, stats, _ = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","),
                                             rounds=1)
    for k, st in stats.items():
        print(f"{k}: {ratios[k]:.3f}x, {st.steps} steps, guard trips {st.guard_trips} "
              f"(job {st.guard_job_trips}), held {st.guard_held}", flush=True)
