"""Admission in groups (runtime/step/admission.py): under --speculate auto, free slots wait for a few
more before one prefill fills them, when a prefill forward's fixed cost is worth more than the
idle slots; never without one."""

from __future__ import annotations

import random

import pytest

from helpers import run_ids
from sim import OracleChains, SimClock, h100_table, sim_controller, sim_run, timed_model
from specctl.runtime.step.admission import Admission


def test_the_fixed_cost_of_a_prefill_is_fit_from_prefills_of_different_sizes():
    a = Admission(32)
    for f, t in ((1, 40), (1, 300), (2, 900), (1, 120)):
        a.prefilled(f, t, 5.0 * f + 0.01 * t)
    assert a.fixed_ms() == pytest.approx(5.0)
    same = Admission(32)
    for _ in range(6):
        same.prefilled(1, 50, 7.0)
    assert same.fixed_ms() is None   # (one size: the fixed part and the tokens' not apart)
    assert Admission(32).fixed_ms() is None and Admission(32).group() == 1
    two = Admission(32)   # (a run's first two prefills: a batch of prompts, then one)
    two.prefilled(1, 320, 5.0 + 0.01 * 320, 32)
    assert two.fixed_ms() is None
    two.prefilled(1, 10, 5.0 + 0.01 * 10, 1)
    assert two.fixed_ms() == pytest.approx(5.0)


def test_the_group_balances_idle_slots_against_prefill_forwards():
    """g* = sqrt(2 F B r / step_ms): F = 5 ms, B = 32, a slot freed every other step, 3 ms
    steps: 7; a fixed cost small against the step (a CPU on long prompts): 1; never more than
    half the slots."""
    a = Admission(32)
    for f, t in ((1, 40), (1, 300), (2, 900), (1, 120)):
        a.prefilled(f, t, 5.0 * f + 0.01 * t)
    for i in range(64):
        a.stepped(3.0, i % 2)
    assert a.group() == 7
    small = Admission(8)
    for f, t in ((1, 100), (1, 400), (1, 250), (2, 600)):
        small.prefilled(f, t, 0.5 * f + 0.5 * t)
    for i in range(64):
        small.stepped(30.0, i % 8 == 0)
    assert small.group() == 1
    dear = Admission(4)
    for f, t in ((1, 40), (1, 300), (2, 900), (1, 120)):
        dear.prefilled(f, t, 50.0 * f)
    for _ in range(64):
        dear.stepped(1.0, 1)
    assert dear.group() == 2


def _fitted(slots: int, fixed: float, step: float, freed: float) -> Admission:
    a = Admission(slots)
    for f, t, p in ((1, 100, 1), (1, 400, 4), (2, 600, 6), (1, 300, 3)):
        a.prefilled(f, t, fixed * f + 0.001 * t, p)
    for i in range(64):
        a.stepped(step, int(i * freed) != int((i + 1) * freed))
    return a


def test_free_slots_wait_for_a_sequence_whose_budget_ends_it_soon():
    """F = 6 ms, 3 ms steps at batch 8, too few slots freed for the rate's group (1): one
    free slot held until a sequence that must end within 5 steps does costs 5 x 3 / 8 =
    1.9 ms against a second forward's 6: held; within 20 steps (7.5 ms): admitted now. With
    less than a batch waiting beyond the free slots (the job's last admissions: a held one
    delays its end by whole steps) only while those steps cost less than the forward saved
    (1 step of 3 ms, not 2) and more wait than are free; never where the next prompt needs a
    forward of its own (100-token prompts, 512-token chunks: a sixth does)."""
    a = _fitted(8, 6.0, 3.0, 0.0)
    assert a.group() == 1 and a.prompt_tokens == pytest.approx(100.0)
    asked = []
    assert a.hold(1, 10, lambda: asked.append(1) or 5, 512)
    assert not a.hold(1, 10, lambda: 20, 512)
    assert a.hold(2, 10, lambda: 2, 512) and not a.hold(2, 10, lambda: 9, 512)
    assert a.hold(2, 9, lambda: 1, 512) and not a.hold(2, 9, lambda: 2, 512)
    assert not a.hold(2, 2, lambda: 1, 512) and a.hold(2, 10, lambda: 1, 512)
    assert not a.hold(5, 20, lambda: 1, 512) and a.hold(4, 20, lambda: 1, 512)
    assert not Admission(8).hold(1, 10, lambda: 1, 512)   # (F not known yet)
    assert asked == [1]


