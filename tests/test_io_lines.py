"""An input is read once (io/lines.py): its identity, what --resume matches, is the hash of
the bytes that one read saw. The probe's case: two piped inputs hashed alike (the path was
opened again to hash it, and a pipe is empty by then), so --resume took A's answers for B's."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.io.shards import read_input
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.records import read_input as job_input
from specctl.store import file_sha256

runner = CliRunner(env={"COLUMNS": "200"})
A = [{"prompt": "The quick brown fox", "id": "a0"}, {"prompt": "To be or not", "id": "a1"}]
B = [{"prompt": "Paris is the capital of", "id": "b0"}, {"prompt": "Count to ten", "id": "b1"}]


def text(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def fifo(path: Path, data: str) -> Path:
    """A named pipe a thread writes `data` to once (as `<(cat file)` does)."""
    if path.exists():
        path.unlink()
    os.mkfifo(path)

    def feed():
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
    threading.Thread(target=feed, daemon=True).start()
    return path


def substitution(data: str) -> tuple[Path, int]:
    """What bash's `<(cat file)` gives: /dev/fd/N, the read end of a pipe that a writer
    fills and closes (opened again, it is at its end: empty). Returns (path, fd to close)."""
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "w", encoding="utf-8") as f:
            f.write(data)
    threading.Thread(target=feed, daemon=True).start()
    return Path(f"/dev/fd/{r}"), r


def test_a_pipe_is_read_once_and_hashed_from_what_was_read(tmp_path):
    (tmp_path / "a.jsonl").write_text(text(A), encoding="utf-8")
    got = read_input(fifo(tmp_path / "in", text(A)))
    assert [r.id for r in got.records] == ["a0", "a1"] and not got.regular
    assert got.sha256 == file_sha256(tmp_path / "a.jsonl")
    assert read_input(fifo(tmp_path / "in", text(B))).sha256 != got.sha256
    # past --limit too: the whole input is in its hash
    assert read_input(fifo(tmp_path / "in", text(A)), limit=1).sha256 == got.sha256


def test_resume_from_another_pipe_is_another_input(tmp_path, tiny_llama):
    """A, then B with --resume, each through `<(cat ...)`: B's answers, never A's (they
    were: "already complete: nothing to generate", A's answers as B's)."""
    store, out = tmp_path / "store", tmp_path / "o.jsonl"

    def gen(data, *extra):
        inp, fd = substitution(data)
        try:
            r = runner.invoke(app, [str(a) for a in (
                "generate", inp, "--model", tiny_llama, "--store", store, "--out", out,
                "--max-tokens", 4, "--device", "cpu", "--dtype", "fp32", "-q", *extra)])
        finally:
            os.close(fd)
        assert r.exit_code == 0, r.output
        return r.output, [json.loads(l)["id"] for l in out.read_text().split("\n") if l]
    assert gen(text(A))[1] == ["a0", "a1"]
    said, ids = gen(text(B), "--resume")
    assert ids == ["b0", "b1"] and "already complete" not in said
    said, ids = gen(text(B), "--resume")   # the same bytes again: that run, resumed
    assert ids == ["b0", "b1"] and "already complete" in said


def test_a_piped_input_needs_its_out_named(tmp_path, tiny_llama, monkeypatch):
    """`<(cat a.jsonl)` is /dev/fd/N: its default output would be N.out.jsonl, the same name
    for every piped run. Refused before anything is read, --out named."""
    monkeypatch.chdir(tmp_path)
    inp, fd = substitution(text(A))
    try:
        r = runner.invoke(app, ["generate", str(inp), "--model", str(tiny_llama), "--store",
                                str(tmp_path / "store"), "--device", "cpu", "-q"])
    finally:
        os.close(fd)
    assert r.exit_code != 0 and "pass --out FILE" in r.output, r.output
    # (`/dev/stdin < a.jsonl`: a regular file's descriptor, named as no file of its own)
    f = tmp_path / "a.jsonl"
    f.write_text(text(A))
    with open(f) as opened:
        r = runner.invoke(app, ["generate", f"/proc/self/fd/{opened.fileno()}", "--model",
                                str(tiny_llama), "--store", str(tmp_path / "store"), "-q"])
    assert r.exit_code != 0 and "pass --out FILE" in r.output, r.output
    assert not list(tmp_path.glob("*.out.jsonl"))


def test_several_processes_refuse_a_pipe_before_reading_it(tmp_path):
    """Each rank reads the input itself: a pipe would give the second rank nothing (or block
    it). Refused by its kind alone: nothing opens it (this would block if it did)."""
    p = tmp_path / "in.jsonl"
    os.mkfifo(p)
    with pytest.raises(SpecctlError, match="not a regular file .* 2 processes"):
        job_input(GenerateConfig(input=str(p)), p, processes=2)
