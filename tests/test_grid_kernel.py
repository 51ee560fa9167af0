"""The grid step's verification kernel (runtime/step/grid_kernel.py, CUDA's) under Triton's
interpreter on the CPU: the same verdicts and KV moves as GridStep.device_step's tensor
operations, in one launch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import triton_module
from specctl.engine.kv import KVCache
from specctl.engine.launches import counting
from specctl.runtime.step.grid import GridDrafts, GridStep
from specctl.speculative.context_table import ContextTable

grid_kernel = triton_module("specctl.runtime.step.grid_kernel")
from specctl.engine.bi_matmul import LAUNCHES  # noqa: E402  (after: the interpreter, set there)
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # (compiled there, else interpreted)


def _drafts(seq, cands, allowed, held, tables, paged: bool) -> GridDrafts:
    """Drafts whose every candidate and allowed slot the host gives (GridDrafts.make: as a
    step's forward fills them), seq [3, B] (slots, committed rows, pending tokens)."""
    B, C, G = cands.shape
    seq = np.concatenate([seq, np.zeros((2, B), np.int64), held[None]])
    return GridDrafts.make(seq, C, G, cands.reshape(B, -1), allowed, tables if paged else None)


def _case(rng, B: int, C: int, G: int, paged: bool, vocab: int = 4):
    """Drafts and a target where chains often agree (a small vocabulary, targets copied from
    the candidates), with every budget, hold and room from none to all."""
    cands = rng.integers(0, vocab, (B, C, G))
    allowed = rng.integers(0, G + 1, (B, C))
    held = rng.integers(0, C + 1, B)
    lens = rng.integers(0, 20, B)
    seq = np.array([np.arange(B), lens, rng.integers(0, vocab, B)])
    tables = rng.permutation(np.arange(1, 3 * B + 1)).reshape(B, 3) if paged else \
        np.arange(B)[:, None]
    target = rng.integers(0, vocab, (B, 1 + C * G))
    agree = rng.random((B, C, G)) < 0.7   # (target after node j - 1 = node j's candidate)
    for b, c, j in zip(*np.nonzero(agree)):
        target[b, c * G + j if j else 0] = cands[b, c, j]
    if C > 1:   # (ties: the first of two equal chains is the one taken, so its rows move)
        cands[::2, 1], allowed[::2, :2], held[::2] = cands[::2, 0], G, C
        target[::2, 1 + G:1 + 2 * G] = target[::2, 1:1 + G]
    return seq, cands, allowed, held, tables, torch.from_numpy(target.ravel())


# (on a CPU each shape once, contiguous or paged in turn, the largest both ways: ~3.4 s a case
# under the interpreter on an AVX2 CPU, where all ten pairs took 34 s of the suite; compiled
# on a GPU, all ten)
SHAPES = [(C, G, paged) for C, G in ((1, 1), (1, 4), (3, 4), (4, 2), (4, 4))
          for paged in (False, True)] if DEV == "cuda" else \
    [(1, 1, False), (1, 4, True), (3, 4, False), (4, 2, True), (4, 4, False), (4, 4, True)]


@pytest.mark.parametrize("C,G,paged", SHAPES)
def test_the_kernel_verifies_as_the_tensor_operations_do(C, G, paged):
    rng = np.random.default_rng(C * 10 + G + paged)
    most = (4, 4)   # (compiled for the largest chains, as a run's: a step's may be fewer)
    accepted = 0
    for B in (1, 7, 64):
        seq, cands, allowed, held, tables, target = _case(rng, B, C, G, paged)
        out = {}
        for kernel in (False, True):
            step = GridStep(ContextTable(50, most[0], most[1]), most[0], kernel=kernel)
            # (3 layers of 3 heads of 5: rows of 15 values, not a power of two)
            kv = KVCache(3, 3 * B + 1 if paged else B, 48, 3, 5, device=DEV,
                         num_blocks=3 * B if paged else None)
            kv.k_all.copy_(torch.randn(kv.k_all.shape, generator=torch.Generator().manual_seed(B)))
            kv.v_all.copy_(-kv.k_all)
            drafts = _drafts(seq, cands, allowed, held, tables, paged)
            # (the inputs' uploads outside the block: on CUDA each is a copy launched)
            up, tgt = torch.from_numpy(drafts.host).to(DEV), target.to(DEV)
            with counting(as_cuda=True) as c:
                res = step.device_step(drafts, tgt, kv, up)
            out[kernel] = res.cpu(), kv.k_all.cpu(), kv.v_all.cpu(), c.count
        (r0, k0, v0, n0), (r1, k1, v1, n1) = out[False], out[True]
        assert torch.equal(r0, r1), (B, r0, r1)
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
        accepted += int((r0[:, 0] > 0).sum())
        assert n1 == 1 and n0 >= 30, (n0, n1)   # (one launch)
    assert accepted > 8   # (drafts accepted: the case is not vacuous)


def test_a_launch_inside_a_counting_block_is_counted_as_it_happens():
    """counting()'s live count includes Triton's launches while the block is open (its count
    adds them only as it ends): host_profile --launches reads a step's launches inside one
    block around the whole run."""
    kv = KVCache(2, 4, 64, 3, 5, device=DEV)
    seq, cands, allowed, held, tables, target = _case(np.random.default_rng(0), 4, 2, 2, False)
    drafts = _drafts(seq, cands, allowed, held, tables, False)
    step = GridStep(ContextTable(50, 2, 2), 2, kernel=True)
    up, tgt = torch.from_numpy(drafts.host).to(DEV), target.to(DEV)   # (outside: copies on CUDA)
    with counting(as_cuda=True) as c:
        before = c.live()
        step.device_step(drafts, tgt, kv, up)
        inside = c.live() - before
    assert inside == 1 and c.count == 1 and c.live() == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tests' model runs on the CPU")
def test_a_grid_run_on_the_kernel_is_a_grid_run(model, monkeypatch):
    """A whole Self-Draft run on the grid, verifying with the kernel: ar's output and the
    same acceptance as the tensor operations give."""
    from helpers import run_ids
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5, [3, 4] * 12]
    ref, _ = run_ids(model, prompts, max_tokens=32)
    hist = {}
    for kernel in (False, True):
        monkeypatch.setattr(GridStep, "kernel", kernel)
        dr = SelfDraftDrafter(SelfDraftParams(branches=0, context_cands=4, prompt_grams=True,
                                              grid=True), None, vocab=model.cfg.vocab_size)
        launched = LAUNCHES[0]
        got, stats = run_ids(model, prompts, batch_size=4, max_tokens=32, drafter=dr)
        assert got == ref and (LAUNCHES[0] > launched) == kernel   # (the kernel ran, or not)
        hist[kernel] = stats.accept_hist
    assert hist[True] == hist[False] and sum(k * n for k, n in hist[True].items()) > 0


def test_a_run_checks_the_kernel_as_it_starts_and_falls_back_where_it_fails(monkeypatch):
    """GridStep.warm (a run's start) compiles the kernel and checks it against the tensor
    operations: where it agrees the steps use it; where it differs, or cannot run, a warning
    says so and the tensor operations verify."""
    kv = KVCache(2, 4, 64, 3, 5, device=DEV)
    step = GridStep(ContextTable(50, 4, 4), 4, kernel=True)
    step.warm(kv)
    assert step.kernel is True
    verify = grid_kernel.verify

    def off_by_one(*a):
        return verify(*a) + 1

    def broken(*a):
        raise RuntimeError("no kernel image for this device")
    for bad, says in ((off_by_one, "differs"), (broken, "no kernel image")):
        monkeypatch.setattr(grid_kernel, "verify", bad)
        step = GridStep(ContextTable(50, 4, 4), 4, kernel=True)
        with pytest.warns(UserWarning, match=says):
            step.warm(kv)
        assert step.kernel is False and step._kernel(kv.k_all.device) is None
