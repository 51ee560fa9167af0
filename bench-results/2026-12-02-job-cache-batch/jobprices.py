import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.speculative.self_draft import SelfDraftDrafter
from sim import script_model, sim_controller, sim_run
from specctl.runtime.control import controller as Cm
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
out, _ = sim_run(m, prompts, None, clock, **kw)
clock.reset(); sim_run(m, prompts, None, clock, **kw); ar = clock()
ob = Cm.Controller.observe
def observe(self, keys, bud, props, verdicts, ms, host=None):
    fit = self.cost.host_fit()
    r = ob(self, keys, bud, props, verdicts, ms, host)
    acc = sum(len(v.accepted) for v in verdicts)
    print(f"t {clock()*1e3:6.1f} b {len(keys):3d} drafting {sum(k > 0 for k in bud.ks):3d} top {max(bud.ks)} "
          f"pred {bud.predicted_ms:5.2f} ms {ms if ms is None else round(ms, 2)} "
          f"host {host if host is None else round(host, 2)} fit ({fit[0]:.2f}, {fit[1]:.4f}) "
          f"ar {self.ar_ms(len(keys)):.2f} accepted {acc}")
    return r
Cm.Controller.observe = observe
d = T._drafters(m, prompts, out, None, b)["self-draft:job"]
dr = SelfDraftDrafter(d.prm, d.corpus, vocab=m.cfg.vocab_size)
clock.reset()
got, st = sim_run(m, prompts, dr, clock, controller=sim_controller(dr, clock.table), **kw)
assert got == out
print("x ar", round(ar / clock(), 3), "steps", st.steps, st.lean_steps, "trips", st.guard_trips, "held", st.guard_held)
