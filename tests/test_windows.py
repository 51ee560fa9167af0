"""Sliding-window layers and soft-capped attention in every attention path the CPU runs: SDPA
(and its capped form), FlexAttention's reference, --exact's batch-invariant groups and the
graph path, on packed batches of chains, mixed lengths and trees (whose tokens sit deeper than
their cache columns); and the families' models under --exact and through the graph path."""

from __future__ import annotations

import pytest
import torch

from helpers import kv_budget, method_drafters, prefill_slots, run_ids
from specctl.engine import exact
from specctl.engine.attention import flex_attention, sdpa_attention, sdpa_meta, windowed
from specctl.engine.batch import ForwardBatch
from specctl.engine.graphs import CudaGraphs
from specctl.engine.kv import KVCache
from specctl.engine.loader import load_model
from test_families import PROMPTS, TOKENS, greedy_reference
from test_graph_path import _attention_cases


def _reference(q, kv, batch, window, scale, cap):
    """Attention written out per query: keys of the sequence's committed rows and its visible
    new tokens, those whose position is within `window` of the query's, capped scores."""
    out = torch.empty_like(q)
    t = 0
    for s in batch.seqs:
        n = len(s.tokens)
        pos = batch.positions[t:t + n].tolist()   # (a tree's: prefix + depth)
        for i in range(n):
            cols = [(c, c) for c in range(s.prefix_len)]   # (cache row, position)
            see = [j for j in range(n) if (s.mask[i, j] if s.mask is not None else
                                           (j <= i if s.parents is None else _anc(s, i, j)))]
            cols += [(s.prefix_len + j, pos[j]) for j in see]
            cols = [r for r, p in cols if pos[i] - p < window]
            rows = torch.tensor([s.slot * kv.block + r for r in cols])
            k, v = kv.k[0][rows], kv.v[0][rows]                   # [L, KV, hd]
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            sc = torch.einsum("hd,lhd->hl", q[t + i], k) * scale
            if cap is not None:
                sc = torch.tanh(sc / cap) * cap
            out[t + i] = torch.einsum("hl,lhd->hd", sc.softmax(-1), v)
        t += n
    return out


def _anc(s, i, j) -> bool:
    """Whether new token j is i or an ancestor of i in the sequence's tree."""
    while i >= 0:
        if i == j:
            return True
        i = -1 if i == 0 else s.parents[i - 1] + 1   # (parents index tokens[1:], -1: root)
    return False


@pytest.mark.parametrize("window, cap", [(3, None), (4, 2.0)])
def test_every_backend_masks_the_window(model, window, cap):
    """Each backend's output under a window (and a soft-cap) is the written-out attention's,
    on chains, mixed lengths and a tree with branches."""
    c = model.cfg
    prompts, cases = _attention_cases(model)
    kv = prefill_slots(model, KVCache(c.num_layers, 4, 256, c.num_kv_heads, c.head_dim,
                                      spare=True), prompts)
    g = torch.Generator().manual_seed(2)
    scale = 0.3
    for seqs in cases:
        b = ForwardBatch(seqs)
        q = torch.randn(b.num_tokens, c.num_heads, c.head_dim, generator=g)
        meta = windowed(sdpa_meta(b, kv), b.positions, window)
        want = _reference(q, kv, b, window, scale, cap)
        for attend in (sdpa_attention, flex_attention, exact.exact_attention):
            got = attend(q, kv.k[0], kv.v[0], meta, scale=scale, softcap=cap)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=attend.__name__)


def test_a_window_wider_than_the_context_changes_nothing(model):
    c = model.cfg
    prompts, cases = _attention_cases(model)
    kv = prefill_slots(model, KVCache(c.num_layers, 4, 256, c.num_kv_heads, c.head_dim),
                       prompts)
    b = ForwardBatch(cases[2])
    meta = sdpa_meta(b, kv)
    assert torch.equal(windowed(meta, b.positions, 10_000).mask, meta.mask)
    assert windowed(meta, b.positions, 3) is windowed(meta, b.positions, 3)   # once a forward


def test_a_windowed_family_through_the_graph_path(tmp_path_factory):
    """The graph path's forwards (engine/graphs.py, eager replays on the CPU: its own attention
    metadata) of Gemma 2 (windows on alternate layers, soft-caps): every method's greedy output
    at batch 4 is transformers'."""
    path, ref = greedy_reference("gemma2", tmp_path_factory)
    m = load_model(path, "cpu", "fp32")
    m.graphs = CudaGraphs(m, capture=False)
    for name, dr in method_drafters(m, PROMPTS, ref).items():
        got, _ = run_ids(m, PROMPTS, batch_size=4, max_tokens=24, drafter=dr)
        assert got == [r[:24] for r in ref], name
    assert m.graphs.replays > 0


def test_windows_over_a_paged_cache(tmp_path_factory):
    """Gemma 3's windows and local rope over a paged KV cache that holds 2.5 of the 4
    sequences (blocks taken as rows grow; sequences preempted and prefilled again): ar's and
    self-draft's (trees with branches) output is transformers'."""
    path, ref = greedy_reference("gemma3", tmp_path_factory)
    m = load_model(path, "cpu", "fp32")
    for name, dr in method_drafters(m, PROMPTS, ref).items():
        if name in ("draft-verify", "kangaroo"):   # (their chains are trees without branches)
            continue
        got, _ = run_ids(m, PROMPTS, batch_size=4, max_tokens=TOKENS, drafter=dr, max_len=80,
                         kv_budget=kv_budget(m, dr, 80, 2.5))
        assert got == ref, name


@pytest.mark.slow   # (exact_attention's windows and caps: test_every_backend_masks_the_window)
def test_exact_on_a_windowed_soft_capped_family(tmp_path_factory):
    """--exact (bf16) on Gemma 2 (windows, soft-caps, GeLU-tanh): a long prompt's rows are the
    same bits prefilled alone, among others and in chunks as decoded one at a time, and every
    method at batch 4 gives ar's tokens at batch 1."""
    from test_exact import check_long_prompt
    path, _ = greedy_reference("gemma2", tmp_path_factory)
    m = load_model(path, "cpu", "bf16")
    m.set_exact(True)
    check_long_prompt(m, n=80)
    ref, _ = run_ids(m, PROMPTS, max_tokens=24)
    for name, dr in method_drafters(m, PROMPTS, ref).items():
        got, _ = run_ids(m, PROMPTS, batch_size=4, max_tokens=24, drafter=dr)
        assert got == ref, name
