"""What is checked before any work: the store is a folder this process can write (before the
demo model is downloaded), --out is this job's alone (a second process on it stops at once),
options that cannot be right (--device cpu:7, --seed -1), an architecture specctl cannot run;
and what is cleaned up: a run rejected before its first answer leaves no folder, `store gc`
removes the empty ones older runs left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import fails
from specctl.cli import app
from specctl.errors import SpecctlError

runner = CliRunner(env={"COLUMNS": "200"})


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def prompts(path: Path, n: int = 1) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Say {i} things"}) + "\n" for i in range(n)))
    return path


def generate(inp, out, store, model, *extra):
    return invoke("generate", inp, "--model", model, "--store", store, "--out", out,
                  "--max-tokens", 4, "--device", "cpu", "--dtype", "fp32", "-q", *extra)


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if the demo model download starts."""
    import specctl.models.checkpoint as ck

    def download(*a, **kw):
        raise AssertionError("the demo model download started")
    monkeypatch.setattr(ck, "_pip_download", download)


@contextmanager
def read_only(path: Path):
    """`path` (a folder) not writable, even for root (chattr +i), else skip."""
    os.chmod(path, 0o555)
    immutable = False
    try:
        if os.access(path, os.W_OK):   # root: the mode does not stop it
            immutable = subprocess.run(["chattr", "+i", str(path)],
                                       capture_output=True).returncode == 0
            if not immutable:
                pytest.skip("cannot make a read-only folder here")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        os.chmod(path, 0o755)


@pytest.mark.parametrize("how", ["--store", "SPECCTL_HOME"])
def test_a_store_that_is_a_file_fails_before_any_download(tmp_path, no_download, how):
    store = tmp_path / "store-file"
    store.write_text("")
    inp = prompts(tmp_path / "p.jsonl")
    if how == "--store":
        r = invoke("generate", inp, "--store", store, "--out", tmp_path / "o.jsonl", "-q")
    else:
        r = invoke("generate", inp, "--out", tmp_path / "o.jsonl", "-q",
                   env={"SPECCTL_HOME": str(store)})
    fails(r, str(store), f"({'--store' if how == '--store' else '$SPECCTL_HOME'})",
          "is a file", "SPECCTL_HOME", "--store")
    fails(invoke("models", "pull", "--store", store), "is a file")
    fails(invoke("bench", inp, "--store", store, "-q"), "is a file")
    fails(invoke("build-cache", "demo", "--store", store), "is a file")
    fails(invoke("generate", inp, "--store", store / "sub", "--out", tmp_path / "o.jsonl"),
          "cannot be created")


def test_a_read_only_store_fails_before_any_download(tmp_path, no_download):
    store = tmp_path / "ro"
    store.mkdir()
    inp = prompts(tmp_path / "p.jsonl")
    with read_only(store):
        fails(invoke("generate", inp, "--store", store, "--out", tmp_path / "o.jsonl", "-q"),
              str(store), "is not writable", "SPECCTL_HOME", "--store")
        fails(invoke("models", "pull", "--store", store), "is not writable")


