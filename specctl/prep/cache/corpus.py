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

This module decides what is read (`CorpusReader.plan`: each input's kind, folders walked, links
checked) and iterates over it. How each kind is read is prep/cache/files.py (text, JSONL) and
prep/cache/zips.py (zips), the OANC's layout prep/cache/oanc.py, the counters
prep/cache/stats.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

from specctl.errors import SpecctlError
from specctl.prep.cache.files import (DOC_CHARS, JSONL_SUFFIXES, Documents, is_text, read_jsonl,
                                       read_text_file)
from specctl.prep.cache.oanc import folder_data_prefix, is_annotation
from specctl.prep.cache.stats import MAX_MEMBER_BYTES, CorpusStats
from specctl.prep.cache.zips import read_zip, zip_text_bytes


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
            elif p.name.lower().endswith(".zip"):
                plan.append(("zip", p, None))
            elif p.name.lower().endswith(JSONL_SUFFIXES):
                plan.append(("jsonl", p, None))
            else:
                plan.append(("text", p, None))
        self._plan = self._once(plan)
        return self._plan

    def _once(self, plan: list[tuple]) -> list[tuple]:
        """Each file read once: one given twice (`a.txt ./a.txt`), or given beside a folder
        whose walk reads it, is said and read the first time only (counted twice, its n-grams
        passed --min-count at half their occurrences). A file the walk skips is not one."""
        seen, out, again = set(), [], []
        for entry in plan:
            key = entry[1].resolve()
            if key in seen:
                again.append(str(entry[1]))
            else:
                seen.add(key)
                out.append(entry)
        if again:   # (one line: a folder given twice repeats its every file)
            self.log(f"{len(again)} file{'s' * (len(again) > 1)} given more than once (or inside "
                     f"a folder given too), read once: {', '.join(again[:3])}"
                     + (", ..." if len(again) > 3 else ""))
        return out

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
        prefix = folder_data_prefix(root, rel)
        out = []
        for f, r in zip(files, rel):
            if prefix and not r.startswith(prefix):
                self.stats.outside_data += 1
            elif is_text(f.name):
                out.append(("text", f, None))
            elif is_annotation(f.name):
                self.stats.annotation_files += 1
            else:
                self.stats.other_files += 1
        return out

    def total_bytes(self) -> int:
        total = 0
        for kind, p, _ in self.plan():
            if kind == "zip":
                total += zip_text_bytes(p, self.max_member_bytes)
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
        # on_bytes is looked up at each call, so a progress bar may be attached at any time
        docs = Documents(self.stats, self.doc_chars, lambda n: self.on_bytes(n))
        for kind, p, _ in plan:
            if kind == "zip":
                yield from read_zip(docs, p, self.max_member_bytes)
            elif kind == "jsonl":
                yield from read_jsonl(docs, p)
            else:
                yield from read_text_file(docs, p)


def read_corpus(paths: list[Path | str], **kw) -> tuple[Iterator[tuple[str, str]], CorpusStats]:
    """(documents, stats): a lazy iterator of (name, text) and the stats it fills in."""
    r = CorpusReader(paths, **kw)
    return iter(r), r.stats
