import sys, os
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.speculative.self_draft import SelfDraftDrafter
from sim import script_model, sim_controller, sim_run
from specctl.runtime.step import admission
if os.environ.get("NOGROUP"):
    admission.Admission.group = lambda self: 1
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
out, _ = sim_run(m, prompts, None, clock, **kw)
for rnd in range(2):
    clock.reset(); _, sa = sim_run(m, prompts, None, clock, **kw); ar = clock()
    d = T._drafters(m, prompts, out, None, b)["self-draft:job"]
    dr = SelfDraftDrafter(d.prm, d.corpus, vocab=m.cfg.vocab_size)
    clock.reset()
    got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table), **kw)
    assert got == out
    print("ar steps", sa.steps, "prefills", sa.prefill_forwards, "| job x ar", round(ar / clock(), 3), "steps", st.steps, "lean", st.lean_steps, "prefills", st.prefill_forwards, "gen", st.generated, sa.generated)
