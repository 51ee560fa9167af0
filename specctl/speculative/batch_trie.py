"""Self-Draft's drafting step for a whole batch at once: every sequence's candidates as rows of
one int array [B, C, G] (-1 past a candidate's end; a missing candidate all -1), its corpus
candidates by one lookup per key length for the batch, and every sequence's trie from that
array by array operations over the batch.

Each gives exactly what the per-sequence path gives (SelfDraftDrafter.candidates, build_trie):
the same nodes, tokens, parents and node order (candidate-major, a prefix's node made by the
first candidate that has it). A duplicate candidate makes no node, so candidates are not
deduplicated here except where it decides which ones are taken (the corpus's first `limit`
distinct continuations). At batch 64 a light step's candidates and tries cost ~0.1 ms this
way against ~0.3 ms a sequence at a time; a few sequences cost more (numpy's fixed cost a call).
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from specctl.speculative.corpus_cache import _FIB, _FP, _row, hash_keys

_FP64 = np.array(_FP, np.uint64)   # the corpus filter's multipliers (lookup's sums), wrapping


def pack(rows: list[list[tuple[int, ...]]], slots: int, width: int) -> np.ndarray:
    """[B, slots, width] int64 of each sequence's tuples (at most `slots`, each at most `width`
    tokens), -1 past each one's end and in the slots it does not fill."""
    out = np.full((len(rows), slots, width), -1, np.int64)
    n = [len(r) for r in rows]
    total = sum(n)
    if not total:
        return out
    lens = np.fromiter((len(c) for r in rows for c in r), np.int64, total)
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(rows)), np.int64, int(lens.sum()))
    seq = np.repeat(np.arange(len(rows)), n)
    start = np.zeros(len(rows), np.int64)
    np.cumsum(n[:-1], out=start[1:])
    slot = np.arange(total) - start[seq]
    if (lens == width).all():
        out[seq, slot] = flat.reshape(total, width)
    else:   # (ragged: each token to its place)
        which = np.repeat(np.arange(total), lens)
        cstart = np.zeros(total, np.int64)
        np.cumsum(lens[:-1], out=cstart[1:])
        out[seq[which], slot[which], np.arange(len(flat)) - cstart[which]] = flat
    return out


def firsts(rows: np.ndarray) -> np.ndarray:
    """[B, M, G] -> [B, M, G]: for each row m and depth g, the first row of its sequence with
    the same first g + 1 tokens (where row m has no token g: any row's index)."""
    t = np.ascontiguousarray(rows.transpose(0, 2, 1))   # [B, G, M]
    same = t[:, :, :, None] == t[:, :, None, :]
    for g in range(1, t.shape[1]):   # (a ufunc's accumulate over it costs ~20x more)
        np.logical_and(same[:, g], same[:, g - 1], out=same[:, g])
    return same.argmax(axis=3).transpose(0, 2, 1)


def tries(cands: np.ndarray, budgets: np.ndarray) -> tuple[list[list[int]], list[list[int]],
                                                           np.ndarray]:
    """build_trie of every sequence's candidates cands[b] (rows of [B, C, G], -1 past a
    candidate's end) within budgets[b] nodes: (tokens per sequence, parents per sequence, the
    node count after each candidate [B, C], as build_trie's `sizes`).
    A candidate's g + 1 first tokens are a node, the first candidate having them makes it
    (nodes in candidate-major order: build_trie's), and only its first budgets[b] nodes stay
    (build_trie stops making nodes there: later candidates only walk the ones made)."""
    B, C, G = cands.shape
    if not C:
        return [[] for _ in range(B)], [[] for _ in range(B)], np.zeros((B, 0), np.int64)
    first = firsts(cands)   # [B, C, G]: the first candidate with c's prefix
    new = (cands >= 0) & (first == np.arange(C)[None, :, None])
    done = np.cumsum(new.reshape(B, C * G), axis=1)   # nodes made so far
    keep = new & (done <= budgets[:, None]).reshape(B, C, G)
    # every prefix's node: its first candidate's index among the new nodes
    at = first * G + (np.arange(B)[:, None, None] * (C * G) + np.arange(G))
    node = done.reshape(-1)[at] - 1
    parent = np.empty((B, C, G), np.int64)
    parent[:, :, 0] = -1
    parent[:, :, 1:] = node[:, :, :-1]
    sizes = np.minimum(done[:, G - 1::G], budgets[:, None])
    toks, pars = cands[keep].tolist(), parent[keep].tolist()
    out_t, out_p, at = [], [], 0
    for n in sizes[:, -1].tolist():
        out_t.append(toks[at:at + n])
        out_p.append(pars[at:at + n])
        at += n
    return out_t, out_p, sizes


