"""GridStep.plan and its parts at batch 64 run warm (the same call 300 times, median us): what
gridparts.py times inside host_profile's run, where the CPU forward runs between two plans."""
import time

import numpy as np

from specctl.engine.batch import ForwardBatch
from specctl.runtime.step.grid import GridDrafts, GridStep
from specctl.speculative.context_table import ContextTable

B, V = 64, 49152
t = ContextTable(V, 8, 4)
rng = np.random.default_rng(0)
t.push_texts([rng.integers(0, V, 200).tolist() for _ in range(64)])
g = GridStep(t, 4)
slots = list(range(B))
lens = rng.integers(50, 300, B).tolist()
pend = rng.integers(0, V, B).tolist()
room = [40] * B


class KV:   # (a contiguous cache: the slot's one block)
    paged, block = False, 1


def tm(f, n=300):
    f()
    ts = []
    for _ in range(n):
        a = time.perf_counter()
        f()
        ts.append(time.perf_counter() - a)
    return sorted(ts)[n // 2] * 1e6


p = np.array(pend)
depth, anc, node = g.layout(4, 4)
cands, held = t.candidates(p, 4)
tokens = np.concatenate([p[:, None], cands.reshape(B, -1)], axis=1)
allowed = np.broadcast_to(np.arange(4)[None, None, :] < np.array(room)[:, None, None], (B, 4, 4))
usable = allowed & held[:, :, None]
tables = np.array(slots, np.int64)[:, None]
print(f"GridStep.plan      {tm(lambda: g.plan(slots, lens, pend, room, None, KV(), 'cpu')):6.1f} us")
print(f"  candidates       {tm(lambda: t.candidates(p, 4)):6.1f} us")
print(f"  ForwardBatch.grid {tm(lambda: ForwardBatch.grid(slots, lens, tokens, depth, anc, 'cpu')):5.1f} us")
print(f"  GridDrafts.make  {tm(lambda: GridDrafts.make(cands, allowed, usable, slots, lens, tables, 'cpu')):6.1f} us")
