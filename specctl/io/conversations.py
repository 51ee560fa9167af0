"""Conversations for training (train-adapter):

    convs, report = read_conversations("sharegpt.json")    # or .jsonl, or a HF dataset name

normalizes every record to `Conversation.messages` = [system?] user, assistant, ..., assistant
(roles mapped, empty turns dropped, same-role runs merged, leading assistant / trailing user
turns dropped) and counts what it skipped and why in a `ReadReport`. A JSON array is streamed
record by record (`JsonArrayReader`), so the 125 MB cut-off ShareGPT file is read up to its cut
with a warning (or refused with `strict=True`); `io.sharegpt.download_sharegpt_json` fetches
that file.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from specctl.errors import SpecctlError
from specctl.io.sharegpt import JsonArrayReader
from specctl.reporting import quiet

_ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "assistant": "assistant", "model": "assistant",
    "system": "system", "developer": "system",
}
_TURN_LISTS = ("conversations", "conversation", "messages", "items")
_PATH_SUFFIXES = {".json", ".jsonl", ".ndjson", ".gz", ".txt"}


@dataclass
class Conversation:
    """One training conversation. `messages` are {"role", "content"} dicts: an optional system
    message first, then user and assistant alternating, starting with user and ending with
    assistant. Contents are non-empty and stripped."""
    id: str | None
    messages: list[dict]


@dataclass
class ReadReport:
    """What `read_conversations` saw. records = kept + sum(skipped.values())."""
    records: int = 0                                        # records seen (decoded or malformed)
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> count
    truncated_at: str | None = None   # where a damaged file stopped being readable, e.g.
    #                                   "byte 123456 (record 17601)"; None if read to its end
    duplicate_ids: int = 0            # kept conversations whose id an earlier one already had

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def summary(self) -> str:
        text = f"{self.records} records, {self.kept} kept"
        if self.skipped:
            text += "; skipped: " + ", ".join(f"{n} {r}" for r, n in
                                              sorted(self.skipped.items(), key=lambda x: -x[1]))
        if self.duplicate_ids:
            text += f"; {self.duplicate_ids} duplicate ids kept"
        if self.truncated_at:
            text += f"; unreadable from {self.truncated_at}"
        return text


class _Malformed:
    """Stands in for a record that could not be decoded (a bad JSONL line)."""


_MALFORMED = _Malformed()


def read_conversations(source: str | Path, strict: bool = False, limit: int | None = None,
                       log: Callable[[str], None] = quiet) -> tuple[list[Conversation], ReadReport]:
    """Read training conversations from a ShareGPT-style `.json` array, a JSON Lines file (one
    record per line; `.gz` works too) or, when `source` is not an existing path, a Hugging Face
    dataset name (its "train" split, via `datasets`).

    Records: {"id", "conversations": [{"from", "value"}]} (roles human/user, gpt/chatgpt/bing/
    bard/assistant/model, system) or {"messages": [{"role", "content"}]}; `items` or
    `conversation` may hold the turns too. Records that cannot become a conversation are skipped
    and counted by reason in the report (see `to_conversation`). A JSON array cut off or broken
    part way is read up to the damage with a warning through `log`; a malformed JSONL line is
    skipped. With `strict=True` either raises SpecctlError instead. `limit`: stop after that many
    kept conversations.
    """
    report = ReadReport()
    convs: list[Conversation] = []
    if limit is not None and limit < 1:
        return convs, report
    path = _local_path(source)
    if path is None:
        records = _dataset_records(str(source))
    else:
        records = _file_records(path, strict, report, log)
    seen_ids: set[str] = set()
    with closing(records):
        for rec in records:
            report.records += 1
            if rec is _MALFORMED:
                report.skip("malformed line")
                continue
            conv, reason = to_conversation(rec)
            if conv is None:
                report.skip(reason)
                continue
            if conv.id is not None:
                if conv.id in seen_ids:
                    report.duplicate_ids += 1
                else:
                    seen_ids.add(conv.id)
            convs.append(conv)
            report.kept += 1
            if limit is not None and report.kept >= limit:
                break
    return convs, report


def to_conversation(rec: object) -> tuple[Conversation | None, str | None]:
    """(conversation, None) for a usable record, else (None, why it is skipped):
    "not a conversation" (not an object, or no list of turns), "bad turn" (a turn that is not an
    object, or whose role or text is missing or not a string), "unknown role", "empty" (no
    non-empty turn), "no assistant turn" (nothing left to learn from after normalizing)."""
    if not isinstance(rec, dict):
        return None, "not a conversation"
    turns = next((rec[k] for k in _TURN_LISTS if k in rec), None)
    if not isinstance(turns, list):
        return None, "not a conversation"
    msgs: list[tuple[str, str]] = []
    for t in turns:
        if not isinstance(t, dict):
            return None, "bad turn"
        role = t["from"] if "from" in t else t.get("role")
        text = t["value"] if "value" in t else t.get("content")
        if not isinstance(role, str):
            return None, "bad turn"
        role = _ROLE_MAP.get(role.strip().lower())
        if role is None:
            return None, "unknown role"
        text = _text(text)
        if text is None:
            return None, "bad turn"
        text = text.strip()
        if text:
            msgs.append((role, text))
    if not msgs:
        return None, "empty"
    merged: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(msgs) and msgs[i][0] == "system":     # a system prompt only at the start
        i += 1
    if i:
        merged.append(("system", [m[1] for m in msgs[:i]]))
    started = False
    for role, text in msgs[i:]:
        if role == "system" or (role == "assistant" and not started):
            continue           # a later system turn; the assistant before the first user turn
        started = True
        if merged and merged[-1][0] == role:
            merged[-1][1].append(text)
        else:
            merged.append((role, [text]))
    if merged and merged[-1][0] == "user":
        merged.pop()           # nothing answers the last user turn
    if not merged or merged[-1][0] != "assistant":
        return None, "no assistant turn"
    ident = rec.get("id")
    messages = [{"role": r, "content": "\n\n".join(ts)} for r, ts in merged]
    return Conversation(id=None if ident is None else str(ident), messages=messages), None


def _text(value: object) -> str | None:
    if isinstance(value, list):     # OpenAI content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in value):
            return None
        return "".join(p["text"] for p in value)
    return value if isinstance(value, str) else None


def _local_path(source: str | Path) -> Path | None:
    """The file to read, or None when `source` names a Hugging Face dataset."""
    path = Path(source).expanduser()
    looks_like_path = (isinstance(source, Path) or path.suffix.lower() in _PATH_SUFFIXES
                       or str(source).startswith((".", "/", "~"))
                       or (os.sep != "/" and os.sep in str(source)))
    if not path.exists() and not looks_like_path:
        return None
    if path.is_dir():
        raise SpecctlError(f"{path}: is a directory, expected a .json or .jsonl file")
    if not path.exists():
        raise SpecctlError(f"{path}: no such file")
    return path


def _open_text(path: Path, strict: bool) -> io.TextIOBase:
    try:
        raw = gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")
    except OSError as e:
        raise SpecctlError(f"{path}: cannot open ({e.strerror or e})") from None
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict" if strict else "replace",
                            newline="")


def _first_char(path: Path, strict: bool) -> str:
    try:
        with _open_text(path, strict) as f:
            while True:
                chunk = f.read(4096)
                if not chunk:
                    return ""
                stripped = chunk.lstrip("\ufeff \t\r\n")
                if stripped:
                    return stripped[0]
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise SpecctlError(f"{path}: cannot read ({e})") from None


def _file_records(path: Path, strict: bool, report: ReadReport,
                  log: Callable[[str], None]) -> Iterator[object]:
    first = _first_char(path, strict)
    if first == "[":
        return _array_records(path, strict, report, log)
    if not first:
        if strict:
            raise SpecctlError(f"{path}: the file is empty")
        log(f"warning: {path}: the file is empty, no conversations")
        return _no_records()
    if path.suffix.lower() == ".json":
        log(f"{path}: not a JSON array; reading it as JSON Lines (one record per line)")
    return _jsonl_records(path, strict, log)


def _no_records() -> Iterator[object]:
    yield from ()


def _array_records(path: Path, strict: bool, report: ReadReport,
                   log: Callable[[str], None]) -> Iterator[object]:
    with _open_text(path, strict) as f:
        reader = JsonArrayReader(f)
        try:
            yield from reader
        except UnicodeDecodeError as e:     # strict only: errors="replace" otherwise
            raise SpecctlError(f"{path}: not valid UTF-8 after record {reader.count} ({e.reason})"
                               ) from None
        except (OSError, EOFError) as e:    # e.g. a damaged .gz
            reader.error, reader.error_byte = f"read error: {e}", None
        if reader.complete:
            return
        where = (f"byte {reader.error_byte} (record {reader.count + 1})"
                 if reader.error_byte is not None else f"record {reader.count + 1}")
        if strict:
            raise SpecctlError(f"{path}: the JSON array is cut off or malformed at {where}: "
                               f"{reader.error}; {reader.count} complete records precede it")
        report.truncated_at = where
        log(f"warning: {path}: the JSON array is cut off or malformed at {where} "
            f"({reader.error}); recovered the {reader.count} complete records before it")


def _jsonl_records(path: Path, strict: bool, log: Callable[[str], None]) -> Iterator[object]:
    bad, first_bad = 0, ""
    line_no = 0
    with _open_text(path, strict) as f:
        try:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    if strict:
                        raise SpecctlError(f"{path}:{line_no}: not valid JSON ({e.msg}, column "
                                           f"{e.colno})") from None
                    bad += 1
                    first_bad = first_bad or f"line {line_no}: {e.msg}"
                    yield _MALFORMED
                    continue
                yield rec
        except UnicodeDecodeError as e:     # strict only
            raise SpecctlError(f"{path}:{line_no + 1}: not valid UTF-8 ({e.reason})") from None
        except (OSError, EOFError) as e:
            raise SpecctlError(f"{path}: read error after line {line_no}: {e}") from None
        finally:
            if bad:
                log(f"warning: {path}: skipped {bad} malformed line{'s' if bad > 1 else ''} "
                    f"(first: {first_bad})")


def _dataset_records(name: str) -> Iterator[object]:
    try:
        import datasets
        ds = datasets.load_dataset(name, split="train")
    except Exception as e:    # noqa: BLE001 - any failure is the user's (name, network, format)
        raise SpecctlError(f"could not load dataset {name}: {_one_line(e)}") from None
    return _guarded(ds, name)


def _guarded(ds: Iterable, name: str) -> Iterator[object]:
    try:
        yield from ds
    except Exception as e:    # noqa: BLE001
        raise SpecctlError(f"could not read dataset {name}: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return lines[0] if lines else type(e).__name__
