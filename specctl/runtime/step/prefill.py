"""Prefill: newly admitted prompts into the KV cache, packed together in chunks of at most
`chunk` tokens, each finished prompt's first token from its last row (a step for the
compression ratio, so `ar`'s is exactly 1; no verification, so no accept statistics).
A drafter that keeps states of its own gets the prefill forward's (Kangaroo's exit layer:
Drafter.prefill_capture / prefilled)."""

from __future__ import annotations

from typing import Callable

import torch

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.errors import SpecctlError
from specctl.runtime.step.answers import Answers
from specctl.runtime.step.logprobs import token_logprobs
from specctl.runtime.step.sequence import Sequence
from specctl.runtime.step.stats import RunStats


def prefill(model, kv, drafter, seqs: list[Sequence], chunk: int, stats: RunStats,
            answers: Answers, sample_rows: Callable[[torch.Tensor, list[Sequence]], list[int]],
            logprobs: int | None = None, under: Callable[[], None] | None = None) -> None:
    """seqs' prompts (what is left of each) into kv, their first tokens emitted
    (sample_rows: each finished prompt's token from its last row's states). under: host
    work run once the last forward is issued and before its output is first read (on CUDA
    while it computes)."""
    todo = list(seqs)
    while todo:
        budget, parts = chunk, []
        for s in todo:
            if budget <= 0:
                break
            n = min(len(s.prompt_ids) - s.prefilled, budget)
            parts.append((s, n))
            budget -= n
        batch = ForwardBatch([SeqInput(s.slot, s.prompt_ids[s.prefilled:s.prefilled + n],
                                       s.prefilled) for s, n in parts], model.device)
        layer = drafter.prefill_capture
        if layer is None:
            hidden = model.forward(batch, kv)
        else:
            hidden, h = model.forward(batch, kv, LayerPlan(capture=layer))
            drafter.prefilled(batch, kv, h)
        stats.prefill_forwards += 1
        stats.prefill_tokens += batch.num_tokens
        ends = []
        for b, (s, n) in enumerate(parts):
            s.prefilled += n
            kv.lens[s.slot] = s.prefilled
            if s.prefilled == len(s.prompt_ids):
                ends.append((s, batch.cu_seqlens[b + 1] - 1))
        if under is not None and all(s.prefilled == len(s.prompt_ids) for s in todo):
            under()   # (the last forward's: the read below is the first wait for it)
        if ends:
            last = hidden[[i for _, i in ends]]
            if not bool(torch.isfinite(last).all()):   # (once per prompt, not per step)
                raise SpecctlError(f"{model.name}: the model's activations are not "
                                   "finite (NaN or inf): its weights are damaged, or do not "
                                   "fit this --dtype")
            first = sample_rows(last, [s for s, _ in ends])
            if logprobs is not None:
                for (s, _), rec in zip(ends, token_logprobs(model, last, first,
                                                            logprobs)):
                    s.logprobs.append(rec)
            for (s, _), tok in zip(ends, first):
                # the prefill forward emits the first token: a step for CR (so ar's CR is
                # exactly 1), but no verification, so no entry in the accept statistics
                s.req.steps += 1
                answers.emit(s, [tok])
        todo = [s for s in todo if s.prefilled < len(s.prompt_ids)]
