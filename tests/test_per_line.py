"""A line's own sampling settings and --logprobs (io/prompts.py, runtime/jobs/groups.py,
runtime/step/logprobs.py): checked like every other field, applied to their own line only, and
every method stays token-identical to ar under them."""

from __future__ import annotations

import json
import random

import pytest

from helpers import method_drafters
from specctl.errors import SpecctlError
from specctl.io.prompts import prompt_record
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.groups import run_groups
from specctl.runtime.step.sequence import Request


def test_settings_are_read_and_checked():
    r = prompt_record({"prompt": "hi", "sampling": {"temperature": 0.7, "seed": 3,
                                                    "stop": "\n\n", "logprobs": 2}})
    assert r.sampling == {"temperature": 0.7, "seed": 3, "stop": ("\n\n",), "logprobs": 2}
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9,
            "top_k": 5, "seed": 1, "stop": ["a", "b"], "logprobs": True, "top_logprobs": 3,
            "max_tokens": 9}
    r = prompt_record({"custom_id": "x", "body": body})
    assert r.sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 1,
                          "stop": ("a", "b"), "logprobs": 3} and r.max_tokens == 9
    quiet = {**body, "logprobs": False, "top_logprobs": None}
    assert prompt_record({"body": quiet}).sampling["temperature"] == 0.5
    assert "logprobs" not in prompt_record({"body": quiet}).sampling
    assert prompt_record({"prompt": "hi"}).sampling is None
    assert prompt_record({"body": {**body, "n": 3}}).sampling["n"] == 3
    assert prompt_record({"body": {**body, "top_k": -1}}).sampling["top_k"] == 0
    off = {"frequency_penalty": 0, "repetition_penalty": 1.0, "best_of": 1, "model": "x"}
    assert prompt_record({"body": {**body, **off}}).sampling["seed"] == 1
    assert "n" not in prompt_record({"prompt": "x", "sampling": {"n": 1, "seed": 2}}).sampling
    for bad, needle in [
        ({"prompt": "x", "sampling": {"temperature": -1}}, "sampling.temperature"),
        ({"prompt": "x", "sampling": {"top_p": 0}}, "sampling.top_p"),
        ({"prompt": "x", "sampling": {"top_k": 1.5}}, "sampling.top_k"),
        ({"prompt": "x", "sampling": {"seed": -1}}, "sampling.seed"),
        ({"prompt": "x", "sampling": {"stop": ""}}, "sampling.stop"),
        ({"prompt": "x", "sampling": {"stop": ["a"] * 17}}, "sampling.stop"),
        ({"prompt": "x", "sampling": {"stop": "\ud800"}}, "surrogate"),
        ({"prompt": "x", "sampling": {"logprobs": 21}}, "sampling.logprobs"),
        ({"prompt": "x", "sampling": {"logprobs": True}}, "sampling.logprobs"),
        ({"prompt": "x", "sampling": {"temprature": 1}}, "sampling.temprature"),
        ({"prompt": "x", "sampling": []}, "sampling"),
        ({"prompt": "x", "sampling": {"temperature": float("nan")}}, "sampling.temperature"),
        ({"body": {**body, "n": 17}}, "body.n"),
        ({"prompt": "x", "sampling": {"temperature": 1e-300}}, "sampling.temperature"),
        ({"body": {**body, "logprobs": None}}, "body.top_logprobs"),
        ({"prompt": "x", "sampling": {"n": 0}}, "sampling.n"),
        ({"body": {**body, "logprobs": 1}}, "body.logprobs"),
        ({"body": {**body, "top_logprobs": 30}}, "body.top_logprobs"),
        ({"body": body, "sampling": {"seed": 1}}, "sampling"),
        ({"body": {**body, "sampling": {"n": 2}}}, "body.sampling"),
        ({"body": {**body, "frequency_penalty": 0.5}},
         "body.frequency_penalty: not supported (specctl samples without penalties, biases, "
         "min_p or best_of): set it to 0 or leave it out"),
        ({"body": {**body, "logit_bias": {"5": 1}}}, "body.logit_bias"),
        # (a JSON mode or tools change the answer too: a helper's probe ran them as plain chat)
        ({"body": {**body, "response_format": {"type": "json_object"}}},
         "body.response_format: not supported (specctl answers in plain text: no response "
         "format, no tools): leave it out"),
        ({"body": {**body, "tools": [{"type": "function", "function": {"name": "f"}}]}},
         "body.tools: not supported"),
        # (at a line's top level they were read by nobody: its temperature ran greedy)
        ({"prompt": "x", "temperature": 0.9}, 'temperature: a line\'s sampling settings go in '
                                               '"sampling": {...}, not at its top level'),
        ({"turns": ["x"], "seed": 5}, "seed: a line's sampling settings go in"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["e"]}, "stop:"),
        ({"prompt": "x", "n": 3}, "n:"),
        ({"prompt": "x", "min_p": 0.1}, "min_p: not supported (specctl samples without "
                                         "penalties, biases, min_p or best_of): set it to 0"),
        ({"custom_id": "c", "body": body, "temperature": 1}, "temperature: a line's sampling "
                                                             "settings go in its body"),
    ]:
        with pytest.raises(SpecctlError) as e:
            prompt_record(bad)
        assert needle in str(e.value), (bad, str(e.value))


