"""arnoise.py BATCH waiting|drain ROUNDS: `ar` alone on the tests' host-charged clock, ROUNDS
runs of one workload (test_host_clock.workload): each run's clock, device and host ms. How
much the host's charge moves between runs of the same work. From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-11-30-graph-staging/arnoise.py 64 waiting 5"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model, sim_run  # noqa: E402
m, patch = script_model()
b, work, R = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
for _ in range(R):
    clock.reset()
    out, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
    print(f"total {clock() * 1e3:8.1f} ms  device {clock.t * 1e3:8.1f}  host "
          f"{clock.host_s() * 1e3:7.1f}  steps {st.steps}", flush=True)
