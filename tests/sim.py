"""A simulated step clock: the GPU's time on the CPU. Every decoding forward (Model.run) advances
the clock by what a step table says that forward costs on the device the table was measured on
(the committed H100 table: bench-results/2026-11-23-engine-step/steps-demo.json), padded as
captured graphs pad it (engine/graphs.py: batch bucket, tokens per sequence on the grid), and
the runner reads that clock instead of the wall's. So the controller, the lean steps and the
guard decide on the GPU's prices, deterministically, while the tiny model's tokens stay real
(losslessness is still checked).

    clock = SimClock(table, slots=32)
    out, stats = sim_run(model, prompts, drafter, clock, monkeypatch, batch_size=32, ...)
    clock.t   # seconds of device time the run's steps took
"""

from __future__ import annotations

import json
from pathlib import Path

from specctl.engine.batch import FULL
from specctl.engine.graphs import CudaGraphs, grid_n
from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import Controller
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request
from specctl.runtime.control.stepcost import StepCost
from specctl.speculative.drafter import DraftLimits, DraftPrice, Drafter, NoDraft, Proposal
from specctl.speculative.sampling import SamplingParams
from specctl.speculative.verify import DraftTree

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "bench-results/2026-11-23-engine-step/steps-demo.json"


def h100_table() -> StepTable:
    return StepTable.from_json(json.loads(H100.read_text()))


class SimClock:
    """Seconds of simulated device time. dear(plan, n): a factor on a forward's table price
    (a device slower than its table for some forwards). A prefill forward (no table prices
    it: eager on a GPU) costs prefill_ms plus token_us a prompt token (default nothing)."""

    def __init__(self, table: StepTable, slots: int, dear=None, prefill_ms: float = 0.0,
                 token_us: float = 0.0):
        self.table, self.slots, self.dear = table, slots, dear
        self.prefill_ms, self.token_us = prefill_ms, token_us
        self.t = 0.0
        self.price = DraftPrice()
        self.paused = False   # (prefill: its forwards are not what a step table prices)

    def __call__(self) -> float:
        return self.t

    def forward(self, batch, plan) -> None:
        if self.paused:
            self.t += (self.prefill_ms + self.token_us * batch.num_tokens / 1e3) / 1e3
            return
        b, n = len(batch.seqs), grid_n(max(batch.num_new))
        ms = self.table.ms(CudaGraphs.bucket(b, self.slots), n)
        if plan.start > 0:
            ms *= self.price.verify_frac
        elif plan.end is not None or plan.skip_attn or plan.skip_mlp:
            ms *= self.price.draft_frac
        if self.dear is not None:
            ms *= self.dear(plan, n)
        self.t += ms / 1e3

    def sleep(self, s: float) -> None:
        self.t += s


def timed_model(model, clock: SimClock, monkeypatch):
    """model whose decoding forwards advance the clock: Model.run's, and Model.forward's called
    by others (Kangaroo's whole-model step); sim_run pauses it for prefill (a prompt's forward
    is not a decoding step, and methods that finish sequences at other steps prefill the next
    ones in other groups: a real cost, which a step table does not price)."""
    cls, inside = type(model), []

    def run(batch, kv, plan=FULL, hidden=None, head=None):
        clock.forward(batch, plan)
        inside.append(1)
        try:
            return cls.run(model, batch, kv, plan, hidden, head)
        finally:
            inside.pop()

    def forward(batch, kv, plan=FULL, hidden=None):
        if not inside:
            clock.forward(batch, plan)
        return cls.forward(model, batch, kv, plan, hidden)
    monkeypatch.setattr(model, "run", run)
    monkeypatch.setattr(model, "forward", forward)
    return model


def sim_controller(drafter, table: StepTable, **kw) -> Controller:
    """--speculate auto's controller as on CUDA: steps priced padded, on `table`."""
    price = drafter.price()
    return Controller(StepCost.of(table, price, padded=True), price.max_draft,
                      tree=price.tree, **kw)


def sim_run(model, prompts, drafter, clock: SimClock, *, batch_size: int, max_tokens: int,
            controller=None, max_len: int = 320):
    """(outputs in input order, RunStats) of a run on the simulated clock."""
    drafter = drafter or NoDraft()
    clock.price = drafter.price()
    reqs = [Request(i, [[{"role": "user", "content": str(i)}]], max_tokens)
            for i in range(len(prompts))]
    out: dict[int, list[int]] = {}
    runner = Runner(model, drafter, SamplingParams(), batch_size=batch_size, max_len=max_len,
                    eos_ids=set(), render=lambda r: prompts[r.index],
                    decode=lambda ids: " ".join(map(str, ids)), controller=controller,
                    threads=1)
    runner.clock = clock
    prefill = runner._prefill

    def untimed(seqs):
        clock.paused = True
        try:
            prefill(seqs)
        finally:
            clock.paused = False
    runner._prefill = untimed
    stats = runner.run(reqs, lambda r: out.__setitem__(r.index, r.answer_ids[0]))
    return [out[i] for i in range(len(prompts))], stats


class OracleChains(Drafter):
    """Chains that know the answer: each draft is the reference's next token with its
    sequence's probability p[index] (else a wrong token, and the chain's rest with it), so
    acceptance is whatever a test sets, sequence by sequence. Drafting costs no forward.
    period > 0: bursty acceptance, p[index] over `period` output positions, then none over the
    next `period` (text that a drafter knows, then text it does not)."""
    name = "oracle"

    def __init__(self, ref: list[list[int]], p: list[float], K: int = 8, seed: int = 0,
                 period: int = 0):
        import random
        self.ref, self.p, self.K, self.period = ref, p, K, period
        self.rng = random.Random(seed)
        self.step_rows = 1 + K

    def _p(self, index: int, at: int) -> float:
        off = self.period and (at // self.period) % 2
        return 0.0 if off else self.p[index]

    def propose(self, seqs, kv, limits: DraftLimits) -> list[Proposal]:
        out = []
        for s, r in zip(seqs, limits.room):
            want, at = self.ref[s.req.index], len(s.out_ids)
            toks = []
            for j in range(min(max(r, 0), self.K)):
                right = at + j < len(want) and self.rng.random() < self._p(s.req.index, at + j)
                toks.append(want[at + j] if right else (want[min(at + j, len(want) - 1)] + 1) % 7)
            out.append(Proposal(DraftTree.chain(toks), forwards=0, conf=[1.0] * len(toks)))
        return out

    def price(self) -> DraftPrice:
        return DraftPrice(max_draft=self.K)

    def fresh(self) -> "OracleChains":
        return OracleChains(self.ref, self.p, self.K, period=self.period)


def against_ar(model, prompts, drafters: dict, table: StepTable, monkeypatch, *,
               batch_size: int, max_tokens: int, ref=None):
    """ar, then every drafter under auto, on one simulated clock over `table`: (ar's seconds,
    its RunStats, {name: (x ar, RunStats)}); each output is checked against ref (ar's)."""
    clock = SimClock(table, batch_size)
    timed_model(model, clock, monkeypatch)
    out, ar = sim_run(model, prompts, None, clock, batch_size=batch_size, max_tokens=max_tokens)
    ar_s, ref, seen = clock.t, ref or out, {}
    for name, dr in drafters.items():
        clock.t = 0.0
        got, st = sim_run(model, prompts, dr, clock, batch_size=batch_size,
                          max_tokens=max_tokens, controller=sim_controller(dr, table))
        assert got == ref, name
        seen[name] = (ar_s / clock.t, st)
    return ar_s, ar, seen
