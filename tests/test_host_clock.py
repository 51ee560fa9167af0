"""Never slower than `ar` on a clock that charges the host (tests/sim.py, host=HOST): every
forward priced by the committed H200 step table (the fused layer), every prefill forward by its
prefill table, and everything else the run does (the controller's search, drafting logic,
verification, commit, admission, retiring) by this process's own CPU time times HOST, as a
GPU's host pays it serially with its launches. Acceptance replays real text (traces recorded
from the demo model on held-out questions: stretches known, then not), and answers end where
the real ones did. Two workloads a batch: requests waiting (4x the batch) and a pure drain."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from functools import partial

import pytest

from helpers import method_drafters
from specctl.runtime.jobs.config import GRID_FROM, GenerateConfig
from specctl.speculative.self_draft import SelfDraftDrafter
from sim import (HOST, SimClock, TraceChains, TraceGrid, h200_fused_table, prefill_table, sim_controller,
                 sim_run, timed_model, trace_lengths, traces)

MAX_TOKENS = 64   # (the traces' answers cut there: time)
LENGTHS = Path(__file__).parent / "data" / "sharegpt-prompt-lengths.json"
# Floors, not yet the targets (every method >= 0.98x ar, the trace's chains >= 1.25x at
# batch 1 and 8 with requests waiting). Since ar's own step takes its short path (no search for
# drafts it never makes, one token a sequence without per-row work: its host at batch 64 a
# third of what it was), the idle-ish 2-core EPYC measured 0.92-1.07x for the drains and the
# non-drafting methods, Self-Draft's drain at batch 64 0.90-1.00 (its exploring drafting steps
# cost ~1.5-3 ms of CPU each there), and the trace's chains 1.19-1.29x / 0.95-0.99x at batch 1
# / 8 with requests waiting (bench-results/2026-11-28-host-clock-2). A busy machine moves a
# run's host time by ~5% even at the least of several rounds, so these leave room for that;
# they catch a gross regression (a search of ~1 ms on each step's critical path read 0.80-0.84x
# before), and smaller ones need the results folder's script, run on a quiet machine
# The trace at batch 1 with requests waiting had three modes: the guard tripped on the first
# request's early misses and held the short run (4 requests) to ar for 128 of its ~210 steps
# (1.09-1.13x) or 227 of 252 (0.99-1.00x), or never tripped (1.30x), as the host's timings
# fell (bench-results/2026-11-29-host-clock-4/trips.py 1 waiting trace 6); since the run's
# first balance is a drafting step's time (Guard.start), ~30 rounds in a noisy window read
# 1.26-1.31x (bench-results/2026-12-01-guard-hold). On an AVX2 EPYC whose CPython is ~2x
# slower (2026-12-02; the host's x HOST charge a larger share) the tripping mode came back:
# 1.095-1.204x with 1-2 trips, at 579dca3 as at this change; the floor is the trips' mode's
FLOOR, TRACE_FLOOR = 0.85, {1: 1.05, 8: 0.90}


def _prompts(n, seed=0, vocab=30):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 12))] for _ in range(n)]


def _real_prompts(n: int, seed: int = 0, vocab: int = 30, most: int = 250) -> list[list[int]]:
    """n prompts as long as real ones (tests/data/sharegpt-prompt-lengths.json, in turn; at
    most `most` tokens: sim_run's context is 320)."""
    rng = random.Random(seed)
    lengths = json.loads(LENGTHS.read_text())["lengths"]
    return [[rng.randrange(vocab) for _ in range(min(lengths[i % len(lengths)], most))]
            for i in range(n)]


def workload(model, batch: int, n: int, monkeypatch, table=None, prefill=None,
             real_lengths: bool = False):
    """(the traces, n prompts, their answers' lengths, the host-charged clock that now prices
    model's forwards) of a batch's workload: n = 4 x batch with requests waiting, batch for a
    pure drain. table, prefill: the forwards' prices (default: the demo shape's on the H200,
    sim.h200_fused_table and sim.prefill_table). real_lengths: prompts as long as ShareGPT's
    in the demo's template (else 3-12 tokens: an eager prefill's price does not follow its
    tokens; prefill's pieces' does). The results folders' scripts start here."""
    known = traces()
    prompts = (_real_prompts if real_lengths else _prompts)(n, seed=batch)
    lens = [min(x, MAX_TOKENS) for x in trace_lengths(n, known)]
    clock = SimClock(table or h200_fused_table(), batch, host=HOST,
                     prefill=prefill or prefill_table())
    timed_model(model, clock, monkeypatch)
    return known, prompts, lens, clock


def host_charged_ratios(model, batch: int, n: int, monkeypatch, methods=None, rounds: int = 2,
                        table=None, prefill=None, real_lengths: bool = False,
                        paired: dict | None = None, **run):
    """ar, then each drafter under auto, on one host-charged clock, `rounds` times over
    (ar at each round's start): ({name: x ar}, {name: RunStats of its last run}, ar's
    RunStats), each name's time its least over the rounds: another process on the machine
    only ever adds to a run's host time (2 vCPUs may share a core), so the least is the run's
    own. Each output is checked against ar's. table, prefill: the forwards' prices (default:
    the demo shape's on the H200, sim.h200_fused_table and sim.prefill_table). Every run
    admits in groups, `ar`'s too (as under --speculate auto), and none sees when its answers
    end (real text's answers end by EOS: sim_run's ends_known). real_lengths: workload's;
    run: sim_run's other settings (pieces, prefill_chunk). paired: where given, each name's
    ratio in each round to that round's ar (a spread; recipes/gpu/predict.py)."""
    known, prompts, lens, clock = workload(model, batch, n, monkeypatch, table, prefill,
                                           real_lengths)
    best, stats, ref, drafters, ar = {}, {}, None, {}, None
    for _ in range(rounds):
        clock.reset()
        out, ar = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens,
                          ends_known=False, **run)
        ar_t = clock()
        best["ar"] = min(best.get("ar", float("inf")), ar_t)
        if ref is None:
            ref = out
            drafters = {"trace": TraceChains(ref, known)}
            if batch >= GRID_FROM:   # (where Self-Draft drafts on the grid by default)
                drafters["trace-grid"] = TraceGrid(ref, known, model.cfg.vocab_size, clock)
            drafters.update(_drafters(model, prompts, ref, methods, batch))
            if methods is not None:
                drafters = {k: v for k, v in drafters.items() if k in methods or k == "trace"}
        assert out == ref
        for name, dr in drafters.items():
            dr = dr.fresh()
            clock.reset()
            got, stats[name] = sim_run(model, prompts, dr, clock, batch_size=batch,
                                       max_tokens=lens, ends_known=False,
                                       controller=sim_controller(dr, clock.table), **run)
            assert got == ref, name
            best[name] = min(best.get(name, float("inf")), clock())
            if paired is not None:
                paired.setdefault(name, []).append(ar_t / clock())
    return {k: best["ar"] / t for k, t in best.items() if k != "ar"}, stats, ar


