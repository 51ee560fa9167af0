"""Counting the kernels a forward launches, on any device: what bounds a small model's decoding
step on a GPU (issue 43), made visible on the CPU.

Every aten op a forward dispatches counts as one launch, except views and metadata (no kernel)
and allocations (empty, whose memory the caching allocator hands out); every Triton kernel of
engine/fused.py and engine/bi_matmul.py (--exact's matmuls on CUDA) counts as one. Two torch
functions are composite on the CPU but one kernel on CUDA: F.rms_norm and
F.scaled_dot_product_attention (the memory-efficient kernel) count as one each, whatever they
dispatch to here. With `as_cuda=True` the model's matmul helpers take the
branches they take on CUDA (F.linear, the residual in addmm's epilogue), so the CPU counts the
CUDA path's ops. A captured CUDA graph replays the same kernels as graph nodes: the count is
what a replay launches.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from specctl.engine import model as model_mod

_FREE = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
         "lift_fresh", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel",
         "sym_storage_offset", "is_same_size", "detach", "detach_"}
_ONE = {F.rms_norm, torch.rms_norm, F.scaled_dot_product_attention}


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0
        self.quiet = 0       # inside one of _ONE: its ops are one kernel, already counted
        self.names: list[str] = []
        self.triton0: int | None = None   # Triton's launches as the block began (None: ended)

    def live(self) -> int:
        """The launches so far, inside the block too (count adds Triton's only as it ends)."""
        return self.count + (_triton() - self.triton0 if self.triton0 is not None else 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not (self.quiet or func.is_view or name in _FREE or _in_triton()):
            self.count += 1
            self.names.append(name)
        return func(*args, **(kwargs or {}))


class _Fused(TorchFunctionMode):
    def __init__(self, ops: _Ops):
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in _ONE or self.ops.quiet:
            return func(*args, **(kwargs or {}))
        self.ops.count += 1
        self.ops.names.append(func.__name__)
        self.ops.quiet += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.ops.quiet -= 1


def _triton() -> int:
    kernels = sys.modules.get("specctl.engine.bi_matmul")   # (not imported: none launched)
    return kernels.LAUNCHES[0] if kernels is not None else 0


def _in_triton() -> bool:
    kernels = sys.modules.get("specctl.engine.bi_matmul")
    return kernels is not None and kernels.IN_LAUNCH[0]


@contextlib.contextmanager
def counting(as_cuda: bool = False):
    """with counting() as c: ... ; then c.count, c.names: the launches made inside."""
    ops = _Ops()
    before = ops.triton0 = _triton()
    was = model_mod.CUDA_PATH[0]
    model_mod.CUDA_PATH[0] = as_cuda or was
    try:
        with _Fused(ops), ops:
            yield ops
    finally:
        model_mod.CUDA_PATH[0] = was
        made = _triton() - before
        ops.count, ops.triton0 = ops.count + made, None
        ops.names += ["triton"] * made   # (after the ops: a layer's names are in order but
        # these)


def per_step(model, batch, kv, as_cuda: bool = False) -> tuple[int, int, list[str]]:
    """(launches of a forward of `batch` through every layer and the greedy head, launches
    one decoder layer adds, that layer's op names), the layer's as the difference between
    forwards of one and two layers (each writes the same KV rows; the batch's attention
    metadata is made anew for each, as a forward's own)."""
    from specctl.engine.batch import LayerPlan
    counts = []
    for plan in (LayerPlan(end=1), LayerPlan(end=2), None):
        batch._attn_meta = None
        with counting(as_cuda) as c:
            if plan is None:
                model.argmax(model.forward(batch, kv))
            else:
                model.forward(batch, kv, plan)
        counts.append(c)
    one, two, whole = counts
    ops1 = [n for n in one.names if n != "triton"]
    ops2 = [n for n in two.names if n != "triton"]
    layer = ops2[len(ops1):] + ["triton"] * (two.names.count("triton")
                                             - one.names.count("triton"))
    return whole.count, two.count - one.count, layer


def of_step(model, batch_size: int = 1, tokens: int = 1,
            as_cuda: bool = False) -> tuple[int, int]:
    """(launches a step, launches a layer) of an eager decoding forward of batch_size sequences
    x tokens each (8 committed rows, on a small cache of its own) with its greedy head, on
    the model's device: what a replay of that captured step launches."""
    from specctl.engine.batch import ForwardBatch, SeqInput
    from specctl.engine.kv import KVCache
    c = model.cfg
    kv = KVCache(c.num_layers, batch_size, 8 + tokens, c.num_kv_heads, c.head_dim,
                 model.dtype, model.device)
    for s in range(batch_size):
        kv.reserve(s, 8 + tokens)
        kv.lens[s] = 8
    batch = ForwardBatch([SeqInput(s, [7] * tokens, 8) for s in range(batch_size)],
                         model.device)
    step, layer, _ = per_step(model, batch, kv, as_cuda)
    return step, layer


def on_cuda(model) -> dict | None:
    """{"step", "layer"}: an `ar` step's launches at batch 1 on CUDA (bench and host_profile
    print them); None elsewhere (the CPU's ops are not a GPU's launches)."""
    if model.device.type != "cuda":
        return None
    step, layer = of_step(model)
    return {"step": step, "layer": layer}
