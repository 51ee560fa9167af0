# The guard's events in N rounds of one workload of tests/test_host_clock.py: each drafting step's ms against ar's for
# its progress and the balance before/after, each job-account entry (excess, ms, steps, balance, step ms), the trips.
#   python bench-results/2026-11-29-drains/guard_events.py BATCH waiting|drain METHOD N
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control.guard import Guard
ev = []
od, oj = Guard.drafted, Guard.job
def drafted(self, ms, ar_ms):
    b0 = self.balance; t0 = self.trips
    od(self, ms, ar_ms)
    ev.append(("d", round(ms, 3), None if ar_ms is None else round(ar_ms, 3), round(b0, 2), round(self.balance, 2), "TRIP" if self.trips > t0 else ""))
def job(self, excess, ms, steps=1):
    b0 = self.job_balance; t0 = self.trips
    oj(self, excess, ms, steps)
    if excess or self.trips > t0:
        ev.append(("j", round(excess, 3), round(ms, 3), steps, round(b0, 2), round(self.job_balance, 2), round(self.step_ms, 3), "TRIP" if self.trips > t0 else ""))
Guard.drafted, Guard.job = drafted, job
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
for r in range(int(sys.argv[4])):
    ev.clear()
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=[] if sys.argv[3] == "trace" else [sys.argv[3]], rounds=1)
    st = stats[sys.argv[3]]
    print("ROUND", r, round(ratios[sys.argv[3]], 3), st.steps, "trips", st.guard_trips)
    trip = [i for i, e in enumerate(ev) if e[-1] == "TRIP"]
    for e in ev[:max(trip[-1] + 3, 12) if trip else 12]:
        print("  ", e)