def test_a_second_process_on_the_same_out_stops_at_once(tmp_path, tiny_llama):
    """Two `generate` processes started together on the same input and --out: the second
    stops at once with a message (before, both did the whole job, the later rename winning);
    the first finishes its job."""
    inp = prompts(tmp_path / "p.jsonl", 24)
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "specctl", "generate", str(inp), "--model", str(tiny_llama),
           "--out", str(out), "--max-tokens", "48", "--device", "cpu", "--dtype", "fp32",
           "-q", "-b", "1", "--threads", "1"]
    first = subprocess.Popen(cmd + ["--store", str(tmp_path / "s1")], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lock = tmp_path / ".o.jsonl.lock"
    deadline = time.time() + 120
    while not lock.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert lock.exists(), first.communicate()[0]
    t0 = time.time()
    second = subprocess.run(cmd + ["--store", str(tmp_path / "s2")], capture_output=True,
                            text=True, timeout=120)
    said = " ".join((second.stdout + second.stderr).split())
    assert second.returncode == 2 and "Traceback" not in said, said
    assert f"--out {out} is being written by another specctl process (pid {first.pid})" in said
    assert not (tmp_path / "s2" / "runs").exists()          # it did nothing
    assert first.poll() is None, "the first job ended before the second was refused"
    assert first.wait(timeout=300) == 0, first.communicate()[0]
    assert len(out.read_text().splitlines()) == 24 and not lock.exists()
    assert time.time() - t0 < 300


def test_out_lock_in_one_process(tmp_path, tiny_llama):
    from specctl.runtime.jobs.locks import OutLock
    inp, out = prompts(tmp_path / "p.jsonl"), tmp_path / "o.jsonl"
    held = OutLock(out)
    try:
        fails(generate(inp, out, tmp_path / "s", tiny_llama), "is being written", str(out))
    finally:
        held.release()
    r = generate(inp, out, tmp_path / "s", tiny_llama)
    assert r.exit_code == 0, r.output
    assert not (tmp_path / ".o.jsonl.lock").exists()


def test_runs_rejected_before_generating_leave_no_folder(tmp_path, tiny_llama):
    store = tmp_path / "s"
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "word " * 3000}) + "\n")
    fails(generate(long, tmp_path / "o.jsonl", store, tiny_llama), "context")
    fails(generate(prompts(tmp_path / "p.jsonl"), tmp_path / "o.jsonl", store, tiny_llama,
                   "--kv-memory", "1KB"), "--kv-memory")
    assert not any((store / "runs").iterdir())
    # --resume of a rejected run finds nothing to resume, and then works
    r = generate(prompts(tmp_path / "p.jsonl"), tmp_path / "o.jsonl", store, tiny_llama)
    assert r.exit_code == 0 and len(list((store / "runs").iterdir())) == 1