def test_a_lines_id_is_carried_beside_custom_id_and_question_id():
    """Every id a line carries reaches its output line: its "id" beside the custom_id or
    question_id that keys it (the first found used to be the only one kept)."""
    from specctl.runtime.jobs.tokenization import record_meta
    q = prompt_record({"question_id": 5, "id": "myid", "turns": ["hi"]})
    c = prompt_record({"custom_id": "c1", "id": 7, "body": {"messages": [
        {"role": "user", "content": "y"}]}})
    assert record_meta(q) == {"index": 0, "question_id": 5, "id": "myid"}
    assert record_meta(c) == {"index": 0, "custom_id": "c1", "id": 7}
    # all three: each one (question_id beside a custom_id was dropped), and each checked
    a = prompt_record({"custom_id": "r", "question_id": 82, "id": "i", "prompt": "hi"})
    assert record_meta(a) == {"index": 0, "custom_id": "r", "question_id": 82, "id": "i"}
    with pytest.raises(SpecctlError, match="question_id: must be a string or integer"):
        prompt_record({"custom_id": "r", "question_id": 1.5, "prompt": "hi"})
    # (a Parquet column with nulls reads as float: 81.0 is id 81, as it was before it was kept)
    f = prompt_record({"custom_id": "r", "question_id": 81.0, "prompt": "hi"})
    assert record_meta(f) == {"index": 0, "custom_id": "r", "question_id": 81}
    assert record_meta(prompt_record({"id": "a", "prompt": "x"})) == {"index": 0, "id": "a"}
    with pytest.raises(SpecctlError, match="id: must be a string or integer"):
        prompt_record({"question_id": 5, "id": [1], "turns": ["hi"]})
    # (null is absent, at the top level as everywhere; an unsupported setting at its off too)
    assert prompt_record({"prompt": "x", "seed": None, "frequency_penalty": 0}).sampling is None
    from pathlib import Path
    from specctl.io.prompts import line_record
    bad = line_record({"question_id": 5, "id": "mine", "turns": []}, 0, 1, Path("f"), True)
    assert bad.error and record_meta(bad) == {"index": 0, "question_id": 5, "id": "mine"}


class _Tok:
    """What make_runner needs of a Tokenization, over token-id prompts."""
    eos_ids: set = set()

    def __init__(self, prompts):
        self.prompts = prompts

    def render(self, req):
        return self.prompts[req.index]

    def decode(self, ids):
        return " ".join(map(str, ids))


def _run(model, drafter, prompts, own, batch, max_tokens=10, first=0, **kw):
    """(ids per request, logprobs per request) of a run in which request i (numbered from
    `first`: a request's draws are keyed by its number) has settings own[i] (None: the
    run's)."""
    cfg = GenerateConfig(input="-", batch_size=batch, max_tokens=max_tokens, device="cpu",
                         dtype="fp32", speculate="fixed", threads=1, **kw)
    ix = range(first, first + len(own))
    reqs = [Request(i, [[{"role": "user", "content": str(i)}]], max_tokens, sampling=o)
            for i, o in zip(ix, own)]
    done = {}
    run_groups(cfg, model, drafter, _Tok(dict(zip(ix, prompts))),
               [(q, len(p) + max_tokens + 8) for q, p in zip(reqs, prompts)],
               lambda q: done.__setitem__(q.index, q))
    return ([done[i].answer_ids[0] for i in ix],
            [done[i].logprobs[0] if done[i].logprobs else None for i in ix])


def _prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(30) for _ in range(rng.randint(3, 12))] for _ in range(n)]


OWN = [None, {"temperature": 0.9, "seed": 5}, {"temperature": 0.9, "seed": 6, "top_k": 8},
       {"logprobs": 3}, None, {"temperature": 0.7, "top_p": 0.8, "seed": 1, "logprobs": 0}]


