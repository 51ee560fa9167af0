"""Host CPU ms of the runner's work outside a step (admission, retirement, prefill), for
`ar` and the b64 waiting trace-grid run, 3 rounds alternated: each run's clock, its time
outside steps and prefills, and each wrapped method's thread CPU ms (x HOST on the clock).

    PYTHONPATH=$PWD python bench-results/2026-12-02-grid-host-price/outside.py [BATCH]
"""
import sys, time, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceGrid, script_model, sim_controller, sim_run
from specctl.runtime.step import runner as R
m, patch = script_model()
b = int(sys.argv[1]) if len(sys.argv) > 1 else 64; n = 4 * b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
acc = collections.defaultdict(float)
def wrap(obj, name):
    f = getattr(obj, name)
    def w(*a, **k):
        c = time.thread_time()
        try: return f(*a, **k)
        finally: acc[name] += (time.thread_time() - c) * 1e3
    patch.setattr(obj, name, w)
for nm in ("_admit", "_retire", "_reserve", "_soon", "_prefill", "step", "under_prefill"):
    wrap(R.Runner, nm)
clock.reset()
out, _ = sim_run(m, prompts, None, clock, **kw)
dr = TraceGrid(out, known, m.cfg.vocab_size, clock)
for r in range(3):
  for name in ("ar", "grid"):
    d = dr.fresh() if name == "grid" else None
    ctl = sim_controller(d, clock.table) if d else None
    acc.clear()
    clock.reset()
    c0 = time.thread_time()
    got, st = sim_run(m, prompts, d, clock, controller=ctl, **kw)
    tot = (time.thread_time() - c0) * 1e3
    print(name, f"clock {clock()*1e3:.1f} outside {1e3*(clock()-st.prefill_s-st.step_s):.1f} cpu {tot:.1f}",
          " ".join(f"{k} {v:.1f}" for k, v in acc.items()))
