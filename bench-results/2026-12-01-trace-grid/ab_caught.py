"""A/B of the accounting's learning overrun (a lean step's ms less what the last step's
learning, caught up under its forward, took past the forward's table price): "new" as on
main, "old" with the overrun left in the lean step's ms (times' caught read as 0). Each
round runs ar, then each drafter new and old, alternated, on the host-charged clock
(tests/sim.py); prints each variant's median and least x ar over the rounds.

    PYTHONPATH=$PWD python bench-results/2026-12-01-trace-grid/ab_caught.py BATCH waiting|drain ROUNDS [DRAFTERS]
DRAFTERS: comma list of trace, trace-grid, and test_host_clock._drafters' names (self-draft, ...)
"""
import statistics
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import TraceChains, TraceGrid, script_model, sim_controller, sim_run  # noqa: E402
from specctl.runtime.step.accounting import Accounting  # noqa: E402

m, patch = script_model()
b, work, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
names = sys.argv[4].split(",") if len(sys.argv) > 4 else ["trace", "trace-grid"]
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
step, old = Accounting.step, [False]


def accounted(self, plan, out, seqs, had, drain, times, later=False):
    if old[0]:
        times = times[:7] + (0.0,)
    return step(self, plan, out, seqs, had, drain, times, later)


patch.setattr(Accounting, "step", accounted)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
times, ref, drafters = {}, None, None
for r in range(rounds):
    clock.reset()
    out, _ = sim_run(m, prompts, None, clock, **kw)
    times.setdefault("ar", []).append(clock())
    if ref is None:
        ref = out
        drafters = {"trace": TraceChains(ref, known),
                    "trace-grid": TraceGrid(ref, known, m.cfg.vocab_size, clock)}
        drafters.update(T._drafters(m, prompts, ref, None, b))
        drafters = {k: drafters[k] for k in names}
    for name, dr in drafters.items():
        for variant in (("new", "old") if r % 2 == 0 else ("old", "new")):
            old[0] = variant == "old"
            clock.reset()
            got, _ = sim_run(m, prompts, dr.fresh(), clock,
                             controller=sim_controller(dr, clock.table), **kw)
            assert got == ref, name
            times.setdefault((name, variant), []).append(clock())
ar = times["ar"]
for name in drafters:
    for variant in ("old", "new"):
        t = times[(name, variant)]
        print(f"b{b} {work} {name} {variant}: median {statistics.median(a / x for a, x in zip(ar, t)):.3f}"
              f" least {min(ar) / min(t):.3f} x ar (rounds {[round(a / x, 3) for a, x in zip(ar, t)]})")
