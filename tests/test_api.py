"""The Python API (`from specctl import Generator`): the same answers as `specctl generate`,
token for token, and lossless across methods; typed outputs; its mistakes as SpecctlError."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

import specctl
from specctl import GenerationOutput, Generator
from specctl.cli import app
from specctl.errors import SpecctlError

PROMPTS = [
    "What is the capital of France?",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A poem."}],
    {"turns": ["Explain transformers.", "Now in one sentence."]},
    {"prompt": "Count to three", "max_tokens": 3},
]
MAX_TOKENS = 6


def _gen(tiny_llama, tmp_path, method="ar", **kw):
    return Generator(str(tiny_llama), method, store=tmp_path / "store", device="cpu",
                     dtype="fp32", max_tokens=MAX_TOKENS, **kw)


def test_generate_matches_the_cli(tiny_llama, tmp_path):
    outs = _gen(tiny_llama, tmp_path, batch_size=2).generate(PROMPTS)
    assert [o.index for o in outs] == list(range(len(PROMPTS)))
    assert all(isinstance(o, GenerationOutput) for o in outs)
    assert len(outs[2].turns) == 2 and outs[3].new_tokens <= 3
    assert len(outs[2].finish_reasons) == 2 and outs[2].finish_reasons[-1] == outs[2].finish_reason
    with pytest.raises(specctl.SpecctlError):   # (exported: what every mistake is)
        Generator(str(tiny_llama), batch_size=0)

    inp = tmp_path / "p.jsonl"
    lines = [{"prompt": p} if isinstance(p, str) else {"messages": p} if isinstance(p, list)
             else p for p in PROMPTS]
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    out = tmp_path / "cli.jsonl"
    r = CliRunner().invoke(app, ["generate", str(inp), "--model", str(tiny_llama), "--store",
                                 str(tmp_path / "store"), "--out", str(out), "--max-tokens",
                                 str(MAX_TOKENS), "--device", "cpu", "--dtype", "fp32", "-q"])
    assert r.exit_code == 0, r.output
    cli = [json.loads(l) for l in out.read_text().splitlines()]
    for o, c in zip(outs, cli):
        assert o.text == c["text"] and o.new_tokens == c["new_tokens"]
        assert o.turns == c.get("turns", [c["text"]])
        assert o.accept_lengths == c["accept_lengths"] and o.finish_reason == c["finish_reason"]


def test_methods_are_lossless_and_calls_independent(tiny_llama, tmp_path):
    ar = _gen(tiny_llama, tmp_path).generate(PROMPTS)
    sd = _gen(tiny_llama, tmp_path, "self-draft", corpus_cache="none", prompt_grams=True)
    first = sd.generate(PROMPTS)
    assert [o.token_ids for o in first] == [o.token_ids for o in ar]
    assert [o.token_ids for o in sd.generate(PROMPTS)] == [o.token_ids for o in first]
    assert sum(o.steps for o in first) <= sum(o.steps for o in ar)


def test_a_stop_string_is_one_string_in_every_form(tiny_llama, tmp_path):
    """stop="x" is one stop string (it was split into letters: any of them stopped the answer),
    in the Generator and in a call, as a list is (a Generator's list was unhashable)."""
    g = _gen(tiny_llama, tmp_path)
    text = g.generate(PROMPTS[:1], max_tokens=16)[0].text
    # the answer's second character, then text it never has: no stop (split into letters,
    # the second character stopped it)
    stop = text[1] + "QZX"
    assert "QZX" not in text
    for got in (g.generate(PROMPTS[:1], 16, stop=stop), g.generate(PROMPTS[:1], 16, stop=[stop]),
                _gen(tiny_llama, tmp_path, stop=stop).generate(PROMPTS[:1], 16),
                _gen(tiny_llama, tmp_path, stop=[stop]).generate(PROMPTS[:1], 16)):
        assert got[0].text == text and got[0].finish_reason == "length", (got[0].text, text)
    with pytest.raises(SpecctlError, match="stop"):
        _gen(tiny_llama, tmp_path, stop=[stop, 3])
    # (as many as a line may give: 16)
    assert len(_gen(tiny_llama, tmp_path, stop=[str(i) for i in range(16)]).config().stop) == 16
    with pytest.raises(SpecctlError, match="at most 16 stop strings, got 17"):
        _gen(tiny_llama, tmp_path, stop=[str(i) for i in range(17)])
    assert _gen(tiny_llama, tmp_path, stop=None).config().stop == ()   # (None: none)


def test_ar_under_auto_admits_in_groups_and_under_fixed_at_once(tiny_llama, tmp_path):
    """make_runner's wiring: `ar` under --speculate auto (its default) groups admissions as
    every controlled run does; under fixed it admits at once (a schedule of the inputs)."""
    from specctl.runtime.jobs.methods import make_drafter
    from specctl.runtime.jobs.sizing import make_runner
    from specctl.runtime.step.threads import usable_cpus
    g = _gen(tiny_llama, tmp_path)
    model_dir, tk, model, _ = g._load(g.config())
    for speculate, grouped in (("auto", True), ("fixed", False)):
        cfg = g.config(speculate=speculate)
        runner = make_runner(cfg, model, make_drafter(cfg, model, model_dir, g.store,
                                                      lambda *a: None), tk, [64, 64])
        assert runner.grouped is grouped and runner.controller is None, speculate
    # (more --threads than the CPUs it may run on is said once a call, not silently
    # oversubscribed; never where none was given: auto's pilot sets its own)
    from specctl.reporting import Reporter
    inp = tmp_path / "p.jsonl"
    inp.write_text(json.dumps({"prompt": "hello"}) + "\n")
    for threads, said in ((None, 0), (1, 0), (usable_cpus() + 1, 1)):
        msgs: list[str] = []
        g = _gen(tiny_llama, tmp_path, "auto", threads=threads, report=Reporter(msgs.append))
        g.generate(PROMPTS[:1], 4)
        g.generate_file(inp)
        assert sum("is more than the" in m for m in msgs) == 2 * said, (threads, msgs)


def test_generate_file_is_the_cli_job(tiny_llama, tmp_path):
    inp = tmp_path / "p.jsonl"
    inp.write_text(json.dumps({"prompt": "hello"}) + "\n")
    res = _gen(tiny_llama, tmp_path).generate_file(inp, tmp_path / "o.jsonl")
    assert res["metrics"]["requests"] == 1 and (tmp_path / "o.jsonl").is_file()
    assert (res["run_dir"] / "metrics.json").is_file()


def test_mistakes_are_specctl_errors(tiny_llama, tmp_path):
    with pytest.raises(SpecctlError, match="unknown option 'batchsize'"):
        Generator(str(tiny_llama), batchsize=2)
    with pytest.raises(SpecctlError, match="unknown method"):
        Generator(str(tiny_llama), "fast")
    g = _gen(tiny_llama, tmp_path)
    with pytest.raises(SpecctlError, match="list of prompts"):
        g.generate("hello")
    with pytest.raises(SpecctlError, match="prompt 1"):
        g.generate(["ok", {"nothing": 1}])
    with pytest.raises(SpecctlError, match="list of prompts .* got NoneType"):
        g.generate(None)
    with pytest.raises(SpecctlError, match="prompt 0: a string, a list of messages or a "
                                           "prompt-line dict, got NoneType"):
        g.generate([None])
    assert g.generate([]) == []


def test_a_setting_of_the_wrong_type_is_a_specctl_error(tiny_llama, tmp_path):
    """The API's keywords come unchecked by a command line: a string or a float where a
    count goes failed deep in the run with a TypeError (after the model loaded). numpy's
    numbers and a Path for a FILE are what they say."""
    import numpy as np
    from pathlib import Path
    for kw, said in [({"batch_size": "4"}, "batch_size must be an integer, got '4'"),
                     ({"max_tokens": 3.5}, "max_tokens must be an integer, got 3.5"),
                     ({"max_tokens": True}, "max_tokens must be an integer, got True"),
                     ({"temperature": "0.5"}, "temperature must be a number"),
                     ({"chat": "no"}, "chat must be True or False"),
                     ({"skip_set": 3}, "skip_set must be a string"),
                     ({"dtype": "fp8"}, "dtype must be auto, fp32, bf16 or fp16, got 'fp8'")]:
        with pytest.raises(SpecctlError, match="^" + re.escape(said)):
            Generator(str(tiny_llama), **kw)
    # (not settings: the store, the reporter, generate_file's resume)
    for kw, said in [({"store": 5}, "Generator: store must be a folder's path or a Store"),
                     ({"report": 5}, "Generator: report must be a specctl.reporting.Reporter")]:
        with pytest.raises(SpecctlError, match="^" + re.escape(said)):
            Generator(str(tiny_llama), **kw)
    g = _gen(tiny_llama, tmp_path)
    with pytest.raises(SpecctlError, match="^resume must be True or False, got 'no'$"):
        g.generate_file(tmp_path / "p.jsonl", resume="no")
    for kw, said in [({"out": 5}, "out must be a file path (a str or os.PathLike), got 5"),
                     ({"out": b"o.jsonl"}, "out must be a file path"),
                     ({"out": ["x"]}, "out must be a file path"),
                     ({"input": None}, "input must be a file path (a str or os.PathLike), "
                                       "got None")]:
        with pytest.raises(SpecctlError, match="^" + re.escape(said)):
            g.generate_file(**{"input": tmp_path / "p.jsonl", **kw})
    # (any path-like store, py.path's too; numpy's bool a bool)
    import py
    assert Generator(str(tiny_llama), store=py.path.local(tmp_path / "s")).store.root == \
        tmp_path / "s"
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    assert g.generate_file(tmp_path / "p.jsonl", resume=np.bool_(False))["metrics"]
    with pytest.raises(SpecctlError, match="^top_k must be an integer, got 2.5$"):
        g.generate(["hi"], temperature=0.5, top_k=2.5)
    c = Generator(Path(tiny_llama), max_tokens=np.int64(4), temperature=np.float32(0.5)).config()
    assert (type(c.max_tokens), type(c.temperature), type(c.model)) == (int, float, str)


def test_n_answers_count_tokens_and_steps_over_every_sample(tiny_llama, tmp_path):
    """A prompt of n answers: its GenerationOutput counts new tokens and steps over all n, as
    its output line does (they counted the first answer only: 12 against the line's 36)."""
    line = {"prompt": "abc", "sampling": {"temperature": 0.7, "seed": 1, "n": 3}}
    (out,) = _gen(tiny_llama, tmp_path).generate([line], max_tokens=6)
    assert len(out.samples) == 3
    assert out.new_tokens == sum(q.new_tokens for q in out.samples) > out.samples[0].new_tokens
    assert out.steps == sum(q.steps for q in out.samples)
    inp = tmp_path / "n.jsonl"
    inp.write_text(json.dumps(line) + "\n")
    res = _gen(tiny_llama, tmp_path).generate_file(inp, tmp_path / "n.out.jsonl")
    got = json.loads((tmp_path / "n.out.jsonl").read_text())
    assert (got["new_tokens"], got["steps"]) == (out.new_tokens, out.steps), res


def test_generate_file_refuses_an_out_that_would_lose_prompts(tiny_llama, tmp_path):
    """The CLI's checks on --out hold for the API's generate_file too (one check_out): the
    input file itself is not overwritten, and answers do not go inside an input directory of
    shards (the next run read them back as prompts: 2 requests, then 4 with an error)."""
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"prompt": "river flows"}) + "\n")
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "part-0.jsonl").write_text(json.dumps({"prompt": "dogs bark"}) + "\n")
    g = _gen(tiny_llama, tmp_path)
    with pytest.raises(SpecctlError, match="^out .* is the input file"):
        g.generate_file(q, q)
    assert q.read_text() == json.dumps({"prompt": "river flows"}) + "\n"
    with pytest.raises(SpecctlError, match="^out .* inside the input directory"):
        g.generate_file(shards, shards / "answers.jsonl")
    assert sorted(p.name for p in shards.iterdir()) == ["part-0.jsonl"]
    assert g.generate_file(shards, tmp_path / "a.jsonl")["metrics"]["requests"] == 1
    # a link placed in the folder is read as a shard: answers through it would replace the
    # prompts of the file it names, wherever that is
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps({"prompt": "second"}) + "\n")
    (shards / "ans.jsonl").symlink_to(elsewhere)
    with pytest.raises(SpecctlError, match="inside the input directory"):
        g.generate_file(shards, shards / "ans.jsonl")
    assert elsewhere.read_text() == json.dumps({"prompt": "second"}) + "\n"


