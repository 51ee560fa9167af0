"""Each drafting step's price against what it took, in one run on the host-charged clock
(tests/sim.py, the traces' grid): its batch, sequences drafting, top budget, predicted ms,
measured ms, host ms, and the host fit (a, s) it was priced with; then each run's RunStats
parts, and its time outside steps and prefills. OLD=1: drafting's host learnt and priced
per drafting sequence (StepCost.hosted as before).

    PYTHONPATH=$PWD python bench-results/2026-12-02-grid-host-price/drafting_prices.py \
        BATCH waiting|drain grid|trace [RUNS]
"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceChains, TraceGrid, script_model, sim_controller, sim_run
from specctl.runtime.control import controller as Cm
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
clock.reset()
out, ar_st = sim_run(m, prompts, None, clock, **kw)
ar = clock()
F = ("steps", "prefill_forwards", "prefill_s", "step_s", "lean_steps", "lean_step_ms",
     "measured_step_ms", "controlled_steps", "searches", "search_ms", "learn_s", "contrasts",
     "guard_trips", "guard_held", "job_excess_ms", "generated")
def show(name, st):
    print(name, " ".join(f"{f}={getattr(st, f):.4g}" if isinstance(getattr(st, f), float)
                         else f"{f}={getattr(st, f)}" for f in F))
show("ar  ", ar_st)
print("ar total", round(ar, 4), "outside", round(ar - ar_st.prefill_s - ar_st.step_s, 4))
ob = Cm.Controller.observe
rows = []
def observe(self, keys, bud, props, verdicts, ms, host=None):
    fit = self.cost.host_fit()
    r = ob(self, keys, bud, props, verdicts, ms, host)
    acc = sum(len(a) for a in (getattr(verdicts, "accepted", None) or [v.accepted for v in verdicts]))
    print(f"b {len(keys):3d} drafting {sum(k > 0 for k in bud.ks):3d} top {max(bud.ks)} "
          f"pred {bud.predicted_ms:5.2f} ms {ms if ms is None else round(ms, 2)} "
          f"host {host if host is None else round(host, 2)} fit ({fit[0]:.2f}, {fit[1]:.4f}) "
          f"ar {self.ar_ms(len(keys)):.2f} accepted {acc}")
    return r
patch.setattr(Cm.Controller, "observe", observe)
import os
if os.environ.get("OLD"):   # (drafting's host learnt and priced per drafting sequence)
    from specctl.runtime.control.stepcost import StepCost
    patch.setattr(StepCost, "hosted", lambda self, b, drafting: drafting)
dr = TraceGrid(out, known, m.cfg.vocab_size, clock) if sys.argv[3] == "grid" else TraceChains(out, known)
res = []
for r in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1):
    clock.reset()
    d = dr.fresh()
    got, st = sim_run(m, prompts, d, clock, controller=sim_controller(d, clock.table), **kw)
    assert got == out
    show("run ", st)
    print("run total", round(clock(), 4), "outside", round(clock() - st.prefill_s - st.step_s, 4))
    print(f"run x ar {ar / clock():.3f}")
