"""What the controller learns as `ar`'s step, and each drafting step's ms, in one run on the
host-charged clock (tests/sim.py): every Controller.lean_done (lean steps' mean ms, the ar
price it leaves) and Controller.observe (a drafting step's ms and predicted ms), in order.
OLD=1: a lean step's ms with the last step's learning's overrun left in (Accounting.step's
times' caught read as 0), as before this folder's change.

    PYTHONPATH=$PWD python bench-results/2026-12-01-trace-grid/learnt_ar.py BATCH waiting|drain grid|trace
"""
import os
import sys, time
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceChains, TraceGrid, script_model, sim_controller, sim_run
from specctl.runtime.control import controller as Cm
m, patch = script_model()
b = int(sys.argv[1]); n = 4*b if sys.argv[2] == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
out, ar = sim_run(m, prompts, None, clock, **kw)
ctl_ref = []
ld = Cm.Controller.lean_done
def lean_done(self, b, ms, steps=1, host=None, hosted=0):
    r = ld(self, b, ms, steps, host, hosted)
    print("lean_done b", b, "ms", None if ms is None else round(ms,2), "steps", steps, "host", None if host is None else round(host,2), "-> ar_ms", round(self.ar_ms(b),2), "drift", round(self.cost.drift,3), "table", round(self.cost.ar_table_ms(b),2))
    return r
patch.setattr(Cm.Controller, "lean_done", lean_done)
ob = Cm.Controller.observe
def observe(self, keys, b, props, verdicts, ms, host=None):
    r = ob(self, keys, b, props, verdicts, ms, host)
    print("observe b", len(keys), "ms", None if ms is None else round(ms,2), "pred", round(b.predicted_ms,2), "host", None if host is None else round(host,2), "-> ar_ms", round(self.ar_ms(len(keys)),2), "drift", round(self.cost.drift,3))
    return r
patch.setattr(Cm.Controller, "observe", observe)
if os.environ.get("OLD"):
    from specctl.runtime.step.accounting import Accounting
    step = Accounting.step
    patch.setattr(Accounting, "step", lambda self, plan, out, seqs, had, drain, times, later=False:
                  step(self, plan, out, seqs, had, drain, times[:7] + (0.0,), later))
dr = TraceGrid(out, known, m.cfg.vocab_size, clock) if sys.argv[3] == "grid" else TraceChains(out, known)
clock.reset()
got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table), **kw)
print("run", round(clock()*1e3,1))
