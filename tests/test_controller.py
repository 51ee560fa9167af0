"""The goodput controller on synthetic step-cost profiles (no model, fast)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers import step_table as table
from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import Budgets, Controller, make_controller
from specctl.runtime.control.stepcost import Shapes, StepCost
from specctl.speculative.drafter import Proposal
from specctl.speculative.verify import DraftTree, Verdict


class Ctl(Controller):
    """The controller driven as the runner drives it, in the tests' shorthand: plain lists of
    budgets, drafted and accepted nodes."""
    explored = 0
    last: Budgets | None = None

    def __init__(self, *a, wait_first=False, **kw):   # (the search's own budgets: the rule
        super().__init__(*a, wait_first=wait_first, **kw)   # on a run's first drafting step
                                                            # has its own test)

    def budgets(self, keys, room):
        self.last = self.plan(keys, room)
        self.explored += self.last.explored
        return list(self.last.ks)

    def learn(self, keys, drafted, accepted, confs=None, attempted=None, stopped=None):
        b = self.last
        if b is None or b.lean or len(b.ks) != len(keys):
            b = Budgets((0,) * len(keys), False, np.ones((len(keys), 1)), 0.0)
        props = [Proposal(DraftTree.chain([0] * n), forwards=int(bool(attempted and attempted[i])),
                          conf=list(confs[i]) if confs else [],
                          stopped_at=stopped[i] if stopped else None)
                 for i, n in enumerate(drafted)]
        self.observe(keys, b, props, [Verdict(list(a), 0) for a in accepted], None)

    def timed(self, ms):
        if self.last.lean:
            self.lean_done(len(self.last.ks), ms)
        else:   # (as observe(..., ms) would)
            self.timed_steps += 1
            self.cost.learn(list(self.last.ks), ms, self.last.probes)

    def stop(self):
        return self.stop_rule(self.last)

NS = (1, 2, 4, 8, 16, 32, 64)


steep = table(lambda b, n: 10.0 * b * n)            # every extra token costs a whole step
flat = table(lambda b, n: 10.0 + 0.001 * b * n)     # verifying more is nearly free


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_steep_cost_gives_budget_zero(tree, padded):
    ctl = Ctl(StepCost(steep, padded, probe=6 if tree else 0), 12, tree=tree,
                     prior_accept=0.95)
    for b in (1, 8):
        assert ctl.budgets(list(range(b)), [100] * b) == [0] * b


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_flat_cost_gives_full_budget(tree, padded):
    ctl = Ctl(StepCost(flat, padded), 12, tree=tree, prior_accept=0.7)
    for b in (1, 8):
        assert ctl.budgets(list(range(b)), [100] * b) == [12] * b
    # the room still caps it
    assert ctl.budgets([0, 1], [3, 0]) == [3, 0]


@pytest.mark.parametrize("tree", [False, True])
def test_budget_zero_explores_and_learns(tree):
    """Under a cost that rules drafting out at the prior, every 32nd step every sequence
    drafts a little more (all in the same step); a sequence whose drafts then turn out to be
    always accepted gets budgets of its own, growing deeper than exploration's, while the
    ones that are always rejected draft rarely."""
    mid = table(lambda b, n: 10.0 * b * (1 + 0.08 * (n - 1)))
    ctl = Ctl(StepCost(mid), 12, tree=tree, prior_accept=0.05)
    keys = list(range(4))
    seen = []
    for step in range(1, 97):
        ks = ctl.budgets(keys, [100] * 4)
        seen.append(ks)
        if step <= 32:
            assert ks == ([2 if not tree else 4] * 4 if step == 32 else [0] * 4), (step, ks)
        # sequence 0 accepts every drafted node, the others none
        ctl.learn(keys, ks, [list(range(k)) if key == 0 else [] for key, k in zip(keys, ks)])
    assert ctl.explored >= 4
    late = seen[40:]
    assert all(ks[0] > 0 for ks in late)                           # learnt from exploring
    assert max(ks[0] for ks in seen[64:]) > 4                      # and deeper
    calm = [ks for i, ks in enumerate(seen[64:], 65) if i % 32]
    assert sum(max(ks[1:]) > 0 for ks in calm) <= len(calm) // 4
    off = Ctl(StepCost(mid), 12, tree=tree, prior_accept=0.05, explore_every=0)
    assert all(off.budgets(keys, [100] * 4) == [0] * 4 for _ in range(64))
    # near their end (on average fewer tokens left than explore_every) sequences do not explore
    late = Ctl(StepCost(mid), 12, tree=tree, prior_accept=0.05)
    assert all(late.budgets(keys, [40, 30, 20, 20]) == [0] * 4 for _ in range(64))
    assert any(late.budgets(keys, [40, 40, 30, 20]) != [0] * 4 for _ in range(64))


def test_exploring_that_finds_nothing_backs_off():
    """Explored drafts never accepted: the period doubles (32, 64, 128 ...) up to 16 x 32; an
    exploring step that gets a draft accepted brings it back to 32."""
    mid = table(lambda b, n: 10.0 * b * (1 + 0.08 * (n - 1)))
    ctl = Ctl(StepCost(mid), 12, prior_accept=0.05)
    keys = list(range(2))
    explored_at = []
    for step in range(1, 1400):
        ks = ctl.budgets(keys, [10_000] * 2)
        if any(ks):
            explored_at.append(step)
        ctl.learn(keys, ks, [[] for _ in ks])
    gaps = [b - a for a, b in zip(explored_at, explored_at[1:])]
    assert gaps[:4] == [64, 128, 256, 512] and set(gaps[4:]) <= {512}
    assert ctl.period == 512
    while not any(ks := ctl.budgets(keys, [10_000] * 2)):
        ctl.learn(keys, ks, [[] for _ in ks])
    ctl.learn(keys, ks, [[0], []])          # an exploring step that found something
    assert ctl.period == 32 and ctl.steps == explored_at[-1] + 512


def test_draft_forward_cost_counts():
    # verify nearly free, but each draft forward costs as much as a step: no drafting
    ctl = Ctl(StepCost(flat, draft_frac=1.0), 6, prior_accept=0.7)
    assert ctl.budgets([0], [10]) == [0]
    # a cheap draft forward with confident drafts: the full budget
    ctl = Ctl(StepCost(flat, draft_frac=0.01), 6, prior_accept=0.9)
    assert ctl.budgets([0], [10]) == [6]


def test_mixed_batch_gives_more_to_sequences_that_accept_more():
    # verify cost grows with the total tokens: speculation pays only for good acceptors
    mid = table(lambda b, n: 10.0 * b * (1 + 0.08 * (n - 1)))
    ctl = Ctl(StepCost(mid), 12, prior_accept=0.5)
    keys = list(range(8))
    for _ in range(30):   # sequences 0-3 accept everything, 4-7 nothing
        ctl.learn(keys, [6] * 8, [list(range(6)) if k < 4 else [] for k in keys])
    ks = ctl.budgets(keys, [100] * 8)
    assert min(ks[:4]) > max(ks[4:]), ks
    assert max(ks[4:]) == 0 and min(ks[:4]) >= 4


def test_tree_mixed_batch():
    mid = table(lambda b, n: 10.0 * b * (1 + 0.05 * (n - 1)))
    ctl = Ctl(StepCost(mid), 20, tree=True, prior_accept=0.3)
    keys = [0, 1]
    for _ in range(30):   # seq 0's first two trie nodes are always accepted; seq 1 never
        ctl.learn(keys, [20, 20], [[0, 1], []])
    ks = ctl.budgets(keys, [100, 100])
    assert ks[0] >= 2 and ks[1] == 0, ks


def test_a_trees_gain_counts_the_nodes_its_drafter_did_not_find():
    """A budget of k trie nodes is priced by what it bought: where the drafter found fewer
    nodes than the budget allowed (Self-Draft on the demo model finds no candidate in ~45% of
    its sequence-steps), the missing ones count as tried and not accepted. Counted only where
    found, a budget's gain read 1.4-2.1x what its steps verified on the demo model's clock
    (bench-results/2026-11-30-tree-gain)."""
    ctl = Ctl(StepCost(flat), 8, tree=True, prior_accept=0.7, explore_every=0)
    for step in range(60):   # half the steps find 8 nodes (the first 3 accepted), half none
        ks = ctl.budgets([0], [100])
        assert ks[0] >= 6, (step, ks)   # (the search keeps the budget near 8 on this table)
        found = 8 if step % 2 else 0
        ctl.learn([0], [min(found, ks[0])], [[0, 1, 2][:min(found, ks[0])]])
    got = ctl.acc.gains_many([0])[0, 8] - 1.0   # accepted nodes expected at budget 8
    assert got == pytest.approx(1.5, abs=0.2), got   # (counted where found: ~3)


def test_cpu_tables_price_rows_by_the_tile_they_cost():
    rows = {1: 10.0, 2: 11.0, 4: 14.0, 8: 20.0, 16: 30.0, 32: 50.0, 64: 90.0}
    t = StepTable("cpu", "float32", "sdpa", 128, (1, 8), NS,
                  (tuple(rows[n] for n in NS), tuple(100.0 + 25.0 * (n - 1) for n in NS)),
                  tiles=True)
    assert [t.ms(1, n) for n in (1, 2, 3, 4, 5, 8, 9, 13, 16)] == \
        [10.0, 11.0, 14.0, 14.0, 20.0, 20.0, 30.0, 30.0, 30.0]
    # batch 8: one draft token (9 rows) costs what one for each (16 rows) does
    assert t.ms(8, 9 / 8) == t.ms(8, 2) == 125.0
    assert t.ms(8, 1) == 100.0 and t.ms(8, 17 / 8) == t.ms(8, 3)
    # fewer sequences than the row's batch: their own rows, against the row's points
    assert t.ms(2, 1.5) == t.ms(2, 1) == 100.0                  # 3 rows (as 4) <= 8
    assert t.ms(5, 2) == t.ms(8, 1.5) == 125.0                  # 10 rows as 16: n = 2 at 8
    # a table without tiles interpolates, and a stored CPU table keeps its tiles
    assert replace(t, tiles=False).ms(8, 9 / 8) == pytest.approx(103.125)
    assert StepTable.from_json(t.to_json()) == t
    old = t.to_json()
    del old["tiles"]
    assert StepTable.from_json(old).tiles
    with pytest.raises(ValueError, match="tiles"):
        StepTable.from_json({**t.to_json(), "tiles": "no"})


def test_a_stair_of_drafts_is_filled_together():
    """On a staircase cost (batch 8: 9 to 16 rows cost alike) one draft token does not pay for
    the stair, eight together do: every sequence gets one (a one-change-at-a-time search
    would give none: no single draft pays)."""
    t = StepTable("cpu", "float32", "sdpa", 128, (8,), NS,
                  (tuple(100.0 + 25.0 * (n - 1) for n in NS),), tiles=True)
    for tree in (False, True):
        ctl = Ctl(StepCost(t), 4, tree=tree, prior_accept=0.5)
        assert ctl.budgets(list(range(8)), [100] * 8) == [1] * 8
        assert ctl.cost.step_ms([1] + [0] * 7) * 8 / 8.7 > ctl.cost.step_ms([0] * 8)
    # half the batch accepting nothing, the other half everything: the others fill the stairs
    ctl = Ctl(StepCost(t), 4, prior_accept=0.5)
    keys = list(range(8))
    for _ in range(30):
        ctl.learn(keys, [4] * 8, [[0, 1, 2, 3] if k < 4 else [] for k in keys])
    ks = ctl.budgets(keys, [100] * 8)
    assert ks == [4] * 4 + [0] * 4, ks


def test_a_stair_with_draft_forwards_is_filled_too():
    """draft-verify on the CPU: a draft forward for all 8 and a stair of verify rows pay
    together (13.6 tokens in 155 ms against 8 in 100), no one sequence's draft alone does."""
    t = StepTable("cpu", "float32", "sdpa", 128, (8,), NS,
                  (tuple(100.0 + 25.0 * (n - 1) for n in NS),), tiles=True)
    ctl = Ctl(StepCost(t, draft_frac=0.3), 4, prior_accept=0.7)
    assert ctl.budgets(list(range(8)), [100] * 8) == [1] * 8
    assert ctl.cost.step_ms([1] + [0] * 7) * 8 / 8.7 > ctl.cost.step_ms([0] * 8)


