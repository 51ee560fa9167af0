"""The paged KV cache (engine/kv.py): block accounting and addressing, attention through block
tables equal to the contiguous layout's, every method lossless on it (eager and graph path),
and a run of more requests than the pool holds at once finishing every one, preempted stages
restarted with their work undone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import Oracle, kv_budget, random_prompts, run_ids
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.graphs import CudaGraphs
from specctl.engine.kv import KVCache
from specctl.engine.loader import load_model
from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
from specctl.speculative.drafter import NoDraft
from specctl.speculative.kangaroo import Adapter, KangarooDrafter, KangarooParams
from specctl.speculative.sampling import SamplingParams
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams


@pytest.fixture(scope="module")
def graph(tiny_llama):
    m = load_model(tiny_llama, "cpu", "fp32")
    m.graphs = CudaGraphs(m, capture=False)
    return m


def test_blocks_are_reserved_addressed_and_returned():
    kv = KVCache(2, 3, 40, 1, 2, num_blocks=5)          # 3 blocks a sequence; 5 in the pool
    assert kv.paged and kv.max_len == 48 and len(kv.free) == 5
    assert kv.reserve(0, 17) and kv.tables[0] == [1, 2]     # 17 rows -> 2 blocks
    assert kv.reserve(1, 5) and kv.tables[1] == [3]
    assert kv.reserve(0, 30) and kv.tables[0] == [1, 2]     # already has them
    assert not kv.reserve(2, 40) and kv.tables[2] == []     # needs 3, 2 free: nothing taken
    assert kv.reserve(2, 32) and kv.free == []
    assert kv.index([0, 0, 1, 2], [0, 17, 3, 31]) == [16, 2 * 16 + 1, 3 * 16 + 3, 5 * 16 + 15]
    with pytest.raises(ValueError, match="not reserved"):
        kv.index([1], [16])
    got = kv.index_array(np.array([0, 0, 1, 2, 0]), np.array([0, 17, 3, 31, 16]))
    assert got.tolist() == kv.index([0, 0, 1, 2, 0], [0, 17, 3, 31, 16])
    with pytest.raises(ValueError, match="not reserved"):
        kv.index_array(np.array([0, 1]), np.array([3, 16]))
    kv.reset(0)
    assert kv.tables[0] == [] and sorted(kv.free) == [1, 2]
    assert kv.reserve(1, 1000) and len(kv.tables[1]) == 3   # capped at max_len
    assert KVCache(2, 3, 40, 1, 2).paged is False
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        KVCache(2, 3, 40, 1, 2, num_blocks=2)


def test_paged_commit_equals_contiguous_commit():
    """Rows kept across block boundaries land where the contiguous cache puts them."""
    g = torch.Generator().manual_seed(0)
    flat = KVCache(2, 2, 64, 1, 3)
    paged = KVCache(2, 2, 64, 1, 3, num_blocks=7)
    for kv in (flat, paged):
        kv.reserve(0, 64)
        kv.reserve(1, 40)
    rows = [(s, r) for s in (0, 1) for r in range(40)]
    vals = torch.randn(2, len(rows), 1, 3, generator=g)
    for kv in (flat, paged):
        idx = torch.tensor(kv.index([s for s, _ in rows], [r for _, r in rows]))
        for layer in range(2):
            kv.write(layer, idx, vals[0], vals[1])
        kv.lens[:] = [14, 3]
        kv.commit_many([(0, [0, 3, 4, 9, 20]), (1, [1, 2])])
    assert flat.lens == paged.lens == [19, 5]
    for s in (0, 1):
        n = flat.lens[s]
        a, b = flat.index([s] * n, list(range(n))), paged.index([s] * n, list(range(n)))
        assert torch.equal(flat.k_all[:, a], paged.k_all[:, b])
        assert torch.equal(flat.v_all[:, a], paged.v_all[:, b])


def test_paged_forward_equals_contiguous(model, graph):
    """The same prompts and a mixed step (chains, a tree, padding) give the same states with
    the rows scattered over blocks as with one block per slot, eager and replayed."""
    prompts = random_prompts(3, seed=4, max_len=50)
    for m in (model, graph):
        outs = []
        for budget in (None, kv_budget(m, None, 100, 1.5)):
            kv = m.new_kv_cache(3, 100 + (m.graphs.max_n if m.graphs else 0), budget)
            assert kv.paged == (budget is not None)
            for s in (2, 0, 1):   # interleaved reservations: slots get scattered blocks
                kv.reserve(s, len(prompts[s]) + 8)
            for s, p in enumerate(prompts):
                m.forward(ForwardBatch([SeqInput(s, p, 0)]), kv)
                kv.lens[s] = len(p)
            mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
            step = [SeqInput(0, [5], kv.lens[0]),
                    SeqInput(1, [6, 7, 8], kv.lens[1], [kv.lens[1], kv.lens[1] + 1,
                                                        kv.lens[1] + 1], mask),
                    SeqInput(2, [9, 10], kv.lens[2])]
            outs.append(m.run(ForwardBatch(step), kv).clone())
        torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_budgets_are_kept_and_flex_needs_contiguous(model, graph):
    """A cache never takes more than its budget (the graphs' scratch slot and the null block
    included); flex attention with a budget that would page is a clear error."""
    for m in (model, graph):
        for seqs in (1, 1.5, 2, 2.5, 3, 4):
            budget = kv_budget(m, None, 100, seqs)
            kv = m.new_kv_cache(3, 100, budget)
            assert kv.bytes <= budget, (seqs, kv.paged)
    model.set_attention("flex")
    try:
        with pytest.raises(ValueError, match="flex attention reads only a contiguous"):
            model.new_kv_cache(4, 256, kv_budget(model, None, 256, 2))
    finally:
        model.set_attention("sdpa")


def test_self_draft_short_branches_fit_their_rows(model):
    """Branches start at up to 2 tokens whatever branch_len: step_rows counts them."""
    prompts = random_prompts(8, seed=5, max_len=40)
    ref, _ = run_ids(model, prompts, max_tokens=20, max_len=96)
    dr = SelfDraftDrafter(SelfDraftParams(branches=6, branch_len=1), Oracle(
        [p + r for p, r in zip(prompts, ref)]))
    got, _ = run_ids(model, prompts, batch_size=8, max_tokens=20, max_len=96, drafter=dr,
                     kv_budget=kv_budget(model, dr, 96, 1.2))
    assert got == ref


def _drafters(m, eager, texts):
    L = eager.cfg.num_layers
    return {
        "ar": NoDraft(),
        "draft-verify": LayerSkipDrafter(m, SkipSet(L, frozenset({1}), frozenset({1})),
                                         SamplingParams(), ExitParams(K=4, gamma0=0.0)),
        "kangaroo": KangarooDrafter(m, Adapter.init_from_model(eager, 1), SamplingParams(),
                                    KangarooParams(eta=0.0, gamma=4)),
        "self-draft": SelfDraftDrafter(SelfDraftParams(), Oracle(texts)),
    }


@pytest.mark.parametrize("batch", [1, 8])
def test_every_method_lossless_on_a_paged_cache(model, graph, batch):
    """Greedy output equals ar's on a contiguous cache; with 8 slots and a pool of two
    sequences, stages are preempted and restarted, and still emit the same tokens."""
    prompts = random_prompts(10, seed=batch, max_len=40)
    ref, _ = run_ids(model, prompts, max_tokens=24, max_len=96)
    texts = [p + r for p, r in zip(prompts, ref)]
    preempted = 0
    for m in (model, graph):
        for name, dr in _drafters(m, model, texts).items():
            budget = kv_budget(m, dr, 96, 2 if batch > 1 else 1)
            got, stats = run_ids(m, prompts, batch_size=batch, max_tokens=24, max_len=96,
                                 drafter=dr, kv_budget=budget)
            assert got == ref, (name, "graph" if m.graphs else "eager")
            if name != "ar":
                assert sum(k * n for k, n in stats.accept_hist.items()) > 0, name
            assert stats.generated == sum(map(len, got))   # preempted work not counted twice
            preempted += stats.preemptions
    assert preempted > 0 or batch == 1   # (one slot: the pool always holds it, contiguous)


def test_more_requests_than_fit_all_finish(model):
    """40 requests, 16 slots, a pool of three full-length sequences: every request finishes,
    equal to ar; sequences waited for blocks and some were preempted and restarted, their
    requests' counters undone (steps count each emitted token's step once)."""
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    prompts = random_prompts(40, seed=11, max_len=60)
    ref, _ = run_ids(model, prompts, max_tokens=40, max_len=128)
    reqs = [Request(i, [[{}]], 40) for i in range(40)]
    done, reported = {}, []
    runner = Runner(model, NoDraft(), SamplingParams(), batch_size=16, max_len=128,
                    eos_ids=set(), render=lambda r: prompts[r.index], decode=str,
                    kv_budget=kv_budget(model, None, 128, 3))
    assert runner.kv.paged
    stats = runner.run(reqs, lambda r: done.__setitem__(r.index, r), on_tokens=reported.append)
    assert sum(reported) == sum(len(r) - 1 for r in ref)   # (the prefill's token is not reported)
    assert [done[i].answer_ids[0] for i in range(40)] == ref
    assert stats.preemptions > 0 and stats.recomputed > 0
    assert stats.generated == sum(map(len, ref))
    for i, r in done.items():
        assert r.steps == len(ref[i]) and r.prompt_tokens == len(prompts[i])
    assert sorted(runner.kv.free) == list(range(1, runner.kv.num_blocks + 1))   # all returned


def test_kv_scale_recipe_runs_small(tmp_path):
    """recipes/gpu/kv_scale.py (the real-size measurement) on a small random model on the CPU:
    every request of every batch size done, the paged runs beside the contiguous one."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, str(root / "recipes/gpu/kv_scale.py"), "--shape", "mini",
                    "--requests", "24", "--batches", "1,16", "--b1-requests", "2",
                    "--max-len", "512", "--cut", "120", "--prompt-median", "40",
                    "--answer-median", "30", "--kv-memory", "2MB", "--out", str(out)],
                   check=True, capture_output=True, env={"PYTHONPATH": str(root),
                                                         "PATH": "/usr/bin:/bin"})
    res = json.loads(out.read_text())
    b16 = res["runs"][1]
    assert b16["layout"] == "paged" and b16["requests_done"] == 24
    assert res["contiguous"]["layout"] == "contiguous" and res["contiguous"]["requests_done"] == 24
    assert res["contiguous"]["batch"] < 16 and b16["generated"] == res["contiguous"]["generated"]


def test_a_budget_too_small_for_kangaroos_share_says_why(tiny_llama):
    """Kangaroo's adapter keeps rows beside the model's, so the model's cache gets a share of
    --kv-memory: a budget too small says so, not only the share's size (which read as half
    the budget given, unexplained)."""
    from specctl.runtime.step.runner import Runner
    m = load_model(tiny_llama, "cpu", "fp32")
    dr = KangarooDrafter(m, Adapter.init_from_model(m, 1), SamplingParams(), KangarooParams())
    kw = dict(batch_size=2, max_len=64, eos_ids=set(), render=None, decode=None)
    with pytest.raises(ValueError, match="kangaroo's adapter keeps rows worth .* of the budget"):
        Runner(m, dr, SamplingParams(), kv_budget=2048, **kw)
    with pytest.raises(ValueError, match="less than one sequence") as e:
        Runner(m, NoDraft(), SamplingParams(), kv_budget=256, **kw)
    assert "adapter" not in str(e.value)
