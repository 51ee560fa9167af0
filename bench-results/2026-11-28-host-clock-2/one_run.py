"""One workload of tests/test_host_clock.py on the host-charged clock, 2 rounds, each method's
x ar with its device and host ms, steps, searches, contrasts, guard trips, budgets and
acceptance (what the table's one number hides).

    python bench-results/2026-11-28-host-clock-2/one_run.py BATCH waiting|drain trace,draft-verify,kangaroo,self-draft
"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from helpers import method_drafters
from sim import SimClock, TraceChains, h200_fused_table, prefill_table, sim_controller, sim_run, timed_model, trace_lengths, traces, HOST, script_model

m, patch = script_model()
b = int(sys.argv[1]); n = 4*b if sys.argv[2] == "waiting" else b
names = sys.argv[3].split(",")
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
for r in range(2):
    clock.reset(); out, ar = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens)
    art = clock()
    print("ar", f"total {clock()*1e3:.2f} dev {clock.t*1e3:.2f} host {clock.host_s()*1e3:.2f} steps {ar.steps}")
    drs = {"trace": TraceChains(out, known)}; drs.update(method_drafters(m, prompts, out))
    for nm in names:
        dr = drs[nm].fresh(); clock.reset()
        got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, controller=sim_controller(dr, clock.table))
        assert got == out
        print(nm, f"x{art/clock():.3f} total {clock()*1e3:.2f} dev {clock.t*1e3:.2f} host {clock.host_s()*1e3:.2f} steps {st.steps} ctl {st.controlled_steps} searches {st.searches} contrasts {st.contrasts} trips {st.guard_trips}/{st.guard_job_trips} budget {st.budget_hist} accept {st.accept_hist} excess {st.job_excess_ms:.2f}")
