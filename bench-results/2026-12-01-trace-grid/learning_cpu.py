"""CPU microseconds of a drafting step's learning on the b64 trace-grid (tests/sim.py's
host-charged clock, requests waiting): medians over the drafting steps of 5 runs of
Controller.observe, Accounting._count and Accounting._drafted (which holds both).

    PYTHONPATH=$PWD python bench-results/2026-12-01-trace-grid/learning_cpu.py 64
"""
import sys, time, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceGrid, script_model, sim_controller, sim_run
from specctl.runtime.control import controller as Cm
from specctl.runtime.step import accounting as A, step as S
m, patch = script_model()
b = int(sys.argv[1]); n = 4*b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
out, ar = sim_run(m, prompts, None, clock, **kw)
acc = collections.defaultdict(list)
def wrap(obj, name):
    f = getattr(obj, name)
    def w(*a, **k):
        c = time.thread_time()
        try: return f(*a, **k)
        finally: acc[name].append((time.thread_time() - c) * 1e6)
    patch.setattr(obj, name, w)
wrap(Cm.Controller, "observe"); wrap(A.Accounting, "_drafted"); wrap(A.Accounting, "_count"); wrap(Cm.Controller, "verified")
dr = TraceGrid(out, known, m.cfg.vocab_size, clock)
for r in range(5):
    got, st = sim_run(m, prompts, dr.fresh(), clock, controller=sim_controller(dr, clock.table), **kw)
import statistics
print({k: (len(v), round(statistics.median(v))) for k, v in acc.items()})
