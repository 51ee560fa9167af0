"""Never slower than `ar` by default (--speculate auto), on what the CPU can show of a GPU: graph
shapes all captured when a runner starts, the step table measured on the run's own cache, lean
steps at `ar`'s cost, the drain priced as the job's critical path, and the measured guard, on a
simulated clock that prices every forward by the committed H100 step table (tests/sim.py)."""

from __future__ import annotations

import random

import pytest

from helpers import method_drafters, run_ids
from sim import (OracleChains, SimClock, against_ar, h100_table, sim_controller, sim_run,
                 timed_model)
from specctl.engine.graphs import CudaGraphs
from specctl.engine.loader import load_model
from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import make_controller
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request
from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
from specctl.speculative.sampling import SamplingParams


def _prompts(n, seed=0, vocab=30):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 12))] for _ in range(n)]


@pytest.fixture(scope="module")
def graph_model(tiny_llama):
    m = load_model(tiny_llama, "cpu", "fp32")
    m.graphs = CudaGraphs(m, max_n=32, capture=False)
    return m


def _jittered(seed):
    """A clock whose every interval is the wall's times 0.5 to 2 (a noisy machine)."""
    import time
    rng, last, t = random.Random(seed), [time.perf_counter()], [0.0]

    def clock():
        now = time.perf_counter()
        t[0] += (now - last[0]) * rng.uniform(0.5, 2.0)
        last[0] = now
        return t[0]
    return clock


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_no_graph_shape_is_captured_after_start_up(graph_model, batch):
    """Every method, auto, at batch 1, 8 and 32 with jittered step timings (so budgets wander):
    whatever the steps plan, no shape is captured once the runner has started."""
    m = graph_model
    prompts = _prompts(batch + 2, seed=batch)
    ref, _ = run_ids(m, prompts, batch_size=batch, max_tokens=10)
    flat = StepTable("cuda", "float32", "sdpa", 128, tuple(sorted({1, batch})),
                     (1, 2, 4, 8, 16, 32, 64),
                     ((1.0, 1.02, 1.04, 1.08, 1.16, 1.3, 1.6),) * (1 if batch == 1 else 2))
    drafted = 0
    for name, dr in method_drafters(m, prompts, ref).items():
        if dr is None:
            continue
        reqs = [Request(i, [[{"role": "user", "content": str(i)}]], 10)
                for i in range(len(prompts))]
        runner = Runner(m, dr, SamplingParams(), batch_size=batch, max_len=64, eos_ids=set(),
                        render=lambda r: prompts[r.index], decode=str, threads=1)
        runner.set_controller(make_controller(dr, m, batch, flat, kv=runner.kv,
                                              explore_every=4))
        runner.clock = _jittered(batch)
        started = set(m.graphs.cache)
        assert started
        out = {}
        stats = runner.run(reqs, lambda r: out.__setitem__(r.index, r.answer_ids[0]))
        assert [out[i] for i in range(len(prompts))] == ref, name
        assert set(m.graphs.cache) == started, (name, set(m.graphs.cache) - started)
        assert stats.captures_in_steps == 0 and m.graphs.replays > 0, name
        drafted += max(stats.budget_hist) > 0
    assert drafted   # (steps drafted: shapes beyond n = 1 were met)


def test_measuring_the_step_table_keeps_the_runs_cache_and_graphs(graph_model, tmp_path):
    """The step-cost table measured for a run's controller runs on the run's cache: the cache
    and every shape captured on it stay (a cache of its own would let both go)."""
    from specctl.store import Store
    m = graph_model
    dr = method_drafters(m, _prompts(2), [[1], [2]])["draft-verify"]
    runner = Runner(m, dr, SamplingParams(), batch_size=4, max_len=64, eos_ids=set(),
                    render=lambda r: [1, 2, 3], decode=str, threads=1)
    kv, shapes = runner.kv, dict(m.graphs.cache)
    assert shapes
    ctl = make_controller(dr, m, 4, store=Store(tmp_path / "store"), fingerprint="fp", kv=kv,
                          log=lambda msg: None)
    runner.set_controller(ctl)
    assert ctl.cost.table.batches == (1, 4)
    assert m._kv[1] is kv and all(kv.lens[s] == 0 for s in range(4))
    assert all(m.graphs.cache.get(k) is c for k, c in shapes.items())
    assert all(c.kv is kv for c in m.graphs.cache.values())