def _drafters(model, prompts, ref, methods=None, batch: int = 1) -> dict:
    """Every method's drafter (helpers.method_drafters), Self-Draft as a user runs it by
    default at this batch size ("self-draft": no job cache) and with --job-cache
    ("self-draft:job"; the lossless tests' Self-Draft), each on the grid from GRID_FROM and
    apart: the job cache's indexing is host work of its own."""
    got = {k: v for k, v in method_drafters(model, prompts, ref).items() if v is not None}
    job = got.pop("self-draft")
    grid = GenerateConfig(input="x", method="self-draft", batch_size=batch).grid_default()
    for name, on in (("self-draft", False), ("self-draft:job", True)):
        got[name] = SelfDraftDrafter(replace(job.prm, job_cache=on, grid=grid), job.corpus,
                                     vocab=model.cfg.vocab_size)
    return {k: v for k, v in got.items() if methods is None or k in methods}


@pytest.mark.parametrize("batch", [1, 8, 32, 64])
@pytest.mark.parametrize("work", ["waiting", "drain"])
def test_auto_keeps_up_with_ar_with_the_host_charged(model, batch, work, monkeypatch):
    """Every method under auto keeps up with ar, host and prefill charged, and the trace's
    chains (real text's acceptance) gain at batch 1 and 8 with requests waiting (FLOOR)."""
    n = 4 * batch if work == "waiting" else batch
    for rounds in (2, 4):   # (more rounds only where a busy machine pushed a ratio under)
        ratios, stats, ar = host_charged_ratios(model, batch, n, monkeypatch, rounds=rounds)
        low = [k for k, r in ratios.items() if r < FLOOR]
        if not low and (work != "waiting" or batch not in TRACE_FLOOR
                        or ratios["trace"] >= TRACE_FLOOR[batch]):
            break
    seen = {k: (round(r, 3), stats[k].steps, stats[k].guard_trips) for k, r in ratios.items()}
    assert not low, (ar.steps, seen)
    if work == "waiting" and batch in TRACE_FLOOR:
        assert ratios["trace"] >= TRACE_FLOOR[batch], seen


