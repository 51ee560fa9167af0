"""Prompt inputs beyond one JSONL file: a Parquet file, and a directory of shards.

A Parquet row is read as a JSONL line is: one object whose columns are the line's keys,
checked by the same schema (io/prompts.py), once what Parquet writers do to a row is undone
(_no_nulls), once its pages are checked against their checksums where the writer stored
them (Spark does, by default: a damaged page is an error, never a row read as sound) and its
column names found unique (two columns of one name would leave one unread). A null is an absent key: Parquet has no other way to leave a column out of a
row, so a file may mix formats ("prompt" in some rows, "messages" in others) as a JSONL file
does. Row numbers (1-based) stand for line numbers in messages.

A directory is read as its shards, one after another in name order: every *.jsonl, *.ndjson,
*.json (Spark writes JSON lines so) and *.parquet file directly in it, compressed ones
included so that they are named as such rather than skipped; names starting with "." or "_"
(Spark's _SUCCESS, .crc files) and subdirectories are not read. A record's index runs over
the whole input, so outputs, resume and sampled draws key on its place in the whole input;
its line number is its line in its shard, and messages name the shard. The input's hash
(what --resume matches) covers every shard's name and contents, in order, from the one
listing and the one read of each shard (io/lines.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.lines import FileRead, open_once, read_jsonl
from specctl.io.prompts import SAMPLING, UNSUPPORTED, PromptRecord, line_record

PARQUET = (".parquet", ".pq")
JSONL = (".jsonl", ".ndjson", ".json")
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")   # (a shard so named is refused by name)
ROWS_PER_BATCH = 1024   # Parquet rows converted to Python at a time
# the columns the line schema reads (io/prompts.py): no other column is converted to Python
FORMATS = ("prompt", "messages", "turns", "body")   # (one of them makes a row a prompt)
COLUMNS = FORMATS + ("custom_id", "question_id", "id", "category", "max_tokens",
                     "max_completion_tokens", "sampling",
                     # (read to be refused: a row's own temperature column ran greedy, unread)
                     *SAMPLING, *UNSUPPORTED)


@dataclass(frozen=True)
class PromptInput:
    """An input as read, once: its records (the first `limit`); its sha256 (what --resume
    matches it by: a file's bytes, or a directory's shard names and their hashes in order);
    whether any line (past `limit` too) carries settings of its own; and whether it was
    read from regular files (a pipe can be read by one process only)."""
    records: list[PromptRecord]
    sha256: str
    own_settings: bool
    regular: bool


def read_input(path: Path, skip_bad: bool = False, limit: int | None = None) -> PromptInput:
    """A JSONL file, a Parquet file or a directory of such shards, each file read once."""
    path = Path(path)
    if not path.is_dir():
        read = read_parquet if path.suffix.lower() in PARQUET else read_jsonl
        got = read(path, skip_bad, limit)
        out = PromptInput(got.records, got.sha256, got.own_settings, got.regular)
    else:
        out = _read_dir(path, skip_bad, limit)
    if not out.records:
        raise SpecctlError(f"no prompts in {path}")
    return out


def _read_dir(path: Path, skip_bad: bool, limit: int | None) -> PromptInput:
    """Every shard of a directory read (past `limit` too: the input's hash covers them)."""
    records: list[PromptRecord] = []
    h, own, regular = hashlib.sha256(), False, True
    for shard in shard_files(path):
        left = None if limit is None else max(0, limit - len(records))
        read = read_parquet if shard.suffix.lower() in PARQUET else read_jsonl
        got = read(shard, skip_bad, left, len(records), str(shard))
        records += got.records
        own, regular = own or got.own_settings, regular and got.regular
        h.update(f"{shard.name}\0{got.sha256}\n".encode())
    return PromptInput(records, h.hexdigest(), own, regular)


def shard_files(path: Path) -> list[Path]:
    """A directory's shards, in name order."""
    try:
        files = sorted(p for p in path.iterdir() if _is_shard(p))
    except OSError as e:
        raise SpecctlError(f"{path}: cannot list the directory: {e.strerror or e}") from None
    if not files:
        raise SpecctlError(f"{path}: a directory with no prompt shards (*.jsonl, *.ndjson, "
                           "*.json or *.parquet files directly in it)")
    return files


def not_read(path: Path) -> list[str]:
    """The files of a directory input that are not read, though not named as skipped (by "."
    or "_"): a user may expect them read (a CSV, a text file)."""
    return sorted(p.name for p in path.iterdir() if not _is_shard(p) and not p.is_dir()
                  and not p.name.startswith((".", "_")))


def _is_shard(p: Path) -> bool:
    """A shard's name: a broken link counts (its read says so) rather than dropping lines."""
    suffixes = [x.lower() for x in p.suffixes[-2:]]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes.pop()
    return not p.name.startswith((".", "_")) and not p.is_dir() and bool(suffixes) \
        and suffixes[-1] in PARQUET + JSONL


def read_parquet(path: Path, skip_bad: bool = False, limit: int | None = None, start: int = 0,
                 source: str | None = None) -> FileRead:
    """One Parquet file read once: its prompt rows (the first `limit`), indexed from `start`."""
    data, sha, regular = _parquet_bytes(path)
    f = _open_parquet(path, data)
    names = f.schema_arrow.names
    twice = next((c for i, c in enumerate(names) if c in names[:i]), None)
    if twice is not None:
        raise SpecctlError(f"{path}: two columns are named {twice!r}: which one holds the "
                           "prompts is ambiguous; rename or drop one")
    records: list[PromptRecord] = []
    row, own = 0, False
    columns = [c for c in names if c in COLUMNS]
    if not skip_bad and f.metadata.num_rows and not set(columns) & set(FORMATS):
        raise SpecctlError(f"{path}: no prompt column ({', '.join(FORMATS)}); its columns: "
                           + ", ".join(names[:12]))
    try:
        for batch in f.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns):
            rows = batch.to_pylist() if columns else [{}] * batch.num_rows
            for obj in rows:
                row += 1
                past = limit is not None and len(records) >= limit
                rec = line_record(_no_nulls(obj), start + len(records), row, path,
                                  skip_bad or past, source)
                own = own or rec.sampling is not None
                if not past:
                    records.append(rec)
    except SpecctlError:
        raise
    except Exception as e:   # (a damaged page, a checksum that fails, a value Arrow cannot
        raise SpecctlError(f"{path}: cannot read the rows after row {row}: "   # turn into Python)
                           f"{_first_line(e)}") from None
    return FileRead(records, sha, own, regular)


