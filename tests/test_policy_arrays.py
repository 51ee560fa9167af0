"""The controller's per-step work as array operations over the batch: the same answers as the
per-sequence definitions (a brute-force search, the hull's monotone chain, the table's
interpolation, learning one sequence at a time), one pricing call per step, and the host
profile recipe on the tiny model."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from specctl.engine.steptable import StepTable
from specctl.runtime.control import policy
from specctl.runtime.control.acceptance import Acceptance
from specctl.runtime.control.controller import Controller
from specctl.runtime.control.stepcost import StepCost

NS = (1, 2, 4, 8, 16, 32, 64)
ROOT = Path(__file__).resolve().parents[1]


def _table(f, batches=(1, 2, 3, 8, 64), tiles=True) -> StepTable:
    return StepTable("cpu", "float32", "sdpa", 128, batches, NS,
                     tuple(tuple(float(f(b, n)) for n in NS) for b in batches), tiles=tiles)


def _ms_reference(t: StepTable, b: int, n: float) -> float:
    """StepTable.ms as a loop over the row's points (its definition)."""
    i = next((i for i, x in enumerate(t.batches) if x >= b), len(t.batches) - 1)
    row, ns = t.table[i], list(t.ns)
    if t.tiles:
        def tile(m):
            return m if m <= 2 else 4 if m <= 4 else -(-m // 8) * 8
        n = tile(math.ceil(b * n - 1e-6))
        ns = [tile(t.batches[i] * m) for m in ns]
    if n <= ns[0]:
        return row[0]
    for j in range(1, len(ns)):
        if n <= ns[j]:
            return row[j - 1] + (n - ns[j - 1]) / (ns[j] - ns[j - 1]) * (row[j] - row[j - 1])
    return row[-1] * n / ns[-1]


@pytest.mark.parametrize("tiles", [False, True])
def test_table_reads_many_points_as_one(tiles):
    rng = np.random.default_rng(0)
    t = _table(lambda b, n: 3.0 + b * n ** 0.7 + rng.random(), tiles=tiles)
    for b in (1, 2, 3, 5, 8, 40, 64, 100):
        n = np.concatenate((rng.random(50) * 100, np.arange(1, 80) / b))
        got = t.ms_many(b, n)
        assert got == pytest.approx([_ms_reference(t, b, x) for x in n], rel=1e-12)


def _hull_reference(g, cap):
    """The upper concave hull's slope over each (k - 1, k], k = 1..cap (monotone chain)."""
    hull = [0]
    for k in range(1, cap + 1):
        while len(hull) > 1 and (g[hull[-1]] - g[hull[-2]]) * (k - hull[-1]) <= \
                (g[k] - g[hull[-1]]) * (hull[-1] - hull[-2]):
            hull.pop()
        hull.append(k)
    out = []
    for a, z in zip(hull, hull[1:]):
        out += [(g[z] - g[a]) / (z - a)] * (z - a)
    return out


def test_hull_order_follows_each_sequences_hull():
    """Gains with rises (a tree's good node behind weak ones, within HULL_SPAN): the order is
    by the exact hull's slopes, each sequence's own tokens in order."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        b, width = 4, policy.HULL_SPAN   # (no segment longer than the span)
        inc = rng.random((b, width)) * (rng.random((b, width)) < 0.6)
        gains = np.concatenate((np.ones((b, 1)), 1 + np.cumsum(inc, axis=1)), axis=1)
        caps = rng.integers(0, width + 1, b)
        seq, ks = policy.hull_order(gains, caps)
        slope = {(i, k + 1): s for i in range(b)
                 for k, s in enumerate(_hull_reference(gains[i], int(caps[i])))}
        assert sorted(zip(seq.tolist(), ks.tolist())) == sorted(slope)
        got = [slope[(i, k)] for i, k in zip(seq.tolist(), ks.tolist())]
        assert all(x >= y - 1e-12 for x, y in zip(got, got[1:]))
        for i in range(b):   # a sequence's budgets come in order
            assert ks[seq == i].tolist() == list(range(1, int(caps[i]) + 1))


def _brute(gains, caps, cost, probes):
    best, pick = -1.0, None
    for ks in itertools.product(*[range(int(c) + 1) for c in caps]):
        t = cost.step_ms(list(ks), probes)
        good = sum(gains[i][k] for i, k in enumerate(ks)) / t
        if good > best * (1 + 1e-9):
            best, pick = good, ks
    return best


@pytest.mark.parametrize("tiles", [False, True])
def test_search_finds_the_best_goodput_of_a_packed_step(tiles):
    """Cost by total tokens (no draft forwards, no padding) and chains' concave gains: the best
    prefix is the best allocation there is (checked against every allocation)."""
    rng = np.random.default_rng(2)
    for trial in range(30):
        t = _table(lambda b, n: 10.0 * b * (1 + rng.random() * 0.3 * (n - 1)), tiles=tiles)
        acc = Acceptance(3, False, prior_accept=float(rng.random()))
        keys = list(range(3))
        for key in keys:   # sequences that accept differently
            for _ in range(int(rng.integers(0, 6))):
                n = int(rng.integers(0, 4))
                acc.learn(key, 3, list(range(n)))
        caps = rng.integers(0, 4, 3)
        gains = acc.gains_many(keys)
        cost = StepCost(t)
        ks = policy.search(gains, caps, cost, True)
        good = sum(gains[i][k] for i, k in enumerate(ks)) / cost.step_ms(ks)
        assert good == pytest.approx(_brute(gains, caps, cost, True), rel=1e-9), trial


@pytest.mark.parametrize("tree", [False, True])
def test_critical_paths_are_each_prefixs_slowest_sequence(tree):
    """The drain's critical path of every prefix of the hull order, computed by sorting (no
    [prefixes, batch] array), equals its definition: max over the sequences of their steps
    left at the budgets the prefix gives them (ties and zero gains included)."""
    rng = np.random.default_rng(3)
    for trial in range(400):
        b, width = int(rng.integers(1, 9)), int(rng.integers(1, 7))
        inc = rng.random((b, width)) * (rng.random((b, width)) < 0.7)
        if trial % 3 == 0:
            inc = np.round(inc, 1)   # (ties between sequences' values)
        if not tree:
            inc = np.cumprod(inc, axis=1)
        gains = np.concatenate((np.ones((b, 1)), 1 + np.cumsum(inc, axis=1)), axis=1)
        caps = rng.integers(0, width + 1, b)
        left = rng.integers(1, 60, b).astype(float)
        seq, _ = policy.hull_order(gains, caps)
        want = []
        for c in range(len(seq) + 1):
            ks = np.bincount(seq[:c], minlength=b)
            want.append(max(left[i] / (gains[i, ks[i]] - gains[i, 0] + 1) for i in range(b)))
        assert np.allclose(policy.critical_paths(gains, seq, left), want), trial


@pytest.mark.parametrize("probe", [0, 3])
def test_padded_search_is_the_best_of_every_allocation(probe, monkeypatch):
    """Captured graphs pad every sequence to the longest (no draft forwards priced: Self-Draft
    on CUDA): the levels-only search finds the best goodput, and while draining the shortest
    critical path, of every allocation there is."""
    def general(*a):   # (the prefixes' search: not what such a step needs)
        raise AssertionError("searched the prefixes")
    monkeypatch.setattr(policy, "hull_order", general)
    rng = np.random.default_rng(4)
    for trial in range(40):
        t = _table(lambda b, n: 2.0 + 0.05 * b + rng.random() * 0.2 * n, tiles=False)
        cost = StepCost(t, padded=True, probe=probe)
        acc = Acceptance(4, bool(probe), prior_accept=float(rng.random()))
        keys = list(range(3))
        for key in keys:
            for _ in range(int(rng.integers(0, 6))):
                acc.learn(key, 4, list(range(int(rng.integers(0, 5)))))
        gains, caps = acc.gains_many(keys), rng.integers(0, 5, 3)
        left = rng.integers(1, 40, 3).astype(float)
        every = list(itertools.product(*[range(int(c) + 1) for c in caps]))

        def good(ks):
            return sum(gains[i][k] for i, k in enumerate(ks)) / cost.step_ms(list(ks), True)

        def job(ks):
            return cost.step_ms(list(ks), True) * max(left[i] / gains[i][k]
                                                     for i, k in enumerate(ks))
        ks = policy.search(gains, caps, cost, True)
        assert good(ks) == pytest.approx(max(good(x) for x in every), rel=1e-9), trial
        ks = policy.search(gains, caps, cost, True, left)
        assert job(ks) == pytest.approx(min(job(x) for x in every), rel=1e-9), trial


def test_learning_a_batch_is_learning_each_sequence():
    rng = np.random.default_rng(3)
    for tree in (False, True):
        one, many = Acceptance(6, tree), Acceptance(6, tree)
        for _ in range(40):
            keys = rng.choice(20, size=5, replace=False).tolist()
            tried = rng.integers(0, 7, 5).tolist()
            acc = [sorted(rng.choice(6, size=int(rng.integers(0, 4)), replace=False).tolist())
                   if tree else list(range(int(rng.integers(0, 7)))) for _ in keys]
            confs = [rng.random(int(rng.integers(0, 7))).tolist() for _ in keys]
            for k, t, a, c in zip(keys, tried, acc, confs):
                one.learn(k, t, a, c)
            many.learn_many(keys, tried, acc, None if tree else confs)
            if rng.random() < 0.2:
                one.forget(keys[0])
                many.forget(keys[0])
        ks = list(range(20))
        assert np.array_equal(one.gains_many(ks), many.gains_many(ks))
        # (one sequence at a time takes learn_many's own path for one: the same counts)
        for name in ("tried", "hit", "steps", "grown"):
            assert np.array_equal(getattr(one, name), getattr(many, name)), name
        for a, b in ((one.pool, many.pool), (one.calib, many.calib)):
            assert np.array_equal(a.tried, b.tried) and np.array_equal(a.hit, b.hit)
            assert a.steps == b.steps


def test_a_step_prices_its_candidates_in_one_call(monkeypatch):
    """The search is linear in the batch: one pricing call per step, over at most one
    candidate per draft token and level."""
    calls = []
    real = StepCost.prices

    def spy(self, sh, probes=True):
        calls.append(len(sh.tokens))
        return real(self, sh, probes)
    monkeypatch.setattr(StepCost, "prices", spy)
    t = _table(lambda b, n: 10.0 + b * n * 0.01)
    for cost, k in ((StepCost(t, draft_frac=0.2), 12), (StepCost(t, padded=True), 52)):
        ctl = Controller(cost, k, prior_accept=0.8)
        ctl.lean_done(64, cost.ar_table_ms(64), 1, 0.1, 1)   # (a lean step timed: with draft
        calls.clear()   # forwards the run waits for one before it drafts, Controller.decide)
        ctl.plan(list(range(64)), [100] * 64)
        assert len(calls) == 1 and calls[0] <= 64 * k + k + 1, calls


def test_host_profile_runs_on_a_tiny_model(tmp_path, tiny_llama):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about item {i}."}) + "\n"
                               for i in range(4)))
    skip = tmp_path / "skip.json"
    skip.write_text(json.dumps({"num_layers": 4, "attn": [3], "mlp": []}))
    out = subprocess.run([sys.executable, str(ROOT / "recipes" / "host_profile.py"),
                          "--model", str(tiny_llama), "--input", str(prompts),
                          "--store", str(tmp_path / "store"), "--skip-set", str(skip),
                          "--methods", "ar,draft-verify,self-draft:light:fixed",
                          "--batch-sizes", "1,2", "--prompts", "4", "--max-tokens", "6",
                          "--threads", "1", "--device", "cpu", "--repeats", "2",
                          "--schedule", "cuda"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.stdout.splitlines()
            if line.startswith("| ")]
    head = rows[0]
    assert "host us/seq-step" in head
    got = {(r[0], r[1]): dict(zip(head, r)) for r in rows[1:] if r[0] != "---"}
    assert set(got) == {(m, b) for m in ("ar", "draft-verify", "self-draft:light:fixed")
                        for b in ("1", "2")}
    rows_a_seq = {k: float(v["rows/seq-step"]) for k, v in got.items()}
    assert rows_a_seq[("ar", "1")] == rows_a_seq[("ar", "2")] == 1.0   # ar's one token
    assert rows_a_seq[("self-draft:light:fixed", "1")] > 1.0
    # CUDA's schedule: Self-Draft's learning waits for the next forward and is timed apart
    # from the host's serial work; ar learns nothing
    under = {k: float(v["under fwd ms/step"]) for k, v in got.items()}
    assert under[("self-draft:light:fixed", "1")] > 0.0 and under[("ar", "1")] < \
        under[("self-draft:light:fixed", "1")]
    # the step loop's own host (admissions, retirements, scheduling), outside the steps
    assert all(float(v["loop ms/step"]) > 0.0 for v in got.values())


def test_learnt_kinds_kept_up_to_date_equal_a_rebuild():
    """learn updates the kinds' sorted codes and corrections in place (one kind a step): after
    any sequence of steps they equal those built anew from the learnt scale, and so do the
    prices of a memoized candidate set against the same set priced afresh."""
    rng = np.random.default_rng(3)
    cost = StepCost(_table(lambda b, n: 2.0 + b * n), draft_frac=0.3)
    for step in range(300):
        b = int(rng.choice([1, 2, 8]))
        ks = rng.integers(0, 7, size=b).tolist()
        cost.learn(ks, float(cost.table_ms(ks)[0] * rng.uniform(0.5, 2.0)))
        if step % 7 == 0:
            for bb in (1, 2, 8):
                cost.kind_rel(bb)   # built now, then kept up to date by the learns after
    for bb in (1, 2, 8):
        kept = cost.kind_rel(bb)
        fresh = StepCost(cost.table, draft_frac=0.3, drift=cost.drift, scale=cost.scale)
        built = fresh.kind_rel(bb)
        assert np.array_equal(kept[0], built[0]) and np.allclose(kept[1], built[1], rtol=0, atol=0)
    policy._search_one(np.linspace(1, 3, 7), 6, cost, True)   # memoizes the 0..6 candidates
    sh = policy._ONE[(6, True)]
    assert np.array_equal(cost.prices(sh, True, memo=("one", 6)),
                          StepCost(cost.table, draft_frac=0.3, drift=cost.drift,
                                   scale=cost.scale, _drafted=cost._drafted).prices(sh, True))


def test_gains_are_kept_while_nothing_is_learnt_and_redone_after():
    """gains_many hands out the same (read-only) array while nothing is learnt, and after a
    learn or a forget the answer a fresh estimate of the same counts gives."""
    acc = Acceptance(6, False)
    acc.learn_many([1, 2], [3, 2], [[0, 1], []], [[0.9, 0.8, 0.1], [0.2, 0.3]])
    g = acc.gains_many([1, 2])
    assert acc.gains_many([1, 2]) is g and not g.flags.writeable
    assert acc.gains_many([2, 1]) is not g   # other keys: computed
    acc.learn_many([2], [2], [[0, 1]], [[0.9, 0.9]])
    fresh = Acceptance(6, False)
    fresh.learn_many([1, 2], [3, 2], [[0, 1], []], [[0.9, 0.8, 0.1], [0.2, 0.3]])
    fresh.learn_many([2], [2], [[0, 1]], [[0.9, 0.9]])
    assert np.array_equal(acc.gains_many([1, 2]), fresh.gains_many([1, 2]))
    acc.forget(2)
    fresh.forget(2)
    assert np.array_equal(acc.gains_many([1, 2]), fresh.gains_many([1, 2]))


@pytest.mark.parametrize("tree", [False, True])
def test_gains_past_a_cap_are_never_read(tree):
    """The controller hands the search each sequence's gains at every budget, its cap apart:
    the budgets, the hull order and the stop rule's answers are those of the same gains held
    flat past each cap (what masking the rates there gives)."""
    rng = np.random.default_rng(5)
    cost = StepCost(_table(lambda b, n: 2 + 0.05 * b * n ** 0.8), draft_frac=0.0 if tree else 0.3)
    for trial in range(60):
        b = int(rng.integers(1, 9))
        inc = rng.random((b, 7)) * (1 if tree else np.linspace(1, 0.2, 7))   # trees: rises
        gains = np.concatenate((np.ones((b, 1)), 1 + np.cumsum(inc, axis=1)), axis=1)
        caps = rng.integers(0, 8, b)
        flat = gains[np.arange(b)[:, None], np.minimum(np.arange(8)[None, :], caps[:, None])]
        for probes in (False, True):
            assert policy.search(gains, caps, cost, probes) == \
                policy.search(flat, caps, cost, probes), trial
        got, want = policy.hull_order(gains, caps), policy.hull_order(flat, caps)
        assert all(np.array_equal(x, y) for x, y in zip(got, want)), trial
        if not tree:
            ks = np.minimum(caps, 3).tolist()
            s1, s2 = (policy.stop_rule(g, ks, cost, True, lambda c: 2 * c) for g in (gains, flat))
            assert [s1(i, 1, 0.3) for i in range(b)] == [s2(i, 1, 0.3) for i in range(b)]


def test_a_sequence_without_room_gets_budget_zero():
    cost = StepCost(_table(lambda b, n: 2 + 0.05 * b * n), draft_frac=0.3)
    ks = Controller(cost, 6, explore_every=0).plan([0, 1], [-1, 2]).ks
    assert ks[0] == 0 and 0 <= ks[1] <= 2


@pytest.mark.parametrize("tree", [False, True])
def test_a_fresh_sequence_is_priced_by_how_far_apart_the_finished_ones_were(tree):
    """The drain's slowest-of-32 quantile for a sequence with no trials of its own: the
    prior's (0.7 with 4 pseudo-trials: ~0.33) until 8 sequences have finished; then near the
    pool's rate when they all accepted ~0.8 (the last one admitted drafts as they did), and as
    low as before when they spread from 0 to 0.95."""
    rng = np.random.default_rng(0)

    def run(rates):
        acc = Acceptance(4, tree)
        for key, p in enumerate(rates):
            for _ in range(40):
                hits = rng.random(4) < p   # (a chain, or a trie that is one: the same path)
                acc.learn_many([key], [4], [list(itertools.takewhile(lambda j: hits[j],
                                                                     range(4)))])
            acc.forget(key)
        return acc

    fresh = Acceptance(4, tree)
    alike, apart = run([0.8] * 16), run([0.95 * (i % 5) / 4 for i in range(16)])
    assert fresh.spread_weight() == 5.0 and apart.spread_weight() == 5.0
    assert alike.spread_weight() > 50
    q = {name: a.rates_many(["new"], NormalDist().inv_cdf(1 / 33))[0, 0]
         for name, a in (("fresh", fresh), ("alike", alike), ("apart", apart))}
    mean = alike.rates_many(["new"])[0, 0]
    assert q["alike"] > mean - 0.1 and q["apart"] < mean - 0.2 and q["fresh"] < 0.45, q


def test_one_steps_price_is_the_searchs_price_of_it():
    """counts_step_ms (a step's own price: decide's, the stop rule's, the accounting's) is
    prices' for the same step (the search's, over arrays), whatever the host has learnt:
    drafting's host fit, the untimed host of draft forwards, a drain's extra for a first
    drafting step. (host_ms and untimed_host take one step in Python, apart from the
    arrays prices reads.)"""
    from specctl.runtime.control.stepcost import Shapes
    rng = np.random.default_rng(7)
    t = _table(lambda b, n: 2.0 + 0.05 * b + 0.1 * n)
    for trial in range(60):
        cost = StepCost(t, draft_frac=float(rng.choice([0.0, 0.2])),
                        padded=bool(rng.random() < 0.5))
        cost.draining = bool(rng.random() < 0.5)
        if rng.random() < 0.7:   # (a lean step timed: untimed_host prices from it)
            cost.learn_host(8, float(rng.random()), 0, int(rng.integers(1, 5)))
        for _ in range(int(rng.integers(0, 4))):   # (drafting steps timed: host_fit)
            cost.learn_host(8, float(rng.random() * 3), int(rng.integers(1, 9)))
        if rng.random() < 0.5:
            cost.learn([2] * 8, float(rng.random() * 10 + 1))
        counts = tuple(int(c) for c in rng.integers(0, 4, int(rng.integers(1, 6))))
        if not sum(counts):
            continue
        want = float(cost.prices(Shapes.of_counts(counts, cost.draft_frac > 0))[0])
        assert cost.counts_step_ms(counts) == pytest.approx(want, rel=1e-9), (trial, counts)
