"""Self-Draft's grid step (runtime/step/grid.py, issue 52): the context table against its
documented semantics and the dict it stands for, chain verification against the trie's, the
step lossless end to end (eager and graph path, contiguous and paged caches, EOS, batch 1 to
8), and its host work the same at any batch size but for emitting each sequence's tokens."""

from __future__ import annotations

import random
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from helpers import kv_budget, random_prompts, run_ids, step_table
from specctl.engine.batch import tree_closure
from specctl.engine.graphs import CudaGraphs
from specctl.engine.kv import KVCache
from specctl.engine.loader import load_model
from specctl.runtime.step.grid import GridStep, chain_layout, verify_chains
from specctl.speculative.context_cache import ContextCache
from specctl.speculative.context_table import ContextTable
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
from specctl.speculative.trie import build_trie
from specctl.speculative.verify import verify_greedy


class RingReference:
    """ContextTable's documented semantics in plain Python: per key a list of at most lru
    continuations, newest last; a push adds each gram once, at its last place in the push,
    unless its key held it when the push began."""

    def __init__(self, lru: int):
        self.lru, self.q = lru, {}

    def push_many(self, grams) -> None:
        last = {gr: i for i, gr in enumerate(grams)}
        held = {gr for gr in last if gr[1] in self.q.get(gr[0], [])}
        for i, (key, cont) in enumerate(grams):
            if last[(key, cont)] == i and (key, cont) not in held:
                q = self.q.setdefault(key, [])
                q.append(cont)
                del q[:-self.lru]

    def get(self, key, limit):
        return list(reversed(self.q.get(key, [])))[:limit]

    def trim(self, keep):
        for q in self.q.values():
            del q[:-keep or len(q)]


