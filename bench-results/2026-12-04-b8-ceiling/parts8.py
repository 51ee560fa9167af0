# In-run host parts (thread CPU us/step) at batch B on the host-charged clock: ar against the
# trace chains drafting every step (no controller). PYTHONPATH=$PWD python THIS 8 waiting
import sys, time, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceChains, script_model, sim_run
import specctl.runtime.step.stepping as S, specctl.runtime.step.step as ST
import specctl.runtime.control.controller as C
import specctl.runtime.step.accounting as A
acc = collections.Counter()
def wrap(obj, name, label):
    fn = getattr(obj, name)
    def w(*a, **k):
        t = time.thread_time()
        try: return fn(*a, **k)
        finally: acc[label] += time.thread_time() - t
    setattr(obj, name, w)
wrap(S.Stepping, "step", "STEP")
wrap(ST.Planner, "plan", "plan")
wrap(ST.Planner, "execute", "execute(model)")
wrap(S.Stepping, "under_forward", "under_forward")
wrap(S.Stepping, "catch_up", "  catch_up")
wrap(S.Stepping, "_prefetch", "  prefetch")
wrap(S, "read", "read"); wrap(S, "verify", "verify"); wrap(S, "commit", "commit")
wrap(A.Accounting, "step", "accounting")
wrap(C.Controller, "decide", "decide"); wrap(C.Controller, "observe", "ctl.observe")
wrap(TraceChains, "propose", "propose")
m, patch = script_model()
b, work = int(sys.argv[1]), sys.argv[2]
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
for r in range(3):
    acc.clear(); clock.reset(); ref, st = sim_run(m, prompts, None, clock, **kw)
    a = dict(acc); asteps = st.steps; ar = clock(); ah = clock.host_s()
    acc.clear()
    dr = TraceChains(ref, known).fresh(); clock.reset()
    got, st = sim_run(m, prompts, dr, clock, controller=None, **kw)
    print(f"round {r}: ratio {ar/clock():.3f} ar host {ah*1e3:.0f} ms, trace host {clock.host_s()*1e3:.0f} ms, dev {clock.t*1e3:.0f}; steps ar {asteps} trace {st.steps}")
for k in sorted(set(a) | set(acc)):
    print(f"{k:16s} ar {a.get(k,0)/asteps*1e6:7.1f} us/step   trace {acc.get(k,0)/st.steps*1e6:7.1f} us/step")