def never_drafts(model) -> LayerSkipDrafter:
    """draft-verify skipping every block: its drafts are never right."""
    L = model.cfg.num_layers
    skip = SkipSet(L, frozenset(range(L)), frozenset(range(L)))
    return LayerSkipDrafter(model, skip, SamplingParams(), ExitParams(K=4, gamma0=0.0))


def test_bare_controlled_steps_take_ars_path(model, monkeypatch):
    """At batch 32 with budgets that stay 0 (drafting never pays on this table), the search runs
    on at most 5% of the steps, no draft forward runs, and the output is ar's."""
    steep = h100_table()
    prompts = _prompts(48, seed=3)
    ref, ar = run_ids(model, prompts, batch_size=32, max_tokens=128)
    dr = never_drafts(model)
    clock = SimClock(steep, 32, dear=lambda plan, n: 1.0 if n == 1 else 8.0)
    timed_model(model, clock, monkeypatch)
    ctl = sim_controller(dr, steep, prior_accept=0.05)
    got, st = sim_run(model, prompts, dr, clock, batch_size=32, max_tokens=128, controller=ctl)
    assert got == ref
    assert st.steps == ar.steps and st.lean_steps >= 0.95 * st.steps
    assert st.searches <= 0.05 * st.steps, (st.searches, st.steps)
    assert dr.draft_forwards <= 4 * (st.controlled_steps - st.lean_steps)
    # and lean steps are learnt in bulk (a tally of up to LEAN_LEARN as one: Accounting)
    assert ctl.cost.steps <= st.controlled_steps - st.lean_steps + st.lean_steps / 4


def _sim_methods(model, prompts, ref):
    """The auto methods of the simulation: every method's drafter on the tiny model, and
    oracle chains whose acceptance differs by sequence (0 to 0.95)."""
    ps = [0.95 * (i % 5) / 4 for i in range(len(prompts))]
    drafters = {k: v for k, v in method_drafters(model, prompts, ref).items() if v is not None}
    drafters["oracle-uneven"] = OracleChains(ref, ps)
    return drafters


def test_every_auto_method_keeps_up_with_ar_on_the_h100_table(model, monkeypatch):
    """32 sequences x 127 tokens at batch 32 on the H100's step table (padded steps, the demo
    model's prices): a job that only drains, with acceptance uneven by sequence (oracle chains
    0 to 0.95, Self-Draft's cache). No method under auto takes longer than ar (a draining
    batch drafts for a sequence only as far as its own drafts were accepted: the slowest of
    32 unknown ones is taken to accept nothing); the summary's ar estimate is within 10% of
    ar's real time. (On b066835 Self-Draft ran 0.51x ar at this batch on the H100; before the
    drain counted own acceptance only, 0.967x on this table.)"""
    prompts = _prompts(32, seed=7)
    ref, _ = run_ids(model, prompts, batch_size=32, max_tokens=128)
    ar_s, _, runs = against_ar(model, prompts, _sim_methods(model, prompts, ref), h100_table(),
                               monkeypatch, batch_size=32, max_tokens=128, ref=ref)
    seen = {name: round(x, 3) for name, (x, _) in runs.items()}
    for name, (_, st) in runs.items():
        assert st.ar_step_ms / 1e3 == pytest.approx(ar_s, rel=0.1), (name, st.ar_step_ms)
    assert all(x >= 1 - 1e-9 for x, _ in runs.values()), seen


