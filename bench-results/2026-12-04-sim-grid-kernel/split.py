"""A grid step's host on the host-charged clock against ar's and auto's lean steps: per kind of
step, its clock ms, this CPU's time outside the forwards (of it, under the forward: the last
step's learning and the next search) and what the clock hid under the forward (x host).
GUARD=off runs the controller without its guard (what the controller alone decides).

    GUARD=off HOSTX=3 PYTHONPATH=$PWD python bench-results/2026-12-04-sim-grid-kernel/split.py 8 waiting 1 trace-grid
"""
import sys, os, collections, time
sys.path.insert(0, "tests")
import sim
import numpy as np
import specctl.runtime.step.stepping as st, specctl.runtime.step.step as stm
orig = sim.sim_controller
def sc(dr, table, **kw):
    if os.environ.get("GUARD") == "off": kw["guard"] = False
    return orig(dr, table, **kw)
sim.sim_controller = sc
last, clk, acc = {}, {}, collections.defaultdict(list)
op = stm.Planner.plan
def plan(self, seqs, drain=False, clock=None):
    p = op(self, seqs, drain, clock); last["p"] = p; return p
stm.Planner.plan = plan
oc = sim.SimClock.__init__
def init(self, *a, **k):
    oc(self, *a, **k); clk["c"] = self
sim.SimClock.__init__ = init
ouf = st.Stepping.under_forward
def uf(self, *a, **k):
    t = time.thread_time(); i = clk["c"].inside
    try: return ouf(self, *a, **k)
    finally: last["uf"] = time.thread_time() - t - (clk["c"].inside - i)
st.Stepping.under_forward = uf
ost = st.Stepping.step
def step(self, seqs, drain=False):
    c = clk["c"]; t = c(); h0 = time.thread_time() - c.inside; hid0 = c.hidden; last["uf"] = 0
    r = ost(self, seqs, drain)
    p = last["p"]
    kind = ("ar" if self.controller is None else "lean") if p.lean else ("grid" if p.grid is not None else "draft")
    acc[kind].append(((c() - t) * 1e3, (time.thread_time() - c.inside - h0) * 1e3, (c.hidden - hid0) * 1e3, last["uf"] * 1e3))
    return r
st.Stepping.step = step
import runpy
runpy.run_path("bench-results/2026-12-01-trace-grid/ratios.py", run_name="__main__")
for k in sorted(acc):
    v = np.array(acc[k]); print(k, len(v), "step ms %.2f | cpu %.3f (under fwd %.3f) hidden(x host) %.3f" % (v[:,0].mean(), v[:,1].mean(), v[:,3].mean(), v[:,2].mean()))
