"""One decoding step as stages with typed hand-overs (nano-vllm's schedule -> run ->
postprocess, with speculation):

    plan = planner.plan(seqs)             # budgets (the controller) + proposals -> StepPlan
    h = planner.execute(plan)             # the target's one forward over the packed batch
    out = verify(plan, h, ...)            # StepOutcome: verdicts and probe outputs
    ... the runner commits (KV rows, tokens) and the drafter and controller learn ...

A StepPlan is frozen: nothing edits a proposal after the drafter made it, so what was
proposed is what is verified and what is learnt from.

Each sequence's share of the forward is [pending, draft nodes, probe nodes]: a node sits at the
root's position + its depth and sees the committed prefix, the root and its own ancestors
only (speculative/verify.py's worked example). The rows of sequence b in the forward's output
are cu[b] .. cu[b + 1]: the first 1 + len(draft) are verified, the probe's after them are read
for their argmax only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.runtime.control.controller import Budgets, Controller
from specctl.runtime.step.grid import GridDrafts, GridProposals, GridStep, GridVerdicts
from specctl.runtime.step.sequence import Sequence
from specctl.speculative.drafter import Drafter, DraftLimits, Proposal
from specctl.speculative.sampling import SamplingParams, warp
from specctl.speculative.verify import RowVerdicts, Verdict, verify_greedy, verify_sampling_batch


@dataclass(frozen=True)
class StepPlan:
    seqs: tuple[Sequence, ...]
    budgets: Budgets | None          # the controller's decision (None: --speculate fixed)
    proposals: tuple[Proposal, ...]
    batch: ForwardBatch              # [pending + draft + probe] of every sequence, packed
    verified: tuple[int, ...]        # rows verified per sequence: 1 + its draft nodes
    probed: tuple[int, ...]          # probe rows after them
    search_ms: float = 0.0           # the controller's search (Controller.decide), if it ran
    lean: bool = False               # `ar`'s step: every proposal the drafter's idle one
    apart_ms: float = 0.0            # planning that is not drafting's host work (Planner.plan)
    grid: GridDrafts | None = None   # a grid step's drafts (runtime/step/grid.py): then
                                     # `proposals` are made from them where they are read

    @property
    def confidence_stops(self) -> int:
        if self.grid is not None:   # (a grid's chains never stop on confidence)
            return 0
        return sum(p.stopped_at is not None for p in self.proposals)


@dataclass(frozen=True)
class StepOutcome:
    # (each sequence's, in order: read by iterating, indexing or len, never as a tuple; an ar
    # step's RowVerdicts and a grid step's GridVerdicts make each where it is asked for)
    verdicts: tuple[Verdict, ...] | RowVerdicts | GridVerdicts
    probe_out: tuple[list[int] | None, ...]   # the target's argmax after each probe node


def seq_input(s: Sequence, p: Proposal, base: int) -> SeqInput:
    """Sequence s's share of the step forward, its cache `base` rows deep."""
    nodes = p.draft.extend(p.probe) if len(p.probe) else p.draft
    if nodes.is_chain:
        return SeqInput(s.slot, [s.pending] + nodes.tokens, base)
    # (positions and mask: the batch's, for every tree at once)
    return SeqInput(s.slot, [s.pending] + nodes.tokens, base, parents=nodes.parents)


