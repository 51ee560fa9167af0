"""Host CPU a step (its clock span less its device time, / HOST) of ar and of Self-Draft's grid
under --speculate fixed (every step drafts) in a drain. fixedspans.py BATCH [profile]"""
import sys
sys.path.insert(0, "tests")
from dataclasses import replace
import test_host_clock as T
from sim import HOST, sim_run, script_model
from specctl.runtime.step import runner as RN
from specctl.speculative.self_draft import SelfDraftDrafter
m, patch = script_model()
b = int(sys.argv[1])
known, prompts, lens, clock = T.workload(m, b, b, patch)
orig = RN.Runner.step; rec = []
def step(self, seqs, drain=False):
    t0, d0 = clock(), clock.t
    w = orig(self, seqs, drain)
    rec.append(((clock() - t0) - (clock.t - d0)) * 1e3 / HOST)
    return w
RN.Runner.step = step
clock.reset()
ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
print("ar host cpu ms/step", [round(x, 3) for x in rec[:12]])
sd = T._drafters(m, prompts, ref, ["self-draft"], b)["self-draft"]
dr = SelfDraftDrafter(replace(sd.prm, grid=True), sd.corpus, vocab=m.cfg.vocab_size)
for r in range(2):
    rec.clear(); clock.reset()
    got, st2 = sim_run(m, prompts, dr.fresh(), clock, batch_size=b, max_tokens=lens, ends_known=False, controller=None)
    print("fixed grid host cpu ms/step", [round(x, 3) for x in rec[:12]], "median", sorted(rec)[len(rec)//2])
if len(sys.argv) > 2:   # (fixedspans.py B profile: where a drafting step's host goes)
    import cProfile, pstats
    prof = cProfile.Profile()
    clock.reset(); prof.enable()
    got, st2 = sim_run(m, prompts, dr.fresh(), clock, batch_size=b, max_tokens=lens,
                       ends_known=False, controller=None)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(
        "specctl/(runtime|speculative|engine/batch|engine/kv|engine/graphs)", 40)
