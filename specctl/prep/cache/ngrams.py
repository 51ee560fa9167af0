"""Counting the corpus n-gram tables of Self-Draft's corpus cache, in bounded memory.

1. Tokenize: documents go through the model's fast tokenizer in batches (optionally in several
   threads: the Rust tokenizer releases the GIL) and are appended to one int32 token stream on
   disk, a -1 between documents, so no n-gram crosses a document.
2. Count, per key length k: every window of k + g tokens of the stream (g = gram_len) that holds
   no -1 is a (key = first k, continuation = last g) pair. Windows are split into partitions by
   the key's hash, each partition small enough to sort in memory (`rows_per_part`); a partition
   is packed into uint64 words (exact: several tokens per word, no hashing), sorted, and runs of
   equal rows give exact counts. Pairs with count >= min_count are kept, the `top` most frequent
   per key (ties: smaller continuation tokens first). Memory is O(rows_per_part), whatever the
   corpus size; the stream and the per-window partition ids live in memory-mapped files.
3. Tables: the kept keys of all partitions, sorted by (key hash, key tokens), with offsets into
   their continuations; written as flat int32/int64 safetensors (`write_artifact`).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from specctl.errors import SpecctlError
from specctl.speculative.corpus_cache import ARTIFACT_FILE, CONFIG_FILE, FORMAT_VERSION, hash_keys

SEP = -1


@dataclass(frozen=True)
class CountConfig:
    max_key_len: int = 4
    gram_len: int = 4
    top: int = 20
    min_count: int = 6
    workers: int = 1
    rows_per_part: int = 4_000_000      # windows sorted at once (memory ~ 100 bytes each)
    batch_chars: int = 1 << 21          # text per tokenizer call
    batch_docs: int = 1024

    def __post_init__(self):
        checks = [(1 <= self.max_key_len <= 16, "--max-key-len must be 1..16"),
                  (1 <= self.gram_len <= 16, "--gram-len must be 1..16"),
                  (self.top >= 1, "--top must be >= 1"),
                  (self.min_count >= 1, "--min-count must be >= 1"),
                  (1 <= self.workers <= 64, "--workers must be 1..64"),
                  (self.rows_per_part >= 1, "rows_per_part must be >= 1")]
        for ok, msg in checks:
            if not ok:
                raise SpecctlError(msg)


@dataclass
class Tables:
    """Per key length k: hashes [n] uint64 (sorted), keys [n,k] int32, offsets [n+1] int64,
    conts [m,g] int32, counts [m] int32."""
    hashes: dict
    keys: dict
    offsets: dict
    conts: dict
    counts: dict

    def num_keys(self) -> dict[int, int]:
        return {k: int(v.shape[0]) for k, v in self.hashes.items()}

    def num_grams(self) -> dict[int, int]:
        return {k: int(v.shape[0]) for k, v in self.counts.items()}


# ---------------------------------------------------------------------------------------------
# 1. tokenizing into a stream


class _Encoder:
    """Batch encoding with a HF tokenizer (its Rust backend when it has one)."""

    def __init__(self, tok):
        self.tok = tok
        self.backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) \
            else None
        if self.backend is not None:
            # the backend may carry truncation/padding settings from tokenizer.json: never here
            if self.backend.truncation is not None:
                self.backend.no_truncation()
            if self.backend.padding is not None:
                self.backend.no_padding()

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        if self.backend is not None:
            encs = self.backend.encode_batch(texts, add_special_tokens=False)
            return [np.asarray(e.ids, dtype=np.int64) for e in encs]
        ids = self.tok(texts, add_special_tokens=False, return_attention_mask=False,
                       verbose=False)["input_ids"]
        return [np.asarray(x, dtype=np.int64) for x in ids]


def _batches(docs: Iterable[tuple[str, str]], cfg: CountConfig) -> Iterator[list[str]]:
    batch, chars = [], 0
    for _, text in docs:
        batch.append(text)
        chars += len(text)
        if chars >= cfg.batch_chars or len(batch) >= cfg.batch_docs:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


@dataclass
class StreamInfo:
    path: Path
    length: int          # entries, separators included
    tokens: int
    documents: int
    max_id: int
    seconds: float


def tokenize_to_stream(docs: Iterable[tuple[str, str]], tok, path: Path, cfg: CountConfig,
                       on_tokens: Callable[[int], None] = lambda n: None) -> StreamInfo:
    """Tokenize documents into an int32 stream file (SEP after each document)."""
    enc = _Encoder(tok)
    t0 = time.perf_counter()
    tokens = docs_n = length = 0
    max_id = -1

    def write(f, arrays: list[np.ndarray]) -> None:
        nonlocal tokens, docs_n, length, max_id
        parts = []
        for a in arrays:
            if a.size == 0:
                continue
            if a.min() < 0 or a.max() > np.iinfo(np.int32).max:
                raise SpecctlError("the tokenizer returned token ids outside int32")
            max_id = max(max_id, int(a.max()))
            parts.append(a.astype(np.int32))
            parts.append(np.array([SEP], dtype=np.int32))
            tokens += int(a.size)
            docs_n += 1
        if parts:
            buf = np.concatenate(parts)
            f.write(buf.tobytes())
            length += int(buf.size)
        on_tokens(sum(int(a.size) for a in arrays))

    with open(path, "wb") as f:
        if cfg.workers <= 1:
            for b in _batches(docs, cfg):
                write(f, enc(b))
        else:
            ex = ThreadPoolExecutor(cfg.workers, thread_name_prefix="specctl-tok")
            try:
                pending = []
                for b in _batches(docs, cfg):
                    pending.append(ex.submit(enc, b))
                    while len(pending) > 2 * cfg.workers:
                        write(f, pending.pop(0).result())
                for fut in pending:
                    write(f, fut.result())
            finally:   # (on Ctrl-C the queued batches are dropped, not tokenized first: the
                ex.shutdown(wait=True, cancel_futures=True)   # exit took 8-13 s)
    return StreamInfo(Path(path), length, tokens, docs_n, max_id, time.perf_counter() - t0)


def stream_from_docs(token_docs: Iterable[Iterable[int]], path: Path) -> StreamInfo:
    """A stream file from already tokenized documents (tests, other tokenizers)."""
    tokens = docs = length = 0
    max_id = -1
    with open(path, "wb") as f:
        for d in token_docs:
            a = np.asarray(list(d), dtype=np.int64)
            if a.size == 0:
                continue
            if a.min() < 0 or a.max() > np.iinfo(np.int32).max:
                raise SpecctlError("token ids must be in 0..2**31-1")
            max_id = max(max_id, int(a.max()))
            f.write(np.concatenate([a, [SEP]]).astype(np.int32).tobytes())
            tokens, docs, length = tokens + a.size, docs + 1, length + a.size + 1
    return StreamInfo(Path(path), length, tokens, docs, max_id, 0.0)


# ---------------------------------------------------------------------------------------------
# 2. counting


_CHUNK = 1 << 22   # stream positions per vectorized step


def _pack(cols: np.ndarray, bits: int) -> np.ndarray:
    """Rows of token ids [n, c] -> uint64 words [n, w], `64 // bits` tokens per word, first
    token in the high bits (so word order = token order)."""
    n, c = cols.shape
    per = 64 // bits
    w = -(-c // per)
    out = np.zeros((n, w), dtype=np.uint64)
    for j in range(c):
        word, slot = divmod(j, per)
        shift = np.uint64(bits * (per - 1 - slot))
        out[:, word] |= cols[:, j].astype(np.uint64) << shift
    return out


def _windows(stream: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Rows stream[s : s + width] for each start, as a new int32 array [len(starts), width]."""
    view = np.lib.stride_tricks.sliding_window_view(stream, width)
    return np.ascontiguousarray(view[starts])


