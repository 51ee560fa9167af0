"""Where each method's time goes against ar's on the tests' clock, one round: steps, lean and drafting, their ms, prefill, search, learning. split.py BATCH waiting|drain METHODS [ROUNDS]"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
meth = sys.argv[3].split(",")
orig = T.sim_run
def sim_run(*a, **kw):
    out, st = orig(*a, **kw)
    name = type(a[2]).__name__ if len(a) > 2 and a[2] is not None else "ar"
    cs = st.controlled_steps - st.lean_steps
    print(f"{name:18s} steps {st.steps} lean {st.lean_steps} drafting {cs} step_s {st.step_s*1e3:.1f} "
          f"lean_ms {st.lean_step_ms/ max(1,st.lean_steps):.2f} draft_ms {(st.measured_step_ms - st.lean_step_ms)/max(1,cs):.2f} "
          f"prefill {st.prefill_forwards} {st.prefill_s*1e3:.1f} search {st.search_ms:.1f} learn {st.learn_s*1e3:.1f} trips {st.guard_trips} gen {st.generated}")
    return out, st
T.sim_run = sim_run
ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=meth, rounds=int(sys.argv[4]) if len(sys.argv) > 4 else 1)
print({k: round(v, 3) for k, v in ratios.items()})
