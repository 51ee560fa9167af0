"""One workload of tests/test_host_clock.py on the host-charged clock, N rounds (ar then each
method, one round each time): ar's clock ms, and each method's x ar, medians over the rounds,
with each method's steps and prefill forwards. Run from a tree (PYTHONPATH=that tree) to
compare commits: the admission rule moves `ar`'s own time too, so its ms are printed.

    python bench-results/2026-11-30-clumps/ab.py BATCH waiting|drain METHODS N
"""
import statistics
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
import sim  # noqa: E402

m, patch = sim.script_model()
b = int(sys.argv[1])
n = 4 * b if sys.argv[2] == "waiting" else b
ms, got = [], {}
real = T.sim_run
times = []


def timed(model, prompts, drafter, clock, **kw):   # (each run's clock: ar's the round's first)
    r = real(model, prompts, drafter, clock, **kw)
    times.append(clock())
    return r


T.sim_run = timed
for _ in range(int(sys.argv[4])):
    times.clear()
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","),
                                              rounds=1)
    ms.append(times[0] * 1e3)
    for k, v in ratios.items():
        got.setdefault(k, []).append((v, stats[k].steps, stats[k].prefill_forwards))
print(f"b{b} {sys.argv[2]}: ar {statistics.median(ms):.1f} ms "
      f"(prefill forwards {ar.prefill_forwards}, steps {ar.steps})")
for k, v in got.items():
    print(f"  {k}: median {statistics.median(x for x, _, _ in v):.3f}x "
          f"[{min(x for x, _, _ in v):.3f}-{max(x for x, _, _ in v):.3f}], "
          f"steps {statistics.median(s for _, s, _ in v)}, "
          f"prefill forwards {statistics.median(p for _, _, p in v)}")
