"""Real text's acceptance (the traces) drafted two ways on the host-charged clock
(tests/sim.py: the H200's demo-shape step and prefill tables, the host charged at HOST x
this CPU's time): TraceChains (a chain of up to 8 drafts a sequence, built in Python per
sequence: a stand-in's host work, not the product's) and TraceGrid (the product's grid step,
its plan, verification, commit and learning charged, the candidates replaying the traces).
Each round runs ar, then each drafter under auto; prints each one's least time over the
rounds as x ar (as test_host_clock.host_charged_ratios), and every round's.

    PYTHONPATH=$PWD python bench-results/2026-12-01-trace-grid/ratios.py BATCH waiting|drain ROUNDS [DRAFTERS]
DRAFTERS: comma list of trace, trace-grid and test_host_clock._drafters' names (default:
trace,trace-grid). HOSTX=h: the host charged at h x this CPU's (default: tests/sim.py's HOST).
"""
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import TraceChains, TraceGrid, script_model, sim_controller, sim_run  # noqa: E402

HOSTX = float(__import__("os").environ.get("HOSTX", "-1"))
if HOSTX >= 0:
    T.HOST = HOSTX
m, patch = script_model()
b, work, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
names = sys.argv[4].split(",") if len(sys.argv) > 4 else ["trace", "trace-grid"]
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
times, stats, ref, drafters = {}, {}, None, None
for _ in range(rounds):
    kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
    clock.reset()
    out, _ = sim_run(m, prompts, None, clock, **kw)
    times.setdefault("ar", []).append(clock())
    if ref is None:
        ref = out
        drafters = {"trace": TraceChains(ref, known),
                    "trace-grid": TraceGrid(ref, known, m.cfg.vocab_size, clock)}
        drafters.update(T._drafters(m, prompts, ref, None, b))
        drafters = {k: drafters[k] for k in names}
    assert out == ref
    for name, dr in drafters.items():
        dr = dr.fresh()
        clock.reset()
        got, stats[name] = sim_run(m, prompts, dr, clock,
                                   controller=sim_controller(dr, clock.table), **kw)
        assert got == ref, name
        times.setdefault(name, []).append(clock())
ar = min(times["ar"])
for name in drafters:
    st = stats[name]
    print(f"b{b} {work}: {name} {ar / min(times[name]):.3f}x ar (rounds "
          f"{[round(a / t, 3) for a, t in zip(times['ar'], times[name])]}), "
          f"{st.steps} steps, trips {st.guard_trips}, accepted {sum(k * v for k, v in st.accept_hist.items())}")
