"""commit (an ar step's) and commit_grid (a grid step's, ~1.25 tokens a sequence) at b64 on 64
stand-in sequences, each 300 times warm and after a 32 MB sweep of the caches ("cold"). From the
repo root:  PYTHONPATH=$PWD python bench-results/2026-12-01-grid-host2/commit_warm.py"""
import time, statistics, random
import numpy as np
from types import SimpleNamespace as NS
from specctl.runtime.step.sequence import Request, Sequence
from specctl.runtime.step.answers import Answers
from specctl.runtime.step.stats import RunStats
from specctl.runtime.step.commit import commit, commit_grid
from specctl.runtime.step.grid import GridVerdicts
from specctl.speculative.verify import RowVerdicts
from specctl.engine.kv import KVCache
B, G = 64, 4
kv = KVCache(1, B, 4096, 1, 2)
st = RunStats()
ans = Answers({0}, (), lambda ids: "", kv, 4096, st)
seqs = [Sequence(Request(i, [[{"role": "user", "content": "x"}]], 10**9), prompt_ids=[1], slot=i) for i in range(B)]
rng = random.Random(0)
slots = [s.slot for s in seqs]
junk = np.ones(32 << 20 >> 3)
def rows():
    out = []
    for i in range(B):
        a = rng.choice([0, 0, 0, 0, 1, 2])
        out.append([a, 0, 0, 4] + [rng.randint(5, 900) for _ in range(G + 1)])
    return out
def run(which, cold, n=300):
    ts = []
    for _ in range(n):
        if kv.lens[0] > 3000:
            for s in seqs: kv.lens[s.slot] = 0; s.out_ids.clear(); s.req.accept_lengths.clear(); s.req.draft_lengths.clear()
        if which == "grid":
            plan = NS(seqs=seqs, batch=NS(num_tokens=B * 17, seq_slots=slots)); out = NS(verdicts=GridVerdicts(rows()))
            f = commit_grid
        else:
            plan = NS(seqs=seqs, batch=NS(num_tokens=B, seq_slots=slots)); out = NS(verdicts=RowVerdicts([rng.randint(5, 900) for _ in range(B)]))
            f = commit
        if cold: junk.sum()
        t = time.perf_counter(); f(plan, out, kv, ans, st); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6
for cold in (False, True):
    for w in ("ar", "grid"):
        print(f"{w:5s} {'cold' if cold else 'warm'} {run(w, cold):6.1f} us")
