"""The one way specctl writes a file and reads back the JSON lines it wrote.

- Where: every file specctl writes (an output, its temp file, metrics, a run's records, a lock
  file, a store artifact) goes through `writable_file` first. A path where nothing stands, or
  a regular file, is written; a symlink is followed to what it names (the write, its temp file
  and any lock are the target's: a link to a file is written through, never replaced by a
  file of its own); anything else (a device such as /dev/null, a FIFO, a directory, a socket)
  is refused, naming the path: an atomic rename over a device node would replace the node.
- How: whole files atomically (a temp file beside the target, fsynced, renamed over it).
- Reading back: JSON lines are framed by "\\n" alone (`jsonl_lines`). `str.splitlines()` also
  breaks at U+2028, U+2029, U+0085, \\x1c-\\x1e, \\v and \\f, which a JSON string may hold raw:
  a record so split is lost. The writers escape the non-ASCII ones too (runtime/jobs/records.py
  dumps), so other readers of an output are safe as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from specctl.errors import SpecctlError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def writable_file(path: Path | str, what: str = "") -> Path:
    """The path to write `path` at: itself, or the file a symlink at it names (resolved all
    the way). SpecctlError naming `path` (as `what` calls it, e.g. "--out") where something
    other than a regular file stands there."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        try:   # (/dev/stdout on a pipe resolves to "/proc/<pid>/fd/pipe:[N]", no path: the
            mode = os.stat(path).st_mode   # thing the link reaches is still there to see)
        except OSError:
            return target
    except OSError as e:
        raise SpecctlError(f"{what + ' ' if what else ''}{path}: cannot write there "
                           f"({e.strerror or e})") from None
    if stat.S_ISREG(mode):
        return target
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    via = f" (a link to {target})" if target != path.absolute() else ""
    raise SpecctlError(f"{what + ' ' if what else ''}{path}{via} is {kind}, not a regular "
                       "file: specctl writes only where a regular file or nothing stands")


def lock_holder(f) -> str:
    """The pid the holder of open lock file f wrote in it (`claim_lock`), or "" where there is
    none to read."""
    try:
        f.seek(0)
        pid = f.read(32).strip()
        return pid if pid.isdigit() else ""
    except OSError:
        return ""


def claim_lock(f) -> None:
    """Write this process's pid into lock file f, just locked, for the next one's message."""
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()


def _umask() -> int:
    mask = os.umask(0o022)   # (read once, at import: os.umask can only be read by setting it)
    os.umask(mask)
    return mask


UMASK = _umask()


def published(path: Path | int, mode: int = 0o666) -> Path | int:
    """Give a temp file (mkstemp: 0600) or directory (mkdtemp: 0700) the mode an ordinary
    open() or mkdir() would have (mode less the umask), so that the files of a shared store
    stay readable by the others who use it. path: a path or an open file descriptor. Where
    the filesystem has no modes to set, it stays as it is."""
    try:
        (os.fchmod if isinstance(path, int) else os.chmod)(path, mode & ~UMASK)
    except OSError:
        pass
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` (writable_file: a symlink's target) via a temp file in the same
    directory and an atomic rename."""
    path = writable_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            published(f.fileno())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        writable_file(path)   # (again: something may have been put there meanwhile)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:   # (a write's: a full disk)
            e.filename = str(path)   # (named, as an open's error is)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecctlError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecctlError(f"{path}: not valid JSON ({e})") from None


def jsonl_lines(text: str | bytes) -> Iterator:
    """The lines of JSON-lines text, framed by "\\n" alone (see the module docstring); blank
    ones (a file's end, a torn line ended by RecordWriter) left out."""
    for line in text.split("\n" if isinstance(text, str) else b"\n"):
        if line.strip():
            yield line


def file_sha256(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = limit
        while True:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
                if left <= 0:
                    break
    return h.hexdigest()


def file_crc32(path: Path) -> str:
    """A fast checksum of a file (zlib's crc32, ~1 GB/s): it catches a damaged or edited
    weights file at every load without a noticeable wait (not a defence against tampering:
    the store is trusted to be the user's own)."""
    import zlib
    c = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            c = zlib.crc32(chunk, c)
    return f"{c:08x}"
