"""What a controlled step teaches the controller, and the run's counts of it (--speculate auto).

    acct = Accounting(controller, stats, clock)
    work = acct.step(plan, out, seqs, had, drain, times)   # after the step's commit
    acct.flush()                                               # at the run's end

A drafting step is learnt at once: acceptance and its measured ms (Controller.observe), then
the guard's account of it against what `ar` takes for the same progress (Controller.drafted).
A lean step (every budget 0: `ar`'s path) teaches only its time, and learning one costs more
than a lean step's own host work on a small model, so lean steps of one batch size are tallied
and learnt as their mean, up to LEAN_LEARN of them at once (Controller.lean_batch).

Every step also goes into the job's account (Guard.job): its excess, the ms beyond what `ar`
takes for the same tokens. A drafting step's is its time less `ar`'s for its progress; a lean
step's, the search it made in vain (a prefetched search runs under the forward on CUDA when
short, but not always: counted, the guard's safe side); a step run with slots held free for a
grouped admission while requests wait pays its step at n sequences against n / (n + h) of its
step at n + h (`ar` under auto holds slots too, but when its own answers end, which this run
does not know: charged all the same, the guard's safe side). Prefill is taken as `ar`'s (what
a grouped admission saves there is not credited, for the same reason). The run's total excess is
RunStats.job_excess_ms (the runner takes it from the guard, as its trips).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specctl.runtime.control.controller import Controller
from specctl.runtime.step.sequence import Sequence
from specctl.runtime.step.stats import RunStats
from specctl.runtime.step.step import StepOutcome, StepPlan


@dataclass(slots=True)
class LeanTally:
    """Lean steps not learnt yet: `steps` steps of `b` sequences, up to `most`, that took `ms`
    in all; `work`: ar's table ms of one (the thread tuner's work); `contrast`: the first was a
    contrast step. b = 0: none."""
    b: int = 0
    steps: int = 0
    most: int = 0
    ms: float = 0.0
    work: float = 0.0
    contrast: bool = False
    host: float = 0.0   # the host's ms of them, in all
    timed: bool = False   # their host time is known (every step's of a run, or none's)


class Accounting:
    def __init__(self, controller: Controller, stats: RunStats, clock: Callable[[], float]):
        self.ctl, self.stats, self.clock = controller, stats, clock
        self.tally = LeanTally()

    def step(self, plan: StepPlan, out: StepOutcome, seqs: list[Sequence],
             had: list[int] | None, drain: bool, times: tuple, later: bool = False) -> float:
        """A controlled step, from the runner's readings `times` (Runner.step): the clock at
        its start, after its plan, after its read (None under sampling: verify's own device
        work follows the read) and at its end; the ms of the next step's search run under its
        forward (hidden there on CUDA when short: counted, an upper bound); the graph shapes
        captured in it (its time is then no step's cost); the slots held free for a grouped
        admission. had: its sequences' output lengths before it (None on a lean step:
        unread); drain: no request waited; later: learnt after it ended, under the next
        forward (its total is then the step as it ended; else this learning is in it; a run
        that raises drops it with the rest of its learning). Returns its work for the thread
        tuner (its table ms)."""
        t0, t1, t2, end, ahead, new, held, caught = times
        b, t, n = plan.budgets, self.tally, len(seqs)
        took = (end - t0) * 1e3
        # (a lean step's forward hides the last step's learning, caught up under it, only as
        # long as it runs: what the learning takes past that is the controller's work, not
        # `ar`'s step: learnt into ar's price, a drafting step's learning made the lean step
        # after it read 2x ar's at batch 64, and drafting that lost looked level; the job's)
        over = max(0.0, caught - self.ctl.cost.ar_table_ms(n)) if b.lean and caught else 0.0
        took -= over
        # (the host's own time: planning, and all after the read; not the search, nor
        # planning apart from drafting's host work (StepPlan.apart_ms), nor what ran under
        # the forward)
        host = None if t2 is None else \
            (t1 - t0 + end - t2) * 1e3 - plan.search_ms - plan.apart_ms
        searched = plan.search_ms + ahead
        if searched:
            self.stats.search_ms += searched
            if b.lean:   # (a search that gave no drafts is the controller's overhead, paid
                took -= searched   # for by its backoff: ar's step has none; the next
                # step's, under the forward, is hidden there on CUDA, and taking it off where
                # it was errs low on ar's price, the guard's safe side)
        if new:
            t0 = None
        if b.lean and t0 is not None:   # (most steps: what they do first is what is short)
            if held or searched or over:   # (at once: the job's account judges now)
                excess = self._held(n, held) + searched + over
                if excess:
                    self.ctl.guard.job(excess, took + searched + over, 0)
            if t.b == n and t.steps < t.most and not b.contrast:
                t.steps += 1
                t.ms += took
                if host is not None:
                    t.host += host
                return t.work
        excess = self._held(n, held) if held and t0 is not None else 0.0
        self.flush()
        ctl, st = self.ctl, self.stats
        if b.lean:   # ar's path: its time is all there is to learn (RunStats.lean)
            work = ctl.cost.ar_table_ms(n)
            if t0 is None:
                st.lean(n, 1, took, ctl.lean_done(n, None), b.contrast)
            else:    # the first of a tally of lean steps of n sequences
                self.tally = LeanTally(n, 1, ctl.lean_batch(), took, work, b.contrast,
                                       host or 0.0, host is not None)
            return work
        return self._drafted(plan, out, seqs, had, drain, took, None if t0 is None else host,
                             t0, end if later else None, excess)

    def _drafted(self, plan: StepPlan, out: StepOutcome, seqs: list[Sequence],
                 had: list[int], drain: bool, took: float, host: float | None,
                 t0: float | None, end: float | None, excess: float) -> float:
        """A drafting step's learning (step): acceptance and its ms (Controller.observe), its
        account against `ar`'s for the same progress, and the job's; end: the clock as it
        ended when learnt later, else None (now, this learning included)."""
        ctl, st, n = self.ctl, self.stats, len(seqs)
        work, expected = ctl.observe([s.slot for s in seqs], plan.budgets, plan.proposals,
                                     out.verdicts, None if t0 is None else took, host)
        total = ((self.clock() if end is None else end) - t0) * 1e3 if t0 is not None \
            else None   # (observe too, unless learnt later)
        ar = ctl.drafted(n, total, _progress(seqs, had, drain))
        st.ar_step_ms += ar
        if total is not None:
            self.ctl.guard.job(excess + total - ar, total, 1)
        self._count(plan, out, expected, took if total is None else total)
        return work

    def _held(self, n: int, h: int) -> float:
        """What n sequences' step costs beyond `ar`'s with h held slots filled, per token."""
        if not h:
            return 0.0
        ar = self.ctl.ar_ms
        return max(0.0, ar(n) - ar(n + h) * n / (n + h))

    def flush(self) -> None:
        """The tally of lean steps so far into the controller and the stats, as their mean."""
        t = self.tally
        if t.steps:
            self.stats.lean(t.b, t.steps, t.ms,
                            self.ctl.lean_done(t.b, t.ms / t.steps, t.steps,
                                               t.host / t.steps if t.timed else None,
                                               t.steps if t.timed else 0),
                            t.contrast)
            self.tally = LeanTally()
            self.ctl.guard.job(0.0, t.ms, t.steps)   # (their excess was told at once)

    def _count(self, plan: StepPlan, out: StepOutcome, expected: float, took: float) -> None:
        st, b = self.stats, plan.budgets
        for k in b.ks:
            st.budget_hist[k] = st.budget_hist.get(k, 0) + 1
        st.explored += b.explored
        st.contrasts += b.contrast
        st.confidence_stops += plan.confidence_stops
        st.controlled_steps += 1
        st.predicted_step_ms += b.predicted_ms
        st.predicted_tokens += expected
        st.verified_tokens += len(plan.seqs) + (sum(out.verdicts.acc) if plan.grid is not None
                                                 else sum(len(v.accepted) for v in out.verdicts))
        st.measured_step_ms += took


def _progress(seqs: list[Sequence], had: list[int], drain: bool) -> float:
    """A drafting step's progress in `ar` steps: the tokens it emitted per sequence, or while
    the batch drains its longest sequence's (the job ends with it: what it emitted, at most
    what the longest remaining fell by; an EOS is no progress of ar's, nor a new longest
    sequence taking over)."""
    if not drain:
        return sum(len(s.out_ids) - k for s, k in zip(seqs, had)) / len(seqs)
    i = max(range(len(seqs)), key=lambda j: seqs[j].req.max_tokens - had[j])
    drop = max(s.req.max_tokens - k for s, k in zip(seqs, had)) - \
        max(0 if s.finished else s.req.max_tokens - len(s.out_ids) for s in seqs)
    return float(min(len(seqs[i].out_ids) - had[i], max(drop, 1)))
