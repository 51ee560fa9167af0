# Each drafting step a METHOD run on the host-charged clock learns (tests/test_host_clock.py's workload of N prompts at
# batch B): its budgets, drafts, accepted, predicted and measured ms, host ms and host_fit.
#   python bench-results/2026-11-29-forward-host/first_steps.py B METHOD N
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control.controller import Controller
from specctl.runtime.step.step import Planner
m, patch = script_model()
b = int(sys.argv[1]); meth = sys.argv[2]; n = int(sys.argv[3])
names = {}
op = Planner.plan
def plan(self, seqs, drain=False, clock=None):
    p = op(self, seqs, drain, clock)
    names[id(self.controller)] = self.drafter.name
    return p
Planner.plan = plan
oo = Controller.observe
def observe(self, keys, b, proposals, verdicts, measured_ms, host_ms=None):
    if names.get(id(self)) == meth:
        print("   obs step", self.steps, "ks", b.ks[:4], "drafting", sum(k > 0 for k in b.ks), "drafts", sum(len(p.draft) for p in proposals), "acc", sum(len(v.accepted) for v in verdicts), "pred", round(b.predicted_ms, 2), "measured", None if measured_ms is None else round(measured_ms, 2), "host", None if host_ms is None else round(host_ms, 3), "fit", [round(float(x), 3) for x in self.cost.host_fit()])
    return oo(self, keys, b, proposals, verdicts, measured_ms, host_ms)
Controller.observe = observe
ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=[meth], rounds=1)
print(ratios)
