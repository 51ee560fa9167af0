import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control import guard as G
log = []
orig_trip, orig_job, orig_dr = G.Guard._trip, G.Guard.job, G.Guard.drafted
def _trip(self):
    log.append(("step-trip", id(self) % 1000, self.n, round(self.balance, 2), self.hist[:self.n]))
    return orig_trip(self)
def drafted(self, ms, ar_ms):
    self.n = getattr(self, "n", 0) + 1
    self.hist = getattr(self, "hist", []) + [(round(ms, 2), None if ar_ms is None else round(ar_ms, 2))]
    return orig_dr(self, ms, ar_ms)
def job(self, excess, ms, steps=1):
    t = self.job_trips
    r = orig_job(self, excess, ms, steps)
    if self.job_trips > t:
        log.append(("job-trip", id(self) % 1000, getattr(self, "n", 0)))
    return r
G.Guard._trip, G.Guard.drafted, G.Guard.job = _trip, drafted, job
m, patch = script_model()
for r in range(6):
    log.clear()
    seen = []
    orig_init = G.Guard.__init__
    ratios, stats, ar = T.host_charged_ratios(m, 1, 4, patch, methods=["kangaroo"], rounds=1)
    print(f"x{ratios['trace']:.3f}", log[-4:])
