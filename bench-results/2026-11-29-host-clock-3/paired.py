"""One workload of tests/test_host_clock.py on the host-charged clock, N separate rounds (ar
then each method, one round each time): each method's median and best x ar over the rounds,
and its median steps. The least-of-rounds of host_clock.py picks one lucky round; on a busy
2-core machine a single round's ratio moves by up to ~10% (the host's charge is thread CPU
time, which a neighbour on the same core inflates), so a change is judged by medians, run
before and after in the same window.

    python bench-results/2026-11-29-host-clock-3/paired.py BATCH waiting|drain METHODS N
    # another commit, from its worktree:  PYTHONPATH=$PWD python .../paired.py ...
"""
import statistics
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402

m, patch = script_model()
b = int(sys.argv[1])
n = 4 * b if sys.argv[2] == "waiting" else b
got = {}
for _ in range(int(sys.argv[4])):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","),
                                              rounds=1)
    for k, v in ratios.items():
        if k != "ar":
            got.setdefault(k, []).append((v, stats[k].steps))
for k, v in got.items():
    xs = sorted(x for x, _ in v)
    print(f"{k}: median {statistics.median(xs):.3f}x, best {xs[-1]:.3f}x, "
          f"median steps {statistics.median(s for _, s in v)}")
