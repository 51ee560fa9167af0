"""Launches of the demo model's decoding step on the CUDA path, counted on the CPU
(engine/launches.py): the unfused layer (--attention sdpa) against the fused one.

    python bench-results/2026-11-27-fused-layer/count.py
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # the fused kernels on the CPU

from specctl.engine.launches import of_step  # noqa: E402
from specctl.engine.loader import load_model  # noqa: E402
from specctl.models.checkpoint import resolve_model  # noqa: E402
from specctl.store import Store  # noqa: E402

model = load_model(resolve_model(None, Store()), "cpu", "bf16")
print("| batch x tokens | sdpa: a step / a layer | fused: a step / a layer |")
print("|---|---|---|")
for b, n in ((1, 1), (8, 1), (32, 1), (8, 8)):
    row = []
    for attention in ("sdpa", "fused"):
        model.set_attention(attention)
        row.append("%d / %d" % of_step(model, b, n, as_cuda=True))
    print(f"| {b} x {n} | {row[0]} | {row[1]} |", flush=True)
