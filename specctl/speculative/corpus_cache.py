"""Self-Draft's corpus n-gram cache at decode time (built offline by `specctl build-cache`).

For each key length k in 1..max_key_len the artifact holds a table of keys (k token ids) and,
per key, its most frequent continuations (gram_len token ids each) with their corpus counts,
highest count first (ties: smaller token ids first). `CorpusCache.lookup(context)` tries the
last max_key_len tokens of the context as a key, then one fewer, ..., down to the last token,
and returns up to `limit` distinct continuations in that order, no loop over a table: per key
length an in-memory filter bit (built at load from the keys), and a binary search on the key's
hash only where the filter says the key may be there; a one-token key's row is kept once
found.

The artifact folder (`<store>/ngram-caches/<id>/`) holds:

    ngram.safetensors   per k, flat arrays (int32 / int64 only, no pickle, read through mmap):
        k{k}.key_hash [n_k]        int64   uint64 hash of the key (see `hash_keys`), sorted as
                                           unsigned, ties by key tokens
        k{k}.keys     [n_k, k]     int32   the key's tokens (a hash collision can never match)
        k{k}.offsets  [n_k + 1]    int64   key i owns continuations offsets[i]:offsets[i+1]
        k{k}.conts    [m_k, g]     int32   continuations
        k{k}.counts   [m_k]        int32   their counts in the corpus
      and its `__metadata__` repeats config.json (so the file alone is self-describing)
    config.json         max_key_len, gram_len, top, min_count, tokenizer_fingerprint, tokenizer
    manifest.json       the store's manifest (corpus, counts, build time)

The cache depends on the tokenizer only: `models.fingerprint.tokenizer_fingerprint` names it, and
`runtime.jobs.artifacts.resolve_corpus_cache` refuses a cache made with another tokenizer.
"""

from __future__ import annotations

import json
import mmap
import struct
from bisect import bisect_left
from pathlib import Path
from typing import Iterable

import numpy as np

from specctl.errors import SpecctlError
from specctl.io.schema import SchemaError, fields, integer, string

ARTIFACT_FILE = "ngram.safetensors"
CONFIG_FILE = "config.json"
KIND = "ngram-caches"
FORMAT_VERSION = 1

_M = (1 << 64) - 1
_SEED = 0x9E3779B97F4A7C15
_MUL = 0xFF51AFD7ED558CCD
_F1 = 0xBF58476D1CE4E5B9
_F2 = 0x94D049BB133111EB
# the lookup filter's hash (_Table.may_hold): odd multipliers per token from the end, then
# Fibonacci hashing (the high bits of a product), in exact Python ints and wrapping numpy alike
_FP = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F) + tuple(
    (0x165667B1 + 0x1000193 * i) | 1 for i in range(60))
_FIB = 0x9E3779B97F4A7C15


# ---------------------------------------------------------------------------------------------
# the key hash: the same function vectorized (build) and scalar (lookup)


def hash_key(key: list[int]) -> int:
    """uint64 hash (as a Python int) of one key, its tokens taken last first."""
    h = _SEED
    for t in reversed(key):
        h = ((h ^ (t & 0xFFFFFFFF)) * _MUL) & _M
        h ^= h >> 32
    return _finish(h)


def _finish(h: int) -> int:
    h ^= h >> 30
    h = (h * _F1) & _M
    h ^= h >> 27
    h = (h * _F2) & _M
    return h ^ (h >> 31)


def hash_keys(keys: np.ndarray) -> np.ndarray:
    """Vectorized `hash_key` over the rows of an int array [n, k]; returns uint64 [n]."""
    keys = np.asarray(keys)
    h = np.full(keys.shape[0], _SEED, dtype=np.uint64)
    mul = np.uint64(_MUL)
    s32 = np.uint64(32)
    for j in range(keys.shape[1] - 1, -1, -1):
        t = keys[:, j].astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
        h ^= t
        h *= mul
        h ^= h >> s32
    h ^= h >> np.uint64(30)
    h *= np.uint64(_F1)
    h ^= h >> np.uint64(27)
    h *= np.uint64(_F2)
    h ^= h >> np.uint64(31)
    return h


# ---------------------------------------------------------------------------------------------
# safetensors through mmap (validated: the file may come from elsewhere)


_DTYPES = {"I32": np.int32, "I64": np.int64, "U64": np.uint64}
_MAX_HEADER = 64 << 20


