import sys, pathlib, tempfile, os
sys.path.insert(0, "tests")
import test_host_clock as T
from tiny import make_tiny_model
from specctl.engine.loader import load_model
from specctl.speculative.self_draft import SelfDraftDrafter
from sim import sim_controller, sim_run
from specctl.runtime.step.runner import Runner
from specctl.runtime.step import admission
class MP:
    def setattr(self, obj, name, val, raising=True): setattr(obj, name, val)
if os.environ.get("NOGROUP"):
    admission.Admission.group = lambda self: 1
m = load_model(make_tiny_model(pathlib.Path(tempfile.mkdtemp()), "llama"), "cpu", "fp32")
b = int(sys.argv[1]); n = 4 * b
known, prompts, lens, clock = T.workload(m, b, n, MP())
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
occ = []
step = Runner.step
def counted(self, *a, **k):
    r = step(self, *a, **k)
    return r
out, _ = sim_run(m, prompts, None, clock, **kw)
for rnd in range(2):
    clock.reset(); _, sa = sim_run(m, prompts, None, clock, **kw); ar = clock()
    d = T._drafters(m, prompts, out, None, b)["self-draft:job"]
    dr = SelfDraftDrafter(d.prm, d.corpus, vocab=m.cfg.vocab_size)
    clock.reset()
    got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table), **kw)
    assert got == out
    print("ar steps", sa.steps, "prefills", sa.prefill_forwards, "| job x ar", round(ar / clock(), 3), "steps", st.steps, "lean", st.lean_steps, "prefills", st.prefill_forwards, "gen", st.generated, sa.generated)
