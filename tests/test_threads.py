"""The CPU thread tuner (runtime/step/threads.py): it keeps the fastest thread count it measures."""

from __future__ import annotations

import torch

from specctl.runtime.step.threads import ThreadTuner


def drive(tuner: ThreadTuner, cost, steps: int) -> list[int]:
    """Run `steps` steps whose seconds per token are cost(threads); returns threads per step."""
    used = []
    for _ in range(steps):
        tuner.before()
        n = torch.get_num_threads()
        used.append(n)
        tuner.after(cost(n), 1)
    return used


def test_tuner_keeps_the_fastest_and_follows_a_change():
    old = torch.get_num_threads()
    try:
        t = ThreadTuner(4, trial=2, period=8, max_period=64)
        assert t.options == [1, 2, 4]
        quiet = {1: 3.0, 2: 2.0, 4: 1.0}   # all cores free: more threads, faster
        used = drive(t, quiet.__getitem__, 200)
        assert t.choice == 4
        assert used.count(1) < 0.1 * len(used)   # trials are rare once the choice holds
        busy = {1: 1.5, 2: 4.0, 4: 9.0}    # another process holds cores: barriers stall
        drive(t, busy.__getitem__, 100)
        assert t.choice == 1
        assert drive(t, busy.__getitem__, 10).count(1) >= 8
    finally:
        torch.set_num_threads(old)


def test_one_core_has_nothing_to_tune():
    t = ThreadTuner(1)
    assert t.options == [1]
    t.before()
    t.after(1.0, 1)
    assert t.choice == 1


def test_work_below_one_unit_still_divides():
    """Work in table ms can be under 1 (a small model): the trials compare seconds per unit
    of it, not seconds, so a candidate whose trial steps did more work is not penalized."""
    old = torch.get_num_threads()
    try:
        t = ThreadTuner(2, trial=2, period=8)
        for _ in range(4):   # the first trial: 1 thread, then 2
            t.before()
            n = torch.get_num_threads()
            t.after(1.0, 0.5) if n == 1 else t.after(0.8, 0.25)   # 2 s/unit against 3.2
        assert t.choice == 1
    finally:
        torch.set_num_threads(old)


def test_a_sudden_slowdown_starts_a_trial_at_once():
    """Between trials, two steps at SLOWER times the choice's measured time start a trial
    then, not `period` steps on: two threads stalled ~150x by a process that took a core
    (a probe saw it) run two steps so, not 64."""
    old = torch.get_num_threads()
    try:
        t = ThreadTuner(2, trial=2, period=64, max_period=64)
        drive(t, {1: 2.0, 2: 1.0}.__getitem__, 10)   # quiet: two threads
        assert t.choice == 2
        busy = {1: 1.5, 2: 150.0}
        used = drive(t, busy.__getitem__, 12)
        assert t.choice == 1 and used[:2] == [2, 2] and used[-4:] == [1, 1, 1, 1]
        # one slow step (a collection, a page fault) is no reason to trial
        t2 = ThreadTuner(2, trial=2, period=64, max_period=64)
        drive(t2, {1: 2.0, 2: 1.0}.__getitem__, 10)
        t2.before()
        t2.after(100.0, 1)
        assert drive(t2, {1: 2.0, 2: 1.0}.__getitem__, 8).count(1) == 0
    finally:
        torch.set_num_threads(old)
