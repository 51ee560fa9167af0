"""Reading a zip of text files into documents, treating its members as untrusted.

Member names that are absolute, contain `..`, a drive letter or a NUL are refused (counted);
members larger than the cap (`max_member_bytes`) decompressed are skipped, whatever their header
claims, so a zip bomb stops there; damaged or encrypted members are skipped (counted); nothing is
ever written to disk. Only `.txt` members are read; in the OANC layout only those under its data
folder (prep/cache/oanc.py).

Knows nothing of folders or of which inputs are read (prep/cache/corpus.py): it is handed one zip.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Iterator

from specctl.errors import SpecctlError
from specctl.prep.cache.files import READ_CHUNK, Documents, decode, is_text
from specctl.prep.cache.oanc import is_annotation, oanc_data_prefix
from specctl.prep.cache.stats import CorpusStats

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


def zip_text_bytes(p: Path, cap: int) -> int:
    """The decompressed size of the zip's text members within the cap (0 if unreadable)."""
    total = 0
    try:
        with zipfile.ZipFile(p) as z:
            total = sum(i.file_size for i in z.infolist()
                        if is_text(i.filename) and i.file_size <= cap)
    except (zipfile.BadZipFile, OSError):
        pass
    return total


def read_zip(docs: Documents, p: Path, cap: int) -> Iterator[tuple[str, str]]:
    """The zip's text members as documents; `cap`: the most bytes a member may decompress to."""
    try:
        z = zipfile.ZipFile(p)
    except zipfile.BadZipFile as e:
        raise SpecctlError(f"{p}: not a zip file ({e})") from None
    stats = docs.stats
    with z:
        infos = z.infolist()
        prefix = oanc_data_prefix([i.filename for i in infos
                                   if unsafe_member_name(i.filename) is None])
        for info in infos:
            name = info.filename
            why = unsafe_member_name(name)
            if why is not None:
                stats.refused_members += 1
                stats.problem(f"{p}:{name!r}", f"refused ({why})")
                continue
            if info.is_dir():
                continue
            if prefix and not name.replace("\\", "/").startswith(prefix):
                stats.outside_data += 1
                continue
            if is_annotation(name):
                stats.annotation_files += 1
                continue
            if not name.lower().endswith(".txt"):
                stats.other_files += 1
                continue
            where = f"{p}:{name}"
            if info.file_size > cap:
                stats.oversize_members += 1
                stats.problem(where, f"{info.file_size} bytes decompressed, over the "
                                     f"{cap >> 20} MiB cap; skipped")
                continue
            data = read_member(stats, z, info, where, cap)
            if data is None:
                continue
            stats.files += 1
            stats.bytes_read += len(data)
            docs.on_bytes(info.file_size)
            text, bad = decode(data)
            del data
            docs.note_bad(where, bad)
            yield from docs.split(where, text)


def read_member(stats: CorpusStats, z: zipfile.ZipFile, info: zipfile.ZipInfo, where: str,
                cap: int) -> bytes | None:
    """The member's bytes, at most `cap` (whatever its header claims); None if damaged or too
    large (counted)."""
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
                    stats.oversize_members += 1
                    stats.problem(where, f"more than {cap >> 20} MiB decompressed; skipped")
                    return None
            return b"".join(chunks)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
            NotImplementedError, RuntimeError) as e:
        # RuntimeError: encrypted member; NotImplementedError: unknown compression
        stats.damaged_members += 1
        stats.problem(where, f"unreadable member ({e}); skipped")
        return None
