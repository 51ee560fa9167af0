"""The guard's job account (runtime/control/guard.py, Guard.job): searches in vain, slots held
for grouped admissions and the prefill forwards grouping saves are charged against `ar`, a
job that loses by them falls back, and the summary's "vs ar" is that account's measure."""

from __future__ import annotations

import random

import pytest

from sim import (OracleChains, SimClock, TraceChains, h200_fused_table, prefill_table,
                 sim_controller, sim_run, timed_model, trace_lengths, traces)
from specctl.runtime.control import controller as controller_mod
from specctl.runtime.control import guard as guard_mod
from specctl.runtime.control import policy
from specctl.runtime.control.guard import JOB_SLACK, Guard
from specctl.runtime.jobs.metrics import gain_vs_ar


def _prompts(n, seed=0, vocab=30):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 12))] for _ in range(n)]


def test_the_job_balance_trips_on_a_loss_and_doubles_its_hold():
    g = Guard(hold=8)
    for _ in range(3):   # 10 ms steps a tenth behind: 2 steps' time lost by step ~20
        g.job(1.0, 10.0)
    assert g.hold == 0 and g.job_trips == 0
    n = 3
    while not g.job_trips:
        g.job(1.0, 10.0)
        n += 1
    assert 20 <= n <= 30 and g.hold == 8 and g.job_hold == 16 and g.trips == 1
    for _ in range(7):   # held steps are ar's: not judged
        g.holding()
        g.job(5.0, 10.0)
    assert g.hold == 1 and g.job_trips == 1 and g.job_balance == 0.0
    g.holding()
    for _ in range(100):   # ar's steps: eps's slack is no saving
        g.job(0.0, 10.0)
    assert g.job_hold == 16
    g.job(-40.0, 10.0)   # (a step's time won back: the next hold starts over)
    assert g.job_hold == 8
    assert g.excess == pytest.approx(n * 1.0 + 7 * 5.0 - 40.0)
    off = Guard(active=False)
    for _ in range(100):
        off.job(5.0, 10.0)
    assert off.hold == 0 and off.excess == 500.0


def test_the_runs_first_balance_is_a_drafting_steps_time():
    """A run's first drafting steps (on a prior: acceptance not learnt yet) may lose one
    drafting step's time more than later ones before the run is held to ar: 10 ms steps that
    lose 3 ms each trip at the 7th (2 steps' time), not the 4th; after a trip, and at start 0,
    one step's time."""
    for start, first in ((1.0, 7), (0.0, 4)):
        g = Guard(start=start)
        n = 0
        while not g.trips:
            g.drafted(10.0, 7.0 / 1.02)
            n += 1
        assert n == first and g.hold == 64, (start, n)
        while g.holding():
            pass
        n = 0
        while g.trips < 2:
            g.drafted(10.0, 7.0 / 1.02)
            n += 1
        assert n == 4 and g.hold == 128, (start, n)


def test_a_prefill_moves_the_balance_not_the_step_mean():
    g = Guard()
    g.job(0.0, 10.0)
    g.job(-30.0, 200.0, steps=0)   # a grouped prefill that saved 30 ms
    assert g.step_ms == pytest.approx(10.0)   # (the mean moved by the step alone)
    assert g.job_balance > 0 and g.excess == -30.0


def _vain_search_runs(model, monkeypatch, batch=8):
    """ar, then oracle chains that are never accepted under auto, on the H200 clock where each
    search costs a whole ar step and the controller searches every other step (LEAN_MAX 1: as
    when a sequence's occasional acceptance keeps resetting the backoff; none kept for the next
    steps, KEEP_STEPS 0), with the job account on and off. Returns (ar s, {on: (s, RunStats)})."""
    prompts = _prompts(4 * batch, seed=3)
    clock = SimClock(h200_fused_table(), batch, prefill=prefill_table())
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=48)
    ar_s = clock()
    search, step_s = policy.search, clock.table.ms(batch, 1) / 1e3

    def dear(*a, **kw):
        clock.sleep(step_s)
        return search(*a, **kw)
    monkeypatch.setattr(policy, "search", dear)
    monkeypatch.setattr(controller_mod, "LEAN_MAX", 1)
    monkeypatch.setattr(controller_mod, "KEEP_STEPS", 0)   # (each search made, none kept)
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(guard_mod, "JOB_SLACK", JOB_SLACK if on else float("inf"))
        dr = OracleChains(ref, [0.0] * len(prompts))
        clock.reset()
        got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=48,
                          controller=sim_controller(dr, clock.table))
        assert got == ref
        runs[on] = (clock(), st)
    return ar_s, runs


def test_a_job_losing_to_searches_in_vain_falls_back(model, monkeypatch):
    """Every other step searches for a whole ar step's time and finds nothing: lean steps,
    which the step account never judges. Without the job account the run is ~1.4x ar's
    time; with it, within a few percent of ar."""
    ar_s, runs = _vain_search_runs(model, monkeypatch)
    (on, st), (off, _) = runs[True], runs[False]
    assert off > 1.25 * ar_s, (ar_s, off)   # (the loss is real without it)
    assert on < 1.06 * ar_s and st.guard_job_trips > 0, (ar_s, on, st.guard_job_trips)


def test_the_summary_gain_is_the_job_account(model, monkeypatch):
    """The summary's estimate of x ar (gain_vs_ar: the run's time less its job excess) is
    within 6% of the measured ratio on the same clock: for a run that loses to its searches,
    and for real text's chains that gain, requests waiting (grouped admissions, held slots)."""
    ar_s, runs = _vain_search_runs(model, monkeypatch)
    monkeypatch.undo()
    for t, st in runs.values():
        est = gain_vs_ar(st, 1.0, t, plain=False)["gain_vs_ar_est"]
        assert est == pytest.approx(ar_s / t, rel=0.06), (est, ar_s / t)
    known, batch = traces(), 8
    prompts = _prompts(4 * batch, seed=9)
    lens = [min(x, 64) for x in trace_lengths(len(prompts), known)]
    clock = SimClock(h200_fused_table(), batch, prefill=prefill_table())
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens)
    ar_s = clock()
    dr = TraceChains(ref, known)
    clock.reset()
    got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=lens,
                      controller=sim_controller(dr, clock.table))
    assert got == ref
    est = gain_vs_ar(st, 1.0, clock(), plain=False)["gain_vs_ar_est"]
    assert ar_s / clock() > 1.05 and est == pytest.approx(ar_s / clock(), rel=0.06), \
        (est, ar_s / clock())