def test_a_pure_drain_drafts_no_step_on_the_prior(model, monkeypatch):
    """A pure drain's first drafting step is priced with its host work (DRAIN_HOST lean steps,
    Controller._untimed_host): at batch 64 the trace's chains and Self-Draft drafted one or
    two of a drain's first steps on the prior, each saving no step and costing ~7 lean steps'
    host (0.966-0.968x ar); now none in its first half. (At batch 64 that holds with the price
    at 1 lean step: Self-Draft's first drafting step then came at step 19, the trace's never;
    at batch 32 a price of 2 let the trace draft from step 19, so a host 4x this EPYC's speed
    would move it there: not asserted.)"""
    batch = 64
    known, prompts, lens, clock = workload(model, batch, batch, monkeypatch)
    ref, ar = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens,
                      ends_known=False)
    drafters = {"trace": TraceChains(ref, known)}
    drafters.update(_drafters(model, prompts, ref, ["self-draft"], batch))
    for name, dr in drafters.items():
        ctl = sim_controller(dr, clock.table)
        first = []
        decide = ctl.decide

        def deciding(keys, room, drain=False, _d=decide, _c=ctl, _f=first):
            b = _d(keys, room, drain)
            if not b.lean and not _f:
                _f.append(_c.steps)
            return b
        ctl.decide = deciding
        got, st = sim_run(model, prompts, dr.fresh(), clock, batch_size=batch,
                          max_tokens=lens, ends_known=False, controller=ctl)
        assert got == ref, name
        assert st.steps == ar.steps and (not first or first[0] > ar.steps // 2), (name, first)


@pytest.mark.parametrize("batch,n", [(8, 32), (64, 64)])
def test_the_next_search_runs_while_the_forward_does(model, monkeypatch, batch, n):
    """The controller searches for the next step after a forward is issued and before its
    output is first read (verify's argmax, or the prefill's first token: on CUDA the forward
    computes meanwhile), and every search of a drafting run is made there, so the step loop
    never waits for one: the run's first, under the first prefill's forward, and a drain's
    first step's, under the prefill that admitted the last waiting request, too (only
    Controller.warm's, before the run, are not). Waiting requests and a drain, batch 8 and
    64. (On the device's clock alone: the run's decisions do not follow this machine's
    load.)"""
    from specctl.runtime.control import policy
    known, events = traces(), []
    prompts = _prompts(n, seed=5)
    lens = [min(x, 48) for x in trace_lengths(n, known)]
    clock = SimClock(h200_fused_table(), batch, prefill=prefill_table())
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=lens)
    for name, attr in (("forward", "run"), ("forward", "forward"), ("read", "argmax")):
        fn = getattr(model, attr)   # (forward: a step's, or a prefill's)

        def logged(*a, _fn=fn, _name=name, **kw):
            events.append(_name)
            return _fn(*a, **kw)
        monkeypatch.setattr(model, attr, logged)
    search = policy.search

    def searched(*a, **kw):
        events.append("search")
        return search(*a, **kw)
    monkeypatch.setattr(policy, "search", searched)
    dr = TraceChains(ref, known)
    ctl = sim_controller(dr, clock.table)
    prefetch = ctl.prefetch

    def prefetching(*a, **kw):
        events.append("(")
        try:
            return prefetch(*a, **kw)
        finally:
            events.append(")")
    ctl.prefetch = prefetching
    clock.reset()
    got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=lens,
                      controller=ctl)
    assert got == ref
    inside, depth, searches = 0, 0, 0
    for i in range(events.index("forward"), len(events)):   # (Controller.warm's before)
        e = events[i]
        if e == "(":
            assert events[i - 1] == "forward", events[i - 3:i + 3]
            depth = 1
        elif e == ")":
            assert events[i + 1] == "read", events[i - 2:i + 3]   # (the forward's first read)
            depth = 0
        elif e == "search":
            searches += 1
            inside += depth
    assert searches >= 5 and inside == searches, (inside, searches)