def test_store_gc(tmp_path):
    import fcntl
    store = tmp_path / "s"
    runs = store / "runs"
    old = time.time() - 3600

    def run(name: str, records: str = "", age: float = old) -> Path:
        d = runs / name
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
        (d / "records.jsonl").write_text(records)
        for p in (d / "manifest.json", d / "records.jsonl", d):
            os.utime(p, (age, age))
        return d

    empty, kept, fresh, held = (run("empty"), run("kept", '{"index": 0}\n'),
                                run("fresh", age=time.time()), run("held"))
    with open(held / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.utime(held / ".lock", (old, old))
        os.utime(held, (old, old))
        r = invoke("store", "gc", "--dry-run", "--store", store)
        assert r.exit_code == 0 and "would remove runs/empty" in r.output and empty.exists()
        r = invoke("store", "gc", "--store", store)
        assert r.exit_code == 0, r.output
    assert "removed runs/empty (no answers)" in r.output
    assert not empty.exists() and kept.exists() and fresh.exists() and held.exists()
    # once its process is gone (the lock free), the held one goes too; the fresh one stays
    assert "removed runs/held" in invoke("store", "gc", "--store", store).output
    assert "nothing to remove" in invoke("store", "gc", "--store", store).output
    assert fresh.exists()
    # a killed command's scratch goes; a killed search's or training's stays: --resume
    # continues from its checkpoint
    for name in ("build-cache-x1", "search-abc", "train-def"):
        (store / "work" / name).mkdir(parents=True)
    r = invoke("store", "gc", "--store", store)
    assert "removed work/build-cache-x1" in r.output
    assert (store / "work" / "search-abc").exists() and (store / "work" / "train-def").exists()
    # an artifact half built by a killed command (its lock free) goes; one being built stays
    from specctl.store import Store
    st = Store(store)
    dead = store / "ngram-caches" / ".junk.abc123.tmp"
    dead.mkdir(parents=True)
    (dead / "ngram.safetensors").write_bytes(b"x" * 100)
    os.utime(dead, (old, old))   # (one touched in the last minute may be a build starting)
    r = invoke("store", "ls", "--store", store)
    assert "kept for --resume" in r.output and "train-def" in r.output
    with st.building("ngram-caches", "live", {"kind": "ngram-cache"}) as live:
        r = invoke("store", "gc", "--store", store)
        assert "removed ngram-caches/.junk.abc123.tmp (half built by a killed command)" in \
            r.output and not dead.exists() and live.exists()
    assert (store / "ngram-caches" / "live").is_dir()
    assert [p.name for p in (store / "ngram-caches").iterdir()] == ["live"]   # (no lock left)
    # store rm takes the work folders ls lists: a kept one goes (its --resume starts over);
    # a scratch folder a running command holds, or a name ls does not list, is refused
    r = invoke("store", "rm", "work/train-def", "--yes", "--store", store)
    assert r.exit_code == 0 and "removed work/train-def" in r.output
    assert not (store / "work" / "train-def").exists() and (store / "work" / "search-abc").exists()
    busy = store / "work" / "build-cache-x2"
    busy.mkdir()
    with open(busy / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for name in ("build-cache-x2", "nope", "../runs"):
            r = invoke("store", "rm", f"work/{name}", "--yes", "--store", store)
            assert r.exit_code != 0 and "store ls" in r.output, name
    assert busy.exists() and (store / "runs").exists()
    r = invoke("store", "rm", "work/search-abc", "--store", store)   # (no tty: cannot ask)
    assert r.exit_code != 0 and "--yes" in r.output and (store / "work" / "search-abc").exists()
    # a search or training running in its folder holds it: not removed, and no second one
    # starts there
    held = st.hold_work(store / "work" / "search-abc", "search-skip")
    r = invoke("store", "rm", "work/search-abc", "--yes", "--store", store)
    assert r.exit_code != 0 and "in use" in r.output and (store / "work" / "search-abc").exists()
    with pytest.raises(SpecctlError, match="search-skip is running in"):
        st.hold_work(store / "work" / "search-abc", "search-skip")
    held.close()
    r = invoke("store", "rm", "work/search-abc", "--yes", "--store", store)
    assert r.exit_code == 0 and not (store / "work" / "search-abc").exists()
    # a run a job is writing (its lock held) is not removed; an empty id (an unset $ID)
    # names nothing, not every artifact
    live = store / "runs" / "live-run"
    live.mkdir(parents=True)
    (live / "manifest.json").write_text('{"kind": "run", "id": "live-run"}')
    with open(live / ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("4242\n")
        f.flush()
        r = invoke("store", "rm", "live-run", "--yes", "--store", store)
        assert r.exit_code != 0 and "in use" in r.output and "4242" in r.output
        assert live.exists()
    for empty in ("", " "):
        r = invoke("store", "rm", empty, "--yes", "--store", store)
        assert r.exit_code != 0 and "empty id" in r.output and live.exists()
    r = invoke("store", "rm", "live-run", "--yes", "--store", store)   # (its job has ended)
    assert r.exit_code == 0 and not live.exists()


def test_a_damaged_or_linked_run_is_shown_and_removed_cleanly(tmp_path):
    """store show on a damaged metrics.json says so (it was a traceback); store rm on a run
    folder linked into the store removes the link, never what it names (rmtree refused the
    link after it was renamed: an error, the run gone from ls, and every gc saying it removed
    what it had not)."""
    store = tmp_path / "s"
    for name, metrics in (("cut", '{"requests": 3, "tok'), ("list", "[]"), ("bytes", b"\xff{")):
        d = store / "runs" / f"ar-{name}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text('{"kind": "run"}')
        (d / "metrics.json").write_bytes(metrics if isinstance(metrics, bytes) else
                                         metrics.encode())
        r = invoke("store", "show", f"ar-{name}", "--store", store)
        assert r.exit_code == 0 and "unreadable metrics.json" in r.output, r.output
    outside = tmp_path / "outside" / "r1"
    outside.mkdir(parents=True)
    (outside / "manifest.json").write_text('{"kind": "run"}')
    (store / "runs" / "r1").symlink_to(outside)
    r = invoke("store", "rm", "r1", "--yes", "--store", store)
    assert r.exit_code == 0 and "removed runs/r1" in r.output, r.output
    assert not os.path.lexists(store / "runs" / "r1") and (outside / "manifest.json").is_file()
    assert not [p for p in (store / "runs").iterdir() if p.name.startswith(".")]
    # one a killed command left half-removed under the old way: gc takes the link alone
    gone = store / "runs" / ".r1.rm.tmp"
    gone.symlink_to(outside)
    os.utime(gone, (time.time() - 3600,) * 2, follow_symlinks=False)
    os.utime(outside, (time.time() - 3600,) * 2)
    r = invoke("store", "gc", "--store", store)
    assert "removed runs/.r1.rm.tmp" in r.output and not os.path.lexists(gone), r.output
    assert (outside / "manifest.json").is_file()


def test_gc_that_cannot_remove_says_why_and_fails(tmp_path, monkeypatch):
    """A stale folder gc cannot remove: named with the reason, and a non-zero exit (it said
    'removed' and exited 0)."""
    import specctl.cli.store_cmd as store_cmd
    store = tmp_path / "s"
    dead = store / "work" / "build-cache-x1"
    dead.mkdir(parents=True)

    def refused(path, *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(store_cmd.shutil, "rmtree", refused)
    r = invoke("store", "gc", "--store", store)
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "could not remove work/build-cache-x1 (Permission denied)" \
        in said and "removed work/" not in said.replace("could not remove", ""), said
    monkeypatch.undo()
    r = invoke("store", "gc", "--store", store)
    assert r.exit_code == 0 and not dead.exists(), r.output


def test_a_linked_work_folder_goes_as_a_link(tmp_path):
    """A scratch folder under work/ that is a link (no command makes one): gc removes the link
    alone, dangling or not, and nothing is made where it points (its lock was opened through
    it); a command's own start clears it the same way."""
    from specctl.store import Store
    store, outside = tmp_path / "s", tmp_path / "outside"
    (store / "work").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (store / "work" / "build-cache-x1").symlink_to(outside)
    (store / "work" / "build-cache-x2").symlink_to(tmp_path / "gone")
    r = invoke("store", "gc", "--store", store)
    assert r.exit_code == 0 and "removed work/build-cache-x1" in r.output and \
        "removed work/build-cache-x2" in r.output, r.output
    assert not list((store / "work").iterdir())
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    (store / "work" / "build-cache-x3").symlink_to(outside)
    with Store(store).work_dir("build-cache") as w:
        assert not (store / "work" / "build-cache-x3").is_symlink() and w.is_dir()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_device_and_seed_are_checked(tmp_path, tiny_llama):
    inp = prompts(tmp_path / "p.jsonl")
    fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "s", tiny_llama, "--device", "cpu:7"),
          "--device", "cpu:7")
    fails(generate(inp, tmp_path / "o.jsonl", tmp_path / "s", tiny_llama, "--seed", "-1"),
          "--seed", "-1")


def test_an_unsupported_architecture_is_said_first(tmp_path):
    """A GPT-2 folder (no Llama tensors, a vocab.json tokenizer, or nothing at all) is refused
    for its architecture, not for the files it lacks."""
    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2",
                                               "architectures": ["GPT2LMHeadModel"]}))
    fails(generate(prompts(tmp_path / "p.jsonl"), tmp_path / "o.jsonl", tmp_path / "s", d),
          "model_type 'gpt2' (GPT2LMHeadModel) is not supported")