def test_contrast_steps_time_a_step_without_drafts():
    """A run that drafts every step runs one without drafts after 1 drafting step (no step
    without drafts timed yet: `ar`'s price unknown), then after 4, 8, 16 and 32, once its steps
    are timed (and never where they are not)."""
    ctl = Ctl(StepCost(flat), 4, prior_accept=0.7)
    untimed = Ctl(StepCost(flat), 4, prior_accept=0.7)
    bare = []
    for step in range(1, 71):
        ks = ctl.budgets([0, 1], [100, 100])
        if not any(ks):
            bare.append(step)
        ctl.timed(ctl.cost.table_ms(ks)[0])
        assert any(untimed.budgets([0, 1], [100, 100]))
    assert bare == [2, 7, 16, 33, 66] and ctl.contrasts == 5
    # the contrast steps' timing was learnt as a class of its own
    assert (False,) in ctl.cost.scale and (True,) in ctl.cost.scale


def test_measured_step_times_correct_the_table():
    """Drafting steps that measure 3x what the table says (and steps without drafts what it
    says) are priced so, and drafting stops; a machine uniformly slower than its table changes
    no decision."""
    mid = table(lambda b, n: 10.0 * b * (1 + 0.08 * (n - 1)))
    for tree in (False, True):
        slow = Ctl(StepCost(mid), 4, tree=tree, prior_accept=0.7, explore_every=0)
        drifted = Ctl(StepCost(mid), 4, tree=tree, prior_accept=0.7, explore_every=0)
        first = slow.budgets([0, 1], [100, 100])
        assert min(first) > 0
        seen = []
        for step in range(40):
            room = [100, 100] if step % 2 else [0, 0]   # half the steps cannot draft
            ks = slow.budgets([0, 1], room)
            seen.append(ks)
            slow.timed(slow.cost.table_ms(ks)[0] * (3.0 if any(ks) else 1.0))
            ks = drifted.budgets([0, 1], room)
            assert ks == (first if step % 2 else [0, 0])
            drifted.timed(drifted.cost.table_ms(ks)[0] * 3.0)
        assert seen[-1] == [0, 0] and seen[-2] == [0, 0], seen
        c = slow.cost

        def dearer(c):   # (priced / table ms: a drafting step's over one without drafts)
            return c.step_ms(first) / c.table_ms(first)[0] / \
                (c.step_ms([0, 0]) / c.table_ms([0, 0])[0])
        assert dearer(c) > 2.0
        for _ in range(64):   # no drafting since: what drafting costs is not forgotten
            slow.timed(c.table_ms(slow.budgets([0, 1], [100, 100]))[0])
        assert dearer(c) > 2.0
        assert math.exp(drifted.cost.drift) == pytest.approx(3.0)
        assert dearer(drifted.cost) == pytest.approx(1.0)
        assert drifted.cost.step_ms(first) == pytest.approx(3.0 * drifted.cost.table_ms(first)[0])


def test_pooled_prior_for_new_sequences():
    mid = table(lambda b, n: 10.0 * b * (1 + 0.2 * (n - 1)))
    ctl = Ctl(StepCost(mid), 8, prior_accept=0.2)
    assert ctl.budgets([0], [10]) == [0]         # a pessimistic prior: ar
    for _ in range(50):
        ctl.learn([0], [8], [list(range(8))])  # the pool learns drafts are accepted
    assert ctl.budgets([99], [10])[0] > 0        # a new sequence starts from the pool


