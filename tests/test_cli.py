"""End-to-end tests of the `specctl` CLI (typer's CliRunner) on the tiny random Llama checkpoint:
every prompt format, batch independence, --no-chat, bad input as one-line errors (never a
traceback), --skip-bad, --resume after a simulated crash, the store commands and --help."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specctl.runtime.jobs.config import GenerateConfig
from helpers import fails
from specctl.cli import app

runner = CliRunner(env={"COLUMNS": "200"})

# one line of each accepted format (the multi-turn line has two turns)
FORMAT_LINES = [
    {"prompt": "What is the capital of France?", "id": "p-1"},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Write a short poem about the sea."}]},
    {"custom_id": "req-7", "body": {"model": "x", "messages": [{"role": "user", "content": "Hello"}],
                                    "max_tokens": 3}},
    {"question_id": 81, "category": "writing",
     "turns": ["Explain how a transformer works.", "Now say it in one sentence."]},
]
EXTRA_PROMPTS = ["The quick brown fox", "To be or not to be", "A journey of a thousand miles",
                 "All that glitters is not gold", "Paris is the capital of", "Write a poem",
                 "Explain it step by step"]
MAX_TOKENS = 6


def write_jsonl(path: Path, rows, raw_lines: dict[int, str] | None = None) -> Path:
    """Write rows as JSONL; raw_lines {position: text} inserts verbatim (bad) lines."""
    lines = [json.dumps(r) for r in rows]
    for pos, text in sorted((raw_lines or {}).items()):
        lines.insert(pos, text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def generate(inp: Path, out: Path, store: Path, model: Path, *extra):
    return invoke("generate", inp, "--model", model, "--store", store, "--out", out,
                  "--max-tokens", MAX_TOKENS, "--device", "cpu", "--dtype", "fp32", "-q", *extra)


def ok(r):
    assert r.exit_code == 0, r.output
    assert r.exception is None, r.exception
    assert "Traceback" not in r.output
    return r


def run_dirs(store: Path) -> list[Path]:
    d = store / "runs"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


def strip_timing(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in l.items() if k != "wall_time_s"} for l in lines]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def prompts_file(work) -> Path:
    rows = FORMAT_LINES + [{"prompt": p} for p in EXTRA_PROMPTS]
    return write_jsonl(work / "prompts.jsonl", rows)


@pytest.fixture(scope="module")
def baseline(work, prompts_file, tiny_llama):
    """One uninterrupted greedy run at the default batch size (8), with the progress bar on."""
    store = work / "store-base"
    r = invoke("generate", prompts_file, "--model", tiny_llama, "--store", store,
               "--out", work / "base.jsonl", "--max-tokens", MAX_TOKENS, "--device", "cpu",
               "--dtype", "fp32")
    ok(r)
    return {"result": r, "store": store, "out": work / "base.jsonl",
            "lines": read_jsonl(work / "base.jsonl")}


# ---------------------------------------------------------------------------------------------
# 1-3: generate


def test_generate_every_format(baseline, prompts_file):
    lines = baseline["lines"]
    n_in = len(prompts_file.read_text().splitlines())
    assert len(lines) == n_in
    assert [l["index"] for l in lines] == list(range(n_in))          # input order
    assert lines[0]["id"] == "p-1"
    assert lines[2]["custom_id"] == "req-7"
    assert lines[3]["question_id"] == 81 and lines[3]["category"] == "writing"
    assert "custom_id" not in lines[0] and "question_id" not in lines[1]
    assert len(lines[3]["turns"]) == 2 and lines[3]["text"] == lines[3]["turns"][0]
    assert len(lines[3]["finish_reasons"]) == 2 and \
        lines[3]["finish_reasons"][-1] == lines[3]["finish_reason"]   # (each turn's)
    assert all("turns" not in l and "finish_reasons" not in l
               for i, l in enumerate(lines) if i != 3)
    assert 1 <= lines[2]["new_tokens"] <= 3                           # body.max_tokens
    for i, l in enumerate(lines):
        assert "error" not in l and isinstance(l["text"], str)
        cap = 3 if i == 2 else MAX_TOKENS * (2 if i == 3 else 1)
        assert 1 <= l["new_tokens"] <= cap
        assert l["prompt_tokens"] > 0 and l["finish_reason"] in ("length", "stop", "eos")
    (run,) = run_dirs(baseline["store"])
    for f in ("metrics.json", "outputs.jsonl", "records.jsonl", "manifest.json"):
        assert (run / f).is_file(), f
    assert read_jsonl(run / "outputs.jsonl") == lines
    assert len(read_jsonl(run / "records.jsonl")) == n_in
    m = json.loads((run / "metrics.json").read_text())
    assert m["requests"] == n_in and m["errors"] == 0
    assert m["new_tokens"] == sum(l["new_tokens"] for l in lines)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["kind"] == "run" and manifest["id"] == run.name
    out = baseline["result"].output
    assert "done" in out and str(run.name) in out


def test_batch_size_one_equals_batch_size_eight(work, prompts_file, tiny_llama, baseline):
    ok(generate(prompts_file, work / "b1.jsonl", work / "store-b1", tiny_llama, "--batch-size", 1))
    got = read_jsonl(work / "b1.jsonl")
    assert [(l["text"], l["new_tokens"], l.get("turns")) for l in got] == \
           [(l["text"], l["new_tokens"], l.get("turns")) for l in baseline["lines"]]


def test_no_chat(tmp_path, tiny_llama, baseline, monkeypatch):
    inp = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": p} for p in EXTRA_PROMPTS[:3]])
    monkeypatch.chdir(tmp_path)   # the default --out is <stem>.out.jsonl in the current directory
    r = invoke("generate", inp, "--model", tiny_llama, "--store", tmp_path / "store",
               "--max-tokens", 4, "--no-chat", "-q")
    ok(r)
    lines = read_jsonl(tmp_path / "plain.out.jsonl")
    assert [l["index"] for l in lines] == [0, 1, 2]
    # verbatim prompts are shorter than the same prompts inside the chat template
    chat = {l["index"]: l["prompt_tokens"] for l in baseline["lines"]}
    assert all(l["prompt_tokens"] < chat[4 + i] for i, l in enumerate(lines))

    bad = write_jsonl(tmp_path / "msgs.jsonl", FORMAT_LINES[:2])
    fails(generate(bad, tmp_path / "x.jsonl", tmp_path / "store", tiny_llama, "--no-chat"),
          "msgs.jsonl:2", "--no-chat")
    assert not (tmp_path / "x.jsonl").exists()
    # (--skip-bad: such a line is a bad line like any other, the 'prompt' lines answered)
    ok(generate(bad, tmp_path / "x.jsonl", tmp_path / "store", tiny_llama, "--no-chat",
                "--skip-bad", "--max-tokens", 4))
    got = read_jsonl(tmp_path / "x.jsonl")
    assert "text" in got[0] and "msgs.jsonl:2: a run without the chat template needs a 'prompt' line" in \
        got[1]["error"], got


# ---------------------------------------------------------------------------------------------
# 4: bad input -> one line, non-zero exit, no traceback


@pytest.fixture(scope="module")
def broken_models(work, tiny_llama) -> dict[str, Path]:
    out = {}
    corrupt = work / "corrupt"
    shutil.copytree(tiny_llama, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x07garbage not a safetensors file" * 10)
    out["corrupt"] = corrupt
    for name, key, value in (("wide", "hidden_size", 128), ("deep", "num_hidden_layers", 9)):
        d = work / name
        shutil.copytree(tiny_llama, d)
        cfg = json.loads((d / "config.json").read_text())
        cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = d
    return out


@pytest.mark.parametrize("raw, needles", [
    ('{"prompt": "fine"}\n{"prompt": "unterminated\n', ["bad.jsonl:2", "malformed JSON"]),
    ('{"prompt": "fine"}\n\n{"question": "what?"}\n', ["bad.jsonl:3", "unknown prompt format"]),
    ('{"prompt": "   "}\n', ["bad.jsonl:1", "prompt"]),
    ('{"messages": [{"role": "robot", "content": "x"}]}\n', ["bad.jsonl:1", "messages[0].role"]),
    ('{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "x"}], '
     '"max_tokens": 0}}\n', ["bad.jsonl:1", "body.max_tokens"]),
    ("\n\n", ["no prompts", "bad.jsonl"]),
], ids=["malformed-json", "unknown-format", "empty-prompt", "bad-role", "bad-max-tokens", "empty"])
def test_bad_prompt_file(tmp_path, tiny_llama, raw, needles):
    inp = tmp_path / "bad.jsonl"
    inp.write_text(raw, encoding="utf-8")
    fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama), *needles)
    assert not (tmp_path / "o.jsonl").exists()


def test_missing_input_file(tmp_path, tiny_llama):
    fails(generate(tmp_path / "nope.jsonl", tmp_path / "o.jsonl", tmp_path / "store", tiny_llama),
          "nope.jsonl", "not found")


def test_unknown_model_path(tmp_path, prompts_file):
    fails(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", "/nonexistent/dir"),
          "/nonexistent/dir", "does not exist")


def test_model_folder_without_weights(tmp_path, prompts_file, tiny_llama):
    d = tmp_path / "noweights"
    shutil.copytree(tiny_llama, d)
    (d / "model.safetensors").unlink()
    fails(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", d), "safetensors")


@pytest.mark.parametrize("which, needles", [
    ("corrupt", ["model.safetensors", "corrupt"]),
    ("wide", ["wide", "shape"]),
    ("deep", ["deep", "model.layers.4"]),
])
def test_broken_checkpoint(tmp_path, prompts_file, broken_models, which, needles):
    fails(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", broken_models[which]),
          *needles)
    assert not (tmp_path / "o.jsonl").exists()


def test_prompt_longer_than_context(tmp_path, tiny_llama):
    inp = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "short one"},
                                                {"prompt": " ".join(["word"] * 3000)}])
    err = fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama),
                "long.jsonl:2", "context (512)", "--skip-bad")
    assert "tokens" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_error_message_is_not_rich_markup(tmp_path, tiny_llama):
    inp = tmp_path / "p[v2].jsonl"          # [v2] would be eaten as a rich style tag
    inp.write_text('{"x": 1}\n', encoding="utf-8")
    fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama), "p[v2].jsonl:1")


def test_unwritable_paths(tmp_path, prompts_file, tiny_llama):
    (tmp_path / "outdir").mkdir()
    fails(generate(prompts_file, tmp_path / "outdir", tmp_path / "store", tiny_llama),
          "outdir", "directory")
    assert not (tmp_path / "store").exists()          # refused before any work
    (tmp_path / "storefile").write_text("")
    fails(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "storefile", tiny_llama),
          "storefile", "Not a directory")


@pytest.mark.parametrize("opts, needle", [
    (["--batch-size", "0"], "--batch-size"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--temperature", "-1"], "--temperature"),
    (["--top-k", "-1"], "--top-k must be >= 0 (0 = off, where other tools take -1)"),
    (["--temperature", "nan"], "--temperature"),
    (["--stop", ""], "--stop"),
    (["--method", "nope"], "nope"),
    (["--dtype", "fp8"], "fp8"),
    (["--device", "tpu9"], "tpu9"),
    (["--attention", "xformers"], "--attention"),
    (["--method", "draft-verify", "--max-draft", "0"], "--max-draft must be at least 1"),
    (["--method", "kangaroo", "--eta", "2"], "--eta must be in [0, 1]"),
    (["--method", "kangaroo", "--kangaroo-gamma", "0"], "--kangaroo-gamma must be at least 1"),
])
def test_invalid_options(tmp_path, prompts_file, tiny_llama, opts, needle):
    # generate() passes --max-tokens itself; a later repeat of the option wins in click
    fails(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, *opts), needle)


def test_flex_attention_gives_the_same_answers(tmp_path, baseline, prompts_file, tiny_llama):
    """--attention flex (on a CPU its reference implementation) answers as sdpa does."""
    r = ok(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--attention", "flex", "--no-cuda-graphs"))
    assert "meant for CUDA" in r.output
    got = [l["text"] for l in read_jsonl(tmp_path / "o.jsonl")]
    assert got == [l["text"] for l in baseline["lines"]]


def test_version():
    from specctl import __version__
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"specctl {__version__}"


def test_option_type_errors_are_usage_errors(tmp_path, prompts_file, tiny_llama):
    r = generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                 "--batch-size", "many")
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert "Traceback" not in r.output and "batch-size" in r.output


# ---------------------------------------------------------------------------------------------
# 5: --skip-bad


def test_skip_bad(tmp_path, tiny_llama):
    rows = [{"prompt": "The quick brown fox", "id": "a"},
            {"prompt": " ".join(["word"] * 3000), "id": "too-long"},
            {"messages": [{"role": "user", "content": "Write a poem"}]},
            {"custom_id": "c", "body": {"messages": [{"role": "user", "content": "Hi"}]}}]
    # line 2: malformed JSON, line 4 blank (skipped, but numbering stays true), line 6: no format
    inp = write_jsonl(tmp_path / "mixed.jsonl", rows,
                      {1: '{"prompt": oops}', 3: "", 5: '{"custom_id": "x", "nothing": 1}'})
    out = tmp_path / "o.jsonl"
    r = ok(generate(inp, out, tmp_path / "store", tiny_llama, "--skip-bad"))
    assert "3 bad lines" in r.output
    lines = read_jsonl(out)
    assert [l["index"] for l in lines] == list(range(6))
    good = {0: ("id", "a"), 3: (None, None), 5: ("custom_id", "c")}
    bad = {1: "mixed.jsonl:2:", 2: "mixed.jsonl:3:", 4: "mixed.jsonl:6:"}
    for i, l in enumerate(lines):
        if i in bad:
            assert bad[i] in l["error"] and "text" not in l, l
        else:
            assert "error" not in l and isinstance(l["text"], str) and l["new_tokens"] >= 1
            if good[i][0]:
                assert l[good[i][0]] == good[i][1]
    assert "malformed JSON" in lines[1]["error"]
    assert "context" in lines[2]["error"] and lines[2]["id"] == "too-long"
    assert "unknown prompt format" in lines[4]["error"] and lines[4]["custom_id"] == "x"
    (run,) = run_dirs(tmp_path / "store")
    m = json.loads((run / "metrics.json").read_text())
    assert m["requests"] == 6 and m["errors"] == 3
    # the job again: the finished run, bad lines and all (a parse error, a prompt past the
    # context), is no unfinished one (it was said to be, "3 of 6 requests done", every time)
    r = ok(generate(inp, tmp_path / "o2.jsonl", tmp_path / "store", tiny_llama, "--skip-bad"))
    assert "unfinished" not in r.output and read_jsonl(tmp_path / "o2.jsonl") != []
    # --resume of the finished run: nothing to do, its bad lines not recorded again, its
    # measured throughput kept (the errors were taken as lines still to do)
    def kept():
        return [((d / "records.jsonl").read_text(), (d / "metrics.json").read_text())
                for d in run_dirs(tmp_path / "store")]
    before = kept()
    r = ok(generate(inp, out, tmp_path / "store", tiny_llama, "--skip-bad", "--resume"))
    said = " ".join(r.output.split())
    assert "already complete" in said and "not measured" not in said
    # (its rate is the run's, not this invocation's, which made nothing)
    assert "no answer made by this invocation (the run measured" in said, said
    assert kept() == before and strip_timing(read_jsonl(out)) == strip_timing(lines)
    # without --skip-bad a recorded bad line stops the resumed job, as it would a new one
    r = generate(inp, out, tmp_path / "store", tiny_llama, "--resume")
    assert r.exit_code != 0 and "mixed.jsonl:2" in r.output


def test_out_is_refused_where_it_cannot_be_the_answers(tmp_path, tiny_llama):
    """--out empty, naming a missing folder (a trailing /), inside the store; and a
    --job-cache-file that is --out or the input: refused before anything runs."""
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}])
    store = tmp_path / "store"
    for out, said in (("", "--out is empty"), (f"{tmp_path}/newdir/", "ends in '/'"),
                      (store / "runs" / "x.jsonl", "inside the store")):
        r = generate(inp, out, store, tiny_llama)
        assert r.exit_code != 0 and said in r.output, (out, r.output)
    assert not (tmp_path / "newdir").exists()
    for cache, said in ((tmp_path / "o.jsonl", "is --out"), (inp, "is the input file")):
        r = generate(inp, tmp_path / "o.jsonl", store, tiny_llama, "--method", "self-draft",
                     "--job-cache", "--job-cache-file", cache)
        assert r.exit_code != 0 and said in r.output, r.output
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / "a.jsonl", [{"prompt": "Hi"}])
    r = generate(shards, tmp_path / "o.jsonl", store, tiny_llama, "--method", "self-draft",
                 "--job-cache", "--job-cache-file", shards / "cache.safetensors")
    assert r.exit_code != 0 and "inside the input directory" in r.output, r.output
    assert not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# 6: --resume


def _crash(baseline, tmp_path, keep_torn: bool):
    """A copy of the baseline's finished run with records.jsonl cut back to its first two lines
    (plus, with keep_torn, half of the third), as a crash would have left it."""
    store = tmp_path / "store"
    shutil.copytree(baseline["store"], store)
    (run,) = run_dirs(store)
    rec = run / "records.jsonl"
    raw = rec.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = raw[:2]
    rec.write_text("".join(kept) + (raw[2][: len(raw[2]) // 2] if keep_torn else ""),
                   encoding="utf-8")
    (run / "outputs.jsonl").unlink()
    (run / "metrics.json").unlink()
    return store, run, {json.loads(l)["index"] for l in kept}


def test_resume_generates_only_missing(prompts_file, tiny_llama, baseline, tmp_path,
                                       count_generated):
    store, run, kept = _crash(baseline, tmp_path, keep_torn=False)
    n = len(baseline["lines"])
    # without --resume: a new run, and a word on the unfinished one
    spare = tmp_path / "spare-store"
    shutil.copytree(store, spare)
    r = ok(generate(prompts_file, tmp_path / "new.jsonl", spare, tiny_llama))
    said = " ".join(r.output.split())
    assert f"{run.name}, an unfinished run of this job, has 2 of {n} requests done: add " \
           "--resume to continue it" in said and len(run_dirs(spare)) == 2
    count_generated.clear()
    out = tmp_path / "resumed.jsonl"
    # the same input under another path, at another batch size (after an out-of-memory, say)
    moved = tmp_path / "elsewhere" / "copy.jsonl"
    moved.parent.mkdir()
    shutil.copy(prompts_file, moved)
    r = ok(generate(moved, out, store, tiny_llama, "--resume", "-b", 3))
    assert f"resuming {run.name}: 2 of {n} requests already done" in " ".join(r.output.split())
    assert sorted(count_generated) == sorted(set(range(n)) - kept)
    assert run_dirs(store) == [run]                                  # no new run
    assert len(read_jsonl(run / "records.jsonl")) == n
    assert strip_timing(read_jsonl(out)) == strip_timing(baseline["lines"])
    assert read_jsonl(run / "outputs.jsonl") == read_jsonl(out)
    m = json.loads((run / "metrics.json").read_text())
    assert m["requests"] == n
    # the summary's tokens/s counts this invocation's tokens, and says so (its new tokens are
    # the whole run's)
    now = sum(l["new_tokens"] for l in read_jsonl(out) if l["index"] not in kept)
    assert m["generated_tokens"] == now < m["new_tokens"]
    assert f"{m['new_tokens']} new tokens, {m['tokens_per_s']} tokens/s over the {now} made " \
           "by this invocation" in " ".join(r.output.split())

    # everything done: a second resume generates nothing, writes the same output and leaves
    # the run's metrics (its throughput) as they were
    metrics = (run / "metrics.json").read_text()
    count_generated.clear()
    r = ok(generate(prompts_file, tmp_path / "again.jsonl", store, tiny_llama, "--resume"))
    said = " ".join(r.output.split())
    assert f"{n} of {n} requests already done" in said and "already complete" in said
    assert count_generated == []
    assert read_jsonl(tmp_path / "again.jsonl") == read_jsonl(out)
    assert (run / "metrics.json").read_text() == metrics
    # options that cannot change an ar run's answers (another method's; --speculate: ar drafts
    # nothing) do not make it another run; one that can does
    r = ok(generate(prompts_file, tmp_path / "inert.jsonl", store, tiny_llama, "--resume",
                    "--gram", "3", "--eta", "0.5", "--speculate", "fixed"))
    assert f"{n} of {n} requests already done" in " ".join(r.output.split())
    assert count_generated == [] and run_dirs(store) == [run]
    r = ok(generate(prompts_file, tmp_path / "other.jsonl", store, tiny_llama, "--resume",
                    "--max-tokens", str(MAX_TOKENS + 1)))
    assert "differs in: max_tokens" in " ".join(r.output.split())
    # (a dtype as given, which the run's key holds as what it resolved to, is named too)
    r = ok(generate(prompts_file, tmp_path / "bf.jsonl", store, tiny_llama, "--resume",
                    "--max-tokens", str(MAX_TOKENS + 2), "--dtype", "bf16"))
    said = " ".join(r.output.split())
    assert 'max_tokens' in said and 'dtype "fp32" there, "bf16" here' in said, said


def test_resume_tolerates_torn_last_line(prompts_file, tiny_llama, baseline, tmp_path,
                                         count_generated):
    store, run, kept = _crash(baseline, tmp_path, keep_torn=True)
    n = len(baseline["lines"])
    count_generated.clear()
    out = tmp_path / "resumed.jsonl"
    r = ok(generate(prompts_file, out, store, tiny_llama, "--resume"))
    assert "2 of" in r.output
    assert sorted(count_generated) == sorted(set(range(n)) - kept)   # the torn one is redone
    assert strip_timing(read_jsonl(out)) == strip_timing(baseline["lines"])
    # the torn fragment stays on a line of its own: no record got glued onto it
    lines = (run / "records.jsonl").read_text(encoding="utf-8").splitlines()
    parsed = []
    for l in lines:
        try:
            parsed.append(json.loads(l))
        except json.JSONDecodeError:
            pass
    assert len(lines) == n + 1 and len(parsed) == n
    count_generated.clear()
    r = ok(generate(prompts_file, tmp_path / "again.jsonl", store, tiny_llama, "--resume"))
    assert f"{n} of {n} requests already done" in " ".join(r.output.split())
    assert count_generated == []


def test_resume_redoes_an_invalid_record(prompts_file, tiny_llama, baseline, tmp_path,
                                         count_generated):
    """A records.jsonl line that parses but is not a finished request's record (edited, or
    from elsewhere) is redone like a torn line, not a KeyError."""
    store, run, kept = _crash(baseline, tmp_path, keep_torn=False)
    rec = run / "records.jsonl"
    bad = sorted(set(range(len(baseline["lines"]))) - kept)[0]
    with rec.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"index": bad, "foo": "bar"}) + "\n")
        f.write(json.dumps([1, 2]) + "\n")
    count_generated.clear()
    out = tmp_path / "resumed.jsonl"
    ok(generate(prompts_file, out, store, tiny_llama, "--resume"))
    assert bad in count_generated
    assert strip_timing(read_jsonl(out)) == strip_timing(baseline["lines"])


def test_resume_needs_same_settings(tmp_path, tiny_llama):
    store = tmp_path / "store"
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    r = ok(generate(inp, tmp_path / "a.jsonl", store, tiny_llama, "--resume"))
    assert "no earlier run" in r.output
    r = ok(generate(inp, tmp_path / "b.jsonl", store, tiny_llama, "--resume",
                    "--max-tokens", 5))
    said = " ".join(r.output.split())
    assert "no earlier run" in said and f"max_tokens {MAX_TOKENS} there, 5 here" in said
    assert len(run_dirs(store)) == 2
    # --dtype auto and fp32 are the same run on a CPU (the dtype the model runs in is keyed)
    r = ok(generate(inp, tmp_path / "c.jsonl", store, tiny_llama, "--resume", "--dtype", "auto"))
    assert "already complete" in " ".join(r.output.split()) and len(run_dirs(store)) == 2


def test_runs_of_older_versions_resume(tmp_path, tiny_llama, monkeypatch, count_generated):
    """A run begun before the key left out the path, batch size and device (its manifest
    holds the old key) is still found by --resume."""
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}, {"prompt": "hi"}])
    store = tmp_path / "store"
    new_key, suffix = GenerateConfig.key, "cpu:torch.float32"   # (device type, dtype)

    def old_key(self, extra, legacy=False):   # what specctl computed before
        return new_key(self, extra if legacy else extra[:-len(suffix)], legacy=True)
    monkeypatch.setattr(GenerateConfig, "key", old_key)
    ok(generate(inp, tmp_path / "a.jsonl", store, tiny_llama))
    monkeypatch.setattr(GenerateConfig, "key", new_key)
    (run,) = run_dirs(store)
    rec = run / "records.jsonl"
    rec.write_text(rec.read_text().splitlines(keepends=True)[0])
    count_generated.clear()
    r = ok(generate(inp, tmp_path / "b.jsonl", store, tiny_llama, "--resume"))
    assert f"resuming {run.name}" in " ".join(r.output.split()) and count_generated == [1]
    # (the keys themselves, as older versions computed them: a new field's default that
    # changes either one would lose those runs, which the run above cannot see)
    cfg = GenerateConfig(input="x")
    assert (cfg.key("E", legacy=True), cfg.key("E")) == ("bcfa0833b9183816", "45bc766c717f7dbb")


def test_a_runs_key_holds_only_what_can_change_its_answers():
    from dataclasses import replace
    from specctl.runtime.jobs.depends import options_digest
    for method, inert, live in (("ar", dict(gram=3, eta=0.5, speculate="fixed"), dict(seed=1)),
                                ("self-draft", dict(eta=0.5, max_draft=3), dict(gram=3)),
                                ("kangaroo", dict(gram=3), dict(eta=0.5))):
        cfg = GenerateConfig(input="x", method=method)
        for opts, same in ((inert, True), (live, False)):
            other = replace(cfg, **opts)
            assert (other.key("e") == cfg.key("e")) == same, (method, opts)
            assert (options_digest(other) == options_digest(cfg)) == same, (method, opts)


def test_output_is_not_the_input(tmp_path, tiny_llama):
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    before = inp.read_text()
    fails(generate(inp, tmp_path / "." / "p.jsonl", tmp_path / "store", tiny_llama),
          "the input file")
    assert inp.read_text() == before


def test_kv_cache_sized_to_the_work(tmp_path, tiny_llama, monkeypatch):
    """No more KV slots than requests; a cache that does not fit is a one-line error."""
    from specctl.engine.model import Model
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}, {"prompt": "hi"}])
    shapes = []
    real = Model.new_kv_cache

    def new_kv_cache(self, slots, rows, budget=None):
        shapes.append(slots)
        if len(shapes) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 190.00 GiB")
        return real(self, slots, rows, budget)
    monkeypatch.setattr(Model, "new_kv_cache", new_kv_cache)
    ok(generate(inp, tmp_path / "a.jsonl", tmp_path / "store", tiny_llama, "-b", 100000))
    assert shapes == [2]
    fails(generate(inp, tmp_path / "b.jsonl", tmp_path / "store", tiny_llama),
          "KV cache of 2 sequences", "--kv-memory", "--batch-size")


def test_kv_memory_pages_the_cache(tmp_path, tiny_llama):
    """--kv-memory below the batch's full-length need: a paged cache, the same answers as the
    contiguous one, the layout and preemptions in metrics.json; a budget below one sequence or
    not a size is a one-line error."""
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"tell me about {w}"} for w in
                                             ("cats", "dogs", "birds", "fish", "the sea")])
    ok(generate(inp, tmp_path / "a.jsonl", tmp_path / "store", tiny_llama, "-b", 4))
    r = ok(generate(inp, tmp_path / "b.jsonl", tmp_path / "store", tiny_llama, "-b", 4,
                    "--kv-memory", "200KB"))
    assert "KV cache: paged" in r.output
    assert [l["text"] for l in read_jsonl(tmp_path / "a.jsonl")] == \
        [l["text"] for l in read_jsonl(tmp_path / "b.jsonl")]
    run = Path(r.output.split("run:")[1].split()[0])
    kvm = json.loads((run / "metrics.json").read_text())["kv_cache"]
    assert kvm["layout"] == "paged" and kvm["blocks"] > 0 and "preemptions" in kvm
    fails(generate(inp, tmp_path / "c.jsonl", tmp_path / "store", tiny_llama,
                   "--kv-memory", "1KB"), "less than one sequence", "--kv-memory")
    # (a line asking for more tokens than the run: the message names a line's own budget too)
    long = write_jsonl(tmp_path / "l.jsonl", [{"prompt": "cats", "max_tokens": 200}])
    fails(generate(long, tmp_path / "e.jsonl", tmp_path / "store", tiny_llama,
                   "--kv-memory", "60KB", "--max-tokens", "8"),
          "--max-tokens", "the max_tokens a line gives itself")
    fails(generate(inp, tmp_path / "d.jsonl", tmp_path / "store", tiny_llama,
                   "--kv-memory", "lots"), "--kv-memory", "not a size")


def test_written_files_follow_the_umask(tmp_path, tiny_llama):
    """Atomic writes (temp file + rename) give files the mode open() would: a shared store
    stays readable by the group."""
    import os
    old = os.umask(0o022)
    try:
        inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
        ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama))
        (run,) = run_dirs(tmp_path / "store")
        for f in (tmp_path / "o.jsonl", run / "outputs.jsonl", run / "metrics.json",
                  run / "manifest.json"):
            assert f.stat().st_mode & 0o777 == 0o644, f
        from specctl.store import Store
        with Store(tmp_path / "store").building("adapters", "x", {"kind": "adapter"}) as d:
            (d / "w").write_text("1")
        assert (tmp_path / "store" / "adapters" / "x").stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(old)


def test_a_stop_string_with_a_shells_backslash_n_is_named(tmp_path, tiny_llama):
    """--stop "\\n" in bash is a backslash and an n, not a newline: it runs as given, with a
    warning that says how to write a newline."""
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--stop", "\\n\\n", "--stop", "x"))
    said = " ".join(r.output.split())
    assert "holds a backslash" in said and "--stop $'\\n'" in said
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "--stop", "\n"))
    assert "backslash" not in r.output


def test_lines_that_share_an_id_are_each_answered_and_said(tmp_path, tiny_llama):
    """Two lines with one id: both answered, in order, told apart by index, and a note says
    so (a join on the id would mix them up)."""
    inp = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "hello"},
                                             {"id": "b", "prompt": "hi"},
                                             {"id": "a", "prompt": "hey"}])
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama))
    said = " ".join(r.output.split())
    assert "1 line shares its id with an earlier line (id 'a' on lines 1, 3)" in said, said
    lines = read_jsonl(tmp_path / "o.jsonl")
    assert [(l["index"], l["id"]) for l in lines] == [(0, "a"), (1, "b"), (2, "a")]
    r = ok(generate(write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "prompt": "x"}]),
                    tmp_path / "o2.jsonl", tmp_path / "store", tiny_llama))
    assert "shares" not in r.output


def test_options_of_another_method_are_named(tmp_path, tiny_llama):
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--skip-set", "nope.json", "--branches", 3, "--prompt-grams"))
    said = " ".join(r.output.split())
    assert "--skip-set only applies to --method draft-verify; ignored with --method ar" in said
    assert "--branches, --prompt-grams only apply to --method self-draft" in said
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "--no-grid"))
    assert "--no-grid only applies to --method self-draft" in " ".join(r.output.split())
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "--actors", 3,
                    "--gpu-memory", 0.5, "--device", "cpu"))
    said = " ".join(r.output.split())
    assert "--actors only applies with --ray; ignored" in said
    assert "--gpu-memory only applies on CUDA; ignored on the CPU" in said
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "--top-p", 0.5,
                    "--top-k", 3))   # (greedy: the default --temperature 0)
    assert "--top-p, --top-k only apply to sampling (--temperature above 0); ignored" in \
        " ".join(r.output.split())
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "--top-p", 0.5,
                    "--temperature", 0.7))
    assert "only apply to sampling" not in r.output and "only applies to sampling" not in r.output
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama, "--eta", 2))
    assert "--eta only applies to --method kangaroo" in " ".join(r.output.split())
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--gpu-memory", 0.5, "--kv-memory", "64MB"))
    assert "--gpu-memory is ignored with --kv-memory" in " ".join(r.output.split())
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--method", "self-draft", "--no-corpus-cache", "--no-context-cache"))
    assert "no candidates" in " ".join(r.output.split())
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--method", "self-draft", "--grid", "--context-cands", 0))
    assert "--grid drafts the context cache's candidates (and the job cache's)" in \
        " ".join(r.output.split())
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--method", "self-draft", "--grid"))
    assert "--grid drafts" not in r.output
    r = ok(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                    "--method", "self-draft", "--batch-size", 32, "--job-cache"))
    assert "drafting on the grid at batch 32 (the default from 32): the context cache's " \
        "candidates and the job cache's only" in " ".join(r.output.split())
    # a skip set that is neither a file nor a stored id fails before the model is loaded
    fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                   "--method", "draft-verify", "--skip-set", "nope.json"),
          "nope.json: no such file or folder")


def test_limit_then_resume_does_the_rest(tmp_path, tiny_llama, count_generated):
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"hello {i}"} for i in range(4)]
                      + [{"nothing": 1}])   # a bad line past the limit is not read
    store = tmp_path / "store"
    ok(generate(inp, tmp_path / "a.jsonl", store, tiny_llama, "--limit", 2))
    assert [l["index"] for l in read_jsonl(tmp_path / "a.jsonl")] == [0, 1]
    count_generated.clear()
    ok(generate(inp, tmp_path / "b.jsonl", store, tiny_llama, "--limit", 4, "--resume"))
    assert sorted(count_generated) == [2, 3] and len(run_dirs(store)) == 1
    assert len(read_jsonl(tmp_path / "b.jsonl")) == 4
    (run,) = run_dirs(store)
    # metrics of an earlier --limit left in place (by a crash before the last write) are not
    # taken for the complete run's
    stale = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**stale, "requests": 2}))
    r = ok(generate(inp, tmp_path / "c.jsonl", store, tiny_llama, "--limit", 4, "--resume"))
    assert "already complete" not in r.output
    assert json.loads((run / "metrics.json").read_text())["requests"] == 4
    # a --limit below what is done writes only those lines
    ok(generate(inp, tmp_path / "d.jsonl", store, tiny_llama, "--limit", 3, "--resume"))
    assert [l["index"] for l in read_jsonl(tmp_path / "d.jsonl")] == [0, 1, 2]
    fails(generate(inp, tmp_path / "c.jsonl", store, tiny_llama, "--limit", 0), "--limit")
    fails(invoke("generate", "-", "--store", store), "standard input")


def test_a_narrower_limit_on_a_complete_run_keeps_the_runs_record(tmp_path, tiny_llama):
    """--limit 2 --resume on a complete run of 4 lines: --out gets the 2, the run keeps its
    outputs and metrics (they were overwritten with the 2 lines' and no throughput)."""
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"hello {i}"} for i in range(4)])
    store = tmp_path / "store"
    ok(generate(inp, tmp_path / "a.jsonl", store, tiny_llama))
    (run,) = run_dirs(store)
    before = {f: (run / f).read_text() for f in ("outputs.jsonl", "metrics.json")}
    assert json.loads(before["metrics.json"])["tokens_per_s"]
    r = ok(generate(inp, tmp_path / "b.jsonl", store, tiny_llama, "--limit", 2, "--resume"))
    assert [l["index"] for l in read_jsonl(tmp_path / "b.jsonl")] == [0, 1]
    said = " ".join(r.output.split())
    assert "already complete (2 of its 4 requests within --limit)" in said
    assert "done: 2 requests" in said   # (the summary is of --out's lines)
    assert {f: (run / f).read_text() for f in before} == before
    # and where every line within the --limit is bad, that is still a failure
    bad = write_jsonl(tmp_path / "q.jsonl", [{"nothing": 1}, {"nothing": 2}]
                      + [{"prompt": f"hello {i}"} for i in range(2)])
    ok(generate(bad, tmp_path / "c.jsonl", store, tiny_llama, "--skip-bad"))
    r = generate(bad, tmp_path / "d.jsonl", store, tiny_llama, "--skip-bad", "--limit", 2,
                 "--resume")
    assert r.exit_code == 1 and "no line" in r.output, r.output