def test_uneven_acceptance_gains_where_requests_wait(model, monkeypatch):
    """64 requests at batch 8 (requests wait, then the batch drains): oracle chains with
    acceptance 0 to 0.95 by sequence, Self-Draft and the methods that accept nothing, on the
    H100's table: none slower than ar by more than 2%, and the uneven one gains."""
    prompts = _prompts(64, seed=9)
    ref, _ = run_ids(model, prompts, batch_size=8, max_tokens=64)
    _, _, runs = against_ar(model, prompts, _sim_methods(model, prompts, ref), h100_table(),
                            monkeypatch, batch_size=8, max_tokens=64, ref=ref)
    seen = {name: round(x, 3) for name, (x, _) in runs.items()}
    assert min(seen.values()) >= 0.98 and seen["oracle-uneven"] > 1.1, seen


def test_the_guard_falls_back_when_drafting_costs_4x_the_table(model, monkeypatch):
    """Drafting steps cost 4x what the table says (a forward of more than one token per
    sequence, and every draft forward): over 2,000+ steps the run loses at most 3% to ar. With
    the online correction off the guard alone holds it to 3% as well."""
    table = h100_table()
    prompts = _prompts(8, seed=11)
    ref, _ = run_ids(model, prompts, batch_size=1, max_tokens=260, max_len=320)
    dear = (lambda plan, n: 4.0 if n > 1 or plan.start or plan.end else 1.0)
    clock = SimClock(table, 1, dear=dear)
    timed_model(model, clock, monkeypatch)
    _, ar = sim_run(model, prompts, None, clock, batch_size=1, max_tokens=260)
    ar_s = clock.t
    assert ar.steps >= 2000
    dr = OracleChains(ref, [0.8] * len(prompts))
    for correct in (True, False):
        clock.t = 0.0
        ctl = sim_controller(dr, table, correct=correct)
        got, st = sim_run(model, prompts, dr, clock, batch_size=1, max_tokens=260,
                          controller=ctl)
        assert got == ref
        assert clock.t <= 1.03 * ar_s, (correct, clock.t / ar_s, st.guard_trips,
                                        st.guard_job_trips, st.guard_held, st.steps)
        if not correct:
            assert st.guard_trips > 0 and st.guard_held > 0.5 * st.steps


def test_a_capture_inside_a_step_is_counted_not_learnt(graph_model, monkeypatch):
    """Graphs captured inside steps (every shape dropped from the cache mid-run), each taking
    50 ms: counted, and the run decides and learns exactly as when they take no time."""
    m = graph_model
    table = h100_table()
    prompts = _prompts(6, seed=5)
    ref, _ = run_ids(m, prompts, batch_size=4, max_tokens=24)
    runs = []
    for slow in (0.0, 0.05):
        clock = SimClock(table, 4)
        timed_model(m, clock, monkeypatch)
        capture = CudaGraphs._capture_one

        def timed_capture(self, *a, clock=clock, slow=slow):
            clock.sleep(slow)
            return capture(self, *a)
        monkeypatch.setattr(CudaGraphs, "_capture_one", timed_capture)
        dr = OracleChains(ref, [0.9, 0.5, 0.0, 0.7, 0.9, 0.2])
        ctl = sim_controller(dr, table)
        decide, calls = ctl.decide, []   # (the steps plan_lean leaves to it)

        def planned(keys, room, drain=False):
            calls.append(1)
            if len(calls) == 6:   # this step's forwards meet shapes the cache no longer holds
                m.graphs.cache.clear()
            return decide(keys, room, drain)
        monkeypatch.setattr(ctl, "decide", planned)
        got, st = sim_run(m, prompts, dr, clock, batch_size=4, max_tokens=24, controller=ctl)
        assert got == ref
        runs.append((st, ctl))
        monkeypatch.undo()
    (a, ca), (b, cb) = runs
    assert a.captures_in_steps == b.captures_in_steps > 0
    assert a.budget_hist == b.budget_hist and a.accept_hist == b.accept_hist
    assert ca.cost.drift == pytest.approx(cb.cost.drift, abs=1e-12)
    assert ca.cost.scale.keys() == cb.cost.scale.keys()
    assert all(ca.cost.scale[k] == pytest.approx(cb.cost.scale[k]) for k in ca.cost.scale)
    assert ca.guard.ar_log == pytest.approx(cb.guard.ar_log)