def test_gain_of_a_chain():
    ctl = Ctl(StepCost(flat), 3, prior_accept=0.5, prior_weight=1.0)
    assert ctl.acc.gains(0, 3) == pytest.approx([1, 1.5, 1.75, 1.875])


def _calibrate(ctl, n=200):
    """A run in which confident drafts (0.95) are accepted and unconfident ones (0.15) not:
    chains of 4 whose first two drafts are confident."""
    for _ in range(n):
        ctl.learn([0], [4], [[0, 1]], [[0.95, 0.95, 0.15, 0.15]])


def test_acceptance_given_confidence_is_learnt():
    ctl = Ctl(StepCost(flat), 8, prior_accept=0.6)
    assert ctl.acc.calibrated(0.95) == ctl.acc.calibrated(0.15) == pytest.approx(0.6)   # no evidence
    _calibrate(ctl)
    assert ctl.acc.calibrated(0.95) > 0.95 and ctl.acc.calibrated(0.99) == ctl.acc.calibrated(0.95)
    assert ctl.acc.calibrated(0.15) < 0.05
    assert ctl.acc.calibrated(0.55) == pytest.approx(ctl.acc.pool_mean())   # a bin never seen
    # only the tried positions count: position 3 (after a rejection) was never tried
    assert sum(ctl.acc.calib.tried) == 200 * 3


def test_stop_rule_ends_chains_at_unconfident_drafts():
    mid = table(lambda b, n: 10.0 * b * (1 + 0.05 * (n - 1)))
    ctl = Ctl(StepCost(mid, draft_frac=0.1), 8, prior_accept=0.8, explore_every=0)
    assert min(ctl.budgets([0, 1], [10, 10])) >= 2
    stop = ctl.stop()
    assert not stop(0, 1, 0.15) and not stop(1, 1, 0.95)   # nothing learnt: as planned
    _calibrate(ctl)
    ks = ctl.budgets([0, 1], [10, 10])
    assert min(ks) >= 2
    stop = ctl.stop()
    assert stop(0, 1, 0.15)                 # a likely rejection: drafting on cannot pay
    assert not stop(1, 1, 0.95)             # confident: on to the budget
    assert stop(1, ks[1], 0.95)             # the budget is a cap
    ctl.budgets([0], [0])
    assert ctl.stop() is None          # every budget 0: nothing to decide
    tree = Ctl(StepCost(flat), 8, tree=True)
    tree.budgets([0], [10])
    assert tree.stop() is None         # trees are cut by node order, not confidence


# -- in the runner: lossless, and the budgets do what the profile says ---------------------------

import random  # noqa: E402

from helpers import method_drafters, run_ids  # noqa: E402


def _ctl(drafter, model, tab, draft_frac=None, timing=True, **kw):
    # timing False: priced by the synthetic table alone, not by the tiny model's step times
    # (nor held to ar by the measured guard)
    ctl = make_controller(drafter, model, 1, tab, correct=timing, guard=timing, **kw)
    if draft_frac is not None and ctl.cost.draft_frac:
        ctl.cost.draft_frac = draft_frac
    return ctl


def _prompts(n, seed=0, vocab=30):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 20))] for _ in range(n)]


@pytest.mark.parametrize("batch", [1, 3])
def test_steep_profile_is_exactly_ar(model, batch):
    prompts = _prompts(4)
    ref, ar_stats = run_ids(model, prompts, batch_size=batch, max_tokens=12)
    for name, dr in method_drafters(model, prompts, ref).items():
        if dr is None:
            continue
        got, st = run_ids(model, prompts, batch_size=batch, max_tokens=12, drafter=dr,
                          speculate="auto", controller=_ctl(dr, model, steep, prior_accept=0.99,
                                                            explore_every=0, timing=False))
        assert got == ref, name
        assert st.steps == ar_stats.steps, name
        assert set(st.budget_hist) == {0} and set(st.accept_hist) == {0}, name
        assert st.probe_tokens == 0 and st.step_tokens == ar_stats.step_tokens, name
        # every step on ar's lean path, priced as itself in the gain estimate
        assert st.lean_steps == st.controlled_steps == st.steps, name
        assert st.ar_step_ms == pytest.approx(st.measured_step_ms), name
        if name == "draft-verify":
            assert dr.draft_forwards == 0   # the budget ruled drafting out: no draft forward
        if name == "kangaroo":   # eager: one forward of the whole model per step
            assert dr.draft_forwards == 0


@pytest.mark.parametrize("batch", [1, 3])
def test_flat_profile_drafts_and_stays_lossless(model, batch):
    prompts = _prompts(4, seed=1)
    ref, ar_stats = run_ids(model, prompts, batch_size=batch, max_tokens=12)
    for name, dr in method_drafters(model, prompts, ref).items():
        if dr is None:
            continue
        got, st = run_ids(model, prompts, batch_size=batch, max_tokens=12, drafter=dr,
                          speculate="auto",
                          controller=_ctl(dr, model, flat, draft_frac=0.01, prior_accept=0.9,
                                          timing=False))
        assert got == ref, name
        assert max(st.budget_hist) > 0, name
        assert sum(k * c for k, c in st.accept_hist.items()) > 0, name
        assert st.steps < ar_stats.steps, name
        assert st.controlled_steps == st.steps and st.predicted_step_ms > 0


def test_no_search_under_a_prefill_whose_next_step_is_lean_regardless():
    """A drafter with draft forwards: until a step is timed the run's steps are lean
    (Controller._untimed_host), so the search made under a prefill for the next step
    would be thrown away; it is not made. Once a lean step is timed it is, and decide takes
    it."""
    ctl = Controller(StepCost(flat), 4, prior_accept=0.9)
    ctl.cost.draft_frac = 0.01   # (draft forwards: draft-verify's, Kangaroo's)
    calls = []
    search = ctl._search
    ctl._search = lambda *a: calls.append(1) or search(*a)
    ctl.prefetch_missing([0, 1], lambda: [100, 100], False)
    assert not calls and ctl._next is None
    assert ctl.plan([0, 1], [100, 100]).lean and not calls
    ctl.lean_done(2, 10.0)
    ctl.prefetch_missing([0, 1], lambda: [99, 99], False)
    assert calls == [1] and ctl._next is not None
    assert not ctl.plan([0, 1], [99, 99]).lean and calls == [1]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_drafter_with_draft_forwards_drafts_under_sampling_too(model, temperature):
    """A run's first steps wait for a timed lean step where the drafter runs draft forwards
    (Controller._untimed_host); under sampling a step's host share is not timed (its
    verify works on the device), and the wait once never ended: such a run never drafted."""
    from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
    from specctl.speculative.sampling import SamplingParams
    sp = SamplingParams(temperature=temperature, seed=1)
    prompts = _prompts(3, seed=1)
    dr = LayerSkipDrafter(model, SkipSet(4, frozenset({2}), frozenset({3})), sp,
                          ExitParams(K=4, gamma0=0.0))
    ctl = make_controller(dr, model, 3, flat, prior_accept=0.95)
    ctl.cost.draft_frac = 0.01
    _, st = run_ids(model, prompts, batch_size=3, max_tokens=40, drafter=dr, sampling=sp,
                    speculate="auto", controller=ctl)
    assert max(st.budget_hist) > 0 and ctl.timed_steps > 0