def _parquet_bytes(path: Path):
    """(the file's bytes, their sha256, whether it is a regular file), read once: a regular
    file mapped (nothing copied), anything else read whole (io/lines.py open_once)."""
    _parquet()
    import pyarrow as pa
    with open_once(path) as f:
        if f.regular:
            try:
                data = pa.memory_map(str(path)).read_buffer()
            except Exception as e:   # (pyarrow's OSError for what cannot be mapped)
                raise SpecctlError(f"{path}: cannot read prompt file: {_first_line(e)}") from None
        else:
            data = pa.py_buffer(f.read())
    return data, hashlib.sha256(memoryview(data)).hexdigest(), f.regular


def _open_parquet(path: Path, data):
    import pyarrow as pa
    pq = _parquet()
    try:
        return pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
    except Exception as e:   # (pyarrow's ArrowInvalid / OSError for a file that is not one)
        head = bytes(memoryview(data)[:64]).lstrip()
        like_json = "; it starts as JSON text: a JSONL file is named .jsonl" \
            if head[:1] in (b"{", b"[") else ""
        raise SpecctlError(f"{path}: not a readable Parquet file ({_first_line(e)})"
                           + like_json) from None


def _no_nulls(v):
    """A row with its null fields left out, at every depth of objects, and an object whose
    every field is null left out too (Arrow gives a struct column's null row so); a list keeps
    its nulls: the schema says what is wrong with them. A whole float is an integer: pandas
    stores an integer column with missing values as floats (the schema's numbers take ints)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        kept = {k: _no_nulls(x) for k, x in v.items() if x is not None}
        return {k: x for k, x in kept.items() if not (isinstance(x, dict) and not x
                                                      and isinstance(v[k], dict) and v[k])}
    if isinstance(v, list):
        return [_no_nulls(x) for x in v]
    return v


def _parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:   # (datasets brings pyarrow; a bare install may lack it)
        raise SpecctlError("reading Parquet needs pyarrow: pip install pyarrow") from None
    return pq


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
