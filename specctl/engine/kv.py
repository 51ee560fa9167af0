"""The KV cache: rows in blocks, a block table per sequence slot, per-sequence lengths.

Storage is one tensor each for keys and values, `[layers, rows, kv_heads, head_dim]`, cut into
blocks of `block` rows; `k[i]`, `v[i]` are layer i's views. A sequence lives in a slot; row r of
slot s (its r-th token) is stored in block `tables[s][r // block]` at offset `r % block`.
Two layouts of the same structure:

- contiguous (when the memory budget holds every slot at full length, and always when no
  budget is given): one block per slot, `max_len` rows long, block s for slot s. Nothing is
  allocated or freed as sequences grow; attention reads a slot's rows as a view of the storage.
- paged (when it does not): blocks of BLOCK rows from one pool, handed to a slot as its rows
  need them (`reserve`) and returned when the slot is emptied (`reset`). Block 0 is the null
  block: unallocated table entries point at it, so rows that nobody keeps (a captured graph's
  padding) write there and reads of it are always masked. The scheduler admits a sequence only
  when the blocks it needs are free, and preempts one when a running sequence cannot grow
  (runtime/step/runner.py), so the pool never overflows mid-step.

`lens[slot]` is a slot's number of *committed* rows. A forward over new tokens writes their rows
at `lens[slot] + i` (i = the token's index among the sequence's new tokens, whatever its
position); they only become part of the sequence by `commit`, which keeps a chosen subset of
them and compacts it to the front:

    lens = 5, new rows written at 5..9 (say, a root and four branch tokens),
    commit(slot, kept=[0, 2, 3]) -> rows 5, 7, 8 are moved to 5, 6, 7; lens = 8.

A step commits all its sequences at once (commit_many): every row that moves, in every slot and
layer, moves in one gather and one scatter per cache tensor, whatever the batch size (on a GPU,
two launches instead of two per layer and sequence). A grid step moves its rows on the device
from indices the device works out (copy_rows, runtime/step/grid.py), then `advance`s the lens.

Rows written past `lens` and not committed (rejected drafts, other branches) are garbage that the
next forward overwrites; they never become visible, because attention reads only committed rows
plus the current forward's own new rows.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 16   # rows per block of a paged cache (vLLM's default)


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", spare: bool = False,
                 num_blocks: int | None = None):
        """max_len: rows a slot may hold. num_blocks: the pool of a paged cache, in BLOCK-row
        blocks, the null block not counted (None: the contiguous layout; Model.new_kv_cache
        decides from a byte budget). spare: one extra scratch slot (contiguous) that padded
        rows of a CUDA-graph replay write into."""
        per = -(-max_len // BLOCK)
        self.paged = num_blocks is not None
        if self.paged:
            if num_blocks < per:
                raise ValueError(f"a paged KV cache of {num_blocks} blocks cannot hold one "
                                 f"sequence of {max_len} rows ({per} blocks)")
            self.block, max_len = BLOCK, per * BLOCK
            total = num_blocks + 1                          # + the null block
            self.free = list(range(num_blocks, 0, -1))      # popped from the end: 1, 2, ...
            self.tables = [[] for _ in range(num_slots + int(spare))]
        else:
            self.block = max_len
            total = num_slots + int(spare)
            self.free = []
            self.tables = [[s] for s in range(total)]
        self.scratch = num_slots if spare else None
        shape = (total * self.block, num_kv_heads, head_dim)
        self.k_all = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.v_all = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.k = list(self.k_all.unbind(0))   # per-layer views [rows, kv_heads, head_dim]
        self.v = list(self.v_all.unbind(0))
        self.num_slots = num_slots
        self.num_blocks = num_blocks if self.paged else total
        self.max_len = max_len
        self.lens = [0] * num_slots  # committed rows per slot (host-side; the scheduler owns it)

    # -- blocks -------------------------------------------------------------------------------
    def reserve(self, slot: int, rows: int) -> bool:
        """Make slot's first `rows` rows (at most max_len) writable: False, with nothing taken,
        when the pool has too few free blocks. Always True for the contiguous layout."""
        table = self.tables[slot]
        need = -(-min(rows, self.max_len) // self.block) - len(table)
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        for _ in range(need):
            table.append(self.free.pop())
        return True

    def reset(self, slot: int) -> None:
        """Empty a slot (its blocks go back to the pool)."""
        self.lens[slot] = 0
        if self.paged:
            self.free.extend(reversed(self.tables[slot]))
            self.tables[slot] = []

    def sibling(self, num_layers: int) -> "KVCache":
        """Another cache of num_layers layers with this one's slots, lengths and block tables
        (shared, not copied): Kangaroo's adapter keeps its rows where the target keeps its."""
        other = object.__new__(KVCache)
        other.__dict__.update(self.__dict__)
        shape = (num_layers, *self.k_all.shape[1:])
        other.k_all = torch.zeros(shape, dtype=self.k_all.dtype, device=self.k_all.device)
        other.v_all = torch.zeros_like(other.k_all)
        other.k, other.v = list(other.k_all.unbind(0)), list(other.v_all.unbind(0))
        return other

    # -- addressing ---------------------------------------------------------------------------
    def index(self, slots: list[int], rows: list[int]) -> list[int]:
        """Storage row of each (slot, row); every row must be reserved."""
        b, tables = self.block, self.tables
        try:
            return [tables[s][r // b] * b + r % b for s, r in zip(slots, rows)]
        except IndexError:
            self.check_reserved(slots, [r + 1 for r in rows])   # raises, naming the row
            raise

    def index_array(self, slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """index over arrays: the storage row of each (slot, row), slots and rows [T] int64
        (whole-array numpy, for many rows at once: Kangaroo's catch-up of a lean stretch);
        every row must be reserved (else ValueError, as index)."""
        b = self.block
        uniq, at = np.unique(slots, return_inverse=True)
        ends = np.zeros(len(uniq), dtype=np.int64)
        np.maximum.at(ends, at, rows + 1)
        self.check_reserved(uniq.tolist(), ends.tolist())   # (as index raises)
        tables = np.array(self.table_rows(uniq.tolist(), -(-int(ends.max()) // b)))
        return tables[at, rows // b] * b + rows % b

    def reserved(self, slot: int) -> int:
        """Rows of slot that may be written (reserve: the blocks taken, at most max_len)."""
        return min(self.max_len, len(self.tables[slot]) * self.block)

    def check_reserved(self, slots: list[int], ends: list[int]) -> None:
        """Every slot's rows [0, end) are reserved (a paged cache would otherwise put a row
        nobody reserved into the null block)."""
        for s, e in zip(slots, ends):
            if e > len(self.tables[s]) * self.block:
                raise ValueError(f"slot {s}: row {e - 1} is not reserved in the KV cache "
                                 f"({len(self.tables[s]) * self.block} rows)")

    def table_rows(self, slots: list[int], blocks: int) -> list[list[int]]:
        """The first `blocks` entries of each slot's block table (unallocated ones: the null
        block), for a paged cache's attention."""
        return [t[:blocks] + [0] * (blocks - len(t)) for t in (self.tables[s] for s in slots)]

    def table(self, slots: list[int], columns: int, device) -> torch.Tensor:
        """table_rows covering `columns` rows, as a [B, blocks] tensor on `device`."""
        return torch.tensor(self.table_rows(slots, -(-columns // self.block)),
                            dtype=torch.long, device=device)

    def write(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new keys/values at storage rows `index` [T]; k, v: [T, kv_heads, head_dim]."""
        self.k[layer][index] = k
        self.v[layer][index] = v

    # -- committing ---------------------------------------------------------------------------
    def commit(self, slot: int, kept: list[int]) -> None:
        """Keep the new rows at offsets `kept` (ascending) after `lens[slot]`, compacted."""
        self.commit_many([(slot, kept)])

    def advance(self, slots: list[int], counts: list[int] | None = None) -> None:
        """commit(slot, [0 .. n - 1]) for each of distinct slots, n = counts[i] (default 1:
        an `ar` step's, each keeping its one new row): rows already in place. Everything is
        checked before a length changes. (Whole-list operations, not a method call a slot:
        every step commits so; bench-results/2026-12-01-commit-host counts it.)"""
        if len(set(slots)) != len(slots):
            raise ValueError("advance: a slot appears twice")
        lens = self.lens
        if counts is None:
            new = [lens[s] + 1 for s in slots]
        else:
            if len(counts) != len(slots):
                raise ValueError(f"advance: {len(slots)} slots, {len(counts)} counts")
            new = [lens[s] + n for s, n in zip(slots, counts)]
        # each slot's last kept row (new - 1) lies within its blocks: a contiguous cache's
        # slot is one block of `block` rows
        if self.paged:
            tables, b = self.tables, self.block
            bad = any(e > len(tables[s]) * b for s, e in zip(slots, new))
        else:
            bad = bool(new) and max(new) > self.block
        if bad or counts and min(counts) < 1:   # (the first slot's error, in slot order)
            for slot, n in zip(slots, counts or [1] * len(slots)):
                if n < 1:
                    raise ValueError(f"advance: slot {slot} keeps {n} rows")
                self._check_kept(slot, lens[slot] + n - 1)
        for s, e in zip(slots, new):
            lens[s] = e

    def _check_kept(self, slot: int, row: int) -> None:
        """A kept row must lie within the slot's blocks."""
        if row >= len(self.tables[slot]) * self.block:
            raise ValueError(f"slot {slot}: kept row {row} is past the cache "
                             f"({len(self.tables[slot]) * self.block} rows)")

    def commit_many(self, items: list[tuple[int, list[int]]]) -> None:
        """commit(slot, kept) for each (slot, kept) of distinct slots, the moves batched.
        Everything is checked before anything moves."""
        if len({slot for slot, _ in items}) != len(items):
            raise ValueError("commit_many: a slot appears twice")
        slots, dst, src = [], [], []
        lens, tables, block = self.lens, self.tables, self.block
        for slot, kept in items:
            n = len(kept)
            if not n:
                continue
            if kept[0] < 0 or n > 1 and any(b <= a for a, b in zip(kept, kept[1:])):
                raise ValueError(f"kept offsets must be ascending, got {kept}")
            base, last = lens[slot], kept[-1]
            if base + last >= len(tables[slot]) * block:
                self._check_kept(slot, base + last)   # (raises, naming the row)
            if last == n - 1:   # ascending from 0 to n - 1: all in place (most steps' rows)
                continue
            for j, o in enumerate(kept):   # a contiguous prefix is already in place
                if o != j:
                    slots.append(slot)
                    dst.append(base + j)
                    src.append(base + o)
        if slots:
            d, r = torch.tensor([self.index(slots, dst), self.index(slots, src)],
                                device=self.k_all.device)   # one copy
            for cache in (self.k_all, self.v_all):
                cache[:, d] = cache[:, r]   # (the right side is gathered first)
        for slot, kept in items:
            self.lens[slot] += len(kept)

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Storage rows src's keys and values into rows dst (index tensors of one shape on
        the cache's device, distinct dst rows), every layer at once, nothing checked nor read
        back: the grid step's moves, issued behind its forward (runtime/step/grid.py)."""
        for cache in (self.k_all, self.v_all):
            cache[:, dst] = cache[:, src]   # (the right side is gathered first)

    def truncate(self, slot: int, n: int) -> None:
        """Drop committed rows past n (rejected rows are simply forgotten)."""
        if n < 0 or n > self.lens[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lens[slot]} to {n}")
        self.lens[slot] = n

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k_all, self.v_all))


def row_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one KV row over all layers (keys and values)."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
