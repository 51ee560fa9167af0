# Forward-only (host charged at 0) ceiling of the trace chains: every step drafting K, and auto.
# PYTHONPATH=$PWD python THIS BATCH waiting|drain
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
T.HOST = 0.0
from sim import TraceChains, script_model, sim_controller, sim_run
m, patch = script_model()
b, work = int(sys.argv[1]), sys.argv[2]
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
clock.reset(); ref, st = sim_run(m, prompts, None, clock, **kw); ar = clock()
print("ar", st.steps, ar)
for K in (2, 3, 4, 5, 6, 8):
    dr = TraceChains(ref, known, K=K).fresh(); clock.reset()
    got, st = sim_run(m, prompts, dr, clock, controller=None, **kw)
    print("always K", K, round(ar / clock(), 3), st.steps)
dr = TraceChains(ref, known).fresh(); clock.reset()
got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table), **kw)
print("auto", round(ar / clock(), 3), st.steps)
