"""Where a controlled run that drafts a step or two loses to ar on the tests' clock: the
device's and the host's charged ms of ar and of a method under auto (the trace oracle, or a
drafter of test_host_clock._drafters built for batch DB, default BATCH: DB=1 gives Self-Draft's
per-sequence steps at any batch).

    DB=1 PYTHONPATH=$PWD python lean_over.py BATCH waiting|drain ROUNDS [PROF|-] [METHOD]
"""
import sys, cProfile, pstats
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceChains, sim_controller, sim_run, script_model
m, patch = script_model()
b, work, R = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
prof = cProfile.Profile() if len(sys.argv) > 4 and sys.argv[4] != "-" else None
for r in range(R):
    clock.reset()
    ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
    a = (clock(), clock.t, clock.host_s(), st.steps, st.prefill_forwards)
    dr = TraceChains(ref, known) if len(sys.argv) < 6 else T._drafters(m, prompts, ref, [sys.argv[5]], int(__import__("os").environ.get("DB", b)))[sys.argv[5]]
    clock.reset()
    if prof: prof.enable()
    got, st2 = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False,
                       controller=sim_controller(dr, clock.table))
    if prof: prof.disable()
    name = sys.argv[5] if len(sys.argv) > 5 else "trace"
    t = (clock(), clock.t, clock.host_s(), st2.steps, st2.prefill_forwards)
    print(f"b{b} {work} r{r}: ar total {a[0]*1e3:.1f} ms (device {a[1]*1e3:.1f}, host {a[2]*1e3:.1f}; {a[3]} steps, {a[4]} pf) | "
          f"{name} {t[0]*1e3:.1f} (device {t[1]*1e3:.1f}, host {t[2]*1e3:.1f}; {t[3]} steps, {t[4]} pf, drafting {st2.controlled_steps - st2.lean_steps}) x{a[0]/t[0]:.3f}", flush=True)
if prof:
    prof.dump_stats(sys.argv[4])
