"""Prefill eager against prefill in pieces on the host-charged clock (tests/sim.py: the H200's
demo-shape step and prefill tables, the host charged at HOST x this CPU's time), prompts as
long as ShareGPT's in the demo's template, CUDA's prefill chunk (4096), requests waiting:
each round runs ar and every method eagerly, then in pieces (sim_run's pieces: piece_price
from the same tables). Prints each mode's job ms (medians over the rounds) and x ar.

    PYTHONPATH=$PWD python bench-results/2026-12-01-prefill-pieces/predict_pieces.py BATCH PROMPTS ROUNDS [METHODS]
"""
import statistics
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import TraceChains, script_model, sim_controller, sim_run  # noqa: E402

m, patch = script_model()
b, n, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
methods = sys.argv[4].split(",") if len(sys.argv) > 4 else None
known, prompts, lens, clock = T.workload(m, b, n, patch, real_lengths=True)
times, forwards, ref, drafters = {}, {}, None, None
for _ in range(rounds):
    for pieces in (False, True):
        kw = dict(batch_size=b, max_tokens=lens, ends_known=False, pieces=pieces,
                  prefill_chunk=4096)
        clock.reset()
        out, st = sim_run(m, prompts, None, clock, **kw)
        times.setdefault(("ar", pieces), []).append(clock())
        forwards[("ar", pieces)] = (st.prefill_forwards, st.prefill_s)
        if ref is None:
            ref = out
            drafters = {"trace": TraceChains(ref, known)}
            drafters.update(T._drafters(m, prompts, ref, methods, b))
        assert out == ref
        for name, dr in drafters.items():
            dr = dr.fresh()
            clock.reset()
            got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table),
                              **kw)
            assert got == ref, name
            times.setdefault((name, pieces), []).append(clock())
            forwards[(name, pieces)] = (st.prefill_forwards, st.prefill_s)
med = {k: statistics.median(v) for k, v in times.items()}
print(f"b{b}, {n} prompts waiting, {rounds} rounds (medians), job ms and x ar:")
print("| method | eager job ms | x ar | pieces job ms | x ar | prefill forwards eager / pieces |")
print("|---|---|---|---|---|---|")
for name in ["ar"] + list(drafters):
    e, p = med[(name, False)], med[(name, True)]
    print(f"| {name} | {e * 1e3:.1f} | {med[('ar', False)] / e:.3f} | {p * 1e3:.1f} | "
          f"{med[('ar', True)] / p:.3f} | {forwards[(name, False)][0]} / "
          f"{forwards[(name, True)][0]} |")
print(f"ar's job, eager over pieces: {med[('ar', False)] / med[('ar', True)]:.3f}x "
      f"(rounds: {[round(x / y, 3) for x, y in zip(times[('ar', False)], times[('ar', True)])]})")
