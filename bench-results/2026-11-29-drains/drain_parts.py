# A workload of tests/test_host_clock.py taken apart on the host-charged clock: ar, then each method (N rounds):
# device and host ms of the steps, the runner's admit / prefill / retire / reserve (clock ms, calls), gen-N GC
# collections, each phase's CPU ms a step, the drafting steps, the median lean step's host ms against ar's.
#   python bench-results/2026-11-29-drains/drain_parts.py BATCH waiting|drain METHODS [N] [cap]
# (cap: sim_run's ends_known=False, the known-end rule seeing one budget for all, as
# tests/test_host_clock.py runs since 2026-11-29-ar-grouped)
import sys, time, statistics
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model, SimClock, HOST, h200_fused_table, prefill_table, timed_model, sim_run, traces, trace_lengths, sim_controller
from specctl.runtime.step.runner import Runner
import os
import specctl.runtime.control.controller as CC
m, patch = script_model()
b = int(sys.argv[1]); work = sys.argv[2]; methods = sys.argv[3].split(",")
ENDS = not (len(sys.argv) > 5 and sys.argv[5] == "cap")
n = 4*b if work == "waiting" else b
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
log = []
import gc
gcs = []
_t = {}
def cb(phase, info):
    if phase == "start": _t['t'] = time.thread_time()
    else: gcs.append((info['generation'], time.thread_time() - _t['t']))
gc.callbacks.append(cb)
def gshow(tag):
    by = {}
    for g, t in gcs:
        a = by.setdefault(g, [0, 0.0]); a[0] += 1; a[1] += t
    print("   gc", tag, {g: (n, round(t*1e3, 2)) for g, (n, t) in sorted(by.items())}, "objects", len(gc.get_objects()))
    gcs.clear()
inner = Runner.step
def step(self, seqs, drain=False):
    t0 = clock(); d0 = clock.t; g0 = sum(t for _, t in gcs); c0 = time.thread_time()
    w = inner(self, seqs, drain)
    for k, v in phase.items(): tot[k] = tot.get(k, 0) + v
    phase.clear()
    if False: print("    step", len(log), "gc ms", round((sum(t for _, t in gcs) - g0)*1e3, 2), "cpu ms", round((time.thread_time()-c0)*1e3,2))
    log.append((len(seqs), clock.t - d0, clock() - t0 - (clock.t - d0), self.stats.step_tokens))
    return w
Runner.step = step
import specctl.runtime.step.runner as RM
from specctl.runtime.step.step import Planner
from specctl.runtime.step.accounting import Accounting
phase = {}
tot = {}
def tw(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        c = time.thread_time()
        try: return f(*a, **k)
        finally: phase[label] = phase.get(label, 0) + time.thread_time() - c
    setattr(obj, name, w)
tw(Planner, "plan", "plan"); tw(Planner, "execute", "execute"); tw(RM, "read", "read"); tw(RM, "verify", "verify")
tw(RM, "commit", "commit"); tw(Runner, "catch_up", "catch_up"); tw(Planner, "prefetch", "prefetch"); tw(Accounting, "step", "acct")
from specctl.speculative.self_draft import SelfDraftDrafter
tw(SelfDraftDrafter, "observe", "sd.observe"); tw(SelfDraftDrafter, "propose", "sd.propose")
cat = {}
def wrap(name):
    f = getattr(Runner, name)
    def w(self, *a, **k):
        t0 = clock(); d0 = clock.t
        try:
            return f(self, *a, **k)
        finally:
            c = cat.setdefault(name, [0.0, 0.0, 0])
            c[0] += clock.t - d0; c[1] += clock() - t0 - (clock.t - d0); c[2] += 1
    setattr(Runner, name, w)
for nm in ("_prefill", "_retire", "_admit", "_reserve"):
    wrap(nm)
def show(tag):
    print("  ", tag, {k: (round(v[0]*1e3,2), round(v[1]*1e3,2), v[2]) for k, v in cat.items()})
    cat.clear()
clock.reset(); gcs.clear()
ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=ENDS)
tar = clock(); arlog = log[:]; log.clear(); show('ar'); gshow('ar')
print("  ar phases CPU ms/step", {k: round(v*1e3/st.steps,3) for k, v in tot.items()}); tot.clear()
print("ar", round(tar*1e3,2), "ms steps", st.steps, "dev", round(sum(x[1] for x in arlog)*1e3,2), "host", round(sum(x[2] for x in arlog)*1e3,2))
drs = T._drafters(m, prompts, ref, methods)
for name, dr in list(drs.items()) * int(sys.argv[4] if len(sys.argv) > 4 else 1):
    dr = dr.fresh(); clock.reset(); log.clear(); gcs.clear()
    got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=ENDS, controller=sim_controller(dr, clock.table))
    assert got == ref
    t = clock(); show(name); gshow(name)
    print("  phases CPU ms/step", {k: round(v*1e3/st.steps,3) for k, v in tot.items()}); tot.clear()
    print(name, "x ar", round(tar/t,3), "ms", round(t*1e3,2), "steps", st.steps, "dev", round(sum(x[1] for x in log)*1e3,2), "host", round(sum(x[2] for x in log)*1e3,2), "outside steps", round((t - sum(x[1]+x[2] for x in log))*1e3,2), "ar outside", round((tar - sum(x[1]+x[2] for x in arlog))*1e3,2))
    prev = 0
    rows = []
    for i,(s,dv,h,tok) in enumerate(log):
        rows.append((i,s,round(dv*1e3,3),round(h*1e3,3),tok-prev)); prev = tok
    big = [r for r in rows if r[4] > r[1]]
    print("  drafting steps (i, seqs, dev ms, host ms, rows):", big[:20], len(big))
    print("  median lean host ms", statistics.median(r[3] for r in rows if r[4] <= r[1]), "ar median host", statistics.median(x[2]*1e3 for x in arlog))
