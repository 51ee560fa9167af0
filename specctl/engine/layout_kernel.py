"""A replay's masks and positions in one Triton launch on CUDA: batch.tree_closure's, which is
~20 tensor operations (17 at 16 tokens a sequence, 23 at 64), each a kernel of every captured
graph with more than one token a sequence, whatever its drafter (chains too), at a few us of
device time each.

One program a sequence: each of its rows walks up its parents to its root (at most n - 1
steps: a parent precedes its row, batch.tree_nodes), marking each ancestor in its row of an
[n, n] block and counting the steps, its depth; its position is the sequence's prefix plus its
depth. The result equals tree_closure's (tests/test_layout_kernel.py, under Triton's
interpreter on a CPU); CudaGraphs checks it so on the device before a capture uses it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specctl.engine.bi_matmul import launch, pow2


@triton.jit(do_not_specialize=["n"])
def _layout_kernel(par, prefix, anc, pos, n, BN: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BN)
    inside = rows < n
    cur = rows.to(tl.int64)   # (int64 from the start: a loop-carried value keeps its type,
    # and the parents it takes are int64; the interpreter would not say so, a compile does)
    seen = rows[:, None] == rows[None, :]   # (each row sees itself)
    depth = tl.zeros([BN], dtype=tl.int64)
    for _ in range(n):
        up = tl.load(par + b * n + cur, mask=inside, other=0)
        more = inside & (up != cur)          # (a root's parent is itself)
        seen = seen | ((rows[None, :] == up[:, None]) & more[:, None])
        depth += more.to(tl.int64)
        cur = tl.where(more, up, cur)
    block = inside[:, None] & inside[None, :]
    tl.store(anc + b * n * n + rows[:, None] * n + rows[None, :], seen, mask=block)
    tl.store(pos + b * n + rows, tl.load(prefix + b) + depth, mask=inside)


def layout(par: torch.Tensor, prefix: torch.Tensor,
           most: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ancestors [B, n, n] bool, positions [B n]) of par [B, n] (each row's parent row, a
    root its own; contiguous int64) and prefix [B] (int64): tree_closure's mask, and prefix +
    its depth. most: the largest n it is compiled for (default n; one compile serves every n
    up to it, n not being a compile-time constant)."""
    B, n = par.shape
    anc = torch.empty(B, n, n, dtype=torch.bool, device=par.device)
    pos = torch.empty(B * n, dtype=torch.long, device=par.device)
    launch(_layout_kernel, (B,), par, prefix, anc, pos, n,
           BN=pow2(max(most or n, n)))
    return anc, pos
