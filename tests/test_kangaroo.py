"""Kangaroo: lossless greedy and sampling, the adapter's two forwards agree, verification from
the exit layer equals a full forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import check_three_token_sampling, kv_budget, random_prompts, run_ids
from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.speculative.kangaroo import Adapter, KangarooDrafter, KangarooParams
from specctl.speculative.kangaroo_heads import AdapterHead, AdapterWhole
from specctl.speculative.sampling import SamplingParams



def _adapter(model, l=1, noise=0.0):
    a = Adapter.init_from_model(model, l)
    if noise:
        g = torch.Generator().manual_seed(0)
        for t in a.w.values():
            t.add_(noise * torch.randn(t.shape, generator=g))
    return a


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("eta", [0.0, 0.6])
def test_greedy_equals_ar(model, batch_size, eta):
    prompts = random_prompts(10, seed=1)
    ref, _ = run_ids(model, prompts, batch_size=batch_size, max_tokens=20)
    dr = KangarooDrafter(model, _adapter(model), SamplingParams(), KangarooParams(eta=eta))
    got, stats = run_ids(model, prompts, batch_size=batch_size, max_tokens=20, drafter=dr)
    assert got == ref
    assert dr.draft_forwards > 0
    if eta == 0.0:
        assert sum(n * k for k, n in stats.accept_hist.items()) > 0   # some drafts accepted


def test_adapter_cache_filled_by_chunked_prefill(model):
    """The prefill forward hands its layer-l states to the adapter's cache, chunk by chunk
    (sequences split across chunks, several per chunk): same drafts as one-chunk prefill."""
    prompts = random_prompts(6, seed=3)
    ref, _ = run_ids(model, prompts, batch_size=3, max_tokens=16)
    accepted = []
    for chunk in (512, 7):
        dr = KangarooDrafter(model, _adapter(model), SamplingParams(), KangarooParams(eta=0.0))
        got, stats = run_ids(model, prompts, batch_size=3, max_tokens=16, drafter=dr,
                             prefill_chunk=chunk)
        assert got == ref
        accepted.append(stats.accept_hist)
    assert accepted[0] == accepted[1] and sum(k * n for k, n in accepted[0].items()) > 0
    # the cache rows themselves: the adapter's keys/values of each whole prompt
    a = _adapter(model)
    dr = KangarooDrafter(model, a, SamplingParams(), KangarooParams(eta=0.0))
    run_ids(model, prompts[:3], batch_size=3, max_tokens=1, drafter=dr, prefill_chunk=7)
    for slot, p in enumerate(prompts[:3]):
        kv = model.new_kv_cache(1, 64)
        h = model.forward(ForwardBatch([SeqInput(0, p, 0)]), kv, LayerPlan(end=1))
        _, k, v = a._qkv(h, torch.arange(len(p)))
        akv = dr.head.akv
        rows = akv.index([slot] * len(p), list(range(len(p))))
        torch.testing.assert_close(akv.k[0][rows], k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(akv.v[0][rows], v, atol=1e-5, rtol=1e-5)


class _LeanEvery2(KangarooDrafter):
    """Kangaroo that may draft nothing at every other step (a lean step: one forward of the
    whole model, as auto's); at each drafting step, what the adapter's cache holds of each
    sequence's rows it has written (its rows [0, done)), kept in `seen` by request."""
    steps = 0

    def propose(self, seqs, kv, limits):
        self.steps += 1
        if self.steps % 2:
            limits = dataclasses.replace(limits, room=tuple(0 for _ in limits.room))
        props = super().propose(seqs, kv, limits)
        if not self.steps % 2:
            akv = self.head.akv
            for s in seqs:
                n = self.head.done[s.slot]
                rows = akv.index([s.slot] * n, list(range(n)))
                self.seen[s.req.index] = (akv.k[0][rows].clone(), akv.v[0][rows].clone())
        return props


@pytest.mark.parametrize("paged", [False, True])
def test_lean_steps_leave_the_adapters_rows_to_the_next_drafting_step(model, monkeypatch,
                                                                       paged):
    """A lean step writes none of the adapter's rows (its forward keeps its layer-l states);
    the next drafting step writes the stretch's rows first, in one pass: then every committed
    row holds what the adapter computes over the whole text, as if each step had written its
    own, and the output is ar's. On a contiguous cache and a paged one (its rows found
    through the block tables)."""
    writes = [0]
    write_rows, whole = Adapter.write_rows, AdapterWhole.__call__

    def counted(self, *a):
        writes[0] += 1
        return write_rows(self, *a)

    def lean(self, *a):
        n = writes[0]
        out = whole(self, *a)
        assert writes[0] == n, "a lean step wrote adapter rows"
        lean.steps += 1
        return out
    lean.steps = 0
    monkeypatch.setattr(Adapter, "write_rows", counted)
    monkeypatch.setattr(AdapterWhole, "__call__", lean)
    prompts = random_prompts(3, seed=4)
    ref, _ = run_ids(model, prompts, batch_size=3, max_tokens=16)
    a = _adapter(model)
    dr = _LeanEvery2(model, a, SamplingParams(), KangarooParams(eta=0.0))
    dr.seen = {}
    # (paged: a pool of 3.2 sequences under 4 slots: all three run at once)
    got, stats = run_ids(model, prompts, batch_size=4 if paged else 3, max_tokens=16,
                         drafter=dr, kv_budget=kv_budget(model, dr, 256, 3.2) if paged else None)
    assert dr.head.akv.paged == paged
    assert got == ref and lean.steps > 0 and sum(k * n for k, n in stats.accept_hist.items())
    for i, (p, out) in enumerate(zip(prompts, got)):
        k_got, v_got = dr.seen[i]   # (at its last drafting step)
        n = len(k_got)
        assert n > len(p) + 2
        kv = model.new_kv_cache(1, 64)
        h = model.forward(ForwardBatch([SeqInput(0, (p + out)[:n], 0)]), kv, LayerPlan(end=1))
        _, k, v = a._qkv(h, torch.arange(n))
        torch.testing.assert_close(k_got, k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v_got, v, atol=1e-5, rtol=1e-5)


def test_drafting_steps_leave_no_rows_to_catch_up(model, monkeypatch):
    """Where every step drafts, each step's draft forwards write its rows: a catch-up finds
    none to write again (a pass of its own at every drafting step would cost the kernels the
    lean step saves)."""
    caught, catch_up = [], AdapterHead.catch_up

    def spy(self, slots, ahead=0):
        caught.append(sum(self.akv.lens[s] + ahead - self.done[s] for s in slots))
        return catch_up(self, slots, ahead)
    monkeypatch.setattr(AdapterHead, "catch_up", spy)
    prompts = random_prompts(4, seed=6)
    ref, _ = run_ids(model, prompts, batch_size=4, max_tokens=16)
    dr = KangarooDrafter(model, _adapter(model), SamplingParams(), KangarooParams(eta=0.0))
    got, stats = run_ids(model, prompts, batch_size=4, max_tokens=16, drafter=dr)
    assert got == ref and sum(k * n for k, n in stats.accept_hist.items()) > 0
    assert caught and not any(caught)


def test_a_catch_up_under_a_lean_forward_takes_its_row_too(model, monkeypatch):
    """Where the host runs beside the forward, the catch-up before a drafting step runs under
    the lean step before it (Runner._prefetch), before that step commits: it writes the lean
    forward's own row too (ordered after it on the device), so the drafting step's plan has
    no pass of its own to run; and every row is still the adapter's over the whole text."""
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.step import Planner
    wrote, catch_up, plan = [], AdapterHead.catch_up, Planner.plan
    where = ["plan"]

    def spy(self, slots, ahead=0):
        wrote.append((where[0], sum(max(0, self.akv.lens[s] + ahead - self.done[s])
                                    for s in slots)))
        return catch_up(self, slots, ahead)

    def lean3(self, seqs, drain=False, clock=None):   # (3 lean steps, then a drafting one)
        self.n = getattr(self, "n", 0) + 1
        return self._lean(seqs, None) if self.n % 4 else plan(self, seqs, drain, clock)

    def prefetch(self, seqs, drain, missing=False, lean=False):   # (the next step drafts)
        where[0] = "prefetch"
        if not missing and self.planner.n % 4 == 3:
            self.drafter.catch_up(seqs, int(lean))
        where[0] = "plan"
        return 0.0
    monkeypatch.setattr(AdapterHead, "catch_up", spy)
    monkeypatch.setattr(Planner, "plan", lean3)
    monkeypatch.setattr(Planner, "overlaps", property(lambda self: True))
    monkeypatch.setattr(Runner, "_prefetch", prefetch)
    prompts = random_prompts(4, seed=3)
    ref, _ = run_ids(model, prompts, batch_size=4, max_tokens=30)
    dr = KangarooDrafter(model, _adapter(model), SamplingParams(), KangarooParams(eta=0.0))
    got, _ = run_ids(model, prompts, batch_size=4, max_tokens=30, drafter=dr)
    assert got == ref
    assert sum(n for w, n in wrote if w == "prefetch") > 0
    assert sum(n for w, n in wrote if w == "plan") == 0, wrote


def test_adapter_step_equals_train_forward(model):
    a = _adapter(model, 2, noise=0.01)
    ids = random_prompts(1, seed=2)[0] + [5, 6, 7, 8]
    kv = model.new_kv_cache(1, 64)
    b = ForwardBatch([SeqInput(0, ids, 0)])
    h = model.forward(b, kv, LayerPlan(end=2))
    full = a.train_logits(h)
    # incremental: the prompt at once, then one token at a time through the adapter's cache
    from specctl.engine.kv import KVCache
    akv = KVCache(1, 1, 64, model.cfg.num_kv_heads, model.cfg.head_dim)
    n = len(ids) - 4
    a.step(h[:n], ForwardBatch([SeqInput(0, ids[:n], 0)]), akv)
    for i in range(n, len(ids)):
        out = a.step(h[i:i + 1], ForwardBatch([SeqInput(0, [ids[i]], i)]), akv)
        torch.testing.assert_close(out[0], full[i], atol=1e-4, rtol=1e-4)


def test_sampling_is_lossless(model):
    sp = SamplingParams(temperature=1.0, top_k=3, seed=11)
    dr = KangarooDrafter(model, _adapter(model, 3), sp, KangarooParams(eta=0.0))
    stats = check_three_token_sampling(model, random_prompts(1, seed=5)[0], sp, dr)
    assert stats.accept_hist.get(1, 0) + stats.accept_hist.get(2, 0) > 100
