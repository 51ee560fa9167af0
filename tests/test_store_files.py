"""Where and how specctl writes (store/files.py): only where a regular file or nothing stands
(a symlink followed to its target, lock included; a device, FIFO, directory or socket
refused, naming the path); JSON lines framed by "\\n" alone, every Unicode line break carried
through generate and --resume."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.runtime.jobs.locks import OutLock
from specctl.runtime.jobs.records import RecordWriter, dumps, read_all_records
from specctl.store import atomic_write_text, jsonl_lines, writable_file

from helpers import fails

runner = CliRunner(env={"COLUMNS": "200"})
# every character str.splitlines() breaks at ("\n" too: JSON escapes it, as the ASCII ones)
BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
PROMPTS = [{"prompt": f"Say {i}", "id": f"id{c}{i}"} for i, c in enumerate(BREAKS)]


def args(inp, out, store, model, *extra) -> list[str]:
    return [str(a) for a in ("generate", inp, "--model", model, "--store", store, "--out", out,
                             "--max-tokens", 4, "--device", "cpu", "--dtype", "fp32", "-q",
                             *extra)]


def odd_paths(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a directory, a socket and (as root, as in a container) a character device made
    as /dev/null is: nothing of them may be replaced."""
    out = {"FIFO": tmp_path / "fifo", "directory": tmp_path / "dir"}
    os.mkfifo(out["FIFO"])
    out["directory"].mkdir()
    out["socket"] = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(out["socket"]))
    s.close()
    if os.geteuid() == 0:
        out["character device"] = tmp_path / "null"
        os.mknod(out["character device"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return out


def test_every_writer_refuses_what_is_not_a_regular_file(tmp_path):
    for kind, p in odd_paths(tmp_path).items():
        mode = os.lstat(p).st_mode
        for write in (lambda q: writable_file(q, "--out"), lambda q: atomic_write_text(q, "x"),
                      RecordWriter, OutLock):
            with pytest.raises(SpecctlError, match=f"{p.name}.* is a {kind}|is a directory"):
                write(p)
        link = tmp_path / f"to-{p.name}"
        link.symlink_to(p)
        with pytest.raises(SpecctlError, match=f"a link to {p}.* is a {kind}|is a directory"):
            atomic_write_text(link, "x")
        assert os.lstat(p).st_mode == mode   # (nothing replaced it)


def test_generate_refuses_such_an_out_before_the_model_loads(tmp_path, tiny_llama):
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]), encoding="utf-8")
    for kind, p in odd_paths(tmp_path).items():
        mode = os.lstat(p).st_mode
        r = runner.invoke(app, args(inp, p, tmp_path / "store", tmp_path / "no-model"))
        fails(r, str(p), "directory" if kind == "directory" else kind)
        assert os.lstat(p).st_mode == mode


def test_a_symlinked_out_is_written_through_with_the_lock_on_its_target(tmp_path, tiny_llama):
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]), encoding="utf-8")
    (tmp_path / "real").mkdir()
    target, link = tmp_path / "real" / "answers.jsonl", tmp_path / "link.jsonl"
    target.write_text("old\n")
    link.symlink_to(target)
    lock = OutLock(link)
    assert lock.path == target.with_name(".answers.jsonl.lock")
    lock.release()
    r = runner.invoke(app, args(inp, link, tmp_path / "store", tiny_llama))
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert [json.loads(l)["id"] for l in jsonl_lines(target.read_text())] == \
        [p["id"] for p in PROMPTS[:2]]


def test_every_line_break_survives_generate_and_resume(tmp_path, tiny_llama, count_generated):
    """An id holding U+2028 (or any break str.splitlines() knows) lost its line: written raw,
    read back split. The output escapes the non-ASCII ones; --resume has every line."""
    inp, out, store = tmp_path / "p.jsonl", tmp_path / "o.jsonl", tmp_path / "store"
    inp.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in PROMPTS),
                   encoding="utf-8")
    r = runner.invoke(app, args(inp, out, store, tiny_llama))
    assert r.exit_code == 0, r.output
    raw = out.read_text(encoding="utf-8")
    assert len(raw.splitlines()) == len(PROMPTS)   # (safe for a reader that splits so, too)
    assert [json.loads(l)["id"] for l in jsonl_lines(raw)] == [p["id"] for p in PROMPTS]
    (run,) = (store / "runs").iterdir()
    assert sorted(read_all_records(run)) == list(range(len(PROMPTS)))
    count_generated.clear()
    r = runner.invoke(app, args(inp, tmp_path / "again.jsonl", store, tiny_llama, "--resume"))
    assert r.exit_code == 0, r.output
    assert count_generated == [] and (tmp_path / "again.jsonl").read_text() == raw


def test_dumps_escapes_the_breaks_json_leaves_raw():
    line = dumps({"text": BREAKS})
    assert "\n" not in line and len(line.splitlines()) == 1
    assert json.loads(line) == {"text": BREAKS}


def test_a_full_store_names_the_file_and_resume_and_tokens_per_s_after_it(
        tmp_path, tiny_llama, monkeypatch, count_generated):
    """The disk fills while the run writes its records (after the first), then while it
    writes its metrics: each error names the file and --resume; the resumed run that had
    nothing left to generate does not claim 0.0 tokens/s."""
    import errno

    from specctl.runtime.jobs import merge, records
    inp, out, store = tmp_path / "p.jsonl", tmp_path / "o.jsonl", tmp_path / "store"
    inp.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:3]), encoding="utf-8")
    full = OSError(errno.ENOSPC, "No space left on device")

    class Full:   # a record file on a disk that fills after one line
        def __init__(self, fh):
            self.fh, self.lines = fh, 0

        def write(self, text):
            self.lines += 1
            if self.lines > 1:
                raise full
            return self.fh.write(text)

        def __getattr__(self, name):
            return getattr(self.fh, name)
    real_init = records.RecordWriter.__init__

    def init(self, path):
        real_init(self, path)
        self.fh = Full(self.fh)
    with monkeypatch.context() as mp:
        mp.setattr(records.RecordWriter, "__init__", init)
        r = runner.invoke(app, args(inp, out, store, tiny_llama, "--batch-size", 1))
    fails(r, "records.jsonl", "No space left", "--resume")

    def no_metrics(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as mp:
        mp.setattr(merge, "atomic_write_json", no_metrics)
        r = runner.invoke(app, args(inp, out, store, tiny_llama, "--resume"))
    fails(r, "metrics.json", "--resume")
    count_generated.clear()
    r = runner.invoke(app, args(inp, out, store, tiny_llama, "--resume"))
    assert r.exit_code == 0, r.output
    assert count_generated == [] and "0.0 tokens/s" not in r.output
    assert "tokens/s not measured" in " ".join(r.output.split())
    (run,) = (store / "runs").iterdir()
    assert json.loads((run / "metrics.json").read_text())["tokens_per_s"] is None


def test_a_link_to_a_pipe_is_named_a_pipe(tmp_path):
    """/dev/stdout on a pipe resolves to /proc/<pid>/fd/pipe:[N], which is no path: the
    message says what is there (a FIFO), not 'No such file or directory'."""
    r, w = os.pipe()
    try:
        link = tmp_path / "out"
        os.symlink(f"/proc/{os.getpid()}/fd/{w}", link)
        with pytest.raises(SpecctlError, match="is a FIFO"):
            writable_file(link, "--out")
    finally:
        os.close(r)
        os.close(w)
