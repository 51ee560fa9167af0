"""When waiting requests are admitted into free slots: at once, or a few together.

A prefill forward pays a fixed cost whatever its tokens (on a CPU the weights' read: the demo
model's forward of 8 or 32 tokens takes ~22 ms, of 512 ~290; on a GPU the launches of an eager
forward, where steps replay graphs but prefill does not) on top of its tokens' work. `ar` at a
fixed answer length finishes its sequences together and admits them in one forward;
speculation finishes them at different steps and admits them one by one (a host-inclusive
simulation of the H100 at batch 32 and 64: 60-100 prefill forwards against ar's 5). Holding a
free slot for a step costs the batch 1/B of a step, and with r slots freed a step the first
of g waits (g - 1) / r steps for the last; admitting them together saves g - 1 fixed costs F.
Per admission that is

    (g - 1) / (2 r) * step_ms / B + F / g,   least at   g* = sqrt(2 F B r / step_ms),

so with F = 5 ms, a 3 ms step, B = 32 and a slot freed every other step, g* ~ 7; where F is
small against a step (a CPU prefilling long prompts) g* = 1: admit at once. F and the cost of a
token are fit by least squares over the run's recent prefills (ms = F x forwards + s x tokens);
step_ms and r are the means of the recent steps. Until all are known (2 prefills of sizes far
enough apart to tell F from a token's cost: a run's first, of a batch of prompts, and the
next, of the first few to end, mostly are), g = 1. (Waiting for 4 admitted the run's first
~3 early ends one prefill forward each; with 2, `ar` on the tests' host-charged clock took 5
prefill forwards where it took 8 at batch 8 and 7 at 32-64 with requests waiting, 3-5% of its
time: bench-results/2026-11-30-clumps.)

Known ends: a sequence's token budget (and the context) bounds the steps it has left, so where a
running sequence must end within w steps, holding the f free slots until then costs at most
f w step_ms / B, and admitting now would pay a second forward's F when it ends: hold while
f w step_ms / B < F, the next prompt fits the same prefill forward, and at least a batch waits
beyond the free slots. Near the job's end a held request is on its critical path: delaying
it w steps delays the job w steps, not f w / B (Self-Draft at batch 8 on the tests' clock,
32 requests, took 103-111 steps against 89-91 priced so), so there it holds while w step_ms
< F and more wait than are free (a later prefill forward is saved only then): admitting at
once there, Self-Draft at batch 32 took its last 57 requests in 4 prefill forwards where
`ar`, its ends a clump, took 1. `ar` at a fixed
answer length admits whole clumps of sequences that end together; a few accepted drafts end
them a few steps apart, and admitting each as it ends made 12-14 prefill forwards where `ar`
made 11 and a run that never drafted, grouping, 8 (the demo model at batch 8, 32 prompts of
96 tokens, the H200's prefill table: ~9 ms a forward, 3 of its steps). Where answers end by
EOS, far from their budgets, the rule holds nothing.

The runner asks for a group under --speculate auto (the default), `ar`'s run too: a run that
admits as slots free pays a prefill forward for nearly every answer that ends on its own step
(by EOS), and on the H200's demo-shape tables, with the host charged, grouping alone made `ar`
1.04x / 1.30x / 1.41x faster at batch 8 / 32 / 64 with requests waiting: all the gain that
speculation under a controller showed there over an ungrouped `ar`
(bench-results/2026-11-29-ar-grouped). A grouped run's schedule follows its timings; under
--speculate fixed the runner admits at once, so the schedule is a function of the inputs alone
and a bf16 run repeats byte for byte (--exact makes any schedule's bits the same).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

PREFILLS = 32       # recent prefills the fixed cost is fit over
STEP_MEMORY = 64    # steps the step time and the slots freed average over
SPREAD = 0.3        # the least coefficient of variation of tokens a forward that fits F


class Admission:
    def __init__(self, slots: int):
        self.slots = slots
        self.prefills: deque[tuple[int, int, float]] = deque(maxlen=PREFILLS)
        self._fixed: float | None = None   # F (_fit), redone at each prefill
        self.step_ms: float | None = None
        self.freed = 0.0   # slots freed a step
        self.steps = 0
        self.prompt_tokens = 0.0   # a prompt's mean tokens (recent prefills)

    def prefilled(self, forwards: int, tokens: int, ms: float, prompts: int = 1) -> None:
        """One prefill call: `forwards` forwards over `prompts` prompts of `tokens` tokens took
        ms (the fit is redone here, not where group() is asked every loop)."""
        if forwards > 0 and ms > 0:
            self.prefills.append((forwards, tokens, ms))
            self._fixed = self._fit()
        if prompts > 0:
            per = tokens / prompts
            self.prompt_tokens += (per - self.prompt_tokens) / min(len(self.prefills) or 1,
                                                                  PREFILLS)

    def stepped(self, ms: float, freed: int) -> None:
        """A step took ms, and `freed` sequences finished in it."""
        if ms > 0:
            self.steps += 1
            a = 1.0 / min(self.steps, STEP_MEMORY)
            self.step_ms = ms if self.step_ms is None else self.step_ms + a * (ms - self.step_ms)
            self.freed += a * (freed - self.freed)

    def fixed_ms(self) -> float | None:
        """F, the ms a prefill forward costs beyond its tokens' (None: not measurable yet)."""
        return self._fixed

    def _fit(self) -> float | None:
        """F by least squares of ms = F x forwards + s x tokens over the recent prefills (2 or
        more), where their tokens a forward spread enough to tell F from s (a coefficient of
        variation of at least SPREAD: prompts of 50 and 51 tokens would split noise), s >= 0,
        and F no more than the cheapest prefill's ms a forward. None where it cannot be
        told."""
        if len(self.prefills) < 2:
            return None
        per = [t / f for f, t, _ in self.prefills]
        mean = sum(per) / len(per)
        if mean <= 0 or math.sqrt(sum((x - mean) ** 2 for x in per) / len(per)) < SPREAD * mean:
            return None
        ff = ft = tt = fy = ty = 0.0
        for f, t, y in self.prefills:
            ff, ft, tt, fy, ty = ff + f * f, ft + f * t, tt + t * t, fy + f * y, ty + t * y
        det = ff * tt - ft * ft
        if det <= 0 or (ff * ty - ft * fy) / det < 0:   # (more tokens took less: noise)
            return None
        F = (tt * fy - ft * ty) / det
        return max(0.0, min(F, min(y / f for f, _, y in self.prefills)))

    def group(self) -> int:
        """How many free slots to wait for before admitting (1: at once)."""
        F = self.fixed_ms()
        if not F or not self.step_ms or not self.freed:
            return 1
        g = round(math.sqrt(2.0 * F * self.slots * self.freed / self.step_ms))
        return max(1, min(self.slots // 2, g))

    def hold(self, free: int, waiting: int, soon: Callable[[], int], chunk: int) -> bool:
        """Whether `free` free slots stay empty this step while `waiting` requests wait: fewer
        than the group, or a running sequence must end within soon() steps and holding the
        free slots until then costs less than the prefill forward it saves (module
        docstring). soon: asked only where it decides."""
        if free < min(self.group(), waiting):
            return True
        F, p = self._fixed, self.prompt_tokens
        if not F or not self.step_ms or \
                p and math.ceil((free + 1) * p / chunk) > math.ceil(free * p / chunk):
            return False
        if waiting < free + self.slots:   # (near the job's end: on its critical path)
            return waiting > free and max(1, soon()) * self.step_ms < F
        return free * max(1, soon()) * self.step_ms / self.slots < F
