"""Exclusive locks a `generate` job holds while it runs (fcntl.flock: the kernel drops them
when the process ends, however it ends, so a killed job leaves nothing locked).

- the run folder (`runs/<id>/.lock`): a second process resuming the same run would append to
  the same records file;
- the output file (`.<name>.lock` beside `--out`, beside the file it names when it is a
  symlink: store/files.py writable_file): two jobs started together on the same input
  would each do the whole job, and the later rename would win; the second stops at once.

A lock file holds the pid of the process that holds it, for the message the next one gets.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.store import claim_lock, lock_holder, writable_file


class Busy(Exception):
    """The lock is held by another process (pid, if it wrote one)."""

    def __init__(self, pid: str):
        super().__init__(pid)
        self.pid = pid


def _acquire(path: Path):
    """The open, locked lock file at `path` (created if need be); Busy if another process
    holds it. A lock file removed by its holder on release (the --out lock) may be unlinked
    between our open and our lock: then the lock is on a dead inode, so try again."""
    path = writable_file(path)   # (a FIFO there would block the open; a device is no lock)
    tries = 0
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = lock_holder(f)
            f.close()
            tries += 1
            if tries < 5:   # (a look that holds it an instant, run_in_use's: wait it out)
                time.sleep(0.02)
                continue
            raise Busy(pid) from None
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    claim_lock(f)
    return f


def run_in_use(run_dir: Path) -> str | None:
    """The pid of the process holding run_dir's lock ("" where it wrote none), or None when
    no process does (a look: the lock is not taken)."""
    path = run_dir / ".lock"
    if not path.is_file():
        return None
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return lock_holder(f) or ""
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _pid(b: Busy) -> str:
    return f" (pid {b.pid})" if b.pid else ""


def lock_run(run_dir: Path):
    """An exclusive lock on a run folder for as long as the job runs."""
    try:
        return _acquire(run_dir / ".lock")
    except Busy as b:
        raise SpecctlError(f"run {run_dir.name} is in use by another specctl process{_pid(b)}: "
                           "let it finish (or stop it), then run this again with --resume"
                           ) from None


def out_path(raw: str | os.PathLike) -> Path:
    """--out as given, made a Path: refused where it is empty, or ends in a separator and is
    no folder (a Path drops the separator: `--out newdir/` wrote a file named newdir)."""
    text = os.fspath(raw)
    if not text:
        raise SpecctlError("--out is empty: pass a file path")
    if text.endswith(("/", os.sep)) and not Path(text).is_dir():
        raise SpecctlError(f"--out {text} ends in '/', a folder's name, and there is no such "
                           "folder: pass a file path")
    return Path(text)


def check_job_cache_file(path: str | None, out: Path | None, input: Path) -> None:
    """--job-cache-file is neither --out nor the input file (the saved cache would replace
    the answers or the prompts, and the next run would fail to read it back), nor inside an
    input directory."""
    if path is None:
        return
    cache = Path(path).expanduser()
    for other, what in ((out, "--out: the saved job cache and the answers would overwrite "
                              "each other"),
                        (input, "the input file: the saved job cache would replace the "
                                "prompts")):
        if other is not None and (cache.resolve() == other.resolve() or cache.exists()
                                  and other.exists() and os.path.samefile(cache, other)):
            raise SpecctlError(f"--job-cache-file {path} is {what}; pass another file")
    if _inside(cache, input):
        raise SpecctlError(f"--job-cache-file {path} is inside the input directory, whose "
                           "files are read as prompt shards: pass a file elsewhere")


def check_out(out: Path, input: Path, named: bool = True, store=None) -> None:
    """`out` can take this job's answers, refused before anything runs: a file path where
    specctl may write (not a directory; writable_file, and a probe file made and removed
    beside it), not the input file (answers would replace the prompts), and not inside an
    input directory (its files are read as prompt shards: the next run would read the answers
    back as prompts), nor inside `store` (a Store: its files are specctl's). named: `out` was
    given, not the default name (said as such). The CLI and the API's generate_file both come
    here (runtime/jobs/job.py _read)."""
    import tempfile
    if out.is_dir():
        raise SpecctlError(f"--out {out} is a directory; pass a file path")
    if store is not None and store.root.resolve() in out.resolve().parents:
        raise SpecctlError(f"--out {out} is inside the store ({store.root}), whose files are "
                           "specctl's own (a run's are in runs/<id>/): pass --out elsewhere")
    target = writable_file(out, "--out")
    try:
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".probe"):
            pass
    except OSError as e:
        raise SpecctlError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    if out.exists() and input.exists() and os.path.samefile(out, input):
        raise SpecctlError(f"--out {out} is the input file: answers would replace the prompts")
    if _inside(out, input):
        what = f"--out {out} is" if named else f"the default output, {out} (in the current " \
            "directory), would be"
        raise SpecctlError(f"{what} inside the input directory, whose files are read as "
                           "prompt shards: pass --out elsewhere")


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` lies in the directory `folder`, by its own path or by what it links to
    (a link placed in the folder is read as a shard, and what is written through it would
    replace a file's prompts)."""
    if not folder.is_dir():
        return False
    where = Path(os.path.abspath(path)).parent.resolve()   # (the folder the path itself is in)
    inside = folder.resolve()
    return inside in path.resolve().parents or inside in (where, *where.parents)


class OutLock:
    """An exclusive lock on an output file, held for the whole job (see the module docstring);
    release() removes the lock file."""

    def __init__(self, out: Path):
        target = writable_file(out, "--out")
        self.path = target.with_name(f".{target.name}.lock")
        try:
            self.f = _acquire(self.path)
        except Busy as b:
            raise SpecctlError(
                f"--out {out} is being written by another specctl process{_pid(b)}: wait for "
                "it to finish (its answers go there), or give this run another --out") from None
        except OSError as e:
            raise SpecctlError(f"--out {out}: cannot lock it ({self.path}: "
                               f"{e.strerror or e})") from None

    def release(self) -> None:
        if self.f is not None:
            try:
                os.unlink(self.path)   # (while held: a process waiting on it retries, see _acquire)
            except OSError:
                pass
            self.f.close()
            self.f = None
