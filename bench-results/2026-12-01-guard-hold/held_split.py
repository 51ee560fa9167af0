"""At b64 with requests waiting (tests/test_host_clock.py's workload, the trace and Kangaroo under
auto): the accounting calls whose steps held slots free for a grouped admission, and the
excess the job account was told for them (Accounting._held), against searches made in vain.
    python bench-results/2026-12-01-guard-hold/held_split.py"""
import sys, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.step import accounting as A
seen = collections.Counter(); sums = collections.Counter()
orig = A.Accounting.step
def step(self, plan, out, seqs, had, drain, times, *a, **k):
    t0, t1, t2, end, ahead, new, held = times
    searched = plan.search_ms if not plan.lean or True else 0
    if held:
        seen["held steps"] += 1; sums["held excess ms"] += self._held(len(plan.seqs), held)
    if plan.lean and plan.search_ms:
        seen["lean steps with search"] += 1; sums["search ms"] += plan.search_ms
    seen["steps"] += 1
    return orig(self, plan, out, seqs, had, drain, times, *a, **k)
A.Accounting.step = step
m, patch = script_model()
r, st, _ = T.host_charged_ratios(m, 64, 256, patch, methods=["kangaroo"], rounds=1)
print(r, dict(seen), {k: round(v, 1) for k, v in sums.items()}, "trips", st["kangaroo"].guard_trips, st["kangaroo"].guard_job_trips, "excess", round(st["kangaroo"].job_excess_ms, 1))