class Planner:
    """Budgets and proposals of a step over the running sequences, and its forward."""

    def __init__(self, model, drafter: Drafter, kv, max_len: int,
                 controller: Controller | None = None):
        self.model, self.drafter, self.kv, self.max_len = model, drafter, kv, max_len
        self.controller = controller
        self.grid: GridStep | None = None   # (a run's, where it drafts on a grid: Runner.run)
        self.lean_forward: tuple | None = None   # (where the drafter verifies its own way:
        # Drafter.lean_forward, at a run's first lean step; a new run or drafter asks anew,
        # Runner.run and Runner.drafter, as a head kept for another cache is made anew)

    def plan(self, seqs: list[Sequence], drain: bool = False, clock=None) -> StepPlan:
        """drain: no request waits (the controller then prices the job's critical path);
        clock: the runner's, to time the controller's search (StepPlan.search_ms)."""
        ctl = self.controller
        if not self.drafter.drafts:   # (`ar`: its every step a lean one)
            return self._lean(seqs, None)
        if ctl is not None:
            budgets = ctl.plan_lean(len(seqs), drain)
            if budgets is not None:   # ar's step: no room, limits nor checks to work out
                return self._lean(seqs, budgets)
        kv, now = self.kv, clock or _no_clock
        room = self._room(seqs)
        budgets, search_ms = None, 0.0
        if ctl is not None:
            t = now()
            budgets = ctl.decide([s.slot for s in seqs], room, drain)   # (plan_lean gave none)
            search_ms = (now() - t) * 1e3
            if budgets.lean:
                return self._lean(seqs, budgets, search_ms)
        if self.grid is not None:
            return self._grid(seqs, budgets, room, search_ms, now)
        if budgets is not None:
            room = [min(r, k) for r, k in zip(room, budgets.ks)]
        # for draft and probe nodes: the rows reserved past the sequence's (a drafter past
        # them is an error here, not a write into a block nobody reserved)
        rows = [kv.reserved(s.slot) - kv.lens[s.slot] - 1 for s in seqs]
        limits = DraftLimits(tuple(room), tuple(rows),
                             probes=budgets.probes if budgets is not None else True,
                             stop=ctl.stop_rule(budgets) if budgets is not None else None)
        # (apart_ms: the drafter's catch-up learning, and its proposals where they run draft
        # forwards, which the step table prices: not host work a drafting sequence adds)
        t = now()
        if any(room):
            self.drafter.catch_up(seqs)
        caught = now()
        props = self.drafter.propose(seqs, kv, limits)
        forwards = ctl is not None and ctl.cost.draft_frac > 0
        apart_ms = ((now() if forwards else caught) - t) * 1e3
        for p, r, n in zip(props, room, rows):
            if len(p.draft) > r or len(p.draft) + len(p.probe) > n:
                raise RuntimeError(f"{self.drafter.name}: a proposal past its limits "
                                   f"({len(p.draft)} + {len(p.probe)} nodes, room {r}, rows {n})")
        return self._planned(seqs, budgets, props, search_ms, apart_ms)

    def _grid(self, seqs: list[Sequence], budgets: Budgets | None, room: list[int],
              search_ms: float, now) -> StepPlan:
        """A grid step's plan: the drafts of every sequence at once (GridStep.plan), within
        its room and budget (the drafter's catch-up learning first, timed apart as in plan)."""
        t = now()
        if any(room):
            self.drafter.catch_up(seqs)
        apart_ms = (now() - t) * 1e3
        lens = self.kv.lens
        job = self.grid.job
        batch, drafts = self.grid.plan([s.slot for s in seqs], [lens[s.slot] for s in seqs],
                                       [s.pending for s in seqs], room,
                                       None if budgets is None else list(budgets.ks),
                                       self.kv, self.model.device,
                                       None if job is None else job.tails(seqs))
        return StepPlan(tuple(seqs), budgets, GridProposals(drafts), batch, (), (), search_ms,
                        apart_ms=apart_ms, grid=drafts)

    def _room(self, seqs: list[Sequence]) -> list[int]:
        """The drafts each sequence may accept: with the bonus token after them, a step emits
        at most room + 1 tokens, so neither the token budget nor the context (prompt and
        answer together at most max_len tokens, where ar stops) is passed."""
        lens, top, room = self.kv.lens, self.max_len - 2, []
        add = room.append
        for s in seqs:   # (comparisons, not min and max: 12 -> 4 us at batch 64 warm, on
            # every drafting step's plan)
            r, t = top - lens[s.slot], s.req.max_tokens - len(s.out_ids) - 1
            r = r if r < t else t
            add(r if r > 0 else 0)
        return room

    @property
    def overlaps(self) -> bool:
        """Whether the host goes on while a step's forward computes: on CUDA, where a
        controller's steps replay captured graphs (it prices them padded: a simulated clock's
        too), or with no controller. On a CPU the forward has finished when it returns."""
        ctl = self.controller
        return ctl.cost.padded if ctl is not None else self.model.device.type == "cuda"

    def prefetch(self, seqs: list[Sequence], drain: bool, clock=None,
                 missing: bool = False) -> float:
        """The controller's search for the next step, run while this step's forward does
        (Controller.prefetch); returns its ms on `clock`. Only where steps replay captured
        graphs (CUDA: the forward is asynchronous): on a CPU the forward has finished by now,
        so there is nothing to hide the search behind, and it would read acceptance a step
        older for nothing."""
        ctl = self.controller
        if ctl is None or not self.overlaps or not ctl.searches_next(drain):
            return 0.0
        now = clock or _no_clock
        t = now()
        fetch = ctl.prefetch_missing if missing else ctl.prefetch
        fetch([s.slot for s in seqs], lambda: self._room(seqs), drain)
        return (now() - t) * 1e3

    def _lean(self, seqs: list[Sequence], budgets: Budgets | None,
              search_ms: float = 0.0) -> StepPlan:
        """`ar`'s step: the drafter's idle proposals (one shared empty one; a lean step's
        cost is not to grow with the batch beyond ar's), a row a sequence."""
        return self._decode(seqs, budgets, self.drafter.idle(seqs, self.kv), search_ms,
                            lean=True)

    def _decode(self, seqs: list[Sequence], budgets: Budgets | None, props: list[Proposal],
                search_ms: float, apart_ms: float = 0.0, lean: bool = False) -> StepPlan:
        """A step of a row a sequence (every proposal empty): ar's batch, from the lists
        directly."""
        n, lens = len(seqs), self.kv.lens
        batch = ForwardBatch.decode([s.slot for s in seqs], [s.pending for s in seqs],
                                    [lens[s.slot] for s in seqs], self.model.device)
        return StepPlan(tuple(seqs), budgets, tuple(props), batch, (1,) * n, (0,) * n,
                        search_ms, lean, apart_ms)

    def _planned(self, seqs: list[Sequence], budgets: Budgets | None,
                 props: list[Proposal], search_ms: float = 0.0,
                 apart_ms: float = 0.0) -> StepPlan:
        lens, p0 = self.kv.lens, props[0]
        if not len(p0.draft) and not len(p0.probe) and all(p is p0 for p in props):
            return self._decode(seqs, budgets, props, search_ms, apart_ms)   # (nothing drafted)
        inputs = [seq_input(s, p, lens[s.slot]) for s, p in zip(seqs, props)]
        return StepPlan(tuple(seqs), budgets, tuple(props),
                        ForwardBatch(inputs, self.model.device),
                        tuple(1 + len(p.draft) for p in props), tuple(len(p.probe) for p in props),
                        search_ms, apart_ms=apart_ms)

    def execute(self, plan: StepPlan) -> torch.Tensor:
        """The verify forward's last-layer states [T, D]."""
        if self.drafter.custom_verify:
            if plan.lean:   # (the run's lean forward: nothing asked of the drafter again)
                lean = self.lean_forward
                if lean is None:
                    lean = self.lean_forward = self.drafter.lean_forward(self.kv)
                (h,) = self.model.run(plan.batch, self.kv, lean[0], head=lean[1])
                return h
            return self.drafter.verify_hidden(plan.batch, self.kv, plan.seqs,
                                              plan.proposals)   # (read, never kept: no copies)
        return self.model.run(plan.batch, self.kv)


