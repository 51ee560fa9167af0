"""self-draft:job (per-sequence Self-Draft with the job cache) vs ar at b32 waiting on the
host-charged clock: where the time goes (RunStats), and with drafting off (lean only)."""
import sys, time
sys.path.insert(0, "tests")
from specctl.speculative.self_draft import SelfDraftDrafter
import test_host_clock as T
from sim import script_model, sim_controller, sim_run

model, patch = script_model()
batch = int(sys.argv[1]); names = sys.argv[2].split(",")
known, prompts, lens, clock = T.workload(model, batch, 4 * batch, patch)
ref, _ = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens, ends_known=False)
drs = T._drafters(model, prompts, ref, None, batch)
F = ("steps", "lean_steps", "prefill_s", "step_s", "searches", "search_ms", "learn_s", "guard_trips", "job_excess_ms")
def show(name, st, t):
    print(f"{name:22s} total {t:.4f} outside {t - st.prefill_s - st.step_s:.4f} " + " ".join(
        f"{f}={getattr(st, f):.4g}" if isinstance(getattr(st, f), float) else f"{f}={getattr(st, f)}" for f in F))
for rnd in range(3):
    clock.reset()
    _, st = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens, ends_known=False)
    ar = clock(); show("ar", st, ar)
    for name in names:
        for lean in (False, True):
            d = drs[name]
            dr = SelfDraftDrafter(d.prm, d.corpus, vocab=model.cfg.vocab_size)
            ctl = sim_controller(dr, clock.table)
            if lean:
                ctl.lean_until = 10 ** 9
            clock.reset()
            got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=lens,
                              ends_known=False, controller=ctl)
            assert got == ref
            show(f"{name}{' lean' if lean else ''} x{ar / clock():.3f}", st, clock())
