"""A batch-invariant matmul for CUDA (--exact), in Triton: c[b] = a[b] @ w[b].T with one tile
configuration whatever the shape, each output's reduction over k in blocks of BK from 0 up, in
fp32, no split-k. So a row's result never depends on how many rows share the call, and keys a
row does not attend to (weight 0, past its own position) add exact zeros. cuBLAS picks its
kernel, tiles and split-k by shape, which is why a row's bits follow the batch there (vLLM's and
SGLang's batch-invariant modes replace it the same way).

Tested on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set before this module is
imported); on a GPU it compiles on first use, a few variants per dtype (Triton specializes on
sizes divisible by 16; the arithmetic is the same in each). Imported only under --exact on
CUDA.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BM, BN, BK = 64, 64, 64   # the one tile configuration
# Under Triton's interpreter (the CPU tests) a tl.dot is numpy's matmul: it multiplies bf16
# operands wrongly (3.9), and its BLAS gives a row other bits by the row's place in the block
# (OpenBLAS's sgemm microtiles do, on an EPYC). So there a block's products are summed over k
# by one numpy reduction, the same for every row: what the CPU tests is the tiling and the k
# order, which is what the GPU's fixed tile configuration makes invariant.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _kernel(a, w, c, M, N, K, s_ab, s_am, s_ak, s_wb, s_wn, s_wk, s_cb, s_cm, s_cn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
            UPCAST: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    pb = tl.program_id(2).to(tl.int64)   # (batch offsets of a large score tensor pass 2^31)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptr = a + pb * s_ab + rm[:, None] * s_am
    w_ptr = w + pb * s_wb + rn[None, :] * s_wn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        x = tl.load(a_ptr + k[None, :] * s_ak, mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)
        y = tl.load(w_ptr + k[:, None] * s_wk, mask=(rn[None, :] < N) & (k[:, None] < K),
                    other=0.0)
        if UPCAST:   # (the interpreter only: see _INTERPRET)
            acc += tl.sum(x.to(tl.float32)[:, :, None] * y.to(tl.float32)[None, :, :], axis=1)
        elif IEEE:
            acc = tl.dot(x, y, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, y, acc)
    out = c + pb * s_cb + rm[:, None] * s_cm + rn[None, :] * s_cn
    tl.store(out, acc.to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def pow2(n: int) -> int:
    """The least power of two >= n (>= 1): a Triton block's size for n values."""
    return 1 << (max(n, 1) - 1).bit_length()


LAUNCHES = [0]   # Triton launches made here and in engine/fused.py (engine/launches.py counts)
IN_LAUNCH = [False]   # (the interpreter's own tensor ops during a launch are not launches)


def launch(kernel, grid, *args, **meta) -> None:
    """kernel[grid](*args, **meta), counted."""
    LAUNCHES[0] += 1
    IN_LAUNCH[0] = True
    try:
        kernel[grid](*args, **meta)
    finally:
        IN_LAUNCH[0] = False


def bmm_nt(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a [B, M, K] @ w [B, N, K].T -> [B, M, N] in a's dtype (any strides)."""
    B, M, K = a.shape
    N = w.shape[1]
    c = torch.empty(B, M, N, dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN), B)
    launch(_kernel, grid, a, w, c, M, N, K, *a.stride(), *w.stride(), *c.stride(),
           BM=BM, BN=BN, BK=BK, IEEE=a.dtype == torch.float32, UPCAST=_INTERPRET)
    return c


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T (+ b), batch-invariant."""
    y = bmm_nt(x[None], w[None])[0]
    return y + b if b is not None else y


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm's contract (a [B, M, K] @ b [B, K, N]), batch-invariant."""
    return bmm_nt(a, b.transpose(1, 2))
