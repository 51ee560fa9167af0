"""Rotary position embedding: each rope variant's frequencies, and cos / sin per position.

    rope = Rope(cfg.rope, cfg.head_dim, device)
    cos, sin = rope(positions, dtype)     # [T, 1, hd] for model.apply_rope

The variants follow transformers' modeling_rope_utils: default (and dynamic NTK, which equals it
within max_position_embeddings), linear, llama3, yarn (its ramp between interpolated and
extrapolated frequencies, and cos / sin times its attention factor) and longrope (Phi-3: the
frequencies divided by short_factor, times its attention factor). transformers picks longrope's
long_factor for every position of a forward once the forward's last position reaches
original_max_position; a KV cache cannot follow that (its keys keep their rotation), so here a
position takes long_factor from original_max_position on: the same as transformers for a
sequence shorter than that.
"""

from __future__ import annotations

import math

import torch

from specctl.engine.config import RopeConfig


def inv_freq(r: RopeConfig, head_dim: int, factors: tuple[float, ...] = ()) -> torch.Tensor:
    """[hd/2] inverse frequencies (float32). factors: longrope's divisors."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv = 1.0 / (r.theta ** exps)
    if r.kind == "linear":
        inv = inv / r.factor
    elif r.kind == "llama3":
        inv = _llama3(r, inv)
    elif r.kind == "yarn":
        return _yarn(r, head_dim)
    elif r.kind == "longrope":
        # (as transformers: fp32 powers, divided by the factors)
        ext = torch.tensor(factors, dtype=torch.float32)
        return 1.0 / (ext * r.theta ** torch.arange(0, head_dim, 2).float().div(head_dim))
    return inv.float()


def _llama3(r: RopeConfig, inv: torch.Tensor) -> torch.Tensor:
    low_wl = r.original_max_position / r.low_freq_factor
    high_wl = r.original_max_position / r.high_freq_factor
    wl = 2 * math.pi / inv
    scaled = torch.where(wl > low_wl, inv / r.factor, inv)
    smooth = (r.original_max_position / wl - r.low_freq_factor) / (
        r.high_freq_factor - r.low_freq_factor)
    mid = (1 - smooth) * scaled / r.factor + smooth * scaled
    is_mid = (wl >= high_wl) & (wl <= low_wl)
    return torch.where(is_mid, mid, scaled)


def _yarn(r: RopeConfig, dim: int) -> torch.Tensor:
    """YaRN's frequencies in float32, step for step as transformers computes them."""
    def correction_dim(rotations):
        return (dim * math.log(r.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(r.theta))
    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # (transformers' guard against a zero-width ramp)
    pos_freqs = r.theta ** (torch.arange(0, dim, 2).float() / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (r.factor * pos_freqs)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp   # extrapolated share
    return inter * (1 - keep) + extra * keep


class Rope:
    """cos / sin of positions for one RopeConfig (on `device`)."""

    def __init__(self, r: RopeConfig, head_dim: int, device):
        self.cfg = r
        self.scale = r.attention_factor if r.kind in ("yarn", "longrope") else 1.0
        self.inv = inv_freq(r, head_dim, r.short_factor).to(device)
        self.inv_long = inv_freq(r, head_dim, r.long_factor).to(device) \
            if r.kind == "longrope" else None

    def freqs(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, hd/2] angles (float32)."""
        p = positions.float()[:, None]
        if self.inv_long is None:
            return p * self.inv[None, :]
        long = positions[:, None] >= self.cfg.original_max_position
        return torch.where(long, p * self.inv_long[None, :], p * self.inv[None, :])

    def cos_sin(self, freqs: torch.Tensor, dtype: torch.dtype):
        """angles [T, hd/2] -> cos, sin [T, 1, hd] (sin's first half negated: rotate_half's
        sign), times the variant's attention factor, in dtype."""
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        sin = torch.cat((-freqs, freqs), dim=-1)[:, None, :].sin()
        cos = emb.cos()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        return cos.to(dtype), sin.to(dtype)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype):
        return self.cos_sin(self.freqs(positions), dtype)
