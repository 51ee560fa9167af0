"""A grid step's verification in one Triton launch on CUDA (GridStep.device_step's, issue 52).

The tensor operations of verify_chains and the storage rows of the KV moves are 37 eager
launches a drafting step (engine/launches.py counts them as CUDA launches them). A GPU's host
pays each one, ~5-10 us through PyTorch's dispatch, at any batch: with the KV moves' own four,
~0.2-0.4 ms a drafting step, where an `ar` step's whole host at batch 64 was 0.4 ms on the H200
(bench-results/2026-11-30-gpu-7f4cca3/host-profile-b64.md). Here they are one program a
sequence, reading its row of GridDrafts.up and of the target's argmax and writing its row of
the verdicts and its rows to move; the moves stay KVCache.copy_rows' (every layer's keys and
values: four launches). The result equals the tensor operations' (tests/test_grid_kernel.py,
under Triton's interpreter on a CPU).

C and G are arguments, not compile-time constants: one compile for the drafter's largest
chains serves every step's (a step's budget picks fewer or shallower ones), made as the run
starts (warm), not in its first drafting step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specctl.engine.bi_matmul import launch


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


@triton.jit(do_not_specialize=["sb", "sk", "C", "G", "block"])
def _verify_kernel(up, target, res, dst, src, sb, sk, C, G, block,
                   BC: tl.constexpr, BG: tl.constexpr, BO: tl.constexpr):
    b = tl.program_id(0)
    n = C * G
    row = up + b * sb                # slot, committed rows, pending, cands [C G], allowed [C],
    tgt = target + b * (1 + n)       # held, block-table entries (column k at k sk); the
    ci = tl.arange(0, BC)            # target's argmax after each row
    c, j = ci[:, None], tl.arange(0, BG)[None, :]
    inside = (c < C) & (j < G)
    cands = tl.load(row + (3 + c * G + j) * sk, mask=inside, other=0)
    allowed = tl.load(row + (3 + n + ci) * sk, mask=ci < C, other=0)
    lim = tl.where(ci < tl.load(row + (3 + n + C) * sk), allowed, 0)   # (usable: a held
    # chain's)
    # after node j of chain c the target's token after its parent: the root's, or node j - 1's
    after = tl.load(tgt + tl.where(j == 0, 0, c * G + j), mask=inside, other=0)
    ok = (cands == after) & (j < lim[:, None]) & inside
    lens = tl.min(tl.where(ok, BG, j), axis=1)                   # each chain's agreeing prefix
    lens = tl.where(ci < C, tl.minimum(lens, G), -1)
    acc = tl.max(lens, axis=0)
    best = tl.min(tl.where(lens == acc, ci, BC), axis=0)         # the first longest (not
    # argmax's tie_break_left, which Triton's interpreter does not honour)
    o = tl.arange(0, BO)   # the emitted tokens: the best chain's drafts, then the target's
    out = tl.load(row + (3 + best * G + o) * sk, mask=o < G, other=0)   # token after the last
    out = tl.where(o == acc, tl.load(tgt + tl.where(acc > 0, best * G + acc, 0)), out)
    start = tl.sum(tl.where(ci < best, allowed, 0), axis=0)      # (GridVerdicts' numbering)
    r = res + b * (G + 5)
    tl.store(r, acc)
    tl.store(r + 1, best)
    tl.store(r + 2, start)
    tl.store(r + 3, tl.sum(lim, axis=0))
    tl.store(r + 4 + o, out, mask=o < G + 1)
    # the best chain's rows below the root: storage rows through the block table
    g = tl.arange(0, BG)
    base = tl.load(row + sk) + 1
    table = row + (4 + n + C) * sk
    d, s = base + g, base + best * G + g
    tl.store(dst + b * G + g, tl.load(table + d // block * sk, mask=g < G, other=0) * block
             + d % block, mask=g < G)
    tl.store(src + b * G + g, tl.load(table + s // block * sk, mask=g < G, other=0) * block
             + s % block, mask=g < G)


def verify(up: torch.Tensor, target: torch.Tensor, C: int, G: int, block: int,
           most: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
    """(verdicts [B, G + 5], dst [B, G], src [B, G]) of GridStep.device_step, from up [B, W]
    (GridDrafts.up, any strides: numpy may lay it out by columns) and target [B (1 + C G)]
    (contiguous), int64 on one device; most: the largest (C, G) the kernel is compiled for
    (default these)."""
    B = up.shape[0]
    mc, mg = most or (C, G)
    res = torch.empty(B, G + 5, dtype=torch.long, device=up.device)
    dst = torch.empty(B, G, dtype=torch.long, device=up.device)
    src = torch.empty_like(dst)
    launch(_verify_kernel, (B,), up, target, res, dst, src, up.stride(0), up.stride(1), C, G,
           block,
           BC=_pow2(mc), BG=_pow2(mg), BO=_pow2(mg + 1))
    return res, dst, src


def warm(C: int, G: int, device) -> None:
    """Compile the kernel for chains of at most C x G (a tiny launch), as a run starts."""
    up = torch.zeros(1, 5 + C * G + C, dtype=torch.long, device=device)
    verify(up, torch.zeros(1 + C * G, dtype=torch.long, device=device), C, G, 1 << 20)
