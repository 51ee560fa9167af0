"""The goodput controller of `--speculate auto`: each step's draft budgets, and what the run
learns from each step.

    ctl = make_controller(drafter, model, batch_size, store=..., fingerprint=...)
    b = ctl.plan(slots, room)              # Budgets: per sequence a draft budget (0 = ar)
    stop = ctl.stop_rule(b)                # for the chain drafter (or None)
    ... draft within b.ks, verify, commit ...
    ctl.prefetch(slots, room, drain)       # (CUDA, while the forward runs) the next search
    ctl.observe(slots, b, proposals, verdicts, measured_ms)
    ctl.drafted(len(slots), step_ms, progress)   # the guard's account (b.lean: ctl.lean_done)

Three parts, one module each: the acceptance estimates (runtime/control/acceptance.py: what a budget
is expected to add), the step cost (runtime/control/stepcost.py: what it costs, from the step-cost
table and the drafter's own DraftPrice, corrected by measured steps) and the policy
(runtime/control/policy.py: pure functions from those numbers to budgets). The controller adds the
schedule of the steps whose point is to learn, and feeds each step's outcome back.

Exploration: a sequence at budget 0 drafts nothing, so nothing new is learnt about it, and an
estimate that once ruled drafting out would rule it out for good (a sequence that turns
repetitive later, a pooled prior that was too low). So every `explore_every` steps (default 32)
every sequence with room gets `explore_budget` more drafts (chains 2, trees 4 nodes) than the
search gave it, in that one step: all of them in the same step, because with padded graphs a
step costs by its longest sequence, so one exploring sequence would cost as much as all. Its
price is held to `explore_cost` (2%) of the steps it is spread over: an exploring step whose
predicted extra cost is e steps waits at least e / explore_cost steps after the last one (on
a 2-core CPU at batch 1 two layer-skip draft forwards cost ~2 steps, so it explores every ~100
steps; on the H100's demo-model table, batch 32, n 1 -> 5 costs ~0.7 of a step, so every 35).
What an exploring step learns is used by the steps after it, so a batch explores only while
requests wait for its slots (draining, the job ends with sequences already running: a lesson
comes too late) and while its sequences have on average at least `explore_every` tokens left
to emit (a batch of 48-token answers near their end, the whole run at batch 16 with 16
prompts, paid for an exploring step and budgets it learnt that it had no steps left to use).
An exploring step does not stop chains on confidence: its extra drafts are there to be
measured. One whose extra drafts get nothing accepted doubles the period to the next (up to
EXPLORE_BACKOFF times `explore_every`); one that gets something back resets it: a method
whose drafts are never accepted (a layer-skip or an adapter that does not fit the model)
then pays for ~log2(steps / 32) exploring steps, not one in every 32.

Contrast steps: step costs are learnt only from steps that run, and a run that drafts in every
step never times a step without drafts, the one it must beat (on the 2-core CPU at batch 8 the
table had a draft token for each sequence at +10%, and every step drafted). So, once steps are
timed, after 1, 4, 8 and 16 drafting steps in a row and then every `explore_every`, one step
runs without drafts (early ones come sooner: one step's timing is noisy and a short run must
learn the contrast too; the first after a single drafting step, while no step without drafts
has been timed: until then each step's time moves the drift that prices both kinds of step,
so one dear drafting step made `ar`'s step look as dear, and a draining batch of 64 on the
host-charged clock drafted on at 3x a lean step's cost). Past the first ~30 steps that costs
at most the speculation's gain in one step of 32. A contrast step is a lean step (plan_lean
decides it, before any search):
timed with the search and the drafter's planning in it, it priced `ar` at ~1.4x its step on
the H100 at batch 32, and drafting that lost 30% won every comparison. For the same reason a
step whose search gave no drafts is learnt without the search's time (the runner subtracts
StepPlan.search_ms): that is the controller's overhead, which its backoff bounds, not `ar`'s.

Lean steps: a step whose budgets are all 0 is `ar`'s step and costs what `ar`'s does: the
drafter gives its idle proposals (Drafter.idle: no draft, no probe, no stop rule), plan_lean
decides it without looking at the sequences, and the runner learns only the steps' time, the
mean of up to LEAN_LEARN of them at once (lean_done: the step cost's class without drafts,
and the guard's `ar` reference), not acceptance (nothing was drafted). While the search keeps
giving every sequence 0 it is not run again for 1, 2, 4 .. LEAN_MAX steps (nothing it reads
changes until a draft is accepted), but for an exploring step when it is due and its price
paid for. And the measured guard (runtime/control/guard.py) holds the run to lean steps when its
drafting steps fall behind what `ar` takes for the same progress.

The run's first drafting step: where the host runs beside the forward a step is learnt a step
late (under the next one's forward), so the step after the run's first drafting step would
draft on the prior too, before the first is learnt. Where that step got fewer than half the
drafts it expected accepted (Controller.verified, told at once) the next is a lean step
instead: on the host-charged clock a method that accepts nothing paid two drafting steps,
~4% of a 64-token drain at batch 1, and the lean step times the step drafting must beat.
(Any accepted draft is too weak a sign: at batch 27 a random adapter hits one. Drafting only
a few sequences until a drafting step's host work is timed was tried too: it cost
Self-Draft ~3 steps of 90 at batch 8 with requests waiting, where its first steps accept ~15
tokens, and saved ~0.4% of a 64-sequence drain; not kept.) And a drafter that runs draft
forwards (draft-verify, Kangaroo) spends the host a lean step's work on each of them, which
the table does not price: until some step has been timed its steps are lean (an `ar` step
costs nothing against `ar`), and its first drafting step is priced with each draft forward
costing the host what a lean step of as many sequences took (StepCost.untimed_host; where a
step's host share is not timed, as under sampling, the prior is nothing, as before). On the
host-charged clock Kangaroo's first drafting step at batch 1, priced 3.2 ms, took 5.2-5.8, ~3% of
a 64-token drain.

While the batch drains (no request waits) the search prices the job's critical path instead of
the step's goodput (policy.drain_best), with each sequence's acceptance taken at what the
slowest of the batch's sequences may be (Acceptance.gains_many's `slowest`). And a drain's
first drafting step is not priced at no host work: its steps are lean until a lean step's host
is timed, as above, and then a step that drafts before any drafting step has been timed is
priced DRAIN_HOST lean steps of host more (StepCost.untimed_host). A step learnt from comes too
late to pay there: on the host-charged clock every drafting method's pure drain at batch 32-64
drafted one or two steps on the prior, each costing ~7 lean steps' host and saving no step
(26 of 32 sequences on the critical path, most accepting nothing), and ran 0.96-0.98x `ar`; priced,
they draft none (or the trace at batch 32, where its gain beat the price, two late ones) and run
0.985-1.0x. A drain of one sequence does not wait (_untimed_host).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from specctl.runtime.control import policy
from specctl.runtime.control.acceptance import Acceptance
from specctl.runtime.control.guard import Guard
from specctl.runtime.control.stepcost import StepCost, cost_for
from specctl.runtime.control.steptables import step_table_for
from specctl.engine.steptable import StepTable


EXPLORE_BACKOFF = 16   # the longest exploration period, in units of explore_every
LEAN_MAX = 128         # the most steps between two searches that gave every budget 0
LEAN_LEARN = 32        # lean steps of one batch size learnt as one, by their mean time
KEEP_STEPS = 4         # steps a search's budgets serve while its inputs hold (_kept)
KEEP_NEW = 1 / 16      # ...while what was learnt of its sequences since is under this share
# (at 1/8, oracle chains of very uneven acceptance at b8 ran 0.8% slower with the known-end
# admission, tests/test_admission.py; at 1/16 as before, with ~25% fewer searches at b8-64)


@dataclass
class Prefetched:
    """A search made for step `step` while the step before it ran (Controller.prefetch)."""
    step: int
    drain: bool
    order: tuple | None     # the sequences it searched for, in order (None: one has left)
    ks: dict                # their budgets, by key
    fill: int               # a sequence admitted since: the search's level, or 0
    gains: np.ndarray       # [len(order), K + 1]
    probes: bool
    explores: bool = False  # an exploring step is due then (decide widens the budgets)
    ready: "Budgets | None" = None   # decide's answer, where nothing changes (Controller._ready)


class Searched(NamedTuple):
    """prefetch's last search, as _kept reads it."""
    order: tuple            # the sequences it searched for, in order
    drain: bool
    step: int               # the step it was made for
    learnt: float           # the verified steps learnt of those sequences then (_learnt)
    probes: bool
    gains: np.ndarray
    ks: list                # their budgets


