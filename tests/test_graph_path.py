"""The GPU fast path's logic, on the CPU: CUDA-graph bookkeeping with eager "replays"
(engine/graphs.py, capture=False) and the FlexAttention backend against SDPA.

What only a GPU can show (the capture itself, compiled kernels, speed) is in test_gpu.py."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from helpers import (HostReads, method_drafters, prefill_slots, random_prompts, run_ids,
                     tree_input)
from specctl.engine.attention import flex_attention, sdpa_attention, sdpa_meta
from specctl.engine.batch import ForwardBatch, SeqInput, tree_closure
from specctl.engine.graphs import CudaGraphs
from specctl.engine.kv import KVCache
from specctl.engine.loader import load_model
from specctl.runtime.step.grid import GridStep
from specctl.speculative.context_table import ContextTable
from specctl.speculative.kangaroo import Adapter, KangarooDrafter, KangarooParams
from specctl.speculative.self_draft import branch_probe, build_trie
from specctl.speculative.sampling import SamplingParams


@pytest.fixture(scope="module")
def eager(tiny_llama):
    return load_model(tiny_llama, "cpu", "fp32")


@pytest.fixture(scope="module")
def reference(eager):
    prompts = random_prompts(9, seed=5)
    ref, _ = run_ids(eager, prompts, batch_size=1, max_tokens=20)
    return prompts, ref


def graph_model(path, attention="sdpa"):
    m = load_model(path, "cpu", "fp32")
    m.set_attention(attention)
    m.graphs = CudaGraphs(m, capture=False)
    return m


@pytest.mark.parametrize("batch_size, attention", [(1, "sdpa"), (4, "sdpa"), (4, "flex")])
def test_graph_path_is_lossless(tiny_llama, eager, reference, attention, batch_size):
    """Every method through the graph path (padded steps, static buffers, scratch slot, heads,
    hidden-state inputs), with either attention backend: greedy output equals ar's, and the
    drafts accepted equal those of the eager path (the same drafts were made). (Flex runs its
    unfused reference here, over the whole cache: slow, so at one batch size.)"""
    prompts, ref = reference
    m = graph_model(tiny_llama, attention)
    plain = method_drafters(eager, prompts, ref)
    keys = set()   # (each method's graphs: a method whose KV cache has another shape, as
    for name, dr in method_drafters(m, prompts, ref).items():   # Self-Draft's with its job
        before = m.graphs.replays                                # cache, captures anew)
        got, stats = run_ids(m, prompts, batch_size=batch_size, max_tokens=20, drafter=dr)
        keys |= set(m.graphs.cache)
        assert got == ref, name
        assert m.graphs.replays > before, name
        if dr is not None:
            _, want = run_ids(eager, prompts, batch_size=batch_size, max_tokens=20,
                              drafter=plain[name])
            assert stats.accept_hist == want.accept_hist, name
            assert sum(k * n for k, n in stats.accept_hist.items()) > 0, name
    shapes = {(key[0], key[1]) for key in keys}
    assert all(n & (n - 1) == 0 for _, n in shapes)   # the grid: powers of two
    heads = {key[3] for key in keys}
    assert ("kangaroo", 1) in heads   # its draft forwards replayed as graphs
    plans = {key[2].start for key in keys}
    assert 1 in plans                 # and so did its verify from the exit layer


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_captured_forwards_never_read_the_device(tiny_llama, reference, monkeypatch, attention):
    """What a CUDA graph captures (every method's forwards: ar, chains, trees with branches,
    Kangaroo's head and its verify from hidden states) does nothing that syncs with the host or
    that a capture cannot hold (helpers.HostReads). Flex's kernel is left out: on CUDA it is
    compiled whole (fullgraph), so it cannot hide a host read."""
    from specctl.engine import attention as A
    prompts, ref = reference
    m = graph_model(tiny_llama, attention)
    reads = HostReads()
    kernel = A._flex_kernel("cpu")
    monkeypatch.setattr(A, "_flex_kernel", lambda device_type: reads.outside(kernel))
    forward, shapes = m.graphs._forward, set()

    def recorded(kv, Bb, n, C, plan, *args, **kwargs):
        shapes.add((n, plan.start))
        with reads:
            return forward(kv, Bb, n, C, plan, *args, **kwargs)
    monkeypatch.setattr(m.graphs, "_forward", recorded)
    for name, dr in method_drafters(m, prompts[:4], ref[:4]).items():
        got, _ = run_ids(m, prompts[:4], batch_size=4, max_tokens=8, drafter=dr)
        assert got == [r[:8] for r in ref[:4]], name
        assert reads.found == [], (name, sorted(set(reads.found)))
    ns = {n for n, _ in shapes}
    assert 1 in ns and max(ns) >= 16 and (8, 0) in shapes and any(s for _, s in shapes), shapes
    # (single tokens, Self-Draft's trees, draft-verify's chains, Kangaroo's verify from layer l)


@pytest.mark.parametrize("bad", ["item", "tolist", "bool", "nonzero", "mask_index", "tensor",
                                 "no_device", "cpu", "repeat_tensor", "bincount"])
def test_host_reads_catches_what_a_capture_cannot_hold(bad):
    x = torch.arange(6)
    fns = {"item": lambda: x.max().item(), "tolist": lambda: x.tolist(),
           "bool": lambda: bool(x.sum() > 3), "nonzero": lambda: torch.nonzero(x),
           "mask_index": lambda: x[x > 2], "tensor": lambda: torch.tensor([1, 2]) + x[:2],
           "no_device": lambda: torch.arange(6) + x, "cpu": lambda: x.cpu(),
           "repeat_tensor": lambda: x.repeat_interleave(x), "bincount": lambda: x.bincount()}
    reads = HostReads()
    try:
        with reads:
            fns[bad]()
    except (RuntimeError, NotImplementedError):   # a meta tensor mixed with real ones
        assert bad in ("no_device", "tensor")
        return
    assert reads.found, bad
    clean = HostReads()
    with clean:   # while device-side work is not flagged
        torch.where(x > 2, x, 0).cumsum(0).to(torch.float32)[torch.arange(3, device=x.device)]
        x.repeat_interleave(2)
        x.repeat_interleave(x, output_size=15)
    assert clean.found == []


def _graphs_and_twin(kind, m, eager, adapter, prompts, ref):
    """A Kangaroo drafter of `kind` on the graph model (its own copy of the adapter) decodes as
    its eager twin does: ar's tokens and the same acceptance. Returns (it, its RunStats)."""
    dr = kind(m, Adapter(m, 1, {k: t.clone() for k, t in adapter.w.items()}),
              SamplingParams(), KangarooParams(eta=0.3))
    got, stats = run_ids(m, prompts, batch_size=4, max_tokens=20, drafter=dr)
    twin = kind(eager, adapter, SamplingParams(), KangarooParams(eta=0.3))
    _, want = run_ids(eager, prompts, batch_size=4, max_tokens=20, drafter=twin)
    assert got == ref and stats.accept_hist == want.accept_hist
    return dr, stats


def test_kangaroo_graphs_follow_a_new_adapter(tiny_llama, eager, reference):
    """A second drafter with other adapter weights replays the same graphs (the kept head is
    loaded with its weights) and drafts exactly as its eager twin does."""
    prompts, ref = reference
    m = graph_model(tiny_llama)
    g = torch.Generator().manual_seed(0)
    noisy = Adapter.init_from_model(eager, 1)
    for t in noisy.w.values():
        t.add_(0.05 * torch.randn(t.shape, generator=g))
    for adapter in (Adapter.init_from_model(eager, 1), noisy):
        _graphs_and_twin(KangarooDrafter, m, eager, adapter, prompts, ref)
    assert len([k for k in m.graphs.kept if k[0] == "kangaroo"]) == 1


def _attention_cases(model):
    """Packed batches of every layout: uniform chains, mixed lengths, a tree with branches."""
    prompts = random_prompts(3, seed=7)
    nodes = build_trie([[5, 6, 7], [5, 8]], 10).extend(branch_probe([[9, 10], [11]]))
    return prompts, [
        [SeqInput(s, [4], len(p)) for s, p in enumerate(prompts)],
        [SeqInput(s, [4, 5, 6][:s + 1], len(p)) for s, p in enumerate(prompts)],
        [tree_input(s, 3, nodes, len(p)) if s != 1 else SeqInput(s, [4, 5], len(p))
         for s, p in enumerate(prompts)],
        [SeqInput(2, [4, 5], len(prompts[2])), SeqInput(0, [6], len(prompts[0]))],  # slot order
    ]


def test_flex_attention_equals_sdpa(eager):
    c = eager.cfg
    prompts, cases = _attention_cases(eager)
    kv = prefill_slots(eager, KVCache(c.num_layers, 4, 256, c.num_kv_heads, c.head_dim,
                                      spare=True), prompts)
    g = torch.Generator().manual_seed(1)
    for seqs in cases:
        b = ForwardBatch(seqs)
        q = torch.randn(b.num_tokens, c.num_heads, c.head_dim, generator=g)
        meta = sdpa_meta(b, kv)
        want = sdpa_attention(q, kv.k[0], kv.v[0], meta)
        torch.testing.assert_close(flex_attention(q, kv.k[0], kv.v[0], meta), want,
                                   atol=1e-5, rtol=1e-5)


def test_flex_block_mask_lists_own_slot_blocks(eager):
    """The block mask reads only the sequence's own slot, and no block past its length."""
    from specctl.engine.attention import flex_block_mask
    b = ForwardBatch([SeqInput(2, [4, 5], 130), SeqInput(0, [6], 3)])
    kv = KVCache(1, 4, 256, eager.cfg.num_kv_heads, eager.cfg.head_dim)
    bm = flex_block_mask(sdpa_meta(b, kv), num_slots=4, max_len=256)
    assert bm.kv_num_blocks.view(-1).tolist() == [2, 1]     # 132 rows -> 2 blocks; 4 -> 1
    idx = bm.kv_indices.view(2, -1)
    assert idx[0, :2].tolist() == [4, 5] and idx[1, :1].tolist() == [0]


def test_flex_needs_block_aligned_cache(eager):
    c = eager.cfg
    kv = KVCache(1, 1, 100, c.num_kv_heads, c.head_dim)
    b = ForwardBatch([SeqInput(0, [4], 0)])
    q = torch.zeros(1, c.num_heads, c.head_dim)
    with pytest.raises(ValueError, match="multiple of 128"):
        flex_attention(q, kv.k[0], kv.v[0], sdpa_meta(b, kv))
    eager.set_attention("flex")
    try:
        assert eager.new_kv_cache(2, 100).max_len == 128   # the model rounds its caches up
    finally:
        eager.set_attention("sdpa")
    with pytest.raises(ValueError, match="unknown attention"):
        eager.set_attention("xformers")


@pytest.mark.slow
def test_compiled_flex_equals_sdpa(eager):
    """The compiled kernel (what CUDA runs) honours the block indices (the unfused reference
    ignores them), and new masks of one shape (a graph's step after step) do not recompile."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention as raw
    from specctl.engine import attention as A
    c = eager.cfg
    prompts = random_prompts(4, seed=7)
    kv = prefill_slots(eager, KVCache(c.num_layers, 4, 256, c.num_kv_heads, c.head_dim,
                                      spare=True), prompts)
    R, KV, hd = kv.k[0].shape
    Lm = kv.block
    S = R // Lm
    k = kv.k[0].view(1, S * Lm, KV, hd).transpose(1, 2)
    v = kv.v[0].view(1, S * Lm, KV, hd).transpose(1, 2)
    compiled = torch.compile(raw)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    g = torch.Generator().manual_seed(2)
    n = 3
    for slots, prefix in (([0, 1, 2], [20, 25, 30]), ([3, 0, 4], [200, 130, 5]),
                          ([2, 2, 1], [126, 0, 252])):
        slots, prefix = torch.tensor(slots), torch.tensor(prefix)
        limit = prefix[:, None] + torch.arange(n)[None, :]
        mask = torch.arange(Lm)[None, None, :] <= limit[:, :, None]       # [B, n, Lm]
        meta = A.SdpaMeta(slots, Lm, None, Lm, n, True, None, None, mask[:, None])
        q = torch.randn(3 * n, c.num_heads, hd, generator=g)
        want = sdpa_attention(q, kv.k[0], kv.v[0], meta)
        out = compiled(A._per_seq(q, meta), k, v, block_mask=A.flex_block_mask(meta, S, Lm),
                       enable_gqa=True)
        torch.testing.assert_close(A._packed(out, meta, q.shape[0]), want, atol=1e-5, rtol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_graph_path_samples_as_eager(tiny_llama, eager, reference):
    """Sampling through the graph path (static outputs read by the drafters' and the
    verifier's read-backs) draws exactly what the eager path draws, per request."""
    prompts, ref = reference
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
    m = graph_model(tiny_llama)
    for name, dr in method_drafters(m, prompts, ref).items():
        if dr is not None:
            dr.sp = sp
        got, _ = run_ids(m, prompts, batch_size=4, max_tokens=12, drafter=dr, sampling=sp)
        twin = method_drafters(eager, prompts, ref)[name]
        if twin is not None:
            twin.sp = sp
        want, _ = run_ids(eager, prompts, batch_size=4, max_tokens=12, drafter=twin, sampling=sp)
        assert got == want, name


class _LeanEvery2(KangarooDrafter):
    """Kangaroo that may draft nothing at every other step (`auto`'s lean steps), counting the
    replays of the steps that draft nothing."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.steps, self.lean_replays = 0, []

    def propose(self, seqs, kv, limits):
        self.steps += 1
        if self.steps % 2:
            limits = dataclasses.replace(limits, room=tuple(0 for _ in limits.room))
        self._r = self.model.graphs.replays if self.model.graphs is not None else 0
        return super().propose(seqs, kv, limits)

    def verify_hidden(self, batch, kv, seqs, proposals):
        h = super().verify_hidden(batch, kv, seqs, proposals)
        if self.model.graphs is not None and all(p.whole for p in proposals):
            self.lean_replays.append(self.model.graphs.replays - self._r)
        return h


def test_kangaroo_step_without_drafts_is_one_replay(tiny_llama, eager, reference):
    """A Kangaroo step that drafts nothing is one whole-model replay whose captured layer-l
    states write the adapter's rows (not a shallow and a deep forward: ar's cost, not ~8% more
    as on the H100 at 237d5df), and decoding stays what the eager path does."""
    prompts, ref = reference
    m = graph_model(tiny_llama)
    dr, stats = _graphs_and_twin(_LeanEvery2, m, eager, Adapter.init_from_model(eager, 1),
                                 prompts, ref)
    assert sum(k * n for k, n in stats.accept_hist.items()) > 0   # (the other steps draft)
    assert dr.lean_replays and set(dr.lean_replays) == {1}
    assert ("kangaroo-whole", 1) in {key[3] for key in m.graphs.cache}


def _staged(batch, Bb: int, n: int, scratch: int):
    """What a padded step stages, a sequence at a time (the layout the module docstring
    states): tokens [Bb * n] (a sequence's real rows first, then its last token again; batch
    rows past it the scratch slot's), slots and prefixes [Bb], the padded row of each real one,
    and (n > 1) each row's parent row [Bb * n]: a tree's node's its parent's (the root: row
    0), every other row's the row before it (row 0: itself)."""
    cu, counts = batch.cu_seqlens, batch.num_new
    toks = [0] * cu[-1] if batch.fill is not None else list(batch.token_list)
    tok, real = [0] * (Bb * n), []
    par = [max(j - 1, 0) for _ in range(Bb) for j in range(n)]
    for b, k in enumerate(counts):
        o = b * n
        tok[o:o + n] = toks[cu[b]:cu[b + 1]] + [toks[cu[b + 1] - 1]] * (n - k)
        real += range(o, o + k)
        if batch.template is not None:
            par[o:o + k] = batch.template_parents.tolist()
        elif batch.seqs[b].parents is not None:
            par[o + 1:o + k] = [p + 1 for p in batch.seqs[b].parents]
    slots = list(batch.seq_slots) + [scratch] * (Bb - len(counts))
    prefix = list(batch.prefix_lens) + [0] * (Bb - len(counts))
    return tok + slots + prefix, real, par if n > 1 else []


def _filled_as_eagerly(batch) -> None:
    """A grid batch's rows as its replay filled them (ForwardBatch.filled) are an eager
    gather's (GridFill), but for the columns past them no one reads."""
    from specctl.runtime.step.grid import CANDS
    C, G = batch.chains
    w = CANDS + C * G + C
    up = torch.zeros(len(batch.up), batch.fill.width(C, G, batch.up.shape[1]), dtype=torch.long)
    up[:, :batch.up.shape[1]] = torch.from_numpy(batch.up)
    batch.fill(up, torch.from_numpy(batch.fill.index(C, G, 1 + C * G, up.shape[1] - 1)),
               1 + C * G)
    assert torch.equal(batch.filled[:, :w], up[:, :w])


@pytest.mark.parametrize("seed", range(4))
def test_a_padded_step_is_staged_as_its_sequences_are_laid_out(tiny_llama, seed):
    """The graph path stages a step's batch in whole arrays (not a loop over its sequences,
    which at batch 64 cost a grid step ~300 us of host a step): what it stages equals the
    layout written out a sequence at a time, and the masks and positions the graph lays out
    from it (tree_closure) are the batch's own, for ragged steps of chains and trees, for
    padded chains, for steps whose every sequence is a tree, and for grid steps (one template
    for all) between other steps."""
    rng = random.Random(seed)
    m = graph_model(tiny_llama)
    B = rng.choice([3, 5, 7])
    kv = m.new_kv_cache(8, 128)   # (buckets of 4 and 8: B < Bb, padded batch rows)
    seqs = []
    for s in range(B):
        k = rng.randrange(1, 12)
        toks = [rng.randrange(3, 300) for _ in range(k)]
        base = rng.randrange(0, 40)
        if rng.random() < 0.5 and k > 1:   # a tree: each node's parent an earlier one
            seqs.append(SeqInput(s, toks, base, parents=[rng.randrange(-1, j) for j in
                                                         range(k - 1)]))
        else:
            seqs.append(SeqInput(s, toks, base))
    table = ContextTable(m.cfg.vocab_size, 10, 4)   # (candidates, so a padding row's token,
    table.push_texts([[rng.randrange(3, 12) for _ in range(60)]])   # its last real one, is not 0)
    grid = GridStep(table, 3)
    for s in range(8):
        kv.lens[s] = 10 + s

    def grid_batch(b, at=10):
        return grid.plan(list(range(b)), [at + s for s in range(b)],
                         list(range(at - 7, b + at - 7)), [9] * b, None, kv, "cpu")[0]
    gbatch, other = grid_batch(B), grid_batch({3: 4, 5: 7, 7: 5}[B])   # (one bucket)
    gbatch2 = grid_batch(B, 12)   # (the next step's: its shape, other tokens and lengths)
    ragged = ForwardBatch(seqs, "cpu")
    trees = ForwardBatch([SeqInput(s, [rng.randrange(3, 300) for _ in range(k)], 5 + s,
                                   parents=[rng.randrange(-1, j) for j in range(k - 1)])
                          for s, k in enumerate(rng.choices(range(2, 13), k=B))], "cpu")
    assert trees.tree_rows and not ragged.tree_rows
    big = ForwardBatch([SeqInput(s, [rng.randrange(3, 300) for _ in range(41)], 5 + s,
                                 parents=[rng.randrange(-1, j) for j in range(40)])
                        for s in range(8)], "cpu")   # (past ROWS_NODES: tree_nodes' arrays)
    one = ForwardBatch([SeqInput(2, [rng.randrange(3, 300) for _ in range(9)], 7,
                                 parents=[rng.randrange(-1, j) for j in range(8)])], "cpu")
    same = ForwardBatch([SeqInput(s, [rng.randrange(3, 300) for _ in range(5)], 9 + s)
                         for s in range(B)], "cpu")   # (every sequence as many rows)
    chains, chains2 = (ForwardBatch([SeqInput(s, [3] * rng.randrange(9, 17), 20 + s)
                                     for s in range(B)], "cpu") for _ in range(2))
    # (each staging lays out every row and parent, whatever the step before it staged: a
    # grid's after another batch size's of the same template, after chains, after trees, and
    # after the same shape's, whose padding, real rows and parents it keeps)
    for batch in (ragged, gbatch, gbatch2, gbatch, other, gbatch, chains, chains, chains2,
                  chains, gbatch, gbatch2, other, other, ragged, trees, ragged, trees, big,
                  trees, big, one, chains, one, same, gbatch2):
        m.run(batch, kv)
        fill = None if batch.fill is None else batch.fill.key
        (Bb, n, *_), cap = next((k, c) for k, c in m.graphs.cache.items()
                                if k[0] == m.graphs.bucket(len(batch.num_new), kv.num_slots)
                                and k[1] == m.graphs.padded_n(max(batch.num_new))
                                and k[5] == fill)
        if fill is not None:   # (its tokens: gathered in the forward, as eagerly)
            _filled_as_eagerly(batch)
        with torch.inference_mode():
            padded = m.graphs._stage_inputs(cap, batch, kv, Bb, n)
        assert padded == any(k != n for k in batch.num_new)
        head, real, par = _staged(batch, Bb, n, kv.scratch)
        ints, T = cap.ints.tolist(), batch.num_tokens
        if fill is not None:   # (no tokens staged)
            head, ints = head[Bb * n:], ints[Bb * n:]
        assert ints[:len(head)] == head
        assert ints[len(head):len(head) + T] == real   # (the rest of `real`: unread)
        assert ints[len(head) + Bb * n:][:len(par)] == par   # (a grid's rows and index after)
        # what the graph lays out from them, each real row's mask and position, is what an
        # eager forward reads (the batch's own layout)
        if n > 1:
            local, depth = tree_closure(cap.parents.view(Bb, n))
        else:
            local, depth = torch.ones(Bb, 1, 1, dtype=torch.bool), torch.zeros(Bb, 1)
        for b, k in enumerate(batch.num_new):
            want = batch.local[b] if b in batch.masked else np.tri(k, dtype=bool)
            assert torch.equal(local[b, :k, :k], torch.from_numpy(np.array(want[:k, :k])))
            pos = (batch.prefix_lens[b] + depth[b, :k]).tolist()
            assert pos == list(batch.position_list[batch.cu_seqlens[b]:][:k])


def test_staging_a_padded_step_makes_as_many_python_calls_at_any_batch(tiny_llama):
    """Staging a grid step's padded batch for its replay, or a step of padded chains', calls
    the same Python and C functions at 2 sequences as at 12: nothing is done a sequence at a
    time (nor is a mask staged: the graph lays it out from each row's parent)."""
    m = graph_model(tiny_llama)
    kv = m.new_kv_cache(16, 128)
    grid = GridStep(ContextTable(m.cfg.vocab_size, 10, 4), 4)
    made, again, tree = {}, {}, {}

    def calls(fn) -> Counter:
        counts = Counter()

        def prof(frame, event, arg):
            if event in ("call", "c_call"):
                counts[getattr(arg, "__name__", None) if event == "c_call"
                       else frame.f_code.co_name] += 1
        sys.setprofile(prof)
        try:
            with torch.inference_mode():
                fn()
        finally:
            sys.setprofile(None)
        return counts
    for B in (2, 12):
        for s in range(B):
            kv.lens[s] = 10
        batch, _ = grid.plan(list(range(B)), [10] * B, list(range(5, 5 + B)), [9] * B, None,
                             kv, "cpu")
        m.run(batch, kv)   # (captures, eagerly)
        Bb, n = m.graphs.bucket(B, kv.num_slots), m.graphs.padded_n(batch.num_new[0])
        assert n > batch.num_new[0]   # (17 rows padded to 32)
        cap = m.graphs.cache[next(k for k in m.graphs.cache
                                  if k[:2] == (Bb, n) and k[5] == batch.fill.key)]
        chains = ForwardBatch([SeqInput(s, [3] * (17 + s % 9), 10) for s in range(B)], "cpu")
        m.run(chains, kv)
        trees = ForwardBatch([SeqInput(s, [3] * (17 + s % 9), 10,
                                       parents=[-1] + [j // 2 for j in range(15 + s % 9)])
                              for s in range(B)], "cpu")
        m.run(trees, kv)
        plain = m.graphs.cache[next(k for k in m.graphs.cache
                                    if k[:2] == (Bb, n) and k[5] is None)]
        made[B] = calls(lambda: m.graphs._stage_inputs(cap, batch, kv, Bb, n))
        again[B] = calls(lambda: m.graphs._stage_inputs(plain, chains, kv, Bb, n))
        tree[B] = calls(lambda: m.graphs._stage_inputs(plain, trees, kv, Bb, n))
    assert made[2] == made[12] and again[2] == again[12] and tree[2] == tree[12]
    assert sum(made[2].values()) > 10


def test_a_tree_step_through_the_graph_path_is_never_laid_out_on_the_host(tiny_llama,
                                                                           monkeypatch):
    """A replay lays out a step's trees on the device from their parents: the host makes the
    batch, checks its trees and stages it, and never runs tree_layout (a b8 Self-Draft step's
    took ~80 us of its host warm); an eager forward does (its positions and masks)."""
    from specctl.engine import batch as batch_mod
    m = graph_model(tiny_llama)
    kv = m.new_kv_cache(4, 128)
    nodes = build_trie([[5, 6, 7], [5, 8]], 10).extend(branch_probe([[9, 10], [11]]))
    seqs = [SeqInput(s, [3] + nodes.tokens, 10, parents=nodes.parents) for s in range(3)]
    for s in range(3):
        kv.lens[s] = 10
    laid = []
    real = batch_mod.tree_layout
    monkeypatch.setattr(batch_mod, "tree_layout", lambda *a: laid.append(1) or real(*a))
    m.run(ForwardBatch(seqs, "cpu"), kv)
    assert m.graphs.replays == 1 and not laid
    m.graphs = None
    m.run(ForwardBatch(seqs, "cpu"), kv)
    assert laid


def test_a_grid_steps_states_are_a_view_of_the_replays_rows(tiny_llama, eager):
    """A grid step's states (ForwardBatch.grid: m rows each of B sequences, padded to n on the
    graph) come back as [B, m, D], a view of the replay's output buffer, not a gather of its
    rows (a copy that took ~50 us of a b64 step's host on a CPU); they are an eager
    forward's, and so is their argmax."""
    m = graph_model(tiny_llama)
    kvs = [x.new_kv_cache(8, 128) for x in (m, eager)]
    keys = torch.randn(kvs[1].k_all.shape, generator=torch.Generator().manual_seed(0))
    for kv in kvs:   # (the graph's cache has a scratch slot's rows after the others)
        kv.k_all[:, :keys.shape[1]].copy_(keys)
        kv.v_all[:, :keys.shape[1]].copy_(-keys)
        for s in range(5):
            kv.lens[s] = 10 + s
    table = ContextTable(m.cfg.vocab_size, 10, 4)
    table.push_texts([[random.Random(1).randrange(3, 12) for _ in range(60)]])
    batch, _ = GridStep(table, 3).plan(list(range(5)), [10 + s for s in range(5)],
                                       list(range(3, 8)), [9] * 5, None, kvs[0], "cpu")
    h, want = m.run(batch, kvs[0]), eager.run(batch, kvs[1])
    B, k = 5, batch.num_new[0]
    assert m.graphs.replays == 1 and m.graphs.padded_n(k) > k
    cap = next(iter(m.graphs.cache.values()))
    assert h.shape == want.shape == (B, k, m.cfg.hidden_size)
    assert h.untyped_storage().data_ptr() == cap.outputs[0].untyped_storage().data_ptr()
    torch.testing.assert_close(h, want)
    assert torch.equal(m.argmax(h), eager.argmax(want))


def test_a_new_cache_lets_the_last_one_go_after_a_grid_step(tiny_llama):
    """What the staging keeps of the last step it laid out (CudaGraphs._last: a grid step's
    shape) holds its graph weakly: a model's new cache of another shape lets the old cache go
    before it is made (Model.new_kv_cache: a 7B model's cache is most of a GPU), grid step
    or not."""
    import gc
    import weakref
    m = graph_model(tiny_llama)
    kv = m.new_kv_cache(8, 128)
    for s in range(3):
        kv.lens[s] = 10
    table = ContextTable(m.cfg.vocab_size, 10, 4)
    table.push_texts([[random.Random(2).randrange(3, 12) for _ in range(60)]])
    batch, _ = GridStep(table, 3).plan([0, 1, 2], [10] * 3, [3, 4, 5], [9] * 3, None, kv, "cpu")
    m.run(batch, kv)
    assert m.graphs._last is not None   # (a template's layout, kept)
    old = weakref.ref(kv)
    del kv, batch
    m.new_kv_cache(4, 256)
    gc.collect()
    assert old() is None