def test_thread_trials_weigh_steps_by_their_table_cost(model, monkeypatch):
    """Under --speculate auto the CPU thread tuner compares its trials per step-cost-table ms,
    not per token: per token a trial whose steps drafted more would win whatever its threads."""
    from specctl.runtime.step.threads import ThreadTuner
    seen = []
    monkeypatch.setattr(ThreadTuner, "after", lambda self, s, work: seen.append(work))
    prompts = _prompts(4, seed=1)
    ref, _ = run_ids(model, prompts, batch_size=3, max_tokens=12)
    dr = method_drafters(model, prompts, ref)["self-draft"]
    ctl = _ctl(dr, model, flat, prior_accept=0.9, timing=False)
    seen.clear()
    run_ids(model, prompts, batch_size=3, max_tokens=12, drafter=dr, speculate="auto",
            controller=ctl)
    assert seen and all(10.0 < w < 11.0 for w in seen)   # flat: 10 ms + 0.001 a token
    seen.clear()
    run_ids(model, prompts, batch_size=3, max_tokens=12)   # ar: packed tokens
    assert seen and all(w in (1, 2, 3) for w in seen)


@pytest.mark.parametrize("batch", [1, 8])
def test_timed_steps_and_contrast_steps_stay_lossless(model, batch):
    """With step times fed back (the online correction) and contrast steps run, every method's
    greedy output is still ar's."""
    prompts = _prompts(10, seed=3)
    ref, _ = run_ids(model, prompts, batch_size=batch, max_tokens=16)
    contrasts = 0
    for name, dr in method_drafters(model, prompts, ref).items():
        if dr is None:
            continue
        ctl = _ctl(dr, model, flat, draft_frac=0.01, prior_accept=0.9)
        got, st = run_ids(model, prompts, batch_size=batch, max_tokens=16, drafter=dr,
                          speculate="auto", controller=ctl)
        assert got == ref, name
        # every drafting step learnt, a run of lean steps by up to LEAN_LEARN at a time
        lean = st.lean_steps
        assert 0 < st.controlled_steps - lean <= ctl.cost.steps <= st.controlled_steps, name
        contrasts += st.contrasts
    assert contrasts > 0


def test_random_profiles_are_lossless(model):
    """Budgets anywhere between 0 and full, changing step to step: greedy still equals ar."""
    for seed in range(6):
        rng = random.Random(seed)
        prompts = _prompts(rng.randint(1, 5), seed=seed, vocab=rng.choice([8, 30]))
        mt = rng.randint(1, 20)
        ref, _ = run_ids(model, prompts, max_tokens=mt)
        slope = rng.choice([0.02, 0.1, 0.3])
        tab = table(lambda b, n: 10.0 * b * (1 + slope * (n - 1)))
        for name, dr in method_drafters(model, prompts, ref).items():
            if dr is None:
                continue
            got, _ = run_ids(model, prompts, batch_size=rng.randint(1, 4), max_tokens=mt,
                             drafter=dr, speculate="auto",
                             controller=_ctl(dr, model, tab, prior_accept=rng.random()))
            assert got == ref, (seed, name)


def test_cli_speculate_auto(tmp_path, tiny_llama):
    """generate --speculate auto and a bench method ending in :auto: same answers as ar, and the
    budgets, predicted and measured step times and goodput in metrics.json / the bench row."""
    import json

    from typer.testing import CliRunner

    from specctl.cli import app
    from specctl.runtime.jobs.config import split_variant
    assert split_variant("self-draft:light:auto")[1]["speculate"] == "auto"
    assert split_variant("draft-verify:fixed") == ("draft-verify", {"speculate": "fixed"})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n"
                               for t in ("one two three", "a b a b a b", "x")))
    skip = tmp_path / "skip.json"
    from specctl.speculative.draft_verify import SkipSet
    skip.write_text(json.dumps(SkipSet(4).to_json()))
    store = tmp_path / "store"
    common = ["--model", str(tiny_llama), "--store", str(store), "--max-tokens", "6",
              "--device", "cpu", "--dtype", "fp32", "-q"]
    outs = {}
    for spec in ("fixed", "auto"):
        out = tmp_path / f"{spec}.jsonl"
        r = CliRunner().invoke(app, ["generate", str(prompts), "--method", "draft-verify",
                                     "--skip-set", str(skip), "--speculate", spec, "-o", str(out),
                                     "-b", "2", *common])
        assert r.exit_code == 0, r.output
        outs[spec] = [json.loads(l)["text"] for l in out.read_text().splitlines()]
        (m,) = [json.loads(f.read_text()) for f in (store / "runs").glob("*/metrics.json")
                if json.loads(f.read_text())["speculation"]["mode"] == spec]
        assert m["speculation"]["mode"] == spec
        if spec == "auto":
            sp = m["speculation"]
            assert sum(sp["budget_hist"].values()) >= sp["controlled_steps"] > 0
            assert sp["explored_sequence_steps"] >= 0
            assert sp["measured_step_ms"] > 0
            # a drafting step is predicted; lean ones (ar's path) are not
            assert sp["predicted_step_ms"] > 0 or sp["lean_steps"] == sp["controlled_steps"]
            assert sp["goodput_tokens_per_s"] > 0
            # what speculation bought, estimated on the table and this run's steps
            assert m["gain_vs_ar_est"] > 0 and m["ar_tokens_per_s_est"] > 0
            assert m["tokens_per_s"] / m["ar_tokens_per_s_est"] == pytest.approx(
                m["gain_vs_ar_est"], rel=0.01)
            assert "vs ar: " in r.output and "estimated" in r.output
        else:   # no table to price by
            assert m["gain_vs_ar_est"] is None and "vs ar: not estimated" in r.output
        assert m["one_off_s"]["step_table"] >= 0
    assert outs["auto"] == outs["fixed"]
    r = CliRunner().invoke(app, ["bench", str(prompts), "--methods", "ar,draft-verify:auto",
                                 "--batch-sizes", "2", "--repeats", "1", "--warmup", "0",
                                 "--skip-set", str(skip), *common])
    assert r.exit_code == 0, r.output
    res = json.loads(next((store / "benches").glob("*/results.json")).read_text())
    row = {x["method"]: x for x in res["rows"]}["draft-verify:auto"]
    assert row["matches_ar"] and row["speculation"]["mode"] == "auto"
    assert row["speculation"]["budget_hist"]


def test_generate_says_the_gain_and_a_smaller_job_measures_no_table(tmp_path, tiny_llama,
                                                                     monkeypatch):
    """The summary's gain line; a second run with fewer prompts (fewer slots) reads its table
    off the stored one (batch 1's row and the first run's) instead of measuring."""
    import json

    from typer.testing import CliRunner

    from specctl.cli import app
    from specctl.runtime.control import steptables
    monkeypatch.setattr(steptables, "_TABLES", {})
    store = tmp_path / "store"

    def run(n):
        p = tmp_path / f"p{n}.jsonl"
        p.write_text("".join(json.dumps({"prompt": f"a b a b {i}"}) + "\n" for i in range(n)))
        r = CliRunner().invoke(app, ["generate", str(p), "--method", "self-draft", "--model",
                                     str(tiny_llama), "--store", str(store), "--max-tokens", "6",
                                     "--device", "cpu", "--dtype", "fp32", "-q", "-b", "8",
                                     "-o", str(tmp_path / f"o{n}.jsonl")])
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split())
    out = run(4)
    assert "vs ar: " in out and "estimated" in out
    assert len(list((store / "profiles").iterdir())) == 1   # measured, kept
    monkeypatch.setattr(steptables, "_TABLES", {})
    monkeypatch.setattr(steptables, "measure_step_table",
                        lambda *a, **kw: pytest.fail("measured a table again"))
    out = run(2)
    assert "vs ar: " in out and "step-cost table measured once" not in out


