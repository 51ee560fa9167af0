"""Host us of CudaGraphs._stage_inputs for a step of ragged drafts (1-5 tokens a sequence, 200
random steps, each staged three times into one graph's buffers, median), chains or trees, at
batch B. No model: the staging alone, into buffers shaped as a captured graph's. From the
repo root:
    PYTHONPATH=$PWD python bench-results/2026-11-30-graph-staging/stage_ragged.py 8,64
"""
import random
import statistics
import sys
import time
import types

import torch

from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.graphs import CAUSAL, CudaGraphs, grid_n


def batches(B: int, tree: bool, rng) -> list:
    out = []
    for _ in range(200):
        seqs = []
        for s in range(B):
            k = rng.randrange(1, 6)
            seqs.append(SeqInput(s, [rng.randrange(3, 300) for _ in range(k)], 50,
                                 parents=[j - 1 for j in range(k - 1)] if tree else None))
        out.append(ForwardBatch(seqs, "cpu"))
    return out


g, kv = CudaGraphs(None, capture=False), types.SimpleNamespace(scratch=0)
for B in map(int, sys.argv[1].split(",")):
    for tree in (False, True):
        caps, ts = {}, []
        with torch.inference_mode():
            for b in batches(B, tree, random.Random(0)) * 3:
                n, Bb = grid_n(max(b.num_new)), CudaGraphs.bucket(B, 64)
                cap = caps.get((Bb, n))
                if cap is None:
                    cap = caps[Bb, n] = types.SimpleNamespace(
                        ints=torch.empty(3 * Bb * n + 2 * Bb, dtype=torch.long), table=None,
                        local=torch.empty(Bb, n, n, dtype=torch.bool), mask=CAUSAL)
                t = time.perf_counter()
                g._stage_inputs(cap, b, kv, Bb, n)
                ts.append((time.perf_counter() - t) * 1e6)
        print(f"B {B:3d} {'trees' if tree else 'chains'}: {statistics.median(ts):5.1f} us",
              flush=True)