def test_a_lines_settings_change_only_its_own_output(model):
    from specctl.speculative.drafter import NoDraft
    prompts = _prompts(len(OWN))
    plain, _ = _run(model, NoDraft(), prompts, [None] * len(OWN), batch=3)
    mixed, _ = _run(model, NoDraft(), prompts, OWN, batch=3)
    for i, o in enumerate(OWN):
        if o is None or "temperature" not in o:
            assert mixed[i] == plain[i], i          # greedy lines: as without the others
        else:                                       # a sampled line: as run alone with its own
            alone, _ = _run(model, NoDraft(), [prompts[i]], [o], batch=1, first=i)
            assert mixed[i] == alone[0], i
    assert mixed[1] != plain[1] or mixed[2] != plain[2]   # the settings did something


@pytest.mark.parametrize("batch", [1, 3])
def test_every_method_matches_ar_under_per_line_settings(model, batch):
    """Greedy lines (and their logprobs, within 1e-4) are ar's for every method; seeded
    sampled lines are ar's for Self-Draft (deterministic drafts, verified at ar's draws)."""
    prompts = _prompts(len(OWN), seed=2)
    from specctl.speculative.drafter import NoDraft
    ref, ref_lp = _run(model, NoDraft(), prompts, OWN, batch=batch)
    drafters = method_drafters(model, prompts, ref)
    for name, dr in drafters.items():
        if dr is None:
            continue
        got, lp = _run(model, dr, prompts, OWN, batch=batch)
        for i, o in enumerate(OWN):
            if o is None or "temperature" not in o or name == "self-draft":
                assert got[i] == ref[i], (name, i)
            if ref_lp[i] is not None and got[i] == ref[i]:
                for (a, ta), (b, tb) in zip(lp[i], ref_lp[i]):
                    assert a == pytest.approx(b, abs=1e-4), (name, i)
                    assert [t for t, _ in ta] == [t for t, _ in tb], (name, i)


def test_seeds_share_a_runner_and_n_answers_are_seeds_in_a_row(model, monkeypatch):
    """Lines that differ only in their seed run in one group (the seed is the request's); a
    line asking for n answers gets n, answer j drawn with seed + j (as a line of that seed
    run alone), counted together."""
    from specctl.runtime.jobs import groups
    from specctl.runtime.jobs.records import output_line
    from specctl.speculative.drafter import NoDraft
    made = []
    real = groups.make_runner
    monkeypatch.setattr(groups, "make_runner", lambda *a, **kw: made.append(1) or real(*a, **kw))
    prompts = _prompts(4, seed=4)
    own = [{"temperature": 0.9, "seed": s} for s in (1, 2, 3)] + [None]
    _run(model, NoDraft(), prompts, own, batch=4, temperature=0.9)
    assert len(made) == 1
    cfg = GenerateConfig(input="-", batch_size=3, max_tokens=8, device="cpu", dtype="fp32",
                         speculate="fixed", threads=1, temperature=0.9, seed=7)
    req = Request(0, [[{"role": "user", "content": "0"}]], 8, sampling={"n": 3})
    done = []
    groups.run_groups(cfg, model, NoDraft(), _Tok({0: prompts[0]}),
                      [(req, len(prompts[0]) + 16)], done.append)
    (got,) = done
    assert len(got.samples) == 3 and got.samples[0] is got
    for j, q in enumerate(got.samples):
        alone, _ = _run(model, NoDraft(), [prompts[0]], [None], batch=1, max_tokens=8,
                        temperature=0.9, seed=7 + j)
        assert q.answer_ids[0] == alone[0], j
    line = output_line(got)
    assert [a["token_ids"] for a in line["samples"]] == [q.answer_ids for q in got.samples]
    assert line["new_tokens"] == sum(len(q.answer_ids[0]) for q in got.samples)
    assert line["text"] == line["samples"][0]["text"]