def test_step_table_is_kept_in_the_store(tmp_path, model, monkeypatch):
    """Measured once per model, device, dtype, attention and batch size, then read back; an
    unreadable file is measured again, with a message naming it."""
    import json

    from specctl.runtime.control import steptables as C
    from specctl.store import Store
    store = Store(tmp_path / "store")
    monkeypatch.setattr(C, "_TABLES", {})
    said = []
    t = C.step_table_for(model, 2, store=store, fingerprint="fp", log=said.append, repeats=1,
                         warmup=0)
    (entry,) = store.entries("profiles")
    assert entry.id == C.step_table_id("fp", model, 2)
    assert entry.id.startswith("fp-cpu-") and entry.id.endswith(
        f"-t{torch.get_num_threads()}-float32-{model.attention}-steps-b2")
    assert any("kept as profiles/" in m for m in said)
    monkeypatch.setattr(C, "_TABLES", {})
    monkeypatch.setattr(C, "measure_step_table", lambda *a, **kw: pytest.fail("measured again"))
    assert C.step_table_for(model, 2, store=store, fingerprint="fp", repeats=1) == t
    (entry.path / "steptable.json").write_text(json.dumps({"table": "no"}))
    monkeypatch.setattr(C, "_TABLES", {})
    monkeypatch.setattr(C, "measure_step_table", lambda *a, **kw: t)
    said.clear()
    assert C.step_table_for(model, 2, store=store, fingerprint="fp", log=said.append) == t
    assert any("unreadable step-cost table" in m for m in said)
    # a table measured by an earlier engine (other matmul forms, other costs) is measured again
    old = dict(t.to_json(), engine=C.ENGINE_COSTS - 1)
    (entry.path / "steptable.json").write_text(json.dumps(old))
    monkeypatch.setattr(C, "_TABLES", {})
    said.clear()
    assert C.step_table_for(model, 2, store=store, fingerprint="fp", log=said.append) == t
    assert any("earlier engine" in m for m in said)
    assert C.step_table_path(store, "fp", model, 2) == entry.path / "steptable.json"
    # fresh: measured again although the process and the store have it (prepare --force)
    again = StepTable.from_json(t.to_json())   # equal, another object
    monkeypatch.setattr(C, "measure_step_table", lambda *a, **kw: again)
    assert C.step_table_for(model, 2, store=store, fingerprint="fp", fresh=True) is again


