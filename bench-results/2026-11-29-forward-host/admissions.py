# Kangaroo at b32 with requests waiting on the host-charged clock: each prefill call (the step it came before,
# its prompts) and the first 12 steps (step, sequences, packed tokens so far, step ms so far).
#   python bench-results/2026-11-29-forward-host/admissions.py
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.step.runner import Runner
m, patch = script_model()
ev = []
op = Runner._prefill
def _prefill(self, seqs, under=None):
    if self.drafter.name == "kangaroo":
        ev.append((self.stats.steps, len(seqs)))
    return op(self, seqs, under)
Runner._prefill = _prefill
ost = Runner.step
def step(self, seqs, drain=False):
    w = ost(self, seqs, drain)
    if self.drafter.name == "kangaroo" and self.stats.steps <= 12:
        b = self.controller.last if hasattr(self.controller, "last") else None
        ev.append(("step", self.stats.steps, len(seqs), self.stats.step_tokens, round(self.stats.step_s * 1e3, 2)))
    return w
Runner.step = step
ratios, stats, ar = T.host_charged_ratios(m, 32, 128, patch, methods=["kangaroo"], rounds=1)
print(round(ratios["kangaroo"], 3), ev)
