"""Self-Draft with --job-cache at batch 32/64 with requests waiting, on the host-charged clock:
the per-sequence path (the default before this change), on the grid with the job cache's
arrays (the default now), and the grid without a job cache, each against ar in the same round
(x ar per single run; RunStats: drafting steps, prefill, searches; the job cache's share of
the accepted drafts). python paths.py BATCH ROUNDS"""
import sys
from dataclasses import replace
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.speculative.self_draft import SelfDraftDrafter
from sim import script_model, sim_controller, sim_run

model, patch = script_model()
batch, rounds = int(sys.argv[1]), int(sys.argv[2])
known, prompts, lens, clock = T.workload(model, batch, 4 * batch, patch)
kw = dict(batch_size=batch, max_tokens=lens, ends_known=False)
ref, _ = sim_run(model, prompts, None, clock, **kw)
base = T._drafters(model, prompts, ref, None, batch)["self-draft:job"].prm
paths = {"job per-sequence": replace(base, grid=False), "job grid": replace(base, grid=True),
         "grid no job": replace(base, grid=True, job_cache=False)}
for rnd in range(rounds):
    clock.reset()
    sim_run(model, prompts, None, clock, **kw)
    ar = clock()
    line = []
    for name, prm in paths.items():
        dr = SelfDraftDrafter(prm, None, vocab=model.cfg.vocab_size)
        clock.reset()
        got, st = sim_run(model, prompts, dr, clock, controller=sim_controller(dr, clock.table),
                          **kw)
        assert got == ref, name
        line.append(f"{name} {ar / clock():.3f} (drafting {st.steps - st.lean_steps}, "
                    f"prefill {st.prefill_s * 1e3:.0f} ms, searches {st.searches}, "
                    f"job {dr.accepted_from['job']}/{sum(dr.accepted_from.values())})")
    print(f"b{batch} round {rnd}: ar {ar * 1e3:.0f} ms | " + " | ".join(line), flush=True)