def test_host_work_under_a_forward_costs_only_past_its_device_time(model, monkeypatch):
    """SimClock.overlapped: host work issued while a forward computes is charged only beyond
    that forward's device time; the next forward's window is its own."""
    import time as _time
    from specctl.engine.batch import FULL, ForwardBatch, SeqInput
    clock = SimClock(h200_fused_table(), 1, host=HOST)
    timed_model(model, clock, monkeypatch)
    kv = model.new_kv_cache(1, 64)

    def burn(s):
        t = _time.thread_time()
        while _time.thread_time() - t < s:
            pass
    batch = ForwardBatch([SeqInput(0, [1], 0)], model.device)
    clock.reset()
    model.run(batch, kv, FULL)   # (a forward of the table's 1.81 ms)
    window = clock.window
    c0 = clock()
    clock.overlapped(burn)(0.2 * window / HOST)   # (a fifth of the window: hidden)
    assert clock() - c0 < 0.1 * window
    clock.overlapped(burn)(window / HOST)   # (the window's other 4/5 hidden, 1/5 past it)
    # (~0.2 of the window: charged in full it would be 1.2, hidden in full 0; the clock's own
    # calls are charged too, x HOST, and on a busy CI machine they took 0.14 of it)
    assert 0.1 * window < clock() - c0 < 0.5 * window, (clock() - c0) / window


def test_the_last_steps_learning_runs_under_the_next_forward(model, monkeypatch):
    """Where the host goes on beside the forward (the padded clock, as CUDA's graphs), a
    step's learning (Self-Draft's context grams, the controller's accounting) runs after the
    next step's forward is issued and before its output is read, a step in which a sequence
    ended too; none of what reads a slot is left waiting when the slot is forgotten or a new
    sequence takes it, nor anything when the run ends; and the output is ar's. On a CPU's
    clock (no padding) it runs at once: the same text, and no step's learning waits."""
    from specctl.runtime.step.accounting import Accounting
    from specctl.runtime.step.runner import Runner
    from specctl.speculative.self_draft import ContextCache
    prompts = _prompts(24, seed=3)
    clock = SimClock(h200_fused_table(), 8, prefill=prefill_table())
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=8, max_tokens=32)
    events, runners = [], []
    for obj, name, tag in ((model, "run", "forward"), (model, "argmax", "read"),
                           (ContextCache, "push_many", "learn"), (Accounting, "step", "account"),
                           (Runner, "catch_up", "catch_up")):
        fn = getattr(obj, name)

        def logged(*a, _fn=fn, _tag=tag, **kw):
            events.append(_tag)
            if _tag == "catch_up" and not runners:
                runners.append(a[0])
            return _fn(*a, **kw)
        monkeypatch.setattr(obj, name, logged)
    for padded in (True, False):
        dr = method_drafters(model, prompts, ref)["self-draft"].fresh()
        ctl = sim_controller(dr, clock.table)
        ctl.cost.padded = padded
        forget = ctl.forget

        def forgetting(key, _f=forget):
            r = runners[-1] if runners else None
            if r is not None and r._later_free:   # (only what reads no slot waits)
                past.append(key)
            assert r is None or not r._later
            return _f(key)
        past = []
        ctl.forget = forgetting
        retire = Runner._retire

        def retiring(self, *a, _retire=retire):   # (the runner whose _later a forget joins)
            runners.append(self)
            return _retire(self, *a)
        monkeypatch.setattr(Runner, "_retire", retiring)

        def reading(fn):   # (the controller reads no slot whose forget is still queued)
            def read(keys, *a, **kw):
                r = runners[-1] if runners else None
                queued = {f.args[0] for f in (r._later if r else [])
                          if isinstance(f, partial) and f.func == ctl.forget}
                assert not queued & set(keys), (fn.__name__, queued)
                return fn(keys, *a, **kw)
            return read
        for name in ("decide", "prefetch", "prefetch_missing"):
            setattr(ctl, name, reading(getattr(ctl, name)))
        events.clear()
        runners.clear()
        clock.reset()
        got, st = sim_run(model, prompts, dr, clock, batch_size=8, max_tokens=32, controller=ctl)
        assert got == ref
        assert not runners[-1]._later and not runners[-1]._later_free
        inside = depth = learnt = 0
        for e in events:
            if e == "forward":
                depth = 1
            elif e == "read":
                depth = 0
            elif e in ("learn", "account"):
                learnt += 1
                inside += depth
        assert events.count("account") == st.steps   # (every step's, none lost)
        assert events.count("learn") > 20
        # (time_split's learn_s: the learning timed where it ran under a forward)
        if padded:   # (the rest: a drafting step's learning caught up before an admission
            # into a slot that a sequence ended in gave up: 284 of 317 ran inside; when every
            # drafting step in which a sequence ended learnt at once, 117 of 180, 2026-11-30)
            assert inside >= 0.8 * learnt and past, (inside, learnt, past)
            assert st.learn_s > 0
        else:
            assert inside == 0 and not past, (inside, learnt)
            assert st.learn_s == 0.0