def test_every_line_bad_fails(tmp_path, tiny_llama):
    inp = tmp_path / "bad.jsonl"
    inp.write_text('{"nothing": 1}\n{"prompt": oops}\n')
    out = tmp_path / "o.jsonl"
    r = generate(inp, out, tmp_path / "store", tiny_llama, "--skip-bad")
    assert r.exit_code == 1 and "no line" in r.output and "Traceback" not in r.output
    assert len(read_jsonl(out)) == 2   # the errors are still recorded


# ---------------------------------------------------------------------------------------------
# 7-8: store and models commands, --help


def test_store_commands(tmp_path, tiny_llama):
    store = tmp_path / "store"
    r = ok(invoke("store", "ls", "--store", store))   # (a mistyped --store: said apart)
    assert "no store at" in r.output and "empty" not in r.output
    (store / "models").mkdir(parents=True)
    assert "is empty" in ok(invoke("store", "ls", "--store", store)).output
    inp = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    ok(generate(inp, tmp_path / "o.jsonl", store, tiny_llama))
    (run,) = run_dirs(store)

    r = ok(invoke("store", "ls", "--store", store))
    assert run.name in r.output and "runs" in r.output
    r = ok(invoke("store", "ls", "--kind", "runs", "--store", store))
    assert run.name in r.output and "p.jsonl" in r.output   # (the input, by its name)
    from specctl.cli.store_cmd import _run_input
    assert _run_input({"input": str(inp)}) == "p.jsonl"
    assert _run_input({"input": ["x"]}) == _run_input({}) == ""
    assert _run_input({"input": "/a/[red]x"}) == "\\[red]x"   # (no rich markup)
    fails(invoke("store", "ls", "--kind", "nope", "--store", store), "nope")

    r = ok(invoke("store", "show", run.name[:-3], "--store", store))
    info = json.loads(r.stdout)
    assert info["kind"] == "runs" and info["manifest"]["id"] == run.name
    assert info["metrics"]["requests"] == 1 and "per_sample" not in info["metrics"]
    assert info["metrics"]["gain_vs_ar_est"] == 1.0   # an ar run is its own estimate

    # ls's run column: method, tokens/s and the gain, from a metrics.json read as untrusted
    from specctl.cli.store_cmd import _run_summary
    tps = info["metrics"]["tokens_per_s"]
    assert _run_summary(run) == f"ar, {tps:.1f} tok/s"
    m = dict(info["metrics"], method="self-draft", gain_vs_ar_est=1.234)
    (run / "metrics.json").write_text(json.dumps(m))
    assert _run_summary(run) == f"self-draft, {tps:.1f} tok/s, 1.23x ar (est.)"
    for bad in ("[1]", "{oops", json.dumps(dict(m, method="[red]x" * 20, tokens_per_s="9"))):
        (run / "metrics.json").write_text(bad)
        assert "tok/s" not in _run_summary(run)
    assert run.name in ok(invoke("store", "ls", "--store", store)).output

    fails(invoke("store", "show", "nope", "--store", store), "nope")
    fails(invoke("store", "rm", "nope", "--yes", "--store", store), "nope")

    fails(invoke("store", "rm", run.name, "--store", store), "--yes")   # cannot ask: no tty
    assert run.exists()
    r = ok(invoke("store", "rm", run.name, "--yes", "--store", store))
    assert f"removed runs/{run.name}" in r.output
    assert not run.exists()
    assert "empty" in ok(invoke("store", "ls", "--store", store)).output


