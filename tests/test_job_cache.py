"""Self-Draft's job cache (speculative/job_cache.py): longest match, counts, continuations cut at
their text's end, the memory bound on a 10,000-answer job; lossless greedy (batch 1 and 8, a
cache pre-filled with wrong continuations) and sampling with its candidates; where accepted
drafts came from."""

from __future__ import annotations

import random

import pytest

from helpers import check_three_token_sampling, random_prompts, run_ids
from specctl.speculative.job_cache import JobCache, JobCacheParams
from specctl.speculative.sampling import SamplingParams
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams


def test_longest_match_first_and_frequent_continuations_rank_first():
    c = JobCache()
    c.add([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    c.add([1, 2, 3, 4, 5, 6, 7, 8, 9, 11])
    c.add([1, 2, 3, 4, 5, 6, 7, 8, 9, 11])
    c.add([30, 8, 9, 12])
    # the key [7, 8, 9] (longest present) says 11 twice, 10 once; [8, 9] alone would say 12
    assert c.lookup([0, 7, 8, 9], 3) == [(11,), (10,)]
    assert c.lookup([30, 8, 9], 3) == [(12,)]
    # the continuation is the text after the latest occurrence, up to cont_len, cut at its end
    assert c.lookup([2, 3], 1) == [(4, 5, 6, 7, 8, 9, 11)]
    assert JobCache(JobCacheParams(cont_len=3)).lookup([2, 3], 1) == []
    short = JobCache(JobCacheParams(cont_len=3))
    short.add([1, 2, 3, 4, 5, 6])
    assert short.lookup([1, 2], 2) == [(3, 4, 5)]
    assert c.lookup([5], 3) == [] and c.lookup([99, 98], 3) == [] and c.lookup([2, 3], 0) == []


def test_a_run_kept_lean_indexes_nothing_and_the_first_drafting_step_catches_up():
    from specctl.speculative.drafter import DraftLimits
    from specctl.runtime.step.sequence import Request, Sequence
    dr = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=0), None)
    s = Sequence(Request(0, [[]], 8), [1, 2, 3, 4], 0)
    dr.admit(s)
    s.out_ids, s.pending = [5, 6], 6
    dr.retire(s)
    dr.propose([s], None, DraftLimits((0,)))   # an ar step: still nothing indexed
    assert len(dr.job) == 0 and len(dr.job_pending) == 2
    dr.admit(s)
    dr.propose([s], None, DraftLimits((4,)))
    assert dr.job_pending == [] and dr.job.lookup([1, 2], 1) == [(3, 4)]
    assert dr.job.lookup([3, 4], 1) == [(5, 6)]   # (the answer after its prompt's tail)


def test_beside_a_forward_finished_answers_are_indexed_there_not_in_the_steps_plan():
    """Where the host runs beside the forward, a drafting step's own catch-up (the planner's,
    on the step's path) leaves finished answers waiting; the one under a forward
    (Runner._prefetch: beside) indexes them."""
    from specctl.runtime.step.sequence import Request, Sequence
    dr = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=0), None)
    dr.overlapped = True
    s = Sequence(Request(0, [[]], 8), [1, 2, 3, 4], 0)
    dr.admit(s)
    s.out_ids, s.pending = [5, 6], 6
    dr.retire(s)
    dr.catch_up([])
    assert len(dr.job) == 0 and len(dr.job_pending) == 2
    dr.catch_up([], beside=True)
    assert dr.job_pending == [] and dr.job.lookup([3, 4], 1) == [(5, 6)]


def test_counts_reorder_and_the_rarest_entry_gives_way():
    c = JobCache(JobCacheParams(min_key=1, max_key=1, nexts=2))
    for nxt in (5, 6, 6, 7):   # 6 overtakes 5; 7 then replaces the least frequent (5)
        c.add([1, nxt])
    assert c.lookup([1], 3) == [(6,), (7,)]


