"""AR generation through the runner: equals transformers' greedy, batch-size independent,
unpadded, continuous batching, stop conditions, and sampling."""

from __future__ import annotations

import pytest
import torch

from helpers import chi_square_ok, hf_greedy, random_prompts, run_ids
from specctl.speculative.sampling import SamplingParams


def _prompts(n, seed=0):
    return random_prompts(n, seed, max_len=40)


def test_greedy_equals_transformers(tiny_llama, model):
    prompts = _prompts(3)
    ours, _ = run_ids(model, prompts, max_tokens=12)
    for p, o in zip(prompts, ours):
        assert o == hf_greedy(tiny_llama, p, 12)


@pytest.mark.parametrize("batch_size", [2, 8])
def test_batched_equals_batch_one_and_is_unpadded(model, batch_size):
    prompts = _prompts(11, seed=1)   # more prompts than slots: continuous batching admits more
    ref, _ = run_ids(model, prompts, batch_size=1, max_tokens=10)
    before = model.tokens_computed
    got, stats = run_ids(model, prompts, batch_size=batch_size, max_tokens=10)
    assert got == ref
    # every token computed is a real token: prompts + one token per step per live sequence
    real = sum(len(p) for p in prompts) + stats.step_tokens
    assert model.tokens_computed - before == real
    assert stats.step_tokens == sum(len(o) - 1 for o in got)   # the first token comes from prefill


def test_slot_is_reused_when_a_sequence_finishes(model):
    # different budgets per request: short ones finish early and their slots get new prompts
    prompts = _prompts(6, seed=2)
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    from specctl.speculative.drafter import NoDraft

    reqs = [Request(i, [[]], 2 if i % 2 == 0 else 9) for i in range(6)]
    order = []
    r = Runner(model, NoDraft(), SamplingParams(), batch_size=2, max_len=128, eos_ids=set(),
               render=lambda q: prompts[q.index], decode=str)
    r.run(reqs, lambda q: order.append((q.index, len(q.answer_ids[0]))))
    assert sorted(order) == [(i, 2 if i % 2 == 0 else 9) for i in range(6)]
    # request 1 (9 tokens) is still running when request 2 (2 tokens) is admitted and done
    assert order.index((2, 2)) < order.index((1, 9))


def test_chunked_prefill_equals_one_shot(model):
    prompts = _prompts(4, seed=3)
    ref, _ = run_ids(model, prompts, batch_size=4, max_tokens=6)
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    from specctl.speculative.drafter import NoDraft
    got = {}
    r = Runner(model, NoDraft(), SamplingParams(), batch_size=4, max_len=128, eos_ids=set(),
               render=lambda q: prompts[q.index], decode=str, prefill_chunk=7)
    r.run([Request(i, [[]], 6) for i in range(4)], lambda q: got.__setitem__(q.index, q.answer_ids[0]))
    assert [got[i] for i in range(4)] == ref
    assert r.stats.prefill_forwards >= sum(len(p) for p in prompts) // 7


def test_a_prefill_forward_keeps_its_padded_attention_rows_within_pad_bytes(model,
                                                                            monkeypatch):
    """The unfused attention pads a prefill forward's prompts to its longest: 24 prompts of
    3-12 tokens beside one of 120, at 512 tokens a forward, would pad 25 x 120 rows. With a
    bound on their mask and bias (PAD_BYTES, made small here) the prompts go in more forwards,
    each within it, the long one in halves where alone it passes the bound: the same
    answers."""
    import specctl.runtime.step.prefill as P
    prompts = _prompts(24, seed=5)
    prompts.insert(3, [(7 * i) % 50 + 1 for i in range(120)])
    ref, st0 = run_ids(model, prompts, batch_size=25, max_tokens=4, max_len=160)
    col, row = P._padded_bytes(model)
    monkeypatch.setattr(P, "PAD_BYTES", 60 * (120 * col + row))   # (120 x 120 alone: over it)
    seen, halves, forward = [], [], model.forward

    def logged(batch, kv, *a, **kw):
        if max(batch.num_new) > 1 or len(batch.num_new) == 1 and batch.prefix_lens[0] == 0:
            seen.append(len(batch.num_new) * max(batch.num_new) * (batch.max_kv_len * col + row))
            halves.extend((p, n) for p, n in zip(batch.prefix_lens, batch.num_new) if n == 60)
        return forward(batch, kv, *a, **kw)
    monkeypatch.setattr(model, "forward", logged)
    got, st = run_ids(model, prompts, batch_size=25, max_tokens=4, max_len=160)
    assert got == ref
    assert st.prefill_forwards > st0.prefill_forwards
    assert seen and max(seen) <= P.PAD_BYTES, (seen, P.PAD_BYTES)
    assert halves == [(0, 60), (60, 60)]   # (the long prompt's halves)