def test_the_guard_lets_bursty_acceptance_win(model, monkeypatch):
    """Acceptance in bursts (0.9 over 24 output positions, then none over 24: what Self-Draft
    met on the H100 at 237d5df, where the guard tripped 5 times and held 320 of its 546 steps
    at batch 1): the guard costs the run at most 3% of what it gains with the guard off."""
    table = h100_table()
    prompts = _prompts(8, seed=13)
    ref, _ = run_ids(model, prompts, batch_size=1, max_tokens=192, max_len=320)
    clock = SimClock(table, 1)
    timed_model(model, clock, monkeypatch)
    sim_run(model, prompts, None, clock, batch_size=1, max_tokens=192)
    ar_s, took, trips = clock.t, {}, {}
    dr = OracleChains(ref, [0.9] * len(prompts), period=24)
    for guard in (True, False):
        clock.t = 0.0
        got, st = sim_run(model, prompts, dr.fresh(), clock, batch_size=1, max_tokens=192,
                          controller=sim_controller(dr, table, guard=guard))
        assert got == ref
        took[guard], trips[guard] = clock.t, (st.guard_trips, st.guard_held, st.steps)
    assert took[False] < ar_s / 1.3, (ar_s, took)       # (bursts do pay with no guard)
    assert took[True] <= 1.03 * took[False], (ar_s, took, trips)


def test_lean_steps_are_timed_without_the_search(model, monkeypatch):
    """The controller's search costs host time an `ar` step does not pay (on the H100's host
    ~0.5-1 ms at batch 32, a third of a step): here 1.5 ms of the simulated clock per search,
    with oracle chains at 0.8. A contrast step stands for a step without drafts, and a step
    whose search gave no drafts is `ar`'s step plus the controller's overhead: both are
    learnt as `ar`'s price without the search. Timed with it (the H100 at 65c1f6b: contrast
    steps at ~1.4x a lean step's time, Self-Draft 0.71x ar at batch 32 and no guard trip),
    the guard's `ar` step was 1.7x the table's here. Drafting still gains."""
    from specctl.runtime.control import policy
    table = h100_table()
    prompts = _prompts(96, seed=17)
    ref, _ = run_ids(model, prompts, batch_size=32, max_tokens=64)
    clock = SimClock(table, 32)
    timed_model(model, clock, monkeypatch)
    sim_run(model, prompts, None, clock, batch_size=32, max_tokens=64)
    ar_s = clock.t
    search = policy.search

    def searched(*a, **kw):
        clock.sleep(0.0015)
        return search(*a, **kw)
    monkeypatch.setattr(policy, "search", searched)
    clock.t = 0.0
    dr = OracleChains(ref, [0.8] * len(prompts))
    ctl = sim_controller(dr, table)
    decided = []
    decide = ctl.decide

    def deciding(keys, room, drain=False):
        decided.append(decide(keys, room, drain))
        return decided[-1]
    monkeypatch.setattr(ctl, "decide", deciding)
    got, st = sim_run(model, prompts, dr, clock, batch_size=32, max_tokens=64, controller=ctl)
    assert got == ref
    assert st.contrasts > 0 and not any(b.contrast for b in decided)   # (plan_lean's, all)
    assert ctl.ar_ms(32) == pytest.approx(table.ms(32, 1), rel=0.01), ctl.ar_ms(32)
    assert clock.t < ar_s / 1.1, (ar_s, clock.t)
    # drafts never accepted (32 prompts: every step of 32): steps whose search gave no drafts
    # are learnt at the table's price, the search's 1.5 ms left out
    prompts = prompts[:32]
    dr = OracleChains(ref[:32], [0.0] * 32)
    ctl = sim_controller(dr, table)
    got, st = sim_run(model, prompts, dr, clock, batch_size=32, max_tokens=64, controller=ctl)
    assert got == ref[:32] and st.searches >= 2   # (the job's account holds it to ar soon:
    # its searches in vain are half a step each)
    assert st.search_ms == pytest.approx(1.5 * st.searches)
    assert st.lean_step_ms == pytest.approx(st.lean_steps * table.ms(32, 1)), st.lean_steps