def test_store_locate(tmp_path):
    from specctl.errors import SpecctlError
    from specctl.store import Store
    st = Store(tmp_path / "store")
    for kind, ident in (("skipsets", "abc-1"), ("skipsets", "abc-2"), ("adapters", "abd-l2")):
        with st.building(kind, ident, {"kind": kind}):
            pass
    assert st.locate("abc-1", "skipsets").name == "abc-1"
    assert st.locate("abd", "adapters").name == "abd-l2"   # a prefix unique among adapters
    assert st.locate(str(tmp_path), "adapters") == tmp_path   # a path wins
    for spec, kind, msg in (("abc", "skipsets", "ambiguous"), ("abd", "skipsets", "adapters"),
                            ("zzz", "skipsets", "no such file")):
        with pytest.raises(SpecctlError, match=msg):
            st.locate(spec, kind)


def test_models_pull_unknown_alias(tmp_path):
    fails(invoke("models", "pull", "nonsense-alias", "--store", tmp_path / "store"),
          "nonsense-alias")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("cmd", [["generate"], ["models", "pull"], ["store", "ls"],
                                 ["store", "show"], ["store", "rm"]])
def test_help_shows_an_example(cmd):
    r = ok(invoke(*cmd, "--help"))
    assert "Example" in r.output and f"specctl {' '.join(cmd)}" in r.output


