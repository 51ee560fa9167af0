# Two runs of Kangaroo on the host-charged clock (BATCH, waiting|drain): x ar and what the run did.
#   python bench-results/2026-11-29-forward-host/kangaroo_runs.py BATCH waiting|drain
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
for r in range(2):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=["kangaroo"], rounds=1)
    st = stats["kangaroo"]
    print(round(ratios["kangaroo"], 3), "steps", st.steps, "lean", st.lean_steps, "contrasts", st.contrasts, "drafting seq-steps", sum(v for k, v in st.budget_hist.items() if k), "trips", st.guard_trips, "held", st.guard_held, "prefill fwd", st.prefill_forwards, "searches", st.searches, "excess", round(st.job_excess_ms, 2), "step_s", round(st.step_s, 4), "prefill_s", round(st.prefill_s, 4))