def tails(seqs, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's last k tokens of prompt and answer together, right-aligned in [B, k]
    (-1 before a shorter text's start), and how many it has."""
    rows = []
    for s in seqs:
        t = s.out_ids[-k:]
        rows.append(t if len(t) == k else s.prompt_ids[len(t) - k:] + t)
    n = np.fromiter(map(len, rows), np.int64, len(rows))
    if (n == k).all():
        return np.array(rows, np.int64).reshape(len(rows), k), n
    out = np.full((len(rows), k), -1, np.int64)
    for b, t in enumerate(rows):
        if t:
            out[b, k - len(t):] = t
    return out, n


def corpus_lookup(corpus, tail: np.ndarray, have: np.ndarray, limit: int) -> np.ndarray:
    """CorpusCache.lookup(context, limit) of every sequence at once (tail [B, K] right-aligned,
    `have` its real tokens): [B, K * limit, g], each key's (longest first) first `limit`
    continuations; those past the first `limit` distinct, and repeats, -1. (A key's
    continuations are distinct: build-cache counts each once.)"""
    B, K = tail.shape
    kmax = min(corpus.max_key_len, K)
    g = corpus.gram_len
    out = np.full((B, kmax, limit, g), -1, np.int64)
    t64 = (tail & 0xFFFFFFFF).astype(np.uint64)   # (-1 padding: masked out below)
    s = np.zeros(B, np.uint64)
    sums = []
    for i in range(kmax):   # filter sums of the last 1..kmax tokens, as lookup's
        s = s + t64[:, K - 1 - i] * _FP64[i]
        sums.append(s)
    for j, k in enumerate(range(kmax, 0, -1)):
        t = corpus.tables[k]
        if not t.hashes.shape[0]:
            continue
        h = (sums[k - 1] * np.uint64(_FIB)) >> np.uint64(t.shift)
        bits = np.frombuffer(t.bits, np.uint8)
        may = (have >= k) & (((bits[h >> np.uint64(3)] >> (h & np.uint64(7)).astype(np.uint8))
                              & 1) == 1)
        at = np.flatnonzero(may)
        if not len(at):
            continue
        keys = tail[at, K - k:]
        hk = hash_keys(keys)
        i = np.minimum(np.searchsorted(t.hashes, hk), t.hashes.shape[0] - 1)
        hit = t.hashes[i] == hk
        ok = hit & (t.keys[i] == keys).all(axis=1)
        rows = np.where(ok, i, -1)
        for m in np.flatnonzero(hit & ~ok):   # (a hash shared by several keys: rare)
            rows[m] = _row(t, keys[m].tolist())
        found = rows >= 0
        at, rows = at[found], rows[found]
        lo, hi = t.offsets[rows], t.offsets[rows + 1]
        for c in range(limit):
            there = lo + c < hi
            out[at[there], j, c] = t.conts[lo[there] + c]
    flat = out.reshape(B, kmax * limit, g)
    once = (flat[:, :, 0] >= 0) & (firsts(flat)[:, :, -1] == np.arange(kmax * limit)[None, :])
    taken = once & (np.cumsum(once, axis=1) <= limit)
    flat[~taken] = -1
    return flat
