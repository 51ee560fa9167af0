"""A grid step's verification and KV moves in one Triton launch on CUDA (GridStep.device_step's,
issue 52).

On the tensor path they are 41 eager launches a drafting step, at any batch: 37 for
verify_chains and the moves' storage rows, 4 for the moves (engine/launches.py counts them as
CUDA launches them). A GPU's host pays each one through PyTorch's dispatch (an eager demo-shape
forward took the H200's host ~27 us a launch, bench-results/2026-11-30-grid-kernel), where an
`ar` step's whole host at batch 64 was 0.4 ms. Here they are one program a sequence and layer:
each reads its sequence's row (GridDrafts.host's, as the forward filled it) and the target's
argmax and verifies it (a few loads), and moves its best chain's rows below its root in its
layer's keys and values
(none where the first chain is the best: its rows are in place); layer 0's writes the
sequence's verdicts. (One program a sequence, looping over the layers, copied a large model's
every layer on one SM at batch 1.) The result equals the tensor operations'
(tests/test_grid_kernel.py, under Triton's interpreter on a CPU).

C and G are arguments, not compile-time constants: one compile for the drafter's largest
chains serves every step's (a step's budget picks fewer or shallower ones), made as the run
starts, where GridStep.warm checks the kernel against the tensor operations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specctl.engine.bi_matmul import launch, pow2


@triton.jit(do_not_specialize=["sb", "sk", "C", "G", "T0", "block", "sL", "sR", "E"])
def _verify_kernel(up, target, res, kc, vc, sb, sk, C, G, T0, block, sL, sR, E,
                   BC: tl.constexpr, BG: tl.constexpr, BO: tl.constexpr, BE: tl.constexpr):
    b, layer = tl.program_id(0), tl.program_id(1)   # (each program verifies its sequence's
    n = C * G                                       # drafts, cheap, and moves one layer's rows)
    row = up + b * sb                # slot, committed rows, pending, room, budget, held, cands
    tgt = target + b * (1 + n)       # [C G], allowed [C], block-table entries from T0 (column
    ci = tl.arange(0, BC)            # k at k sk); the target's argmax after each row
    c, j = ci[:, None], tl.arange(0, BG)[None, :]
    inside = (c < C) & (j < G)
    cands = tl.load(row + (6 + c * G + j) * sk, mask=inside, other=0)
    allowed = tl.load(row + (6 + n + ci) * sk, mask=ci < C, other=0)
    lim = tl.where(ci < tl.load(row + 5 * sk), allowed, 0)   # (usable: a held
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
    out = tl.load(row + (6 + best * G + o) * sk, mask=o < G, other=0)   # token after the last
    out = tl.where(o == acc, tl.load(tgt + tl.where(acc > 0, best * G + acc, 0)), out)
    start = tl.sum(tl.where(ci < best, allowed, 0), axis=0)      # (GridVerdicts' numbering)
    if layer == 0:   # (the verdicts: layer 0's program writes them)
        r = res + b * (G + 5)
        tl.store(r, acc)
        tl.store(r + 1, best)
        tl.store(r + 2, start)
        tl.store(r + 3, tl.sum(lim, axis=0))
        tl.store(r + 4 + o, out, mask=o < G + 1)
    # the best chain's rows moved below the root, this layer's keys and values (storage
    # rows through the block table; a sequence's rows are its own, and the chain's lie past
    # the rows they move to: no program reads a row another writes)
    g = tl.arange(0, BG)
    base = tl.load(row + sk) + 1
    table = row + T0 * sk   # (a contiguous cache's: its slot, column 0)
    d, s = base + g, base + best * G + g
    d = tl.load(table + d // block * sk, mask=g < G, other=0) * block + d % block
    s = tl.load(table + s // block * sk, mask=g < G, other=0) * block + s % block
    e = tl.arange(0, BE)[None, :]
    moves = tl.where(best > 0, G, 0)   # (the first chain's rows: in place, none moved)
    moved = (g < moves)[:, None] & (e < E)
    d, s = d[:, None] * sR + e, s[:, None] * sR + e
    at = layer.to(tl.int64) * sL   # (64-bit: a layer's offset may pass 2^31 values)
    tl.store(kc + at + d, tl.load(kc + at + s, mask=moved), mask=moved)
    tl.store(vc + at + d, tl.load(vc + at + s, mask=moved), mask=moved)


def fits(kv) -> bool:
    """Whether the kernel moves kv's rows: each layer's keys and values rows of contiguous
    values (KVCache's own)."""
    return all(t.is_contiguous() for t in (kv.k_all, kv.v_all))


def verify(up: torch.Tensor, target: torch.Tensor, C: int, G: int, tables_at: int, kv,
           most: tuple[int, int] | None = None) -> torch.Tensor:
    """GridStep.device_step's verdicts [B, G + 5], its KV moves made (kv: a KVCache, fits),
    from up [B, W] (GridDrafts.host's layout, filled by GridFill, its block-table entries
    from column tables_at; any strides: numpy may lay it out by columns) and target
    [B (1 + C G)] (contiguous), int64 on kv's device; most: the largest (C, G) the kernel is
    compiled for (default these)."""
    B = up.shape[0]
    mc, mg = most or (C, G)
    k = kv.k_all
    E = k.shape[2] * k.shape[3]
    res = torch.empty(B, G + 5, dtype=torch.long, device=up.device)
    launch(_verify_kernel, (B, k.shape[0]), up, target, res, k, kv.v_all, up.stride(0),
           up.stride(1), C, G, tables_at, kv.block, k.stride(0), k.stride(1), E,
           BC=pow2(mc), BG=pow2(mg), BO=pow2(mg + 1), BE=pow2(E))
    return res
