"""Sampling: the settings (temperature, top-k, top-p, seed), the warped distribution, and the
draws: each row's top-1 and its probability (greedy drafting's confidence), drafts drawn from a
drafter's q, and the counter-based uniforms by which a token is drawn at a given output position
(position_uniforms, sample_rows). ar samples through these, and the verifier (verify.py) draws
the target's tokens of deterministic drafts through them, so the text is ar's for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


MIN_TEMPERATURE = 1e-3   # below it (but 0) the warped probabilities are not numbers


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0    # 0 = greedy
    top_k: int = 0              # 0 = off
    top_p: float = 1.0          # 1 = off
    seed: int = 0

    def __post_init__(self):
        if not 0 <= self.temperature < float("inf"):   # (NaN fails too)
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:   # logits / T overflow: NaN probabilities
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, "
                             f"got {self.temperature}")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off, where other tools take -1), "
                             f"got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """[N, V] logits -> [N, V] probabilities with temperature, top-k and top-p applied
    (the same warping is applied to p and to q)."""
    x = logits.float() / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sp.top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_x, dim=-1) >= sp.top_p   # keep the smallest nucleus
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, idx, sorted_x)
    return torch.softmax(x, dim=-1)


def top1_tensors(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax of [N, V] logits and its softmax probability (the draft's confidence),
    as tensors. The probability is the fused softmax's largest (a CPU's logsumexp runs several
    kernels: 10 us for one row of 2,048 against 2 us); the token is the logits' own argmax."""
    lf = logits.float()
    return lf.argmax(-1), torch.softmax(lf, -1).amax(-1)


def top1(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """Greedy drafting's read-back: top1_tensors fetched in one transfer (token ids are exact
    in float32: vocabularies are far below 2^24)."""
    tok, conf = top1_tensors(logits)
    toks, confs = torch.stack([tok.float(), conf]).tolist()
    return [int(t) for t in toks], confs


def draw_drafts(logits: torch.Tensor, sp: SamplingParams, rngs: list) -> tuple:
    """One draft token per row of [B, V] draft logits, for the drafting loops: greedy, each
    row's argmax (q None); sampling, a draw from the warped distribution q [B, V] (kept on the
    host, where each request's generator is) with request i's generator. Returns (tokens, the
    confidence the draft exits on, q)."""
    if sp.greedy:
        toks, conf = top1(logits)
        return toks, conf, None
    q = warp(logits, sp).cpu()
    conf = q.max(-1).values.tolist()
    toks = [int(torch.multinomial(q[i], 1, generator=g).item()) for i, g in enumerate(rngs)]
    return toks, conf, q


_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's step: a well-mixed 64-bit value of x."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def position_uniforms(seed: int, stream: int, start: int, n: int) -> list[float]:
    """Uniforms in [0, 1) for output positions start .. start + n - 1 of one answer (stream:
    the request and turn). Counter-based: the draw for a position depends on nothing else,
    not on the drafts, the batch or the steps before, so a sampled token is the one ar samples
    there (sample_rows) whatever method produced the text before it."""
    base = _mix(_mix(seed & _M64) ^ (stream & _M64))
    return [(_mix((base + (start + i) * 0x9E3779B97F4A7C15) & _M64) >> 11) * 2.0 ** -53
            for i in range(n)]


def sample_rows(probs: torch.Tensor, u) -> torch.Tensor:
    """One token per row of probs [R, V] (on any device) by the inverse CDF at u[r]: the first
    token whose cumulative probability passes u[r] times the row's total. Zero-probability
    tokens are never chosen. Returns a [R] tensor on probs' device."""
    cdf = probs.double().cumsum(-1)   # (fp64: every token keeps its share of [0, 1))
    # a parallel scan (CUDA) may round a flat step upwards: the CDF stands still where p = 0
    cdf = torch.where(probs > 0, cdf, 0.0).cummax(-1).values
    uu = torch.tensor(u, dtype=torch.float64)
    if probs.is_cuda:
        uu = uu.pin_memory()
    t = uu.to(probs.device, non_blocking=True)[:, None] * cdf[:, -1:]
    tok = torch.searchsorted(cdf, t, right=True)[:, 0]
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)   # (rounding at the end)
    return torch.minimum(tok, last)