@pytest.mark.parametrize("method", ["draft-verify", "kangaroo"])
def test_a_lean_step_looks_at_no_sequence_of_the_drafters(model, monkeypatch, method):
    """A lean step (`auto`'s choice of ar's step) costs what ar's does at any batch: the
    planner takes the drafter's one shared idle proposal as it is, and the drafter is asked
    neither to propose nor to read each verdict, nor reads a sequence's own state (a loop
    over the batch in idle and observe made a lean step at batch 64 cost ~1.4x ar's host:
    recipes/host_profile.py). The output stays ar's. (Self-Draft learns from a lean step's
    text: under the next forward where that is hidden, else at its next drafting step.)"""
    prompts = _prompts(16, seed=5)
    clock = SimClock(h200_fused_table(), 16, prefill=prefill_table())
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=16, max_tokens=24)
    dr = method_drafters(model, prompts, ref)[method].fresh()

    class Untouched:   # a sequence's drafter state that no lean step may read
        def __getattr__(self, name):
            raise AssertionError(f"a lean step read a sequence's {name}")
    monkeypatch.setattr(dr, "admit", lambda seq: setattr(seq, "state", Untouched()))
    for name in ("propose", "observe"):
        monkeypatch.setattr(dr, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} asked"))
    ctl = sim_controller(dr, clock.table)
    monkeypatch.setattr(ctl, "plan_lean", lambda b, drain=False: ctl._lean_budgets(b))
    got, st = sim_run(model, prompts, dr, clock, batch_size=16, max_tokens=24, controller=ctl)
    assert got == ref and st.steps >= 23


