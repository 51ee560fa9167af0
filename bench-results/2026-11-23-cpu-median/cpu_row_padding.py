"""CPU steps with the matmul rows padded (engine/model.py `gemm_rows`) against the same steps
unpadded (a lone row still padded to two), alternating in one process, fastest of 9 rounds.

    python bench-results/2026-11-23-cpu-median/cpu_row_padding.py [--threads 2] [--rounds 10]

Steps over 300 committed rows: batch 8 with every sequence at 1 or 2 tokens, or one or two
sequences verifying a chain among single-token ones (what --speculate auto makes at batch 8),
and batch 1 at several token counts. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import time

import torch

import specctl.engine.model as engine_model
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.models.checkpoint import resolve_model
from specctl.engine.loader import load_model
from specctl.store import Store

CONTEXT = 300
# name -> tokens of each sequence in the step
STEPS = {
    "b8 all 1": [1] * 8,
    "b8 all 2": [2] * 8,
    "b8 one 1+2 (10 rows)": [3] + [1] * 7,
    "b8 one 1+3 (11 rows)": [4] + [1] * 7,
    "b8 one 1+6 (14 rows)": [7] + [1] * 7,
    "b8 two 1+4 (18 rows)": [5, 5] + [1] * 6,
    "b8 one 1+12 (20 rows)": [13] + [1] * 7,
    "b8 one 1+14 (22 rows)": [15] + [1] * 7,
    "b1 1": [1], "b1 3": [3], "b1 6": [6], "b1 10": [10], "b1 13": [13], "b1 20": [20],
}
FORMS = {"unpadded": lambda m: 2 if m == 1 else m, "gemm_rows": engine_model.gemm_rows}


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(resolve_model(None, Store()), "cpu", "fp32")
    kv = model.new_kv_cache(8, CONTEXT + 40)
    for s in range(8):
        kv.lens[s] = CONTEXT
    g = torch.Generator().manual_seed(0)
    batches = {}
    for name, ns in STEPS.items():
        seqs = [SeqInput(s, torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist(),
                         CONTEXT) for s, n in enumerate(ns)]
        batches[name] = ForwardBatch(seqs, "cpu")
    best = {(f, k): float("inf") for f in FORMS for k in STEPS}
    try:
        for r in range(a.rounds):
            for form, rows in FORMS.items():
                engine_model.gemm_rows = rows
                for name, batch in batches.items():
                    t = time.perf_counter()
                    model.argmax(model.run(batch, kv)).tolist()
                    if r:   # the first round warms up
                        best[(form, name)] = min(best[(form, name)],
                                                 (time.perf_counter() - t) * 1e3)
    finally:
        engine_model.gemm_rows = FORMS["gemm_rows"]
    print("| step | unpadded ms | gemm_rows ms | ratio |\n|---|---|---|---|")
    for name in STEPS:
        old, new = best[("unpadded", name)], best[("gemm_rows", name)]
        print(f"| {name} | {old:.1f} | {new:.1f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