def read_safetensors_mmap(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Arrays (read-only views over an mmap of the file) and the metadata of a safetensors
    file holding int32/int64/uint64 tensors. Anything malformed is a SpecctlError."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise SpecctlError(f"{path}: file not found") from None
    with f:
        size = f.seek(0, 2)
        f.seek(0)
        if size < 8:
            raise SpecctlError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(_MAX_HEADER, size - 8):
            raise SpecctlError(f"{path}: not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SpecctlError(f"{path}: not a safetensors file (bad header)") from None
        if not isinstance(header, dict):
            raise SpecctlError(f"{path}: not a safetensors file (bad header)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 0 else b""
    base = 8 + n
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SpecctlError(f"{path}: bad __metadata__")
    arrays = {}
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(x) for x in info["shape"])
            a, b = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SpecctlError(f"{path}: tensor {name!r}: unsupported dtype or bad entry") from None
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if (any(x < 0 for x in shape) or a < 0 or b < a or base + b > size
                or (b - a) != count * np.dtype(dtype).itemsize):
            raise SpecctlError(f"{path}: tensor {name!r}: offsets do not fit its shape or the file")
        arr = np.frombuffer(mm, dtype=dtype, count=count, offset=base + a) if count else \
            np.zeros(0, dtype=dtype)
        arrays[name] = arr.reshape(shape)
    return arrays, meta


# ---------------------------------------------------------------------------------------------
# the cache


class _Table:
    __slots__ = ("hashes", "keys", "offsets", "conts", "counts", "hv", "ov", "bits", "shift")

    def __init__(self, hashes, keys, offsets, conts, counts):
        self.hashes, self.keys, self.offsets, self.conts, self.counts = (
            hashes, keys, offsets, conts, counts)
        self.hv = self.ov = self.bits = None
        self.shift = 64

    def finish(self) -> None:
        """Unsigned hashes, memoryviews for the lookup (bisect and indexing on them give
        Python ints, several times faster than numpy scalars for one key), and the filter."""
        self.hashes = self.hashes.view(np.uint64)
        self.hv = memoryview(np.ascontiguousarray(self.hashes))
        self.ov = memoryview(np.ascontiguousarray(self.offsets))
        n, k = self.keys.shape
        m = max(6, int(16 * n - 1).bit_length())   # >= 16 bits a key: ~6% false positives
        s = np.zeros(n, dtype=np.uint64)
        for i in range(k):   # the key's last token first, as lookup's sums
            s += ((self.keys[:, k - 1 - i].astype(np.int64).astype(np.uint64)
                   & np.uint64(0xFFFFFFFF)) * np.uint64(_FP[i]))
        self.shift = 64 - m
        s *= np.uint64(_FIB)
        s >>= np.uint64(self.shift)   # each key's bit
        bits = np.zeros(1 << (m - 3), dtype=np.uint8)
        for j in range(8):   # (a bit position at a time: ~24 bytes a key at the peak, 2 kept)
            bits[s[(s & np.uint64(7)) == j] >> np.uint64(3)] |= np.uint8(1 << j)
        self.bits = bits.tobytes()

    def may_hold(self, s: int) -> bool:
        """False when no key of the table has filter sum s (lookup's): no search needed.
        (An in-memory bit per hashed key: most contexts' longer keys are absent, and a
        bisect over the mmapped hashes costs ~1.5 us a key with the caches cold.)"""
        i = ((s * _FIB) & _M) >> self.shift
        return (self.bits[i >> 3] >> (i & 7)) & 1 == 1


class CorpusCache:
    """The corpus n-gram cache of one artifact (see the module docstring)."""

    def __init__(self, tables: dict[int, _Table], config: dict, path: Path | None = None):
        self.tables = tables
        self.config = config
        self.path = path
        self.max_key_len = int(config["max_key_len"])
        self.gram_len = int(config["gram_len"])
        self.tokenizer_fingerprint = str(config["tokenizer_fingerprint"])
        self.tokenizer = str(config.get("tokenizer", ""))
        # _conts of one-token keys, kept once found (at most a token's few continuations for
        # each token of the vocabulary; their slice of the mmapped table cost ~1 us a lookup)
        self._first: dict[int, tuple[tuple[int, ...], ...]] = {}

    # -- loading

    @classmethod
    def load(cls, path: Path | str, verify: bool = True) -> "CorpusCache":
        """Open an artifact folder (or its ngram.safetensors). `verify` checks every table's
        shapes, order and hashes (linear in the table size, once)."""
        path = Path(path).expanduser()
        st = path / ARTIFACT_FILE if path.is_dir() else path
        if not st.is_file():
            raise SpecctlError(f"{path}: not an n-gram cache (no {ARTIFACT_FILE}); "
                               "make one with `specctl build-cache`")
        arrays, meta = read_safetensors_mmap(st)
        try:
            config = json.loads(meta["config"])
        except (KeyError, TypeError, ValueError):
            raise SpecctlError(f"{st}: not an n-gram cache (no usable config in its metadata)") from None
        check_config(config, st)
        kmax, g = config["max_key_len"], config["gram_len"]
        tables = {}
        for k in range(1, kmax + 1):
            try:
                t = _Table(arrays[f"k{k}.key_hash"], arrays[f"k{k}.keys"], arrays[f"k{k}.offsets"],
                           arrays[f"k{k}.conts"], arrays[f"k{k}.counts"])
            except KeyError as e:
                raise SpecctlError(f"{st}: missing tensor {e.args[0]}") from None
            _check_table(st, k, g, t, verify)
            t.finish()
            tables[k] = t
        return cls(tables, config, path)

    # -- lookup

    def lookup(self, context: list[int], limit: int = 3) -> list[list[int]]:
        """Up to `limit` distinct continuations (lists of gram_len token ids) of `context`:
        longest key first (its last max_key_len tokens, then fewer), within a key higher count
        first."""
        out: list[list[int]] = []
        kmax = min(self.max_key_len, len(context))
        if limit <= 0 or kmax == 0:
            return out
        tail = [int(t) for t in context[-kmax:]]
        sums, s = [], 0   # the filter sums of the last 1..kmax tokens
        for i, t in enumerate(reversed(tail)):
            s += (t & 0xFFFFFFFF) * _FP[i]
            sums.append(s)
        seen: set[tuple[int, ...]] = set()
        for k in range(kmax, 0, -1):
            for tc in self._conts(k, tail, sums[k - 1]):
                if tc not in seen:
                    seen.add(tc)
                    out.append(list(tc))
                    if len(out) >= limit:
                        return out
        return out

    def _conts(self, k: int, tail: list[int], s: int) -> tuple[tuple[int, ...], ...]:
        """The continuations of the key tail[-k:] (its filter sum s), () when it is absent.
        (_Table.may_hold inline: most keys are absent, and a call cost a lookup ~15%.)"""
        if k == 1 and (c := self._first.get(tail[-1])) is not None:
            return c
        t = self.tables[k]
        h = ((s * _FIB) & _M) >> t.shift
        i = _row(t, tail[-k:]) if (t.bits[h >> 3] >> (h & 7)) & 1 else -1
        c = tuple(map(tuple, t.conts[t.ov[i]:t.ov[i + 1]].tolist())) if i >= 0 else ()
        if k == 1:
            self._first[tail[-1]] = c
        return c

    def entries(self, key: list[int]) -> list[tuple[list[int], int]]:
        """(continuation, count) pairs stored for exactly this key (diagnostics and tests)."""
        k = len(key)
        if k not in self.tables:
            return []
        t = self.tables[k]
        i = _row(t, [int(x) for x in key])
        if i < 0:
            return []
        a, b = t.ov[i], t.ov[i + 1]
        return list(zip(t.conts[a:b].tolist(), t.counts[a:b].tolist()))

    def max_token(self) -> int:
        """The largest token id in any key or continuation (-1 when empty)."""
        return max([int(a.max()) for t in self.tables.values() for a in (t.keys, t.conts)
                    if a.size] or [-1])

    def num_keys(self, k: int | None = None) -> int:
        ks = [k] if k else list(self.tables)
        return sum(int(self.tables[j].hashes.shape[0]) for j in ks)

    def num_grams(self, k: int | None = None) -> int:
        ks = [k] if k else list(self.tables)
        return sum(int(self.tables[j].counts.shape[0]) for j in ks)

    def __repr__(self) -> str:
        return (f"CorpusCache({self.path}, k<={self.max_key_len}, g={self.gram_len}, "
                f"{self.num_keys()} keys, {self.num_grams()} grams)")


def _row(t: _Table, key: list[int]) -> int:
    """The row of `key` in its table, or -1: a binary search on its hash, then its tokens
    compared (a hash collision can never match)."""
    h = hash_key(key)
    hv = t.hv
    i = bisect_left(hv, h)
    while i < len(hv) and hv[i] == h:
        if t.keys[i].tolist() == key:
            return i
        i += 1
    return -1


def _check_table(st: Path, k: int, g: int, t: _Table, full: bool) -> None:
    def bad(what: str):
        raise SpecctlError(f"{st}: table k={k}: {what}")
    n = t.hashes.shape[0]
    if t.hashes.dtype != np.int64 or t.hashes.ndim != 1:
        bad("key_hash must be int64 [n]")
    if t.keys.dtype != np.int32 or t.keys.shape != (n, k):
        bad(f"keys must be int32 [{n}, {k}]")
    if t.offsets.dtype != np.int64 or t.offsets.shape != (n + 1,):
        bad(f"offsets must be int64 [{n + 1}]")
    m = t.counts.shape[0]
    if t.counts.dtype != np.int32 or t.counts.ndim != 1:
        bad("counts must be int32 [m]")
    if t.conts.dtype != np.int32 or t.conts.shape != (m, g):
        bad(f"conts must be int32 [{m}, {g}]")
    if int(t.offsets[0]) != 0 or int(t.offsets[-1]) != m:
        bad("offsets must start at 0 and end at the number of continuations")
    if not full:
        return
    if n and np.any(np.diff(t.offsets) <= 0):
        bad("offsets must increase (every key has a continuation)")
    u = t.hashes.view(np.uint64)
    if n > 1 and np.any(u[1:] < u[:-1]):
        bad("key hashes are not sorted")
    if n and not np.array_equal(hash_keys(t.keys), u):
        bad("key hashes do not match the keys")
    if (t.keys.size and t.keys.min() < 0) or (t.conts.size and t.conts.min() < 0):
        bad("negative token ids")
    if m and t.counts.min() <= 0:
        bad("counts must be positive")


# ---------------------------------------------------------------------------------------------
# finding the cache for a model


# config.json (and the artifact's metadata): what the tables were counted with (write_artifact)
CONFIG_SCHEMA = {"max_key_len": integer(1, 64), "gram_len": integer(1, 64),
                 "tokenizer_fingerprint": string(nonempty=True)}
CONFIG_OPTIONAL = {"format": integer(1), "top": integer(1), "min_count": integer(1),
                   "tokenizer": string()}


def check_config(config, where) -> dict:
    """An n-gram cache's config, every field checked (never coerced): SpecctlError naming
    `where` (the file) and the field."""
    try:
        fields(config, CONFIG_SCHEMA, CONFIG_OPTIONAL, what="n-gram cache config")
    except SchemaError as e:
        raise SpecctlError(f"{where}: not an n-gram cache config: {e}") from None
    if config.get("format", FORMAT_VERSION) > FORMAT_VERSION:
        raise SpecctlError(f"{where}: n-gram cache format {config['format']} is newer than this "
                           "specctl understands; upgrade specctl")
    return config


def read_config(path: Path) -> dict:
    """config.json of an artifact folder (or the metadata of a bare .safetensors), checked."""
    path = Path(path)
    if path.is_dir():
        cf = path / CONFIG_FILE
        if cf.is_file():
            try:
                cfg = json.loads(cf.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise SpecctlError(f"{cf}: not valid JSON") from None
            return check_config(cfg, cf)
        path = path / ARTIFACT_FILE
    if not path.is_file():
        raise SpecctlError(f"{path}: not an n-gram cache (make one with `specctl build-cache`)")
    _, meta = read_safetensors_mmap(path)
    try:
        cfg = json.loads(meta["config"])
    except (KeyError, TypeError, ValueError):
        raise SpecctlError(f"{path}: not an n-gram cache (no config in its metadata)") from None
    return check_config(cfg, path)


def brute_force_table(docs: Iterable[list[int]], max_key_len: int, gram_len: int, top: int,
                      min_count: int) -> dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]]:
    """The same tables in plain Python (for tests and small checks):
    {key: [(continuation, count), ...] highest count first, ties by tokens}."""
    from collections import Counter
    counts: Counter = Counter()
    for d in docs:
        d = list(d)
        for k in range(1, max_key_len + 1):
            for s in range(0, len(d) - k - gram_len + 1):
                counts[(tuple(d[s:s + k]), tuple(d[s + k:s + k + gram_len]))] += 1
    by_key: dict = {}
    for (key, cont), c in counts.items():
        if c >= min_count:
            by_key.setdefault(key, []).append((cont, c))
    return {key: sorted(v, key=lambda x: (-x[1], x[0]))[:top] for key, v in by_key.items()}
