"""Self-Draft's job cache as arrays, for the grid (issue 52): a step's job-cache candidates for
the whole batch are one matrix product and a few gathers, not ~3 dict probes a sequence.

What the job cache (job_cache.py) keeps, in the form the grid reads: every text indexed (the
run's prompts, its finished answers) appended to a token buffer, texts separated by -1; for
each position j of a text and each key length k in min_key..max_key, the key (the k tokens
before j) maps to j, the start of its continuation. A step's lookup hashes each sequence's
last max_key .. min_key tokens at once ([B, max_key] tokens times a fixed [max_key, keys]
matrix of powers: each column the hash of one suffix), probes them all, and takes the longest
present: its continuation is the buffer's next G tokens.

Where it differs from the dict, and why that is safe: a key keeps only its latest occurrence
(the dict keeps its `nexts` most frequent next tokens), and keys live in a fixed table of
2^SLOT_BITS entries where a newer key takes a colliding slot; a key is a 64-bit hash of its
tokens and length (two that collide count as one). Each only changes which tokens a step
drafts: verification keeps only the target's own, so never an answer. A continuation that
runs past its text reads the separator, drafted as token 0 (a real token: the forward must
see a valid id), never accepted unless the target's own token is 0.

Memory bound: the table is 2^SLOT_BITS x 16 bytes (16 MB); the buffer holds at most
max_tokens tokens (int32: 8 MB at the defaults), past which its oldest half is dropped with
every key pointing into it (their positions fall below `base`: read as absent). A text writes
up to 7 keys a token, so a full table holds the keys of the newest ~150k-250k tokens (the
dict's bound, max_keys, is 2^18 keys): older text is kept in the buffer but mostly not found.
A grid chain is the step's G tokens (`gram`), not job_len: it may run past its text's end.
(A slot written twice in one pass keeps the later write: numpy assigns repeated indices in
order; were it not so, a key would only draft another key's text.)
"""

from __future__ import annotations

import numpy as np

from specctl.speculative.context_table import _P, _powers
from specctl.speculative.job_cache import JobCache, JobCacheParams

SLOT_BITS = 20
LOAD_PASS = 1 << 16   # tokens a file's texts are indexed in at once (from_job_cache)
_LEN = 0xC2B2AE3D27D4EB4F   # (odd: mixes a key's length into its hash, so "a b" and "0 a b"
                            # hash apart although a leading 0 adds nothing to the polynomial)


def last_tokens(seq, k: int) -> list[int]:
    """A sequence's last k tokens, its prompt's before its answer's (fewer where it has
    fewer): what a job or corpus cache's keys are looked up from."""
    a = seq.out_ids
    return a[-k:] if len(a) >= k else seq.prompt_ids[len(a) - k:] + a


