"""Where a run's host CPU goes on the host-charged clock, per step: each part's thread CPU
time (inclusive; `~forward` is the forwards' own, not charged), ar then one method.

    python bench-results/2026-11-28-host-clock-2/attribute.py BATCH waiting|drain trace|draft-verify|kangaroo|self-draft
"""
import sys, time, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from helpers import method_drafters
from sim import SimClock, TraceChains, h200_fused_table, prefill_table, sim_controller, sim_run, timed_model, trace_lengths, traces, HOST, script_model
acc = collections.Counter(); cnt = collections.Counter(); depth = [0]
def wrap(obj, name, tag):
    fn = getattr(obj, name)
    def w(*a, **k):
        depth[0] += 1; t = time.thread_time()
        try: return fn(*a, **k)
        finally: acc[tag] += time.thread_time() - t; cnt[tag] += 1; depth[0] -= 1
    setattr(obj, name, w)
from specctl.runtime.control.controller import Controller
from specctl.runtime.step import step as S, runner as R
from specctl.runtime.step.accounting import Accounting
m, patch = script_model()
b = int(sys.argv[1]); n = 4*b if sys.argv[2] == "waiting" else b
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
for obj, name in ((Controller, "plan_lean"), (Controller, "decide"), (Controller, "prefetch"), (S.Planner, "_planned"), (R, "commit"), (R.Runner, "_retire"), (R.Runner, "_admit"), (R.Runner, "step")):
    wrap(obj, name, name)
wrap(Accounting, "step", "accounting")
wrap(Controller, "observe", "ctl.observe")
wrap(Controller, "_search", "ctl._search")
from specctl.runtime.control.guard import Guard
wrap(Guard, "job", "guard.job")
wrap(Accounting, "flush", "acct.flush")
import specctl.runtime.step.runner as RR
v = RR.verify
def vv(*a, **k):
    t = time.thread_time(); r = v(*a, **k); acc["verify(incl argmax)"] += time.thread_time() - t; return r
RR.verify = vv
clock.reset(); out, ar = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens)
def show(tag, steps):
    print(tag, {k: round(v / steps * 1e6, 1) for k, v in sorted(acc.items())}, "us/step")
acc["~forward"] = clock.inside; show("ar", ar.steps); acc.clear()
drs = {"trace": TraceChains(out, known)}; drs.update(method_drafters(m, prompts, out))
dr = drs[sys.argv[3]].fresh()
for obj in (type(dr),):
    for name in ("propose", "idle", "observe"):
        wrap(obj, name, "drafter." + name)
clock.reset()
got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, controller=sim_controller(dr, clock.table))
acc["~forward"] = clock.inside; show(sys.argv[3], st.steps)
