"""Tree inputs as arrays: every tree of a step laid out at once (ancestor masks, depths,
positions) equals the per-tree definitions (a node's row is its parent's plus itself;
DraftTree.depths), bad parents are refused, and the attention mask places them the same way on
the host and by the device's scatter."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specctl.engine import batch
from specctl.engine.attention import _place_local
from specctl.engine.batch import FULL, ForwardBatch, SeqInput, tree_closure, tree_layout
from specctl.speculative.verify import DraftTree


def _mask(t: DraftTree) -> torch.Tensor:
    """[n+1, n+1] over [root, nodes], node by node: each row sees itself and its ancestors."""
    m = torch.eye(len(t) + 1, dtype=torch.bool)
    m[:, 0] = True
    for j, p in enumerate(t.parents):
        if p >= 0:
            m[j + 1] |= m[p + 1]
    return m


def _random_tree(rng: random.Random, n: int) -> DraftTree:
    return DraftTree([rng.randrange(100) for _ in range(n)],
                     [rng.randrange(-1, j) for j in range(n)])


@pytest.mark.parametrize("count", [1, 3, 30])   # (Python bit rows up to ROWS_NODES nodes, then numpy)
def test_layout_of_a_batch_equals_each_trees_own(count):
    rng = random.Random(count)
    trees = [_random_tree(rng, rng.choice([0, 1, 3, 17, 40, 70])) for _ in range(count)]
    assert (sum(map(len, trees)) > batch.ROWS_NODES) == (count == 30)
    n = 1 + max(len(t) for t in trees)
    anc, depth = tree_layout([t.parents for t in trees], n)
    for b, t in enumerate(trees):
        k = len(t) + 1
        assert np.array_equal(anc[b, :k, :k], _mask(t).numpy())
        assert depth[b, :k].tolist() == [0] + t.depths()
        assert np.array_equal(anc[b, k:, :], np.eye(n, dtype=bool)[k:])   # padding: itself


@pytest.mark.parametrize("others", [0, 400])   # (both ways of laying trees out)
@pytest.mark.parametrize("bad", [[0], [-2], [-1, 1], [-1, 0, 5]])
def test_a_parent_after_its_node_is_refused(bad, others):
    good = [SeqInput(1, [1] * (others + 1), 4, parents=[-1] * others)] if others else []
    with pytest.raises(ValueError, match="slot 0: draft tree node .* must precede it"):
        ForwardBatch(good + [SeqInput(0, [1] * (len(bad) + 1), 4, parents=bad)])


def test_a_tree_sets_its_own_positions_and_mask():
    with pytest.raises(ValueError):
        SeqInput(0, [1, 2], 0, positions=[0, 1], parents=[-1])
    with pytest.raises(ValueError):
        SeqInput(0, [1, 2, 3], 0, parents=[-1])


def test_positions_and_mask_of_a_mixed_step():
    """Chains, trees and a hand-made mask in one batch: positions are prefix + depth for trees,
    and the attention mask shows each its committed prefix plus what its local mask allows,
    the same by the host's slices and by the scatter used on devices."""
    rng = random.Random(1)
    t1, t2 = _random_tree(rng, 9), _random_tree(rng, 4)
    hand = torch.eye(3, dtype=torch.bool)
    seqs = [SeqInput(0, [1, 2, 3], 11), SeqInput(1, [5] * 10, 7, parents=t1.parents),
            SeqInput(2, [6], 30), SeqInput(3, [7] * 5, 3, parents=t2.parents),
            SeqInput(4, [8, 9, 10], 20, positions=[2, 3, 4], mask=hand)]
    fb = ForwardBatch(seqs)
    assert fb.masked == [1, 3, 4]
    pos = fb.position_list
    cu = fb.cu_seqlens
    assert pos[cu[0]:cu[1]] == [11, 12, 13] and pos[cu[2]:cu[3]] == [30]
    assert pos[cu[1]:cu[2]] == [7 + d for d in [0] + t1.depths()]
    assert pos[cu[3]:cu[4]] == [3 + d for d in [0] + t2.depths()]
    assert pos[cu[4]:cu[5]] == [2, 3, 4]
    n, L = max(fb.num_new), fb.max_kv_len
    base = torch.arange(L)[None, None, :] <= (torch.tensor(fb.prefix_lens)[:, None]
                                               + torch.arange(n)[None, :])[:, :, None]
    host, dev = base.clone(), base.clone()
    _place_local(host, fb, host=True)
    _place_local(dev, fb, host=False)
    assert torch.equal(host, dev)
    for b, (s, ref) in enumerate(zip(seqs, [None, _mask(t1), None, _mask(t2), hand])):
        k, p = len(s.tokens), s.prefix_len
        want = torch.zeros(k, L, dtype=torch.bool)
        want[:, :p] = True
        want[:, p:p + k] = torch.ones(k, k, dtype=torch.bool).tril() if ref is None else ref
        assert torch.equal(host[b, :k], want), b