def _no_clock() -> float:   # (Planner.plan without a clock: nothing timed)
    return 0.0


def read(plan: StepPlan, h: torch.Tensor, model, sp: SamplingParams) -> list[int] | None:
    """The target's argmax of every row of h, where verify needs it (greedy, or probes): the
    step's one read-back, its first wait for the forward on CUDA. None: not needed."""
    return model.argmax(h).tolist() if sp.greedy or any(plan.probed) else None


def verify(plan: StepPlan, h: torch.Tensor, model, sp: SamplingParams,
           uniforms: Callable[[Sequence, int], list[float]],
           target: list[int] | None = None) -> StepOutcome:
    """Every sequence's verdict from the forward's states h [T, D] (one verifier for every
    method: greedy, or lossless sampling), and the argmax after each probe node. uniforms(s,
    n): the uniforms of s's next n output positions (one-hot drafts are verified at them).
    target: read's, if read already."""
    cu, real, probed = plan.batch.cu_seqlens, plan.verified, plan.probed
    props = plan.proposals
    if target is None:
        target = read(plan, h, model, sp)   # one read-back for verification and probes
    if sp.greedy and plan.batch.num_tokens == len(props):   # (an ar step: a row each, no probe)
        return StepOutcome(RowVerdicts(target), (None,) * len(props))
    probe_out = tuple(target[cu[b] + real[b]:cu[b] + real[b] + probed[b]] if probed[b] else None
                      for b in range(len(props)))
    if sp.greedy:   # probe rows (if any) are ignored
        verdicts = [verify_greedy(p.draft, target[cu[b]:cu[b] + real[b]])
                    for b, p in enumerate(props)]
    else:   # fp32 logits of the verified rows only
        vrows = [i for b in range(len(props)) for i in range(cu[b], cu[b] + real[b])]
        starts = [0]
        for n in real[:-1]:
            starts.append(starts[-1] + n)
        verdicts = verify_sampling_batch(
            [p.draft for p in props], warp(model.logits(h[vrows]), sp), starts,
            [s.rng for s in plan.seqs],
            [uniforms(s, 1 + max(p.draft.depths(), default=0)) if p.draft.q is None else None
             for s, p in zip(plan.seqs, props)])   # (q-trees use s.rng)
    return StepOutcome(tuple(verdicts), probe_out)