def test_memory_stays_within_its_bound_on_a_10000_answer_job():
    p = JobCacheParams(max_keys=4096, max_tokens=8192)
    c = JobCache(p)
    rng = random.Random(0)
    frame = [7, 8, 9, 10]   # (a frame every answer repeats, and a random tail)
    for _ in range(10_000):
        c.add(frame + [rng.randrange(5000) for _ in range(8)])
        assert len(c) <= p.max_keys and len(c.buf) <= p.max_tokens + 13
    assert c.added == 10_000
    assert all(len(v) <= 3 * p.nexts for v in c.table.values())
    assert all(0 <= v[i] < len(c.buf) for v in c.table.values() for i in range(2, len(v), 3))
    # the frame is the most frequent text: it survives every pruning
    assert c.lookup([7, 8], 1)[0][:2] == (9, 10)


def test_arrays_round_trip_and_malformed_arrays_are_refused():
    c = JobCache()
    for i in range(20):
        c.add([1, 2, 3, i, 4, 5])
    back = JobCache.from_arrays(c.prm, c.arrays())
    assert back.table == c.table and back.buf == c.buf
    bad = c.arrays()
    bad["entries"] = bad["entries"].copy()
    bad["entries"][0, 2] = len(c.buf) + 5   # a position outside the buffer
    with pytest.raises(ValueError):
        JobCache.from_arrays(c.prm, bad)
    with pytest.raises(ValueError):
        JobCache.from_arrays(JobCacheParams(max_keys=16), c.arrays())   # over the bound


@pytest.fixture(scope="module")
def repeated(model):
    """Prompts that come back (a job's second pass): later answers repeat earlier ones."""
    base = random_prompts(4, seed=11)
    prompts = base + base[::-1] + base
    ref, _ = run_ids(model, prompts, batch_size=1, max_tokens=24)
    return prompts, ref


@pytest.mark.parametrize("batch_size", [1, 8])
def test_greedy_equals_ar_and_the_job_cache_drafts(model, repeated, batch_size):
    prompts, ref = repeated
    dr = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=2), None)
    got, stats = run_ids(model, prompts, batch_size=batch_size, max_tokens=24, drafter=dr)
    assert got == ref
    assert dr.accepted_from["job"] > 0 and stats.accepted_from["job"] == dr.accepted_from["job"]
    assert len(dr.job) > 0
    if batch_size == 1:   # (every repeat follows its first: whole answers drafted)
        plain = SelfDraftDrafter(SelfDraftParams(branches=2), None)
        _, st0 = run_ids(model, prompts, batch_size=1, max_tokens=24, drafter=plain)
        assert stats.steps < 0.7 * st0.steps and plain.accepted_from["job"] == 0


@pytest.mark.parametrize("grid", [False, True])
def test_a_job_cache_of_wrong_continuations_changes_no_token(model, repeated, grid):
    """Per sequence (the dict's) and on the grid (its arrays', job_table.py: the wrong
    continuation each sequence's first chain)."""
    prompts, ref = repeated
    dr = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=0, context_cache=grid,
                                          grid=grid), None, vocab=model.cfg.vocab_size)
    for p, r in zip(prompts, ref):   # every prompt and answer context continued wrongly
        text = p + r
        for j in range(2, len(text)):
            dr.job.add(text[j - 2:j] + [t + 1 for t in text[j:j + 16]])
    dr.job.add_many = lambda texts: None   # (stays wrong: the run's answers are not learnt)
    found = []
    if grid:   # (its grid steps' first chains: the job's, wrong)
        match = dr.job.match
        dr.job.match = lambda *a: (lambda got: found.append(got[1].sum()) or got)(match(*a))
    got, stats = run_ids(model, prompts, batch_size=4, max_tokens=24, drafter=dr)
    assert got == ref
    # (long wrong drafts were verified: far more tokens than the answers')
    assert stats.step_tokens > 3 * stats.generated
    assert (sum(found) > 50) == grid   # (137 sequences' steps here)


@pytest.mark.parametrize("grid", [False, True])
def test_sampling_with_job_candidates_is_lossless(model, grid):
    """3,000 samples of one prompt: the job cache drafts the most frequent earlier samples
    (grid: its arrays' latest, job_table.py, as a sampling run's per-sequence steps read
    them), and the three tokens' joint distribution is still the target's."""
    sp = SamplingParams(temperature=1.0, top_k=3, seed=17)
    prompt = random_prompts(1, seed=5)[0]
    dr = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=0, context_cache=False,
                                          corpus_cache=False, grid=grid), None,
                          vocab=model.cfg.vocab_size)
    stats = check_three_token_sampling(model, prompt, sp, dr)
    assert dr.accepted_from["job"] > 100
    assert stats.accept_hist.get(1, 0) + stats.accept_hist.get(2, 0) > 100


