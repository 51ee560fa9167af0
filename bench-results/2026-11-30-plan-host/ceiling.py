"""What the trace's chains (real text's acceptance, tests/sim.py TraceChains) can make of
batch 8 with requests waiting (tests/test_host_clock.py's workload: 32 requests, answers of
the real lengths) as the host's charge goes from nothing to the clock's x3: the issue's bar
is 1.25x there.

    python bench-results/2026-11-30-plan-host/ceiling.py HOST [ROUNDS]
"""
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402

m, patch = script_model()
T.HOST = float(sys.argv[1])
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    ratios, stats, ar = T.host_charged_ratios(m, 8, 32, patch, methods=["trace"], rounds=1)
    st = stats["trace"]
    print(f"host x{T.HOST}: trace {ratios['trace']:.3f}x ar, {st.steps} steps (ar {ar.steps}), "
          f"guard trips {st.guard_trips}, held {st.guard_held}", flush=True)
