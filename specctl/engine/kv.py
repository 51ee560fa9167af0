"""Per-slot KV cache with per-sequence lengths (EMS-SD's unpadded KV cache).

Storage is preallocated: for each layer, keys and values `[num_slots, max_len, kv_heads, head_dim]`.
A sequence lives in one slot; `lens[slot]` is its number of *committed* rows. A forward over new
tokens writes their rows at `lens[slot] + i` (i = the token's index among the sequence's new
tokens, whatever its position); they only become part of the sequence by `commit`, which keeps a
chosen subset of them and compacts it to the front:

    lens = 5, new rows written at 5..9 (say, a root and four branch tokens),
    commit(slot, kept=[0, 2, 3]) -> rows 5, 7, 8 are moved to 5, 6, 7; lens = 8.

Rows written past `lens` and not committed (rejected drafts, other branches) are garbage that the
next forward overwrites; they never become visible, because attention reads only committed rows
plus the current forward's own new rows.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", spare: bool = False):
        # spare: one extra scratch slot that padded rows of a CUDA-graph replay write into
        shape = (num_slots + int(spare), max_len, num_kv_heads, head_dim)
        self.scratch = num_slots if spare else None
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots
        self.max_len = max_len
        self.lens = [0] * num_slots  # committed rows per slot (host-side; the scheduler owns it)

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new keys/values. slots, rows: [T] long; k, v: [T, kv_heads, head_dim]."""
        self.k[layer][slots, rows] = k
        self.v[layer][slots, rows] = v

    def commit(self, slot: int, kept: list[int]) -> None:
        """Keep the new rows at offsets `kept` (ascending) after `lens[slot]`, compacted."""
        base = self.lens[slot]
        n = len(kept)
        if n and kept != list(range(n)):  # a contiguous prefix is already in place
            if any(b <= a for a, b in zip(kept, kept[1:])) or kept[0] < 0:
                raise ValueError(f"kept offsets must be ascending, got {kept}")
            src = torch.tensor(kept, device=self.k[0].device) + base
            for cache in (*self.k, *self.v):
                cache[slot, base:base + n] = cache[slot, src]
        if base + n > self.max_len:
            raise ValueError(f"slot {slot} overflows the cache ({base + n} > {self.max_len})")
        self.lens[slot] = base + n

    def truncate(self, slot: int, n: int) -> None:
        """Drop committed rows past n (rejected rows are simply forgotten)."""
        if n < 0 or n > self.lens[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lens[slot]} to {n}")
        self.lens[slot] = n

    def reset(self, slot: int) -> None:
        self.lens[slot] = 0

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
