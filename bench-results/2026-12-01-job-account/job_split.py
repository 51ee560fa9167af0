"""One run of one workload of tests/test_host_clock.py: the job account's excess by source (the
held slots' charge, Accounting._held, in all; the drafting steps' excess, their held slots'
included), its trips, and the 12 job-account entries before each trip (excess, ms, steps,
balance before, step ms, hold).
    python bench-results/2026-12-01-job-account/job_split.py BATCH waiting|drain METHOD"""
import sys, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control import guard as G
from specctl.runtime.step import accounting as A
src = collections.Counter(); cnt = collections.Counter()
tag = [None]
orig_held = A.Accounting._held
def held(self, n, h):
    v = orig_held(self, n, h); src["held"] += v; cnt["held"] += bool(h); return v
A.Accounting._held = held
orig_job = G.Guard.job
log = []
def job(self, excess, ms, steps=1):
    log.append((excess, ms, steps, self.job_balance, self.step_ms, self.hold))
    if steps == 1 and excess: src["drafting(+held)"] += excess
    r = orig_job(self, excess, ms, steps)
    if self.hold and not log[-1][5]: log.append(("TRIP",))
    return r
G.Guard.job = job
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
meth = sys.argv[3]
r, st, _ = T.host_charged_ratios(m, b, n, patch, methods=[meth], rounds=1)
s = st[meth]
print({k: round(v, 3) for k, v in r.items()}, "trips", s.guard_trips, "job", s.guard_job_trips, "held", s.guard_held, "excess", round(s.job_excess_ms, 1))
print({k: round(v, 2) for k, v in src.items()}, dict(cnt))
# around trips
for i, e in enumerate(log):
    if e[0] == "TRIP":
        for x in log[max(0, i - 12):i]:
            print("  ", tuple(round(v, 3) if isinstance(v, float) else v for v in x))
        print("  TRIP")
