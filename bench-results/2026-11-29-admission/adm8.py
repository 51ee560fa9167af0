# One waiting workload of tests/test_host_clock.py (4 x BATCH requests), N rounds: each method's ratio, steps, prefill forwards, guard trips.
#   python bench-results/2026-11-29-admission/adm8.py BATCH METHODS N
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
meth = sys.argv[2].split(",")
for _ in range(int(sys.argv[3])):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=meth, rounds=1)
    for k in meth:
        st = stats[k]
        print(k, f"{ratios[k]:.3f}", "steps", st.steps, "prefill fw", st.prefill_forwards, f"prefill {st.prefill_s*1e3:.1f} steps {st.step_s*1e3:.1f}", "trips", st.guard_trips, "held", st.guard_held, "lean", st.lean_steps, "searches", st.searches)
