# What Self-Draft would gain on the host-charged clock (tests/test_host_clock.py, requests waiting) if a drafting
# step's own host work (its proposals and their layout, verify, commit, observe) cost FRAC of what it costs here:
# the rest of that work's CPU time is counted as the device's (not charged). ar is run as it is.
#   python bench-results/2026-11-29-drafting-host/whatif.py BATCH FRAC
import sys, time
sys.path.insert(0, "tests")
import test_host_clock as T
import sim
from sim import script_model
import specctl.runtime.step.runner as RM
from specctl.runtime.step.step import Planner
from specctl.speculative.self_draft import SelfDraftDrafter
FRAC = float(sys.argv[2])
m, patch = script_model()
clocks = []
oc = sim.SimClock.__init__
def init(self, *a, **k):
    oc(self, *a, **k); clocks.append(self)
sim.SimClock.__init__ = init
ON = [False]   # (Self-Draft's run only: ar's and the trace's verify and commit are charged in full)
orun = RM.Runner.run
def run(self, *a, **k):
    ON[0] = self.drafter.name == "self-draft"
    try: return orun(self, *a, **k)
    finally: ON[0] = False
RM.Runner.run = run
def credit(obj, name):
    f = getattr(obj, name)
    def w(*a, **k):
        if not ON[0]:
            return f(*a, **k)
        c = time.thread_time(); i0 = clocks[-1].inside
        try: return f(*a, **k)
        finally:
            own = time.thread_time() - c - (clocks[-1].inside - i0)
            clocks[-1].inside += (1 - FRAC) * own
    setattr(obj, name, w)
for o, n in [(SelfDraftDrafter, "propose"), (Planner, "_planned"), (RM, "verify"), (RM, "commit"), (SelfDraftDrafter, "observe")]:
    credit(o, n)
b = int(sys.argv[1])
ratios, stats, ar = T.host_charged_ratios(m, b, 4 * b, patch, methods=["self-draft"], rounds=1)
st = stats["self-draft"]
print("frac", FRAC, "b", b, {k: round(v, 3) for k, v in ratios.items()}, "steps", st.steps,
      "drafting seq-steps", sum(v for k, v in st.budget_hist.items() if k),
      "accepted", sum(k * v for k, v in st.accept_hist.items()), "prefill forwards", st.prefill_forwards)
