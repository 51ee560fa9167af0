# per round: `ar` ms, the method ms, x ar, steps, guard trips and held steps, prefill forwards
# (host-charged clock, requests waiting, ends not foreseen): python rounds.py BATCH METHOD N
import sys, statistics
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model, SimClock, HOST, h200_fused_table, prefill_table, timed_model, sim_run, traces, trace_lengths, sim_controller
m, patch = script_model()
b = int(sys.argv[1]); method = sys.argv[2]; N = int(sys.argv[3])
n = 4*b
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
rs = []
dr0 = None
for i in range(N):
    clock.reset()
    ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
    tar = clock(); apf = st.prefill_forwards
    if dr0 is None: dr0 = T._drafters(m, prompts, ref, [method])[method]
    dr = dr0.fresh(); clock.reset()
    got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False, controller=sim_controller(dr, clock.table))
    assert got == ref
    t = clock()
    rs.append(tar / t)
    print(f"ar {tar*1e3:.0f} ({apf} pf) {method} {t*1e3:.0f} x{tar/t:.3f} steps {st.steps} trips {st.guard_trips} held {st.guard_held} pf {st.prefill_forwards}", flush=True)
print("median", round(statistics.median(rs), 3), "mean", round(statistics.mean(rs), 3))