def test_mistakes_name_the_keyword_given_and_the_cli_its_flag(tiny_llama, tmp_path):
    """A setting's check names what the caller wrote: `batch_size` in the API, `--batch-size`
    on the command line (the same check, one GenerateConfig)."""
    with pytest.raises(SpecctlError, match=r"^batch_size must be at least 1$"):
        Generator(str(tiny_llama), batch_size=0)
    with pytest.raises(SpecctlError, match=r"^job_cache_file needs job_cache=True$"):
        Generator(str(tiny_llama), "self-draft", job_cache_file="x.jsonl")
    with pytest.raises(SpecctlError, match=r"^max_tokens must be at least 1$"):
        _gen(tiny_llama, tmp_path).generate(["hi"], max_tokens=0)
    with pytest.raises(SpecctlError, match=r"^--batch-size must be at least 1$"):
        Generator(str(tiny_llama), batch_size=0, flags=True)
    # a flag only where it stands as a word: not inside a path or quoted text; a switch as
    # its setting; the exception's own class kept (RankStopped under torchrun)
    from specctl.runtime.jobs.dist import RankStopped
    from specctl.runtime.jobs.generator import _keywords
    assert _keywords("in--out/p.jsonl:2: stop '--no-chat' (--max-tokens 5), add --resume") \
        == "in--out/p.jsonl:2: stop '--no-chat' (max_tokens 5), add resume=True"
    assert _keywords("--no-chat needs a 'prompt' line") == "chat=False needs a 'prompt' line"
    with pytest.raises(SpecctlError, match=r"^prompt 1: chat=False needs a 'prompt' line"):
        Generator(str(tiny_llama), chat=False, store=tmp_path / "store").generate(
            ["ok", [{"role": "user", "content": "x"}]], max_tokens=2)   # (0-based, as all)
    assert type(_gen(tiny_llama, tmp_path)._said(RankStopped(3))) is RankStopped
    inp = tmp_path / "p.jsonl"
    inp.write_text(json.dumps({"prompt": "hello"}) + "\n")
    r = CliRunner().invoke(app, ["generate", str(inp), "--model", str(tiny_llama),
                                 "--batch-size", "0", "--store", str(tmp_path / "s")])
    assert r.exit_code != 0 and "--batch-size must be at least 1" in r.output, r.output


