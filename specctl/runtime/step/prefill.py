"""Prefill: newly admitted prompts into the KV cache, packed together in chunks of at most
`chunk` tokens (and of padded rows whose attention mask fits PAD_BYTES), each finished
prompt's first token from its last row (a step for the compression ratio, so `ar`'s is
exactly 1; no verification, so no accept statistics).
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


PAD_BYTES = 256 * 2**20   # the most a prefill forward's attention mask and bias may take: the
# unfused attention pads each prompt to the forward's longest ([prompts, new rows, columns]),
# so 64 prompts beside one of 3,000 tokens would take 64 x 3,000 x 3,000 of each


def _padded_bytes(model) -> tuple[int, int]:
    """(bytes a padded query row takes for each key column, bytes it takes besides) in the
    unfused attention (engine/attention.py): the bool mask, the bias in the model's dtype
    before and after its repeat over each KV head's grouped queries, and the copy SDPA's
    memory-efficient kernel may pad it into; one mask and bias more for each sliding window
    (layer.windowed), and soft-capped scores with their fp32 softmax (Gemma 2's _capped);
    besides, the padded queries, SDPA's output and its packed copy."""
    c, e = model.cfg, model.embed.element_size()
    windows = len({w for w in c.layer_windows if w is not None})
    col = (1 + windows) * (1 + (1 + 2 * c.num_heads // c.num_kv_heads) * e)
    if c.attn_softcap is not None:   # (scores, a temporary of their tanh, the fp32 softmax)
        col += c.num_heads * (2 * e + 4)
    return col, 3 * c.num_heads * c.head_dim * e


def prefill(model, kv, drafter, seqs: list[Sequence], chunk: int, stats: RunStats,
            answers: Answers, sample_rows: Callable[[torch.Tensor, list[Sequence]], list[int]],
            logprobs: int | None = None, under: Callable[[], None] | None = None) -> None:
    """seqs' prompts (what is left of each) into kv, their first tokens emitted
    (sample_rows: each finished prompt's token from its last row's states). under: host
    work run once the last forward is issued and before its output is first read (on CUDA
    while it computes)."""
    todo = list(seqs)
    col, row = _padded_bytes(model)

    def over(prompts: int, wide: int, far: int) -> bool:   # (prompts x wide rows x far columns)
        return prompts * wide * (far * col + row) > PAD_BYTES

    while todo:
        budget, parts, n_max, cols = chunk, [], 0, 0
        for s in todo:
            if budget <= 0:
                break
            n = min(len(s.prompt_ids) - s.prefilled, budget)
            while not parts and n > 1 and over(1, n, s.prefilled + n):
                n //= 2   # (one long prompt deep in its context: in smaller pieces)
            wide, far = max(n_max, n), max(cols, s.prefilled + n)
            if parts and over(len(parts) + 1, wide, far):
                break
            parts.append((s, n))
            budget, n_max, cols = budget - n, wide, far
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