def test_eos_and_context_stop(model):
    prompts = _prompts(2, seed=4)
    ref, _ = run_ids(model, prompts, max_tokens=12)
    eos = ref[0][4]
    got, _ = run_ids(model, prompts, max_tokens=12, eos_ids={eos})
    assert got[0] == ref[0][:ref[0].index(eos) + 1]   # EOS kept in the ids, generation stops
    # a context of prompt + 3 rows stops there
    got, _ = run_ids(model, prompts[:1], max_tokens=50, max_len=len(prompts[0]) + 4)
    assert len(got[0]) == 4 and got[0] == ref[0][:4]


def test_every_method_stops_at_the_context_as_ar_does(model):
    """Near the context end a step may accept only as many drafts as leave room for its bonus
    token: prompt and answer together stop at max_len for every method, as for ar (one draft
    too many made the speculative methods emit one token more there)."""
    from helpers import method_drafters
    prompts = [[5, 6, 7, 8] * 12, [9, 10, 11] * 15, [12, 13] * 21]   # repetitive: drafts hit
    max_len = 64
    ref, _ = run_ids(model, prompts, max_tokens=40, max_len=max_len)
    assert [len(p) + len(r) for p, r in zip(prompts, ref)] == [max_len] * 3
    full = [p + r for p, r in zip(prompts, ref)]
    for name, dr in method_drafters(model, prompts, ref).items():
        for b in (1, 3):
            got, stats = run_ids(model, prompts, batch_size=b, max_tokens=40, max_len=max_len,
                                 drafter=dr)
            assert [p + g for p, g in zip(prompts, got)] == full, (name, b)
            if dr is not None:
                assert sum(k * n for k, n in stats.accept_hist.items()) > 0, name


def test_sampling_same_seed_same_output_any_batch(model):
    prompts = _prompts(5, seed=5)
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=7)
    a, _ = run_ids(model, prompts, batch_size=1, max_tokens=8, sampling=sp)
    b, _ = run_ids(model, prompts, batch_size=4, max_tokens=8, sampling=sp)
    c, _ = run_ids(model, prompts, batch_size=4, max_tokens=8,
                   sampling=SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=8))
    assert a == b
    assert a != c


def test_sampling_matches_model_distribution(model):
    """The first sampled token's empirical distribution matches the warped softmax
    (temperature + top-p), by a chi-square test that a 10% temperature error fails."""
    prompt = _prompts(1, seed=6)[0]
    from specctl.engine.batch import ForwardBatch, SeqInput
    from specctl.speculative.sampling import warp
    kv = model.new_kv_cache(1, 64)
    logits = model.logits(model.forward(ForwardBatch([SeqInput(0, prompt, 0)]), kv))[-1]
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=3)
    p = warp(logits[None], sp)[0]
    n = 3000
    outs, _ = run_ids(model, [prompt] * n, batch_size=64, max_tokens=1, sampling=sp)
    counts = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=p.numel()).double()
    assert counts[p == 0].sum() == 0   # nothing outside the nucleus
    assert chi_square_ok(counts, p)


@pytest.mark.parametrize("empty", [0, 4])
def test_a_stop_string_many_tokens_long_ends_the_answer_at_its_last_token(model, empty):
    """The stop check decodes a window of the stop's length (plus slack) in tokens, not the
    answer: a stop string spanning 30 tokens, some of which decode to nothing, still ends
    the answer at the token that completes it, and its text is cut before it."""
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    from specctl.speculative.drafter import NoDraft
    prompt = random_prompts(1, seed=3)[0]   # (an answer of 26 different tokens)
    (ref,), _ = run_ids(model, [prompt], max_tokens=60)
    # tokens that decode to nothing (as skipped special tokens do), at most 8 times in the stop
    silent: set[int] = set()
    for t in dict.fromkeys(ref[12:38]):
        if len(silent) < empty and sum(x in silent or x == t for x in ref[10:40]) <= 8:
            silent.add(t)
    assert len(silent) == empty

    def decode(ids):   # one character per token, but the silent ones
        return "".join(chr(0x41 + t % 50) for t in ids if t not in silent)
    stop = decode(ref[10:40])
    assert len(stop) >= 22
    end = next(i for i in range(1, 61) if stop in decode(ref[:i]))
    got = {}
    Runner(model, NoDraft(), SamplingParams(), batch_size=1, max_len=256, eos_ids=set(),
           render=lambda r: prompt, decode=decode, stop=(stop,)).run(
        [Request(0, [[{}]], 60)], lambda r: got.update(ids=r.answer_ids[0], text=r.answers[0],
                                                      why=r.finish_reasons[0]))
    assert got["ids"] == ref[:end] and got["why"] == "stop_string"
    assert got["text"] == decode(ref[:end])[:decode(ref[:end]).find(stop)]


