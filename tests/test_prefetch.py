"""The next step's search made while a step's forward runs (Controller.prefetch): taken by the
next step when it is that step's, for its sequences, never by a sequence it was not made for."""

from __future__ import annotations

import pytest

from specctl.engine.steptable import StepTable
from specctl.runtime.control import policy
from specctl.runtime.control.controller import Controller
from specctl.runtime.control.stepcost import StepCost
from specctl.speculative.drafter import DraftPrice

# a step of up to 8 tokens a sequence costs what one does: the search gives the level of 6
FLAT = StepTable("cuda", "float32", "sdpa", 128, (1, 4), (1, 2, 4, 8, 16, 32, 64),
                 ((1.0, 1.0, 1.0, 1.0, 1.01, 1.3, 1.6),) * 2)


@pytest.fixture
def counted(monkeypatch):
    """(a padded controller with chains of up to 6, the list its searches append to)"""
    searched = []
    search = policy.search
    monkeypatch.setattr(policy, "search",
                        lambda *a, **kw: searched.append(1) or search(*a, **kw))
    # (each decide is the search's, not the rule on a run's first drafting step)
    return Controller(StepCost.of(FLAT, DraftPrice(max_draft=6), padded=True), 6,
                      wait_first=False), searched


def test_the_next_step_takes_it_capped_by_its_room(counted):
    """Over the room less this step's sure token; each budget capped by the room then; a
    sequence admitted since at the search's level; another drain flag searches anew."""
    ctl, searched = counted
    ctl.prefetch([0, 1, 2], lambda: [9, 9, 3], False)
    assert len(searched) == 1 and ctl._next is not None
    b = ctl.decide([0, 1, 5], [9, 2, 9], False)   # (sequence 2 retired, 5 admitted)
    assert len(searched) == 1, "the prefetched search was not taken"
    assert b.ks == (6, 2, 6)   # (0's as searched, 1's capped by its room, 5 at the level)
    ctl.prefetch([0, 1, 5], lambda: [9, 9, 9], False)
    ctl.decide([0, 1, 5], [9, 9, 9], True)   # (the queue emptied: a drain, priced otherwise)
    assert len(searched) == 3


def test_a_drain_takes_it_only_for_its_own_sequences(counted):
    """A drain's budgets are its sequences' critical path: the same sequences, or some of them
    as others end, take the prefetched budgets; a sequence it did not price searches anew."""
    ctl, searched = counted
    ctl.prefetch([0, 1], lambda: [9, 9], True)
    k = ctl._next.ks[0]
    b = ctl.decide([0], [9], True)   # (sequence 1 ended)
    assert len(searched) == 1 and b.ks == (k,)
    ctl.prefetch([0, 1], lambda: [9, 9], True)
    ctl.decide([0, 1], [9, 9], True)
    assert len(searched) == 2
    ctl.prefetch([0, 1], lambda: [9, 9], True)
    ctl.decide([0, 2], [9, 9], True)
    assert len(searched) == 4


def test_a_slot_given_to_another_sequence_gets_nothing_of_the_last(counted):
    """A sequence that retires after the prefetch (Controller.forget) leaves neither its
    budget nor its gains to the request admitted into its slot; a new run starts with none."""
    import numpy as np
    ctl, searched = counted
    ctl.acc.learn(1, 6, list(range(6)))   # (slot 1's sequence accepts everything)
    ctl.prefetch([0, 1], lambda: [9, 3], False)
    high = ctl._next.gains[1].copy()
    ctl.forget(1)
    b = ctl.decide([0, 1], [9, 9], False)
    assert len(searched) == 1 and b.ks == (6, 6)   # (the newcomer at the search's level)
    fresh = ctl.acc.gains_many([0, 1])[1]
    assert np.allclose(b.gains[1], fresh) and not np.allclose(b.gains[1], high)
    ctl.prefetch([0, 1], lambda: [9, 9], False)
    ctl.new_run()
    ctl.decide([0, 1], [9, 9], False)
    assert len(searched) == 3