def test_the_fewest_steps_left_are_either_limits_least_over_the_running_sequences():
    """Runner._soon: the least, over the unfinished running sequences, of each one's token
    budget left and its context rows left (less the row a step writes); max_len with none."""
    from types import SimpleNamespace

    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request, Sequence
    rng = random.Random(0)
    for _ in range(300):
        m, n = rng.randrange(20, 200), rng.randrange(6)
        runner = SimpleNamespace(kv=SimpleNamespace(lens=[rng.randrange(m) for _ in range(n)]),
                                 max_len=m)
        running = []
        for slot in range(n):
            s = Sequence(Request(slot, [[]], max_tokens=rng.randrange(1, 60)), [1], slot)
            s.out_ids = [1] * rng.randrange(s.req.max_tokens + 1)
            s.finish_reason = rng.choice([None, None, "stop"])
            running.append(s)
        want = min((min(s.req.max_tokens - len(s.out_ids), m - runner.kv.lens[s.slot] - 1)
                    for s in running if not s.finished), default=m)
        assert Runner._soon(runner, running) == want


def _prompts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(30) for _ in range(rng.randint(3, 12))] for _ in range(n)]


def _controlled_runs(model, monkeypatch, prompts, batch, max_tokens, prefill_ms, ps, holds):
    """(ar's outputs, the clock, {name: (clock s, prefill forwards)}): oracle chains of
    acceptance ps under a controller on the H100's table, a prefill forward prefill_ms, one
    run for each of holds, in order, with Admission.hold patched to it (None: as it is, or
    as the run before patched it); every output checked against ar's."""
    table = h100_table()
    ref, _ = run_ids(model, prompts, batch_size=batch, max_tokens=max_tokens)
    clock = SimClock(table, batch, prefill_ms=prefill_ms, token_us=5.0)
    timed_model(model, clock, monkeypatch)
    runs = {}
    for name, hold in holds.items():
        if hold is not None:
            monkeypatch.setattr(Admission, "hold", hold)
        clock.t = 0.0
        dr = OracleChains(ref, ps)
        got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=max_tokens,
                          controller=sim_controller(dr, table))
        assert got == ref
        runs[name] = (clock.t, st.prefill_forwards)
    return ref, clock, runs


def test_speculation_admits_in_groups_where_prefill_forwards_are_dear(model, monkeypatch):
    """96 requests at batch 32 on the H100's step table, each prefill forward 5 ms (~2 of its
    steps; eager there, where steps replay graphs): oracle chains of uneven acceptance end
    sequences at different steps. Admitting as slots free up took 3x the prefill forwards
    and longer than admitting a few at once; outputs are ar's either way. Under `--speculate
    fixed` the runner admits at once, whatever the group would be; `ar` under auto (the
    default) groups as speculation does."""
    prompts = _prompts(96, seed=21)
    ps = [0.95 * (i % 5) / 4 for i in range(len(prompts))]
    ref, clock, runs = _controlled_runs(model, monkeypatch, prompts, 32, 64, 5.0, ps,
                                        {True: None, False: lambda self, *a: False})
    (t_on, pf_on), (t_off, pf_off) = runs[True], runs[False]
    assert pf_on * 3 <= pf_off, runs
    assert t_on < t_off, runs
    fixed = {}
    for group in (1, 8):
        monkeypatch.setattr(Admission, "group", lambda self, g=group: g)
        got, st = sim_run(model, prompts, OracleChains(ref, ps), clock, batch_size=32,
                          max_tokens=64, grouped=False)
        assert got == ref
        fixed[group] = st.prefill_forwards
    assert fixed[8] == fixed[1] > pf_on, (fixed, pf_on)


