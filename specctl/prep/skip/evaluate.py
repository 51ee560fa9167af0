"""Scoring a skip set on the dev set, and the cost model every objective of `search-skip`
prices with.

`run_cost` turns one sequence's draft-verify counts (tokens drafted per step, draft forwards)
into modelled seconds on a step-cost table, as stepcost.cost_for prices draft-verify at batch 1;
`ar_per_token` is ar's price on the same table. `DevSet` is the `decode` and `wall` objectives:
the dev prompts prefilled once, each evaluation decoding `max_new` greedy tokens per prompt with
a skip set (counted and priced by `run_cost`, or clocked at batch 1), returning a `DevEval`.
prep/skip/tf_probe.py (the `model` objective) returns the same `DevEval`, priced by the same
`run_cost`.

Knows nothing of the search: which sets are probed, in what order, how probes are logged or
resumed (prep/skip/search.py), or the GP that suggests them (prep/skip/bit_gp.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specctl.engine.steptable import StepTable
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request, Sequence
from specctl.speculative.draft_verify import (ExitParams, LayerSkipDrafter, SkipSet,
                                              skip_draft_frac)
from specctl.speculative.sampling import SamplingParams

EARLY_STOP_RATIO = 1.25    # stop a probe once it costs this much more per token than the best
EARLY_STOP_AFTER = 0.25    # ... after this share of the dev tokens


def run_cost(table: StepTable, draft_lengths: list[int], draft_forwards: int,
             draft_frac: float) -> float:
    """Modelled seconds of one sequence's decoding from its counts, priced at batch 1 as
    stepcost.cost_for prices draft-verify: a step that drafted d tokens verifies d + 1
    (table.ms(1, d + 1)), a draft forward costs draft_frac * table.ms(1, 1) (skip_draft_frac).
    Two runs with the same counts cost the same: the clock is read once, for the table."""
    ms = sum(table.ms(1, d + 1) for d in draft_lengths) + \
        draft_forwards * draft_frac * table.ms(1, 1)
    return ms / 1e3


def ar_per_token(table: StepTable) -> float:
    """ar's seconds per token on the same table: one 1-token step each."""
    return table.ms(1, 1) / 1e3


@dataclass
class DevEval:
    tokens: int
    drafted: int
    accepted: int
    steps: int
    cost: float               # modelled (model) or measured (wall) seconds
    early_stopped: bool = False
    per_seq: list[dict] = field(default_factory=list)

    @property
    def per_token(self) -> float:
        return self.cost / max(self.tokens, 1)

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


class DevSet:
    """Dev prompts prefilled once; each evaluation decodes `max_new` greedy tokens per prompt
    from that cache with a given skip set."""

    def __init__(self, model, prompts: list[list[int]], max_new: int = 32, K: int = 12):
        self.model, self.prompts, self.max_new = model, prompts, max_new
        self.params = ExitParams(K=K)
        n = len(prompts)
        max_len = max(len(p) for p in prompts) + max_new + K + 2
        self.runner = Runner(model, LayerSkipDrafter(model, SkipSet(model.cfg.num_layers),
                                                     SamplingParams()),
                             SamplingParams(), batch_size=n, max_len=max_len, eos_ids=set(),
                             render=lambda r: prompts[r.index], decode=lambda ids: "")
        self.first = []
        for i in range(n):   # prefill one by one: the rows are the full model's, kept forever
            seq = Sequence(Request(i, [[]], max_new), prompts[i], i)
            self.runner._prefill([seq])
            self.first.append(seq.out_ids[0])

    def _sequences(self) -> list[Sequence]:
        seqs = []
        for i, p in enumerate(self.prompts):
            s = Sequence(Request(i, [[]], self.max_new), p, i)
            s.prefilled, s.out_ids, s.pending = len(p), [self.first[i]], self.first[i]
            self.runner.kv.lens[i] = len(p)
            seqs.append(s)
        return seqs

    def evaluate(self, skip: SkipSet, table: StepTable | None,
                 best_per_token: float | None = None) -> DevEval:
        """table given: counted, priced by run_cost (batched); None: wall clock, batch 1."""
        drafter = LayerSkipDrafter(self.model, skip, SamplingParams(), self.params)
        self.runner.drafter = drafter
        seqs = self._sequences()
        for s in seqs:
            drafter.admit(s)
        frac = skip_draft_frac(self.model, skip)
        total = len(seqs) * self.max_new
        early = False
        t0 = time.perf_counter()
        if table is None:
            for s in seqs:
                while not s.finished:
                    self.runner.step([s])
        else:
            live = seqs
            while live:
                self.runner.step(live)
                live = [s for s in live if not s.finished]
                done = sum(len(s.out_ids) for s in seqs)
                if best_per_token and live and done >= EARLY_STOP_AFTER * total:
                    cost = sum(run_cost(table, s.req.draft_lengths,
                                        s.state.draft_forwards, frac) for s in seqs)
                    # the first token of each sequence came from prefill: not priced, not counted
                    if cost / (done - len(seqs)) > EARLY_STOP_RATIO * best_per_token:
                        early = True
                        break
        wall = time.perf_counter() - t0
        per_seq = [{"tokens": len(s.out_ids) - 1, "draft_lengths": s.req.draft_lengths,
                    "accept_lengths": s.req.accept_lengths,
                    "draft_forwards": s.state.draft_forwards} for s in seqs]
        tokens = sum(p["tokens"] for p in per_seq)
        cost = wall if table is None else sum(
            run_cost(table, p["draft_lengths"], p["draft_forwards"], frac) for p in per_seq)
        return DevEval(tokens, sum(sum(p["draft_lengths"]) for p in per_seq),
                       sum(sum(p["accept_lengths"]) for p in per_seq),
                       sum(len(p["draft_lengths"]) for p in per_seq), cost, early, per_seq)

    def ar_per_token(self, table: StepTable | None) -> float:
        """The AR baseline of the same objective: priced (ar_per_token) or, wall, measured."""
        if table is not None:
            return ar_per_token(table)
        # ar through the same runner: a drafter that never drafts (K drafts of 0 tokens)
        from specctl.speculative.drafter import NoDraft
        self.runner.drafter = NoDraft()
        seqs = self._sequences()
        t0 = time.perf_counter()
        for s in seqs:
            while not s.finished:
                self.runner.step([s])
        return (time.perf_counter() - t0) / sum(len(s.out_ids) - 1 for s in seqs)
