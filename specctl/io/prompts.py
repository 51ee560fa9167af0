"""Read prompt files (JSONL, one JSON object per line, read once by io/lines.py; Parquet files
and directories of shards through io/shards.py) into normalized `PromptRecord`s.

Accepted line formats:
  {"prompt": "..."}                                  one stage: [user: prompt]; raw_prompt kept
  {"messages": [{"role", "content"}, ...]}           one stage: those messages
  {"custom_id", "body": {"messages", "max_tokens"}}  OpenAI batch; id from custom_id
  {"question_id", "category", "turns": ["q1", ...]}  MT-bench / Spec-Bench; one stage per turn
Any format may also carry "id" (the line's key when custom_id/question_id are absent; every id
a line has is carried to the output), "category" and a top-level "max_tokens" (OpenAI batch
lines use body.max_tokens / body.max_completion_tokens).

A line's own sampling settings (they win over the command's, for that line only): in an OpenAI
batch body as OpenAI (and vLLM) take them (temperature, top_p, top_k, seed, stop, n, logprobs
with top_logprobs), on any other line as a "sampling" object with the same keys; "logprobs"
there is the number of alternatives per token (0: the chosen token's only), "n" the answers
to sample (seeds seed, seed + 1, ...). Such a setting at a line's top level is refused: read by
nobody, a line's own temperature would run greedy without a word.

`turns` is a tuple of conversation stages: the generator appends stage 1's messages, answers,
appends its answer, then stage 2, and so on. Messages are {"role", "content"} dicts with role
system/user/assistant ("developer" maps to "system"); each stage ends with a user message.
OpenAI content lists of {"type": "text", "text"} parts are joined into one string.

Bad input raises `SpecctlError("<file>:<line>: <what is wrong>")` on the first bad line; with
skip_bad=True the record is kept with `error` set and `turns` None. Blank lines are skipped but
line numbers stay true; a UTF-8 BOM is accepted; lines over 10 MB are rejected. Every text
(prompt, message contents, turns, ids, category) is checked here once: a string UTF-8 cannot
encode (a lone surrogate, valid JSON) makes its line bad, so nothing downstream meets it. A
compressed file (gzip, bzip2, xz, zstd, zip) is named as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.schema import json_type

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_FORMAT_KEYS = ("prompt", "messages", "turns", "body")


@dataclass(frozen=True)
class PromptRecord:
    index: int  # 0-based position among the file's non-blank lines
    line_no: int  # 1-based line number in the file
    id: str | int | None
    id_field: str | None  # "custom_id" | "question_id" | "id" | None
    category: str | None
    turns: tuple[tuple[dict, ...], ...] | None
    max_tokens: int | None
    raw_prompt: str | None = None  # the verbatim "prompt" text (for --no-chat)
    error: str | None = None
    sampling: dict | None = None   # the line's own settings (SAMPLING keys), checked
    source: str | None = None      # the shard it came from, when the input is a directory
    more_ids: tuple = ()   # its other ids (key, value), where it has several: all carried

    def where(self, path) -> str:
        """The line as messages name it: file:line (the shard's, in a directory of them)."""
        return f"{self.source or path}:{self.line_no}"


class _Bad(Exception):
    pass


def unencodable(text: str) -> str | None:
    """Why `text` cannot be written as UTF-8 (a lone surrogate such as "\\ud800", which JSON
    can spell but no UTF-8 file, tokenizer or output line can hold), or None when it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"has a lone surrogate {ascii(text[e.start])[1:-1]} at character {e.start + 1}, "
                "which UTF-8 cannot encode")
    return None


def _show(value, limit: int = 40) -> str:
    """A value as a message shows it: its repr (escapes, never a raw control character or
    surrogate), cut short."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _text(value: str, where: str) -> str:
    """A string from the input, checked once here so that nothing downstream (tokenizer, chat
    template, the output line) meets text it cannot encode."""
    why = unencodable(value)
    if why:
        raise _Bad(f"{where}: {why}")
    return value


def _content(value, where: str) -> str:
    if isinstance(value, list):  # OpenAI content parts
        texts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise _Bad(f"{where}[{i}]: only text content parts are supported")
            texts.append(part["text"])
        value = "".join(texts)
    if not isinstance(value, str):
        raise _Bad(f"{where}: must be a string, got {json_type(value)}")
    return _text(value, where)


def _messages(value, where: str) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise _Bad(f"{where}: must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise _Bad(f"{where}[{i}]: must be an object with role and content")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise _Bad(f"{where}[{i}].role: {_show(role)} is not one of system, user, assistant")
        out.append({"role": _ROLES[role], "content": _content(m.get("content"), f"{where}[{i}].content")})
    if out[-1]["role"] != "user":
        raise _Bad(f"{where}: last message must be from the user")
    return tuple(out)


def _max_tokens(obj: dict, where: str) -> int | None:
    """The line's own token budget: max_tokens, or OpenAI's newer name for it,
    max_completion_tokens; both given must agree (which one another reader keeps differs)."""
    got = {}
    for key in ("max_tokens", "max_completion_tokens"):
        if obj.get(key) is not None:
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise _Bad(f"{where}{key}: must be a positive integer, got {_show(v)}")
            got[key] = v
    if len(set(got.values())) > 1:
        raise _Bad(f"{where}max_tokens ({got['max_tokens']}) and {where}max_completion_tokens "
                   f"({got['max_completion_tokens']}) differ: give one")
    return next(iter(got.values()), None)


MAX_LOGPROBS = 20   # alternatives per token, as OpenAI allows
MAX_N = 16          # answers sampled per line
SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop", "n", "logprobs")
UNSUPPORTED = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1,
               "logit_bias": {}, "min_p": 0, "best_of": 1}   # (their "off")
# an OpenAI body's fields that shape the answer (a JSON mode, tools the chat template would
# render into the prompt), and their "off"
BODY_UNSUPPORTED = {"response_format": {"type": "text"}, "tools": [], "functions": []}


def _number(v, key: str, lo: float, hi: float, lo_open: bool = False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or \
            not (lo < v if lo_open else lo <= v) or v > hi:
        raise _Bad(f"{key}: must be a number in {'(' if lo_open else '['}{lo}, {hi}], got "
                   f"{_show(v)}")
    return float(v)


def _count(v, key: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _Bad(f"{key}: must be an integer in [{lo}, {hi}], got {_show(v)}")
    return v


MAX_STOPS = 16   # stop strings a line or a run may give (each is checked at every token)


def _stops(v, key: str) -> tuple[str, ...]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOPS or \
            not all(isinstance(x, str) and x for x in stops):
        raise _Bad(f"{key}: must be a non-empty string or a list of 1-{MAX_STOPS} of them")
    return tuple(_text(x, key) for x in stops)


def _sampling(obj: dict, where: str, openai: bool) -> dict | None:
    """The settings of SAMPLING found in obj, checked (None when there are none). openai: a
    batch body (logprobs a switch, top_logprobs its count)."""
    out: dict = {}
    if openai and obj.get("top_logprobs") is not None and obj.get("logprobs") is not True:
        raise _Bad(f"{where}top_logprobs: needs {where}logprobs: true")
    for key in SAMPLING:
        v = obj.get(key)
        if v is None:
            continue
        k = where + key
        if key == "temperature":
            out[key] = _number(v, k, 0.0, 100.0)
            if 0 < out[key] < 1e-3:   # (speculative/sampling.py MIN_TEMPERATURE)
                raise _Bad(f"{k}: must be 0 (greedy) or at least 0.001, got {_show(v)}")
        elif key == "top_p":
            out[key] = _number(v, k, 0.0, 1.0, lo_open=True)
        elif key == "top_k":   # (-1: off, as vLLM spells it)
            out[key] = max(0, _count(v, k, -1, 1 << 30))
        elif key == "seed":
            out[key] = _count(v, k, 0, 2**63 - 1)
        elif key == "stop":
            out[key] = _stops(v, k)
        elif key == "n":
            if _count(v, k, 1, MAX_N) > 1:
                out[key] = v
        elif openai:
            if not isinstance(v, bool):
                raise _Bad(f"{k}: must be true or false, got {_show(v)}")
            if v:
                top = obj.get("top_logprobs")
                out[key] = 0 if top is None else _count(top, where + "top_logprobs", 0,
                                                        MAX_LOGPROBS)
        else:
            out[key] = _count(v, k, 0, MAX_LOGPROBS)
    return out or None


def _id_value(obj: dict, key: str) -> str | int | None:
    """The line's id under `key` (None: absent), checked."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _Bad(f"{key}: must be a string or integer, got {json_type(v)}")
    return _text(v, key) if isinstance(v, str) else v


def _ident(obj: dict) -> tuple[str | int | None, str | None]:
    for key in ("custom_id", "question_id", "id"):
        v = _id_value(obj, key)
        if v is not None:
            return v, key
    return None, None


# a line's own settings: a top-level key within one edit of one of these is a typo of it
# ("max_token" ran the default budget without a word); any other key is the line's own data
# (ids too: a misspelt one only leaves the line keyed by its index, and datasets carry
# question_idx and the like as data)
_SETTING_KEYS = ("max_tokens", "sampling", "messages", "prompt", "turns")


def _near_miss(key: str) -> str | None:
    """The setting `key` misspells (one letter dropped, added, changed or two swapped), or
    None."""
    for want in _SETTING_KEYS:
        if key == want or abs(len(key) - len(want)) > 1 or len(want) < 5:
            continue
        if len(key) == len(want):
            diff = [i for i, (a, b) in enumerate(zip(key, want)) if a != b]
            if len(diff) == 1 or len(diff) == 2 and diff[1] == diff[0] + 1 and \
                    key[diff[0]] == want[diff[1]] and key[diff[1]] == want[diff[0]]:
                return want
        else:
            short, long = sorted((key, want), key=len)
            if any(long[:i] + long[i + 1:] == short for i in range(len(long))):
                return want
    return None


def _top_level_settings(obj: dict, kind: str) -> None:
    """A sampling setting at a line's top level is refused, naming where it goes (read by
    nobody there, a line's temperature ran greedy without a word); an unsupported one
    (penalties, min_p, ...) too, unless it is off. null is absent, as everywhere here."""
    for key in SAMPLING:
        if obj.get(key) is not None:
            home = "its body" if kind == "body" else '"sampling": {...}'
            raise _Bad(f"{key}: a line's sampling settings go in {home}, not at its top level")
    for key, off in UNSUPPORTED.items():
        if obj.get(key) is not None and obj[key] != off:
            raise _Bad(f"{key}: not supported (specctl samples without penalties, biases, "
                       f"min_p or best_of): set it to {off!r} or leave it out")


def _more_ids(obj: dict, id_field: str | None) -> tuple:
    """The line's ids besides the one that keys it (question_id and id beside a custom_id, id
    beside a question_id), as (key, value): every one is carried to the output line."""
    if id_field is None:
        return ()
    keys, out = ("custom_id", "question_id", "id"), []
    for k in keys[keys.index(id_field) + 1:]:
        v = obj.get(k)
        if isinstance(v, float) and v.is_integer():   # (a column with nulls reads as float)
            v = int(v)
        v = _id_value({k: v}, k)
        if v is not None:
            out.append((k, v))
    return tuple(out)


_READ = _FORMAT_KEYS + ("sampling", "max_tokens", "max_completion_tokens", "custom_id",
                       "question_id", "id", "category")   # (a line's keys whose values are read)


def _plain(v, depth: int = 0):
    """A line's values as JSON means them, however its writer spelled them: a whole float is
    an integer (pandas writes an integer column with gaps as floats, `"max_tokens": 2.0`, as
    a Parquet file's rows do, io/shards.py), numpy's scalars and arrays Python's (a prompt
    given in memory from a DataFrame's rows), a tuple a list. (A NaN stays one, and is
    refused: a temperature of 0/0 taken as absent would run greedy unsaid.) Only the keys a
    line's values are read from, and no deeper than any of them goes (a message's content
    parts: 6): a field nobody reads is left as it came, however large or deep."""
    if depth == 0 and isinstance(v, dict):
        return {k: _plain(x, 1) if k in _READ else x for k, x in v.items()}
    if depth > 8:
        return v
    if isinstance(v, dict):
        return {k: _plain(x, depth + 1) for k, x in v.items()}
    if type(v).__module__ == "numpy" and hasattr(v, "tolist"):   # (numpy is not imported
        v = v.tolist()                                            # here)
    if isinstance(v, (list, tuple)):
        return [_plain(x, depth + 1) for x in v]
    # (within an int64: a whole 1e300 stays a float, and is refused as one)
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**63 else v


def _parse(obj) -> dict:
    obj = _plain(obj)
    if not isinstance(obj, dict):
        raise _Bad(f"expected a JSON object, got {json_type(obj)}"
                   + (" (a prompt file is JSON lines: one object a line, not one array)"
                      if isinstance(obj, list) else ""))
    formats = any(k in obj for k in _FORMAT_KEYS)
    for key in obj:   # (before the format: {"promt": ...} is a typo, not another format)
        want = _near_miss(key)   # (a format's, only where the line has none: "turn": 1 is
        if want is not None and want not in obj and not (formats and want in _FORMAT_KEYS):
            raise _Bad(f"{key}: unknown; did you mean {want}?")   # a chat log's own)
    ident, id_field = _ident(obj)
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise _Bad(f"category: must be a string, got {json_type(category)}")
    if category is not None:
        _text(category, "category")
    found = [k for k in _FORMAT_KEYS if k in obj]
    if not found:
        raise _Bad("unknown prompt format: expected one of prompt, messages, turns, body.messages")
    if len(found) > 1:
        raise _Bad(f"ambiguous prompt format: has both {found[0]!r} and {found[1]!r}")
    raw, max_tokens = None, _max_tokens(obj, "")
    kind = found[0]
    _top_level_settings(obj, kind)
    sampling = obj.get("sampling")
    if sampling is not None:
        if kind == "body":
            raise _Bad("sampling: an OpenAI batch line sets them in its body")
        if not isinstance(sampling, dict) or not sampling:
            raise _Bad("sampling: must be an object of settings (temperature, top_p, ...)")
        unknown = sorted(set(sampling) - set(SAMPLING))
        if unknown:
            raise _Bad(f"sampling.{unknown[0]}: unknown setting ({', '.join(SAMPLING)})")
        sampling = _sampling(sampling, "sampling.", openai=False)
    if kind == "prompt":
        raw = obj["prompt"]
        if not isinstance(raw, str):
            raise _Bad(f"prompt: must be a string, got {json_type(raw)}")
        if not raw.strip():
            raise _Bad("prompt: must be a string with some text (not empty, nor only "
                       "whitespace)")
        _text(raw, "prompt")
        turns = (({"role": "user", "content": raw},),)
    elif kind == "messages":
        turns = (_messages(obj["messages"], "messages"),)
    elif kind == "body":
        body = obj["body"]
        if not isinstance(body, dict) or "messages" not in body:
            raise _Bad("body: must be an object with messages (OpenAI batch request)")
        turns = (_messages(body["messages"], "body.messages"),)
        max_tokens = _max_tokens(body, "body.") or max_tokens
        sampling = _sampling(body, "body.", openai=True)
        if "sampling" in body:
            raise _Bad("body.sampling: an OpenAI batch body sets them as its own fields "
                       "(temperature, seed, ...)")
        for key, off in UNSUPPORTED.items():   # would change the answer: not left out quietly
            if body.get(key) is not None and body[key] != off:
                raise _Bad(f"body.{key}: not supported (specctl samples without penalties, "
                           f"biases, min_p or best_of): set it to {off!r} or leave it out")
        for key, off in BODY_UNSUPPORTED.items():
            if body.get(key) is not None and body[key] != off:
                raise _Bad(f"body.{key}: not supported (specctl answers in plain text: no "
                           "response format, no tools): leave it out")
    else:
        qs = obj["turns"]
        if not isinstance(qs, list) or not qs:
            raise _Bad("turns: must be a non-empty list of strings")
        for i, q in enumerate(qs):
            if not isinstance(q, str) or not q.strip():
                raise _Bad(f"turns[{i}]: must be a string with some text (not empty, nor "
                           "only whitespace)")
            _text(q, f"turns[{i}]")
        turns = tuple(({"role": "user", "content": q},) for q in qs)
    return dict(id=ident, id_field=id_field, category=category, turns=turns,
                max_tokens=max_tokens, raw_prompt=raw, sampling=sampling,
                more_ids=_more_ids(obj, id_field))


def record_from_json(d: dict) -> PromptRecord:
    """A PromptRecord from the JSON of its asdict() (what the Ray driver sends its actors), as
    the driver read it: JSON makes tuples lists, and a list in a line's settings (its stop
    strings) made the settings unhashable where lines are grouped by them
    (runtime/jobs/groups.py): the job failed on any line with a stop list of its own."""
    d = dict(d)
    if d.get("turns") is not None:
        d["turns"] = tuple(tuple(stage) for stage in d["turns"])
    if d.get("sampling") is not None:
        d["sampling"] = {k: tuple(v) if isinstance(v, list) else v
                         for k, v in d["sampling"].items()}
    d["more_ids"] = tuple(tuple(kv) for kv in d.get("more_ids", ()))
    return PromptRecord(**d)


def prompt_record(prompt, index: int = 0) -> PromptRecord:
    """One prompt given in memory as a PromptRecord: a string (a user message), a list of
    {"role", "content"} messages, or a dict in any of the line formats above."""
    obj = ({"prompt": prompt} if isinstance(prompt, str) else   # (a tuple of messages too)
           {"messages": list(prompt)} if isinstance(prompt, (list, tuple)) else prompt)
    if not isinstance(obj, dict):
        raise SpecctlError(f"prompt {index}: a string, a list of messages or a prompt-line dict, "
                           f"got {type(prompt).__name__}")
    try:
        return PromptRecord(index=index, line_no=index + 1, **_parse(obj))
    except _Bad as e:
        raise SpecctlError(f"prompt {index}: {e}") from None


def read_prompts(path: str | Path, skip_bad: bool = False,
                 limit: int | None = None) -> list[PromptRecord]:
    """The prompt lines of a JSONL file, a Parquet file or a directory of such shards, the
    first `limit` of them if given (io/shards.py read_input: the input read once, with its
    identity)."""
    from specctl.io.shards import read_input   # (shards reads lines through here)
    return read_input(Path(path), skip_bad, limit).records


def line_record(obj, index: int, line_no: int, path: Path, skip_bad: bool,
                source: str | None = None, bad: str | None = None) -> PromptRecord:
    """Line line_no of path (or a Parquet row) read as a PromptRecord through the schema: a
    bad one raises SpecctlError("<path>:<line_no>: <what is wrong>"), or with skip_bad is kept
    with its error (and its id, where that much could be read). bad: why the line could not
    even be read."""
    try:
        if bad is not None:
            raise _Bad(bad)
        return PromptRecord(index=index, line_no=line_no, source=source, **_parse(obj))
    except _Bad as e:
        msg = f"{path}:{line_no}: {e}"
        if not skip_bad:
            raise SpecctlError(msg) from None
        ident, id_field, more = None, None, ()
        if isinstance(obj, dict):
            try:
                ident, id_field = _ident(obj)
                more = _more_ids(obj, id_field)
            except _Bad:
                pass
        return PromptRecord(index=index, line_no=line_no, id=ident, id_field=id_field,
                            category=None, turns=None, max_tokens=None, error=msg,
                            source=source, more_ids=more)
