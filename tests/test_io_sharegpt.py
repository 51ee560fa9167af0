import gzip
import io
import json
import sys
import types
from pathlib import Path

import pytest

from specctl.errors import SpecctlError
from specctl.io.conversations import Conversation, ReadReport, read_conversations, to_conversation
from specctl.io.sharegpt import JsonArrayReader, download_sharegpt_json, iter_json_array


def sg(*turns, id=None):
    """A ShareGPT record from (from, value) pairs."""
    rec = {"conversations": [{"from": f, "value": v} for f, v in turns]}
    if id is not None:
        rec["id"] = id
    return rec


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def S(text):
    return {"role": "system", "content": text}


def write_json(tmp_path, records, name="c.json", **kw):
    p = tmp_path / name
    p.write_text(json.dumps(records, **kw), encoding="utf-8")
    return p


def write_jsonl(tmp_path, lines, name="c.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
                 encoding="utf-8")
    return p


def read(path, **kw):
    logs = []
    convs, report = read_conversations(path, log=logs.append, **kw)
    assert report.records == report.kept + sum(report.skipped.values())
    assert report.kept == len(convs)
    for c in convs:                       # the normalized shape every caller relies on
        roles = [m["role"] for m in c.messages]
        if roles and roles[0] == "system":
            roles = roles[1:]
        assert roles and roles[0] == "user" and roles[-1] == "assistant"
        assert all(r == ("user", "assistant")[i % 2] for i, r in enumerate(roles))
        assert all(m["content"] and m["content"] == m["content"].strip() for m in c.messages)
    return convs, report, logs


# ---- record variants ---------------------------------------------------------------------------

def test_sharegpt_human_gpt(tmp_path):
    p = write_json(tmp_path, [sg(("human", "Hi"), ("gpt", "Hello!"), ("human", "2+2?"),
                                 ("gpt", "4"), id="abc_0")])
    convs, report, logs = read(p)
    assert convs == [Conversation(id="abc_0", messages=[U("Hi"), A("Hello!"), U("2+2?"), A("4")])]
    assert report == ReadReport(records=1, kept=1, skipped={}, truncated_at=None)
    assert logs == []


@pytest.mark.parametrize("bot", ["chatgpt", "bing", "bard", "assistant", "model", "GPT"])
def test_assistant_role_aliases(tmp_path, bot):
    convs, _, _ = read(write_json(tmp_path, [sg(("user", "q"), (bot, "a"))]))
    assert convs[0].messages == [U("q"), A("a")]