def test_learning_the_written_answers_rebuilds_a_batch_1_runs_cache(model, repeated):
    """--resume's rebuild (SelfDraftDrafter.learn_finished, in index order) gives exactly the
    cache an unbroken batch-1 run had after the same answers."""
    prompts, ref = repeated
    ran = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=0), None)
    run_ids(model, prompts[:6], batch_size=1, max_tokens=24, drafter=ran)
    learnt = SelfDraftDrafter(SelfDraftParams(job_cache=True, branches=0), None)
    for p, r in zip(prompts[:6], ref[:6]):
        learnt.learn_finished(p, r)
    ran.flush_job(), learnt.flush_job()   # (the texts a drafting step had not indexed yet)
    assert learnt.job.table == ran.job.table and learnt.job.buf == ran.job.buf


def test_a_resumed_job_drafts_as_an_unbroken_one(tiny_llama, tmp_path):
    import json

    from typer.testing import CliRunner

    from specctl.cli import app
    inp = tmp_path / "p.jsonl"
    words = ("cats", "the sea", "rain", "a fox")
    inp.write_text("".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n"
                           for w in words * 3))

    def generate(tag, store, *args):
        out = tmp_path / f"{tag}.jsonl"
        r = CliRunner().invoke(app, ["generate", str(inp), "--model", str(tiny_llama),
                                     "--store", str(tmp_path / store), "--out", str(out),
                                     "--max-tokens", "16", "--device", "cpu", "-b", "1",
                                     "--method", "self-draft", "--job-cache", "--corpus-cache",
                                     "none", "--speculate", "fixed", *args])
        assert r.exit_code == 0, r.output
        return r.output, {l["index"]: l for l in map(json.loads, out.read_text().splitlines())}

    _, whole = generate("whole", "a")
    generate("part", "b", "--limit", "6")
    said, resumed = generate("resumed", "b", "--resume")
    assert all(resumed[i]["token_ids"] == whole[i]["token_ids"] for i in range(12))
    late = range(6, 12)
    steps = sum(resumed[i]["steps"] for i in late), sum(whole[i]["steps"] for i in late)
    assert abs(steps[0] - steps[1]) <= 0.05 * steps[1], steps
    assert "learnt the 6 answers already written" in " ".join(said.split())
    # (and without the rebuild the late answers would have drafted less)
    assert sum(whole[i]["steps"] for i in late) < sum(whole[i]["steps"] for i in range(6))
    # --job-cache-file: a second job starts with the first one's cache (saved when it ended)
    f = tmp_path / "job-cache.safetensors"
    said, first = generate("night1", "c", "--job-cache-file", str(f))
    assert "starts empty" in " ".join(said.split()) and f.is_file()
    said, second = generate("night2", "d", "--job-cache-file", str(f))
    assert f"jobcache{f}(" in "".join(said.split())   # (loaded: the rich log may wrap)
    assert sum(l["steps"] for l in second.values()) < sum(l["steps"] for l in first.values())