@dataclass(frozen=True)
class Budgets:
    """One step's decision: what the planner hands the drafter and later learns against."""
    ks: tuple[int, ...]                   # draft budget per sequence (0: an ar step)
    probes: bool                          # whether speculating sequences run their probes
    gains: np.ndarray                     # gains[i, k]: expected emitted tokens at budget k
    predicted_ms: float                   # the step's predicted cost
    explored: int = 0                     # sequences given the exploration budget
    contrast: bool = False                # a step run without drafts to time it
    stops: bool = False                   # chains may stop early on a draft's confidence
    base: tuple[int, ...] | None = None   # an exploring step: the budgets it widened
    lean: bool = False                    # every budget 0: `ar`'s step (nothing to observe)


class Controller:
    """Per-sequence, per-step draft budgets (module docstring). Sequences are keyed by slot."""

    def __init__(self, cost: StepCost, max_budget: int, *, tree: bool = False,
                 prior_accept: float = 0.7, prior_weight: float = 4.0, explore_every: int = 32,
                 explore_budget: int | None = None, explore_cost: float = 0.02,
                 probe_share: float = 0.1, correct: bool = True, guard: bool = True,
                 wait_first: bool = True):
        if max_budget < 0:
            raise ValueError("max_budget must be >= 0")
        self.cost, self.K, self.tree = cost, max_budget, tree
        self.acc = Acceptance(max_budget, tree, prior_accept, prior_weight)
        self.explore_every = explore_every   # 0: never explore (nor contrast)
        self.period = explore_every          # now (backed off while exploring finds nothing)
        self.explore_budget = explore_budget if explore_budget is not None else (4 if tree else 2)
        self.explore_cost = explore_cost
        self.probe_share = probe_share
        self.wait_first = wait_first   # (the run's first drafting step: module docstring)
        self.correct = correct   # step costs corrected by measured step times (stepcost)
        self.steps = 0
        self.last_explore = 0
        self.last_bare = 0       # the last step without drafts
        self.contrasts = 0
        self.profile_s = 0.0     # seconds spent getting the step-cost table
        self.searches = 0        # policy searches run (a prefetched one too)
        self.timed_steps = 0     # drafting steps observed with their time (contrasts need it)
        self.idle = 0            # lean steps granted after the last search that gave 0s
        self.lean_until = 0      # no search before this step (but an exploring step's)
        self.next_try = 0        # the first step an exploring step due may pay for itself
        self.unlearnt = 0        # drafting steps decided and not yet observed
        self.hit = False         # whether the last one verified got half its expected drafts
        self.guard = Guard(active=guard)   # (off: decisions by the table and acceptance alone)
        self._lean: dict = {}   # batch, or (batch, True) a contrast step's -> lean Budgets
        self._next: Prefetched | None = None   # prefetch's search for the next step
        self._last: Searched | None = None   # prefetch's last search (_kept)

    def _lean_budgets(self, b: int, contrast: bool = False) -> Budgets:
        key = (b, True) if contrast else b
        got = self._lean.get(key)
        if got is None:
            got = self._lean[key] = Budgets((0,) * b, False, None, 0.0, contrast=contrast,
                                            lean=True)
        return got

    def _explore_due(self, room: list[int], s: int | None = None) -> bool:
        """Whether step s (default: the current one) explores (module docstring)."""
        s = self.steps if s is None else s
        return bool(self.explore_every) and s - self.last_explore >= self.period \
            and sum(room) >= self.explore_every * len(room)   # steps left to use the lesson

    def plan_lean(self, b: int, drain: bool = False) -> Budgets | None:
        """This step's budgets when they are a lean step's without looking at the sequences
        (a contrast step is due, the guard holds, or a lean stretch goes on and no exploring
        step can be due): plan's decision, at a lean step's cost. None: ask decide."""
        s, g = self.steps + 1, self.guard
        if g.hold:   # (held to ar: no contrast step is due, _contrast_due)
            g.holding()   # (counts a held step)
        elif s - self.last_bare > 1 and self._contrast_due(s):   # (in a lean stretch: never)
            self.contrasts += 1
            self.steps = self.last_bare = s
            return self._lean_budgets(b, contrast=True)
        elif s >= self.lean_until or self.explore_every and not drain and \
                s - self.last_explore >= self.period and s >= self.next_try:
            return None   # (_may_search's test, inline: most steps ask it)
        self.steps = self.last_bare = s
        try:   # (the lean step's own: one look-up, not _lean_budgets')
            return self._lean[b]
        except KeyError:
            return self._lean_budgets(b)

    def _may_search(self, s: int, drain: bool) -> bool:
        """Whether step s may search: past a lean stretch, or an exploring step may be due
        and paid for (never while draining: decide)."""
        return s >= self.lean_until or bool(self.explore_every) and not drain and \
            s - self.last_explore >= self.period and s >= self.next_try

    def _contrast_due(self, s: int) -> bool:
        """Whether step s is a contrast step: drafting steps have been timed and the steps
        since the last one without drafts all drafted, 1 (while no step without drafts has
        been timed), 4, 8, 16, then explore_every of them (module docstring)."""
        gap = 1 if self.guard.ar_log is None else \
            min(self.explore_every, 2 ** (self.contrasts + 1))
        return bool(self.explore_every) and self.timed_steps > 0 and not self.guard.hold \
            and s - self.last_bare > gap

    def plan(self, keys: list, room: list[int], drain: bool = False) -> Budgets:
        """This step's budgets for the sequences `keys`, budget i at most room[i]. drain: no
        request waits (the job ends with its slowest sequence: policy.drain_best)."""
        got = self.plan_lean(len(keys), drain)
        return got if got is not None else self.decide(keys, room, drain)

    def decide(self, keys: list, room: list[int], drain: bool = False) -> Budgets:
        """plan's decision where plan_lean gave none (its caller asked it first)."""
        self.steps += 1
        due = not drain and self._explore_due(room)   # (draining, a lesson comes too late)
        # (in a lean stretch only an exploring step due, and paid for, searches; and none
        # after the run's first drafting step if that one got too few: module docstring)
        if self.steps < self.lean_until and not due or self.wait_first and self.unlearnt \
                and not self.timed_steps and not self.hit \
                or self._untimed_host(drain, len(keys)):
            self.last_bare = self.steps
            return self._lean_budgets(len(keys))
        c = self.cost
        c.draining = drain
        got = self._ready(keys, room, due, drain)
        if got is not None:
            return got
        caps = self._caps(room)
        nxt, self._next = self._next, None
        same = nxt is not None and nxt.order == tuple(keys)
        if self._serves(nxt, self.steps, keys, drain):
            if not same:   # (its gains are rows of the prefetched sequences; probes, their b)
                self._refit(nxt, keys, drain)
            gains, probes = nxt.gains, nxt.probes
            ks = [min(int(cap), nxt.ks.get(k, nxt.fill)) for k, cap in zip(keys, caps)]
        else:
            probes, gains, ks = self._search(keys, caps, room, drain)
        if any(ks):
            self.idle = 0
        else:   # nothing pays: lean steps until the next search, backing off
            self.idle = min(2 * self.idle, LEAN_MAX) if self.idle else 1
            self.lean_until = self.steps + self.idle
        explored, contrast, base = 0, False, None
        since = self.steps - self.last_explore
        if due:
            wide = np.minimum(caps, np.asarray(ks) + self.explore_budget).tolist()
            ms = c.step_ms(ks, probes)
            extra = c.step_ms(wide, probes) - ms
            if extra <= self.explore_cost * since * ms:
                explored = sum(w > k for w, k in zip(wide, ks))
                base, ks, self.last_explore = tuple(ks), wide, self.steps
                self.next_try = 0
            else:   # the step at which its price is paid for (lean steps end for it then)
                self.next_try = self.last_explore + math.ceil(extra / (self.explore_cost * ms))
        if not any(ks):
            self.last_bare = self.steps
            return self._lean_budgets(len(keys))
        self.unlearnt += 1
        return Budgets(tuple(ks), probes, gains, c.step_ms(ks, probes), explored, contrast,
                       stops=not self.tree and self.last_explore != self.steps and any(ks),
                       base=base)

    def _untimed_host(self, drain: bool, b: int) -> bool:
        """Whether the drafter runs draft forwards, or a batch of more than one drains, and
        no step has been timed yet: the run's first steps are lean until one is (module
        docstring), so that its first drafting step is priced with its host work
        (StepCost.untimed_host; nothing where the host's share was not timed, as under
        sampling, whose verify works on the device). A drain of one sequence does not wait:
        every token a drafting step gains is on its critical path, its first drafting step's
        host was 2.7 lean steps on the host-charged clock, and waiting cost Self-Draft 2
        steps of 20 there (2.26 -> 2.14x `ar`) where the price changed no decision."""
        return self.wait_first and (bool(self.cost.draft_frac) or drain and b > 1) \
            and self.correct and not self.timed_steps and self.guard.ar_log is None

    def _caps(self, room) -> np.ndarray:
        """Each sequence's largest budget: its room, at most K."""
        return np.maximum(np.minimum(np.asarray(room, dtype=np.int64), self.K), 0)

    def _search(self, keys: list, caps: np.ndarray, room,
                drain: bool) -> tuple[bool, np.ndarray, list[int]]:
        """(probes, gains, budgets) of the best step for these sequences (policy.search)."""
        c = self.cost
        c.draining = drain
        probes = policy.probes_pay(c, len(keys), self.probe_share)
        # (draining, the slowest's gains: the stop rule and the expected tokens read them too,
        # so a drain's predicted tokens are its critical path's, not the batch's mean)
        gains = self.acc.gains_many(keys, slowest=len(keys) if drain else 1)
        self.searches += 1
        return probes, gains, policy.search(gains, caps, c, probes,
                                            np.asarray(room) + 1 if drain else None)

    def prefetch(self, keys: list, room, drain: bool = False) -> None:
        """The next step's search, made while this step's forward runs (on CUDA the host
        waits for it anyway: the step's verify reads its argmax), so the step loop does not
        wait for the search. Over these sequences with room less this step's one sure token,
        from the acceptance known now (a step behind, the price of running early). decide
        takes it at the next step if that step searches with the same drain flag: each
        sequence's budget capped by its room then; a sequence admitted since gets the level
        where the search gives every sequence one (StepCost.by_top: policy._search_levels),
        else 0. Skipped where the next step will not search (a lean stretch, the guard).
        room: a callable giving it (not worked out where nothing is searched)."""
        self._next = None
        if not self.searches_next(drain):
            return
        s, room = self.steps + 1, [max(0, r - 1) for r in room()]
        due = self._explore_due(room, s)
        if s < self.lean_until and not due:
            return   # (decide would not search: as its own lean-stretch test; a drain never
                     # gets here in a lean stretch, _may_search)
        explores = not drain and due
        caps = self._caps(room)
        kept = self._kept(keys, drain, s)
        if kept is not None:   # (its budgets, each capped by the room now, decide's way)
            self.cost.draining = drain   # (as _search sets it: the step's price below)
            probes, gains = kept.probes, kept.gains
            ks = [min(int(c), k) for c, k in zip(caps, kept.ks)]
        else:
            probes, gains, ks = self._search(keys, caps, room, drain)
            self._last = Searched(tuple(keys), drain, s, self._learnt(keys), probes, gains, ks)
        fill = max(ks, default=0) if self.cost.by_top else 0
        self._next = Prefetched(s, drain, tuple(keys), dict(zip(keys, ks)), fill, gains, probes,
                                explores)
        # the prices decide will read, worked out now (StepCost keeps each step shape's: a new
        # one costs ~0.1 ms at b64): its step's, and an exploring step's widened one; and
        # decide's answer itself where nothing changes by then (_ready)
        ms = self.cost.step_ms(ks, probes)
        if any(ks) and not explores:
            self._next.ready = Budgets(tuple(ks), probes, gains, ms,
                                       stops=not self.tree and any(ks))
        if explores:
            self.cost.step_ms(np.minimum(caps, np.asarray(ks) + self.explore_budget).tolist(),
                              probes)

    def _kept(self, keys: list, drain: bool, s: int) -> Searched | None:
        """prefetch's last search where its budgets still serve step s: made for these
        sequences in this order and this drain flag at most KEEP_STEPS steps before, with at
        most KEEP_NEW of what is known of these sequences' acceptance learnt since, and some
        budget above 0 (a search that gave none backs off as it did: decide's lean
        stretches). Its step prices move too as steps are timed (StepCost's drift), a step's
        worth of them at a time: kept, the decision lags them by up to KEEP_STEPS. Searching
        at every step cost ~0.3 ms of CPU under each forward at batch 32-64 on the
        host-charged clock, which with the last step's learning ran past a GPU's forward
        there (x3 this CPU's host: ~1 ms of CPU a step at b32, the H200's step ~2.1 ms,
        bench-results/2026-12-04-sim-grid-kernel);
        a decision kept for a few steps, with its sequences' estimates near enough the same,
        is the decision the search gives (a sequence's own stretch of text it knows moves its
        budget a few steps later). Else None: search."""
        last = self._last
        if last is None or s - last.step > KEEP_STEPS or last.drain != drain or \
                last.order != tuple(keys) or not any(last.ks):
            return None
        if not last.learnt or self._learnt(keys) - last.learnt > KEEP_NEW * last.learnt:
            return None
        return last

    def _learnt(self, keys: list) -> float:
        """The verified steps learnt of these sequences, all told (_kept's evidence)."""
        acc = self.acc
        rows = acc.rows
        return float(acc.steps[[rows.get(k, 0) for k in keys]].sum())

    def _ready(self, keys: list, room: list[int], due: bool, drain: bool) -> Budgets | None:
        """decide's answer made by the prefetch under the last forward (Prefetched.ready), where
        it is the one decide would work out: made for this step, its drain flag and these
        sequences in this order, no exploring step due, and every budget within its room (else
        None: decide works it out). What it saves on the step's path is decide's caps, budgets
        and step price, ~0.1 ms of CPU at batch 8 on the host-charged clock in a run (x3 on
        the GPU's host); nothing is learnt between a prefetch and the decide it serves (the
        step's learning waits for the next forward)."""
        nxt = self._next
        if nxt is None or nxt.ready is None or due or nxt.step != self.steps or \
                nxt.drain != drain or nxt.order != tuple(keys):
            return None
        ks = nxt.ready.ks
        for k, r in zip(ks, room):   # (a budget past its room: capped, decide's way)
            if k > r:
                return None
        self._next, self.idle = None, 0
        self.unlearnt += 1
        return nxt.ready

    @staticmethod
    def _serves(nxt: Prefetched | None, step: int, keys: list, drain: bool) -> bool:
        """Whether a prefetched search serves step `step` over these sequences: made for that
        step and drain flag; a drain's, for the same sequences or some of them, as they end
        (its budgets are the critical path of those, near enough for the rest for one step,
        where a search of its own costs a step a third of its time at b8)."""
        return nxt is not None and (nxt.step, nxt.drain) == (step, drain) and \
            (not drain or nxt.order == tuple(keys) or all(k in nxt.ks for k in keys))

    def prefetch_missing(self, keys: list, room, drain: bool) -> None:
        """What decide would work out on the step's critical path for the next step over
        these sequences, done now (under a prefill's forward): the search, unless the one
        prefetched serves it (_serves: the run's first, one whose step became a drain as the
        last waiting request was admitted); else, where sequences were admitted since, their
        gains and whether probes pay (~0.1 ms at b64), as decide computes them."""
        nxt = self._next
        if self._untimed_host(drain, len(keys)):   # (decide gives the next step a lean step
            return   # without searching, and nothing is learnt between a prefill and it:
            # draft-verify and Kangaroo made this search, ~0.25 ms of CPU at batch 64, under a
            # run's first prefill, where a launch-bound eager forward hides little)
        if not self._serves(nxt, self.steps + 1, keys, drain):
            self.prefetch(keys, room, drain)
        elif nxt.order != tuple(keys):   # (nothing is learnt between now and decide)
            self._refit(nxt, keys, drain)

    def _refit(self, nxt: Prefetched, keys: list, drain: bool) -> None:
        """A prefetched search made over other sequences, for these: their gains and whether
        probes pay at their batch size (its budgets stay, and its level for a newcomer)."""
        nxt.gains = self.acc.gains_many(keys, slowest=len(keys) if drain else 1)
        nxt.probes = policy.probes_pay(self.cost, len(keys), self.probe_share)
        nxt.order, nxt.ready = tuple(keys), None   # (ready: the other sequences')

    def searches_next(self, drain: bool) -> bool:
        """Whether the next step may search (prefetch's first test: a lean step's cheap)."""
        return not self.guard.hold and bool(self.K) and self._may_search(self.steps + 1, drain)

    @property
    def drafts_next(self) -> bool:
        """Whether the search prefetched for the next step (prefetch) gives any sequence a
        budget, or that step explores: the drafter may then catch up on what lean steps left
        it (Runner._prefetch) under this step's forward, not on the drafting step's path."""
        nxt = self._next
        return nxt is not None and nxt.step == self.steps + 1 and \
            (nxt.explores or nxt.fill > 0 or any(k > 0 for k in nxt.ks.values()))

    def lean_batch(self) -> int:
        """How many lean steps of one batch size the runner may learn as one, by their mean
        time (learning costs ~3 us, a tenth of a lean step's host work on a small model);
        one until the guard has `ar`'s step to judge drafting steps by."""
        return LEAN_LEARN if self.guard.ar_log is not None else 1

    def lean_done(self, b: int, ms: float | None, steps: int = 1,
                  host: float | None = None, hosted: int = 0) -> float:
        """`steps` lean steps of b sequences took ms each on average (None: not to be learnt,
        a graph was captured in it): learnt as the price of a step without drafts and as the
        guard's `ar` step. Returns what `ar` takes for them: their measured ms, else the
        estimate."""
        if ms is None:
            return self.ar_ms(b) * steps
        if self.correct:
            self.cost.learn_counts((b,), ms, False)   # (learn's [0] * b, in O(1))
            if host is not None:   # (the mean host time of `hosted` of them: the baseline
                self.cost.learn_host(b, host, 0, hosted)   # of drafting's, host_fit)
        self.guard.lean(self.cost.ar_table_ms(b), ms, steps)
        return ms * steps

    def drafted(self, b: int, ms: float | None, progress: float) -> float:
        """A drafting step of b sequences took ms all told (observe included; None: not to be
        learnt) and made `progress` (runtime/control/guard.py): the guard's account. Returns
        what `ar` takes for the same progress (the summary's estimate)."""
        ar = self.ar_ms(b)   # (before a lean step is timed: the table's, corrected)
        if ms is not None:
            self.guard.drafted(ms, progress * ar)
        return progress * ar

    def stop_rule(self, b: Budgets) -> policy.StopRule | None:
        """The confidence stop of this step's chains (policy.stop_rule), or None when there is
        nothing to decide (trees, an exploring step, every budget 0)."""
        if not b.stops:
            return None
        acc = self.acc
        return policy.stop_rule(b.gains, b.ks, self.cost, b.probes,
                                lambda conf: acc.calibrated(conf) / acc.pool_mean())

    def spent(self, b: Budgets, proposals) -> list[int]:
        """The budgets as the drafter spent them: cut where a chain stopped on confidence."""
        return [k if p.stopped_at is None else min(k, p.stopped_at)
                for k, p in zip(b.ks, proposals)]

    def observe(self, keys: list, b: Budgets, proposals, verdicts,
                measured_ms: float | None, host_ms: float | None = None) -> tuple[float, float]:
        """Learn from a verified step: each sequence's acceptance (a chain against its budget
        as spent, since a draft forward whose token the drafter's own exit dropped was paid
        for and added nothing; a tree against its budget, the nodes its drafter did not find
        counted as tried: acceptance.py), and the step's measured
        ms (all of it: planning, drafting, verify, bookkeeping), host_ms of it the host's own
        (StepCost.learn_host; None: not known). Returns (the step's table ms as run, the
        tokens it was expected to emit)."""
        # (a grid step's proposals and verdicts give their sizes and accepted nodes whole,
        # runtime/step/grid.py: a tree's drafts, none stopped, probed nor forwarded; made
        # one a sequence, as below, they cost ~0.4 ms of its learning at batch 64)
        sizes = getattr(proposals, "sizes", None)
        ks = list(b.ks) if sizes is not None else self.spent(b, proposals)
        accepted = getattr(verdicts, "accepted", None)
        if accepted is None:
            accepted = [v.accepted for v in verdicts]
        self.unlearnt = max(0, self.unlearnt - 1)
        if any(accepted):   # drafting may pay now: search the next step
            self.lean_until = 0   # (backing off as before if it still does not)
        self.timed_steps += measured_ms is not None
        tried = sizes if sizes is not None else \
            [len(p.draft) if self.tree else max(len(p.draft), k if p.forwards else 0)
             for k, p in zip(ks, proposals)]
        allowed = [max(t, k) for t, k in zip(tried, ks)] if self.tree else tried
        self.acc.learn_many(keys, allowed, accepted,
                            None if self.tree else [p.conf for p in proposals])
        if b.base is not None:   # an exploring step: did its extra drafts bring anything?
            found = any(len(a) > k for a, k in zip(accepted, b.base))
            self.period = self.explore_every if found else \
                min(2 * self.period, EXPLORE_BACKOFF * self.explore_every)
        # (priced as it ran: a sequence whose drafter found nothing ran ar's rows, its probe's
        # if it had one, but its proposal's host work was spent: the sequences with a budget)
        ran = tried if sizes is not None else \
            [max(t, 1) if len(p.probe) else t for t, p in zip(tried, proposals)]
        if self.correct and measured_ms is not None:
            extra = 0.0 if host_ms is None else \
                self.cost.learn_host(len(ks), host_ms, sum(k > 0 for k in ks))
            table = self.cost.learn(ran, measured_ms, b.probes, extra)
        else:
            table = self.cost.table_ms(ran, b.probes)[0]
        return table, float(b.gains[np.arange(len(ks)), ks].sum())

    def verified(self, b: Budgets, verdicts) -> None:
        """A drafting step's verdicts, before it is learnt (observe: maybe a step later):
        whether it got at least half the drafts it was expected to (its gains)."""
        if not self.timed_steps:
            want = b.gains[np.arange(len(b.ks)), b.ks].sum() - b.gains[:, 0].sum()
            self.hit = sum(len(v.accepted) for v in verdicts) >= 0.5 * want

    def ar_ms(self, b: int) -> float:
        """ms of an `ar` step of b sequences: as this run's lean steps measure it, else the
        table's corrected price (the gain estimate, metrics.py)."""
        got = self.guard.ar_ms(self.cost.ar_table_ms(b))
        return got if got is not None else self.cost.ar_ms(b)

    def forget(self, key) -> None:
        """A sequence left its slot: nothing learnt or prefetched for it stays (a request
        admitted into the slot is another sequence)."""
        self.acc.forget(key)
        if self._last is not None and key in self._last.order:
            self._last = None   # (the slot's next sequence is another: search for it)
        if self._next is not None and key in self._next.ks:
            del self._next.ks[key]
            self._next.order = self._next.ready = None

    def warm(self, slots: int) -> None:
        """Search once for the batch sizes a run meets most (`slots` and the 15 below it, the
        powers of two under them), waiting and draining, on a copy that shares only the step
        costs: their per-batch-size tables are made now, before a run, not in its first
        search at each size (~0.2-1.5 ms of CPU at batch 64 on a critical path a GPU's step
        is ~2 ms long: a search that is not prefetched, the run's first, waits for them).
        ~10 ms at 64 slots, 50-85 at 1024 (every size up to 1024 took 1-2.6 s). Nothing
        is learnt."""
        if not self.K:
            return
        sizes = set(range(max(1, slots - 15), slots + 1))
        sizes |= {1 << i for i in range(slots.bit_length()) if 1 << i < slots}
        ghost = copy.copy(self)   # (its own acceptance and counts: what _search touches)
        ghost.acc = copy.deepcopy(self.acc)
        for b in sorted(sizes, reverse=True):   # (the largest first: smaller ones reuse it)
            self.cost.ar_table_ms(b)   # (the guard's and the accounting's `ar` price)
            for drain in (False, True):
                ghost._search(list(range(-b, 0)), self._caps([self.K] * b), [self.K] * b, drain)

    def new_run(self) -> None:
        """A runner's run starts: a search prefetched at the end of the last one is not its."""
        self._next, self._last, self.unlearnt, self.hit = None, None, 0, False


def make_controller(drafter, model, batch_size: int, table: StepTable | None = None, *,
                    store=None, fingerprint: str | None = None, log=lambda msg: None,
                    kv=None, **kw) -> Controller:
    """The controller of a run of `batch_size` slots; its step-cost table `table`, or else
    step_table_for's (kept in `store` when given with the model's fingerprint), measured on
    the run's cache kv where it can be (Runner.set_controller)."""
    t0 = time.perf_counter()
    table = table or step_table_for(model, batch_size, store=store, fingerprint=fingerprint,
                                    log=log, kv=kv)
    price = drafter.price()
    ctl = Controller(cost_for(drafter, model, table), price.max_draft, tree=price.tree, **kw)
    ctl.profile_s = time.perf_counter() - t0
    return ctl