def _grams(rng, n, keys, alphabet, g):
    return [(rng.randrange(keys), tuple(rng.randrange(alphabet) for _ in range(g)))
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_context_table_is_its_documented_ring(seed):
    """Pushes of many grams a key in one call (past lru), repeats inside a push and of grams
    held, trims: every key's candidates as the reference's, newest first."""
    rng = random.Random(seed)
    lru, g = rng.choice([1, 3, 10]), rng.choice([1, 4])
    table, ref = ContextTable(40, lru, g), RingReference(lru)
    for _ in range(30):
        grams = _grams(rng, rng.randrange(0, 40), 6, 3, g)   # (small: repeats are common)
        table.push_many(grams)
        ref.push_many(grams)
        if rng.random() < 0.2:
            keep = rng.randint(1, lru)
            table.trim(keep)
            ref.trim(keep)
        for key in range(8):
            assert table.get(key, lru) == ref.get(key, lru), (key, grams)
        limit, depth = rng.randint(1, lru), rng.randint(1, g)   # (a grid step's: fewer,
        cands, held = table.candidates(np.arange(8), limit, depth)   # shallower chains)
        for key in range(8):
            assert [tuple(c) for c in cands[key][:held[key]].tolist()] == \
                [c[:depth] for c in ref.get(key, limit)], (key, limit, depth)
    assert len(table) == sum(map(len, ref.q.values()))


def test_context_table_equals_the_dict_where_no_gram_repeats():
    rng = random.Random(7)
    table, cache = ContextTable(50, 4, 3), ContextCache(4, 3)
    seen = set()
    for _ in range(40):
        grams = [gr for gr in _grams(rng, 25, 10, 1000, 3) if gr not in seen]
        seen.update(grams)
        table.push_many(grams)
        cache.push_many(grams)
        if rng.random() < 0.2:
            table.trim(2)
            cache.trim(2)
        assert all(table.get(k, 4) == cache.get(k, 4) for k in range(10))


def test_push_texts_makes_every_window():
    texts = [[1, 2, 3, 4, 5], [], [9], [6, 7, 8]]
    table, cache = ContextTable(20, 10, 2), ContextCache(10, 2)
    table.push_texts(texts)
    cache.push_texts(texts)
    assert [table.get(k, 10) for k in range(20)] == [cache.get(k, 10) for k in range(20)]
    assert table.get(1, 10) == [(2, 3)] and table.get(6, 10) == [(7, 8)] and len(table) == 4


@pytest.mark.parametrize("C,G", [(3, 4), (1, 2), (2, 1)])
def test_the_forwards_gather_drafts_the_newest_candidates_the_jobs_first(C, G):
    """GridFill (a grid step's candidates, gathered in its forward from the table's rows):
    each sequence's C newest continuations of its pending token, their first G tokens, and
    the chains its key holds; where its first chain is staged as the job cache's, that one
    first, the context's after it, the last dropped, one more chain held; each chain's
    allowed slots, within the sequence's room and its budget (GridDrafts.allowed's, the
    host's reading of them). Padding tokens (a graph's n past 1 + C G) land in the column
    no one reads."""
    from specctl.runtime.step.grid import CANDS, GridDrafts, GridFill
    rng, V, R, Gt, B = np.random.default_rng(C * 10 + G), 40, 4, 4, 9
    table = ContextTable(V, R, Gt)
    table.push_texts([rng.integers(0, 12, 80).tolist() for _ in range(3)])
    fill = GridFill(table.device_rows("cpu"), Gt)
    pending = rng.integers(0, 14, B)   # (some keys never seen: nothing held)
    job = np.arange(B) % 3 == 0
    first = rng.integers(0, V, (B, G))
    room, budget = rng.integers(0, G + 2, B), rng.integers(0, C * G + 1, B)
    seq = np.array([np.arange(B), np.full(B, 7), pending, room, budget, job])
    drafts = GridDrafts.make(seq, C, G, first, job=job)
    allowed = [[max(0, min(r, G, k - c * G)) for c in range(C)] for r, k in zip(room, budget)]
    assert drafts.allowed.tolist() == allowed
    k = CANDS
    for n in (1 + C * G, 1 + C * G + 5):
        w = GridFill.width(C, G, drafts.host.shape[1]) + 8
        up = torch.zeros(B, w, dtype=torch.long)
        up[:, :drafts.host.shape[1]] = torch.from_numpy(drafts.host)
        tokens = fill(up, torch.from_numpy(fill.index(C, G, n, w - 1)), n)
        assert tokens.shape == (B, n)
        for b in range(B):
            held = int(table.fill[pending[b]])
            ctx = table.candidates(pending[b:b + 1], R)[0][0][:, :G]
            want = np.concatenate([first[b:b + 1], ctx[:C - 1]]) if job[b] else ctx[:C]
            got = up[b, k:k + C * G].view(C, G).numpy()
            assert (got == want).all(), (b, got, want)
            assert up[b, k + C * G:k + C * G + C].tolist() == allowed[b]
            assert up[b, 5] == held + job[b]
            assert tokens[b, 0] == pending[b] and (tokens[b, 1:1 + C * G].numpy()
                                                   == want.ravel()).all()
            assert (up[b, :5].numpy() == seq[:5, b]).all()   # (the rest as staged)
            assert (up[b, k + C * G + C:w - 1] == 0).all()
    assert any(table.fill[pending] > 0) and not all(table.fill[pending] > 0)


def test_chain_layout():
    depth, anc, parents = chain_layout(2, 3)
    assert depth.tolist() == [0, 1, 2, 3, 1, 2, 3]
    assert anc[6].tolist() == [True, False, False, False, True, True, True]
    assert anc[2].tolist() == [True, True, True, False, False, False, False]
    assert anc.diagonal().all() and anc[:, 0].all()
    assert parents.tolist() == [0, 0, 1, 2, 0, 4, 5]
    # (what a replay lays out from the parents: the same mask and depths)
    a, d = tree_closure(torch.from_numpy(parents)[None])
    assert np.array_equal(a[0].numpy(), anc) and d[0].tolist() == depth.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_verify_chains_emits_what_the_trie_does(seed):
    """Chains that share prefixes, candidates a key lacks, rooms that cut them: the tokens
    emitted equal build_trie + verify_greedy over the usable candidates (the per-sequence
    path's), the target a function of each row's path as a model's is."""
    rng = np.random.default_rng(seed)
    B, C, G = 64, 4, 3
    cands = rng.integers(0, 3, (B, C, G))
    held = rng.random((B, C)) < 0.7
    held = np.cumsum(~held, axis=1) == 0   # (held candidates are the first ones, as a ring's)
    room = rng.integers(0, G + 2, B)
    usable = held[:, :, None] & (np.arange(G)[None, None, :] < room[:, None, None])
    salt = rng.integers(0, 1 << 30, B)
    target = np.zeros((B, 1 + C * G), np.int64)

    def after(b, path):   # (the first token of a path follows a candidate half the time)
        return hash((int(salt[b]), tuple(path))) % 3
    for b in range(B):
        target[b, 0] = after(b, [])
        for c in range(C):
            for j in range(G):
                target[b, 1 + c * G + j] = after(b, cands[b, c, :j + 1].tolist())
    res = verify_chains(*map(torch.from_numpy, (cands, usable, target))).numpy()
    acc, best, out = res[:, 0], res[:, 1], res[:, 2:]
    hits = 0
    for b in range(B):
        keep = [cands[b, c, :min(G, room[b])].tolist() for c in range(C) if held[b, c]]
        tree = build_trie(keep, 1 << 20)
        paths = {}
        for j, (t, p) in enumerate(zip(tree.tokens, tree.parents)):
            paths[j] = (paths[p] if p >= 0 else ()) + (t,)
        v = verify_greedy(tree, [target[b, 0]] + [after(b, paths[j]) for j in range(len(tree))])
        assert out[b, :acc[b] + 1].tolist() == v.tokens(tree), b
        hits += acc[b] > 0
    assert hits > 5   # (drafts were accepted: the comparison is not over empty paths)


@pytest.fixture(scope="module")
def graph(tiny_llama):
    m = load_model(tiny_llama, "cpu", "fp32")
    m.graphs = CudaGraphs(m, capture=False)
    return m


def _grid_drafter(model, **kw):
    prm = dict(branches=0, context_cands=4, prompt_grams=True, grid=True) | kw
    return SelfDraftDrafter(SelfDraftParams(**prm), None, vocab=model.cfg.vocab_size)


@pytest.fixture
def grid_steps(monkeypatch):
    """Counts the grid steps run (so a test knows the grid path ran, not the other)."""
    ran = Counter()
    real = GridStep.plan

    def plan(self, slots, *a, **kw):
        ran["steps"] += 1
        ran["seqs"] += len(slots)
        return real(self, slots, *a, **kw)
    monkeypatch.setattr(GridStep, "plan", plan)
    return ran


@pytest.mark.parametrize("path", ["eager", "graph"])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_grid_is_lossless(model, graph, grid_steps, path, batch_size):
    m = model if path == "eager" else graph
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5] + \
        random_prompts(6, seed=batch_size)
    for eos in ((), (7,)):
        ref, _ = run_ids(model, prompts, max_tokens=40, eos_ids=eos)
        dr = _grid_drafter(m)
        got, st = run_ids(m, prompts, batch_size=batch_size, max_tokens=40, eos_ids=eos,
                          drafter=dr)
        assert got == ref, eos
        assert grid_steps["steps"] == st.steps and st.step_tokens == 17 * grid_steps["seqs"]
        grid_steps.clear()
        assert sum(k * n for k, n in st.accept_hist.items()) > 20   # drafts were accepted
        assert dr.accepted_from["context"] > 20