def test_a_generator_loads_its_model_once_for_every_call(tiny_llama, tmp_path, monkeypatch):
    """generate() and generate_file() calls of one Generator share one load of the model and
    its tokenizer (each generate_file job loaded its own: a loop over prompt files paid a
    model's load a file); the answers are a fresh Generator's, call after call."""
    import specctl.runtime.jobs.loaded as loaded
    loads = []
    real = loaded.load_model
    monkeypatch.setattr(loaded, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "bye", "why")))
    g = _gen(tiny_llama, tmp_path, "self-draft", corpus_cache="none")
    first = g.generate(PROMPTS)
    texts = []
    for i in range(2):
        res = g.generate_file(inp, tmp_path / f"o{i}.jsonl")
        assert res["metrics"]["requests"] == 3
        texts.append([json.loads(l)["text"] for l in (tmp_path / f"o{i}.jsonl").open()])
    again = g.generate(PROMPTS)
    assert len(loads) == 1, loads
    assert texts[0] == texts[1]
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    fresh = _gen(tiny_llama, tmp_path, "self-draft", corpus_cache="none")
    fresh.generate_file(inp, tmp_path / "fresh.jsonl")
    assert [json.loads(l)["text"] for l in (tmp_path / "fresh.jsonl").open()] == texts[0]
    assert len(loads) == 2   # (a Generator's own)