@pytest.mark.parametrize("grid", [False, True])
def test_drafts_past_where_the_answer_ends_are_not_counted_as_accepted(model, grid):
    """A step whose accepted drafts run past a stop string counts only the drafts its answer
    keeps: every step but the last emits its accepted drafts and a token after them, the last
    at most that (Self-Draft knowing the answer: its trees from an oracle corpus, its grid
    from the job cache of the same prompt answered before)."""
    from helpers import Oracle
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    prompt = random_prompts(1, seed=3)[0]
    (ref,), _ = run_ids(model, [prompt], max_tokens=40)

    def decode(ids):
        return "".join(chr(0x41 + t % 50) for t in ids)
    dr = SelfDraftDrafter(SelfDraftParams(branches=0, context_cands=4, grid=True,
                                          job_cache=True), vocab=model.cfg.vocab_size) \
        if grid else SelfDraftDrafter(SelfDraftParams(), Oracle([prompt + ref]))
    done, came = [], []
    # (the first run, without a stop, leaves the whole answer in the grid's job cache)
    for stop in [None] + [decode(ref[j:j + 2]) for j in range(8, 30, 3)]:
        st = Runner(model, dr, SamplingParams(), batch_size=1, max_len=256, eos_ids=set(),
                    render=lambda r: prompt, decode=decode,
                    stop=(stop,) if stop else ()).run(
            [Request(0, [[{}]], 40)], done.append if stop else lambda r: None)
        if stop:
            came.append(st.accepted_from)
    assert all(r.finish_reasons == ["stop_string"] for r in done)
    # (and the caches they came from count those drafts, no more: none below 0)
    assert [sum(c.values()) for c in came] == [sum(r.accept_lengths) for r in done]
    assert all(v >= 0 for c in came for v in c.values()), came
    # (the prefill's token, then each step's accepted drafts and the token after them, the
    # last step's perhaps not)
    ends = [len(r.answer_ids[0]) - 1 - sum(r.accept_lengths) - len(r.accept_lengths)
            for r in done]
    assert set(ends) <= {-1, 0}, ends
    assert any(sum(r.accept_lengths) for r in done)


@pytest.mark.parametrize("stop", ["User:", "ขอบคุณครับ", "🤖🤖🤖🤖🤖", "谢谢你的帮助！"])
def test_a_stop_string_of_many_tokens_a_character_is_found(model, tmp_path, stop):
    """A byte-level tokenizer spells a Thai, CJK or emoji character as several tokens: the stop
    check's window (sized in UTF-8 bytes) still sees the whole stop string, and the answer ends
    at the token that completes it."""
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request, Sequence
    from specctl.speculative.drafter import NoDraft
    from tiny import make_tokenizer
    tok = make_tokenizer(tmp_path)
    ids = tok.encode("Some answer text here. " + stop + " and more after it",
                     add_special_tokens=False)

    def decode(x):
        return tok.decode(x, skip_special_tokens=True)
    if not stop.isascii():   # (more tokens than a window of its characters and slack)
        assert len(tok.encode(stop, add_special_tokens=False)) > len(stop) + 8
    runner = Runner(model, NoDraft(), SamplingParams(), batch_size=1, max_len=256, eos_ids=set(),
                    render=lambda r: [], decode=decode, stop=(stop,))
    s = Sequence(Request(0, [[]], 200), [1, 2], 0)
    for t in ids:
        runner.answers.emit(s, [t])
        if s.finished:
            break
    assert s.finish_reason == "stop_string"
    assert len(s.out_ids) == next(i for i in range(1, len(ids) + 1) if stop in decode(ids[:i]))


