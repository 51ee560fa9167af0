"""The engine's forward against transformers' reference implementation, and its batch features."""

from __future__ import annotations

import pytest
import torch

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.engine.loader import load_model
from tiny import make_tiny_model


def hf_logits(path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0]


def run_full(model, ids: list[int], slot: int = 0, kv=None):
    kv = kv or model.new_kv_cache(4, 128)
    b = ForwardBatch([SeqInput(slot, ids, 0)])
    return model.logits(model.forward(b, kv)), kv


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama3-rope", "tied"])
def test_logits_match_transformers(kind, tmp_path):
    if kind == "llama3-rope":
        path = make_tiny_model(tmp_path, "llama", rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    elif kind == "tied":
        path = make_tiny_model(tmp_path, "llama", tie=True)
    else:
        path = make_tiny_model(tmp_path, kind)
    ids = list(range(5, 105, 3))  # 34 tokens
    ref = hf_logits(path, ids)
    ours, _ = run_full(load_model(path, "cpu", "fp32"), ids)
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4), (ours - ref).abs().max()


def test_packed_batch_with_prefixes_matches_single(tiny_llama):
    """Prefill in chunks and decode several sequences in one packed step: same logits as alone."""
    model = load_model(tiny_llama, "cpu", "fp32")
    seqs = {0: list(range(10, 30)), 2: list(range(40, 47)), 3: list(range(100, 133))}
    ref = {s: run_full(model, ids)[0] for s, ids in seqs.items()}
    kv = model.new_kv_cache(4, 128)
    # prefill all but the last 3 tokens of each, in two chunks of mixed sizes
    for s, ids in seqs.items():
        cut = (len(ids) - 3) // 2
        for lo, hi in ((0, cut), (cut, len(ids) - 3)):
            model.forward(ForwardBatch([SeqInput(s, ids[lo:hi], lo)]), kv)
        kv.lens[s] = len(ids) - 3
    # one packed step: seq 0 gets 3 tokens, seq 2 gets 3, seq 3 gets 3 — then a ragged step
    before = model.tokens_computed
    batch = ForwardBatch([SeqInput(s, ids[-3:], len(ids) - 3) for s, ids in seqs.items()])
    out = model.logits(model.forward(batch, kv))
    assert model.tokens_computed - before == 9  # sum of real tokens, no padding
    for b, (s, ids) in enumerate(seqs.items()):
        lo = batch.cu_seqlens[b]
        torch.testing.assert_close(out[lo:lo + 3], ref[s][-3:], atol=1e-4, rtol=1e-4)
    # ragged: 1, 2 and 3 new tokens
    kv2 = model.new_kv_cache(4, 128)
    for s, ids in seqs.items():
        model.forward(ForwardBatch([SeqInput(s, ids[:-3], 0)]), kv2)
    news = {0: 1, 2: 2, 3: 3}
    batch = ForwardBatch([SeqInput(s, ids[-3:][:news[s]], len(ids) - 3) for s, ids in seqs.items()])
    out = model.logits(model.forward(batch, kv2))
    assert batch.num_tokens == 6
    for b, (s, ids) in enumerate(seqs.items()):
        lo, n = batch.cu_seqlens[b], news[s]
        torch.testing.assert_close(out[lo:lo + n], ref[s][-3:][:n], atol=1e-4, rtol=1e-4)


