"""Per-slot KV cache with per-sequence lengths (EMS-SD's unpadded KV cache).

Storage is preallocated: keys and values of all layers in one tensor each,
`[layers, num_slots, max_len, kv_heads, head_dim]`; `k[i]`, `v[i]` are layer i's views.
A sequence lives in one slot; `lens[slot]` is its number of *committed* rows. A forward over new
tokens writes their rows at `lens[slot] + i` (i = the token's index among the sequence's new
tokens, whatever its position); they only become part of the sequence by `commit`, which keeps a
chosen subset of them and compacts it to the front:

    lens = 5, new rows written at 5..9 (say, a root and four branch tokens),
    commit(slot, kept=[0, 2, 3]) -> rows 5, 7, 8 are moved to 5, 6, 7; lens = 8.

A step commits all its sequences at once (commit_many): every row that moves, in every slot and
layer, moves in one gather and one scatter per cache tensor, whatever the batch size (on a GPU,
two launches instead of two per layer and sequence).

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
        self.k_all = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.v_all = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.k = list(self.k_all.unbind(0))   # per-layer views
        self.v = list(self.v_all.unbind(0))
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
        self.commit_many([(slot, kept)])

    def commit_many(self, items: list[tuple[int, list[int]]]) -> None:
        """commit(slot, kept) for each (slot, kept) of distinct slots, the moves batched.
        Everything is checked before anything moves."""
        if len({slot for slot, _ in items}) != len(items):
            raise ValueError("commit_many: a slot appears twice")
        slots, dst, src = [], [], []
        for slot, kept in items:
            base, n = self.lens[slot], len(kept)
            if any(b <= a for a, b in zip(kept, kept[1:])) or (n and kept[0] < 0):
                raise ValueError(f"kept offsets must be ascending, got {kept}")
            if n and base + kept[-1] >= self.max_len:
                raise ValueError(f"slot {slot}: kept row {base + kept[-1]} is past the cache "
                                 f"({self.max_len} rows)")
            for j, o in enumerate(kept):   # a contiguous prefix is already in place
                if o != j:
                    slots.append(slot)
                    dst.append(base + j)
                    src.append(base + o)
        if slots:
            s, d, r = torch.tensor([slots, dst, src], device=self.k_all.device)   # one copy
            for cache in (self.k_all, self.v_all):
                cache[:, s, d] = cache[:, s, r]   # (the right side is gathered first)
        for slot, kept in items:
            self.lens[slot] += len(kept)

    def truncate(self, slot: int, n: int) -> None:
        """Drop committed rows past n (rejected rows are simply forgotten)."""
        if n < 0 or n > self.lens[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lens[slot]} to {n}")
        self.lens[slot] = n

    def reset(self, slot: int) -> None:
        self.lens[slot] = 0

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k_all, self.v_all))