@pytest.mark.parametrize("cmd", [[], ["models"], ["store"]])
def test_group_help(cmd):
    r = ok(invoke(*cmd, "--help"))
    assert "Usage" in r.output and "Examples" in r.output
    assert "specctl " + (cmd[0] if cmd else "generate") in r.output.split("Examples")[1]


@pytest.mark.parametrize("cmd", [["--help"], ["generate", "--help"], ["store", "ls", "--store",
                                                                   "{tmp}"]])
def test_help_and_the_store_commands_do_not_import_torch(cmd, tmp_path):
    """torch's import is most of a command's start (~1.5 s of `specctl --help`'s 2 s here):
    only what runs a model pays it."""
    import subprocess
    import sys
    code = ("import sys; from specctl.cli import app\n"
            "try:\n    app(sys.argv[1:], prog_name='specctl')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nassert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code, *[c.format(tmp=tmp_path) for c in cmd]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_switches_show_no_value_in_help():
    r = ok(invoke("generate", "--help"))
    assert "<bool>" not in r.output and "--skip-bad" in r.output and "<int>" in r.output


def test_unwritable_out_fails_before_generating(tmp_path, prompts_file, tiny_llama,
                                                 count_generated):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    count_generated.clear()
    r = generate(prompts_file, blocker / "out.jsonl", tmp_path / "store", tiny_llama)
    fails(r, "--out", "cannot write")
    assert count_generated == []


def test_a_run_in_use_is_not_resumed_twice(prompts_file, tiny_llama, baseline, tmp_path):
    """While one process holds a run (its lock), a second --resume of it exits with a clear
    message instead of appending to the same records file."""
    import fcntl
    store, run, _ = _crash(baseline, tmp_path, keep_torn=False)
    with open(run / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = generate(prompts_file, tmp_path / "o.jsonl", store, tiny_llama, "--resume")
        fails(r, run.name, "in use by another specctl process")
    ok(generate(prompts_file, tmp_path / "o.jsonl", store, tiny_llama, "--resume"))


def test_resume_takes_the_run_furthest_on(prompts_file, tiny_llama, baseline, tmp_path,
                                          count_generated):
    """A newer run of the same job that stopped earlier (killed before its first answer, say)
    does not hide an older one's answers: --resume takes the run with the most records, as
    the word on an unfinished run names it; a run still going is said to be going."""
    import fcntl
    store, run, kept = _crash(baseline, tmp_path, keep_torn=False)
    newer = store / "runs" / (run.name[:-6] + "zzzzzz")   # (a later id, its records empty)
    shutil.copytree(run, newer)
    (newer / "records.jsonl").write_text("")
    man = json.loads((newer / "manifest.json").read_text())
    man["created"] = man["created"].replace("T", "T9") if "T" in man["created"] else "9"
    (newer / "manifest.json").write_text(json.dumps(man))
    spare = tmp_path / "spare"
    shutil.copytree(store, spare)
    with open(spare / "runs" / run.name / ".lock", "a") as f:   # (held: a process is on it)
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = ok(generate(prompts_file, tmp_path / "n.jsonl", spare, tiny_llama))
        said = " ".join(r.output.split())
        assert f"{run.name}, a run of this job, is still going" in said, said
        ls = " ".join(ok(invoke("store", "ls", "--store", spare, "--kind", "runs")).output
                      .split())
        assert "running (pid" in ls and "2 lines recorded so far" in ls and "unfinished: 0" in ls
    # (what is not a run has no run's state: a bench or a model lists no "unfinished")
    # (its name matches no run id: a run's id is hex and may hold "b1")
    (spare / "benches" / "bench-x").mkdir(parents=True)
    (spare / "benches" / "bench-x" / "manifest.json").write_text('{"created": "x"}')
    ls = ok(invoke("store", "ls", "--store", spare)).output
    assert any("bench-x" in line for line in ls.splitlines()), ls
    assert [line for line in ls.splitlines() if "bench-x" in line and "unfinished" in line] == []
    assert "unfinished: 0" in " ".join(ls.split())
    count_generated.clear()
    r = ok(generate(prompts_file, tmp_path / "o.jsonl", store, tiny_llama, "--resume"))
    assert f"resuming {run.name}: 2 of" in " ".join(r.output.split())
    assert sorted(count_generated) == sorted(set(range(len(baseline["lines"]))) - kept)


def test_sigterm_stops_as_ctrl_c_does():
    """cli.main turns SIGTERM into Terminated, a KeyboardInterrupt: the same cleanup, its
    own word and exit status 143."""
    import os
    import signal

    import typer

    from specctl.cli import _terminated
    from specctl.cli.common import Terminated, friendly
    with pytest.raises(Terminated):
        _terminated(signal.SIGTERM, None)

    @friendly
    def job():
        os.kill(os.getpid(), signal.SIGTERM)
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        with pytest.raises(typer.Exit) as e:
            job()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert e.value.exit_code == 143


def test_threads_option(tmp_path, prompts_file, tiny_llama, baseline):
    """--threads fixes the CPU threads of a step; the answers and the run's key are those of
    the default (a thread count is how, not what, is computed)."""
    fails(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                   "--threads", "0"), "--threads")
    ok(generate(prompts_file, tmp_path / "o.jsonl", tmp_path / "store", tiny_llama,
                "--threads", "1"))
    assert strip_timing(read_jsonl(tmp_path / "o.jsonl")) == strip_timing(baseline["lines"])
    assert GenerateConfig(input="x", threads=1).key("k") == GenerateConfig(input="x").key("k")


def test_options_are_declared_once():
    """Every GenerateConfig field declared as an option is a `generate` option with the field's
    default and help; `bench` takes the ones marked for it, every method's option among them."""
    from dataclasses import fields

    from rich.markup import escape
    from typer.main import get_command

    from specctl.cli.options import BENCH, METHOD_OPTIONS
    from specctl.runtime.jobs.config import GenerateConfig
    cmd = get_command(app)
    gen = {p.name: p for p in cmd.commands["generate"].params}
    bench = {p.name for p in cmd.commands["bench"].params}
    declared = [f for f in fields(GenerateConfig) if f.metadata.get("option")]
    assert len(declared) > 30
    for f in declared:
        p = gen[f.name]
        assert (list(p.default) if f.default == () else p.default) == \
            (list(f.default) if f.default == () else f.default), f.name
        # (escaped: a help text is plain, "[ray]" in it is no markup)
        assert p.help == (escape(f.metadata["help"]) or None), f.name
    every_method = {n for names in METHOD_OPTIONS.values() for n in names} - {"no_corpus_cache"}
    assert {"skip_set", "adapter", "branches"} <= every_method <= set(BENCH) <= bench
    assert {"speculate", "threads", "kv_memory"} <= set(BENCH)
    assert "no_corpus_cache" in gen and "prefill_chunk" in gen and "prefill_chunk" in bench


def test_a_ray_address_nothing_answers_at_fails_at_once(tiny_llama, tmp_path):
    """--ray HOST:PORT with no cluster there: a one-line error in seconds (Ray's own connect
    timeout is minutes), before the input is read or a model loads (Ray is not needed)."""
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # (free, once closed: nothing listens there)
    inp = tmp_path / "p.jsonl"
    inp.write_text(json.dumps({"prompt": "hello"}) + "\n")
    t0 = time.perf_counter()
    for address, said in ((f"127.0.0.1:{port}", "nothing answers there"),
                          ("127.0.0.1:70000", "'70000' is not a port")):
        r = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
            "generate", str(inp), "--model", str(tiny_llama), "--store", str(tmp_path / "s"),
            "--out", str(tmp_path / "o.jsonl"), "--ray", address, "-q"])
        assert r.exit_code == 2 and f"--ray {address}: {said}" in " ".join(r.output.split()), \
            r.output
    assert time.perf_counter() - t0 < 30


def test_ctrl_c_while_the_command_line_loads_says_one_word(monkeypatch, capsys):
    """An interrupt in the command line's imports (a second or more: torch) ends as one in a
    command does, exit 130 and a word, not Python's traceback (a new user's Ctrl-C did)."""
    import sys

    from specctl import entry

    class Interrupting:   # (the imports as a Ctrl-C meets them)
        def find_spec(self, name, path=None, target=None):
            if name == "specctl.cli":
                raise KeyboardInterrupt
            return None
    monkeypatch.delitem(sys.modules, "specctl.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting()] + sys.meta_path)
    with pytest.raises(SystemExit) as e:
        entry.main()
    assert e.value.code == 130 and capsys.readouterr().err.strip() == "interrupted"
