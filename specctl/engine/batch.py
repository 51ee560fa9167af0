"""The packed (unpadded) batch of one forward, and the layer plan.

All new tokens of all sequences in a step are packed into one flat sequence of T tokens, T being
the sum of the sequences' real token counts (EMS-SD's unpadded inputs). Per token we keep its
position (for RoPE), its slot in the KV cache and the cache row it writes; per sequence its number
of committed (prefix) rows and an optional mask among its new tokens.

Worked example, two sequences in one step:

    seq A: slot 3, prefix 7, new tokens [a0]                 (a plain decode step)
    seq B: slot 0, prefix 4, new tokens [b0 b1 b2], mask     (a root and two sibling drafts)
           mask = [[1,0,0],     b1 and b2 both see b0 but not each other, so both sit at
                   [1,1,0],     position 5: positions are given explicitly as [4, 5, 5]
                   [1,0,1]]
    tokens    = [a0, b0, b1, b2]      positions = [7, 4, 5, 5]
    slots     = [3, 0, 0, 0]          rows      = [7, 4, 5, 6]   (rows = prefix + index)
    cu_seqlens = [0, 1, 4]

A token attends to all committed rows of its slot and to the new tokens of its own sequence that
its mask allows (default: causal among the new tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class SeqInput:
    """One sequence's share of a forward."""
    slot: int
    tokens: list[int]
    prefix_len: int
    positions: list[int] | None = None   # default: prefix_len + arange(n)
    mask: torch.Tensor | None = None     # [n, n] bool among the new tokens; default causal

    def __post_init__(self):
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a sequence in a batch needs at least one new token")
        if self.positions is not None and len(self.positions) != n:
            raise ValueError("positions must have one entry per new token")
        if self.mask is not None:
            if tuple(self.mask.shape) != (n, n) or self.mask.dtype != torch.bool:
                raise ValueError(f"mask must be bool [{n}, {n}], got {self.mask.dtype} "
                                 f"{tuple(self.mask.shape)}")
            m = self.mask   # (a host mask is checked in numpy: a torch op costs ~20 us)
            if not (m.numpy() if m.device.type == "cpu" else m).diagonal().all():
                raise ValueError("every token must attend to itself (mask diagonal)")


@dataclass(frozen=True)
class LayerPlan:
    """Which blocks a forward runs.

    Layers [start, end) run; an attention block of layer i is skipped when i in skip_attn, an MLP
    block when i in skip_mlp (a skipped block returns its residual input unchanged). With
    start > 0 the forward starts from given hidden states of layer `start` (the residual stream
    entering that layer). `capture` names a layer whose input hidden states are returned too.
    """
    start: int = 0
    end: int | None = None
    skip_attn: frozenset[int] = field(default_factory=frozenset)
    skip_mlp: frozenset[int] = field(default_factory=frozenset)
    capture: int | None = None


FULL = LayerPlan()


class ForwardBatch:
    """Flat packed tensors for one forward (see module docstring)."""

    def __init__(self, seqs: list[SeqInput], device: torch.device | str = "cpu"):
        if not seqs:
            raise ValueError("empty batch")
        self.seqs = seqs
        self.device = torch.device(device)
        toks, pos, slots, rows, counts = [], [], [], [], []
        for s in seqs:
            n = len(s.tokens)
            toks.extend(s.tokens)
            pos.extend(s.positions if s.positions is not None
                       else range(s.prefix_len, s.prefix_len + n))
            slots.extend([s.slot] * n)
            rows.extend(range(s.prefix_len, s.prefix_len + n))
            counts.append(n)
        self.num_new = counts
        self.num_tokens = len(toks)  # T: the sum of real tokens, nothing padded
        # host lists; the device tensors are made on first use (a CUDA-graph replay copies the
        # lists into its static buffers in one transfer and never needs them)
        self.token_list, self.position_list, self._slots, self._rows = toks, pos, slots, rows
        self.seq_slots = [s.slot for s in seqs]
        self.prefix_lens = [s.prefix_len for s in seqs]
        cu = [0]
        for n in counts:
            cu.append(cu[-1] + n)
        self.cu_seqlens = cu
        self.max_kv_len = max(p + n for p, n in zip(self.prefix_lens, counts))
        self._attn_meta = None

    def _dev(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @cached_property
    def tokens(self) -> torch.Tensor:      # [T]
        return self._dev(self.token_list)

    @cached_property
    def positions(self) -> torch.Tensor:   # [T]
        return self._dev(self.position_list)

    @cached_property
    def slots(self) -> torch.Tensor:       # [T]
        return self._dev(self._slots)

    @cached_property
    def rows(self) -> torch.Tensor:        # [T]
        return self._dev(self._rows)

    def last_index(self) -> list[int]:
        """Index in the flat batch of each sequence's last new token."""
        return [c - 1 for c in self.cu_seqlens[1:]]