def count_tables(stream_path: Path, info: StreamInfo, cfg: CountConfig, work: Path,
                 on_progress: Callable[[str, int, int], None] = lambda what, done, total: None
                 ) -> tuple[Tables, dict]:
    """Exact top-N tables from a token stream (see the module docstring). `on_progress(what,
    done, total)` reports windows counted. Returns (tables, stats)."""
    g, kmax = cfg.gram_len, cfg.max_key_len
    n = info.length
    bits = max(1, int(max(info.max_id, 1)).bit_length())
    stats = {"windows": {}, "partitions": {}}
    tables = Tables({}, {}, {}, {}, {})
    stream = np.memmap(stream_path, dtype=np.int32, mode="r", shape=(n,)) if n else \
        np.zeros(0, dtype=np.int32)
    # windows counted in all (for the progress bar): per k, starts with a full window
    totals = {k: max(0, n - (k + g) + 1) for k in range(1, kmax + 1)}
    grand, done = sum(totals.values()), 0
    on_progress("count", 0, grand)
    for k in range(1, kmax + 1):
        width = k + g
        m = totals[k]
        # partition id of each window start (-1: not a full window inside one document)
        pid_path = work / f"pid-k{k}.u16"
        valid = 0
        if m:
            pid = np.memmap(pid_path, dtype=np.uint16, mode="w+", shape=(m,))
            for lo in range(0, m, _CHUNK):
                hi = min(m, lo + _CHUNK)
                seg = np.asarray(stream[lo: hi + width - 1])
                sep = np.concatenate([[0], np.cumsum(seg == SEP)])
                ok = sep[width: width + hi - lo] == sep[: hi - lo]
                valid += int(ok.sum())
                pid[lo:hi] = np.where(ok, 0, 0xFFFF).astype(np.uint16)
            parts = max(1, -(-valid // cfg.rows_per_part))
            if parts >= 0xFFFF:
                raise SpecctlError("corpus too large for rows_per_part; raise it")
            if parts > 1:
                for lo in range(0, m, _CHUNK):
                    hi = min(m, lo + _CHUNK)
                    ok = pid[lo:hi] != 0xFFFF
                    starts = np.nonzero(ok)[0] + lo
                    keys = _windows(stream, starts, k)
                    h = hash_keys(keys)
                    sub = pid[lo:hi]
                    sub[ok] = (h % np.uint64(parts)).astype(np.uint16)
            pid.flush()
        else:
            parts = 1
        stats["windows"][k], stats["partitions"][k] = valid, parts
        found = []   # per partition: (keys [n,k], lengths [n], conts [m,g], counts [m])
        for p in range(parts if m else 0):
            starts = np.concatenate([np.nonzero(pid[lo: min(m, lo + _CHUNK)] == p)[0] + lo
                                     for lo in range(0, m, _CHUNK)] or [np.zeros(0, np.int64)])
            found.append(_count_partition(stream, starts.astype(np.int64), k, g, bits, cfg))
            done += starts.size
            on_progress("count", done, grand)
        if m:
            del pid
            pid_path.unlink(missing_ok=True)
        _assemble(tables, k, g, found)
        done = sum(totals[j] for j in range(1, k + 1))
        on_progress("count", done, grand)
    return tables, stats


def _count_partition(stream, starts: np.ndarray, k: int, g: int, bits: int, cfg: CountConfig):
    empty = (np.zeros((0, k), np.int32), np.zeros(0, np.int64), np.zeros((0, g), np.int32),
             np.zeros(0, np.int32))
    if starts.size == 0:
        return empty
    win = _windows(stream, starts, k + g)                      # [r, k+g] int32
    kw, cw = _pack(win[:, :k], bits), _pack(win[:, k:], bits)   # exact packings
    cols = [cw[:, j] for j in range(cw.shape[1] - 1, -1, -1)] + \
           [kw[:, j] for j in range(kw.shape[1] - 1, -1, -1)]
    order = np.lexsort(cols)                                   # by (key, continuation)
    kw, cw = kw[order], cw[order]
    r = order.size
    new = np.ones(r, dtype=bool)
    new[1:] = np.any(kw[1:] != kw[:-1], axis=1) | np.any(cw[1:] != cw[:-1], axis=1)
    first = np.nonzero(new)[0]
    counts = np.diff(np.append(first, r))
    keep = counts >= cfg.min_count
    first, counts = first[keep], counts[keep]
    if first.size == 0:
        return empty
    kw, cw = kw[first], cw[first]
    # order by (key, -count, continuation) and keep the `top` first of each key
    cols = [cw[:, j] for j in range(cw.shape[1] - 1, -1, -1)] + [-counts] + \
           [kw[:, j] for j in range(kw.shape[1] - 1, -1, -1)]
    o2 = np.lexsort(cols)
    kw, counts, rows = kw[o2], counts[o2], order[first[o2]]
    knew = np.ones(o2.size, dtype=bool)
    knew[1:] = np.any(kw[1:] != kw[:-1], axis=1)
    kstart = np.nonzero(knew)[0]
    rank = np.arange(o2.size) - np.repeat(kstart, np.diff(np.append(kstart, o2.size)))
    sel = rank < cfg.top
    rows, counts, knew = rows[sel], counts[sel], knew[sel]
    win_sel = win[rows]
    kidx = np.nonzero(knew)[0]
    lengths = np.diff(np.append(kidx, rows.size))
    return (win_sel[kidx, :k].astype(np.int32), lengths.astype(np.int64),
            win_sel[:, k:].astype(np.int32), counts.astype(np.int32))


def _assemble(tables: Tables, k: int, g: int, found: list) -> None:
    if found:
        keys = np.concatenate([f[0] for f in found])
        lengths = np.concatenate([f[1] for f in found])
        conts = np.concatenate([f[2] for f in found])
        counts = np.concatenate([f[3] for f in found])
    else:
        keys, lengths = np.zeros((0, k), np.int32), np.zeros(0, np.int64)
        conts, counts = np.zeros((0, g), np.int32), np.zeros(0, np.int32)
    h = hash_keys(keys)
    perm = np.lexsort([keys[:, j] for j in range(k - 1, -1, -1)] + [h])  # by (hash, tokens)
    old_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    new_len = lengths[perm]
    new_off = np.concatenate([[0], np.cumsum(new_len)]).astype(np.int64)
    total = int(new_off[-1])
    idx = np.repeat(old_off[:-1][perm], new_len) + (np.arange(total) - np.repeat(new_off[:-1], new_len))
    tables.hashes[k] = h[perm]
    tables.keys[k] = np.ascontiguousarray(keys[perm], dtype=np.int32)
    tables.offsets[k] = new_off
    tables.conts[k] = np.ascontiguousarray(conts[idx], dtype=np.int32).reshape(total, g)
    tables.counts[k] = np.ascontiguousarray(counts[idx], dtype=np.int32)


def count_token_docs(token_docs: Iterable[Iterable[int]], cfg: CountConfig, work: Path) -> Tables:
    """Tables straight from tokenized documents (tests, small corpora)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    info = stream_from_docs(token_docs, work / "stream.i32")
    tables, _ = count_tables(info.path, info, cfg, work)
    return tables


# ---------------------------------------------------------------------------------------------
# 3. the artifact


def write_artifact(out_dir: Path, tables: Tables, config: dict) -> Path:
    """ngram.safetensors (+ config.json) in `out_dir` (a folder being built by the store)."""
    from safetensors.numpy import save_file

    config = {"format": FORMAT_VERSION, **config}
    tensors = {}
    for k in sorted(tables.keys):
        tensors[f"k{k}.key_hash"] = np.ascontiguousarray(tables.hashes[k].astype(np.uint64).view(np.int64))
        tensors[f"k{k}.keys"] = np.ascontiguousarray(tables.keys[k], dtype=np.int32)
        tensors[f"k{k}.offsets"] = np.ascontiguousarray(tables.offsets[k], dtype=np.int64)
        tensors[f"k{k}.conts"] = np.ascontiguousarray(tables.conts[k], dtype=np.int32)
        tensors[f"k{k}.counts"] = np.ascontiguousarray(tables.counts[k], dtype=np.int32)
    out_dir = Path(out_dir)
    from specctl.store import atomic_write_json, writable_file
    path = writable_file(out_dir / ARTIFACT_FILE)
    tmp = writable_file(out_dir / f".{ARTIFACT_FILE}.tmp")
    save_file(tensors, str(tmp), metadata={"config": json.dumps(config, sort_keys=True)})
    os.replace(tmp, path)
    atomic_write_json(out_dir / CONFIG_FILE, config)
    return path


def config_dict(cfg: CountConfig, fingerprint: str, tokenizer: str) -> dict:
    d = asdict(cfg)
    return {"max_key_len": d["max_key_len"], "gram_len": d["gram_len"], "top": d["top"],
            "min_count": d["min_count"], "tokenizer_fingerprint": fingerprint,
            "tokenizer": tokenizer}
