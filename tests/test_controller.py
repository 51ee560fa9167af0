"""The goodput controller on synthetic step-cost profiles (no model, fast)."""

from __future__ import annotations

import pytest

from specctl.engine.steptable import StepTable
from specctl.runtime.controller import Controller, StepCost

NS = (1, 2, 4, 8, 16, 32, 64)


def table(f, batches=(1, 8)) -> StepTable:
    """A synthetic table: ms(b, n) = f(b, n)."""
    return StepTable("cpu", "float32", "sdpa", 128, tuple(batches), NS,
                     tuple(tuple(float(f(b, n)) for n in NS) for b in batches))


steep = table(lambda b, n: 10.0 * b * n)            # every extra token costs a whole step
flat = table(lambda b, n: 10.0 + 0.001 * b * n)     # verifying more is nearly free


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_steep_cost_gives_budget_zero(tree, padded):
    ctl = Controller(StepCost(steep, padded, probe=6 if tree else 0), 12, tree=tree,
                     prior_accept=0.95)
    for b in (1, 8):
        assert ctl.budgets(list(range(b)), [100] * b) == [0] * b


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_flat_cost_gives_full_budget(tree, padded):
    ctl = Controller(StepCost(flat, padded), 12, tree=tree, prior_accept=0.7)
    for b in (1, 8):
        assert ctl.budgets(list(range(b)), [100] * b) == [12] * b
    # the room still caps it
    assert ctl.budgets([0, 1], [3, 0]) == [3, 0]


def test_draft_forward_cost_counts():
    # verify nearly free, but each draft forward costs as much as a step: no drafting
    ctl = Controller(StepCost(flat, draft_frac=1.0), 6, prior_accept=0.7)
    assert ctl.budgets([0], [10]) == [0]
    # a cheap draft forward with confident drafts: the full budget
    ctl = Controller(StepCost(flat, draft_frac=0.01), 6, prior_accept=0.9)
    assert ctl.budgets([0], [10]) == [6]


def test_mixed_batch_gives_more_to_sequences_that_accept_more():
    # verify cost grows with the total tokens: speculation pays only for good acceptors
    mid = table(lambda b, n: 10.0 * b * (1 + 0.08 * (n - 1)))
    ctl = Controller(StepCost(mid), 12, prior_accept=0.5)
    keys = list(range(8))
    for _ in range(30):   # sequences 0-3 accept everything, 4-7 nothing
        ctl.observe(keys, [6] * 8, [list(range(6)) if k < 4 else [] for k in keys])
    ks = ctl.budgets(keys, [100] * 8)
    assert min(ks[:4]) > max(ks[4:]), ks
    assert max(ks[4:]) == 0 and min(ks[:4]) >= 4


def test_tree_mixed_batch():
    mid = table(lambda b, n: 10.0 * b * (1 + 0.05 * (n - 1)))
    ctl = Controller(StepCost(mid), 20, tree=True, prior_accept=0.3)
    keys = [0, 1]
    for _ in range(30):   # seq 0's first two trie nodes are always accepted; seq 1 never
        ctl.observe(keys, [20, 20], [[0, 1], []])
    ks = ctl.budgets(keys, [100, 100])
    assert ks[0] >= 2 and ks[1] == 0, ks


def test_pooled_prior_for_new_sequences():
    mid = table(lambda b, n: 10.0 * b * (1 + 0.2 * (n - 1)))
    ctl = Controller(StepCost(mid), 8, prior_accept=0.2)
    assert ctl.budgets([0], [10]) == [0]         # a pessimistic prior: ar
    for _ in range(50):
        ctl.observe([0], [8], [list(range(8))])  # the pool learns drafts are accepted
    assert ctl.budgets([99], [10])[0] > 0        # a new sequence starts from the pool
    assert ctl.report()["budget_hist"]


def test_gain_of_a_chain():
    ctl = Controller(StepCost(flat), 3, prior_accept=0.5, prior_weight=1.0)
    assert ctl.gains(0, 3) == pytest.approx([1, 1.5, 1.75, 1.875])
