"""Where a run's host time goes on the critical path of the host-charged clock: each part's
thread CPU time outside Runner.under_forward (what runs while a forward does is not the
step loop's wait; Controller.warm, before the run, neither), ar then each method. Parts are
inclusive and nest (`step` holds the rest and the forward's own CPU, which is not charged).

    python bench-results/2026-11-29-host-clock-3/critical.py BATCH waiting|drain METHODS
"""
import collections
import sys
import time

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from helpers import method_drafters  # noqa: E402
from sim import (HOST, SimClock, TraceChains, h200_fused_table, prefill_table,  # noqa: E402
                 script_model, sim_controller, sim_run, timed_model, trace_lengths,
                 traces)
from specctl.runtime.control.controller import Controller  # noqa: E402
from specctl.runtime.step import runner as R, step as S  # noqa: E402
from specctl.runtime.step.accounting import Accounting  # noqa: E402

acc, cnt, under = collections.Counter(), collections.Counter(), [0]


def wrap(obj, name, tag, hides=False):
    fn = getattr(obj, name)

    def w(*a, **k):
        t = time.thread_time()
        under[0] += hides
        try:
            return fn(*a, **k)
        finally:
            under[0] -= hides
            if not under[0] or hides:
                acc[tag] += time.thread_time() - t
                cnt[tag] += 1
    setattr(obj, name, w)


wrap(R.Runner, "under_forward", "(under the forward)", hides=True)
wrap(Controller, "warm", "(warm, before the run)", hides=True)
for obj, name in ((Controller, "plan_lean"), (Controller, "decide"), (Controller, "_search"),
                  (S.Planner, "_planned"), (S.Planner, "_lean"), (S.Planner, "plan"),
                  (R, "commit"), (R.Runner, "_retire"), (R.Runner, "_admit"),
                  (R.Runner, "step"), (R.Runner, "catch_up"), (Accounting, "step"),
                  (Accounting, "flush"), (Controller, "observe")):
    wrap(obj, name, name)
m, patch = script_model()
b = int(sys.argv[1])
n = 4 * b if sys.argv[2] == "waiting" else b
known, prompts = traces(), T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)


def show(tag, st):
    print(f"{tag}: {st.steps} steps, host charged {clock.host_s() * 1e3:.2f} ms, hidden "
          f"{clock.hidden * 1e3:.2f};", ", ".join(f"{k} {v * 1e3:.2f} ms/{cnt[k]}"
                                                  for k, v in sorted(acc.items())))


acc.clear(), cnt.clear(), clock.reset()
out, ar = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens)
show("ar", ar)
drs = {"trace": TraceChains(out, known)}
drs.update(method_drafters(m, prompts, out))
for name in sys.argv[3].split(","):
    dr = drs[name].fresh()
    for part in ("propose", "observe"):
        wrap(dr, part, "drafter." + part)
    acc.clear(), cnt.clear(), clock.reset()
    got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens,
                      controller=sim_controller(dr, clock.table))
    assert got == out
    show(name, st)