def test_n_answers_without_a_seed_are_kept_apart_by_their_line(model):
    """Lines of one prompt asking for n answers, without a seed of their own: each line's
    samples are its own, as every unseeded line's draws are keyed by its position (they were
    drawn with the run's seed + j as the line's own seed: every such line gave the same n)."""
    from specctl.runtime.jobs import groups
    from specctl.speculative.drafter import NoDraft
    p = _prompts(1, seed=6)[0]
    cfg = GenerateConfig(input="-", batch_size=4, max_tokens=8, device="cpu", dtype="fp32",
                         speculate="fixed", threads=1, temperature=1.0, seed=5)
    reqs = [Request(i, [[{"role": "user", "content": str(i)}]], 8, sampling={"n": 2})
            for i in range(3)]
    done = []
    groups.run_groups(cfg, model, NoDraft(), _Tok({i: p for i in range(3)}),
                      [(q, len(p) + 16) for q in reqs], done.append)
    got = {q.index: [s.answer_ids[0] for s in q.samples] for q in done}
    assert got[0] != got[1] != got[2] != got[0] and all(a != b for a, b in got.values())
    # (and line 0's first is what line 0 alone draws with the run's seed, unlike a line seeded
    # with it elsewhere)
    alone, _ = _run(model, NoDraft(), [p], [None], batch=1, max_tokens=8, temperature=1.0,
                    seed=5)
    seeded, _ = _run(model, NoDraft(), [p, p], [None, {"temperature": 1.0, "seed": 5}],
                     batch=2, max_tokens=8, temperature=1.0, seed=5)
    assert got[0][0] == alone[0] and got[1][0] != seeded[1]


def test_a_seed_of_its_own_samples_the_same_answer_wherever_its_line_is(model):
    """The same prompt with the same seed of its own: the same answer at line 0 and line 3
    (as vLLM's per-request seeds); without one, lines are kept apart by their position."""
    from specctl.speculative.drafter import NoDraft
    p = _prompts(1, seed=5)[0]
    own = {"temperature": 1.0, "seed": 11}
    ids, _ = _run(model, NoDraft(), [p, p, p, p], [own, None, None, own], batch=2,
                  temperature=1.0)
    assert ids[0] == ids[3] and ids[1] != ids[2]


def test_logprobs_are_the_models_own(model):
    """--logprobs N: the chosen token's log-probability and the N likeliest, in order; greedy,
    the chosen token is the likeliest; a softmax's log: they are <= 0 and sum below 1."""
    from specctl.speculative.drafter import NoDraft
    prompts = _prompts(2, seed=3)
    ids, lps = _run(model, NoDraft(), prompts, [None, None], batch=2, logprobs=4)
    for toks, lp in zip(ids, lps):
        assert len(lp) == len(toks)
        for t, (c, top) in zip(toks, lp):
            assert len(top) == 4 and top[0][0] == t and c == pytest.approx(top[0][1])
            vals = [v for _, v in top]
            assert vals == sorted(vals, reverse=True) and all(v <= 0 for v in vals)
            assert sum(2.718281828 ** v for v in vals) <= 1 + 1e-6


def test_generate_file_with_per_line_settings(tmp_path, tiny_llama):
    """The CLI: lines with their own settings, token ids and logprobs in the output."""
    from typer.testing import CliRunner

    from specctl.cli import app
    lines = [{"prompt": "one two"}, {"prompt": "one two", "sampling": {"temperature": 1.0,
                                                                        "seed": 4}},
             {"custom_id": "c", "body": {"messages": [{"role": "user", "content": "one two"}],
                                         "logprobs": True, "top_logprobs": 2}}]
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    out = tmp_path / "o.jsonl"
    r = CliRunner().invoke(app, ["generate", str(inp), "--model", str(tiny_llama), "--store",
                                 str(tmp_path / "s"), "-o", str(out), "--max-tokens", "6",
                                 "--device", "cpu", "--dtype", "fp32", "-q"])
    assert r.exit_code == 0, r.output
    got = [json.loads(l) for l in out.read_text().splitlines()]
    assert all(len(g["token_ids"]) == 1 and len(g["token_ids"][0]) == g["new_tokens"]
               for g in got)
    assert got[2]["token_ids"] == got[0]["token_ids"]         # greedy, as the plain line
    assert "logprobs" not in got[0] and len(got[2]["logprobs"][0]) == got[2]["new_tokens"]
    assert all(len(top) == 2 for _, top in got[2]["logprobs"][0])


def test_runs_of_files_with_per_line_settings_key_apart(tmp_path):
    """An older specctl ignored a line's own settings: its runs of such a file must not be
    resumed, so their key gains a mark; settings anywhere in the file count (a --limit run of
    the first lines resumes to the rest)."""
    from specctl.runtime.jobs.records import per_line, read_input
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "a"}) + "\n" +
                 json.dumps({"prompt": "b", "sampling": {"seed": 1}}) + "\n")
    cfg = GenerateConfig(input=str(f))
    assert per_line(read_input(cfg, f).own_settings) == ":per-line"
    limited = GenerateConfig(input=str(f), limit=1)
    got = read_input(limited, f)
    assert len(got.records) == 1 and per_line(got.own_settings) == ":per-line"
    f.write_text(json.dumps({"prompt": "a"}) + "\n")
    assert per_line(read_input(cfg, f).own_settings) == ""