def test_a_lean_stretchs_text_is_indexed_under_the_forward_before_a_drafting_step(
        model, monkeypatch):
    """Where the next step's prefetched search gives drafts, Self-Draft catches up on what the
    lean steps before it left (their text into its table) under this step's forward
    (Runner._prefetch), not in the drafting step's plan, where it was host work on that
    step's path: the plan indexes only the last lean step's tokens, committed after the
    forward. The output stays ar's."""
    prompts = _prompts(32, seed=11)
    clock = SimClock(h200_fused_table(), 8, prefill=prefill_table())
    timed_model(model, clock, monkeypatch)
    lens = [min(x, MAX_TOKENS) for x in trace_lengths(32, traces())]
    ref, _ = sim_run(model, prompts, None, clock, batch_size=8, max_tokens=lens,
                     ends_known=False)
    # (Self-Draft as users get it from GRID_FROM on: on the grid, from a context table, which
    # takes a lean stretch's text only when a step next drafts)
    dr = _drafters(model, prompts, ref, ["self-draft"], GRID_FROM)["self-draft"]
    assert dr.context_table is not None and dr.prm.grid
    events, depth = [], [0]
    for obj, name, tag in ((model, "run", "forward"), (model, "argmax", "read")):
        def logged(*a, _fn=getattr(obj, name), _tag=tag, **kw):
            depth[0] = _tag == "forward"
            return _fn(*a, **kw)
        monkeypatch.setattr(obj, name, logged)
    catch_up, tail, catching = type(dr).catch_up, type(dr)._text_tail, [False]

    def caught(self, seqs, *a, _f=catch_up, **kw):
        catching[0] = True
        try:
            return _f(self, seqs, *a, **kw)
        finally:
            catching[0] = False

    def tailed(self, s, _f=tail):   # (a catch-up's tokens, where it indexed them)
        new = len(s.out_ids) - s.state.pushed
        if catching[0] and new > 0:
            events.append((depth[0], new))
        return _f(self, s)
    monkeypatch.setattr(type(dr), "catch_up", caught)
    monkeypatch.setattr(type(dr), "_text_tail", tailed)
    ctl = sim_controller(dr, clock.table)
    ctl.lean_until = 12   # (a lean stretch first: its 11 steps' text, then a drafting step)
    got, _ = sim_run(model, prompts, dr, clock, batch_size=8, max_tokens=lens,
                     ends_known=False, controller=ctl)
    assert got == ref
    under = sum(n for inside, n in events if inside)
    assert under >= 8 * 11, events   # (the stretch's text, every sequence's; the plans
    # index the last lean step's token a sequence, committed after the forward)


def test_prefill_in_pieces_saves_what_the_tables_say(model, monkeypatch):
    """Prefill's pieces (runtime/step/prefill.py) priced from the H200's tables
    (sim.piece_price: an eager forward the prefill table's, a replay the step table's),
    prompts as long as ShareGPT's, CUDA's chunk, batch 8 with requests waiting: `ar`'s job
    faster than with eager prefill (1.07-1.09x, bench-results/2026-12-01-prefill-pieces), its
    answers the same, and its prefills about as many calls as the eager run's (the
    admission learns what a call in pieces would have cost eagerly): only the calls of a
    few prompts go in pieces."""
    from specctl.runtime.step import admission
    from specctl.runtime.step.runner import Runner
    known, prompts, lens, clock = workload(model, 8, 64, monkeypatch, real_lengths=True)
    best, outs, learnt, priced, device = {}, {}, {}, {}, {}
    prefilled, prefill = admission.Admission.prefilled, Runner._prefill

    def counted(self, forwards, tokens, ms, prompts=1):
        learnt[key].append(ms)
        return prefilled(self, forwards, tokens, ms, prompts)

    def pricing(self, seqs, under=None):
        eager = prefill(self, seqs, under)
        priced[key].append(eager)
        return eager
    monkeypatch.setattr(admission.Admission, "prefilled", counted)
    monkeypatch.setattr(Runner, "_prefill", pricing)
    # (alternated, the least of two each, of four where a busy machine pushed the ratio under:
    # another process only ever adds to a run's host time)
    pairs = 0
    for key in (False, True) * 4:
        learnt[key], priced[key] = [], []
        clock.reset()
        outs[key], st = sim_run(model, prompts, None, clock, batch_size=8, max_tokens=lens,
                                ends_known=False, pieces=key, prefill_chunk=4096)
        best[key] = min(best.get(key, float("inf")), clock())
        device[key] = min(device.get(key, float("inf")), clock.t)   # (the tables' seconds)
        assert (st.prefill_forwards > len(learnt[key])) == key   # (pieces: rounds a call)
        pairs += key
        if pairs >= 2 and key and best[False] / best[True] > 1.0:
            break
    assert outs[True] == outs[False]
    # The device's seconds, what the tables say, fall ~10% (1.10-1.11x, steady). The whole
    # job, with the host's x HOST charge, gains less: the pieces' staging and admission are
    # host work (1.07-1.09x where first measured; 1.02-1.10x on this AVX2 EPYC alone, whose
    # CPython is ~2x slower, and 0.99x under a busy machine, 2026-12-03, which failed a CI
    # run at a bar of 1.02): so the tables' saving is held, and the job only to not losing.
    assert device[False] / device[True] > 1.05, device
    assert best[False] / best[True] > 0.98, best
    # The admission learns a call in pieces at its eager price, not at what the pieces took:
    # learning the pieces' own ms split a b32 run's admissions into 22 calls where eager ones
    # made 9. (Checked on the wiring, not by counting calls against the eager run's: those
    # learn measured ms with the host's time in them, and their count moves with the CPU,
    # 19 against 14 calls in one CI run.)
    assert priced[False] == [None] * len(learnt[False])
    assert len(priced[True]) == len(learnt[True])
    pieced = [(e, ms) for e, ms in zip(priced[True], learnt[True]) if e is not None]
    assert pieced and all(ms == e for e, ms in pieced), pieced


