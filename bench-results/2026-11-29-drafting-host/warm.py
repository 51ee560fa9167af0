# The pure host pieces of Self-Draft's drafting steps, timed warm (least of 30 calls) on the states a host-charged
# run (tests/test_host_clock.py, BATCH, requests waiting) captured: what the Python floor of each is.
#   python bench-results/2026-11-29-drafting-host/warm.py BATCH
import sys, time
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
import specctl.runtime.step.step as STM
from specctl.runtime.step.step import Planner
from specctl.engine.batch import ForwardBatch
from specctl.speculative.trie import build_trie
from specctl.speculative.self_draft import SelfDraftDrafter
from specctl.speculative.verify import verify_greedy
m, patch = script_model()
b = int(sys.argv[1])
caps = []   # (drafter, seqs, lens, plan, target)
oplan = Planner._planned
def _planned(self, seqs, budgets, props, search_ms=0.0, apart_ms=0.0):
    p = oplan(self, seqs, budgets, props, search_ms, apart_ms)
    if self.drafter.name == "self-draft" and not p.lean and p.batch.num_tokens > len(seqs) and len(caps) < 40:
        caps.append([self, list(seqs), [self.kv.lens[s.slot] for s in seqs], p,
                     [SelfDraftDrafter.candidates(self.drafter, s) for s in seqs], None])
    return p
Planner._planned = _planned
oread = STM.read
import specctl.runtime.step.runner as RM
def read(plan, h, model, sp):
    t = oread(plan, h, model, sp)
    for c in caps:
        if c[3] is plan: c[5] = t
    return t
RM.read = read
ratios, stats, ar = T.host_charged_ratios(m, b, 4 * b, patch, methods=["self-draft"], rounds=1)
caps = [c for c in caps if c[5] is not None]
print(ratios, "captured", len(caps), "steps; seqs/step", sum(len(c[1]) for c in caps) / len(caps),
      "nodes/seq", sum(len(p.draft) for c in caps for p in c[3].proposals) / sum(len(c[1]) for c in caps))
def best(fn, n=30):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)
tot = {}
nseq = sum(len(c[1]) for c in caps)
for pl, seqs, lens, plan, cands, target in caps:
    props = plan.proposals
    budgets = [len(p.draft) for p in props]
    def layout():
        inputs = [STM.seq_input(s, p, l) for s, p, l in zip(seqs, props, lens)]
        ForwardBatch(inputs, "cpu")
    def seqin():
        [STM.seq_input(s, p, l) for s, p, l in zip(seqs, props, lens)]
    def trie():
        for (cs, _, _), k in zip(cands, budgets):
            build_trie(cs, max(k, 1), [])
    def cand():
        for s in seqs: pl.drafter.candidates(s)
    cu, real = plan.batch.cu_seqlens, plan.verified
    def ver():
        [verify_greedy(p.draft, target[cu[i]:cu[i] + real[i]]) for i, p in enumerate(props)]
    for k, f in (("layout", layout), ("seq_input", seqin), ("build_trie", trie), ("candidates", cand), ("verify_greedy", ver)):
        tot[k] = tot.get(k, 0) + best(f)
for k, v in tot.items():
    print(f"  {k:14s} {v * 1e6 / nseq:6.2f} us/seq")
