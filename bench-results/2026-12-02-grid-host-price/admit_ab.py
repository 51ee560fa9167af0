"""Outside-the-step host of a b64 waiting trace-grid run, branches drawn lazily (new) or at
admission (old), alternated in one process: each run's x ar (one ar run's clock), its time
outside steps and prefills (ms on the clock), and the drafter's admit CPU ms.

    PYTHONPATH=$PWD python bench-results/2026-12-02-grid-host-price/admit_ab.py [BATCH] [ROUNDS]
"""
import sys, time, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceGrid, script_model, sim_controller, sim_run
from specctl.speculative import self_draft as SD
m, patch = script_model()
b = int(sys.argv[1]) if len(sys.argv) > 1 else 64; n = 4 * b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
admit_cpu = [0.0]
real_admit = SD.SelfDraftDrafter.admit
def admit(self, seq):
    c = time.thread_time()
    real_admit(self, seq)
    if OLD[0]:
        seq.state.branches   # (drawn now, as before)
    admit_cpu[0] += time.thread_time() - c
patch.setattr(SD.SelfDraftDrafter, "admit", admit)
OLD = [False]
clock.reset()
out, _ = sim_run(m, prompts, None, clock, **kw)
ar = clock()
dr = TraceGrid(out, known, m.cfg.vocab_size, clock)
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    for old in (True, False):
        OLD[0] = old
        admit_cpu[0] = 0.0
        d = dr.fresh()
        clock.reset()
        got, st = sim_run(m, prompts, d, clock, controller=sim_controller(d, clock.table), **kw)
        assert got == out
        print("old" if old else "new", f"x ar {ar / clock():.3f} outside "
              f"{1e3 * (clock() - st.prefill_s - st.step_s):.1f} admit cpu {admit_cpu[0] * 1e3:.2f}")
