"""The step loop: continuous batching over KV slots, prefill, draft -> verify -> commit.

    runner = Runner(model, drafter, sampling, batch_size=8, max_len=..., eos_ids={...},
                    render=..., decode=...)
    runner.run(requests, on_done=write_record)

Scheduling (nano-vllm style): up to `batch_size` sequences hold a KV slot each; whenever one
finishes (EOS, its token budget, a stop string, the context end) its slot is freed and the next
waiting prompt is admitted at once, so a long answer never holds a batch back; under a
controller, once a prefill forward's fixed cost is measured to be worth more than a few idle
slots, a few freed slots are filled together (runtime/step/admission.py). A multi-turn request
re-enters the queue (at its front) for its next stage.

With a paged KV cache (a memory budget smaller than every slot at full length, engine/kv.py) a
prompt is admitted only when the blocks for it and one step are free, and before each step every
running sequence reserves the rows the step may write (Drafter.step_rows). When the pool runs
dry the newest sequence is preempted: its blocks are freed, its stage's work undone, and it goes
back to the front of the queue to start that stage again (recomputed from its prompt; its output
is the same, since decoding depends only on the request). No step ever runs out of rows.

Each iteration: prefill the newly admitted sequences (their prompts packed together, in chunks of
at most `prefill_chunk` tokens), then one step over all running sequences: the drafter proposes a
tree per sequence, the target runs once over [pending token + drafts] of every sequence packed
flat (no padding: the tokens computed equal the sum of real tokens), the verifier picks the
accepted path and bonus token per sequence, and the KV cache keeps exactly the accepted rows.

Speculation: without a controller each drafter drafts its own amount (`--speculate fixed`, the
papers' settings); with one (`--speculate auto`, runtime/control/controller.py) every step
gives each sequence a draft budget before the drafter proposes: the budget caps the sequence's
room, so budget 0 is an `ar` step for it (no draft forward, no probe). The step and the learning
around it are the Runner's base, runtime/step/stepping.py; its stages are in runtime/step/step.py
(plan -> forward -> verify) and runtime/step/commit.py.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from functools import partial
from operator import attrgetter
from typing import Callable, Iterable

import torch

from specctl.engine.batch import FULL
from specctl.engine.model import Model
from specctl.runtime.control.controller import Controller
from specctl.runtime.step.accounting import Accounting
from specctl.runtime.step.admission import Admission
from specctl.runtime.step.answers import Answers
from specctl.runtime.step.prefill import (PiecePrice, measure_pieces, piece_prompts, prefill,
                                          prefill_plan)
from specctl.runtime.step.sequence import Request, Sequence, request_rng
from specctl.runtime.step.stats import RunStats
from specctl.runtime.step.step import Planner
from specctl.runtime.step.stepping import Stepping
from specctl.runtime.control.steptables import STEP_TABLE_ROWS
from specctl.runtime.step.threads import ThreadTuner
from specctl.speculative.drafter import Drafter
from specctl.speculative.sampling import SamplingParams, position_uniforms, sample_rows, warp

_SLOT = attrgetter("slot")   # (a running sequence's sort key)
_ADMITTED = attrgetter("admitted")   # (and its admission's, newest preempted first)


class Runner(Stepping):
    def __init__(self, model: Model, drafter: Drafter, sampling: SamplingParams, *,
                 batch_size: int, max_len: int, eos_ids: set[int],
                 render: Callable[[Request], list[int]], decode: Callable[[list[int]], str],
                 stop: tuple[str, ...] = (), prefill_chunk: int = 512,
                 threads: int | None = None, controller: Controller | None = None,
                 kv_budget: int | None = None, logprobs: int | None = None):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.controller = controller
        self.model, self.sp = model, sampling
        self.batch_size, self.max_len = batch_size, max_len
        self.render = render
        self.prefill_chunk = prefill_chunk
        self.logprobs = logprobs   # None, or how many alternatives per token to record
        headroom = drafter.kv_headroom
        length = max_len
        if model.graphs is not None:
            # one cache shape for every method, so runs of different methods (a bench's
            # round-robin) keep replaying the same captured graphs instead of re-capturing;
            # long enough for the step-cost table to be measured on it (make_controller)
            headroom = max(headroom, model.graphs.max_n)
            length = max_len + headroom if kv_budget is not None else \
                max(max_len + headroom, STEP_TABLE_ROWS)   # (a paged pool: a budget's rows)
        else:
            length = max_len + headroom
        # kv_budget: bytes for the cache (and a drafter's own, Kangaroo's adapter's, sharing
        # its rows); smaller than every slot at full length -> paged
        share = None
        if kv_budget is not None and drafter.kv_layers:
            L = model.cfg.num_layers
            share = L, drafter.kv_layers
            kv_budget = int(kv_budget * L / (L + drafter.kv_layers))
        try:
            self.kv = model.new_kv_cache(batch_size, length, kv_budget)
        except ValueError as e:   # (a budget that reads as half the one given: say why)
            if share is None or "KV cache budget" not in str(e):
                raise
            L, k = share
            raise ValueError(f"{e} ({drafter.name}'s adapter keeps rows worth {k:.1f} of the "
                             f"model's layers beside its {L}: the model's rows get "
                             f"{L / (L + k):.0%} of the budget)") from None
        self._admitted = 0
        self._held = 0   # slots the step loop holds free for a grouped admission (accounting)
        # the last step's learning (under_forward): what reads a slot (caught up before a
        # retirement gives the slot up), and what reads none (it waits on past one)
        self._later: list[Callable[[], object]] = []
        self._later_free: list[Callable[[], object]] = []
        self.caught_ms = 0.0   # the last under_forward's catch-up, on the run's clock
        self._on_tokens = None
        self._rendered = None
        self.planner = Planner(model, drafter, self.kv, max_len, controller)
        self._overlaps = self.planner.overlaps   # (its every step reads it: kept, not asked)
        self.stats = RunStats(kv_bytes=self.kv.bytes, prefill_chunk=prefill_chunk,
                              kv_blocks=self.kv.num_blocks if self.kv.paged else 0)
        self.answers = Answers(eos_ids, stop, decode, self.kv, max_len, self.stats, logprobs)
        self.clock = time.perf_counter   # (a test's simulated clock replaces it)
        self.accounting: Accounting | None = None   # (set_controller)
        self.admission = Admission(batch_size)
        # freed slots admitted in groups (admission.py): under --speculate auto, every
        # method's and ar's (set_controller, make_runner); else at once, so the schedule is
        # a function of the inputs alone
        self.grouped = False
        # what a prefill forward costs eagerly and in pieces (prefill.py), where the device
        # measured it (_warm); used by a grouped run only: a schedule of the inputs alone
        # (--speculate fixed) does not follow timings
        self.prefill_price: PiecePrice | None = None
        self._warm()
        if controller is not None:
            self.set_controller(controller)
        # CPU threads: a fixed count, or (None) measured as the run goes (runtime/step/threads.py)
        self.threads = threads

    @property
    def drafter(self) -> Drafter:
        """The run's drafter: the planner's, which proposes (one object, so a drafter set here
        is the one that drafts: search-skip's DevSet sets each candidate's in turn)."""
        return self.planner.drafter

    @drafter.setter
    def drafter(self, drafter: Drafter) -> None:
        self.planner.drafter, self.planner.lean_forward = drafter, None

    def _warm(self) -> None:
        """Capture every graph shape the drafter's steps can meet, now, on the run's own
        cache (engine/graphs.py): a shape captured inside a step would cost that step 20-40
        of `ar`'s steps and be learnt as what drafting costs."""
        g = self.model.graphs
        t0 = self.clock()
        # (asking makes what the drafter keeps per cache, Kangaroo's adapter head and its KV
        # rows, without graphs too: now, not in the run's first prefill, on its clock)
        forwards = self.drafter.graph_forwards(self.kv)
        if g is None:
            return
        grid = self.planner.grid = self._grid_step()
        if grid is not None:   # (its steps' forwards gather their tokens: GridFill)
            forwards = forwards + [(FULL, None, 1 + grid.C * grid.G,
                                    grid.fill(self.model.device))]
        # (and prefill's pieces where real graphs are captured: prefill.py; a CPU's test sets
        # prefill_price itself)
        plan, most = prefill_plan(self.drafter), piece_prompts(self.kv, self.prefill_chunk)
        pieces = [(plan, most)] if g.capture else []
        self.stats.captures += g.warm(self.kv, forwards, pieces)
        if pieces:   # (once a cache: its graphs and costs serve every runner on it; its
            # seconds are the captures': start-up, out of tokens/s)
            self.prefill_price = g.keep(("prefill-price", plan, most), self.kv, lambda:
                                        measure_pieces(self.model, self.kv, plan,
                                                       self.prefill_chunk))
        self.stats.capture_s += self.clock() - t0

    def set_controller(self, controller: Controller) -> None:
        """Speculate under `controller` (--speculate auto): made after the runner, so the
        step-cost table it may measure runs on this runner's cache and graphs."""
        self.controller = self.planner.controller = controller
        self.grouped = True
        self._overlaps = self.planner.overlaps
        t0 = time.perf_counter()
        controller.warm(self.batch_size)   # (its searches' tables: made now, not in a step)
        self.stats.profile_s = controller.profile_s + time.perf_counter() - t0
        self.accounting = Accounting(controller, self.stats, lambda: self.clock())

    # -- the loop ---------------------------------------------------------------------------
    def run(self, requests: Iterable[Request], on_done: Callable[[Request], None],
            on_tokens: Callable[[int], None] | None = None) -> RunStats:
        cpu_threads = torch.get_num_threads()
        ctl = self.controller
        marks = (ctl.searches, ctl.guard.trips, ctl.guard.held, ctl.guard.job_trips,
                 ctl.guard.excess) if ctl is not None else None
        # (a drafter that says where its accepted tokens came from, Self-Draft's caches: a
        # drafter may serve several runs, so this run's share is the difference)
        came = dict(getattr(self.drafter, "accepted_from", {}))
        if ctl is not None:
            ctl.new_run()
        self.drafter.overlapped = self._overlaps = self.planner.overlaps
        self.planner.grid = self._grid_step()
        price = self.prefill_price if self.grouped else None
        if price is not None:   # (the prices prefill follows: RunStats.piece_*)
            st = self.stats
            st.piece_prompts, st.piece_eager_ms, st.piece_replay_ms = \
                price.most, price.eager[1], price.replay[1]
        self.planner.lean_forward = None
        # what exists now (the model's and the drafter's objects, a corpus cache's tables)
        # is out of the cyclic GC's sight for the run: a collection in a step scanned it all
        # (Self-Draft's first steps at batch 64 paid ~2 ms for one, as much as a step's
        # forward on a GPU); the run's own objects are collected as ever, and all of them
        # again after it (what is garbage now is freed then)
        gc.freeze()
        try:
            with torch.inference_mode():   # (once: the forwards' own then cost nothing,
                # engine/inference.py)
                return self._loop(requests, on_done, on_tokens, self._tuner())
        except BaseException:
            # (a run that failed learns nothing more from its last step)
            self._later, self._later_free = [], []
            raise
        finally:
            gc.unfreeze()
            self.catch_up()   # (what waits past the last retirements: a grid or lean step's)
            torch.set_num_threads(cpu_threads)
            self.stats.accepted_from = {k: v - came.get(k, 0) for k, v in
                                        getattr(self.drafter, "accepted_from", {}).items()}
            if ctl is not None:
                self.accounting.flush()
                st = self.stats
                st.searches += ctl.searches - marks[0]
                st.guard_trips += ctl.guard.trips - marks[1]
                st.guard_held += ctl.guard.held - marks[2]
                st.guard_job_trips += ctl.guard.job_trips - marks[3]
                st.job_excess_ms += ctl.guard.excess - marks[4]

    def _tuner(self) -> ThreadTuner | None:
        if self.model.device.type != "cpu":
            return None
        if self.threads is not None:
            torch.set_num_threads(self.threads)
            return None
        return ThreadTuner(torch.get_num_threads())

    def _loop(self, requests, on_done, on_tokens, tuner: ThreadTuner | None) -> RunStats:
        waiting: deque[Request] = deque(requests)
        free = list(range(self.batch_size))
        running: list[Sequence] = []
        self._on_tokens = on_tokens
        while waiting or running:
            # the running sequences' rows for this step first (a paged cache: preempting the
            # newest when short), then new prompts into what is left (not after a preemption:
            # the preempted one would come straight back and be preempted again)
            preempted = self.stats.preemptions
            self._reserve(running, free, waiting)
            fresh = []
            # (grouped: a few free slots are filled in one prefill, admission.py)
            hold = bool(running and free and waiting) and self.grouped and \
                self.admission.hold(len(free), len(waiting), lambda: self._soon(running),
                                    self.prefill_chunk)
            self._held = len(free) if hold else 0
            while free and waiting and not hold and self.stats.preemptions == preempted:
                seq = self._admit(waiting[0], free[0])
                if seq is None:   # too few free KV blocks: wait for a sequence to finish
                    if not running and not fresh:
                        raise RuntimeError("KV cache: an empty pool cannot hold one sequence")
                    break
                waiting.popleft()
                free.pop(0)
                if seq.finished:   # could not start (prompt too long for the context)
                    self._retire(seq, free, waiting, on_done)
                    continue
                fresh.append(seq)
            if fresh:
                t, st = self.clock(), self.stats
                forwards, tokens = st.prefill_forwards, st.prefill_tokens
                eager = self._prefill(fresh, under=lambda: self.under_prefill(
                    [s for s in running if not s.finished] + fresh, not waiting))
                took = self.clock() - t
                st.prefill_s += took
                forwards, tokens = st.prefill_forwards - forwards, st.prefill_tokens - tokens
                if eager is not None:   # (in pieces: the groups are still sized by what an
                    # eager prefill costs, as before; learning the pieces' ms split a b32 run's
                    # admissions into 22 prefills where eager ones were 9, and lost 3% on the
                    # host-charged clock, bench-results/2026-12-01-prefill-pieces. The price
                    # alone: the call's measure plus what the pieces saved grouped larger and
                    # gained less, 1.030-1.039x against 1.032-1.055 on a slow host, 2026-12-02)
                    forwards, took = -(-tokens // self.prefill_chunk), eager / 1e3
                self.admission.prefilled(forwards, tokens, took * 1e3, len(fresh))
                running.extend(fresh)
            # (each step's passes over the batch: a C-level key and finish_reason read, not
            # a lambda and the `finished` property a sequence, ~10 -> ~2.5 us a step at
            # batch 64 warm; bench-results/2026-12-01-commit-host)
            running.sort(key=_SLOT)
            live = [s for s in running if s.finish_reason is None]
            took = None
            if live:
                before = self.stats.generated
                if tuner:
                    tuner.before()
                t0 = self.clock()
                work = self.step(live, drain=not waiting)
                took = self.clock() - t0
                self.stats.step_s += took
                if tuner:
                    tuner.after(took, work)
                if on_tokens:
                    on_tokens(self.stats.generated - before)
            done = [s for s in running if s.finish_reason is not None]
            if took is not None:   # (those the step finished: the rest were done before it)
                self.admission.stepped(took * 1e3, len(done) - len(running) + len(live))
            for s in done:
                running.remove(s)
                self._retire(s, free, waiting, on_done)
        return self.stats

    def _soon(self, running: list[Sequence]) -> int:
        """The fewest steps a running sequence may have left: its token budget, or the
        context's end (a step emits at least a token)."""
        lens, m = self.kv.lens, self.max_len
        live = [s for s in running if s.finish_reason is None]
        if not live:
            return m
        # (the least of either limit over the batch: two list passes, not a min a sequence)
        return min(min([s.req.max_tokens - len(s.out_ids) for s in live]),
                   m - 1 - max([lens[s.slot] for s in live]))

    def _admit(self, req: Request, slot: int) -> Sequence | None:
        """The request's next stage in `slot`, or None when the KV cache has too few free
        blocks for its prompt and one step (nothing changed then)."""
        memo = self._rendered   # (a waiting stage is tried again each step until it fits)
        if memo is None or memo[0] is not req or memo[1] != len(req.answers):
            memo = self._rendered = (req, len(req.answers), self.render(req))
        ids = memo[2]
        self.kv.reset(slot)
        fits = len(ids) + 1 <= self.max_len
        if fits and not self.kv.reserve(slot, len(ids) + self.drafter.step_rows):
            return None
        if req.started is None:
            req.started = time.perf_counter()
        rng = None if self.sp.greedy else request_rng(self._seed(req), req.stream)
        self._admitted += 1
        seq = Sequence(req, ids, slot, rng, admitted=self._admitted,
                       mark=(req.steps, len(req.accept_lengths), len(req.draft_lengths)))
        req.prompt_tokens += len(ids)
        if not fits:
            seq.finish_reason = "context"
        else:
            self.drafter.admit(seq)
        return seq

    def _reserve(self, running: list[Sequence], free: list[int], waiting: deque) -> None:
        """Reserve the KV rows the next step may write for every running sequence, oldest
        first, preempting the newest while the pool is short. (Sequences admitted this
        iteration reserved a prompt's and a step's rows at admission.)"""
        kv = self.kv
        if not kv.paged:
            return
        rows, lens, reserve = self.drafter.step_rows, kv.lens, kv.reserve
        cut = False   # (a preemption so far: a later sequence may be gone, its slot freed)
        for s in sorted(running, key=_ADMITTED):
            if cut and s not in running:
                continue
            if reserve(s.slot, lens[s.slot] + rows):   # (most steps: every sequence, with
                continue                                # no scan of `running` a sequence)
            while s in running and not reserve(s.slot, lens[s.slot] + rows):
                self._preempt(max(running, key=_ADMITTED), running, free, waiting)
                cut = True

    def _preempt(self, seq: Sequence, running: list[Sequence], free: list[int],
                 waiting: deque) -> None:
        """Give seq's slot and blocks back and queue its stage to start again: everything the
        stage added to its request and to the run's counts is undone."""
        self.catch_up()
        req = seq.req
        steps, accepts, drafts = seq.mark
        req.steps = steps
        del req.accept_lengths[accepts:], req.draft_lengths[drafts:]
        req.prompt_tokens -= len(seq.prompt_ids)
        self.stats.generated -= len(seq.out_ids)
        self.stats.recomputed += len(seq.out_ids)
        self.stats.preemptions += 1
        if self._on_tokens and len(seq.out_ids) > 1:   # (its prefill token was not reported)
            self._on_tokens(1 - len(seq.out_ids))
        if self.controller is not None:
            self.controller.forget(seq.slot)
        self.kv.reset(seq.slot)
        running.remove(seq)
        free.append(seq.slot)
        free.sort()
        waiting.appendleft(req)

    def _retire(self, seq: Sequence, free: list[int], waiting: deque, on_done) -> None:
        req = seq.req
        if seq.prefilled or seq.out_ids:
            self.drafter.retire(seq)
        done = self.answers.finish(seq)
        if self.controller is not None:   # (after the learning that reads its slot: that
            # waits for the next forward, a prefill's if a sequence is admitted into the slot
            # first, under_prefill; on the step's path it cost a drafting step in which a
            # sequence ended ~0.3 ms of host at b32 on the demo model,
            # bench-results/2026-11-30-plan-host)
            if self._later:
                self._later.append(partial(self.controller.forget, seq.slot))
            else:
                self.controller.forget(seq.slot)
        self.kv.reset(seq.slot)
        free.append(seq.slot)
        free.sort()
        if done:
            req.wall_time = time.perf_counter() - req.started
            on_done(req)
        else:
            waiting.appendleft(req)

    # -- prefill ----------------------------------------------------------------------------
    def _prefill(self, seqs: list[Sequence],
                 under: Callable[[], None] | None = None) -> float | None:
        """prefill.prefill's: what the prompts would have cost eagerly where they went in
        pieces."""
        return prefill(self.model, self.kv, self.drafter, seqs, self.prefill_chunk, self.stats,
                       self.answers, self._sample_rows, self.logprobs, under,
                       self.prefill_price if self.grouped else None)

    def _sample_rows(self, h: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Each sequence's next token from its row of last-layer states h [B, D]: the argmax,
        or its draw (position_uniforms)."""
        if self.sp.greedy:
            return self.model.argmax(h).tolist()
        return sample_rows(warp(self.model.logits(h), self.sp),
                           [self._uniforms(s, 1)[0] for s in seqs]).tolist()

    def _uniforms(self, s: Sequence, n: int) -> list[float]:
        """The uniforms of s's next n output positions (one stream per request and turn)."""
        return position_uniforms(self._seed(s.req), s.req.stream, len(s.out_ids), n)

    def _seed(self, req: Request) -> int:
        """The request's own seed (a line's), else the run's: draws are keyed by it, so lines
        with different seeds share steps."""
        return (self.sp.seed + req.sample) % 2**63 if req.seed is None else req.seed
