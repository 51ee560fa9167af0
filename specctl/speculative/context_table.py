"""Self-Draft's context cache as arrays (issue 52): a step's candidates for the whole batch are
one gather, a step's grams one scatter, so neither grows in Python with the batch (the dict
of context_cache.py is read and written a sequence, and a gram, at a time).

Per key token a ring of `lru` continuations of G tokens: conts[key, p], the newest at ptr[key]
- 1, `fill[key]` of them held, `newest[key]` their rows newest first. Where it differs from the
dict (ContextCache), and why that is safe: a gram pushed while its key holds it already keeps
its place (the dict makes it the newest; a gram a push repeats is pushed once, at its last
place). That changes only which candidates a step drafts, never what it emits (verification
keeps only the target's own tokens). Grams are told apart by a 64-bit hash of key and
continuation (one sort and one compare a gram, not five: a 25k-gram push of 256 prompts took
~20 ms): two that collide count as one, which again only changes the candidates. Row V is a
dump that no gather reads: writes that must not land go there, so no operation's shape depends
on the data.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch


_P = 0x9E3779B97F4A7C15   # (odd: each power is a unit mod 2^64)
_POWERS: dict[int, np.ndarray] = {}


def _powers(n: int) -> np.ndarray:
    """[n] P^(n-1), ..., P, 1 mod 2^64."""
    got = _POWERS.get(n)
    if got is None:
        got = _POWERS[n] = np.array([pow(_P, n - 1 - j, 1 << 64) for j in range(n)],
                                    dtype=np.uint64)
    return got


def _hash(grams: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each gram [K, 1 + G] (its key, then its continuation): its tokens as
    the digits of a number in base P, mod 2^64 (one product, not the 6 G operations of a
    mixing hash: a step's push took ~58 us of it in a run at b64). Two grams collide where
    their differences d (each |d_j| < vocabulary) give sum_j d_j P^(G-j) = 0 mod 2^64: by
    chance, for a fixed odd P; a collision only changes which candidates a step drafts."""
    return grams.astype(np.uint64) @ _powers(grams.shape[1])


