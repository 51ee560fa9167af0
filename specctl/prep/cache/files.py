"""Reading single files into documents: plain or compressed (`.gz` / `.bz2`) text, and JSONL
with a string `text` field, streamed (a file is never held whole).

Text is decoded as `utf-8-sig` (a BOM is dropped); undecodable bytes become U+FFFD and are
counted (`decode`, and the same codec error handler for streamed files). `Documents` is where
read text becomes documents: a long text is cut at line ends into pieces of about `doc_chars`
characters, empty ones are counted and dropped, and `CorpusStats` is filled in as it goes.

Knows nothing of folders, zips or the OANC (prep/cache/corpus.py, prep/cache/zips.py,
prep/cache/oanc.py): it is handed one path at a time.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import threading
from pathlib import Path
from typing import Callable, Iterator

from specctl.errors import SpecctlError
from specctl.prep.cache.stats import CorpusStats

DOC_CHARS = 1 << 20
READ_CHUNK = 1 << 20
TEXT_SUFFIXES = (".txt", ".txt.gz", ".txt.bz2")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.bz2")

# ---------------------------------------------------------------------------------------------
# counting undecodable bytes: a codec error handler that replaces and counts (per thread)

_bad = threading.local()


def _count_and_replace(e: UnicodeDecodeError):
    _bad.n = getattr(_bad, "n", 0) + (e.end - e.start)
    return "\ufffd", e.end


_HANDLER = "specctl-count-replace"
codecs.register_error(_HANDLER, _count_and_replace)


def _take_bad() -> int:
    n = getattr(_bad, "n", 0)
    _bad.n = 0
    return n


def decode(data: bytes) -> tuple[str, int]:
    """`data` as utf-8-sig text and the number of undecodable bytes (replaced by U+FFFD)."""
    _take_bad()
    text = data.decode("utf-8-sig", errors=_HANDLER)
    return text, _take_bad()


# ---------------------------------------------------------------------------------------------


def is_text(name: str) -> bool:
    return name.lower().endswith(TEXT_SUFFIXES)


def open_text(p: Path):
    n = p.name.lower()
    if n.endswith(".gz"):
        return gzip.open(p, "rb")
    if n.endswith(".bz2"):
        return bz2.open(p, "rb")
    return open(p, "rb")


class Documents:
    """The documents of a read: `emit` counts a text and yields it unless it has no words,
    `split` cuts a long text first. `on_bytes(n)` is told as input is consumed."""

    def __init__(self, stats: CorpusStats, doc_chars: int, on_bytes: Callable[[int], None]):
        self.stats, self.doc_chars, self.on_bytes = stats, doc_chars, on_bytes

    def emit(self, name: str, text: str) -> Iterator[tuple[str, str]]:
        self.stats.chars += len(text)
        words = len(text.split())
        if words == 0:
            self.stats.empty_documents += 1
            return
        self.stats.words += words
        self.stats.documents += 1
        yield name, text

    def split(self, name: str, text: str) -> Iterator[tuple[str, str]]:
        """Cut a long text at line ends into pieces of about doc_chars characters."""
        start, part = 0, 0
        while len(text) - start > self.doc_chars:
            cut = text.rfind("\n", start, start + self.doc_chars)
            cut = start + self.doc_chars if cut < 0 else cut + 1
            yield from self.emit(f"{name}#{part}", text[start:cut])
            start, part = cut, part + 1
        yield from self.emit(name if part == 0 else f"{name}#{part}", text[start:])

    def note_bad(self, where: str, bad: int) -> None:
        if bad:
            self.stats.files_with_bad_bytes += 1
            self.stats.bad_bytes += bad
            self.stats.problem(where, f"{bad} undecodable bytes replaced (not UTF-8)")

    def bad_line(self, p: Path, lineno: int, what: str) -> None:
        self.stats.bad_jsonl_lines += 1
        self.stats.problem(f"{p}:{lineno}", what)


def read_text_file(docs: Documents, p: Path) -> Iterator[tuple[str, str]]:
    """Stream a (maybe compressed) text file: decode incrementally, cut at line ends."""
    compressed = p.name.lower().endswith((".gz", ".bz2"))
    dec = codecs.getincrementaldecoder("utf-8-sig")(errors=_HANDLER)
    _take_bad()
    bad, buf, part = 0, "", 0
    docs.stats.files += 1
    try:
        with open_text(p) as f:
            while True:
                chunk = f.read(READ_CHUNK)
                final = not chunk
                buf += dec.decode(chunk, final=final)
                bad += _take_bad()
                docs.stats.bytes_read += len(chunk)
                if not compressed:
                    docs.on_bytes(len(chunk))
                while len(buf) > docs.doc_chars:
                    cut = buf.rfind("\n", 0, docs.doc_chars)
                    cut = docs.doc_chars if cut < 0 else cut + 1
                    yield from docs.emit(f"{p}#{part}", buf[:cut])
                    buf, part = buf[cut:], part + 1
                if final:
                    break
    except (OSError, EOFError, ValueError) as e:   # gzip/bz2 errors are OSError/EOFError
        if not compressed and isinstance(e, OSError):
            raise SpecctlError(f"{p}: cannot read ({e})") from None
        docs.stats.problem(str(p), f"damaged compressed file ({e}); read up to the damage")
    if compressed:
        try:
            docs.on_bytes(p.stat().st_size)
        except OSError:
            pass
    yield from docs.emit(str(p) if part == 0 else f"{p}#{part}", buf)
    docs.note_bad(str(p), bad)


def read_jsonl(docs: Documents, p: Path) -> Iterator[tuple[str, str]]:
    """One document (cut if long) per line's string `text` field; other lines are counted."""
    docs.stats.files += 1
    compressed = p.name.lower().endswith((".gz", ".bz2"))
    bad_bytes = 0
    try:
        with open_text(p) as f:
            for lineno, raw in enumerate(f, 1):
                docs.stats.bytes_read += len(raw)
                if not compressed:
                    docs.on_bytes(len(raw))
                if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8):]
                line, bad = decode(raw)
                bad_bytes += bad
                if not line.strip():
                    continue
                docs.stats.jsonl_lines += 1
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    docs.bad_line(p, lineno, f"not valid JSON ({e.msg})")
                    continue
                if not isinstance(obj, dict):
                    docs.bad_line(p, lineno, "not a JSON object")
                    continue
                text = obj.get("text")
                if not isinstance(text, str):
                    docs.bad_line(p, lineno, "no string 'text' field")
                    continue
                yield from docs.split(f"{p}:{lineno}", text)
    except (EOFError, ValueError) as e:
        docs.stats.problem(str(p), f"damaged compressed file ({e}); read up to the damage")
    except OSError as e:
        if not compressed:
            raise SpecctlError(f"{p}: cannot read ({e})") from None
        docs.stats.problem(str(p), f"damaged compressed file ({e}); read up to the damage")
    if compressed:
        docs.on_bytes(p.stat().st_size)
    docs.note_bad(str(p), bad_bytes)

