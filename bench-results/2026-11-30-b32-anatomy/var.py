"""Variants on the tests' clock: var.py BATCH waiting|drain METHODS ROUNDS VARIANT"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control import guard as G
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
v = sys.argv[5]
if v == "nojob":
    G.JOB_SLACK = 1e9
out = []
for r in range(int(sys.argv[4])):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","), rounds=1)
    out.append({k: (round(x, 3), stats[k].steps, stats[k].prefill_forwards, stats[k].guard_trips) for k, x in ratios.items()})
    print(v, out[-1], flush=True)
    for k, st in list(stats.items()) + [("ar", ar)]:
        cs = st.controlled_steps - st.lean_steps
        print(f"  {k:12s} steps {st.steps} lean {st.lean_steps} drafting {cs} step_s {st.step_s*1e3:.1f} lean_ms {st.lean_step_ms:.1f} draft_ms {st.measured_step_ms - st.lean_step_ms:.1f} ar_eq_draft {st.ar_step_ms - st.lean_step_ms:.1f} prefill {st.prefill_forwards} {st.prefill_s*1e3:.1f} search {st.search_ms:.1f} learn {st.learn_s*1e3:.1f} excess {st.job_excess_ms:.1f}")
