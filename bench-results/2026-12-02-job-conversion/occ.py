import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.speculative.self_draft import SelfDraftDrafter
from specctl.runtime.step import runner as R
from sim import script_model, sim_controller, sim_run
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
known, prompts, lens, clock = T.workload(m, b, n, patch)
kw = dict(batch_size=b, max_tokens=lens, ends_known=False)
out, _ = sim_run(m, prompts, None, clock, **kw)
rec = []
orig = R.Runner.step
def step(self, seqs, drain=False):
    t0 = clock(); r = orig(self, seqs, drain); rec.append((t0, clock() - t0, len(seqs), drain)); return r
R.Runner.step = step
def run(dr, ctl):
    rec.clear(); clock.reset()
    got, st = sim_run(m, prompts, dr, clock, controller=ctl, **kw)
    assert got == out
    return clock(), list(rec)
def summary(name, t, rr):
    w = [x for x in rr if not x[3]]; d = [x for x in rr if x[3]]
    seq = "".join("D" if x[3] else "w" for x in rr)
    print(name, "phases:", seq[:40], "...", seq[-70:], "batch sizes in drain:", sorted(set(x[2] for x in d)))
    print(f"{name:6s} total {t*1e3:7.1f} waiting: steps {len(w)} ms {sum(x[1] for x in w)*1e3:6.1f} occ {sum(x[2] for x in w)/max(1,len(w)):5.2f} ends at {(w[-1][0]+w[-1][1])*1e3 if w else 0:6.1f} | drain: steps {len(d)} ms {sum(x[1] for x in d)*1e3:6.1f} occ {sum(x[2] for x in d)/max(1,len(d)):5.2f}")
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    t, rr = run(None, None); summary("ar", t, rr)
    d = T._drafters(m, prompts, out, None, b)["self-draft:job"]
    dr = SelfDraftDrafter(d.prm, d.corpus, vocab=m.cfg.vocab_size)
    t, rr = run(dr, sim_controller(dr, clock.table)); summary("job", t, rr)