def test_extra_mask_branches_and_commit(tiny_llama):
    """Two sibling branches in one forward with a tree mask equal running each branch alone;
    committing one branch's rows gives the same next logits as running it normally."""
    model = load_model(tiny_llama, "cpu", "fp32")
    prompt, a, b = list(range(20, 40)), [50, 51], [60, 61, 62]
    kv = model.new_kv_cache(1, 64)
    model.forward(ForwardBatch([SeqInput(0, prompt, 0)]), kv)
    kv.lens[0] = len(prompt)
    # new tokens: root r, branch a (2 tokens), branch b (3 tokens); each branch sees r
    r = 7
    toks = [r] + a + b
    n = len(toks)
    mask = torch.zeros(n, n, dtype=torch.bool)
    parents = [-1, 0, 1, 0, 3, 4]
    for i, p in enumerate(parents):
        mask[i, i] = True
        while p >= 0:
            mask[i, p] = True
            p = parents[p]
    P = len(prompt)
    pos = [P, P + 1, P + 2, P + 1, P + 2, P + 3]
    out = model.logits(model.forward(ForwardBatch([SeqInput(0, toks, P, pos, mask)]), kv))
    ref_a, _ = run_full(model, prompt + [r] + a)
    ref_b, _ = run_full(model, prompt + [r] + b)
    torch.testing.assert_close(out[:3], ref_a[P:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[[0, 3, 4, 5]], ref_b[P:], atol=1e-4, rtol=1e-4)
    # commit root + branch b (offsets 0, 3, 4, 5), then decode one more token
    kv.commit(0, [0, 3, 4, 5])
    assert kv.lens[0] == P + 4
    nxt = model.logits(model.forward(ForwardBatch([SeqInput(0, [9], P + 4)]), kv))
    ref, _ = run_full(model, prompt + [r] + b + [9])
    torch.testing.assert_close(nxt[0], ref[-1], atol=1e-4, rtol=1e-4)


def test_layer_plan_skip_exit_and_resume(tiny_llama):
    model = load_model(tiny_llama, "cpu", "fp32")
    ids = list(range(30, 50))
    L = model.cfg.num_layers
    full, _ = run_full(model, ids)
    # exit at layer 2 and resume from the captured hidden states: same logits
    kv = model.new_kv_cache(1, 64)
    b = ForwardBatch([SeqInput(0, ids, 0)])
    h2, cap = model.forward(b, kv, LayerPlan(end=2, capture=2))
    assert torch.equal(h2, cap)
    hL = model.forward(b, kv, LayerPlan(start=2), hidden=h2)
    torch.testing.assert_close(model.logits(hL), full, atol=1e-5, rtol=1e-5)
    # capture inside a full run equals the early exit
    _, cap1 = model.forward(b, kv, LayerPlan(capture=2))
    torch.testing.assert_close(cap1, h2)
    # skipping everything leaves the embedding untouched; skipping some blocks changes logits
    kv = model.new_kv_cache(1, 64)
    all_skip = LayerPlan(skip_attn=frozenset(range(L)), skip_mlp=frozenset(range(L)))
    h = model.forward(b, kv, all_skip)
    torch.testing.assert_close(h, model.embed[torch.tensor(ids)])
    some = model.logits(model.forward(b, kv, LayerPlan(skip_attn=frozenset({1}))))
    assert not torch.allclose(some, full, atol=1e-3)


def test_kv_commit_truncate_validation(tiny_llama):
    model = load_model(tiny_llama, "cpu", "fp32")
    kv = model.new_kv_cache(2, 16)
    kv.lens[1] = 5
    with pytest.raises(ValueError):
        kv.commit(1, [2, 1])
    kv.commit(1, [0, 1])
    assert kv.lens[1] == 7
    kv.truncate(1, 3)
    assert kv.lens[1] == 3
    with pytest.raises(ValueError):
        kv.truncate(1, 4)
    with pytest.raises(ValueError):
        SeqInput(0, [], 0)
    with pytest.raises(ValueError):
        SeqInput(0, [1, 2], 0, mask=torch.zeros(2, 2, dtype=torch.bool))


def test_kv_commit_many_moves_every_layer_and_slot():
    """One batched commit over slots with a moved subset, a prefix and nothing kept equals
    moving each slot's rows by hand, in every layer, keys and values; other slots untouched."""
    from specctl.engine.kv import KVCache
    kv = KVCache(3, 4, 12, 2, 4)
    g = torch.Generator().manual_seed(0)
    for t in (kv.k_all, kv.v_all):
        t.copy_(torch.randn(t.shape, generator=g))
    kv.lens[:] = [2, 3, 1, 4]
    by_slot = [t.view(3, 4, 12, 2, 4) for t in (kv.k_all, kv.v_all)]   # contiguous layout
    before = [t.clone() for t in by_slot]
    kv.commit_many([(0, [0, 2, 5]), (1, [0, 1]), (3, [])])
    assert kv.lens == [5, 5, 1, 4]
    for got, old in zip(by_slot, before):
        assert torch.equal(got[:, 0, 2:5], old[:, 0, [2, 4, 7]])   # rows 2+0, 2+2, 2+5
        assert torch.equal(got[:, 0, :2], old[:, 0, :2])
        assert torch.equal(got[:, 1], old[:, 1]) and torch.equal(got[:, 2:], old[:, 2:])
    assert kv.k[1].data_ptr() == kv.k_all[1].data_ptr()           # per-layer views
    with pytest.raises(ValueError, match="ascending"):
        kv.commit_many([(2, [0, 1]), (1, [3, 2])])
    with pytest.raises(ValueError, match="twice"):
        kv.commit_many([(2, [0]), (2, [1])])
    with pytest.raises(ValueError, match="past the cache"):
        kv.commit_many([(2, [0]), (3, [0, 8])])                    # reads row 12 of 12
    assert kv.lens == [5, 5, 1, 4]                                 # nothing half-done


@pytest.mark.parametrize("paged", [False, True])
def test_kv_advance_keeps_rows_in_place_and_checks_before_it_changes_a_length(paged):
    """advance adds each slot's kept rows (1 by default); a slot twice, a count below 1 or a
    kept row past the slot's blocks raises, naming the slot, and leaves every length as it
    was (a paged slot holds what it reserved, a contiguous one its max_len rows)."""
    from specctl.engine.kv import KVCache
    kv = KVCache(1, 4, 48, 1, 2, num_blocks=12) if paged else KVCache(1, 4, 48, 1, 2)
    if paged:
        for slot in range(4):
            assert kv.reserve(slot, 32)                 # 2 blocks of 16 rows: 32 rows each
    top = 32 if paged else 48
    kv.lens[:] = [0, 5, top - 3, 7]
    kv.advance([0, 2])
    assert kv.lens == [1, 5, top - 2, 7]
    kv.advance([3, 1, 2], [4, 1, 2])
    assert kv.lens == [1, 6, top, 11]                   # slot 2's last row: top - 1, its last
    for bad, match in ((([1, 1], [1, 1]), "twice"), (([0, 1], [1, 0]), "slot 1 keeps 0"),
                       (([0, 2], None), f"slot 2: kept row {top} is past"),
                       (([3, 0], [top - 10, 1]), f"slot 3: kept row {top} is past"),
                       (([0, 1], [1]), "2 slots, 1 counts"),
                       (([0, 1], [0, -1]), "slot 0 keeps 0 rows"),         # (the first's, in
                       (([2, 1], [5, 0]), f"slot 2: kept row {top + 4}"),   # slot order)
                       (([1, 2], [0, 5]), "slot 1 keeps 0 rows")):
        with pytest.raises(ValueError, match=match):
            kv.advance(*bad)
        assert kv.lens == [1, 6, top, 11]               # nothing half-done


def test_argmax_equals_the_logits_argmax(tiny_llama):
    """Model.argmax (the greedy head, no fp32 [T, V] tensor) picks what the fp32 logits do."""
    model = load_model(tiny_llama, "cpu", "fp32")
    h = torch.randn(37, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.argmax(h), model.logits(h).argmax(-1))


@pytest.mark.parametrize("rows", [1, 2, 3, 11, 17, 23, 250, 256, 257])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_form_equals_f_linear(rows, bias):
    """engine.model.linear (on the CPU (w @ x.T).T up to GEMM_ROWS rows, padded to
    gemm_rows) gives F.linear's result up to fp32 rounding, contiguous, in F.linear's shape."""
    import torch.nn.functional as F

    from specctl.engine.model import GEMM_ROWS, linear
    assert GEMM_ROWS == 256
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 48, generator=g), torch.randn(72, 48, generator=g)
    b = torch.randn(72, generator=g) if bias else None
    y = linear(x, w, b)
    assert y.shape == (rows, 72) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert not torch.equal(linear(x, w + 1, b), y)


