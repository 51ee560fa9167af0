"""The demo model's 4 linears of one layer and its LM head, bf16, under each --exact candidate
(engine/exact.py) at the row counts a run makes: decode steps of 1, 8, 16 and 32 sequences, a
tree step of 8 x 6 rows, and a 512-row prefill chunk. Median of 7 timed calls after 2, ms.

    python bench-results/2026-11-27-exact-parts/linears.py
"""
import os
import statistics
import time

import torch

from specctl.engine import exact
from specctl.engine.loader import load_model
from specctl.models.checkpoint import resolve_model
from specctl.store import Store

m = load_model(resolve_model(None, Store(os.path.expanduser("~/.cache/specctl")),
                             log=lambda s: None), "cpu", "bf16")
L = m.layers[0]
weights = {"qkv": L.wqkv, "o": L.wo, "gate/up": L.w_gate_up, "down": L.w_down,
           "head": m.lm_head}
print(f"threads {torch.get_num_threads()}")
print("| rows | " + " | ".join(f.__name__ for f in exact.candidates(False)) + " |")
print("|---|" + "---|" * len(exact.candidates(False)))
with torch.inference_mode():
    for rows in (1, 8, 16, 32, 48, 512):
        cells = []
        for f in exact.candidates(False):
            times = []
            for i in range(9):
                xs = {k: torch.randn(rows, w.shape[1]).bfloat16() for k, w in weights.items()}
                t0 = time.perf_counter()
                for k, w in weights.items():
                    if k != "head" or rows <= 48:   # (a prefill computes the head on its last row)
                        f(xs[k], w)
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1e3)
            cells.append(f"{statistics.median(times):.2f}")
        print(f"| {rows} | " + " | ".join(cells) + " |")
