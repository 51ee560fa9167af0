"""In-run thread CPU (us a call) of named parts of the host-charged clock's runs (ratios.py of
../2026-12-01-trace-grid, its arguments): each part's total over both runs (ar's, then the
drafter's under auto) by its calls.

    HOSTX=0 PYTHONPATH=$PWD python bench-results/2026-12-04-sim-grid-kernel/parts.py 32 waiting 1 trace-grid
"""
import sys, os, collections, time
sys.path.insert(0, "tests")
import sim
import specctl.runtime.step.stepping as stp, specctl.runtime.step.step as stm
import specctl.runtime.step.accounting as accm, specctl.runtime.control.controller as cm
import specctl.speculative.self_draft as sdm, specctl.runtime.step.grid as gm
acc = collections.Counter(); cnt = collections.Counter()
def wrap(obj, name, label):
    fn = getattr(obj, name)
    def w(*a, **k):
        t = time.thread_time()
        try: return fn(*a, **k)
        finally: acc[label] += time.thread_time() - t; cnt[label] += 1
    setattr(obj, name, w)
wrap(stm.Planner, "plan", "plan")
wrap(stm.Planner, "_grid", "plan.grid")
wrap(stp.Stepping, "under_forward", "under_forward")
wrap(stp.Stepping, "catch_up", "uf.catch_up")
wrap(stp.Stepping, "_prefetch", "uf.prefetch")
wrap(stp, "commit_grid", "commit_grid")
wrap(accm.Accounting, "step", "accounting.step")
wrap(cm.Controller, "observe", "ctl.observe")
wrap(cm.Controller, "decide", "ctl.decide")
wrap(cm.Controller, "verified", "ctl.verified")
wrap(sdm.SelfDraftDrafter, "grid_learned", "grid_learned")
wrap(gm.GridStep, "verify", "verify(dev)")
wrap(stp.Stepping, "step", "STEP")
import specctl.runtime.control.stepcost as scm, specctl.runtime.control.acceptance as am, specctl.runtime.control.policy as pm
wrap(scm.StepCost, "learn", "cost.learn")
wrap(scm.StepCost, "learn_host", "cost.learn_host")
wrap(am.Acceptance, "learn_many", "acc.learn_many") if hasattr(am, "Acceptance") else None
wrap(cm.Controller, "drafted", "ctl.drafted")
wrap(accm.Accounting, "_count", "acct._count")
wrap(cm.Controller, "prefetch", "ctl.prefetch")
wrap(cm.Controller, "_search", "ctl._search")
wrap(sdm.SelfDraftDrafter, "catch_up", "drafter.catch_up")

wrap(sim.Staging, "__call__", "sim.stage")
wrap(sim.SimClock, "forward", "sim.clock.forward")
wrap(gm.GridStep, "device_step", "verify.device_step")
wrap(stm.Planner, "execute", "execute")
import specctl.engine.launches as lm
import specctl.speculative.context_table as ctm
wrap(ctm.ContextTable, "push_texts", "ctx.push_texts")
wrap(sdm.SelfDraftDrafter, "_settle", "sd._settle")
import runpy
runpy.run_path("bench-results/2026-12-01-trace-grid/ratios.py", run_name="__main__")
for k in sorted(acc): print(f"{k:18s} {cnt[k]:5d} {acc[k]/cnt[k]*1e6:8.1f} us/call")
