"""Reading text corpora for `build-cache`, streaming: documents come one at a time, never the
whole corpus at once.

Accepted inputs (any mix, each a path):
- the OANC as shipped, `OANC_GrAF.zip`, read in place with zipfile (nothing is unpacked), or its
  unpacked tree `OANC-GrAF/data/{spoken,written_1,written_2}/<genre>/<source>/*.txt`: only the
  `.txt` files are read, the `.xml` / `.anc` annotation files beside them are skipped (counted).
  When a tree or zip has an `OANC-GrAF/data/` folder, only the files under it are read;
- any other zip or folder: every `.txt` file (also `.txt.gz` / `.txt.bz2` in folders),
  recursively, in sorted order;
- a single file: `.jsonl` (also `.jsonl.gz` / `.jsonl.bz2`): one JSON object per line with a
  string `text` field (bad lines are counted, skipped and reported); `.zip`: as above; `.gz` /
  `.bz2`: compressed text; anything else: plain text.

Text is decoded as `utf-8-sig` (a BOM is dropped); undecodable bytes become U+FFFD and are
counted (files with errors, bad bytes in all). Zip members are untrusted: names that are
absolute, contain `..`, a drive letter or a NUL are refused (counted), members larger than
`max_member_bytes` (64 MiB) decompressed are skipped (a zip bomb stops there), and nothing is
ever written to disk. A large file is cut into documents of about `doc_chars` characters at line
ends, so memory stays bounded; a document is the unit n-grams never cross.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import os
import re
import threading
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from specctl.errors import SpecctlError

MAX_MEMBER_BYTES = 64 << 20
DOC_CHARS = 1 << 20
READ_CHUNK = 1 << 20
TEXT_SUFFIXES = (".txt", ".txt.gz", ".txt.bz2")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.bz2")
ANNOTATION_SUFFIXES = (".xml", ".anc")
_EXAMPLES = 5

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


@dataclass
class CorpusStats:
    inputs: int = 0
    files: int = 0                  # text files / members / JSONL files read
    documents: int = 0
    empty_documents: int = 0
    words: int = 0                  # whitespace-separated
    chars: int = 0
    bytes_read: int = 0             # bytes of text before decoding (decompressed)
    annotation_files: int = 0       # .xml / .anc skipped
    other_files: int = 0            # neither text nor annotation, skipped
    outside_data: int = 0           # OANC files outside OANC-GrAF/data/, skipped
    links_outside: int = 0          # symbolic links to files outside the given folder, skipped
    refused_members: int = 0        # unsafe zip member names
    oversize_members: int = 0       # zip members over the size cap
    damaged_members: int = 0        # CRC / decompression errors
    files_with_bad_bytes: int = 0
    bad_bytes: int = 0
    jsonl_lines: int = 0
    bad_jsonl_lines: int = 0
    problems: list = field(default_factory=list)   # the first few, "where: what"

    def problem(self, where: str, what: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"{where}: {what}")

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{self.files} files", f"{self.documents} documents", f"{self.words:,} words"]
        if self.annotation_files:
            parts.append(f"{self.annotation_files} annotation files skipped")
        if self.other_files:
            parts.append(f"{self.other_files} other files skipped")
        if self.outside_data:
            parts.append(f"{self.outside_data} files outside OANC-GrAF/data skipped")
        if self.links_outside:
            parts.append(f"{self.links_outside} links to files outside the folder skipped")
        if self.refused_members:
            parts.append(f"{self.refused_members} unsafe zip members refused")
        if self.oversize_members:
            parts.append(f"{self.oversize_members} zip members over "
                         f"{MAX_MEMBER_BYTES >> 20} MiB skipped")
        if self.damaged_members:
            parts.append(f"{self.damaged_members} damaged zip members skipped")
        if self.bad_bytes:
            parts.append(f"{self.bad_bytes} undecodable bytes in {self.files_with_bad_bytes} "
                         "files (replaced)")
        if self.jsonl_lines:
            parts.append(f"{self.jsonl_lines} JSONL lines")
        if self.bad_jsonl_lines:
            parts.append(f"{self.bad_jsonl_lines} bad JSONL lines skipped")
        return ", ".join(parts)


def _lower_name(name: str) -> str:
    return name.lower()


def _is_text(name: str) -> bool:
    return _lower_name(name).endswith(TEXT_SUFFIXES)


def _is_annotation(name: str) -> bool:
    return _lower_name(name).endswith(ANNOTATION_SUFFIXES)


_DRIVE = re.compile(r"^[A-Za-z]:")


def unsafe_member_name(name: str) -> str | None:
    """Why a zip member name is unsafe (absolute, `..`, drive letter, NUL), or None."""
    if "\0" in name:
        return "NUL in name"
    if name.startswith(("/", "\\")):
        return "absolute path"
    if _DRIVE.match(name):
        return "drive letter"
    if any(part == ".." for part in re.split(r"[/\\]", name)):
        return "'..' in path"
    return None


def _oanc_data_prefix(names: list[str]) -> str | None:
    """'.../OANC-GrAF/data/' when the names have such a folder (the OANC layout), else None."""
    for n in names:
        m = re.match(r"^(.*?OANC-GrAF/data/)", n.replace("\\", "/"))
        if m:
            return m.group(1)
    return None


class CorpusReader:
    """Iterate over the documents of a list of inputs: `for name, text in reader: ...`.

    `stats` fills in while iterating. `total_bytes()` is the input size for a progress bar (text
    bytes; compressed files count their compressed size) and `on_bytes(n)` is called as input is
    consumed.
    """

    def __init__(self, paths: list[Path | str], *, max_member_bytes: int = MAX_MEMBER_BYTES,
                 doc_chars: int = DOC_CHARS, log: Callable[[str], None] = lambda m: None):
        if not paths:
            raise SpecctlError("no corpus given")
        self.paths = [Path(p).expanduser() for p in paths]
        for p in self.paths:
            if not p.exists():
                raise SpecctlError(f"{p}: no such file or folder")
        self.max_member_bytes = max_member_bytes
        self.doc_chars = doc_chars
        self.log = log
        self.stats = CorpusStats(inputs=len(self.paths))
        self.on_bytes: Callable[[int], None] = lambda n: None
        self._plan: list[tuple] | None = None

    # -- what will be read

    def plan(self) -> list[tuple]:
        """[(kind, path, extra)] in reading order; kind: 'zip', 'text', 'jsonl'. Counts the files
        skipped in folders (annotations, others)."""
        if self._plan is not None:
            return self._plan
        plan = []
        for p in self.paths:
            if p.is_dir():
                plan += self._plan_dir(p)
            elif _lower_name(p.name).endswith(".zip"):
                plan.append(("zip", p, None))
            elif _lower_name(p.name).endswith(JSONL_SUFFIXES):
                plan.append(("jsonl", p, None))
            else:
                plan.append(("text", p, None))
        self._plan = plan
        return plan

    def _plan_dir(self, root: Path) -> list[tuple]:
        """The folder's files, walked in sorted order; a link is followed only to a file inside
        the folder (a corpus folder must not read, say, ~/.ssh through a planted link)."""
        files, inside = [], root.resolve()
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for fn in sorted(filenames):
                f = Path(dirpath) / fn
                if f.is_symlink() and not f.resolve().is_relative_to(inside):
                    self.stats.links_outside += 1
                    continue
                files.append(f)
        rel = [f.relative_to(root).as_posix() for f in files]
        prefix = _oanc_data_prefix(rel)
        if prefix is None and root.name == "OANC-GrAF":
            prefix = "data/" if any(r.startswith("data/") for r in rel) else None
        if prefix is None and root.name == "data" and root.parent.name == "OANC-GrAF":
            prefix = ""
        out = []
        for f, r in zip(files, rel):
            if prefix and not r.startswith(prefix):
                self.stats.outside_data += 1
            elif _is_text(f.name):
                out.append(("text", f, None))
            elif _is_annotation(f.name):
                self.stats.annotation_files += 1
            else:
                self.stats.other_files += 1
        return out

    def total_bytes(self) -> int:
        total = 0
        for kind, p, _ in self.plan():
            if kind == "zip":
                try:
                    with zipfile.ZipFile(p) as z:
                        total += sum(i.file_size for i in z.infolist()
                                     if _is_text(i.filename) and i.file_size <= self.max_member_bytes)
                except (zipfile.BadZipFile, OSError):
                    pass
            else:
                try:
                    total += p.stat().st_size
                except OSError:
                    pass
        return total

    # -- reading

    def __iter__(self) -> Iterator[tuple[str, str]]:
        plan = self.plan()
        if not plan:
            where = ", ".join(str(p) for p in self.paths)
            raise SpecctlError(f"{where}: no .txt files found (a corpus is text files, a zip of "
                               "them, or JSONL with a 'text' field)")
        for kind, p, _ in plan:
            if kind == "zip":
                yield from self._read_zip(p)
            elif kind == "jsonl":
                yield from self._read_jsonl(p)
            else:
                yield from self._read_text_file(p)

    def _emit(self, name: str, text: str) -> Iterator[tuple[str, str]]:
        self.stats.chars += len(text)
        words = len(text.split())
        if words == 0:
            self.stats.empty_documents += 1
            return
        self.stats.words += words
        self.stats.documents += 1
        yield name, text

    def _split(self, name: str, text: str) -> Iterator[tuple[str, str]]:
        """Cut a long text at line ends into pieces of about doc_chars characters."""
        start, part = 0, 0
        while len(text) - start > self.doc_chars:
            cut = text.rfind("\n", start, start + self.doc_chars)
            cut = start + self.doc_chars if cut < 0 else cut + 1
            yield from self._emit(f"{name}#{part}", text[start:cut])
            start, part = cut, part + 1
        yield from self._emit(name if part == 0 else f"{name}#{part}", text[start:])

    def _open_text(self, p: Path):
        n = _lower_name(p.name)
        if n.endswith(".gz"):
            return gzip.open(p, "rb")
        if n.endswith(".bz2"):
            return bz2.open(p, "rb")
        return open(p, "rb")

    def _read_text_file(self, p: Path) -> Iterator[tuple[str, str]]:
        """Stream a (maybe compressed) text file: decode incrementally, cut at line ends."""
        compressed = _lower_name(p.name).endswith((".gz", ".bz2"))
        dec = codecs.getincrementaldecoder("utf-8-sig")(errors=_HANDLER)
        _take_bad()
        bad, buf, part = 0, "", 0
        self.stats.files += 1
        try:
            with self._open_text(p) as f:
                while True:
                    chunk = f.read(READ_CHUNK)
                    final = not chunk
                    buf += dec.decode(chunk, final=final)
                    bad += _take_bad()
                    self.stats.bytes_read += len(chunk)
                    if not compressed:
                        self.on_bytes(len(chunk))
                    while len(buf) > self.doc_chars:
                        cut = buf.rfind("\n", 0, self.doc_chars)
                        cut = self.doc_chars if cut < 0 else cut + 1
                        yield from self._emit(f"{p}#{part}", buf[:cut])
                        buf, part = buf[cut:], part + 1
                    if final:
                        break
        except (OSError, EOFError, ValueError) as e:   # gzip/bz2 errors are OSError/EOFError
            if not compressed and isinstance(e, OSError):
                raise SpecctlError(f"{p}: cannot read ({e})") from None
            self.stats.problem(str(p), f"damaged compressed file ({e}); read up to the damage")
        if compressed:
            try:
                self.on_bytes(p.stat().st_size)
            except OSError:
                pass
        yield from self._emit(str(p) if part == 0 else f"{p}#{part}", buf)
        self._note_bad(str(p), bad)

    def _note_bad(self, where: str, bad: int) -> None:
        if bad:
            self.stats.files_with_bad_bytes += 1
            self.stats.bad_bytes += bad
            self.stats.problem(where, f"{bad} undecodable bytes replaced (not UTF-8)")

    def _read_zip(self, p: Path) -> Iterator[tuple[str, str]]:
        try:
            z = zipfile.ZipFile(p)
        except zipfile.BadZipFile as e:
            raise SpecctlError(f"{p}: not a zip file ({e})") from None
        with z:
            infos = z.infolist()
            prefix = _oanc_data_prefix([i.filename for i in infos
                                        if unsafe_member_name(i.filename) is None])
            for info in infos:
                name = info.filename
                why = unsafe_member_name(name)
                if why is not None:
                    self.stats.refused_members += 1
                    self.stats.problem(f"{p}:{name!r}", f"refused ({why})")
                    continue
                if info.is_dir():
                    continue
                if prefix and not name.replace("\\", "/").startswith(prefix):
                    self.stats.outside_data += 1
                    continue
                if _is_annotation(name):
                    self.stats.annotation_files += 1
                    continue
                if not _lower_name(name).endswith(".txt"):
                    self.stats.other_files += 1
                    continue
                where = f"{p}:{name}"
                if info.file_size > self.max_member_bytes:
                    self.stats.oversize_members += 1
                    self.stats.problem(where, f"{info.file_size} bytes decompressed, over the "
                                              f"{self.max_member_bytes >> 20} MiB cap; skipped")
                    continue
                data = self._read_member(z, info, where)
                if data is None:
                    continue
                self.stats.files += 1
                self.stats.bytes_read += len(data)
                self.on_bytes(info.file_size)
                text, bad = decode(data)
                del data
                self._note_bad(where, bad)
                yield from self._split(where, text)

    def _read_member(self, z: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> bytes | None:
        """The member's bytes, at most max_member_bytes (whatever its header claims); None if
        damaged or too large."""
        cap = self.max_member_bytes
        try:
            with z.open(info) as f:
                chunks, size = [], 0
                while True:
                    c = f.read(min(READ_CHUNK, cap + 1 - size))
                    if not c:
                        break
                    chunks.append(c)
                    size += len(c)
                    if size > cap:
                        self.stats.oversize_members += 1
                        self.stats.problem(where, f"more than {cap >> 20} MiB decompressed; skipped")
                        return None
                return b"".join(chunks)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
                NotImplementedError, RuntimeError) as e:
            # RuntimeError: encrypted member; NotImplementedError: unknown compression
            self.stats.damaged_members += 1
            self.stats.problem(where, f"unreadable member ({e}); skipped")
            return None

    def _read_jsonl(self, p: Path) -> Iterator[tuple[str, str]]:
        self.stats.files += 1
        compressed = _lower_name(p.name).endswith((".gz", ".bz2"))
        bad_bytes = 0
        try:
            with self._open_text(p) as f:
                for lineno, raw in enumerate(f, 1):
                    self.stats.bytes_read += len(raw)
                    if not compressed:
                        self.on_bytes(len(raw))
                    if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                        raw = raw[len(codecs.BOM_UTF8):]
                    line, bad = decode(raw)
                    bad_bytes += bad
                    if not line.strip():
                        continue
                    self.stats.jsonl_lines += 1
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        self._bad_line(p, lineno, f"not valid JSON ({e.msg})")
                        continue
                    if not isinstance(obj, dict):
                        self._bad_line(p, lineno, "not a JSON object")
                        continue
                    text = obj.get("text")
                    if not isinstance(text, str):
                        self._bad_line(p, lineno, "no string 'text' field")
                        continue
                    yield from self._split(f"{p}:{lineno}", text)
        except (EOFError, ValueError) as e:
            self.stats.problem(str(p), f"damaged compressed file ({e}); read up to the damage")
        except OSError as e:
            if not compressed:
                raise SpecctlError(f"{p}: cannot read ({e})") from None
            self.stats.problem(str(p), f"damaged compressed file ({e}); read up to the damage")
        if compressed:
            self.on_bytes(p.stat().st_size)
        self._note_bad(str(p), bad_bytes)

    def _bad_line(self, p: Path, lineno: int, what: str) -> None:
        self.stats.bad_jsonl_lines += 1
        self.stats.problem(f"{p}:{lineno}", what)


def read_corpus(paths: list[Path | str], **kw) -> tuple[Iterator[tuple[str, str]], CorpusStats]:
    """(documents, stats): a lazy iterator of (name, text) and the stats it fills in."""
    r = CorpusReader(paths, **kw)
    return iter(r), r.stats