@pytest.mark.parametrize("cleanup", [False, True])
def test_decoding_is_the_tokenizers(tiny_llama, tmp_path, cleanup):
    """Tokenization.decode calls a fast tokenizer's own decoder where the wrapper adds nothing
    (no space clean-up) and the wrapper otherwise: the tokenizer's text either way, special
    tokens skipped."""
    import json
    import random
    import shutil
    from specctl.runtime.jobs.tokenization import Tokenization
    d = tmp_path / "m"
    shutil.copytree(tiny_llama, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg,
                                                         "clean_up_tokenization_spaces": cleanup}))
    tk = Tokenization(d, True)
    assert (tk._fast is None) == cleanup
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(len(tk.tok)) for _ in range(rng.randrange(0, 30))]
        assert tk.decode(ids) == tk.tok.decode(ids, skip_special_tokens=True)
    assert tk.decode(tk.tok.encode("Hi there. Bye.", add_special_tokens=False)
                     + [tk.tok.eos_token_id]) == "Hi there. Bye."


def _emit_by_definition(s, tokens, eos, stop, decode, window, lens, max_len):
    """Answers.emit's definition, a token at a time: (s's tokens, finish_reason, pending,
    tokens counted as generated)."""
    out, reason, n = list(s.out_ids), s.finish_reason, 0
    for t in tokens:
        if len(out) >= s.req.max_tokens:
            reason = "length"
            break
        out.append(t)
        n += 1
        if t in eos:
            reason = "stop"
            break
        if stop and any(x in decode(out[-window:]) for x in stop):
            reason = "stop_string"
            break
    if reason is None and len(out) >= s.req.max_tokens:
        reason = "length"
    if reason is None and lens[s.slot] + 1 >= max_len:
        reason = "context"
    return out, reason, out[-1] if out else None, n


def test_emit_checks_each_token_as_its_definition_does():
    """Answers.emit (locals, one count) equals the token-at-a-time definition on random
    sequences: a finish reason set before, no tokens, the budget spent before or reached
    mid-list, EOS on the budget's last token, stop strings, the context's end."""
    import random

    from specctl.runtime.step.answers import Answers
    from specctl.runtime.step.sequence import Request, Sequence
    from specctl.runtime.step.stats import RunStats
    rng = random.Random(0)

    def decode(ids):
        return "".join(chr(97 + t % 5) for t in ids)
    for _ in range(3000):
        stop = rng.choice([(), ("cd",), ("e", "aab")])
        lens, max_len = [rng.randrange(30)], 30
        kv = type("KV", (), {"lens": lens})()
        st = RunStats()
        answers = Answers({4, 9}, stop, decode, kv, max_len, st)
        s = Sequence(Request(0, [[]], max_tokens=rng.randrange(1, 8)), [1], 0)
        s.out_ids = [rng.randrange(12) for _ in range(rng.randrange(s.req.max_tokens + 1))]
        s.finish_reason = rng.choice([None] * 4 + ["stop", "context"])
        tokens = [rng.randrange(12) for _ in range(rng.randrange(5))]
        want = _emit_by_definition(s, tokens, {4, 9}, answers.stop, decode,
                                   answers.stop_window, lens, max_len)
        answers.emit(s, tokens)
        assert (s.out_ids, s.finish_reason, s.pending, st.generated) == want


@pytest.mark.parametrize("greedy", [True, False])
def test_an_ar_steps_verdicts_are_its_rows_tokens_and_commit_emits_them(model, monkeypatch,
                                                                          greedy):
    """A greedy step of a row a sequence verifies into RowVerdicts (the row tokens, no
    probe output), sampling into a Verdict a sequence; commit emits each one's bonus (every
    token after the prefill's is a step's bonus; greedy: the run equals batch 1's)."""
    from specctl.runtime.step import stepping as R
    from specctl.speculative.verify import RowVerdicts, Verdict
    seen, real = [], R.commit

    def commit(plan, out, *a):
        seen.append((type(out.verdicts), out.probe_out, [v.bonus for v in out.verdicts]))
        return real(plan, out, *a)
    monkeypatch.setattr(R, "commit", commit)
    prompts = random_prompts(5, seed=3)
    sp = SamplingParams() if greedy else SamplingParams(temperature=0.8, seed=1)
    got, _ = run_ids(model, prompts, batch_size=3, max_tokens=6, sampling=sp)
    assert seen and all(t is (RowVerdicts if greedy else tuple) for t, _, _ in seen)
    assert all(p == (None,) * len(b) for _, p, b in seen)
    # (what a step emitted is what its verdicts hold: each answer's tokens after its first,
    # the prefill's, are the bonuses in step order)
    assert sum(len(b) for _, _, b in seen) == sum(len(g) - 1 for g in got)
    assert all(type(v) is Verdict for v in RowVerdicts([1, 2]))
    if greedy:
        assert got == run_ids(model, prompts, batch_size=1, max_tokens=6)[0]