def test_a_drafting_steps_learning_past_the_next_forward_is_not_ars_price(model, monkeypatch):
    """A drafting step's learning waits for the next step's forward and runs under it (CUDA's
    schedule: the padded clock), past it where it is long. What it takes past a lean step's
    forward is the controller's work, in the job's excess, not `ar`'s step: learnt as ar's
    price (Accounting.step's overrun), the lean step after a drafting step made ar's step
    read ~2x its own at batch 64 on the trace-grid (bench-results/2026-12-01-trace-grid), and
    drafting that lost looked level."""
    import time as _time
    from sim import OracleChains
    from specctl.engine.graphs import CudaGraphs
    from specctl.runtime.control.guard import Guard
    batch = 8
    prompts = _prompts(4 * batch, seed=5)
    clock = SimClock(h200_fused_table(), batch, host=HOST)
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=batch, max_tokens=48)
    step_s = clock.table.ms(CudaGraphs.bucket(batch, batch), 1) / 1e3

    def burn():   # (3 lean forwards of host work: one hidden under the next forward)
        t = _time.thread_time()
        while _time.thread_time() - t < 3 * step_s / HOST:
            pass

    class Learning(OracleChains):   # (each drafting step's learning: the burn)
        def observe(self, seqs, proposals, verdicts, probe_out):
            return burn
    seen = []
    lean = Guard.lean

    def learnt(self, table_ms, ms, steps=1):
        seen.append(ms / table_ms)
        return lean(self, table_ms, ms, steps)
    monkeypatch.setattr(Guard, "lean", learnt)
    runs = {}
    for burning in (False, True):
        dr = (Learning if burning else OracleChains)(ref, [0.6] * len(prompts), K=4)
        seen.clear()
        clock.reset()
        got, st = sim_run(model, prompts, dr, clock, batch_size=batch, max_tokens=48,
                          controller=sim_controller(dr, clock.table))
        assert got == ref
        assert st.steps - st.lean_steps > 4, st.steps   # (it drafted: learning to burn)
        runs[burning] = (max(seen), st.job_excess_ms, st.steps - st.lean_steps)
    (calm, calm_excess, _), (hot, hot_excess, drafting) = runs[False], runs[True]
    # every lean step's ms read as ar's within what it reads without the burn (a lean step
    # after a drafting step would read ~2 more of ar's steps)
    assert hot < calm + 1.0, runs
    # and the job's account was told: ~2 lean steps' ms a lean step after a drafting step
    assert hot_excess > calm_excess + step_s * 1e3, runs


