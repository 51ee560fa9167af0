"""Prefill: newly admitted prompts into the KV cache, packed together in chunks of at most
`chunk` tokens (and of padded rows whose attention mask fits PAD_BYTES), each finished
prompt's first token from its last row (a step for the compression ratio, so `ar`'s is
exactly 1; no verification, so no accept statistics).
A drafter that keeps states of its own gets the prefill forward's (Kangaroo's exit layer:
Drafter.prefill_capture / prefilled).

Or in pieces: where decoding steps replay CUDA graphs, an eager forward is bound by its
launches, not its tokens (the demo model on the H200: 8.5-16 ms for 1 to 16 prompts of 1 to
512 tokens, where a replay of 8 x 64 rows took 2.4 ms: bench-results/2026-11-28-gpu-74f1c5f).
Then the prompts go in as replays of a captured shape, PIECE tokens of each prompt a forward,
where that is cheaper than the eager forwards, as the run's device measured both when the
runner started (PiecePrice). Each piece is a chain below the prompt's rows so far, its rows
the ones the eager forward writes: the same cache, the same first token up to rounding."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from specctl.engine.batch import FULL, ForwardBatch, LayerPlan, SeqInput
from specctl.engine.graphs import PIECE, CudaGraphs
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


@dataclass(frozen=True)
class PiecePrice:
    """What a prefill forward costs on the run's device (measure_pieces): ms of an eager
    forward of p prompts of PIECE tokens, and of a replay of them, at p = 1 and p = `most`,
    linear in p (`most`: the most prompts a replay takes, within the prefill chunk's
    tokens, whose working memory the KV cache's budget left)."""
    most: int
    eager: tuple[float, float]
    replay: tuple[float, float]

    def at(self, ms: tuple[float, float], p: int) -> float:
        """ms at p prompts, linear between the measured ends (p past the most: the most's)."""
        a, b = ms
        return a if self.most == 1 else a + (b - a) * (min(p, self.most) - 1) / (self.most - 1)

    def costs(self, left: list[int], chunk: int, slots: int) -> tuple[float, float]:
        """(ms as eager forwards of `chunk` tokens, ms as replays of PIECE tokens a prompt)
        of prompts with `left` tokens each to go in. An eager forward is priced as one of at
        most the most prompts of PIECE tokens each: what it costs at least (an eager H200
        forward cost 15-16 ms for 4 to 16 prompts of 1 to 512 tokens), so a guess errs
        towards the eager forward, as prefill ran before."""
        p = len(left)
        rounds = -(-p // self.most) * -(-max(left) // PIECE)
        forwards = -(-sum(left) // chunk)
        return forwards * self.at(self.eager, p), \
            rounds * self.at(self.replay, CudaGraphs.bucket(min(p, self.most), slots))

    def pieces(self, left: list[int], chunk: int, slots: int) -> bool:
        """Whether they cost less in pieces (costs)."""
        eager, pieces = self.costs(left, chunk, slots)
        return pieces < eager


def piece_prompts(kv, chunk: int) -> int:
    """The most prompts a prefill replay takes: the cache's slots, within `chunk` tokens."""
    return max(1, min(kv.num_slots, chunk // PIECE))


def prefill_plan(drafter) -> LayerPlan:
    """The layer plan of a prefill forward: every layer, with the drafter's capture."""
    layer = drafter.prefill_capture
    return FULL if layer is None else LayerPlan(capture=layer)


def measure_pieces(model, kv, plan: LayerPlan, chunk: int,
                   repeats: int = 5) -> PiecePrice | None:
    """A PiecePrice measured now on kv's idle slots (a runner's, as it starts: prefill
    writes over what this leaves there), where prefill can replay: CUDA graphs captured, a
    contiguous cache, no --exact; else None (prefill runs eagerly)."""
    g = model.graphs
    if g is None or not g.capture or kv.scratch is None or model.exact or \
            kv.max_len < PIECE:
        return None
    return price_of(model, kv, plan, piece_prompts(kv, chunk), repeats)


def price_of(model, kv, plan: LayerPlan, most: int, repeats: int) -> PiecePrice:
    """measure_pieces' timings, on whatever runs the model's graphs (a CPU's test: their
    eager stand-in)."""
    V = min(model.cfg.vocab_size, 1000)

    def sync():
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)

    def ms(p: int, fn) -> float:
        batch = ForwardBatch([SeqInput(s, [(7 * s + j) % V for j in range(PIECE)], 0)
                              for s in range(p)], model.device)
        times = []
        for i in range(repeats + 2):   # (two untimed: the allocator's and kernels' first use)
            sync()
            t = time.perf_counter()
            fn(batch)
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times[2:]) * 1e3

    def eager(b):
        return model.forward(b, kv, plan)

    def replay(b):
        return model.run(b, kv, plan, pad_n=PIECE)
    ends = (1, most)
    return PiecePrice(most, tuple(ms(p, eager) for p in ends),
                      tuple(ms(p, replay) for p in ends))


def _parts(model, todo: list[Sequence], chunk: int) -> list[tuple[Sequence, int]]:
    """An eager forward's prompts and tokens of each: at most `chunk` tokens, their padded
    attention within PAD_BYTES."""
    col, row = _padded_bytes(model)

    def over(prompts: int, wide: int, far: int) -> bool:   # (prompts x wide rows x far columns)
        return prompts * wide * (far * col + row) > PAD_BYTES

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
    return parts


def prefill(model, kv, drafter, seqs: list[Sequence], chunk: int, stats: RunStats,
            answers: Answers, sample_rows: Callable[[torch.Tensor, list[Sequence]], list[int]],
            logprobs: int | None = None, under: Callable[[], None] | None = None,
            price: PiecePrice | None = None) -> float | None:
    """seqs' prompts (what is left of each) into kv, their first tokens emitted
    (sample_rows: each finished prompt's token from its last row's states). under: host
    work run once the last forward is issued and before its output is first read (on CUDA
    while it computes). price: where given, a forward goes in pieces where they cost less
    (module docstring). Returns what the prompts would have cost as eager forwards (the
    price's ms) where some went in pieces, else None."""
    todo = list(seqs)
    plan = prefill_plan(drafter)
    eager, pieced = None, False
    while todo:
        left = [len(s.prompt_ids) - s.prefilled for s in todo]
        piece = False
        if price is not None:
            ms, cheaper = price.costs(left, chunk, kv.num_slots)
            eager = ms if eager is None else eager
            piece = cheaper < ms
        pieced |= piece
        parts = [(s, min(n, PIECE)) for s, n in zip(todo[:price.most], left)] if piece else \
            _parts(model, todo, chunk)
        batch = ForwardBatch([SeqInput(s.slot, s.prompt_ids[s.prefilled:s.prefilled + n],
                                       s.prefilled) for s, n in parts], model.device)
        # (a piece replays where a captured shape fits it, else runs eagerly: Model.run)
        g = model.graphs if piece else None
        replays = g.replays if g is not None else 0
        out = model.run(batch, kv, plan, pad_n=PIECE) if piece else \
            model.forward(batch, kv, plan)
        if plan.capture is None:
            hidden = out
        else:
            hidden, h = out
            drafter.prefilled(batch, kv, h)
        stats.prefill_forwards += 1
        if g is not None:
            stats.prefill_replays += g.replays - replays
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
    return eager if pieced else None
