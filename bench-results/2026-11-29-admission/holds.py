# Every hold the admission made in one waiting run (step, free, waiting, group, soon, F, step ms, by the rate rule).
#   python bench-results/2026-11-29-admission/holds.py BATCH METHOD
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.step.admission import Admission
log = []
orig = Admission.hold
def hold(self, free, waiting, soon, chunk):
    r = orig(self, free, waiting, soon, chunk)
    g = self.group()
    if r: log.append((self.steps, free, waiting, g, soon(), round(self._fixed or 0, 1), round(self.step_ms or 0, 2), free < min(g, waiting)))
    return r
Admission.hold = hold
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=[sys.argv[2]], rounds=1)
st = stats[sys.argv[2]]
print(ratios[sys.argv[2]], st.steps, st.prefill_forwards)
print("steps, free, waiting, group, soon, F, step_ms, by-rate")
for x in log: print(x)
