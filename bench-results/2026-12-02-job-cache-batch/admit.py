import sys
sys.path.insert(0, "tests")
from specctl.speculative.self_draft import SelfDraftDrafter
from specctl.runtime.step import admission
import test_host_clock as T
from sim import script_model, sim_controller, sim_run
model, patch = script_model()
batch = int(sys.argv[1])
known, prompts, lens, clock = T.workload(model, batch, 4 * batch, patch)
log = []
pre = admission.Admission.prefilled
def prefilled(self, forwards, tokens, ms, prompts=1):
    log.append((round(clock() * 1e3, 1), prompts, forwards, tokens, round(ms, 2), self.group(), self._fixed and round(self._fixed, 2), self.step_ms and round(self.step_ms, 2), round(self.freed, 3)))
    return pre(self, forwards, tokens, ms, prompts)
admission.Admission.prefilled = prefilled
ref, st = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens, ends_known=False)
print("ar"); [print(" ", x) for x in log]; log.clear()
d = T._drafters(model, prompts, ref, None, batch)["self-draft:job"]
dr = SelfDraftDrafter(d.prm, d.corpus, vocab=model.cfg.vocab_size)
clock.reset()
got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=lens, ends_known=False, controller=sim_controller(dr, clock.table))
print("job"); [print(" ", x) for x in log]
print("job prefill_s", st.prefill_s, "step_s", st.step_s, "total", clock(), "searches", st.searches, st.search_ms, "steps", st.steps, st.lean_steps)