def test_sequences_desynced_by_drafts_are_admitted_in_the_clumps_ar_admits(model, monkeypatch):
    """64 requests of one token budget at batch 8 on the H100's table, a prefill forward 9 ms
    (3 steps, the H200's demo-shape eager prefill): `ar` ends each clump of 8 together and
    admits it in one forward. Oracle chains of uneven acceptance end a clump's sequences a
    few steps apart; waiting for those whose budgets end them soon (the known-end rule) takes
    fewer prefill forwards, and less time, than the rate's group alone."""
    prompts = _prompts(64, seed=5)
    ps = [0.9 * (i % 4) / 3 for i in range(len(prompts))]
    rate = lambda self, f, w, soon, chunk: f < min(self.group(), w)   # noqa: E731
    _, _, runs = _controlled_runs(model, monkeypatch, prompts, 8, 40, 9.0, ps,
                                  {"known": None, "rate": rate})
    assert runs["known"][1] < runs["rate"][1] and runs["known"][0] < runs["rate"][0], runs


def test_ar_under_auto_admits_in_groups_too(model, monkeypatch):
    """`ar` whose answers end at different steps (as EOS ends them), 96 requests at batch 32,
    each prefill forward 5 ms on the H100's table: under --speculate fixed it admits as slots
    free, a prefill forward nearly every answer; under auto (its default) in groups, in less
    time, the same answers."""
    prompts = _prompts(96, seed=21)
    lens = [8 + (7 * i) % 57 for i in range(len(prompts))]
    clock = SimClock(h100_table(), 32, prefill_ms=5.0, token_us=5.0)
    timed_model(model, clock, monkeypatch)
    ar = {}
    for grouped in (False, True):
        clock.t = 0.0
        got, st = sim_run(model, prompts, None, clock, batch_size=32, max_tokens=lens,
                          grouped=grouped)
        ar[grouped] = (got, st.prefill_forwards, clock.t)
    assert ar[True][0] == ar[False][0]
    assert ar[True][1] * 3 <= ar[False][1] and ar[True][2] < ar[False][2], \
        {g: r[1:] for g, r in ar.items()}


def test_ar_holds_its_first_early_ends_for_the_clump_that_ends_at_its_budget(model,
                                                                             monkeypatch):
    """`ar` under auto at batch 8, 32 requests of 40 tokens but for three that end early (as
    EOS ends them), a prefill forward 9 ms on the H100's table: F is known from the run's first
    two prefills (a batch of prompts, then one), so the next early ends wait for the clump
    that ends at its budget, one prefill forward for all. Fitting F only from 4 prefills
    admitted each of them in a forward of its own."""
    prompts = _prompts(32, seed=3)
    lens = [40] * 32
    lens[1], lens[4], lens[6] = 9, 14, 17
    clock = SimClock(h100_table(), 8, prefill_ms=9.0, token_us=5.0)
    timed_model(model, clock, monkeypatch)
    runs = {}
    fit = Admission._fit
    for need in (2, 4):
        monkeypatch.setattr(Admission, "_fit",
                            lambda self, n=need: fit(self) if len(self.prefills) >= n else None)
        clock.t = 0.0
        got, st = sim_run(model, prompts, None, clock, batch_size=8, max_tokens=lens,
                          ends_known=False)
        runs[need] = (got, st.prefill_forwards, clock.t)
    assert runs[2][0] == runs[4][0]
    assert runs[2][1] < runs[4][1] and runs[2][2] < runs[4][2], \
        {n: r[1:] for n, r in runs.items()}
