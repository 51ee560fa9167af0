"""ar and METHOD at 4096 tokens a prefill forward on the demo clock, each run's split: steps,
lean and drafting, their ms, prefill, search, learning, guard trips, budgets and accepted drafts.

    python bench-results/2026-11-30-prefill-chunk/split_clock.py BATCH PROMPTS METHOD
"""
import os
import sys
# (chunk_clock.py's set-up, then one pair at 4096 with the run's split)
__file__ = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "chunk_clock.py")
exec(open(__file__).read().split("Runner = sim.Runner")[0])
Runner = sim.Runner
sim.Runner = lambda *a, **kw: Runner(*a, prefill_chunk=4096, **kw)
for label, dr in (("ar", None), (METHOD, base.fresh())):
    clock.reset()
    got, st = sim_run(model, prompts, dr, clock, batch_size=b, max_tokens=lens,
                      controller=sim_controller(dr, clock.table) if dr else None)
    cs = st.controlled_steps - st.lean_steps
    print(f"{label:12s} {clock()*1e3:.1f} ms steps {st.steps} lean {st.lean_steps} drafting {cs} step_s {st.step_s*1e3:.1f} "
          f"lean_ms {st.lean_step_ms/max(1,st.lean_steps):.2f} draft_ms {(st.measured_step_ms-st.lean_step_ms)/max(1,cs):.2f} "
          f"prefill {st.prefill_forwards} {st.prefill_s*1e3:.1f} search {st.search_ms:.1f} learn {st.learn_s*1e3:.1f} trips {st.guard_trips} "
          f"budgets {dict(sorted(st.budget_hist.items())) if st.budget_hist else None} acc {dict(sorted(st.accept_hist.items()))}")
