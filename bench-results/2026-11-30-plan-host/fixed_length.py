"""Answers of one fixed length (ar's ends clump), the tests' toy prompts on the tests' clock
(host x HOST): Self-Draft as helpers.method_drafters makes it (the job cache on, the oracle
corpus) and draft-verify, against ar. Three workloads (seed, batch, requests, tokens).

    python bench-results/2026-11-30-plan-host/fixed_length.py [HOST]
"""
import sys

sys.path.insert(0, "tests")
from helpers import method_drafters  # noqa: E402
from sim import (SimClock, h200_fused_table, prefill_table, script_model,  # noqa: E402
                 sim_controller, sim_run, timed_model)
import test_host_clock as T  # noqa: E402

m, patch = script_model()
host = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
for seed, b, nprom, mt in [(3, 8, 24, 32), (5, 8, 32, 48), (7, 16, 64, 32)]:
    prompts = T._prompts(nprom, seed=seed)
    clock = SimClock(h200_fused_table(), b, prefill=prefill_table(), host=host)
    timed_model(m, clock, patch)
    ref, ar = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=mt)
    t_ar = clock()
    for name in ("self-draft", "draft-verify"):
        dr = method_drafters(m, prompts, ref)[name].fresh()
        ctl = sim_controller(dr, clock.table)
        clock.reset()
        got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=mt, controller=ctl)
        assert got == ref
        print(f"seed {seed} b{b} {nprom}x{mt} {name}: {t_ar / clock():.3f}x ar, {st.steps} steps "
              f"(ar {ar.steps}), drafting {st.controlled_steps - st.lean_steps}, guard trips "
              f"{st.guard_trips}, prefill forwards {st.prefill_forwards} "
              f"(ar {ar.prefill_forwards})", flush=True)