def test_a_model_folder_written_over_between_calls_is_loaded_again(tiny_llama, tmp_path):
    """The kept model is the folder's as it was loaded: weights written over between two
    calls (an eval loop between epochs) load again, and the answers are a fresh Generator's
    on the new weights (the run records the new weights' digests)."""
    import shutil

    from safetensors.torch import load_file, save_file
    d = tmp_path / "model"
    shutil.copytree(tiny_llama, d)
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "why")))
    g = Generator(str(d), "ar", store=tmp_path / "store", device="cpu", dtype="fp32",
                  max_tokens=8)
    g.generate_file(inp, tmp_path / "a.jsonl")
    (f,) = d.glob("*.safetensors")
    w = load_file(f)
    name = next(k for k in w if "embed" in k)
    w[name] = w[name].flip(0).contiguous()   # (other weights: other answers)
    save_file(w, f, metadata={"format": "pt"})
    g.generate_file(inp, tmp_path / "b.jsonl")
    assert g._kept.loads == 2
    fresh = Generator(str(d), "ar", store=tmp_path / "store2", device="cpu", dtype="fp32",
                      max_tokens=8)
    fresh.generate_file(inp, tmp_path / "c.jsonl")
    texts = {n: [json.loads(l)["text"] for l in (tmp_path / f"{n}.jsonl").open()]
             for n in "abc"}
    assert texts["b"] == texts["c"] != texts["a"]


def test_method_auto_keeps_a_pilots_choice_not_a_small_calls(tiny_llama, tmp_path, monkeypatch):
    """Generator(method="auto") races once per sampling setting and keeps what a pilot chose;
    a call too small to pilot runs `ar` without keeping it (a warm-up call of two prompts held
    every later call, of thousands, to `ar`)."""
    from specctl.runtime.control import auto
    calls = []

    def race(cfg, model, tk, drafters, skipped, records, **kw):
        calls.append(len(records))
        if len(records) < 3:
            return "ar", {"chosen": "ar", "pilot_s": 0.0, "pilots": [], "small_job": 8}
        return "self-draft", {"chosen": "self-draft", "pilot_s": 0.1, "pilots": [{"x": 1}]}
    monkeypatch.setattr(auto, "race", race)
    g = Generator(str(tiny_llama), method="auto", max_tokens=4, store=tmp_path / "s")
    g.generate(["a", "b"])
    g.generate(["a", "b"])
    assert calls == [2, 2]   # (small: raced again, nothing kept)
    big = [f"q{i}" for i in range(4)]
    g.generate(big)
    g.generate(["a", "b"])
    g.generate(big)
    assert calls == [2, 2, 4]   # (a pilot's choice kept for every later call)

