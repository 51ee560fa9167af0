import json
import os
import re
import threading

import pytest

from specctl.errors import SpecctlError
from specctl.io import lines
from specctl.io.prompts import PromptRecord, read_prompts


def write(tmp_path, *lines, raw=None, name="p.jsonl"):
    p = tmp_path / name
    if raw is not None:
        p.write_bytes(raw)
    else:
        p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def test_prompt_format(tmp_path):
    (r,) = read_prompts(write(tmp_path, {"prompt": "Hi there", "id": 7, "category": "chat"}))
    assert r == PromptRecord(index=0, line_no=1, id=7, id_field="id", category="chat",
                             turns=(({"role": "user", "content": "Hi there"},),),
                             max_tokens=None, raw_prompt="Hi there", error=None)


def test_messages_format_developer_maps_to_system(tmp_path):
    msgs = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "q"}]
    (r,) = read_prompts(write(tmp_path, {"messages": msgs, "max_tokens": 32}))
    assert r.turns == (({"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}),)
    assert r.max_tokens == 32 and r.id is None and r.id_field is None and r.raw_prompt is None


def test_openai_batch_format(tmp_path):
    line = {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "x", "messages": [{"role": "user", "content": "hello"}],
                     "max_completion_tokens": 64}}
    (r,) = read_prompts(write(tmp_path, line))
    assert (r.id, r.id_field, r.max_tokens) == ("req-1", "custom_id", 64)
    line["body"]["max_tokens"] = 64   # (both names, one number: fine)
    (r,) = read_prompts(write(tmp_path, line))
    assert r.max_tokens == 64
    assert r.turns == (({"role": "user", "content": "hello"},),)


def test_openai_content_parts_joined(tmp_path):
    parts = [{"type": "text", "text": "foo "}, {"type": "text", "text": "bar"}]
    line = {"custom_id": "a", "body": {"messages": [{"role": "user", "content": parts}], "max_tokens": 5}}
    (r,) = read_prompts(write(tmp_path, line))
    assert r.turns[0][0]["content"] == "foo bar" and r.max_tokens == 5


def test_mtbench_multi_turn(tmp_path):
    line = {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]}
    (r,) = read_prompts(write(tmp_path, line))
    assert (r.id, r.id_field, r.category) == (81, "question_id", "writing")
    assert r.turns == (({"role": "user", "content": "Write a poem."},),
                       ({"role": "user", "content": "Now shorter."},))


def test_blank_lines_keep_true_line_numbers_and_bom(tmp_path):
    raw = b'\xef\xbb\xbf{"prompt": "a"}\n\n   \r\n{"prompt": "b"}\r\n\n'
    rs = read_prompts(write(tmp_path, raw=raw))
    assert [(r.index, r.line_no, r.raw_prompt) for r in rs] == [(0, 1, "a"), (1, 4, "b")]
    # (a later line's mark: said in words, not json's "decode using utf-8-sig")
    with pytest.raises(SpecctlError, match=r"p.jsonl:2: starts with a byte order mark"):
        read_prompts(write(tmp_path, raw=b'{"prompt": "a"}\n\xef\xbb\xbf{"prompt": "b"}\n'))


def test_duplicate_ids_allowed(tmp_path):
    rs = read_prompts(write(tmp_path, {"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}))
    assert [r.id for r in rs] == ["x", "x"]


def test_a_lines_own_data_is_not_taken_for_a_typo(tmp_path):
    """Keys near a prompt format's name are a line's own data where it has a format ("turn":
    a chat log's turn number); other names are never checked."""
    rs = read_prompts(write(tmp_path, {"prompt": "a", "turn": 1, "message": "m", "prompts": 2,
                                       "answer": "b", "reference": ["r"], "max_length": 9,
                                       "question_idx": 3, "custom_ids": "c", "Question_id": 4}))
    assert [r.raw_prompt for r in rs] == ["a"]


BAD = [
    ('{"prompt": "a"', "malformed JSON: Expecting ',' delimiter (column 15)"),
    ('[1, 2]', "expected a JSON object"),
    ('{"question": "a"}', "unknown prompt format: expected one of prompt, messages, turns, body.messages"),
    ('{"prompt": "  "}', "prompt: must be a string with some text (not empty, nor only whitespace)"),
    ('{"prompt": 3}', "prompt: must be a string, got an integer"),
    ('{"prompt": "   "}', "prompt: must be a string with some text"),
    ('null', "expected a JSON object, got null"),
    ('{"prompt": "a", "category": true}', "category: must be a string, got a boolean"),
    ('{"turns": []}', "turns: must be a non-empty list"),
    ('{"turns": ["ok", 5]}', "turns[1]: must be a string with some text"),
    ('{"turns": ["ok", ""]}', "turns[1]: must be a string with some text"),
    # a setting's name one letter off (it ran the default without a word); the line's own
    # data under other names is its own
    ('{"prompt": "a", "max_token": 3}', "max_token: unknown; did you mean max_tokens?"),
    ('{"prompt": "a", "smapling": {"seed": 1}}', "smapling: unknown; did you mean sampling?"),
    ('{"promt": "a"}', "promt: unknown; did you mean prompt?"),
    ('{"messages": []}', "messages: must be a non-empty list"),
    ('{"messages": [{"role": "user", "content": 5}]}', "messages[0].content: must be a string"),
    ('{"messages": [{"role": "tool", "content": "x"}]}', "messages[0].role: 'tool'"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
     "last message must be from the user"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages[0].content[0]"),
    ('{"body": {"input": "x"}}', "body: must be an object with messages"),
    ('{"body": {"messages": [{"role": "user", "content": "q"}], "max_tokens": 0}}',
     "body.max_tokens: must be a positive integer"),
    ('{"prompt": "a", "max_tokens": "10"}', "max_tokens: must be a positive integer"),
    # (OpenAI's two names for one budget: which one a reader keeps differs)
    ('{"body": {"messages": [{"role": "user", "content": "q"}], "max_tokens": 8, '
     '"max_completion_tokens": 64}}', "body.max_tokens (8) and body.max_completion_tokens (64) "
     "differ"),
    ('{"prompt": "a", "max_tokens": true}', "max_tokens: must be a positive integer"),
    ('{"prompt": "a", "id": [1]}', "id: must be a string or integer"),
    ('{"prompt": "a", "category": 3}', "category: must be a string"),
    ('{"prompt": "a", "turns": ["b"]}', "ambiguous prompt format"),
    # (Python's json would keep the last prompt, another parser the first)
    ('{"prompt": "a", "prompt": "b"}', 'the key "prompt" appears twice in one object'),
    ('{"messages": [{"role": "user", "content": "a", "content": "b"}]}',
     'the key "content" appears twice'),
]


@pytest.mark.parametrize("line,expected", BAD)
def test_bad_line_raises_with_file_and_line(tmp_path, line, expected):
    p = write(tmp_path, {"prompt": "fine"}, "", line)
    with pytest.raises(SpecctlError) as ei:
        read_prompts(p)
    assert str(ei.value).startswith(f"{p}:3: ") and expected in str(ei.value)


def test_invalid_utf8(tmp_path):
    p = write(tmp_path, raw=b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    with pytest.raises(SpecctlError, match=r":2: not valid UTF-8 \(byte 0xff at column 13\)"):
        read_prompts(p)


def test_a_utf16_or_cr_file_is_named_as_such(tmp_path):
    """Two files a text editor may make: UTF-16 (a byte order mark, then two bytes a
    character) and old Mac line ends (CR alone: the whole file one line)."""
    u = tmp_path / "u16.jsonl"
    u.write_bytes('{"prompt": "a"}\n'.encode("utf-16"))
    with pytest.raises(SpecctlError, match=r"u16\.jsonl:1: not valid UTF-8 .*the file is "
                                           r"UTF-16: convert it to UTF-8"):
        read_prompts(u)
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes(b'{"prompt": "a"}\r{"prompt": "b"}\r')
    with pytest.raises(SpecctlError, match=r"cr\.jsonl:1: malformed JSON: Extra data .*end "
                                           r"in a carriage return alone"):
        read_prompts(cr)
    inside = tmp_path / "inside.jsonl"   # (a raw CR inside a string: no such hint)
    inside.write_bytes(b'{"prompt": "a\rb"}\n')
    with pytest.raises(SpecctlError) as e:
        read_prompts(inside)
    assert "Invalid control character" in str(e.value) and "carriage" not in str(e.value)


def test_overlong_line(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", 50)
    p = write(tmp_path, {"prompt": "x" * 200}, {"prompt": "short"})
    with pytest.raises(SpecctlError, match=r":1: line is longer than"):
        read_prompts(p)
    rs = read_prompts(p, skip_bad=True)
    assert rs[0].error and rs[1].line_no == 2 and rs[1].raw_prompt == "short"


def test_an_endless_device_is_refused_at_the_piped_bound(tmp_path, monkeypatch):
    """A pipe or device is held in memory to be read once: /dev/zero (no line ends, no end)
    is refused past MAX_PIPED_BYTES, not read until the kernel kills the run; a FIFO within
    the bound reads as its file would."""
    monkeypatch.setattr(lines, "MAX_PIPED_BYTES", 3 << 20)
    with pytest.raises(SpecctlError, match=r"/dev/zero: a prompt file that is not a regular "
                                           r"file gave more than"):
        read_prompts("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    body = b'{"prompt": "' + b"y" * (2 << 20) + b'"}\n{"prompt": "b"}\n'
    writer = threading.Thread(target=lambda: fifo.write_bytes(body))
    writer.start()
    rs = read_prompts(fifo)
    writer.join()
    assert [len(r.raw_prompt) for r in rs] == [2 << 20, 1]


def test_skip_bad_keeps_good_lines(tmp_path):
    p = write(tmp_path, {"prompt": "a"}, '{"id": "b", "turns": [1]}', "not json", "", {"prompt": "d"})
    rs = read_prompts(p, skip_bad=True)
    assert [(r.index, r.line_no, r.error is None) for r in rs] == [
        (0, 1, True), (1, 2, False), (2, 3, False), (3, 5, True)]
    assert rs[1].error.startswith(f"{p}:2: turns[0]") and rs[1].turns is None and rs[1].id == "b"
    assert rs[2].error.startswith(f"{p}:3: malformed JSON")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(SpecctlError, match="not found"):
        read_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(SpecctlError, match="a directory with no prompt shards"):
        read_prompts(tmp_path)   # (a directory is read as its shards: io/shards.py)
    p = write(tmp_path, raw=b"\n  \n")
    with pytest.raises(SpecctlError, match=f"no prompts in {p}"):
        read_prompts(p)


def test_an_api_prompt_as_a_tuple_of_messages():
    """A tuple of messages is messages, as a list is; a tuple of strings is told what its items
    must be (it was told the tuple was no non-empty list)."""
    from specctl.io.prompts import prompt_record
    r = prompt_record(({"role": "user", "content": "x"},))
    assert r.turns == (({"role": "user", "content": "x"},),)
    with pytest.raises(SpecctlError, match=r"prompt 0: messages\[0\]: must be an object"):
        prompt_record(("hi",))


def test_numbers_as_other_writers_spell_them(tmp_path):
    """pandas writes an integer column with gaps as floats ("max_tokens": 2.0, as Parquet
    rows are read, io/shards.py); a prompt given in memory from a DataFrame holds numpy
    scalars; a turns tuple is a list: each as JSON means it. A fraction, a boolean, a NaN (a
    DataFrame's gap: taken as absent, a temperature of 0/0 would run greedy unsaid) and a
    float past int64 stay refused."""
    import numpy as np
    from specctl.errors import SpecctlError
    from specctl.io.prompts import prompt_record
    (r,) = read_prompts(write(tmp_path, {"prompt": "a", "max_tokens": 2.0,
                                         "sampling": {"seed": 7.0, "top_k": 5.0, "n": 2.0,
                                                      "temperature": 1.0}}))
    assert r.max_tokens == 2 and type(r.max_tokens) is int
    assert r.sampling == {"seed": 7, "top_k": 5, "n": 2, "temperature": 1.0}
    r = prompt_record({"prompt": "a", "max_tokens": np.int64(3),
                       "sampling": {"seed": np.int64(1), "temperature": np.float32(0.5)}})
    assert r.max_tokens == 3 and r.sampling == {"seed": 1, "temperature": 0.5}
    assert prompt_record({"turns": ("a", "b")}).turns == prompt_record({"turns": ["a", "b"]}).turns
    # (an array is a list: a DataFrame's list column; a field nobody reads is not looked at,
    # however deep)
    assert prompt_record({"turns": np.array(["a", "b"])}).turns == \
        prompt_record({"turns": ["a", "b"]}).turns
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    assert prompt_record({"prompt": "x", "reference": np.array(["a", "b"], dtype=object),
                          "data": deep}).raw_prompt == "x"
    for bad, said in [(2.5, "got 2.5"), (np.bool_(True), "got True"), (1e300, "got 1e+300"),
                      (np.float64("nan"), "got nan"), (np.array([5]), "got [5]")]:
        with pytest.raises(SpecctlError,
                           match=re.escape("max_tokens: must be a positive integer, " + said)):
            prompt_record({"prompt": "a", "max_tokens": bad})

