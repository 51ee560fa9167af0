"""Per-block costs of a model on this machine, and the cost model built from them.

Measured once per (model, device, dtype) and kept in the store (`profiles/`):
    base      embedding + per-forward overhead of a 1-token forward with every block skipped
    attn      one attention block, 1 token          mlp   one MLP block, 1 token
    head      final norm + LM head for 1 token
    verify[k] a full forward + head over k tokens (k = 1 .. K + 1)
all at batch 1 with a context of typical length (median of repeats, seconds).

The cost model prices a decoding run from its counts alone:
    cost = sum over steps of verify[drafted + 1]  +  draft_forwards * draft(skip)
    draft(skip) = base + head + (L - skipped attn) * attn + (L - skipped mlp) * mlp
so two runs with the same acceptance statistics cost the same, run after run: the clock is read
once, when the profile is measured, instead of at every probe of a search.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput


@dataclass(frozen=True)
class CostProfile:
    num_layers: int
    base: float
    attn: float
    mlp: float
    head: float
    verify: tuple[float, ...]     # verify[k - 1] = cost of verifying k tokens
    device: str = "cpu"
    dtype: str = "float32"

    def draft(self, skipped_attn: int, skipped_mlp: int) -> float:
        L = self.num_layers
        return self.base + self.head + (L - skipped_attn) * self.attn + (L - skipped_mlp) * self.mlp

    def verify_cost(self, k: int) -> float:
        if k <= len(self.verify):
            return self.verify[k - 1]
        # beyond the measured range: extend linearly from the last two points
        a, b = self.verify[-2], self.verify[-1]
        return b + (k - len(self.verify)) * (b - a)

    @property
    def ar_per_token(self) -> float:
        return self.verify[0]

    def to_json(self) -> dict:
        d = asdict(self)
        d["verify"] = list(self.verify)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CostProfile":
        return cls(**{**d, "verify": tuple(d["verify"])})


def _timed(fn, repeats: int) -> float:
    fn()   # warm-up
    ts = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def measure_costs(model, context: int = 128, max_k: int = 13, repeats: int = 25) -> CostProfile:
    """Time the blocks of `model` at batch 1 after a `context`-token prefix (see module doc)."""
    L = model.cfg.num_layers
    kv = model.new_kv_cache(1, context + max_k + 1)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.cfg.vocab_size, (context,), generator=gen).tolist()
    model.forward(ForwardBatch([SeqInput(0, prefix, 0)], model.device), kv)
    kv.lens[0] = context
    one = ForwardBatch([SeqInput(0, [prefix[-1]], context)], model.device)
    everything = frozenset(range(L))

    def fwd(plan, head=False):
        def run():
            h = model.forward(one, kv, plan)
            if head:
                model.logits(h)
        return run
    full = _timed(fwd(LayerPlan()), repeats)
    no_attn = _timed(fwd(LayerPlan(skip_attn=everything)), repeats)
    no_mlp = _timed(fwd(LayerPlan(skip_mlp=everything)), repeats)
    none = _timed(fwd(LayerPlan(skip_attn=everything, skip_mlp=everything)), repeats)
    with_head = _timed(fwd(LayerPlan(), head=True), repeats)
    measured = []
    for k in range(1, max_k + 1):
        b = ForwardBatch([SeqInput(0, prefix[-k:], context)], model.device)
        measured.append(_timed(lambda: model.logits(model.forward(b, kv)), max(5, repeats // 2)))
    verify = nondecreasing(measured)
    return CostProfile(
        num_layers=L, base=none, attn=max(full - no_attn, 0.0) / L,
        mlp=max(full - no_mlp, 0.0) / L, head=max(with_head - full, 0.0),
        verify=tuple(verify), device=str(model.device), dtype=str(model.dtype).replace("torch.", ""))


def measure_costs_seconds(model, context: int = 128, max_k: int = 13, repeats: int = 25) -> float:
    """How long measure_costs(model, context, max_k, repeats) takes here: its forwards counted
    (as measure_costs and _timed run them), each priced by timing a 1-token and a max_k-token
    forward after the same prefix (a fraction of a second)."""
    kv = model.new_kv_cache(1, context + max_k + 1)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.cfg.vocab_size, (context,), generator=gen).tolist()
    model.forward(ForwardBatch([SeqInput(0, prefix, 0)], model.device), kv)
    kv.lens[0] = context

    def fwd(k):
        b = ForwardBatch([SeqInput(0, prefix[-k:], context)], model.device)
        return lambda: model.logits(model.forward(b, kv))
    one, last = _timed(fwd(1), 2), _timed(fwd(max_k), 2)
    started = time.perf_counter()
    model.forward(ForwardBatch([SeqInput(0, prefix, 0)], model.device), kv)
    prefill = time.perf_counter() - started
    blocks = 5 * (repeats + 1) * one   # full, 3 with blocks skipped, with the head
    verify = sum((max(5, repeats // 2) + 1) * (one + (last - one) * (k - 1) / max(max_k - 1, 1))
                 for k in range(1, max_k + 1))
    return prefill + blocks + verify


def nondecreasing(y: list[float]) -> list[float]:
    """Isotonic (pool-adjacent-violators) fit: the closest non-decreasing sequence, so one noisy
    timing cannot make verifying k + 1 tokens look cheaper than k and reward odd draft lengths,
    while real steps (a GEMV -> GEMM switch between 1 and 2 tokens on a CPU) are kept."""
    blocks: list[list[float]] = []   # [sum, count]
    for v in y:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return [s / c for s, c in blocks for _ in range(c)]


def run_cost(profile: CostProfile, draft_lengths: list[int], draft_forwards: int,
             skipped_attn: int, skipped_mlp: int) -> float:
    """Modelled seconds of one sequence's decoding from its counts (module docstring)."""
    verify = sum(profile.verify_cost(d + 1) for d in draft_lengths)
    return verify + draft_forwards * profile.draft(skipped_attn, skipped_mlp)