@pytest.mark.parametrize("job", [False, True])
def test_the_host_reads_no_candidate(model, graph, monkeypatch, job):
    """A grid step's candidates are gathered in its forward (GridFill: on a GPU inside the
    captured graph), from the table's rows on the device: the host reads none, on the graph
    path and eagerly, with or without the job cache's first chains, and the output is ar's."""
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8] + random_prompts(4, seed=3)
    ref, _ = run_ids(model, prompts, max_tokens=30)
    for m in (model, graph):
        def boom(*a, **k):
            raise AssertionError("a candidate read on the host")
        monkeypatch.setattr(ContextTable, "candidates", boom)
        dr = _grid_drafter(m, job_cache=job)
        got, st = run_ids(m, prompts, batch_size=4, max_tokens=30, drafter=dr)
        monkeypatch.undo()
        assert got == ref
        assert dr.accepted_from["context"] + dr.accepted_from["job"] > 10


def test_grid_is_lossless_on_a_paged_cache_near_the_context_end(model, grid_steps):
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5, [3, 4] * 12]
    preempted = 0
    for max_len in (40, 64):
        ref, _ = run_ids(model, prompts, max_tokens=60, max_len=max_len)
        dr = _grid_drafter(model, gram=5)
        budget = kv_budget(model, dr, max_len, 1.2)   # (a pool of 1.2 sequences: preemptions)
        got, st = run_ids(model, prompts, batch_size=3, max_tokens=60, max_len=max_len,
                          drafter=dr, kv_budget=budget)
        assert got == ref and grid_steps["steps"] > 0, max_len
        preempted += st.preemptions
    assert preempted > 0


