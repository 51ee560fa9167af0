"""Self-Draft: lossless greedy (every cache switch, batch 1 and 8), the step's mask and positions
for a worked example, KV commit of an accepted candidate, the context cache's grams, sampling."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers import (Oracle, check_three_token_sampling, prefill_slots, random_prompts, run_ids,
                     tree_input)
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.step import seq_input
from specctl.runtime.step.sequence import Request, Sequence
from specctl.speculative.drafter import DraftLimits, NoDraft, Proposal
from specctl.speculative.self_draft import (ContextCache, SelfDraftDrafter, SelfDraftParams,
                                     branch_probe, build_trie)
from specctl.speculative.verify import DraftTree, Verdict
from specctl.speculative.sampling import SamplingParams


@pytest.fixture(scope="module")
def reference(model):
    prompts = random_prompts(10, seed=3)
    ref, _ = run_ids(model, prompts, batch_size=1, max_tokens=24)
    return prompts, ref


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("switches", [dict(), dict(context_cache=False),
                                      dict(corpus_cache=False), dict(branches=0)])
def test_greedy_equals_ar(model, reference, batch_size, switches):
    prompts, ref = reference
    oracle = Oracle([p + r for p, r in zip(prompts, ref)])
    dr = SelfDraftDrafter(SelfDraftParams(**switches), oracle, "oracle")
    got, stats = run_ids(model, prompts, batch_size=batch_size, max_tokens=24, drafter=dr)
    assert got == ref
    accepted = sum(n * k for k, n in stats.accept_hist.items())
    if switches.get("corpus_cache", True):
        assert oracle.calls > 0 and dr.accepted_from["corpus"] > 0 and accepted > 0
    else:
        assert oracle.calls == 0 and dr.accepted_from["corpus"] == 0
    if switches.get("context_cache", True):   # emitted text feeds it even without branches
        assert len(dr.ctx) > 0
    else:
        assert len(dr.ctx) == 0 and dr.accepted_from["context"] == 0
    if switches.get("branches", 6):
        assert stats.probe_tokens > 0
    else:
        assert stats.probe_tokens == 0


def test_context_cache_alone_is_lossless_and_drafts(model):
    # repetitive prompts: the context cache (emitted text + branches) finds the repeats
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5]
    ref, st_ar = run_ids(model, prompts, batch_size=2, max_tokens=40)
    dr = SelfDraftDrafter(SelfDraftParams(), None)
    got, stats = run_ids(model, prompts, batch_size=2, max_tokens=40, drafter=dr)
    assert got == ref
    assert dr.accepted_from["context"] > 0
    assert stats.steps < st_ar.steps


def test_trie_merges_shared_prefixes_and_respects_budget():
    t = build_trie([[1, 2, 3], [1, 2, 4], [5], [1, 2, 3]], budget=10)
    assert t.tokens == [1, 2, 3, 4, 5] and t.parents == [-1, 0, 1, 1, -1]
    t = build_trie([[1, 2, 3], [5, 6]], budget=4)
    assert t.tokens == [1, 2, 3, 5] and t.parents == [-1, 0, 1, -1]
    assert len(build_trie([[1, 2]], budget=0)) == 0


def _trie_by_token(candidates, budget, sizes):
    """build_trie's definition, a token at a time: walk while the child is there, else make
    it (while the budget lasts)."""
    tokens, parents, child = [], [], {}
    for cand in candidates:
        at = -1
        for t in cand:
            if (at, t) not in child:
                if len(tokens) >= budget:
                    break
                child[at, t] = len(tokens)
                tokens.append(t)
                parents.append(at)
            at = child[at, t]
        sizes.append(len(tokens))
    return tokens, parents


def test_trie_and_extension_equal_their_definitions_on_random_candidates():
    """build_trie equals the token-at-a-time trie, sizes too, on random candidates that
    share prefixes, repeat and get cut by the budget; DraftTree.extend equals moving every
    non-root parent (a rewrite of either is held to these: bench-results/
    2026-12-01-commit-host tried one)."""
    rng = random.Random(0)
    for _ in range(3000):
        cands = [tuple(rng.randrange(3) for _ in range(rng.randrange(7)))
                 for _ in range(rng.randrange(9))]
        budget, got, want = rng.randrange(25), [], []
        t = build_trie(cands, budget, got)
        assert (list(t.tokens), t.parents) == _trie_by_token(cands, budget, want)
        assert got == want
        DraftTree(list(t.tokens), t.parents)   # (a valid tree)
        probe = branch_probe([list(c) for c in cands[:3]])
        nodes = t.extend(probe)
        off = len(t)
        assert nodes.tokens == list(t.tokens) + probe.tokens
        assert nodes.parents == t.parents + [p if p < 0 else p + off for p in probe.parents]


def test_step_mask_and_positions_worked_example(model):
    """Root r (pending) at position 7; candidates [a b], [a c] (trie: a -> b, a -> c); branches
    [x y], [z]. Every node sees the 7 committed rows, the root and its own ancestors."""
    s = Sequence(Request(0, [[]], 8), [1] * 7, 0)
    s.pending = 40
    a, b, c, x, y, z = 41, 42, 43, 44, 45, 46
    prop = Proposal(build_trie([[a, b], [a, c]], budget=10), branch_probe([[x, y], [z]]))
    inp = seq_input(s, prop, 7)
    assert inp.tokens == [40, a, b, c, x, y, z]
    fb = ForwardBatch([SeqInput(1, [3], 5), inp])   # (beside a plain decode step)
    assert fb.position_list == [5, 7, 8, 9, 9, 8, 9, 8]
    expected = torch.tensor([
        # r  a  b  c  x  y  z
        [1, 0, 0, 0, 0, 0, 0],   # r
        [1, 1, 0, 0, 0, 0, 0],   # a
        [1, 1, 1, 0, 0, 0, 0],   # b: r a b
        [1, 1, 0, 1, 0, 0, 0],   # c: r a c (not its sibling b)
        [1, 0, 0, 0, 1, 0, 0],   # x: r x (blind to the candidates)
        [1, 0, 0, 0, 1, 1, 0],   # y: r x y
        [1, 0, 0, 0, 0, 0, 1],   # z: r z (blind to the other branch)
    ], dtype=torch.bool)
    assert np.array_equal(fb.local[1], expected.numpy()) and fb.masked == [1]

    # a proposal past the step's limits (here the room: 2 drafts before the token budget) is
    # an error, never cut after the fact: what a drafter proposes is what is verified
    class Overdraft(NoDraft):
        def propose(self, seqs, kv, limits):
            assert limits.room == (2,)
            return [Proposal(build_trie([[a, b], [a, c]], budget=10))]
    runner = Runner(model, Overdraft(), SamplingParams(), batch_size=1, max_len=64,
                    eos_ids=set(), render=lambda r: [], decode=str)
    runner.kv.lens[0] = 7
    s = Sequence(Request(0, [[]], 3), [1] * 7, 0)
    s.pending = 40
    with pytest.raises(RuntimeError, match="past its limits"):
        runner.planner.plan([s])


def test_a_proposal_past_the_reserved_rows_is_an_error(model):
    """On a paged cache a step may write only the rows reserved for it (step_rows past the
    sequence's): a drafter proposing more is stopped at the plan with its name and numbers,
    not by a write into a block nobody reserved."""
    from helpers import kv_budget

    class Overprobe(NoDraft):   # declares 1 row a step, proposes 40 probe nodes
        def propose(self, seqs, kv, limits):
            return [Proposal(DraftTree(), branch_probe([[5] * 40])) for _ in seqs]
    dr = Overprobe()
    runner = Runner(model, dr, SamplingParams(), batch_size=2, max_len=256, eos_ids=set(),
                    render=lambda r: [], decode=str,
                    kv_budget=kv_budget(model, dr, 256, 1.5))
    assert runner.kv.paged
    s = Sequence(Request(0, [[]], 8), [1] * 7, 0)
    s.pending, s.slot = 40, 0
    runner.kv.reserve(0, 7 + dr.step_rows)
    runner.kv.lens[0] = 7
    with pytest.raises(RuntimeError, match="past its limits"):
        runner.planner.plan([s])


def test_commit_of_accepted_candidate_matches_plain_run(model):
    """Forward [root, trie, branches], keep the path r -> a -> c, then the next token's logits
    equal those of a cache that ran the accepted tokens plainly."""
    prompt = random_prompts(1, seed=9)[0]
    r, a, b, c = 30, 31, 32, 33
    kv = model.new_kv_cache(1, 128)
    model.forward(ForwardBatch([SeqInput(0, prompt, 0)]), kv)
    kv.lens[0] = len(prompt)
    tree = build_trie([[a, b], [a, c, 34]], budget=10)
    nodes = tree.extend(branch_probe([[50, 51, 52], [53, 54]]))
    base = len(prompt)
    x = tree_input(0, r, nodes, base)
    model.forward(ForwardBatch([x]), kv)
    kv.commit(0, [0, 1, 3])              # rows of r, a (node 0), c (node 2)
    assert kv.lens[0] == base + 3
    nxt = model.logits(model.forward(ForwardBatch([SeqInput(0, [35], base + 3)]), kv))
    kv2 = model.new_kv_cache(1, 128)
    ref = model.logits(model.forward(ForwardBatch([SeqInput(0, prompt + [r, a, c, 35], 0)]),
                                     kv2))[-1:]
    torch.testing.assert_close(nxt, ref, atol=1e-5, rtol=1e-5)


def test_branch_growth_and_harvested_grams():
    p = SelfDraftParams(branches=2, branch_len=5, gram=2, lru=10)
    dr = SelfDraftDrafter(p, None)
    s = Sequence(Request(0, [[]], 50), [3, 4, 5], 0)
    dr.admit(s)
    s.state.branches = [[1, 2, 3], [7]]
    s.out_ids, s.pending = [9], 9
    [prop] = dr.propose([s], None, DraftLimits((10,)))
    assert prop.probe.tokens == [1, 2, 3, 7] and prop.probe.parents == [-1, 0, 1, -1]
    # target's argmax after 1, 1 2, 1 2 3, 7
    learn = dr.observe([s], [prop], [Verdict([], 11)], [[20, 21, 22, 23]])
    assert s.state.branches == [[1, 2, 3, 22], [7, 23]] and len(dr.ctx) == 0   # (grams: later)
    learn()
    # branch 0 grows by its last prediction; windows of G = 2 + the prediction after them
    assert s.state.branches == [[1, 2, 3, 22], [7, 23]]
    assert dr.ctx.get(1, 10) == [(2, 21)] and dr.ctx.get(2, 10) == [(3, 22)]
    # emitted text: the prompt's tail + [9] gives the window (4, 5, 9)
    assert (5, 9) in dr.ctx.get(4, 10)
    # past L the oldest token goes
    s.state.branches = [[1, 2, 3, 4, 5], [7]]
    [prop] = dr.propose([s], None, DraftLimits((10,)))
    dr.observe([s], [prop], [Verdict([], 11)], [[0, 0, 0, 0, 60, 61]])
    assert s.state.branches[0] == [2, 3, 4, 5, 60]
    # room 0 (an ar step): no draft and no probe, and the branches stay as they were
    [prop] = dr.propose([s], None, DraftLimits((0,)))
    assert len(prop.draft) == 0 and len(prop.probe) == 0
    # (what a probe would have given: unused)
    dr.observe([s], [prop], [Verdict([], 11)], [[70, 71, 72, 73, 74, 75]])
    # the KV rows left cut the probe (a branch cut short does not grow), and no probes: none
    [full] = dr.propose([s], None, DraftLimits((10,)))
    [prop] = dr.propose([s], None, DraftLimits((10,), rows=(len(full.draft) + 3,)))
    assert prop.draft.tokens == full.draft.tokens
    assert prop.probe.tokens == full.probe.tokens[:3] == [2, 3, 4]
    [prop] = dr.propose([s], None, DraftLimits((10,), probes=False))
    assert len(prop.probe) == 0
    assert s.state.branches == [[2, 3, 4, 5, 60], [7, 61]]


def test_lean_steps_index_their_text_when_a_step_next_drafts():
    """The controller's lean steps (Drafter.idle) leave their text unindexed; the next step
    that drafts indexes it before proposing, as a step of `fixed` (room 0 included) indexes its
    own text at once."""
    p = SelfDraftParams(branches=0, gram=2, lru=10)
    lean, fixed = SelfDraftDrafter(p, None), SelfDraftDrafter(p, None)
    seqs = {}
    for name, dr in (("lean", lean), ("fixed", fixed)):
        s = seqs[name] = Sequence(Request(0, [[]], 50), [3, 4], 0)
        dr.admit(s)
    for tok in (9, 8, 7):   # three steps without drafts, each emitting one token
        for name, dr in (("lean", lean), ("fixed", fixed)):
            s = seqs[name]
            props = dr.idle([s], None) if name == "lean" else \
                dr.propose([s], None, DraftLimits((0,)))
            s.out_ids.append(tok)
            s.pending = tok
            learn = dr.observe([s], props, [Verdict([], tok)], [None])
            if learn:
                learn()
    assert fixed.ctx.get(9, 10) == [(8, 7)] and fixed.ctx.get(3, 10) == [(4, 9)]
    assert lean.ctx.get(9, 10) == [] and len(lean.ctx) == 0
    lean.propose([seqs["lean"]], None, DraftLimits((4,)))   # a step that drafts
    assert {k: lean.ctx.get(k, 10) for k in (3, 4, 9)} == \
        {k: fixed.ctx.get(k, 10) for k in (3, 4, 9)}


def test_context_cache_lru_and_trim():
    cc = ContextCache(lru=3)
    for cont in [(1,), (2,), (3,), (1,), (4,)]:
        cc.push(0, cont)
    assert cc.get(0, 10) == [(4,), (1,), (3,)]   # newest first; (2,) evicted; (1,) refreshed
    assert cc.get(0, 2) == [(4,), (1,)]
    cc.trim(1)
    assert cc.get(0, 10) == [(4,)]


def test_context_cache_is_an_lru_queue_per_key():
    """Random pushes (one at a time and a step's at once) and trims against a plain LRU: each
    key keeps its most recently pushed distinct continuations, newest last, in order."""
    import random
    from collections import OrderedDict
    rng = random.Random(11)
    cc, ref = ContextCache(lru=4), {}
    for step in range(300):
        grams = [(rng.randrange(6), (rng.randrange(5),)) for _ in range(rng.randrange(12))]
        if step % 2:
            cc.push_many(grams)
        else:
            for k, c in grams:
                cc.push(k, c)
        for k, c in grams:
            q = ref.setdefault(k, OrderedDict())
            q.pop(c, None)
            q[c] = None
            if len(q) > 4:
                q.popitem(last=False)
        if step % 37 == 36:
            keep = rng.randrange(4)
            cc.trim(keep)
            for k in list(ref):
                while len(ref[k]) > keep:
                    ref[k].popitem(last=False)
                if not ref[k]:
                    del ref[k]
        assert {k: list(q) for k, q in cc.grams.items()} == {k: list(q) for k, q in ref.items()}
        assert all(cc.get(k, 3) == list(reversed(q))[:3] for k, q in ref.items())


def test_context_cache_trim_visits_only_what_changed_and_equals_a_full_trim():
    """A trim after pushes, then trims to more, as many, and fewer: each leaves what trimming
    every key would (the cache's queues compared with a copy trimmed key by key)."""
    import random
    rng = random.Random(5)
    cc = ContextCache(lru=6)
    for keep in [2, 3, 2, 1, 4, 0, 2]:
        cc.push_many((rng.randrange(30), (rng.randrange(8),)) for _ in range(rng.randrange(200)))
        ref = {k: list(q)[max(0, len(q) - keep):] for k, q in cc.grams.items()}
        cc.trim(keep)
        assert {k: list(q) for k, q in cc.grams.items()} == {k: q for k, q in ref.items() if q}



def test_options_are_validated():
    with pytest.raises(ValueError):
        SelfDraftParams(branch_len=0)
    with pytest.raises(ValueError):
        SelfDraftParams(branches=-1)


def test_sampling_is_lossless(model):
    sp = SamplingParams(temperature=1.0, top_k=3, seed=13)
    prompt = random_prompts(1, seed=5)[0]
    # candidates after x1: the three likeliest x2, each followed by its likeliest x3

    def top3(ids):
        kv = model.new_kv_cache(1, 64)
        out = model.logits(model.forward(ForwardBatch([SeqInput(0, ids, 0)]), kv))[-1]
        return torch.topk(out, 3).indices.tolist()
    after = {x1: [[x2, top3(prompt + [x1, x2])[0]] for x2 in top3(prompt + [x1])]
             for x1 in top3(prompt)}

    class Fixed:
        def lookup(self, context, limit=3):
            return after.get(context[-1], [])[:limit]

    dr = SelfDraftDrafter(SelfDraftParams(branches=2, branch_len=3, corpus_cands=3), Fixed())
    stats = check_three_token_sampling(model, prompt, sp, dr)
    assert stats.accept_hist.get(1, 0) + stats.accept_hist.get(2, 0) > 100


@pytest.mark.parametrize("num_slots, max_len", [(3, 64), (16, 300)])
def test_graph_forward_math_on_cpu(model, num_slots, max_len):
    """The computation engine/graphs.py captures (static buffers, device-side masks from prefix
    lengths and each row's parent, padded batch rows on a scratch slot, KV columns cut to a bucket,
    attention over every slot as a view or over the batch's gathered slots) run eagerly on the
    CPU equals the eager packed forward for a masked tree + branches step and for chains."""
    from specctl.engine.batch import FULL
    from specctl.engine.graphs import CudaGraphs
    g = CudaGraphs(model, capture=False)
    prompts = random_prompts(3, seed=4)
    nodes = build_trie([[5, 6, 7], [5, 8]], 10).extend(branch_probe([[9, 10], [11]]))
    Bb = 4   # one padded batch row, on the scratch slot

    def primed():
        from specctl.engine.kv import KVCache
        c = model.cfg
        return prefill_slots(model, KVCache(c.num_layers, num_slots, max_len, c.num_kv_heads,
                                            c.head_dim, spare=True), prompts)

    for tree in (True, False):
        seqs = [tree_input(s, 3, nodes, len(p)) if tree else SeqInput(s, [3, 4, 5], len(p))
                for s, p in enumerate(prompts)]
        b = ForwardBatch(seqs)
        k = b.num_new[0]
        ref = model.logits(model.run(b, primed()))
        kv = primed()
        C = g.kv_columns(max(b.prefix_lens) + k, kv.max_len)
        assert C == min(max_len, 128)
        pad = lambda t, fill: torch.cat([t, torch.full((Bb * k - t.numel(),), fill)])
        par = torch.tensor([max(j - 1, 0) for j in range(k)] * Bb)   # (a chain's rows)
        for i, si in enumerate(seqs):   # (a tree's nodes: their parents' rows)
            if si.parents is not None:
                par[i * k + 1:i * k + k] = torch.tensor(si.parents) + 1
        out = g._forward(kv, Bb, k, C, FULL, pad(b.tokens, 0),
                         torch.tensor(b.seq_slots + [kv.scratch]),
                         torch.tensor(b.prefix_lens + [0]), par, None)[0]
        torch.testing.assert_close(model.logits(out[:3 * k]), ref, atol=1e-4, rtol=1e-4)


def test_prompt_grams_seed_the_context_cache_and_stay_lossless(model):
    prompts = [[5, 6, 7, 8, 9, 10, 11] * 3 + [40, 41], [20, 21, 22, 23, 24] * 4]
    ref, _ = run_ids(model, prompts, batch_size=2, max_tokens=24)
    dr = SelfDraftDrafter(SelfDraftParams(prompt_grams=True), None)
    s = Sequence(Request(0, [[]], 8), prompts[0], 0)
    dr.admit(s)
    assert dr.ctx.get(5, 10) == [(6, 7, 8, 9)] and dr.ctx.get(10, 10) == [(11, 5, 6, 7)]
    late = SelfDraftDrafter(SelfDraftParams(prompt_grams=True), None)
    late.overlapped = True   # (the host beside the forward: pushed by the next learning)
    late.admit(Sequence(Request(0, [[]], 8), prompts[0], 0))
    assert len(late.ctx) == 0
    late.catch_up([])   # (not on a drafting step's critical path either: they wait on)
    assert len(late.ctx) == 0
    late.observe_lean([])()   # (the learning a step leaves for the next forward)
    assert {k: late.ctx.get(k, 10) for k in (5, 10)} == {k: dr.ctx.get(k, 10) for k in (5, 10)}
    beside = SelfDraftDrafter(SelfDraftParams(prompt_grams=True), None)
    beside.overlapped = True
    beside.admit(Sequence(Request(0, [[]], 8), prompts[0], 0))
    beside.catch_up([], beside=True)   # (the catch-up under a forward before a drafting
    # step: a grid's lean steps leave no learning to push them before its first drafts)
    assert {k: beside.ctx.get(k, 10) for k in (5, 10)} == \
        {k: dr.ctx.get(k, 10) for k in (5, 10)}
    assert "-pg" in dr.signature()
    dr = SelfDraftDrafter(SelfDraftParams(prompt_grams=True), None)
    got, _ = run_ids(model, prompts, batch_size=2, max_tokens=24, drafter=dr)
    assert got == ref
    assert len(SelfDraftDrafter(SelfDraftParams(prompt_grams=False), None).ctx) == 0


def test_prompt_grams_default_follows_speculate():
    """The prompt's grams seed the context cache under auto (the default), not under fixed
    (the paper's settings); --prompt-grams / --no-prompt-grams win either way."""
    from specctl.runtime.jobs.config import GenerateConfig
    grams = lambda **kw: GenerateConfig(input="x", method="self-draft",  # noqa: E731
                                        **kw).self_draft_params().prompt_grams
    assert grams() and grams(speculate="auto")
    assert not grams(speculate="fixed")
    assert grams(speculate="fixed", prompt_grams=True)
    assert not grams(speculate="auto", prompt_grams=False)


def test_grid_default_follows_the_batch_size():
    """Self-Draft drafts on the grid by default from GRID_FROM sequences, under auto, greedy,
    without --logprobs, with --job-cache or without; --grid / --no-grid win either way, and
    the light and no-grid variants keep the per-sequence steps; a corpus cache named is
    drafted from. Neither
    its key, its options digest nor its signature follows: a run resumes at another batch size
    (after running out of memory), with --grid or --no-grid or neither."""
    from specctl.runtime.jobs.config import GRID_FROM, GenerateConfig, split_variant
    from specctl.runtime.jobs.depends import options_digest
    cfg = lambda **kw: GenerateConfig(input="x", method="self-draft", **kw)  # noqa: E731
    grid = lambda **kw: cfg(**kw).self_draft_params().grid  # noqa: E731
    assert not grid() and not grid(batch_size=GRID_FROM - 1)
    assert grid(batch_size=GRID_FROM) and grid(batch_size=64)
    for off in ({"speculate": "fixed"}, {"temperature": 0.7}, {"logprobs": 2},
                {"corpus_cache": "my-corpus"}, {"grid": False}):
        assert not grid(batch_size=64, **off), off
    assert grid(batch_size=64, job_cache=True)   # (its arrays' form: speculative/job_table.py)
    assert grid(batch_size=1, grid=True)
    for variant in ("self-draft:light", "self-draft:no-grid"):
        assert not grid(batch_size=64, **split_variant(variant)[1]), variant
    small, big = (SelfDraftDrafter(cfg(batch_size=b).self_draft_params(), None, vocab=100)
                  for b in (8, 64))
    assert not small.prm.grid and big.prm.grid
    assert small.signature() == big.signature()
    runs = [cfg(batch_size=b, **kw) for b in (8, 64) for kw in ({}, {"grid": True},
                                                                {"grid": False})]
    assert len({c.key(small.signature()) for c in runs}) == 1
    assert len({options_digest(c) for c in runs}) == 1


def test_light_variant_is_lossless(model, reference):
    """bench's self-draft:light (the CPU-friendly settings): what it sets, and greedy = ar."""
    from specctl.errors import SpecctlError
    from specctl.runtime.jobs.config import GenerateConfig, split_variant
    method, opts = split_variant("self-draft:light")
    prm = GenerateConfig(input="x", method=method, **opts).self_draft_params()
    assert (prm.branches, prm.context_cands, prm.corpus_cands, prm.prompt_grams) == (0, 4, 1, True)
    prompts, ref = reference
    oracle = Oracle([p + r for p, r in zip(prompts, ref)])
    for batch_size in (1, 4):
        got, stats = run_ids(model, prompts, batch_size=batch_size, max_tokens=24,
                             drafter=SelfDraftDrafter(prm, oracle))
        assert got == ref and stats.probe_tokens == 0
        assert sum(n * k for k, n in stats.accept_hist.items()) > 0
    with pytest.raises(SpecctlError, match="self-draft:light"):
        split_variant("self-draft:heavy")


def test_corpus_continuations_are_cut_to_the_declared_gram_length():
    """A step's rows are reserved for gram_len tokens per corpus candidate (step_rows): a
    longer continuation from the corpus object is cut there, never written past them."""
    class Long:
        gram_len = 2

        def lookup(self, context, limit=3):
            return [[1, 2, 3, 4, 5], [6, 7, 8]][:limit]
    dr = SelfDraftDrafter(SelfDraftParams(context_cache=False, corpus_cands=2, branches=0),
                          Long())
    s = Sequence(Request(0, [[]], 8), [1] * 7, 0)
    s.pending = 9
    assert dr.candidates(s) == ([(1, 2), (6, 7)], 0, 0)
    assert dr.price().max_draft == 10 * 4 + 2 * 2