def test_kill_9_then_resume(tmp_path, tiny_llama):
    """kill -9 mid-job leaves its run and a stale --out lock file: --resume takes both over,
    generates only what is missing, and the answers are an uninterrupted run's."""
    import signal
    inp, out, store = prompts(tmp_path / "p.jsonl", 16), tmp_path / "o.jsonl", tmp_path / "s"
    opts = ("--max-tokens", "32", "-b", "1", "--threads", "1")
    p = subprocess.Popen([sys.executable, "-m", "specctl", "generate", str(inp), "--model",
                          str(tiny_llama), "--out", str(out), "--store", str(store), "--device",
                          "cpu", "--dtype", "fp32", "-q", *opts],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    done = 0
    while done < 3 and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
        done = sum(len(f.read_text().splitlines()) for f in store.glob("runs/*/records.jsonl"))
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert 3 <= done < 16 and not out.exists() and (tmp_path / ".o.jsonl.lock").exists()
    r = generate(inp, out, store, tiny_llama, "--resume", *opts)
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "resuming" in said and "of 16 requests already done" in said, said
    assert not (tmp_path / ".o.jsonl.lock").exists()
    r = generate(inp, tmp_path / "whole.jsonl", tmp_path / "s2", tiny_llama, *opts)
    assert r.exit_code == 0, r.output
    got = [json.loads(l)["text"] for l in out.read_text().splitlines()]
    whole = (tmp_path / "whole.jsonl").read_text().splitlines()
    assert got == [json.loads(l)["text"] for l in whole]


def test_record_writer_fsyncs_off_the_callers_thread(tmp_path, monkeypatch):
    """A finished line is written and flushed at once (readable while the job runs, the OS's
    to keep if the process is killed) and fsynced by the writer's own thread, not the step's;
    close fsyncs whatever is left, and a disk error in the thread reaches the caller."""
    import threading
    from specctl.runtime.jobs import records
    synced = []
    real = os.fsync
    monkeypatch.setattr(records.os, "fsync",
                        lambda fd: (synced.append(threading.current_thread()), real(fd)))
    w = records.RecordWriter(tmp_path / "records.jsonl")
    for i in range(5):
        w.persist({"index": i})
        assert json.loads((tmp_path / "records.jsonl").read_text().splitlines()[-1]) == {"index": i}
    assert all(t is not threading.main_thread() for t in synced)
    w.close()
    assert synced and synced[-1] is threading.main_thread()   # (close's own, last)
    w.close()   # (twice: nothing more)

    def broken(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(records.os, "fsync", broken)
    w = records.RecordWriter(tmp_path / "records.jsonl")
    w.persist({"index": 5})
    w._syncer.join(5)   # (the thread stops at its error)
    from specctl.errors import SpecctlError
    with pytest.raises(SpecctlError, match="Input/output.*--resume"):   # (names the file too)
        w.persist({"index": 6})
    w.close()   # (the error was told once, by persist: close does not tell it again)
    assert [json.loads(l)["index"] for l in (tmp_path / "records.jsonl").read_text().splitlines()] \
        == [0, 1, 2, 3, 4, 5]


def test_a_disk_error_under_the_fsync_thread_stops_the_job_cleanly(tmp_path, tiny_llama,
                                                                   monkeypatch):
    """An fsync that fails in the record writer's thread ends the job with one clear error
    (through the job's own error path: the writer closed, the run's lock released), and a
    --resume once the disk is back finishes it."""
    from specctl.runtime.jobs import records
    real = os.fsync
    calls = []

    def broken(fd):
        calls.append(fd)
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(records.os, "fsync", broken)
    inp, out, store = prompts(tmp_path / "p.jsonl", 3), tmp_path / "o.jsonl", tmp_path / "s"
    fails(generate(inp, out, store, tiny_llama, "-b", "1"), "Input/output error")
    assert calls and not out.exists() and not (tmp_path / ".o.jsonl.lock").exists()
    monkeypatch.setattr(records.os, "fsync", real)
    r = generate(inp, out, store, tiny_llama, "-b", "1", "--resume")
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 3


def test_an_ambiguous_prefix_says_how_many_more_match():
    """The error names five of the matches and counts the rest (it dropped them unsaid: a
    probe's `store show fad5` matched nine)."""
    from specctl.store import Entry, Store
    entries = [Entry("adapters", f"fad5-l2-{i}", Path("x"), {}) for i in range(8)]
    with pytest.raises(SpecctlError, match=r"'fad5' is ambiguous: .*fad5-l2-4 and 3 more$"):
        Store._match("fad5", entries)
    with pytest.raises(SpecctlError, match=r"fad5-l2-4$"):
        Store._match("fad5", entries[:5])