def test_a_run_takes_the_grid_step_only_where_it_can(model):
    """Greedy: the grid step; sampling, or a drafter without context candidates: the
    per-sequence path (which drafts from the same table)."""
    from specctl.runtime.step.runner import Runner
    from specctl.speculative.sampling import SamplingParams

    def grid(sp=SamplingParams(), **kw):
        r = Runner(model, _grid_drafter(model, **kw), sp, batch_size=2, max_len=64,
                   eos_ids=set(), render=lambda r: [1, 2], decode=str)
        return r._grid_step()
    assert grid() is not None
    assert grid(SamplingParams(temperature=0.8)) is None
    assert grid(context_cands=0) is None and grid(context_cache=False) is None


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("profile", ["flat", "steep"])
def test_grid_under_the_controller(model, grid_steps, batch_size, profile):
    """--speculate auto: where verifying more rows is nearly free the controller's budgets
    let the grid draft (cut chain after chain in node order) and it accepts; where every row
    costs a step, every step is `ar`'s. The output is ar's either way."""
    from specctl.runtime.control.controller import make_controller
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5, [3, 4] * 12] + \
        random_prompts(4, seed=9)
    ref, ar = run_ids(model, prompts, max_tokens=32)
    dr = _grid_drafter(model)
    f = (lambda b, n: 10.0 + 0.001 * b * n) if profile == "flat" else \
        (lambda b, n: 10.0 * b * n)
    ctl = make_controller(dr, model, batch_size, step_table(f), correct=False, guard=False,
                          prior_accept=0.9 if profile == "flat" else 0.99,
                          explore_every=32 if profile == "flat" else 0)
    got, st = run_ids(model, prompts, batch_size=batch_size, max_tokens=32, drafter=dr,
                      speculate="auto", controller=ctl)
    assert got == ref
    assert st.controlled_steps == st.steps and dr.price().max_draft == 16
    if profile == "flat":
        assert grid_steps["steps"] > 0 and max(st.budget_hist) > 0
        assert dr.accepted_from["context"] > 0 and st.steps < sum(map(len, ref))
    else:
        assert grid_steps["steps"] == 0 and set(st.budget_hist) == {0}


def test_the_grid_at_batch_32_through_graphs_cuts_its_chain_to_the_budgets(model, graph,
                                                                          monkeypatch):
    """Self-Draft's default from batch 32 (the grid, runtime/jobs/config.py GRID_FROM) on
    the graph path under --speculate auto, its steps priced padded as on CUDA (so the host
    runs beside the forward and the controller learns a step late, as tests/test_gpu.py's
    twin does): where the budgets fit in one chain, its steps run fewer rows than 1 + G a
    sequence, and accept; the output is ar's. (With the prior's weight at 4 the run's first
    two grid steps, which find nothing in the table for the tiny model's tokens, teach it to
    draft no more within 24 tokens: on the H200 the twin failed so, 2026-12-04.)"""
    from specctl.runtime.control import stepcost
    from specctl.runtime.control.controller import make_controller
    monkeypatch.setattr(stepcost, "padded_steps", lambda model: True)
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5, [3, 4] * 12] * 6 + \
        random_prompts(16, seed=11)
    ref, _ = run_ids(model, prompts, max_tokens=24)
    rows, plan = [], GridStep.plan

    def planned(self, *a, **kw):
        batch, drafts = plan(self, *a, **kw)
        rows.append(batch.num_new[0])
        return batch, drafts
    monkeypatch.setattr(GridStep, "plan", planned)
    dr = _grid_drafter(graph)
    ctl = make_controller(dr, graph, 32, step_table(lambda b, n: 10.0 + 0.02 * b * n,
                                                     tuple(range(1, 9)) + (16, 32)),
                          correct=False, guard=False, prior_accept=0.8, prior_weight=32,
                          explore_every=8)
    got, st = run_ids(graph, prompts, batch_size=32, max_tokens=24, drafter=dr,
                      speculate="auto", controller=ctl)
    assert got == ref
    assert ctl.cost.padded and graph.graphs.replays > 0 and dr.accepted_from["context"] > 0
    assert min(rows) < 1 + dr.prm.gram, rows


