import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.step import admission as A
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
orig = A.Admission.hold
log = []
def hold(self, free, waiting, soon, chunk):
    r = orig(self, free, waiting, soon, chunk)
    log.append((id(self), free, waiting, soon(), self.group(), round(self._fixed or 0, 2), round(self.step_ms or 0, 2), round(self.freed, 2), r))
    return r
A.Admission.hold = hold
ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[2].split(","), rounds=1)
print(ratios)
ids = []
for r in log:
    if r[0] not in ids: ids.append(r[0])
for i in ids:
    print("run", ids.index(i))
    for r in log:
        if r[0] == i: print("  free %d wait %d soon %d group %d F %.2f step %.2f freed %.2f hold %s" % r[1:])
