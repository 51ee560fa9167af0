"""Hostile values in every text field of every input format (lone surrogates, NUL, very long
strings, wrong types), with and without --skip-bad: a bad line is one line of error naming the
file and line, never a traceback; with --skip-bad the good lines' answers reach --out, equal to
a run of the good lines alone, and the output is valid UTF-8 JSON. Also --stop, the Python API,
and a compressed input file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import fails
from specctl.cli import app

runner = CliRunner(env={"COLUMNS": "200"})
MAX_TOKENS = 4
GOOD = [{"prompt": "The quick brown fox", "id": "g1"},
        {"messages": [{"role": "user", "content": "Write a poem"}], "id": "g2"},
        {"custom_id": "g3", "body": {"messages": [{"role": "user", "content": "Hello"}]}},
        {"question_id": "g4", "category": "writing", "turns": ["Explain it.", "Shorter."]}]

SURROGATE, NUL, LONG = "\ud800", "a\u0000b", "word " * 20000
WRONG = [5, 1.5, True, None, [], {}, ["x"]]


def _set(obj: dict, path: tuple, value) -> dict:
    """A deep copy of obj with the field at `path` (keys and list indices) set to value."""
    obj = json.loads(json.dumps(obj))
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return obj


# every text field of every format: (line, path to the field)
FIELDS = {
    "prompt.prompt": (GOOD[0], ("prompt",)),
    "prompt.id": (GOOD[0], ("id",)),
    "prompt.category": ({**GOOD[0], "category": "c"}, ("category",)),
    "messages.content": (GOOD[1], ("messages", 0, "content")),
    "messages.content-part": ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi"}]}]}, ("messages", 0, "content", 0, "text")),
    "messages.role": (GOOD[1], ("messages", 0, "role")),
    "messages.id": (GOOD[1], ("id",)),
    "openai.custom_id": (GOOD[2], ("custom_id",)),
    "openai.content": (GOOD[2], ("body", "messages", 0, "content")),
    "openai.max_tokens": (GOOD[2], ("body", "max_tokens")),
    "turns.question_id": (GOOD[3], ("question_id",)),
    "turns.category": (GOOD[3], ("category",)),
    "turns.turn1": (GOOD[3], ("turns", 0)),
    "turns.turn2": (GOOD[3], ("turns", 1)),
}


ID_FIELDS = ("prompt.id", "messages.id", "openai.custom_id", "turns.question_id")
OPTIONAL = ID_FIELDS + ("prompt.category", "turns.category", "openai.max_tokens")
# where a 100k-character string makes a first prompt longer than the context (512 tokens)
LONG_BAD = ("prompt.prompt", "messages.content", "messages.content-part", "openai.content",
            "turns.turn1")


def is_bad(field: str, v) -> bool:
    """What reading (or sizing) must refuse: text UTF-8 cannot encode, a wrong type, a role
    that is none, a first prompt longer than the context."""
    if v is None:
        return field not in OPTIONAL          # (a null id or category: none given)
    if field == "openai.max_tokens":
        return not (type(v) is int and v > 0)
    if field == "messages.role":
        return True
    if field in ID_FIELDS and type(v) is int:
        return False
    if field.endswith(".content") and v == []:
        return False                          # no content parts: an empty message
    if not isinstance(v, str) or SURROGATE in v:
        return True
    return v is LONG and field in LONG_BAD    # (a long later turn stops at the context)


def hostile_lines(one_each: bool = False) -> list[tuple[str, dict, bool]]:
    """(name, line, bad?) for every field and hostile value (one_each: only the first bad
    value of each kind per field)."""
    out = []
    for name, (line, path) in FIELDS.items():
        values = [("surrogate", SURROGATE), ("surrogate-inside", "ok" + SURROGATE + "ok"),
                  ("nul", NUL), ("long", LONG)]
        values += [(f"wrong-{json.dumps(v)}", v) for v in WRONG]
        if name.endswith("max_tokens"):
            values += [("huge", 10 ** 30), ("zero", 0), ("negative", -3)]
        seen = set()
        for vname, v in values:
            bad, kind = is_bad(name, v), vname.split("-")[0]
            if one_each and (not bad or kind in seen):
                continue
            seen.add(kind)
            out.append((f"{name}:{vname}", _set(line, path, v), bad))
    return out


def write_lines(path: Path, lines: list[dict]) -> Path:
    # json.dumps escapes a lone surrogate as \ud800: valid JSON, as a user's file would have it
    path.write_text("".join(json.dumps(l) + "\n" for l in lines), encoding="utf-8")
    return path


def generate(inp, out, store, model, *extra):
    return runner.invoke(app, [str(a) for a in (
        "generate", inp, "--model", model, "--store", store, "--out", out, "--max-tokens",
        MAX_TOKENS, "--device", "cpu", "--dtype", "fp32", "-q", *extra)])


def read_out(path: Path) -> list[dict]:
    raw = Path(path).read_bytes()
    raw.decode("utf-8")   # (strict: the output is valid UTF-8)
    return [json.loads(l) for l in raw.decode().splitlines()]


@pytest.fixture(scope="module")
def good_answers(tmp_path_factory, tiny_llama) -> dict:
    """The good lines' answers in a run of their own, by id."""
    d = tmp_path_factory.mktemp("good")
    r = generate(write_lines(d / "good.jsonl", GOOD), d / "o.jsonl", d / "store", tiny_llama)
    assert r.exit_code == 0, r.output
    return {l.get("id") or l.get("custom_id") or l.get("question_id"): l["text"]
            for l in read_out(d / "o.jsonl")}


