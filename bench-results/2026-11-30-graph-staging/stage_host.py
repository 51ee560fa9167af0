"""Host us of CudaGraphs.run less its replay (the graph path's staging of a step's inputs,
engine/graphs.py), for a Self-Draft grid step (C 4 chains of G 4: 17 rows a sequence, padded
to 32) and for an `ar` step, at each batch size; the tiny model at /tmp/tiny
(recipes/tiny_model.py), the CPU's eager stand-in for a graph with its replay made a no-op,
300 calls each, warm. From the repo root:

    PYTHONPATH=$PWD python bench-results/2026-11-30-graph-staging/stage_host.py 8,32,64
"""
import statistics
import sys
import time

import torch

from specctl.engine.batch import ForwardBatch
from specctl.engine.graphs import CudaGraphs
from specctl.engine.loader import load_model
from specctl.runtime.step.grid import GridStep
from specctl.speculative.context_table import ContextTable

torch.set_num_threads(1)
m = load_model("/tmp/tiny", "cpu", "fp32")
for B in map(int, sys.argv[1].split(",")):
    m.graphs = CudaGraphs(m, capture=False)
    kv = m.new_kv_cache(B, 256)
    table = ContextTable(m.cfg.vocab_size, 10, 4)
    table.push_texts([list(range(3, 600))])
    grid, slots = GridStep(table, 4), list(range(B))
    for s in slots:
        kv.lens[s] = 10
    make = {"grid": lambda: grid.plan(slots, [10] * B, list(range(5, 5 + B)), [8] * B, None,
                                      kv, "cpu")[0],
            "ar": lambda: ForwardBatch.decode(slots, list(range(5, 5 + B)), [10] * B, "cpu")}
    got = {}
    for name, mk in make.items():
        m.run(mk(), kv)   # (captures the shape, eagerly)
        for cap in m.graphs.cache.values():
            cap.graph.replay = lambda: None
        ts = []
        for _ in range(300):
            b = mk()
            t = time.perf_counter()
            m.run(b, kv)
            ts.append((time.perf_counter() - t) * 1e6)
        got[name] = statistics.median(ts)
    print(f"B {B:3d}: grid {got['grid']:6.1f} us, ar {got['ar']:5.1f} us "
          f"({got['grid'] / got['ar']:.1f}x)", flush=True)