def test_a_table_measured_on_a_busy_cpu_is_not_kept(tmp_path, model, monkeypatch):
    """A measurement whose process ran under BUSY of the time its threads could have (other
    processes had the cores) serves its run only, saying so; one process at a time measures a
    model's tables, the next waiting for it and reading what it kept."""
    import threading
    import fcntl

    from specctl.runtime.control import steptables as C
    from specctl.store import Store
    store = Store(tmp_path / "store")
    monkeypatch.setattr(C, "_TABLES", {})
    t = StepTable("cpu", "float32", "sdpa", 128, (1, 2), C.STEP_NS,
                  tuple(tuple(10.0 + b * n for n in C.STEP_NS) for b in (1, 2)), tiles=False)
    clock = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(C.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(C.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(C.torch, "get_num_threads", lambda: 1)   # (one CPU's time to have)

    def measure(*a, **kw):   # 2 s of wall, `share` of it on the CPU
        clock["wall"] += 2.0
        clock["cpu"] += 2.0 * share
        return t
    monkeypatch.setattr(C, "measure_step_table", measure)
    said: list = []
    share = 0.3
    assert C.step_table_for(model, 2, store=store, fingerprint="fp", log=said.append) is t
    assert any("CPU was busy" in m and "30%" in m for m in said), said
    assert not store.entries("profiles")
    # a quiet measurement is kept; a second process waits for the first's
    monkeypatch.setattr(C, "_TABLES", {})
    share = 0.9
    lock = open(store.root / "work" / f".measuring-{C.step_table_id('fp', model, 0)}", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    said.clear()
    th = threading.Thread(target=C.step_table_for, args=(model, 2),
                          kwargs=dict(store=store, fingerprint="fp", log=said.append))
    th.start()
    th.join(1.0)
    assert th.is_alive() and any("waiting for it" in m for m in said), said
    # the holder keeps its table; the waiting one reads it, measuring nothing
    C._measure(model, 2, (1, 2), C.STEP_NS, C.STEP_CONTEXT, 1, 0, None, store, "fp",
               lambda m: None)
    again: list = []   # (a failure raised in the thread would not fail the test)
    monkeypatch.setattr(C, "measure_step_table", lambda *a, **kw: again.append(1) or t)
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    th.join(10.0)
    assert not th.is_alive() and [e.id for e in store.entries("profiles")] == \
        [C.step_table_id("fp", model, 2)]
    assert not again and not any("measured in" in m for m in said), said


def test_a_table_no_machine_could_measure_is_measured_again_and_never_kept(tmp_path, model,
                                                                           monkeypatch):
    """A table pricing a step of more sequences below one of fewer (one measured beside another
    process's work read batch 1 at 17x batch 64, and every later run on the machine claimed
    2x against `ar` while it lost) is measured once more as it is made, kept only when the
    second is plausible, and refused where the store holds one: measured again."""
    from specctl.runtime.control import steptables as C
    from specctl.store import Store
    store = Store(tmp_path / "store")

    def table(b1_scale):
        return StepTable("cpu", "float32", "sdpa", 128, (1, 2), C.STEP_NS,
                         tuple(tuple(s * (10.0 + b * n) for n in C.STEP_NS)
                               for b, s in ((1, b1_scale), (2, 1.0))), tiles=False)
    bad, good = table(15.0), table(1.0)
    assert "batch 2 x 1 tokens" in bad.implausible() and good.implausible() is None
    assert table(1.15).implausible() is None and table(1.9).implausible() is None   # (noise)
    for got in ([bad, bad], [bad, good]):
        monkeypatch.setattr(C, "_TABLES", {})
        made, said = list(got), []
        monkeypatch.setattr(C, "measure_step_table", lambda *a, **kw: made.pop(0))
        assert C.step_table_for(model, 2, store=store, fingerprint="fp",
                                log=said.append) is got[1]
        assert not made and any("measuring it again" in m for m in said), said
        kept = [e.id for e in store.entries("profiles")]
        assert kept == ([] if got[1] is bad else [C.step_table_id("fp", model, 2)]), kept
        assert (got[1] is bad) == any("measured wrong twice" in m for m in said), said
    # a stored table that is implausible (an earlier version kept them) is measured again
    C.step_table_path(store, "fp", model, 2).write_text(json.dumps(bad.to_json()))
    monkeypatch.setattr(C, "_TABLES", {})
    said.clear()
    monkeypatch.setattr(C, "measure_step_table", lambda *a, **kw: good)
    assert C.step_table_for(model, 2, store=store, fingerprint="fp", log=said.append) is good
    assert sum("measured wrong" in m and "measuring again" in m for m in said) == 1, said


def test_a_batch_size_between_stored_ones_is_interpolated(tmp_path, model, monkeypatch):
    """Tables stored for batch 2 and 8: batch 5 is read off the line between their rows, not
    measured (a file of 5 prompts after runs of 2 and 8), batch 1 is their row; batch 9, past
    them, is measured."""
    from specctl.runtime.control import steptables as C
    from specctl.store import Store
    store = Store(tmp_path / "store")
    monkeypatch.setattr(C, "_TABLES", {})

    def measure(model, batches, ns, **kw):
        measured.append(batches)
        return StepTable("cpu", "float32", "sdpa", 128, tuple(batches), tuple(ns),
                         tuple(tuple(10.0 + b * n for n in ns) for b in batches), tiles=False)
    measured: list = []
    monkeypatch.setattr(C, "measure_step_table", measure)
    for b in (2, 8):
        C.step_table_for(model, b, store=store, fingerprint="fp")
    said: list = []
    t = C.step_table_for(model, 5, store=store, fingerprint="fp", log=said.append)
    assert measured == [(1, 2), (1, 8)] and t.batches == (1, 5)
    assert t.table[1] == pytest.approx([10.0 + 5 * n for n in t.ns])
    assert any("read off the stored batches [1, 2, 8]" in m for m in said)
    assert not store.path("profiles", C.step_table_id("fp", model, 5)).exists()
    said.clear()
    one = C.step_table_for(model, 1, store=store, fingerprint="fp", log=said.append)
    assert one.batches == (1,) and one.table[0] == t.table[0] and len(measured) == 2
    assert any("the stored row of batch 1" in m for m in said), said   # (every table has it)
    C.step_table_for(model, 9, store=store, fingerprint="fp")
    assert measured[-1] == (1, 9)
    # tables measured apart that disagree (batch 8's on a machine 2.5x slower then: each is
    # plausible, batch 5 read off both would price 5 sequences below 1) are not read together
    slow = StepTable("cpu", "float32", "sdpa", 128, (1, 8), tuple(C.STEP_NS),
                     tuple(tuple(2.5 * (10.0 + b * n) for n in C.STEP_NS) for b in (1, 8)),
                     tiles=False)
    C.step_table_path(store, "fp", model, 8).write_text(json.dumps(slow.to_json()))
    monkeypatch.setattr(C, "_TABLES", {})
    said.clear()
    t = C.step_table_for(model, 5, store=store, fingerprint="fp", log=said.append)
    assert measured[-1] == (1, 5) and t.batches == (1, 5)
    assert sum("disagree" in m for m in said) == 1, said


def test_step_table_seconds_counts_the_measured_steps():
    from specctl.runtime.control.steptables import (STEP_NS, STEP_REPEATS, STEP_WARMUP,
                                                    step_table_seconds)
    runs = STEP_WARMUP + STEP_REPEATS   # each point: warm-up, then timed repeats
    # batches 1 and 8, and each round's first point once more (untimed, to warm it)
    assert step_table_seconds(8, lambda b, n: b * n) == \
        runs * 9 * (sum(STEP_NS) + STEP_NS[0])
    assert step_table_seconds(1, lambda b, n: 1.0) == runs * (len(STEP_NS) + 1)


def test_exploration_costs_at_most_its_share():
    """Exploring with two layer-skip draft forwards costs ~1.8 steps here: at a 2% share it
    waits ~90 steps between explorations, not 32."""
    cost = StepCost(table(lambda b, n: 10.0 * b), draft_frac=0.9)
    ctl = Ctl(cost, 12, prior_accept=0.01)
    explored = [i for i in range(1, 301) if any(ctl.budgets([0, 1], [100, 100]))]
    assert len(explored) == 3 and explored[0] >= 90 and min(
        b - a for a, b in zip(explored, explored[1:])) >= 90, explored
    cheap = Ctl(StepCost(table(lambda b, n: 10.0 * b * (1 + 0.05 * (n - 1)))), 12,
                       prior_accept=0.01)
    assert sum(any(cheap.budgets([0, 1], [100, 100])) for _ in range(320)) == 10   # every 32


def test_probes_run_only_where_they_cost_little(model):
    """Self-Draft's branches (36 probe tokens) at a cost that is flat in n run beside the
    drafts; where they would make a step 4x dearer the step drafts its candidates without
    them. Either way greedy equals ar."""
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    assert StepCost(flat, probe=36).tokens(3) == 40
    prompts = _prompts(3, seed=4, vocab=8)
    ref, _ = run_ids(model, prompts, batch_size=3, max_tokens=16)
    dear = table(lambda b, n: 10.0 * b * (1 + 0.1 * (n - 1)))
    seen = {}
    for name, tab in (("flat", flat), ("dear", dear)):
        dr = SelfDraftDrafter(SelfDraftParams(), None)
        ctl = _ctl(dr, model, tab, prior_accept=0.9)
        got, st = run_ids(model, prompts, batch_size=3, max_tokens=16, drafter=dr,
                          speculate="auto", controller=ctl)
        assert got == ref, name
        assert max(st.budget_hist) > 0, name
        seen[name] = st.probe_tokens
    assert seen["flat"] > 0 and seen["dear"] == 0


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_confidence_stops_stay_lossless(model, batch):
    """Chains cut short by the stop rule (a run that has learnt that drafts under 0.5
    confidence are rejected): fewer drafts, greedy output still ar's."""
    prompts = _prompts(10, seed=2)
    ref, _ = run_ids(model, prompts, batch_size=batch, max_tokens=16)
    mid = table(lambda b, n: 10.0 * b * (1 + 0.05 * (n - 1)))
    for name in ("draft-verify", "kangaroo"):
        dr = method_drafters(model, prompts, ref)[name]
        ctl = _ctl(dr, model, mid, draft_frac=0.05, prior_accept=0.9, explore_every=0)
        for b in range(5):   # learnt: under 0.5 nothing is accepted
            ctl.acc.calib.tried[b], ctl.acc.calib.hit[b] = 1000.0, 0.0
        got, st = run_ids(model, prompts, batch_size=batch, max_tokens=16, drafter=dr,
                          speculate="auto", controller=ctl)
        assert got == ref, name
        assert st.confidence_stops > 0 and max(st.budget_hist) > 1, name


def test_a_drafter_that_exits_at_once_loses_its_budget():
    """Budgets learnt against what they bought: a chain drafter whose confidence exit drops
    every draft (draft forwards paid, nothing verified) is soon given budget 0; counted by what
    it drafted instead, it would keep its budget (and its draft forwards) for good."""
    mid = table(lambda b, n: 10.0 * b * (1 + 0.05 * (n - 1)))
    for attempted, learns in ((True, True), (None, False)):
        ctl = Ctl(StepCost(mid, draft_frac=0.2), 4, prior_accept=0.9, explore_every=0)
        for _ in range(40):
            ks = ctl.budgets([0], [10])
            ctl.learn([0], [0], [[]], [[]], [True] if attempted else None)
        assert (ks == [0]) == learns, ks
    # stop_rule's early end is where the chain's learning stops: no miss after it
    ctl = Ctl(StepCost(mid, draft_frac=0.2), 4, prior_accept=0.9, explore_every=0)
    ks = ctl.budgets([0], [10])
    # as the chain loop reports a chain stop_rule ended at 2 drafts
    ctl.learn([0], [2], [[0, 1]], [[0.9, 0.9]], [True], stopped=[2])
    assert ctl.acc.seq_stats(0).tried.tolist() == [1, 1]


def test_gain_vs_ar_takes_the_job_excess_off_the_run_time():
    """10 s of decoding, its job account 4 s ahead of ar (a negative excess): ar runs 14 s,
    the gain is 1.4x; an ar run is its own estimate; without the controller, none."""
    from specctl.runtime.jobs.metrics import gain_vs_ar
    from specctl.runtime.step.stats import RunStats
    st = RunStats(controlled_steps=10, job_excess_ms=-4000.0)
    got = gain_vs_ar(st, 50.0, 10.0, plain=False)
    assert got["gain_vs_ar_est"] == pytest.approx(1.4)
    assert got["ar_tokens_per_s_est"] == pytest.approx(50.0 / 1.4, abs=1e-3)
    assert gain_vs_ar(st, 50.0, 10.0, plain=True) == {"ar_tokens_per_s_est": 50.0,
                                                       "gain_vs_ar_est": 1.0}
    assert gain_vs_ar(RunStats(), 50.0, 10.0, plain=False)["gain_vs_ar_est"] is None



def test_a_drafting_sequences_host_work_is_priced_per_sequence_not_as_a_ratio():
    """A drafting sequence's host work (its proposal, tree, verification and commit), timed
    apart from the forward, is priced per sequence drafting: measured at batch 64, where it
    costs more than the forward and drafting stops, it still lets batch 1 draft, where the
    same work is a small share of a step (a ratio learnt at 64 would stop batch 1 too: the
    H100 at batch 64 ran Self-Draft at 0.61x ar with its host work unpriced). And a machine
    uniformly slower than its table moves no host price: the host's time is measured, not
    inferred from the step's total."""
    wide = table(lambda b, n: 2.0 + 0.02 * b * n, batches=(1, 2, 4, 8, 16, 32, 64))
    ctl = Ctl(StepCost(wide), 4, prior_accept=0.7, explore_every=0)
    big, one = list(range(64)), [100]
    assert min(ctl.budgets(big, [100] * 64)) > 0 and ctl.budgets(one, [100]) == [4]
    c = ctl.cost
    for _ in range(8):   # lean steps: 1.5 us of host a sequence
        c.learn_host(64, 0.096)
        c.learn([0] * 64, 3.3, False)
    for _ in range(4):   # drafting steps: 80 us of host work a drafting sequence
        host = 0.096 + 64 * 0.08
        extra = c.learn_host(64, host, 64)
        c.learn([4] * 64, c.table_ms([4] * 64)[0] + host, False, extra)
    assert c.host_fit() == (0.0, pytest.approx(0.08))
    assert c.step_ms([4] * 64, False) > c.table_ms([4] * 64)[0] + 5.0
    assert ctl.budgets(big, [100] * 64) == [0] * 64
    assert ctl.budgets(one, [100]) == [4]   # 80 us on a ~2 ms step: still worth it
    slow = Ctl(StepCost(wide), 4, prior_accept=0.7, explore_every=0)
    for _ in range(4):   # 3x the table, host work nothing beyond a lean step's
        slow.cost.learn_host(64, 0.1)
        slow.cost.learn([0] * 64, 3 * slow.cost.table_ms([0] * 64)[0], False)
        extra = slow.cost.learn_host(64, 0.1, 64)
        slow.cost.learn([4] * 64, 3 * slow.cost.table_ms([4] * 64)[0], False, extra)
    assert slow.cost.host_fit() == (0.0, pytest.approx(0.0, abs=1e-9))


@pytest.mark.parametrize("accepted", [False, True])
def test_the_step_after_the_runs_first_drafting_step_waits_for_its_verdicts(accepted):
    """Where a step is learnt a step late (under the next one's forward), the step after the
    run's first drafting step is decided before that one is learnt: it drafts on the prior
    only where the first had at least half the drafts it expected accepted (verified, told at
    once), else it is a lean step; once a drafting step is learnt, steps draft as the search
    says."""
    ctl = Ctl(StepCost(flat, True), 4, prior_accept=0.7, explore_every=0, wait_first=True)
    keys = list(range(4))
    first = ctl.plan(keys, [100] * 4)
    assert min(first.ks) > 0 and ctl.unlearnt == 1
    ctl.verified(first, [Verdict([0] if i == 2 else [], 0) for i in keys])   # (too few)
    assert min(ctl.plan(keys, [100] * 4).ks) == 0
    ctl.verified(first, [Verdict([0, 0, 0] if accepted else [], 0) for i in keys])
    assert (min(ctl.plan(keys, [100] * 4).ks) > 0) == accepted
    props = [Proposal(DraftTree.chain([0] * k)) for k in first.ks]
    ctl.observe(keys, first, props, [Verdict([], 0)] * 4, 10.0, 0.1)   # (learnt: timed)
    assert min(ctl.plan(keys, [100] * 4).ks) > 0


def test_drafting_host_work_is_fitted_as_a_steps_part_and_a_part_a_sequence():
    """What a drafting step's host work costs beyond a lean step's: a part every drafting step
    pays (its search's verdicts, the controller's learning of it) and a part per sequence
    drafting, fitted over steps of different drafting counts, robust to one page-in; while
    every step had as many drafting, the whole is that count's share a sequence (no step part
    can be told apart then)."""
    c = StepCost(table(lambda b, n: 2.0 + 0.02 * b * n, batches=(1, 2, 4, 8, 16, 32, 64)))
    c.learn_host(64, 0.064)   # a lean step: 1 us of host a sequence
    for n in (8, 64, 8):
        c.learn_host(64, 0.064 + 1.0 + 0.05 * n, n)
    assert c.host_fit() == (pytest.approx(1.0), pytest.approx(0.05))
    c.learn_host(64, 0.064 + 1.0 + 0.05 * 32 + 30.0, 32)   # a page-in
    assert c.host_fit() == (pytest.approx(1.0), pytest.approx(0.05))
    assert float(c.host_ms(64)) == pytest.approx(4.2) and float(c.host_ms(0)) == 0.0
    ms, kind = c.counts_ms((56, 8))   # (a step's price: the table's, corrected, + the host's)
    assert c.counts_step_ms((56, 8)) == pytest.approx(ms * c.factor(kind) + 1.4)
    one = StepCost(c.table)
    one.learn_host(8, 0.008)
    one.learn_host(8, 0.008 + 1.0 + 0.05 * 8, 8)   # one count only: its share a sequence
    assert one.host_fit() == (0.0, pytest.approx(1.4 / 8))


def test_a_grids_host_is_priced_for_every_sequence_of_a_step_that_drafts():
    """On a grid (StepCost.chain) a drafting step plans, verifies and commits every
    sequence's rows, a budget of 0 or not: its host work is learnt and priced for the whole
    batch once any sequence drafts (StepCost.hosted), so a step of 3 drafting costs what one
    of 64 drafting did; per drafting sequence (the per-sequence path's) it is 3/64 of that."""
    t = table(lambda b, n: 2.0 + 0.02 * b * n, batches=(1, 2, 4, 8, 16, 32, 64))
    for chain in (4, 0):
        c = StepCost(t, chain=chain)
        c.learn_host(64, 0.1)   # a lean step
        for _ in range(3):      # every sequence drafting: 2 ms beyond the lean step's host
            c.learn_host(64, 2.1, 64)
        ms, kind = c.counts_ms((61, 3))
        few = c.counts_step_ms((61, 3)) - ms * c.factor(kind)
        sh = Shapes.of_counts((61, 3), False)
        assert float(c.prices(sh)[0]) == pytest.approx(c.counts_step_ms((61, 3)))
        assert few == pytest.approx(2.0 if chain else 2.0 * 3 / 64)
        assert c.counts_step_ms((64,)) == pytest.approx(c.counts_ms((64,))[0] * c.factor(
            c.counts_ms((64,))[1]))   # (a lean step: no drafting host)


def test_draft_forwards_are_priced_with_a_lean_steps_host_until_a_drafting_step_is_timed():
    """Each draft forward spends the host what a lean step of as many sequences does (its
    batch, launch and read-back), which the table does not price: until a drafting step has
    been timed it is priced so (StepCost.untimed_host); from then on host_fit's measure is
    the price. Nothing for a drafter without draft forwards, nor before a lean step's host
    is known."""
    t = table(lambda b, n: 2.0 + 0.02 * b * n)
    c = StepCost(t, draft_frac=0.3, draft_extra=1, tail_frac=0.2, idle_whole=True)   # (Kangaroo)
    plain = [c.step_ms([k]) for k in (0, 2)]
    c.learn_host(1, 0.3)   # a lean step of one sequence: 0.3 ms of host
    assert c.step_ms([2]) == pytest.approx(plain[1] + 3 * 0.3)   # 2 drafts + the tail forward
    assert c.step_ms([0]) == pytest.approx(plain[0])   # (its lean step: one plain forward)
    got = c.prices(Shapes.of_counts((0, 0, 1), True))   # (the search's prices too)
    assert float(got[0]) == pytest.approx(c.step_ms([2]))
    c.learn_host(1, 0.3 + 1.0, 1)   # a drafting step timed: its measure prices from now on
    assert c.step_ms([2]) == pytest.approx(plain[1] + 1.0)
    tree = StepCost(t)   # (no draft forwards)
    tree.learn_host(1, 0.3)
    ms, kind = tree.counts_ms((0, 0, 1))
    assert tree.step_ms([2]) == pytest.approx(ms * tree.factor(kind))


def test_a_drains_first_drafting_step_is_priced_with_its_host_work():
    """While the batch drains, a step that would draft before any drafting step has been
    timed waits for a lean step's host time, and is then priced DRAIN_HOST lean steps of host
    more (StepCost.untimed_host): a lesson learnt in a drain comes too late to pay (on the
    host-charged clock every method's drain at batch 32-64 drafted one or two steps on the
    prior, each saving no step, and ran 0.96-0.98x ar). With requests waiting the same step
    drafts as before, and once a drafting step is timed its measure prices a drain too. A
    gain that covers the price still drafts, and a drain of one sequence drafts at once."""
    from specctl.runtime.control.stepcost import DRAIN_HOST
    t = table(lambda b, n: 2.0 + 0.001 * b * n, batches=(1, 2, 4, 8, 16, 32, 64))
    keys = list(range(32))

    def ctl(accept):
        return Controller(StepCost(t, True), 4, prior_accept=accept, explore_every=0,
                          wait_first=True)
    c = ctl(0.7)
    assert c.plan(keys, [60] * 32, drain=True).lean   # (no lean step's host timed yet)
    c.lean_done(32, 2.05, 1, 0.2, 1)                  # a lean step: 0.2 ms of host
    cost = c.cost
    cost.draining = True
    ms, kind = cost.counts_ms((0, 32))
    assert cost.step_ms([1] * 32) == pytest.approx(ms * cost.factor(kind) + DRAIN_HOST * 0.2)
    assert c.plan(keys, [60] * 32, drain=True).lean   # the prior's slowest gains less
    waiting = ctl(0.7)
    waiting.lean_done(32, 2.05, 1, 0.2, 1)
    assert not waiting.plan(keys, [60] * 32).lean     # (not a drain: as before)
    one = ctl(0.7)   # (a drain of one sequence does not wait: its gains are all critical)
    assert not one.plan([0], [60], drain=True).lean
    sure = ctl(0.99)
    sure.lean_done(32, 2.05, 1, 0.2, 1)
    assert not sure.plan(keys, [60] * 32, drain=True).lean   # a gain worth the price
    timed = ctl(0.7)
    timed.lean_done(32, 2.05, 1, 0.2, 1)
    timed.cost.learn_host(32, 0.25, 32)   # a drafting step timed: its host is known
    assert not timed.plan(keys, [60] * 32, drain=True).lean


def test_a_drafter_with_draft_forwards_drafts_once_a_step_is_timed():
    """The run's first steps are lean until a lean step's host time is known, where the
    drafter runs draft forwards: its first drafting step is then priced with their host
    work. On the host-charged clock Kangaroo's first drafting step at batch 1, priced 3.2 ms,
    took 5.2-5.8 (its three draft forwards' host work), ~3% of a 64-token drain."""
    t = table(lambda b, n: 2.0 + 0.001 * b * n)
    ctls = [Ctl(StepCost(t, draft_frac=0.05), 4, prior_accept=0.9, explore_every=0,
                wait_first=True) for _ in range(2)]
    for ctl, host, want in zip(ctls, (0.05, 2.0), ([4], [0])):
        assert ctl.budgets([0], [100]) == [0]   # nothing timed yet
        ctl.lean_done(1, 2.0, 1, host, 1)       # a lean step, with its host time
        assert ctl.budgets([0], [100]) == want  # (a host as dear as a forward: no drafting)
    tree = Ctl(StepCost(t), 4, tree=True, prior_accept=0.9, explore_every=0, wait_first=True)
    assert tree.budgets([0], [100]) == [4]   # (no draft forwards: no wait)
    sampled = Ctl(StepCost(t, draft_frac=0.05), 4, prior_accept=0.9, explore_every=0,
                  wait_first=True)
    assert sampled.budgets([0], [100]) == [0]
    sampled.lean_done(1, 2.0)   # timed without its host's share (sampling verifies on the
    assert sampled.budgets([0], [100]) == [4]   # device): drafting is priced as before


def test_a_lean_steps_host_is_priced_by_its_batch_size():
    """What drafting adds to a step's host time is measured against a lean step of the same
    batch size: a lean step's host is part a step's, part a sequence's, so as a drain shrinks
    to batch 1 its share a sequence grows (~190 us against ~40 at batch 8 on the demo model's
    clock); read as a share a sequence it priced batch 8's lean step above its drafting steps,
    and drafting's host work at nothing."""
    c = StepCost(table(lambda b, n: 2.0 + 0.02 * b * n))
    c.learn_host(8, 0.32)   # a lean step at batch 8: 40 us a sequence
    for _ in range(3):      # drafting steps of 8: 0.1 ms a drafting sequence more
        c.learn_host(8, 0.32 + 0.8, 8)
    fit = c.host_fit()
    assert float(c.host_ms(8)) == pytest.approx(0.8)
    c.learn_host(1, 0.19, 0, 32)   # the drain's tail: lean steps of one sequence
    assert c.host_fit() == fit and float(c.host_ms(8)) == pytest.approx(0.8)
    assert c.lean_at(4) == pytest.approx(4 * c.lean_host)   # (a size never run lean)


def test_a_steps_learning_prices_its_own_kind_at_once():
    """After a step is learnt, its kind's next price reads the drift and ratios the step just
    moved, as every other kind's does (learn once cached its kind's factor as it stood before
    the step: that kind was priced a step late)."""
    c = StepCost(table(lambda b, n: 2.0 + 0.02 * b * n))
    for ms in (3.0, 3.1, 2.9, 6.0, 6.2, 5.8, 6.1):   # the machine turns slower midway
        c.learn([2] * 8, ms, False)
        kind = c.counts_ms((0, 0, 8), False)[1]
        assert c.factor(kind) == pytest.approx(
            math.exp(c.drift + c._rel(kind[3:]) + c._rel(kind)), rel=1e-12)


def test_one_outlying_first_lean_step_does_not_price_lean_steps():
    """A run's first lean step that hit 26 ms of page faults (43x its table price) is learnt
    as at most StepCost.FIRST_OFF x what it was expected to cost, and as at most
    guard.AR_OFF x `ar`'s price in the guard; the lean steps after it (at 1.5x the table)
    bring both back within 10% in a dozen steps. Taken at face value it priced lean steps at
    5-20x theirs for ~60 steps of a b8 run on the demo model, and every step drafted at a
    loss (bench-results/2026-11-29-grid-device)."""
    from specctl.runtime.control.guard import AR_OFF
    from specctl.runtime.control.stepcost import FIRST_OFF
    c = Ctl(StepCost(table(lambda b, n: 2.0 * (1 + 0.1 * (n - 1)))), 4, tree=True,
            prior_accept=0.7, explore_every=0)
    lean = c.cost.table_ms([0] * 8)[0]
    c.lean_done(8, 43 * lean)
    assert c.cost.step_ms([0] * 8) <= FIRST_OFF * lean * 1.001
    assert c.guard.ar_ms(lean) <= AR_OFF * lean * 1.001
    for _ in range(12):
        c.lean_done(8, 1.5 * lean)
    assert c.cost.step_ms([0] * 8) == pytest.approx(1.5 * lean, rel=0.1)
    assert c.guard.ar_ms(lean) == pytest.approx(1.5 * lean, rel=0.1)


def test_a_steady_ratio_far_off_the_table_is_learnt_at_once_by_the_guard():
    """Lean steps that all take 10x (or 43x) their table price are a machine unlike the
    table's, not a page-in: the guard's `ar` price is theirs from the second such step (the
    bound kept the first at 4x, and a running mean would have carried it for dozens)."""
    from specctl.runtime.control.guard import Guard
    for far in (10.0, 43.0):
        g = Guard()
        g.lean(2.0, far * 2.0)
        assert g.ar_ms(2.0) == pytest.approx(4 * 2.0)
        g.lean(2.0, far * 2.0)
        assert g.ar_ms(2.0) == pytest.approx(far * 2.0)
        for _ in range(5):
            g.lean(2.0, far * 2.0)
        assert g.ar_ms(2.0) == pytest.approx(far * 2.0)