def _calls(fn) -> Counter:
    """Python calls made by fn() outside the model's forward and read-back (they are the
    device's), by function."""
    counts, depth = Counter(), [0]

    def prof(frame, event, arg):
        name = frame.f_code.co_name
        if event == "call":
            if depth[0] == 0:
                counts[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{name}"] += 1
            if name in ("run", "argmax") and "engine/model.py" in frame.f_code.co_filename:
                depth[0] += 1
        elif event == "return" and name in ("run", "argmax") and \
                "engine/model.py" in frame.f_code.co_filename:
            depth[0] -= 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


def test_a_grid_step_makes_as_many_python_calls_at_any_batch(model):
    """The host's work in a grid step (candidates, layout, verification, commit) does not
    grow in Python with the batch: the same calls at 2 and at 12 sequences (the KV cache's
    check of the kept rows too: a call a step, not a sequence's)."""
    table = ContextTable(model.cfg.vocab_size, 10, 4)
    table.push_texts([list(range(3, 60))])
    grid = GridStep(table, 4)
    kv = model.new_kv_cache(12, 128)
    made = {}
    for B in (2, 12):
        slots = list(range(B))

        def step():
            for s in slots:
                kv.lens[s] = 10
            batch, drafts = grid.plan(slots, [10] * B, list(range(5, 5 + B)), [4] * B, None,
                                      kv, "cpu")
            v = grid.verify(drafts, model.argmax(model.run(batch, kv)), kv, batch.filled)
            kv.advance(slots, [a + 1 for a in v.acc])
        step()   # (the layout is made once, at the first step)
        made[B] = _calls(step)
    assert made[2] == made[12] and sum(made[2].values()) > 10


def test_one_chain_runs_no_deeper_than_a_sequence_may_accept():
    """With every budget within one chain, the step's chain is only as deep as the most a
    sequence's budget and room let it accept (budgets 2 and 3, rooms 9 and 1: 3 rows a
    sequence, not 1 + G = 5, which a captured graph's grid pads to 8); past one chain, or
    with no budgets, every chain is whole. And what a sequence may accept is unchanged."""
    table = ContextTable(50, 4, 4)
    table.push_texts([[1, 2, 3, 4, 5, 6, 7, 8, 9] * 3])
    grid, kv = GridStep(table, 4), KVCache(2, 1, 64, 1, 2)
    for budget, room, rows, allowed in (([2, 3], [9, 1], 3, [2, 1]),
                                        ([6, 1], [9, 9], 9, [6, 1]),
                                        (None, [2, 1], 17, [8, 4]),
                                        ([1, 1], [0, 0], 2, [0, 0])):
        batch, drafts = grid.plan([0, 1], [5, 5], [1, 2], room, budget, kv, "cpu")
        assert batch.num_new == [rows, rows], budget
        assert drafts.allowed.reshape(2, -1).sum(axis=1).tolist() == allowed, budget


def test_verdicts_number_accepted_drafts_as_the_controller_learns_them():
    """Near a sequence's end its room cuts every chain (room 2 of G 4): its usable drafts are
    nodes 0, 1, 4, 5, 8, 9 ... of the layout, learnt as positions 0..7 (GridProposals' size 8);
    two drafts accepted on chain 1 are positions 2 and 3, not the layout's 4 and 5."""
    from specctl.runtime.step.grid import GridDrafts, GridProposals
    C, G = 4, 4
    cands = np.arange(C * G).reshape(1, C, G) + 100
    allowed = np.full((1, C), 2)   # (2 slots of each chain allowed, every chain held)
    target = np.zeros((1, 1 + C * G), np.int64)
    target[0, 0] = 104                 # the root's next token: chain 1's first draft
    target[0, 1 + 4] = 105             # after chain 1's node 0: its node 1
    target[0, 1 + 5] = 7               # after node 1: the bonus
    kv = KVCache(1, 1, 32, 1, 2)
    drafts = GridDrafts.make(np.array([[0], [3], [9], [2], [C * G], [C]]), C, G,
                             cands.reshape(1, -1), allowed)
    grid = GridStep(ContextTable(200, 10, G), C)
    v = grid.verify(drafts, torch.from_numpy(target.ravel()), kv, torch.from_numpy(drafts.host))
    assert GridProposals(drafts).sizes == [8] and v.acc == [2] and v.best == [1]
    assert v[0].accepted == [2, 3] and v[0].bonus == 7
    assert [t[0] for t in v.out[:3]] == [104, 105, 7]


@pytest.mark.parametrize("paged", [False, True])
def test_the_device_step_is_a_fixed_set_of_ops_that_reads_nothing_back(paged):
    """GridStep.device_step (verification and the KV moves, issued behind the forward) is the
    same tensor operations at batch 1, 8 and 64, and runs on the meta device, where reading a
    value back (.item(), .tolist(), a data-dependent shape such as nonzero's) raises: so on a
    GPU it queues behind the forward and the step's one wait is verify's read of its result."""
    from specctl.engine.launches import counting
    from specctl.runtime.step.grid import GridDrafts
    C, G = 4, 4
    grid = GridStep(ContextTable(50, 10, G), C)
    counts = {}
    for B in (1, 8, 64):
        rng = np.random.default_rng(B)
        cands = rng.integers(0, 50, (B, C, G))
        allowed, held = rng.integers(0, G + 1, (B, C)), rng.integers(0, C + 1, B)
        seq = np.array([np.arange(B), np.full(B, 5), rng.integers(0, 50, B)])
        tables = rng.integers(1, 40, (B, 3)) if paged else np.arange(B)[:, None]
        for dev in ("meta", "cpu"):
            kv = KVCache(2, 64, 48, 1, 2, device=dev, num_blocks=40 if paged else None)
            seq6 = np.concatenate([seq, np.zeros((2, B), np.int64), held[None]])
            drafts = GridDrafts.make(seq6, C, G, cands.reshape(B, -1), allowed,
                                     tables if paged else None)
            target = torch.from_numpy(rng.integers(0, 50, B * (1 + C * G))).to(dev)
            up = torch.from_numpy(drafts.host).to(dev)
            with counting() as c:
                res = grid.device_step(drafts, target, kv, up)
            assert res.shape == (B, G + 5)
            counts[B, dev] = c.count
    assert len(set(counts.values())) == 1 and counts[1, "cpu"] > 10, counts


@pytest.mark.parametrize("padded", [False, True])
def test_a_grid_step_is_priced_at_the_rows_it_runs(model, padded, monkeypatch):
    """The controller prices a grid step at the rows GridStep.plan gives it: every sequence
    runs as many as the longest budget needs (one chain cut to it, else whole chains), on
    the graph grid where steps are padded. A price by each sequence's own budget put a step
    of budgets 5 at 6 rows a sequence where it ran 9, and on a CPU a step in which 4 of 32
    sequences draft 4 tokens at 48 rows where it ran 160."""
    from specctl.engine.graphs import grid_n
    from specctl.runtime.control.stepcost import Shapes, StepCost, budget_counts
    dr = _grid_drafter(model)
    G, b = dr.prm.gram, 32
    table = step_table(lambda bb, n: 1.0 + bb * n, batches=(b,))
    cost = StepCost.of(table, dr.price(), padded)
    grid = GridStep(ContextTable(model.cfg.vocab_size, 10, G), dr.grid_cands)
    kv = model.new_kv_cache(b, 256)
    for top in range(0, dr.price().max_draft + 1):
        for drafting in (1, 4, b):
            ks = [top] * drafting + [0] * (b - drafting)
            batch, _ = grid.plan(list(range(b)), [10] * b, [5] * b, [40] * b, ks, kv, "cpu")
            n = batch.num_new[0] if top else 1   # (top 0: a lean step, ar's)
            n = grid_n(n) if padded else n
            ms = cost.table_prices(Shapes.of_counts(budget_counts(ks), False))[0][0]
            assert ms == pytest.approx(table.ms(b, n)), (top, drafting)
    # so its budgets are searched by levels, as a padded step's (on a CPU too)
    from dataclasses import replace
    from specctl.runtime.control import policy
    seen = []
    monkeypatch.setattr(policy, "_search_levels", lambda *a: seen.append(a) or [0] * b)
    policy.search(np.zeros((b, 5)), np.full(b, 4), cost, False)
    assert len(seen) == 1 and cost.by_top
    assert StepCost.of(table, replace(dr.price(), chain=0), padded).by_top == padded