def test_the_trace_grid_replays_the_traces(model, monkeypatch):
    """sim.TraceGrid (the product's grid step drafting from the traces) accepts what
    TraceChains does, step for step, where no controller steers either: a trace's run of
    right drafts is at most a gram long (the recorded drafter's chains), so one chain of G
    holds it; and its outputs are ar's."""
    known = traces()
    prompts = _prompts(32, seed=8)
    lens = [min(x, MAX_TOKENS) for x in trace_lengths(32, known)]
    clock = SimClock(h200_fused_table(), 8, host=HOST)
    timed_model(model, clock, monkeypatch)
    ref, _ = sim_run(model, prompts, None, clock, batch_size=8, max_tokens=lens)
    runs = {}
    for dr in (TraceChains(ref, known), TraceGrid(ref, known, model.cfg.vocab_size, clock)):
        got, st = sim_run(model, prompts, dr, clock, batch_size=8, max_tokens=lens)
        assert got == ref
        runs[type(dr).__name__] = (st.steps, dict(sorted(st.accept_hist.items())))
    assert runs["TraceGrid"] == runs["TraceChains"], runs
    assert sum(k * n for k, n in runs["TraceGrid"][1].items()) > 0, runs   # (it accepted)


@pytest.mark.parametrize("triton", [True, False])
def test_a_grid_steps_device_work_is_charged_as_cuda_launches_it(model, monkeypatch, triton):
    """The clock charges a grid step's device work the step table does not price as CUDA runs
    it: its gather (GridFill, inside the forward's graph) KERNEL_US an op, and its verification
    and moves one Triton launch where the kernel fits the cache (grid_kernel.fits; without
    Triton, the 41 tensor operations this CPU runs: 205 us a step had been charged for what a
    GPU does in one launch)."""
    import time
    import types

    import numpy as np
    import torch

    import sim
    from specctl.engine.kv import KVCache
    from specctl.engine.launches import counting
    from specctl.runtime.step.grid import GridDrafts, GridFill, GridStep
    if triton and sim._GRID_KERNEL is None:
        pytest.skip("no Triton here")
    if not triton:
        monkeypatch.setattr(sim, "_GRID_KERNEL", None)
    fill_ops, step_ops = GridFill.__call__, GridStep.device_step   # (before the clock's)
    clock = SimClock(h200_fused_table(), 8, host=1.0)
    timed_model(model, clock, monkeypatch)
    rng, B, C, G = np.random.default_rng(0), 4, 2, 3
    seq = np.array([np.arange(B), rng.integers(0, 4, B), rng.integers(0, 2, B),
                    np.full(B, G), np.full(B, C * G), rng.integers(0, 2, B)], dtype=np.int64)
    drafts = GridDrafts.make(seq, C, G)
    fill = GridFill(torch.from_numpy(rng.integers(0, 5, (3, 1 + C * G))).int(), G)
    width = GridFill.width(C, G, drafts.host.shape[1])
    n = 1 + C * G

    def up():
        u = torch.zeros(B, width, dtype=torch.long)
        u[:, :drafts.host.shape[1]] = torch.from_numpy(drafts.host)
        return u
    index = torch.from_numpy(fill.index(C, G, n, width - 1))
    u = up()
    with counting() as ops:
        fill_ops(fill, u, index, n)
    t = clock.t
    filled = up()
    fill(filled, index, n)
    assert ops.count > 5 and clock.t - t == pytest.approx(ops.count * sim.KERNEL_US / 1e6)

    step = GridStep(types.SimpleNamespace(R=C, G=G), C, kernel=False)
    target = torch.from_numpy(rng.integers(0, 5, B * n))

    def kv():
        return KVCache(1, B, 8 + n, 1, 4, torch.float32, "cpu")
    args = (drafts, target, kv(), filled.clone())
    with counting() as ops:
        want = step_ops(step, *args)
    t, args = clock.t, (drafts, target, kv(), filled.clone())
    h, cpu = clock.host_s(), time.thread_time()
    got = step.device_step(*args)
    cpu = time.thread_time() - cpu
    assert torch.equal(got, want)
    assert clock.host_s() - h < 0.25 * cpu   # (the device's work and its count: not the host's)
    assert clock.t - t == pytest.approx((1 if triton else ops.count) * sim.KERNEL_US / 1e6)
    assert triton or ops.count > 30