def test_gemm_rows_pads_up_to_a_tile():
    from specctl.engine.model import gemm_rows
    assert [gemm_rows(m) for m in (1, 2, 3, 4, 5, 8, 9, 10, 15, 16, 17, 18, 23, 24, 250)] == \
        [2, 2, 4, 4, 5, 8, 9, 16, 16, 16, 17, 24, 24, 24, 256]


def test_step_table_measures_and_round_trips(tiny_llama):
    from specctl.engine.steptable import StepTable, measure_step_table
    model = load_model(tiny_llama, "cpu", "fp32")
    seen = []
    t = measure_step_table(model, batches=(1, 3), ns=(1, 4), context=20, repeats=2, warmup=1,
                           progress=lambda b, n, ms: seen.append((b, n)))
    assert seen == [(1, 1), (1, 4), (3, 1), (3, 4)]
    assert all(v > 0 for row in t.table for v in row)
    assert all(list(row) == sorted(row) for row in t.table)   # more tokens, never less time
    back = StepTable.from_json(t.to_json())
    assert back == t
    assert t.ms(3, 4) == t.table[1][1] and t.ms(2, 1) == t.table[1][0]   # next batch up
    mid = t.ms(1, 2)
    assert min(t.table[0]) <= mid <= max(t.table[0])                     # linear in n
    assert "| 3 |" in t.markdown()
    with pytest.raises(ValueError):
        StepTable.from_json({**t.to_json(), "table": [[1.0], [2.0, 3.0]]})


def test_nondecreasing_fit():
    from specctl.engine.steptable import nondecreasing
    assert nondecreasing([1, 3, 2, 4, 3.5, 5]) == [1, 2, 2, 3.5, 3.5, 5]
    assert nondecreasing([50.1, 44.4, 42.7, 101]) == [42.7, 42.7, 42.7, 101]
    assert nondecreasing([1, 2, 3]) == [1, 2, 3]
