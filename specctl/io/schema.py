"""Strict reading of the JSON objects specctl stores (skip sets, adapter configs, n-gram cache
configs, step tables): every field has one type and range, and a value of another type is an
error, never coerced (`int("12")`, `int(1.9)` and `int(True)` all "work", so a hand-edited
`"attn": "12"` would quietly become layers [1, 2]). Unknown keys are errors too: a misspelt
key would otherwise be ignored and its default used.

    spec = {"num_layers": integer(1), "attn": int_list(0, 31)}
    d = fields(raw, required=spec)        # SchemaError("attn[1]: ...") on the first bad field

SchemaError is a ValueError whose message names the field; the caller adds the file.
"""

from __future__ import annotations

import math
from typing import Any, Callable

Check = Callable[[Any, str], Any]


class SchemaError(ValueError):
    """A stored JSON value that does not fit its schema (the message names the field)."""


def json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, float) and not v.is_integer():   # ("must be an integer, got a number")
        return "a non-integer number"
    return {int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _is_int(v) -> bool:
    return type(v) is int   # (not bool, which is an int to Python)


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    def check(v, where):
        if not _is_int(v):
            raise SchemaError(f"{where}: must be an integer, got {json_type(v)} ({v!r})")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise SchemaError(f"{where}: {v} is out of range "
                              f"[{'' if lo is None else lo}, {'' if hi is None else hi}]")
        return v
    return check


def number(lo: float | None = None, hi: float | None = None, *,
           above: float | None = None) -> Check:
    """A finite JSON number (an integer is a number); `above`: strictly greater than."""
    def check(v, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError(f"{where}: must be a finite number, got {json_type(v)} ({v!r})")
        if (lo is not None and v < lo) or (hi is not None and v > hi) or \
                (above is not None and not v > above):
            raise SchemaError(f"{where}: {v} is out of range")
        return float(v)
    return check


def string(nonempty: bool = False) -> Check:
    def check(v, where):
        if not isinstance(v, str):
            raise SchemaError(f"{where}: must be a string, got {json_type(v)}")
        if nonempty and not v:
            raise SchemaError(f"{where}: must not be empty")
        return v
    return check


def boolean(v, where):
    if not isinstance(v, bool):
        raise SchemaError(f"{where}: must be true or false, got {json_type(v)} ({v!r})")
    return v


def json_object(v, where):
    """Any JSON object (its fields unchecked)."""
    if not isinstance(v, dict):
        raise SchemaError(f"{where}: must be an object, got {json_type(v)}")
    return v


def anything(v, where):
    return v


def optional(check: Check) -> Check:
    """null, or what `check` accepts."""
    return lambda v, where: None if v is None else check(v, where)


def list_of(item: Check, *, unique: bool = False, nonempty: bool = False) -> Check:
    def check(v, where):
        if not isinstance(v, (list, tuple)):   # (a tuple: an object's to_json, not yet JSON)
            raise SchemaError(f"{where}: must be a list, got {json_type(v)} ({v!r})")
        if nonempty and not v:
            raise SchemaError(f"{where}: must not be empty")
        out = [item(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if unique and len(set(out)) != len(out):
            dup = next(x for i, x in enumerate(out) if x in out[:i])
            raise SchemaError(f"{where}: {dup!r} is listed twice")
        return out
    return check


def fields(d, required: dict[str, Check], optional_keys: dict[str, Check] | None = None,
           where: str = "", what: str = "object") -> dict:
    """The checked fields of the JSON object `d` (those present); SchemaError for a value that
    is not an object, a missing required key, an unknown key or a field that fails its check."""
    optional_keys = optional_keys or {}
    if not isinstance(d, dict):
        raise SchemaError(f"{where or 'top level'}: expected a JSON {what} (an object with "
                          f"{', '.join(required)}), got {json_type(d)}")
    prefix = f"{where}." if where else ""
    missing = [k for k in required if k not in d]
    if missing:
        raise SchemaError(f"{prefix}{missing[0]}: missing (a {what} has "
                          f"{', '.join(required)})")
    unknown = sorted(set(d) - set(required) - set(optional_keys))
    if unknown:
        raise SchemaError(f"{prefix}{unknown[0]}: unknown key (a {what} has "
                          f"{', '.join([*required, *optional_keys])})")
    return {k: check(d[k], f"{prefix}{k}")
            for k, check in {**required, **optional_keys}.items() if k in d}