def test_messages_role_content_and_items(tmp_path):
    recs = [{"id": 7, "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "q"},
                                   {"role": "assistant",
                                    "content": [{"type": "text", "text": "a"}]}]},
            {"items": [{"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]}]
    convs, report, _ = read(write_json(tmp_path, recs))
    assert convs == [Conversation(id="7", messages=[S("be brief"), U("q"), A("a")]),
                     Conversation(id=None, messages=[U("q2"), A("a2")])]


def test_system_first_kept_later_system_dropped(tmp_path):
    rec = sg(("system", "You are helpful."), ("human", "q"), ("system", "ignored"), ("gpt", "a"))
    convs, _, _ = read(write_json(tmp_path, [rec]))
    assert convs[0].messages == [S("You are helpful."), U("q"), A("a")]


# ---- normalization and skips -------------------------------------------------------------------

def test_normalization_cases(tmp_path):
    recs = [
        sg(id="empty"),                                                    # empty conversation
        sg(("human", "  "), ("gpt", "\n"), id="blank"),                    # only empty turns
        sg(("gpt", "continuing..."), ("gpt", "more"), ("human", "q"), ("gpt", "a"), id="lead"),
        sg(("human", "q1"), ("human", "q2"), ("gpt", "a1"), ("gpt", "a2"), id="merge"),
        sg(("human", "q"), ("gpt", ""), ("gpt", " a "), ("human", " "), id="empty-turns"),
        sg(("human", "q"), ("gpt", "a"), ("human", "unanswered"), id="trailing"),
        sg(("human", "q"), ("tool", "x"), ("gpt", "a"), id="unknown"),
        sg(("gpt", "only the assistant"), id="no-user"),
        sg(("human", "only a question"), id="no-answer"),
        {"id": "bad", "conversations": [{"from": "human", "value": None}, {"from": "gpt",
                                                                          "value": "a"}]},
        {"id": "bad2", "conversations": ["not a turn"]},
        "a string record", 42, None,
        {"id": "no-turns"}, {"conversations": "nope"},
    ]
    convs, report, logs = read(write_json(tmp_path, recs, indent=2))
    assert {c.id: c.messages for c in convs} == {
        "lead": [U("q"), A("a")],
        "merge": [U("q1\n\nq2"), A("a1\n\na2")],
        "empty-turns": [U("q"), A("a")],
        "trailing": [U("q"), A("a")],
    }
    assert report.records == len(recs) and report.kept == 4
    assert report.skipped == {"empty": 2, "unknown role": 1, "no assistant turn": 2,
                              "bad turn": 2, "not a conversation": 5}
    assert report.truncated_at is None and logs == []


def test_to_conversation_reasons():
    assert to_conversation([]) == (None, "not a conversation")
    assert to_conversation({"conversations": [{"value": "x"}]}) == (None, "bad turn")
    assert to_conversation({"messages": [{"role": "user", "content": 3}]}) == (None, "bad turn")
    assert to_conversation(sg(("narrator", "x"))) == (None, "unknown role")
    conv, why = to_conversation(sg(("system", "s1"), ("system", "s2"), ("human", "q"),
                                   ("gpt", "a"), id=5))
    assert why is None and conv == Conversation("5", [S("s1\n\ns2"), U("q"), A("a")])


def test_duplicate_ids_kept_and_counted(tmp_path):
    recs = [sg(("human", "q"), ("gpt", "a"), id="x"), sg(("human", "q2"), ("gpt", "a2"), id="x")]
    convs, report, _ = read(write_json(tmp_path, recs))
    assert [c.id for c in convs] == ["x", "x"] and report.duplicate_ids == 1


def test_limit(tmp_path):
    recs = [sg(("human", "bad"))] + [sg(("human", f"q{i}"), ("gpt", f"a{i}"), id=i)
                                     for i in range(10)]
    convs, report, _ = read(write_json(tmp_path, recs), limit=3)
    assert [c.id for c in convs] == ["0", "1", "2"]
    assert report.records == 4 and report.kept == 3 and report.truncated_at is None
    assert read(write_json(tmp_path, recs), limit=0)[0] == []


# ---- damaged files -----------------------------------------------------------------------------

def _good(n):
    return [sg(("human", f"question {i} é✓"), ("gpt", f"answer {i}"), id=f"r{i}")
            for i in range(n)]


def test_truncated_array_recovers_records_before_the_cut(tmp_path):
    full = json.dumps(_good(5), indent=2, ensure_ascii=False)
    cut = full.index('"r3"') + 2                     # inside record 4 (index 3)
    p = tmp_path / "cut.json"
    p.write_text(full[:cut], encoding="utf-8")
    convs, report, logs = read(p)
    assert [c.id for c in convs] == ["r0", "r1", "r2"]
    assert report.records == 3
    start = full.rindex("{", 0, full.index('"conversations"', full.index('"r2"')))  # record 4 opens
    start_byte = len(full[:start].encode("utf-8"))
    assert report.truncated_at == f"byte {start_byte} (record 4)"
    assert len(logs) == 1 and "recovered the 3 complete records" in logs[0]
    assert str(p) in logs[0] and f"byte {start_byte}" in logs[0]
    with pytest.raises(SpecctlError, match=r"cut off or malformed at byte \d+ \(record 4\).*3 "
                                           r"complete records"):
        read_conversations(p, strict=True, log=logs.append)


def test_array_cut_between_records_and_broken_middle(tmp_path):
    full = json.dumps(_good(3))
    p = tmp_path / "nobracket.json"
    p.write_text(full[:-1])                          # only the closing ']' is missing
    convs, report, logs = read(p)
    assert len(convs) == 3 and report.truncated_at == f"byte {len(full) - 1} (record 4)"
    assert "closing ']'" in logs[0]
    bad = full.replace('"r1"', '"r1" oops', 1)       # broken JSON in the middle: stop there
    p.write_text(bad)
    convs, report, logs = read(p)
    assert [c.id for c in convs] == ["r0"] and report.truncated_at.endswith("(record 2)")
    assert "not valid JSON" in logs[0]
    with pytest.raises(SpecctlError):
        read_conversations(p, strict=True, log=logs.append)


def test_json_array_reader_across_chunk_boundaries():
    items = [{"s": "x" * n, "n": n, "u": "é✓\u2028", "f": 1.5e3} for n in range(40)]
    items += [12345, "z", None]
    text = json.dumps(items, ensure_ascii=False)
    for chunk in (1, 3, 7, 64):
        r = JsonArrayReader(io.StringIO(text), chunk_chars=chunk)
        assert list(r) == items and r.complete and r.error is None and r.count == len(items)
    assert list(iter_json_array(io.StringIO(text[:-1]))) == items   # cut at the ']': all read
    r = JsonArrayReader(io.StringIO(text[: len(text) // 2]), chunk_chars=16)
    got = list(r)
    assert got == items[: len(got)] and not r.complete and r.error and r.error_byte > 0


def test_jsonl_with_malformed_line(tmp_path):
    p = write_jsonl(tmp_path, [sg(("human", "q"), ("gpt", "a"), id=1), "{not json", "",
                               {"messages": [{"role": "user", "content": "q2"},
                                             {"role": "assistant", "content": "a2"}]}])
    convs, report, logs = read(p)
    assert [c.id for c in convs] == ["1", None]
    assert report.records == 3 and report.skipped == {"malformed line": 1}
    assert len(logs) == 1 and "line 2" in logs[0]
    with pytest.raises(SpecctlError, match=r"c\.jsonl:2: not valid JSON"):
        read_conversations(p, strict=True, log=logs.append)


def test_gzip_jsonl_and_json_that_is_jsonl(tmp_path):
    line = json.dumps(sg(("human", "q"), ("gpt", "a"), id="g")) + "\n"
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(line.encode()))
    assert [c.id for c in read(gz)[0]] == ["g"]
    j = tmp_path / "lines.json"
    j.write_text(line * 2)
    convs, _, logs = read(j)
    assert len(convs) == 2 and "reading it as JSON Lines" in logs[0]


def test_missing_empty_and_directory(tmp_path):
    with pytest.raises(SpecctlError, match="no such file"):
        read_conversations(tmp_path / "nope.json")
    with pytest.raises(SpecctlError, match="no such file"):
        read_conversations("./nope.jsonl")
    with pytest.raises(SpecctlError, match="is a directory"):
        read_conversations(tmp_path)
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    convs, report, logs = read(empty)
    assert convs == [] and report.records == 0 and "empty" in logs[0]
    with pytest.raises(SpecctlError, match="empty"):
        read_conversations(empty, strict=True)


# ---- Hugging Face datasets (offline: a stand-in module) ----------------------------------------

def test_dataset_name(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        if name == "owner/missing":
            raise FileNotFoundError("Dataset 'owner/missing' doesn't exist on the Hub\nmore")
        return [sg(("human", "q"), ("gpt", "a"), id="h1"), {"x": 1}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    convs, report, _ = read("owner/sharegpt")
    assert calls == [("owner/sharegpt", "train")]
    assert [c.id for c in convs] == ["h1"] and report.skipped == {"not a conversation": 1}
    with pytest.raises(SpecctlError) as e:
        read_conversations("owner/missing")
    assert str(e.value) == ("could not load dataset owner/missing: Dataset 'owner/missing' "
                            "doesn't exist on the Hub")


# ---- the real file -----------------------------------------------------------------------------

@pytest.mark.demo
def test_real_sharegpt_file():
    from helpers import cache_root
    try:
        path = download_sharegpt_json(cache_root() / "data", log=lambda m: None)
    except SpecctlError as e:
        pytest.skip(f"ShareGPT unavailable: {e}")
    convs, report, _ = read(path, limit=200)
    assert report.kept == 200 and report.truncated_at is None
    assert report.records < 400                      # most records are usable
    assert sum(len(c.messages) for c in convs) >= 400
