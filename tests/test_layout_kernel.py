"""A replay's layout kernel (engine/layout_kernel.py, CUDA's), compiled on a GPU, else under
Triton's interpreter on the CPU: the masks and positions batch.tree_closure lays out, in one
launch; and the check that keeps it off a device where it differs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers import triton_module
from specctl.engine.batch import tree_closure
from specctl.engine.graphs import checked_kernel

layout_kernel = triton_module("specctl.engine.layout_kernel")
from specctl.engine.bi_matmul import LAUNCHES  # noqa: E402  (after: the interpreter, set there)
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # (compiled there, else interpreted)


def _parents(rng: random.Random, B: int, n: int) -> torch.Tensor:
    """Every row's parent: trees of random shapes and sizes (a parent before its row, the
    root its own), then chain rows (padding), as CudaGraphs stages them."""
    par = np.tile(np.maximum(np.arange(n) - 1, 0), (B, 1))
    for b in range(B):
        k = rng.randrange(1, n + 1)
        deep = rng.random() < 0.3   # (a chain as deep as the rows allow)
        for j in range(1, k):
            par[b, j] = j - 1 if deep else rng.randrange(0, j)
    return torch.from_numpy(par)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128])
def test_the_kernel_lays_out_what_tree_closure_does(n):
    rng = random.Random(n)
    for most in (n, 128):   # (compiled for this n, or for the grid's largest)
        par, prefix = _parents(rng, 5, n).to(DEV), torch.tensor([0, 7, 300, 1, 42]).to(DEV)
        before = LAUNCHES[0]
        anc, pos = layout_kernel.layout(par, prefix, most)
        assert LAUNCHES[0] == before + 1
        local, depth = tree_closure(par)
        assert torch.equal(anc, local)
        assert torch.equal(pos.view(5, n), prefix[:, None] + depth)


def test_a_kernel_that_differs_is_not_used(monkeypatch):
    assert checked_kernel(torch.device(DEV), 16) is layout_kernel
    good = layout_kernel.layout

    def off_by_one(par, prefix, most=None):
        anc, pos = good(par, prefix, most)
        return anc, pos + (par.shape[1] == 8)
    monkeypatch.setattr(layout_kernel, "layout", off_by_one)
    with pytest.warns(UserWarning, match="differs from tree_closure at n = 8"):
        assert checked_kernel(torch.device(DEV), 16) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tests' model runs on the CPU (on "
                    "CUDA, tests/test_gpu.py replays trees through the kernel in real graphs)")
def test_a_replay_through_the_kernel_decodes_as_eagerly(tiny_llama):
    """Self-Draft's tries and branches, chains and a padded batch row through the graph path
    with the kernel laying out their masks and positions: the states the eager forward
    computes (the kernel inside the captured function, as on CUDA)."""
    from helpers import prefill_slots, random_prompts
    from specctl.engine.batch import ForwardBatch, SeqInput
    from specctl.engine.graphs import CudaGraphs
    from specctl.engine.kv import KVCache
    from specctl.engine.loader import load_model
    from specctl.speculative.self_draft import branch_probe, build_trie
    m = load_model(tiny_llama, "cpu", "fp32")
    c, prompts = m.cfg, random_prompts(3, seed=4)
    nodes = build_trie([[5, 6, 7], [5, 8], [9]], 10).extend(branch_probe([[9, 10], [11]]))

    def primed():
        return prefill_slots(m, KVCache(c.num_layers, 4, 64, c.num_kv_heads, c.head_dim,
                                        spare=True), prompts)
    seqs = [SeqInput(0, [3] + nodes.tokens, len(prompts[0]), parents=nodes.parents),
            SeqInput(1, [3, 4, 5], len(prompts[1])),
            SeqInput(2, [7] + nodes.tokens[:4], len(prompts[2]), parents=nodes.parents[:4])]
    batch = ForwardBatch(seqs)
    want = m.run(batch, primed())
    m.graphs = CudaGraphs(m, capture=False)
    m.graphs._kernel = layout_kernel
    before = LAUNCHES[0]
    got = m.run(batch, primed())
    assert m.graphs.replays == 1 and LAUNCHES[0] > before   # (replayed, through the kernel)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