@pytest.mark.parametrize("case", ["same", "capped", "admitted", "refit", "forgot", "explores",
                                  "due", "drain"])
def test_the_prefetched_decision_is_the_one_decide_works_out(counted, monkeypatch, case):
    """Where the next step is the prefetch's own (its sequences, in order, within their room,
    nothing to explore) decide hands out the budgets the prefetch made under the forward
    (Controller._ready), pricing nothing on the step's path; in every case its answer and
    what it leaves are those decide works out itself."""
    import copy

    from specctl.runtime.control.stepcost import StepCost as Cost
    ctl, searched = counted
    ctl.acc.learn(0, 6, [0, 1])   # (sequence 0 known: rows that move with the order)
    ctl.acc.learn(5, 6, list(range(6)))   # (and 5, admitted below: gains of its own)
    keys, room = [0, 1, 2], [9, 9, 9]
    drain = False
    if case in ("explores", "due"):   # (an exploring step is due next: its room then, or
        ctl.steps = ctl.explore_every   # only the room decide sees, one more than prefetch's)
        room = [99] * 3 if case == "explores" else [ctl.explore_every] * 3
    ctl.prefetch(keys, lambda: room, False)
    if case == "capped":
        room = [9, 1, 9]
    elif case == "drain":
        drain = True
    elif case == "admitted":
        keys = [0, 1, 5]
    elif case == "refit":   # (under a prefill: another batch's order, gains worked out anew)
        keys = [2, 1, 0]
        ctl.prefetch_missing(keys, lambda: room, False)
    elif case == "forgot":
        ctl.forget(2)
    ready = ctl._next is not None and ctl._next.ready is not None
    slow = copy.deepcopy(ctl)
    if slow._next is not None:
        slow._next.ready = None
    priced = []
    step_ms = Cost.step_ms
    monkeypatch.setattr(Cost, "step_ms", lambda *a, **kw: priced.append(1) or step_ms(*a, **kw))
    got, want = ctl.decide(keys, room, drain), slow.decide(keys, room, drain)
    fields = ("ks", "probes", "predicted_ms", "explored", "contrast", "stops", "base", "lean")
    assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields]
    assert (got.gains == want.gains).all()
    state = ("steps", "idle", "lean_until", "unlearnt", "last_explore", "last_bare", "_next")
    assert [getattr(ctl, f) for f in state] == [getattr(slow, f) for f in state]
    assert any(got.ks)
    if case == "same":   # (only the slow one priced its step)
        assert len(priced) == 1 and len(searched) == 1
    if case == "due":    # (the prefetch's step did not explore, decide's does)
        assert ready and got.base is not None


def test_a_search_serves_the_next_steps_while_its_inputs_hold(counted):
    """prefetch keeps its last search's budgets for the same sequences in the same order and
    drain flag, up to KEEP_STEPS steps, while what was learnt of them since is under KEEP_NEW
    of what was known (Controller._kept); anything else searches anew."""
    from specctl.runtime.control import controller as cm
    ctl, searched = counted
    keys, room = [0, 1, 2], lambda: [9, 9, 9]

    def learn(n):   # (n verified steps of each sequence)
        for _ in range(n):
            ctl.acc.learn_many(keys, [6] * 3, [[0, 1]] * 3)

    def step(keys=keys, drain=False):
        ctl.prefetch(keys, room, drain)
        return ctl.decide(keys, room(), drain)
    step()                                 # (nothing learnt of them: a search)
    learn(64)
    step()
    assert len(searched) == 2
    for _ in range(cm.KEEP_STEPS):         # (kept: less than 1/16 new, each step one more)
        learn(1)
        step()
    assert len(searched) == 2
    step()                                 # (KEEP_STEPS since it searched)
    assert len(searched) == 3
    learn(5)                               # (5 of 73 steps new: past 1/16)
    step()
    assert len(searched) == 4
    step([2, 1, 0])                        # (another order)
    step([2, 1, 0], drain=True)            # (a drain)
    assert len(searched) == 6
    ctl.forget(1)                          # (its slot's next sequence is another)
    step([2, 1, 0], drain=True)
    assert len(searched) == 7