class JobTable:
    def __init__(self, params: JobCacheParams = JobCacheParams()):
        self.prm = params
        self.K, self.lo = params.max_key, params.min_key
        size = 1 << SLOT_BITS
        # (every page written now, as the drafter is made, as ContextTable's: zeros mapped
        # lazily made a run's first 128 prompts' indexing ~20x dearer, in page faults)
        self.keys = np.empty(size, dtype=np.uint64)
        self.keys.fill(0)
        self.pos = np.full(size, -1, dtype=np.int64)   # absolute position; -1: empty
        self.buf = np.full(params.max_tokens + params.cont_len + 1, -1, dtype=np.int32)
        self.n = 0      # tokens in buf
        self.base = 0   # the absolute position of buf[0]
        self.used = 0   # keys written (a count of writes: 0, nothing to look up)
        # [K, keys]: column c the powers that hash the last lo + c tokens of K
        lens = np.arange(self.lo, self.K + 1)
        self.lens = lens.astype(np.uint64)
        w = np.zeros((self.K, len(lens)), dtype=np.uint64)
        for c, k in enumerate(lens):
            w[self.K - k:, c] = _powers(int(k))
        self.w = w

    def __len__(self) -> int:
        """The keys held (a scan of the table: for a log line, not a step)."""
        return int(np.count_nonzero(self.pos >= self.base))

    def _mix(self, h: np.ndarray, k) -> np.ndarray:
        return h * np.uint64(_P) + np.asarray(k, dtype=np.uint64) * np.uint64(_LEN)

    def _slot(self, h: np.ndarray) -> np.ndarray:
        return (h >> np.uint64(64 - SLOT_BITS)).astype(np.int64)

    def add(self, ids) -> None:
        """Index one text (a prompt or a finished answer): its keys and its tokens."""
        self.add_many([ids])

    def add_many(self, texts) -> None:
        """Index texts in order, in one pass over all of them (a text at a time, a short
        prompt's ~40 array calls cost more than the dict's probes: a b32 run's prefills
        took 1.8x `ar`'s on the host-charged clock)."""
        flat: list[int] = []
        for t in texts:   # (each text, then -1: lists, as they come, joined in Python)
            if len(t):
                flat += t if isinstance(t, list) else list(t)
                flat.append(-1)
        if not flat:
            return
        ids = np.array(flat, dtype=np.int64)
        if len(ids) > self.prm.max_tokens:   # (the newest texts: what later text continues)
            ids = ids[len(ids) - self.prm.max_tokens:]
        while self.n and self.n + len(ids) > self.prm.max_tokens:
            self._drop_old_text()
        start = self.base + self.n
        self.buf[self.n:self.n + len(ids)] = ids
        self.n += len(ids)
        sep = ids < 0
        with np.errstate(over="ignore"):
            for k in range(self.lo, min(self.K, len(ids) - 1) + 1):
                # the key before each j = k .. len - 1: within one text, and followed by one
                # of its tokens (no separator among its k + 1)
                cut = np.lib.stride_tricks.sliding_window_view(sep, k + 1).any(axis=1)
                j = np.flatnonzero(~cut) + k
                if not len(j):
                    continue
                win = np.lib.stride_tricks.sliding_window_view(ids[:-1], k)[j - k]
                h = self._mix(win.astype(np.uint64) @ _powers(k), k)
                slot = self._slot(h)
                self.keys[slot] = h   # (a repeated slot: the later write, the newer key, stays)
                self.pos[slot] = start + j
                self.used += len(h)

    def _drop_old_text(self) -> None:
        """The buffer's oldest half goes; keys pointing into it read as absent (pos < base)."""
        cut = (self.n + 1) // 2
        self.buf[:self.n - cut] = self.buf[cut:self.n]
        self.buf[self.n - cut:self.n] = -1
        self.n -= cut
        self.base += cut

    def _find(self, tails: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """tails [B, K]: each sequence's last K tokens (-1 before its first): ([B] where in
        buf the continuation of its longest key present starts, else n, [B] whether it has
        one)."""
        pad = (tails < 0).sum(axis=1)
        valid = (self.K - self.lens.astype(np.int64))[None, :] >= pad[:, None]   # [B, keys]
        with np.errstate(over="ignore"):
            h = self._mix(np.maximum(tails, 0).astype(np.uint64) @ self.w, self.lens)
        slot = self._slot(h)
        p = self.pos[slot]
        hit = valid & (self.keys[slot] == h) & (p >= self.base)
        found = hit.any(axis=1)
        longest = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)    # the longest present
        return np.where(found, p[np.arange(len(tails)), longest] - self.base, self.n), found

    def match(self, tails: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray]:
        """([B, G] the continuation of each sequence's longest key present, its text's
        separator as token 0 and the next text's tokens after it, [B] whether it has one) of
        tails [B, K] (_find)."""
        at, found = self._find(tails)   # (past the buffer's end: its last slot, always -1)
        at = np.minimum(at[:, None] + np.arange(G), len(self.buf) - 1)
        return np.maximum(self.buf[at], 0), found

    def lookup(self, context, limit: int) -> list[tuple[int, ...]]:
        """JobCache.lookup's: the continuation (at most one, up to cont_len tokens, cut at
        its text's end) of the context's longest key present, for a step off the grid."""
        if limit <= 0 or not self.used or len(context) < self.lo:
            return []
        got = [int(t) for t in context[-self.K:]]
        tail = np.full((1, self.K), -1, dtype=np.int64)
        tail[0, self.K - len(got):] = got
        at, found = self._find(tail)
        if not found[0]:
            return []
        cont = self.buf[at[0]:at[0] + self.prm.cont_len].tolist()
        cont = cont[:cont.index(-1)] if -1 in cont else cont
        return [tuple(cont)] if cont else []

    def tails(self, seqs) -> np.ndarray:
        """[B, K] each sequence's last K tokens, its prompt's before its answer's (-1 before
        the first)."""
        K = self.K   # (lists joined in one array call: a row's assignment a sequence took
        # ~130 us of a b64 step's plan in a run)
        return np.array([t if len(t) == K else [-1] * (K - len(t)) + t
                         for t in (last_tokens(s, K) for s in seqs)], dtype=np.int64)

    def texts(self) -> list[np.ndarray]:
        """The texts held, oldest first (the first may be the end of one cut by the bound)."""
        return self._split(self.buf[:self.n])

    @classmethod
    def from_job_cache(cls, cache: JobCache) -> "JobTable":
        """The same texts (a loaded --job-cache-file's) indexed as arrays, in passes of
        about LOAD_PASS tokens (one pass over a full buffer's 2^21 would hold ~256 MB of
        windows at once)."""
        t, part, size = cls(cache.prm), [], 0
        for text in cls._split(np.asarray(cache.buf, dtype=np.int64)):
            part.append(text)
            size += len(text)
            if size >= LOAD_PASS:
                t.add_many(part)
                part, size = [], 0
        t.add_many(part)
        return t

    def to_job_cache(self) -> JobCache:
        """The same texts indexed as the dict's (what --job-cache-file saves)."""
        c = JobCache(self.prm)
        for text in self.texts():
            c.add(text.tolist())
        return c

    @staticmethod
    def _split(buf: np.ndarray) -> list[np.ndarray]:
        return [t for t in np.split(buf, np.flatnonzero(buf < 0) + 1)
                for t in [t[t >= 0]] if len(t)]