@pytest.mark.parametrize("count", [3, 40])   # (every sequence a tree: positions from depths)
def test_a_step_of_trees_packs_each_trees_positions_slots_and_rows(count):
    rng = random.Random(count)
    trees = [_random_tree(rng, rng.choice([0, 2, 9, 30])) for _ in range(count)]
    seqs = [SeqInput(7 - b % 5 + 5 * b, [1] * (len(t) + 1), 3 * b + 1, parents=t.parents)
            for b, t in enumerate(trees)]
    fb = ForwardBatch(seqs)
    assert fb.position_list == [s.prefix_len + d for s, t in zip(seqs, trees)
                                for d in [0] + t.depths()]
    assert fb.slots.tolist() == [s.slot for s in seqs for _ in s.tokens]
    assert fb.rows.tolist() == [s.prefix_len + i for s in seqs for i in range(len(s.tokens))]
    assert fb.masked == list(range(count)) and fb.local.shape[0] == count


@pytest.mark.parametrize("seed", range(3))
def test_the_devices_layout_equals_the_hosts(seed):
    """tree_closure (what a replay lays out from each row's parent, engine/graphs.py) equals
    tree_layout for trees, chains, deep chains and padding rows (their own parent: themselves
    only), at every n a graph has."""
    rng = random.Random(seed)
    for n in (2, 3, 4, 8, 16, 32, 64, 128):
        trees = []
        for _ in range(rng.randint(1, 5)):
            k = rng.randrange(n)
            trees.append(list(range(-1, k - 1)) if rng.random() < 0.3 else
                         [rng.randrange(-1, j) for j in range(k)])
        anc, depth = tree_layout(trees, n)
        par = np.tile(np.arange(n), (len(trees), 1))
        for b, ps in enumerate(trees):
            par[b, 0] = 0
            par[b, 1:1 + len(ps)] = np.asarray(ps, dtype=np.int64) + 1
        a, d = tree_closure(torch.from_numpy(par))
        assert np.array_equal(a.numpy(), anc) and np.array_equal(d.numpy(), depth)


def test_a_mask_or_positions_by_hand_run_eagerly(model):
    """A graph lays masks and positions out from parents: a batch whose mask or positions are
    set by hand has none, and runs eagerly (the same states as without graphs)."""
    from helpers import prefill_slots
    from specctl.engine.graphs import CudaGraphs
    from specctl.engine.kv import KVCache
    c = model.cfg
    kv = KVCache(c.num_layers, 2, 64, c.num_kv_heads, c.head_dim, spare=True)
    kv = prefill_slots(model, kv, [[5, 6, 7], [8, 9]])
    hand = [SeqInput(0, [3, 4, 5], 3, mask=torch.eye(3, dtype=torch.bool)),
            SeqInput(1, [3, 4], 2, positions=[2, 2])]
    g = CudaGraphs(model, capture=False)
    for seqs in (hand[:1], hand[1:]):
        batch = ForwardBatch(seqs)
        assert batch.by_hand and g.run(batch, kv, FULL) is None and g.replays == 0
    assert not ForwardBatch([SeqInput(0, [3, 4], 3, parents=[-1])]).by_hand