def test_job_cache_file_starts_the_next_job_warm_and_is_refused_for_another_model(
        tiny_llama, tmp_path):
    from specctl.errors import SpecctlError
    from specctl.runtime.jobs.job_cache_file import load_job_cache, save_job_cache
    from tiny import make_tiny_model
    said = []
    dr = SelfDraftDrafter(SelfDraftParams(job_cache=True), None)
    path = tmp_path / "nightly" / "job.safetensors"
    load_job_cache(str(path), dr, tiny_llama, said.append)   # (none yet: starts empty)
    assert len(dr.job) == 0 and "does not exist yet" in said[-1]
    dr.learn_finished([5, 6, 7, 8], [9, 10, 11, 12])
    save_job_cache(str(path), dr, tiny_llama)   # (indexes what waits: flush_job)
    assert [p.name for p in path.parent.iterdir()] == ["job.safetensors"]   # (no temporary)
    warm = SelfDraftDrafter(SelfDraftParams(job_cache=True), None)
    load_job_cache(str(path), warm, tiny_llama, said.append)
    assert warm.job.table == dr.job.table and warm.job.buf == dr.job.buf
    assert warm.job.lookup([7, 8], 1) == [(9, 10, 11, 12)]
    other = make_tiny_model(tmp_path / "other", "llama", seed=1)
    with pytest.raises(SpecctlError, match="differs in: model"):
        load_job_cache(str(path), warm, other, said.append)
    longer = SelfDraftDrafter(SelfDraftParams(job_cache=True, job_len=8), None)
    with pytest.raises(SpecctlError, match="params"):
        load_job_cache(str(path), longer, tiny_llama, said.append)
    link = tmp_path / "link.safetensors"   # a symlink: its target written, the link kept
    link.symlink_to(path)
    save_job_cache(str(link), dr, tiny_llama)
    assert link.is_symlink() and path.is_file()
    path.write_bytes(path.read_bytes()[:40])   # a torn file
    with pytest.raises(SpecctlError):
        load_job_cache(str(path), warm, tiny_llama, said.append)
    notes = tmp_path / "notes.jsonl"   # (some other file: named as not a job cache, kept)
    notes.write_text('{"prompt": "mine"}\n')
    with pytest.raises(SpecctlError, match=r"^--job-cache-file .*notes\.jsonl: not a "
                                           r"safetensors file .*: not a job cache"):
        load_job_cache(str(notes), warm, tiny_llama, said.append)
    assert notes.read_text() == '{"prompt": "mine"}\n'
    from specctl.runtime.jobs.config import GenerateConfig
    for bad in ("/dev/null", str(tmp_path)):   # a device, a folder: refused as the job starts
        with pytest.raises(SpecctlError, match="--job-cache-file .* not a regular file"):
            GenerateConfig(input="in.jsonl", method="self-draft", job_cache=True,
                           job_cache_file=bad)


def test_job_cache_file_is_one_format_for_the_grid_and_the_per_sequence_steps(
        tiny_llama, tmp_path):
    """A grid drafter's job cache (its arrays' form, speculative/job_table.py) is saved as
    the dict's, and either loads the other's: a nightly job that ran at batch 64 one night
    and batch 8 the next keeps its cache."""
    from specctl.runtime.jobs.job_cache_file import load_job_cache, save_job_cache
    from specctl.speculative.job_table import JobTable
    path = tmp_path / "job.safetensors"
    grid = lambda: SelfDraftDrafter(SelfDraftParams(job_cache=True, grid=True), None,  # noqa
                                    vocab=300)
    flat = lambda: SelfDraftDrafter(SelfDraftParams(job_cache=True), None)  # noqa: E731
    dr = grid()
    assert isinstance(dr.job, JobTable)
    dr.learn_finished([5, 6, 7, 8], [9, 10, 11, 12])
    save_job_cache(str(path), dr, tiny_llama)
    for make in (flat, grid):
        warm = make()
        load_job_cache(str(path), warm, tiny_llama, lambda s: None)
        assert isinstance(warm.job, JobTable) == (make is grid)
        assert warm.job.lookup([7, 8], 1) == [(9, 10, 11, 12)]
    save_job_cache(str(path), warm, tiny_llama)   # (the grid's again, loaded by the dict's)
    back = flat()
    load_job_cache(str(path), back, tiny_llama, lambda s: None)
    assert back.job.lookup([6, 7, 8], 1) == [(9, 10, 11, 12)]


def test_a_job_cache_file_with_a_token_past_the_vocabulary_is_refused(tiny_llama, tmp_path):
    """A token id the model does not have (a file made for another vocabulary, or tampered
    with) would be drafted: the embedding's index error. Refused as the file loads."""
    from specctl.errors import SpecctlError
    from specctl.runtime.jobs.job_cache_file import load_job_cache, save_job_cache
    path = tmp_path / "job.safetensors"
    for grid in (False, True):
        dr = SelfDraftDrafter(SelfDraftParams(job_cache=True, grid=grid), None, vocab=300)
        dr.learn_finished([5, 6, 7, 8], [9, 10, 299])
        save_job_cache(str(path), dr, tiny_llama)
        load_job_cache(str(path), dr, tiny_llama, lambda s: None)   # (its own: fits)
        small = SelfDraftDrafter(SelfDraftParams(job_cache=True, grid=grid), None, vocab=299)
        with pytest.raises(SpecctlError, match="past the model's vocabulary of 299"):
            load_job_cache(str(path), small, tiny_llama, lambda s: None)