def test_every_field_with_skip_bad(tmp_path, tiny_llama, good_answers):
    """One file: the good lines between all the hostile ones; --skip-bad records each bad line
    with its reason, answers the rest, and the good lines' answers are theirs."""
    cases = hostile_lines()
    lines = []
    for i, (_, line, _) in enumerate(cases):
        lines += [line, GOOD[i % len(GOOD)]]
    inp = write_lines(tmp_path / "hostile.jsonl", lines)
    out = tmp_path / "o.jsonl"
    r = generate(inp, out, tmp_path / "store", tiny_llama, "--skip-bad")
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "Traceback" not in r.output
    got = read_out(out)
    assert [l["index"] for l in got] == list(range(len(lines)))
    for i, (name, _, bad) in enumerate(cases):
        hostile, good = got[2 * i], got[2 * i + 1]
        if bad:
            assert "error" in hostile and "text" not in hostile, (name, hostile)
            assert f"hostile.jsonl:{2 * i + 1}:" in hostile["error"], (name, hostile)
            assert "\n" not in hostile["error"]
        else:
            assert "error" not in hostile and isinstance(hostile["text"], str), (name, hostile)
        ident = good.get("id") or good.get("custom_id") or good.get("question_id")
        assert good["text"] == good_answers[ident], (name, good)
    surrogates = [got[2 * i]["error"] for i, (n, _, _) in enumerate(cases)
                  if "surrogate" in n and not n.startswith(("messages.role", "openai.max"))]
    assert len(surrogates) == 24 and all("lone surrogate \\ud800" in e for e in surrogates)


@pytest.mark.parametrize("name, line", [(n, l) for n, l, _ in hostile_lines(one_each=True)],
                         ids=[n for n, _, _ in hostile_lines(one_each=True)])
def test_every_bad_field_without_skip_bad(tmp_path, tiny_llama, name, line):
    inp = write_lines(tmp_path / "in.jsonl", [GOOD[0], line])
    out = tmp_path / "o.jsonl"
    fails(generate(inp, out, tmp_path / "store", tiny_llama), "in.jsonl:2")
    assert not out.exists()
    runs = tmp_path / "store" / "runs"
    assert not runs.is_dir() or not any(runs.iterdir())   # no empty run left behind


def test_an_id_that_cannot_be_written_is_a_bad_line_and_resume_recovers(tmp_path, tiny_llama,
                                                                        good_answers):
    """The probe's case: a surrogate id crashed while writing the record, after generating;
    --resume and --skip-bad crashed the same way forever."""
    inp = write_lines(tmp_path / "in.jsonl", [GOOD[0], {"prompt": "hi", "id": SURROGATE}])
    out = tmp_path / "o.jsonl"
    fails(generate(inp, out, tmp_path / "s", tiny_llama), "in.jsonl:2", "id")
    r = generate(inp, out, tmp_path / "s", tiny_llama, "--skip-bad", "--resume")
    assert r.exit_code == 0, r.output
    got = read_out(out)
    assert got[0]["text"] == good_answers["g1"] and "lone surrogate" in got[1]["error"]


def test_stop_strings_and_the_python_api(tmp_path, tiny_llama):
    from specctl import Generator
    from specctl.errors import SpecctlError

    inp = write_lines(tmp_path / "in.jsonl", GOOD[:1])
    fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "s", tiny_llama, "--stop", SURROGATE),
          "--stop", "surrogate")
    g = Generator(str(tiny_llama), store=tmp_path / "s", device="cpu", dtype="fp32")
    for bad in (SURROGATE, {"turns": ["ok", SURROGATE]}, {"prompt": "x", "id": SURROGATE},
                [{"role": "user", "content": SURROGATE}]):
        with pytest.raises(SpecctlError, match="surrogate"):
            g.generate([bad], max_tokens=2)
    with pytest.raises(SpecctlError, match="surrogate"):
        g.generate(["hi"], max_tokens=2, stop=[SURROGATE])
    assert g.generate([NUL], max_tokens=2)[0].new_tokens >= 1


@pytest.mark.parametrize("kind", ["gzip", "zip"])
def test_compressed_input_is_named(tmp_path, tiny_llama, kind):
    text = "".join(json.dumps(l) + "\n" for l in GOOD).encode()
    inp = tmp_path / "in.jsonl"
    if kind == "gzip":
        inp.write_bytes(gzip.compress(text))
    else:
        import zipfile
        with zipfile.ZipFile(inp, "w") as z:
            z.writestr("in.jsonl", text)
    err = fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "s", tiny_llama),
                "in.jsonl", f"{kind}-compressed")
    assert "UTF-8" not in err
