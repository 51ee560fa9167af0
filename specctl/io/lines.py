"""A prompt file read once (io/shards.py reads Parquet files and directories through here).

Every input is read exactly once, and what --resume matches it by (its sha256) is taken from
the bytes that read saw, not by opening the path again: a pipe (`<(cat a.jsonl)`,
/dev/stdin, a FIFO) is empty by a second open, so every piped input used to hash alike and a
resumed run took one input's answers for another's; a regular file edited between two reads
would do the same. A regular file is streamed through a hash (`open_once`); anything else
that can be read (a pipe, a character device) is read whole into memory first, up to
MAX_PIPED_BYTES (more is refused: write it to a file), then the same way. Past a --limit the
file is still read to its end: for its hash, and for whether any line carries settings of its
own (runtime/jobs/records.py per_line).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, line_record

MAX_LINE_BYTES = 10 * 1024 * 1024   # (a longer line is refused: see io/prompts.py)
MAX_PIPED_BYTES = 1 << 30   # what a pipe or device may give, held in memory (open_once): an
# endless one (/dev/zero, `yes |`) filled 24 GB and was killed by the kernel, deaf to TERM


@dataclass(frozen=True)
class FileRead:
    """One file as read: its records (the first `limit`), the sha256 of all its bytes, and
    whether any of its lines (past `limit` too) carries sampling settings of its own; and
    whether it is a regular file (not a pipe)."""
    records: list[PromptRecord]
    sha256: str
    own_settings: bool
    regular: bool


class Hashed:
    """A binary file whose every byte read is hashed (peek reads ahead without hashing)."""

    def __init__(self, f, regular: bool):
        self.f, self.regular, self.h = f, regular, hashlib.sha256()

    def readline(self, n: int = -1) -> bytes:
        b = self.f.readline(n)
        self.h.update(b)
        return b

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        return b

    def peek(self, n: int) -> bytes:
        return self.f.peek(n)

    def drain(self) -> str:
        """The rest read (and hashed); the sha256 of the whole file."""
        while self.read(1 << 20):
            pass
        return self.h.hexdigest()

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> "Hashed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_once(path: Path, what: str = "prompt file") -> Hashed:
    """`path` open for its one read (see the module docstring); SpecctlError naming it where
    it cannot be opened."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        if str(path) == "-":
            raise SpecctlError("'-' is no file: for standard input pass /dev/stdin "
                               "(`... | specctl generate /dev/stdin --out answers.jsonl`)"
                               ) from None
        raise SpecctlError(f"{path}: {what} not found") from None
    except OSError as e:
        raise SpecctlError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
        if not regular:   # (a pipe: read now, whole; nothing can read it again)
            with f:
                f = io.BufferedReader(_piped(f, path, what))
    except OSError as e:
        f.close()
        raise SpecctlError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    return Hashed(f, regular)


def _piped(f, path: Path, what: str) -> io.BytesIO:
    """All a pipe or device gives, up to MAX_PIPED_BYTES, in memory (read in pieces: a
    signal's handler runs between them)."""
    got = io.BytesIO()
    while got.tell() <= MAX_PIPED_BYTES:
        b = f.read(1 << 20)
        if not b:
            got.seek(0)
            return got
        got.write(b)
    raise SpecctlError(f"{path}: a {what} that is not a regular file gave more than "
                       f"{MAX_PIPED_BYTES >> 30} GB (held in memory to be read once); write it "
                       f"to a file and pass that")


def _lines(f):
    """Yield (line_no, bytes) per line (framed by b"\\n" alone); bytes is None for a line over
    MAX_LINE_BYTES."""
    line_no = 0
    while True:
        chunk = f.readline(MAX_LINE_BYTES + 1)
        if not chunk:
            return
        line_no += 1
        if len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while chunk and not chunk.endswith(b"\n"):  # skip the rest of the line
                chunk = f.readline(MAX_LINE_BYTES)
            yield line_no, None
        else:
            yield line_no, chunk


# what compressed files start with (a JSONL file starts with text)
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -k"), (b"BZh", "bzip2", "bunzip2 -k"),
               (b"\xfd7zXZ\x00", "xz", "unxz -k"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
               (b"PK\x03\x04", "zip", "unzip"))


def _not_compressed(f, path: Path) -> None:
    head = f.peek(8)[:8]
    for magic, kind, tool in _COMPRESSED:
        if head.startswith(magic):
            raise SpecctlError(f"{path}: a {kind}-compressed file, not JSONL text: decompress "
                               f"it first ({tool} {path})")


def read_jsonl(path: Path, skip_bad: bool = False, limit: int | None = None, start: int = 0,
               source: str | None = None) -> FileRead:
    """One JSONL file read once: its prompt lines (the first `limit`), indexed from `start` (a
    shard's place in its directory); source: the shard's name for the records."""
    records: list[PromptRecord] = []
    own = False
    with open_once(path) as f:
        _not_compressed(f, path)
        try:
            for line_no, raw in _lines(f):
                if raw is not None and line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                if raw is not None and not raw.strip():
                    continue
                obj, bad = _decode(raw)
                past = limit is not None and len(records) >= limit
                rec = line_record(obj, start + len(records), line_no, path, skip_bad or past,
                                  source, bad)
                own = own or rec.sampling is not None
                if not past:
                    records.append(rec)
            sha = f.drain()
        except OSError as e:
            raise SpecctlError(f"{path}: cannot read prompt file: {e.strerror or e}") from None
    return FileRead(records, sha, own, f.regular)


class _Repeated(ValueError):
    """A JSON object's key given twice (its args: the key)."""


def _unique(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all distinct: `{"prompt": "a", "prompt": "b"}` is refused,
    not read as its last value (Python's json keeps the last, others the first: the line's
    writer and specctl could mean different prompts)."""
    d = dict(pairs)
    if len(d) < len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Repeated(k)
            seen.add(k)
    return d


def _decode(raw: bytes | None) -> tuple[object, str | None]:
    """A line's JSON value, or why it has none."""
    if raw is None:
        return None, f"line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MB"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        utf16 = raw.startswith((b"\xff\xfe", b"\xfe\xff"))   # (its byte order mark)
        return None, (f"not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})"
                      + ("; the file is UTF-16: convert it to UTF-8 (iconv -f UTF-16 -t "
                         "UTF-8)" if utf16 else ""))
    text = text.rstrip("\r\n")
    if text.startswith("\ufeff"):   # (json's own words: "decode using utf-8-sig")
        return None, ("starts with a byte order mark (U+FEFF): remove it (a file may begin "
                      "with one, no line may)")
    try:
        return json.loads(text, object_pairs_hook=_unique), None
    except _Repeated as e:
        return None, (f"the key {json.dumps(e.args[0])} appears twice in one object: which "
                      "value is meant is ambiguous (JSON parsers differ in which one they "
                      "keep); keep one")
    except json.JSONDecodeError as e:
        return None, (f"malformed JSON: {e.msg} (column {e.colno})"
                      + ("; its lines end in a carriage return alone (CR): JSON lines end in "
                         "a newline (tr '\\r' '\\n')"
                         if e.msg == "Extra data" and "\r" in text[:e.pos] else ""))
