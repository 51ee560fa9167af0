"""The job cache's arrays' form (speculative/job_table.py, the grid's): its lookups against
a plain reading of its documented semantics (the longest key present, its latest occurrence),
one pass of many texts as the same texts one at a time, its memory bound, the grid's match,
and the round trip through --job-cache-file's format; on the grid, lossless, and drafting a
job's repeated answers."""

from __future__ import annotations

import random

import numpy as np
import pytest

from helpers import random_prompts, run_ids
from specctl.speculative.job_cache import JobCache, JobCacheParams
from specctl.speculative.job_table import JobTable
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams


def _reference(texts, context, lo=2, hi=8, cont=16):
    """The continuation (up to `cont` tokens, cut at its text's end) after the latest
    occurrence of the longest of the context's last hi .. lo tokens that some text holds
    followed by a token; None where none does."""
    stream = [t for x in texts for t in list(x) + [-1]]
    for k in range(min(hi, len(context)), lo - 1, -1):
        key, at = list(context[-k:]), None
        for j in range(k, len(stream)):
            if stream[j] >= 0 and stream[j - k:j] == key:
                at = j
        if at is not None:
            s = stream[at:at + cont]
            return tuple(s[:s.index(-1)] if -1 in s else s)
    return None


@pytest.mark.parametrize("seed", range(4))
def test_lookup_is_the_latest_occurrence_of_the_longest_key(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([3, 8, 30])   # (small: long keys repeat; large: short ones only)
    texts = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 50))] for _ in range(30)]
    one, many = JobTable(), JobTable()
    for t in texts:
        one.add(t)
    many.add_many(texts)
    found = 0
    for _ in range(200):
        ctx = [rng.randrange(alphabet) for _ in range(rng.randint(1, 12))]
        want = _reference(texts, ctx)
        for table in (one, many):
            got = table.lookup(ctx, 1)
            assert (got[0] if got else None) == want, (ctx, got, want)
        found += want is not None
    assert found > 20   # (the comparison is not over misses alone)


def test_match_is_lookup_over_the_batch():
    """(GridFill puts a match first among a grid step's chains: tests/test_grid.py.)"""
    rng = random.Random(5)
    texts = [[rng.randrange(6) for _ in range(rng.randint(5, 40))] for _ in range(20)]
    t = JobTable()
    t.add_many(texts)
    B, G = 16, 4
    tails = np.full((B, t.K), -1, dtype=np.int64)
    ctxs = [[rng.randrange(6) for _ in range(rng.randint(1, 10))] for _ in range(B)]
    for i, c in enumerate(ctxs):
        c = c[-t.K:]
        tails[i, t.K - len(c):] = c
    assert (t.tails([_Seq(c[:1], c[1:]) for c in ctxs]) == tails).all()
    cont, found = t.match(tails, G)
    for i, c in enumerate(ctxs):
        want = _reference(texts, c)
        assert found[i] == (want is not None)
        if want is None:
            continue
        assert tuple(cont[i][:len(want)].tolist()) == want[:G]
        if len(want) < G:   # (its text's end, the separator, as token 0: a real id)
            assert cont[i][len(want)] == 0
    assert 0 < found.sum() < B


class _Seq:
    def __init__(self, prompt, out):
        self.prompt_ids, self.out_ids = list(prompt), list(out)


def test_the_buffer_is_bounded_and_keys_into_dropped_text_read_absent():
    prm = JobCacheParams(max_tokens=64, max_keys=16)
    t = JobTable(prm)
    t.add([1, 2, 3, 4, 5])
    assert t.lookup([1, 2], 1) == [(3, 4, 5)]
    for i in range(40):
        t.add([100 + i, 200 + i, 7])
        assert t.n <= prm.max_tokens
    assert t.lookup([1, 2], 1) == []              # (its text was dropped)
    assert t.lookup([139, 239], 1) == [(7,)]      # (the newest stays)
    t.add(list(range(10, 300)))                   # (longer than the bound: its newest part)
    assert t.n <= prm.max_tokens and t.lookup([297, 298], 1) == [(299,)]


def test_the_files_format_round_trips_the_texts():
    rng = random.Random(2)
    texts = [[rng.randrange(9) for _ in range(rng.randint(1, 30))] for _ in range(12)]
    t = JobTable()
    t.add_many(texts)
    c = t.to_job_cache()
    assert isinstance(c, JobCache) and c.added == len(texts)
    back = JobTable.from_job_cache(JobCache.from_arrays(c.prm, c.arrays()))
    assert [x.tolist() for x in back.texts()] == texts
    assert np.array_equal(back.keys, t.keys) and np.array_equal(back.pos, t.pos)


def test_the_grid_drafts_a_jobs_repeated_answers_and_stays_lossless(model):
    """Each prompt twice: the second answer is the first's, which the job cache holds by
    then (batch 3: the first ones finish first). On the grid with it, the run takes fewer
    steps than on the grid without it (73 against 82 here: the tiny model's answers repeat
    themselves, which the context table drafts too), and every output is ar's."""
    prompts = random_prompts(6, seed=4)
    prompts = prompts + prompts
    ref, _ = run_ids(model, prompts, max_tokens=40)
    steps = {}
    for job in (False, True):
        dr = SelfDraftDrafter(SelfDraftParams(branches=0, context_cands=4, grid=True,
                                              job_cache=job), None, vocab=model.cfg.vocab_size)
        assert (dr.job_table is not None) == job
        got, st = run_ids(model, prompts, batch_size=3, max_tokens=40, drafter=dr)
        assert got == ref, job
        steps[job] = st.steps
        assert (dr.accepted_from["job"] > 20) == job   # (the report: its chain's accepted)
    assert steps[True] < 0.92 * steps[False], steps


def test_a_chain_longer_than_the_buffers_slack_reads_separators():
    """A grid whose chains are longer than a continuation (gram > cont_len) at the buffer's
    very end: its tail reads the end's -1, as token 0, not past the array."""
    prm = JobCacheParams(max_tokens=64, max_keys=16, cont_len=2)
    t = JobTable(prm)
    t.add(list(range(1, 63)))   # (fills the buffer to its bound)
    tails = np.array([[-1] * 6 + [60, 61]])
    cont, found = t.match(tails, 12)
    assert found[0] and cont[0].tolist() == [62] + [0] * 11


def test_a_files_texts_load_in_passes_as_in_one(monkeypatch):
    import specctl.speculative.job_table as jt
    rng = random.Random(3)
    texts = [[rng.randrange(20) for _ in range(rng.randint(1, 40))] for _ in range(50)]
    c = JobCache()
    for x in texts:
        c.add(x)
    whole = JobTable.from_job_cache(c)
    monkeypatch.setattr(jt, "LOAD_PASS", 30)   # (a pass every text or two)
    parts = JobTable.from_job_cache(c)
    assert [x.tolist() for x in parts.texts()] == texts
    for _ in range(100):
        ctx = [rng.randrange(20) for _ in range(rng.randint(2, 9))]
        assert parts.lookup(ctx, 1) == whole.lookup(ctx, 1) == \
            ([_reference(texts, ctx)] if _reference(texts, ctx) else [])
