"""Self-Draft's batched drafting (speculative/batch_trie.py) gives exactly the per-sequence
path's proposals: the same trie nodes, tokens, parents and order, corpus candidates and counts."""

from __future__ import annotations

import numpy as np
import pytest

from specctl.prep.ngram_build import CountConfig, count_token_docs, write_artifact
from specctl.runtime.step.sequence import Request, Sequence
from specctl.speculative import batch_trie, self_draft
from specctl.speculative.corpus_cache import CorpusCache
from specctl.speculative.drafter import DraftLimits
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
from specctl.speculative.trie import build_trie


def corpus(tmp_path, rng, base=0, g=3, kmax=4):
    """A corpus cache of random documents over a few tokens (keys of every length repeat)."""
    docs = [(base + rng.integers(0, 6, size=int(rng.integers(5, 60)))).tolist()
            for _ in range(60)]
    cfg = CountConfig(max_key_len=kmax, gram_len=g, top=4, min_count=2, rows_per_part=300)
    out = tmp_path / f"c{base}"
    out.mkdir()
    write_artifact(out, count_token_docs(docs, cfg, tmp_path / f"w{base}"),
                   {"max_key_len": kmax, "gram_len": g, "top": 4, "min_count": 2,
                    "tokenizer_fingerprint": "x", "tokenizer": "t"})
    return CorpusCache.load(out)


@pytest.mark.parametrize("b", [1, 7, 64])
def test_tries_equal_build_trie(b):
    rng = np.random.default_rng(b)
    for _ in range(20):
        C, G = int(rng.integers(1, 14)), int(rng.integers(1, 6))
        cands = [[tuple(rng.integers(0, 3, size=int(rng.integers(1, G + 1))).tolist())
                  for _ in range(int(rng.integers(0, C + 1)))] for _ in range(b)]
        budgets = rng.integers(0, C * G + 2, size=b)
        toks, pars, sizes = batch_trie.tries(batch_trie.pack(cands, C, G), budgets)
        for i in range(b):
            want_sizes: list[int] = []
            want = build_trie(cands[i], int(budgets[i]), want_sizes)
            assert (toks[i], pars[i]) == (want.tokens, want.parents)
            n = len(cands[i])
            assert sizes[i, :n].tolist() == want_sizes
            assert (sizes[i, n:] == (want_sizes[-1] if n else 0)).all()


@pytest.mark.parametrize("base", [0, 2**31 - 97])   # (large ids: the filter's sums wrap)
def test_corpus_lookup_equals_lookup(tmp_path, base):
    rng = np.random.default_rng(7)
    c = corpus(tmp_path, rng, base)
    for limit in (1, 3, 5):
        ctxs = [(base + rng.integers(0, 7, size=int(rng.integers(0, 7)))).tolist()
                for _ in range(64)]

        class S:   # a sequence's text: the prompt, then the answer
            def __init__(self, t):
                cut = int(rng.integers(0, len(t) + 1))
                self.prompt_ids, self.out_ids = t[:cut], t[cut:]
        tail, have = batch_trie.tails([S(t) for t in ctxs], 4)
        got = batch_trie.corpus_lookup(c, tail, have, limit)
        for i, t in enumerate(ctxs):
            rows = [r for r in got[i].tolist() if r[0] >= 0]
            assert rows == c.lookup(t, limit), t


def drafter_and_seqs(tmp_path, rng, b, params, with_corpus=True):
    dr = SelfDraftDrafter(params, corpus(tmp_path, rng, g=params.gram) if with_corpus else None)
    grams = [(int(rng.integers(0, 5)), tuple(rng.integers(0, 4, size=params.gram).tolist()))
             for _ in range(400)]
    dr.ctx.push_many(grams)
    seqs = []
    for i in range(b):
        s = Sequence(Request(i, [[]], 64), rng.integers(0, 6, size=int(rng.integers(1, 9))).tolist(), i)
        dr.admit(s)
        s.out_ids = rng.integers(0, 6, size=int(rng.integers(0, 6))).tolist()
        s.pending = int(rng.integers(0, 6))
        seqs.append(s)
    return dr, seqs


def proposals(dr, seqs, limits, batched, monkeypatch):
    monkeypatch.setattr(self_draft, "BATCH_MIN", 1 if batched else 1 << 30)
    return [(p.draft.tokens, p.draft.parents, p.probe.tokens, p.probe.parents, p.job_nodes,
             p.ctx_nodes) for p in dr.propose(seqs, None, limits)]


@pytest.mark.parametrize("b", [1, 7, 64])
@pytest.mark.parametrize("params", [
    SelfDraftParams(),
    SelfDraftParams(prompt_grams=True, branches=0, context_cands=4, corpus_cands=1),   # light
    SelfDraftParams(gram=3, context_cands=12, corpus_cands=5, lru=12),
    SelfDraftParams(context_cache=False, corpus_cands=2),
    SelfDraftParams(context_cands=0, corpus_cands=0)])
def test_propose_batched_equals_per_sequence(tmp_path, monkeypatch, b, params):
    rng = np.random.default_rng(b)
    dr, seqs = drafter_and_seqs(tmp_path, rng, b, params)
    k, drafted = dr.price().max_draft, 0
    for _ in range(8):
        room = tuple(rng.integers(0, k + 2, size=b).tolist())
        rows = tuple((np.array(room) + rng.integers(0, 40, size=b)).tolist())
        limits = DraftLimits(room, rows, probes=bool(rng.integers(0, 2)))
        want = proposals(dr, seqs, limits, False, monkeypatch)
        assert proposals(dr, seqs, limits, True, monkeypatch) == want
        drafted += sum(len(p[0]) for p in want)
    assert drafted or not (params.context_cands or params.corpus_cands)   # (not all empty)


def test_propose_without_corpus_batched_equals_per_sequence(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    dr, seqs = drafter_and_seqs(tmp_path, rng, 16, SelfDraftParams(), with_corpus=False)
    limits = DraftLimits(tuple(rng.integers(0, 50, size=16).tolist()))
    assert (proposals(dr, seqs, limits, True, monkeypatch)
            == proposals(dr, seqs, limits, False, monkeypatch))
