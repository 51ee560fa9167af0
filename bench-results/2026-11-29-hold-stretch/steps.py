# each drafting step of a method on the host-charged clock (requests waiting, ends not foreseen): its
# sequences, how many drafted, the controller's predicted ms against the measured, host ms, tokens
#   python steps.py BATCH METHOD
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model, SimClock, HOST, h200_fused_table, prefill_table, timed_model, sim_run, traces, trace_lengths, sim_controller
from specctl.runtime.step.accounting import Accounting
m, patch = script_model()
b = int(sys.argv[1]); method = sys.argv[2]
n = 4*b
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
tar = clock()
rows = []
inner = Accounting.step
def step(self, plan, out, seqs, had, took, t0, drain, held=0, searched=0.0, host=None, end=None):
    bb = plan.budgets
    if not bb.lean:
        toks = sum(1 + len(v.accepted) for v in out.verdicts)
        c = self.ctl
        rows.append((self.stats.steps, len(seqs), sum(k > 0 for k in bb.ks), round(bb.predicted_ms, 2), round(took, 2), None if host is None else round(host, 2), toks, round(c.cost.host_fit()[1], 3)))
    return inner(self, plan, out, seqs, had, took, t0, drain, held, searched, host, end)
Accounting.step = step
dr = T._drafters(m, prompts, ref, [method])[method].fresh(); clock.reset()
got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False, controller=sim_controller(dr, clock.table))
assert got == ref
print(method, "x ar", round(tar/clock(), 3), "steps", st.steps, "guard trips", st.guard_trips, "job trips", st.guard_job_trips, "held", st.guard_held, "excess", round(st.job_excess_ms,1))
print("(step, seqs, drafting, predicted ms, took ms, host ms, tokens, host slope)")
for r in rows: print(r)
