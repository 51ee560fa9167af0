"""Prompt inputs beyond one JSONL file: a Parquet file, and a directory of shards.

A Parquet row is read as a JSONL line is: one object whose columns are the line's keys,
checked by the same schema (io/prompts.py), once what Parquet writers do to a row is undone
(_no_nulls). A null is an absent key: Parquet has no other way to leave a column out of a
row, so a file may mix formats ("prompt" in some rows, "messages" in others) as a JSONL file
does. Row numbers (1-based) stand for line numbers in messages.

A directory is read as its shards, one after another in name order: every *.jsonl, *.ndjson,
*.json (Spark writes JSON lines so) and *.parquet file directly in it, compressed ones
included so that they are named as such rather than skipped; names starting with "." or "_"
(Spark's _SUCCESS, .crc files) and subdirectories are not read. A record's index runs over
the whole input, so outputs, resume and sampled draws key on its place in the whole input;
its line number is its line in its shard, and messages name the shard. The input's hash
(what --resume matches) covers every shard's name and contents, in order.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, line_record, read_jsonl
from specctl.store import file_sha256

PARQUET = (".parquet", ".pq")
JSONL = (".jsonl", ".ndjson", ".json")
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")   # (a shard so named is refused by name)
ROWS_PER_BATCH = 1024   # Parquet rows converted to Python at a time
# the columns the line schema reads (io/prompts.py): no other column is converted to Python
FORMATS = ("prompt", "messages", "turns", "body")   # (one of them makes a row a prompt)
COLUMNS = FORMATS + ("custom_id", "question_id", "id", "category", "max_tokens",
                     "max_completion_tokens", "sampling")


def read_shards(path: Path, skip_bad: bool, limit: int | None) -> list[PromptRecord]:
    """The records of a Parquet file or of a directory of shards (the first `limit`)."""
    if not path.is_dir():
        return read_parquet(path, skip_bad, limit)
    records: list[PromptRecord] = []
    for shard in shard_files(path):
        left = None if limit is None else limit - len(records)
        if left is not None and left <= 0:
            break
        read = read_parquet if shard.suffix.lower() in PARQUET else read_jsonl
        records += read(shard, skip_bad, left, len(records), str(shard))
    return records


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
                 source: str | None = None) -> list[PromptRecord]:
    """The prompt rows of one Parquet file, indexed from `start`."""
    pq = _parquet()
    try:
        f = pq.ParquetFile(path)
    except FileNotFoundError:
        raise SpecctlError(f"{path}: prompt file not found") from None
    except Exception as e:   # (pyarrow's ArrowInvalid / OSError for a file that is not one)
        raise SpecctlError(f"{path}: not a readable Parquet file ({_first_line(e)})"
                           + _looks_like_json(path)) from None
    records: list[PromptRecord] = []
    row = 0
    columns = [c for c in f.schema_arrow.names if c in COLUMNS]
    if not skip_bad and f.metadata.num_rows and not set(columns) & set(FORMATS):
        raise SpecctlError(f"{path}: no prompt column ({', '.join(FORMATS)}); its columns: "
                           + ", ".join(f.schema_arrow.names[:12]))
    try:
        for batch in f.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns):
            rows = batch.to_pylist() if columns else [{}] * batch.num_rows
            for obj in rows:
                if limit is not None and len(records) >= limit:
                    return records
                row += 1
                records.append(line_record(_no_nulls(obj), start + len(records), row, path,
                                           skip_bad, source))
    except SpecctlError:
        raise
    except Exception as e:   # (a damaged page, a value Arrow cannot turn into Python)
        raise SpecctlError(f"{path}: cannot read the rows after row {row}: "
                           f"{_first_line(e)}") from None
    return records


def input_sha256(path: Path) -> str:
    """What --resume matches an input by: a file's sha256, or for a directory the sha256 of
    its shards' names and hashes in order."""
    if not path.is_dir():
        return file_sha256(path)
    h = hashlib.sha256()
    for shard in shard_files(path):
        h.update(f"{shard.name}\0{file_sha256(shard)}\n".encode())
    return h.hexdigest()


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


def _looks_like_json(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return ""
    return "; it starts as JSON text: a JSONL file is named .jsonl" if head[:1] in (b"{", b"[") \
        else ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