class ContextTable:
    def __init__(self, vocab: int, lru: int, gram: int):
        self.V, self.R, self.G = vocab, lru, gram
        # (int32 tokens: ~8 MB at a 49k vocabulary, not 16; every page written now, as the
        # drafter is made: zeros are mapped lazily, and the run's first push, ~60 prompts'
        # grams scattered over the keys, paid ~26 ms of page faults inside a step)
        self.conts = np.empty((vocab + 1, lru, gram), dtype=np.int32)
        self.hash = np.empty((vocab + 1, lru), dtype=np.uint64)   # each held gram's _hash
        # each key's fill, then its continuations newest first, in one row (kept by push): a
        # step's candidates are one gather of a row a sequence, not a gather of its rows of
        # conts by `newest` and one of `fill` (in a run at b64, ~6 cache lines a sequence,
        # each cold after the forward, against 2); row V's continuations, the dump's, may go
        # stale: no key reads them
        self.ready = np.empty((vocab + 1, 1 + lru * gram), dtype=np.int32)
        for a in (self.conts, self.hash, self.ready):
            a.fill(0)
        self.ptr = np.zeros(vocab + 1, dtype=np.int64)
        self.fill = self.ready[:, 0]   # (a view: how many each key holds, kept in its row)
        self._ring = np.arange(lru)
        # each key's rows of conts newest first (key R + (ptr - 1 - i) % R for the i-th
        # newest), kept by push: a step's candidates are then two gathers, not the ring's
        # arithmetic over the batch (each numpy call of a step's plan costs ~5x in a run
        # what it costs warm, bench-results/2026-11-30-grid-host)
        self.newest = self._rows(np.arange(vocab + 1))
        self._dev: torch.Tensor | None = None   # (device_rows')
        self._on = None

    def device_rows(self, device: torch.device) -> torch.Tensor:
        """`ready` on `device`, where a grid step's forward gathers its candidates
        (runtime/step/grid.py): on a CPU `ready` itself, shared; elsewhere a copy made once
        and kept equal to it, each push's and trim's rows copied after them, in the device's
        stream order (a learning pushed while a forward runs reaches the next forward, as
        the host's table does)."""
        if device is self._on:   # (the last one asked for: a step's, each step)
            return self._dev
        dev, want = self._dev, torch.device(device)
        if dev is None or dev.device.type != want.type or \
                want.index not in (None, dev.device.index):   # ("cuda" is cuda:0's)
            dev = self._dev = torch.from_numpy(self.ready) if want.type == "cpu" else \
                torch.from_numpy(self.ready).to(want)
        self._on = device
        return dev

    def _sync(self, keys: np.ndarray | None) -> None:
        """keys' rows of `ready` (None: the fill of every key) into the device's copy."""
        dev = self._dev
        if dev is None or dev.device.type == "cpu":
            return
        # (non-blocking: a blocking copy from pageable memory waits for the forward in flight,
        # which the learning that pushed runs beside)
        to = dict(device=dev.device, non_blocking=True)
        if keys is None:
            dev[:, 0] = torch.from_numpy(np.ascontiguousarray(self.fill)).to(**to)
        else:
            dev[torch.from_numpy(keys).to(**to)] = torch.from_numpy(self.ready[keys]).to(**to)

    def candidates(self, keys: np.ndarray, limit: int,
                   depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The `limit` newest continuations of each key [B] (newest first), their first
        `depth` tokens (None: all G): ([B, C, depth] tokens, [B] how many each key holds: its
        first that many of the C are held), C = min(limit, lru)."""
        rows, C, G = self.ready[keys], min(limit, self.R), self.G
        cands = rows[:, 1:1 + C * G].reshape(len(rows), C, G)
        return (cands if depth is None or depth == G else cands[:, :, :depth]), rows[:, 0]

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        """[K, R] each key's rows of conts, newest first."""
        return keys[:, None] * self.R + (self.ptr[keys][:, None] - 1 - self._ring) % self.R

    def push(self, grams: np.ndarray) -> None:
        """Grams [K, 1 + G] (a key, then its continuation) in push order: each key keeps its
        newest `lru`; a gram its key holds already is not added again."""
        if not grams.shape[0]:
            return
        h = _hash(grams)
        keys, conts = grams[:, 0], grams[:, 1:]
        order = np.argsort(h, kind="stable")   # (a gram's repeats in push order)
        hs = h[order]
        again = np.zeros(len(h), dtype=bool)   # a gram this push repeats later
        again[order[:-1][hs[1:] == hs[:-1]]] = True
        if again.any():
            keys, conts, h = keys[~again], conts[~again], h[~again]
        K, R = keys.shape[0], self.R
        # (a key's held grams: its first fill rows newest first)
        held = ((self.hash.reshape(-1)[self.newest[keys]] == h[:, None]) &
                (self._ring < self.fill[keys][:, None])).any(1)
        keys = np.where(held, self.V, keys)
        order = np.argsort(keys, kind="stable")   # (push order within a key)
        ks = keys[order]
        idx = np.arange(K)
        first = np.ones(K, dtype=bool)
        first[1:] = ks[1:] != ks[:-1]
        rank = idx - np.maximum.accumulate(np.where(first, idx, 0))   # within its key
        before = self.ptr[ks]
        starts = np.flatnonzero(first)
        sizes = np.diff(np.append(starts, K))   # each key's grams in this push
        touched = ks[starts]
        self.ptr[touched] += sizes              # (keys distinct there: np.add.at costs ~1 us
        n = np.repeat(sizes, sizes)             # a gram)
        land = np.where(rank >= n - R, ks, self.V)   # (only a key's last R land)
        at = (before + rank) % R
        self.conts[land, at] = conts[order]
        self.hash[land, at] = h[order]
        self.fill[ks] = np.minimum(self.fill[ks] + n, R)
        self.newest[touched] = self._rows(touched)
        self._ready(touched)

    def _ready(self, keys: np.ndarray) -> None:
        """keys' continuations in `ready`, newest first, from conts."""
        self.ready[keys, 1:] = self.conts.reshape(-1, self.G)[self.newest[keys]].reshape(
            len(keys), -1)
        self._sync(keys)   # (their fill too: push set it before)

    def push_many(self, grams) -> None:
        """push of (key, continuation) pairs, in order (ContextCache's call)."""
        grams = list(grams)
        if grams:
            self.push(np.fromiter(chain.from_iterable((k, *c) for k, c in grams), np.int64,
                                  len(grams) * (1 + self.G)).reshape(len(grams), 1 + self.G))

    def push_texts(self, texts: list[list[int]]) -> None:
        """The grams of each text (every window of G + 1 tokens: its first the key), the
        texts in order: ContextCache.push_many of each text's grams, one array pass."""
        g = self.G
        if not texts:
            return
        lens = np.fromiter(map(len, texts), np.int64, len(texts))
        flat = np.fromiter(chain.from_iterable(texts), np.int64, int(lens.sum()))
        start = np.concatenate([[0], np.cumsum(lens)[:-1]])
        n = np.maximum(lens - g, 0)   # windows a text makes
        at = np.repeat(start - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(n.sum())
        self.push(flat[at[:, None] + np.arange(g + 1)])

    def get(self, key: int, limit: int) -> list[tuple[int, ...]]:
        """One key's newest `limit` continuations (ContextCache.get: the per-sequence path)."""
        if limit <= 0 or not 0 <= key < self.V:
            return []
        c, held = self.candidates(np.array([key]), limit)
        return [tuple(t) for t in c[0][:held[0]].tolist()]

    def trim(self, keep: int) -> None:
        """Every key keeps only its `keep` newest continuations."""
        np.minimum(self.fill, keep, out=self.fill)
        self._sync(None)

    def __len__(self) -> int:
        return int(self.fill[:self.V].sum())
