import sys
sys.path.insert(0, "tests")
import numpy as np
import test_host_clock as T
from specctl.speculative.self_draft import SelfDraftDrafter
from sim import script_model, sim_controller, sim_run
from specctl.runtime.control import controller as Cm
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b; name = sys.argv[2] if len(sys.argv) > 2 else "self-draft:job"
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
out, _ = sim_run(m, prompts, None, clock, **kw)
clock.reset(); sim_run(m, prompts, None, clock, **kw); ar = clock()
ob = Cm.Controller.observe
def observe(self, keys, bud, props, verdicts, ms, host=None):
    r = ob(self, keys, bud, props, verdicts, ms, host)
    acc = sum(len(v.accepted) for v in verdicts)
    exp = float(bud.gains[np.arange(len(bud.ks)), list(bud.ks)].sum() - bud.gains[:, 0].sum())
    arm = self.ar_ms(len(keys))
    pg = (len(keys) + exp) / bud.predicted_ms / (len(keys) / arm)
    rg = (len(keys) + acc) / ms / (len(keys) / arm) if ms else float('nan')
    print(f"t {clock()*1e3:6.1f} b {len(keys):3d} top {max(bud.ks)} pred {bud.predicted_ms:5.2f} ms {ms and round(ms, 2)} ar {arm:.2f} exp {exp:5.1f} acc {acc:3d} pred-x {pg:.2f} real-x {rg:.2f} expl {bud.explored}")
    return r
Cm.Controller.observe = observe
d = T._drafters(m, prompts, out, None, b)[name]
dr = SelfDraftDrafter(d.prm, d.corpus, vocab=m.cfg.vocab_size)
clock.reset()
got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table), **kw)
assert got == out
print("x ar", round(ar / clock(), 3), "steps", st.steps, st.lean_steps, "trips", st.guard_trips, "held", st.guard_held, "searches", st.searches)
