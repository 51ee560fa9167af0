"""A lean step (`auto`'s choice of `ar`'s step) makes about the calls `ar`'s step makes: its
controller's share is O(1) and small (issue 52: on the 2-layer model at batch 1 each extra
call is ~1% of `ar`'s host work a step). Counted, not timed: the Python calls into specctl
that a step makes outside the forward, on a CPU run (no overlap, no prefetch)."""

from __future__ import annotations

import random
import sys
from collections import Counter

import pytest

from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import Controller
from specctl.runtime.control.stepcost import StepCost
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request
from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
from specctl.speculative.drafter import NoDraft
from specctl.speculative.sampling import SamplingParams

FORWARD = {"run", "forward", "argmax", "logits"}   # (the model's: device work, not counted)
EXTRA = 2   # calls a lean step may make beyond ar's (plan_lean, the account)


def _calls(model, drafter, batch: int, controller=None) -> list[tuple[bool, int]]:
    """(whether the step was a tallied lean step, its calls) of every decoding step."""
    rng = random.Random(batch)
    prompts = [[rng.randrange(30) for _ in range(rng.randint(3, 12))] for _ in range(2 * batch)]
    runner = Runner(model, drafter, SamplingParams(), batch_size=batch, max_len=96,
                    eos_ids=set(), render=lambda r: prompts[r.index],
                    decode=lambda ids: " ".join(map(str, ids)), controller=controller,
                    threads=1)
    inner, got = runner.step, []

    def step(seqs, drain=False):
        n, inside = Counter(), []

        def prof(frame, event, arg):
            co = frame.f_code
            if event == "call" and "specctl" in co.co_filename:
                if inside or co.co_name in FORWARD and "engine" in co.co_filename:
                    inside.append(co)
                else:
                    n["calls"] += 1
            elif event == "return" and inside and inside[-1] is co:
                inside.pop()
        acct = runner.accounting
        sys.setprofile(prof)
        try:
            return inner(seqs, drain)
        finally:
            sys.setprofile(None)
            got.append((acct is not None and acct.tally.steps > 1, n["calls"]))
    runner.step = step
    runner.run([Request(i, [[{"role": "user", "content": str(i)}]], 40)
                for i in range(len(prompts))], lambda r: None)
    return got


@pytest.mark.parametrize("batch", [1, 8])
def test_a_lean_step_calls_what_ars_does(model, batch):
    ar = [c for _, c in _calls(model, NoDraft(), batch)]
    L = model.cfg.num_layers   # (draft-verify skipping every block: never right)
    dr = LayerSkipDrafter(model, SkipSet(L, frozenset(range(L)), frozenset(range(L))),
                          SamplingParams(), ExitParams(K=4, gamma0=0.0))
    table = StepTable("cpu", "float32", "sdpa", 128, (1, 8), (1, 2, 4, 8),
                      ((1.0, 1.5, 2.0, 3.0),) * 2)
    ctl = Controller(StepCost.of(table, dr.price(), padded=False), dr.price().max_draft,
                     prior_accept=0.05)
    lean = [c for tallied, c in _calls(model, dr, batch, ctl) if tallied]
    assert len(lean) > len(ar) / 2   # (most of the run: a lean stretch, learnt in bulk)
    # (the most common step of each: sequences that end, a search that gave 0s, a tally
    # learnt, take more, and as many in both runs or few)
    base, got = Counter(ar).most_common(1)[0][0], Counter(lean).most_common(1)[0][0]
    assert got <= base + EXTRA, (base, Counter(lean))
