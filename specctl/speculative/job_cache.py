"""Self-Draft's job cache: n-gram tables over a job's own prompts and finished answers, built as
the job runs, so that a job whose answers repeat each other (the same JSON keys, the same
sentence frames, text copied from the input) drafts long stretches of them.

Structure (the corpus cache's, corpus_cache.py, learnt online): every text indexed is appended
to a token buffer (texts separated by -1); for each position j of it and each key length k in
min_key..max_key, the key (its k tokens before j) maps to up to `nexts` next tokens, each with
its count and the buffer position of its latest occurrence, highest count first. A lookup
finds the longest of the context's last min_key..max_key tokens that is a key (longest match
first) by a binary search on k (a key's suffixes are keys too): ~3 dict probes. Its
continuations are the buffer's text after each next token's latest occurrence, up to
`cont_len` tokens and never past the end of its text: a slice, no further probes. Keys are
Python's hash of the token tuple (deterministic for ints; a collision costs a wrong draft,
which verification rejects: never a wrong token).

Memory bound (enforced on every `add`): at most `max_keys` keys, each with at most `nexts`
entries, and at most `max_tokens` buffered tokens. Over max_keys, the least frequent keys (the
count of their top entry; the oldest first among equals) are dropped down to 3/4 of it; over
max_tokens, the oldest half of the buffer is dropped with every entry pointing into it. Both
are one pass over the tables, paid once per max_keys / 4 new keys (or max_tokens / 2 tokens)
and only inside `add` (a finished answer or an admitted prompt), never in a step's lookup.
At the defaults (2^18 keys, nexts 3, 2^21 tokens) that is at most ~80 MB of Python objects
(~250 B a full key, 8 B a token; tests/test_job_cache.py measures it).

The cache is one per run and process: shared by every sequence of the run and kept across its
prompts; under torchrun or Ray each process keeps its own (sharing one would need a service the
processes query every step, or tables merged between steps: see docs/self-draft.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class JobCacheParams:
    min_key: int = 2           # shortest key (one-token keys are the context cache's)
    max_key: int = 8           # longest key
    cont_len: int = 16         # tokens a continuation drafts at most
    nexts: int = 3             # next tokens kept per key (highest count first)
    max_keys: int = 1 << 18    # the bound on keys ...
    max_tokens: int = 1 << 21  # ... and on buffered tokens

    def __post_init__(self):
        if not 1 <= self.min_key <= self.max_key:
            raise ValueError("job cache keys: need 1 <= min_key <= max_key")
        for name in ("cont_len", "nexts"):
            if getattr(self, name) < 1:
                raise ValueError(f"job cache {name} must be >= 1")
        if self.max_keys < 16 or self.max_tokens < 64:
            raise ValueError("job cache bounds too small (max_keys >= 16, max_tokens >= 64)")


class JobCache:
    """See the module docstring. `add(ids)` indexes a text; `lookup(context, limit)` gives up
    to `limit` continuations of the context, most frequent first."""

    def __init__(self, params: JobCacheParams = JobCacheParams()):
        self.prm = params
        # hash(key tokens) -> [tok, count, pos, tok, count, pos, ...] (count descending)
        self.table: dict[int, list[int]] = {}
        self.buf: list[int] = []
        self.added = 0   # texts indexed

    def __len__(self) -> int:
        return len(self.table)

    def add(self, ids) -> None:
        """Index one text (a prompt or a finished answer): its n-grams and its tokens."""
        ids = [int(t) for t in ids]
        if not ids:
            return
        p, table = self.prm, self.table
        base = len(self.buf)
        self.buf += ids
        self.buf.append(-1)
        lo, hi, room = p.min_key, p.max_key, 3 * p.nexts
        for j in range(lo, len(ids)):
            nxt, pos = ids[j], base + j
            for k in range(lo, min(hi, j) + 1):
                h = hash(tuple(ids[j - k:j]))
                v = table.get(h)
                if v is None:
                    table[h] = [nxt, 1, pos]
                    continue
                for i in range(0, len(v), 3):
                    if v[i] == nxt:
                        v[i + 1] += 1
                        v[i + 2] = pos
                        while i and v[i - 2] < v[i + 1]:   # keep counts descending
                            v[i - 3:i + 3] = v[i:i + 3] + v[i - 3:i]
                            i -= 3
                        break
                else:
                    if len(v) < room:
                        v += (nxt, 1, pos)
                    else:   # (the least frequent entry gives way: recent text counts)
                        v[-3:] = (nxt, 1, pos)
        self.added += 1
        if len(self.buf) > p.max_tokens:
            self._drop_old_text()
        if len(table) > p.max_keys:
            self._drop_rare_keys()

    def add_many(self, texts) -> None:
        """Index texts in order (add's, one at a time)."""
        for ids in texts:
            self.add(ids)

    def lookup(self, context, limit: int) -> list[tuple[int, ...]]:
        """Up to `limit` continuations (tuples of at most cont_len tokens) of the context's
        longest key present (its last max_key .. min_key tokens), highest count first."""
        p, table = self.prm, self.table
        if limit <= 0 or not table:
            return []
        tail = tuple(context[-p.max_key:])
        # a key's suffixes were indexed with it, so presence falls with k: a binary search
        # for the longest key present (~3 probes; the pruning may hide a longer one)
        lo, hi, v = p.min_key, len(tail), None
        while lo <= hi:
            k = (lo + hi) // 2
            w = table.get(hash(tail[-k:]))
            if w is None:
                hi = k - 1
            else:
                lo, v = k + 1, w
        if v is None:
            return []
        buf, out = self.buf, []
        for i in range(0, min(len(v), 3 * limit), 3):
            s = buf[v[i + 2]:v[i + 2] + p.cont_len]
            if -1 in s:
                s = s[:s.index(-1)]
            out.append(tuple(s))
        return out

    # -- the bound ------------------------------------------------------------------------------
    def _drop_rare_keys(self) -> None:
        table, keep = self.table, self.prm.max_keys * 3 // 4
        n = len(table)
        top = np.fromiter((v[1] for v in table.values()), dtype=np.int64, count=n)
        keys = list(table)
        # (stable: among keys of equal count the oldest, first inserted, go first)
        for i in np.argsort(top, kind="stable")[:n - keep].tolist():
            del table[keys[i]]

    def _drop_old_text(self) -> None:
        cut = len(self.buf) // 2
        self.buf = self.buf[cut:]
        dead = []
        for h, v in self.table.items():
            kept = []
            for i in range(0, len(v), 3):
                if v[i + 2] >= cut:
                    kept += (v[i], v[i + 1], v[i + 2] - cut)
            if not kept:
                dead.append(h)
            elif len(kept) != len(v) or kept[2] != v[2]:
                v[:] = kept
        for h in dead:
            del self.table[h]

    # -- saving and loading (runtime/jobs: --job-cache PATH) -------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """The cache as flat int64 arrays (keys [n], offsets [n + 1], entries [m, 3], buf)."""
        keys = np.fromiter(self.table.keys(), dtype=np.int64, count=len(self.table))
        lens = np.fromiter((len(v) // 3 for v in self.table.values()), dtype=np.int64,
                           count=len(self.table))
        flat = [x for v in self.table.values() for x in v]
        return {"keys": keys, "offsets": np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                "entries": np.asarray(flat, dtype=np.int64).reshape(-1, 3),
                "buf": np.asarray(self.buf, dtype=np.int64)}

    @classmethod
    def from_arrays(cls, params: JobCacheParams, a: dict[str, np.ndarray]) -> "JobCache":
        """A cache from `arrays`' output, every field checked (ValueError when malformed)."""
        keys, off, ent, buf = a["keys"], a["offsets"], a["entries"], a["buf"]
        n = keys.shape[0]
        if (keys.ndim != 1 or off.shape != (n + 1,) or ent.ndim != 2 or ent.shape[1] != 3
                or buf.ndim != 1 or int(off[0]) != 0 or int(off[-1]) != ent.shape[0]
                or (n and np.any(np.diff(off) <= 0)) or (n and np.diff(off).max() > params.nexts)
                or n > params.max_keys or buf.shape[0] > params.max_tokens
                or len(np.unique(keys)) != n):
            raise ValueError("job cache arrays do not fit together or exceed the bounds")
        if ent.size and (ent[:, 0].min() < 0 or ent[:, 1].min() < 1 or ent[:, 2].min() < 0
                         or ent[:, 2].max() >= buf.shape[0]):
            raise ValueError("job cache entries: a negative token or count, or a position "
                             "outside the buffer")
        if buf.size and buf.min() < -1:
            raise ValueError("job cache buffer: token ids must be >= 0 (-1 separates texts)")
        c = cls(params)
        flat = ent.tolist()
        ov = off.tolist()
        c.table = {int(h): [x for e in flat[ov[i]:ov[i + 1]] for x in e]
                   for i, h in enumerate(keys.tolist())}
        c.buf = buf.tolist()
        return c
