"""Parquet files and directories of shards as prompt inputs (io/shards.py): read through the
same schema as JSONL lines, indexed over the whole input, errors naming shard and line, and
`generate` on them the same job as on the one JSONL file they hold."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.io.prompts import read_prompts
from specctl.io.shards import read_input
from specctl.store import file_sha256

LINES = [
    {"prompt": "Hi there", "id": 7, "category": "chat"},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}],
     "max_tokens": 5},
    {"question_id": 81, "turns": ["one", "two"], "sampling": {"temperature": 0.5, "seed": 3}},
    {"custom_id": "r1", "body": {"messages": [{"role": "user", "content": "hello"}],
                                 "max_completion_tokens": 4, "temperature": 0}},
    {"prompt": "Count to ten", "id": 9},
]


def jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n"
                            for l in lines), encoding="utf-8")
    return path


def parquet(path: Path, rows: list[dict]) -> Path:
    """rows as one table (its columns those of every row: from_pylist would keep the first's)"""
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), path)
    return path


def plain(records) -> list[dict]:
    """What a record says of its line (where it was read from aside)."""
    return [{k: v for k, v in asdict(r).items() if k not in ("line_no", "source")}
            for r in records]


def test_a_parquet_file_reads_as_its_jsonl(tmp_path):
    # one table of every format: Arrow fills the columns a row lacks with nulls
    want = read_prompts(jsonl(tmp_path / "p.jsonl", LINES))
    got = read_prompts(parquet(tmp_path / "p.parquet", LINES))
    assert plain(got) == plain(want)
    assert [r.line_no for r in got] == [1, 2, 3, 4, 5] and got[0].source is None
    assert plain(read_prompts(tmp_path / "p.parquet", limit=2)) == plain(want[:2])


def test_a_directory_reads_its_shards_in_name_order(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "part-0.jsonl", LINES[:2])
    parquet(d / "part-1.parquet", LINES[2:4])
    jsonl(d / "part-2.ndjson", ["", json.dumps(LINES[4])])   # (a blank line keeps numbers)
    for other in ("_SUCCESS", ".part-0.jsonl.crc", "README.md"):
        (d / other).write_text("not a shard")
    (d / "sub").mkdir()
    jsonl(d / "sub" / "x.jsonl", LINES)                        # (not read: not directly in d)
    got = read_prompts(d)
    assert plain(got) == plain(read_prompts(jsonl(tmp_path / "all.jsonl", LINES)))
    assert [(Path(r.source).name, r.line_no) for r in got] == [
        ("part-0.jsonl", 1), ("part-0.jsonl", 2), ("part-1.parquet", 1), ("part-1.parquet", 2),
        ("part-2.ndjson", 2)]
    assert [r.index for r in read_prompts(d, limit=3)] == [0, 1, 2]


def test_bad_rows_name_their_shard_and_line(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "a.jsonl", LINES[:2])
    parquet(d / "b.parquet", [{"prompt": "fine"}, {"prompt": ""}, {"prompt": "also fine"}])
    with pytest.raises(SpecctlError, match=r"b\.parquet:2: prompt: must be a string with some text"):
        read_prompts(d)
    got = read_prompts(d, skip_bad=True)
    assert [r.error is None for r in got] == [True, True, True, False, True]
    assert got[3].where("x") == f"{d / 'b.parquet'}:2" and got[4].index == 4
    (d / "b.parquet").unlink()
    jsonl(d / "c.jsonl", ["{not json"])
    with pytest.raises(SpecctlError, match=r"c\.jsonl:1: malformed JSON"):
        read_prompts(d)


def test_parquet_columns_the_schema_refuses(tmp_path):
    # a wrong type in a column is the row's error, as in a JSONL line
    p = parquet(tmp_path / "t.parquet", [{"prompt": "a", "max_tokens": -3}])
    with pytest.raises(SpecctlError, match=r"t\.parquet:1: max_tokens: must be a positive"):
        read_prompts(p)
    p = parquet(tmp_path / "u.parquet", [{"text": "no format column", "label": 1}])
    with pytest.raises(SpecctlError, match=r"u\.parquet: no prompt column \(prompt, messages, "
                       r"turns, body\); its columns: text, label"):
        read_prompts(p)
    bad = read_prompts(p, skip_bad=True)   # (as a JSONL file of such lines: each row's error)
    assert "unknown prompt format" in bad[0].error
    p = parquet(tmp_path / "v.parquet", [{"prompt": "a", "messages": [
        {"role": "user", "content": "b"}]}])
    with pytest.raises(SpecctlError, match="ambiguous prompt format"):
        read_prompts(p)
    # a row's own temperature column is read, to be refused (unread, it ran greedy); a null
    # in it is absent
    p = parquet(tmp_path / "w.parquet", [{"prompt": "a", "temperature": None},
                                         {"prompt": "b", "temperature": 0.9}])
    with pytest.raises(SpecctlError, match=r"w\.parquet:2: temperature: a line's sampling "
                       r"settings go in \"sampling\""):
        read_prompts(p)


def test_files_that_are_not_inputs(tmp_path):
    (tmp_path / "fake.parquet").write_text('{"prompt": "I am JSON"}\n')
    with pytest.raises(SpecctlError, match=r"fake\.parquet: not a readable Parquet file .*"
                       r"it starts as JSON text: a JSONL file is named \.jsonl"):
        read_prompts(tmp_path / "fake.parquet")
    (tmp_path / "arr.json").write_text('[{"prompt": "a"}, {"prompt": "b"}]\n')
    with pytest.raises(SpecctlError, match=r"arr\.json:1: expected a JSON object, got a list "
                       r"\(a prompt file is JSON lines"):
        read_prompts(tmp_path / "arr.json")
    with pytest.raises(SpecctlError, match="not found"):
        read_prompts(tmp_path / "none.parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "_SUCCESS").write_text("")
    with pytest.raises(SpecctlError, match="no prompt shards"):
        read_prompts(empty)
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), tmp_path / "zero.parquet")
    with pytest.raises(SpecctlError, match="no prompts in"):
        read_prompts(tmp_path / "zero.parquet")


def input_sha256(path: Path) -> str:
    return read_input(path, skip_bad=True).sha256


def test_a_directorys_hash_covers_every_shards_name_and_bytes(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "a.jsonl", LINES[:2])
    jsonl(d / "b.jsonl", LINES[2:])
    one = input_sha256(d)
    assert input_sha256(d / "a.jsonl") == file_sha256(d / "a.jsonl")
    (d / "_SUCCESS").write_text("")
    assert input_sha256(d) == one          # (not a shard)
    (d / "b.jsonl").rename(d / "0.jsonl")                # (the order changed)
    assert input_sha256(d) != one
    (d / "0.jsonl").rename(d / "b.jsonl")
    jsonl(d / "b.jsonl", LINES[2:] + LINES[:1])
    assert input_sha256(d) != one


def test_generate_on_shards_is_generate_on_their_jsonl(tmp_path, tiny_llama):
    """Outputs equal the one file's, line for line; a finished run resumes from the same
    directory; another shard makes it another input."""
    runner = CliRunner(env={"COLUMNS": "200"})
    prompts = [{"prompt": f"{w} {i}", "id": f"q{i}"} for i, w in
               enumerate(["The fox", "To be", "A journey", "Paris is", "Count", "Write"])]
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "0.jsonl", prompts[:2])
    parquet(d / "1.parquet", prompts[2:5])
    jsonl(d / "2.jsonl", prompts[5:])

    def gen(inp, out, *extra):
        r = runner.invoke(app, [str(a) for a in (
            "generate", inp, "--model", tiny_llama, "--store", tmp_path / "store", "--out", out,
            "--max-tokens", 6, "--device", "cpu", "--dtype", "fp32", "--batch-size", 2, "-q",
            *extra)])
        assert r.exit_code == 0, r.output
        return [json.loads(l) for l in out.read_text().splitlines()]

    one = gen(jsonl(tmp_path / "all.jsonl", prompts), tmp_path / "one.out.jsonl")
    strip = lambda ls: [{k: v for k, v in l.items() if k != "wall_time_s"} for l in ls]  # noqa
    sharded = gen(d, tmp_path / "dir.out.jsonl")
    assert strip(sharded) == strip(one) and [l["id"] for l in sharded] == [p["id"] for p in prompts]
    runs = lambda: sorted((tmp_path / "store" / "runs").iterdir())  # noqa: E731
    n = len(runs())
    assert strip(gen(d, tmp_path / "again.jsonl", "--resume")) == strip(one)
    assert len(runs()) == n                                 # (resumed: nothing new)
    jsonl(d / "3.jsonl", [{"prompt": "One more"}])
    assert len(gen(d, tmp_path / "more.jsonl", "--resume")) == len(prompts) + 1
    assert len(runs()) == n + 1


def test_records_cross_to_ray_with_their_shard(tmp_path):
    """A record's JSON (what the Ray driver sends its actors) keeps where it was read."""
    from specctl.runtime.jobs.ray_pool import _record
    d = tmp_path / "in"
    d.mkdir()
    parquet(d / "a.parquet", LINES[:3])
    for rec in read_prompts(d):
        back = _record({"record": json.dumps(asdict(rec))}, 0)
        assert back == rec and back.source == str(d / "a.parquet")


def test_shards_that_cannot_be_read_are_named_not_dropped(tmp_path):
    """A broken link and a compressed shard fail naming the file; Spark's part-*.json (JSON
    lines) is a shard; names starting with _ or . are not."""
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "part-0.json", LINES[:2])
    jsonl(d / "_metadata.json", ["not a prompt"])
    assert len(read_prompts(d)) == 2
    (d / "part-1.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(SpecctlError, match=r"part-1\.parquet: prompt file not found"):
        read_prompts(d)
    (d / "part-1.parquet").unlink()
    import gzip
    (d / "part-2.jsonl.gz").write_bytes(gzip.compress(b'{"prompt": "hi"}\n'))
    with pytest.raises(SpecctlError, match=r"part-2\.jsonl\.gz: a gzip-compressed file"):
        read_prompts(d)


def test_parquet_columns_the_schema_does_not_read_are_not_converted(tmp_path):
    """A column no line format reads (here a timestamp Python cannot hold) does not fail the
    file, and a struct whose fields are all null is an absent key."""
    t = pa.table({"prompt": ["a", "b"],
                  "created": pa.array([0, 2**62], pa.timestamp("us")),
                  "sampling": pa.array([{"temperature": None, "seed": None},
                                        {"temperature": 0.5, "seed": 1}])})
    pq.write_table(t, tmp_path / "t.parquet")
    a, b = read_prompts(tmp_path / "t.parquet")
    assert a.sampling is None and b.sampling == {"temperature": 0.5, "seed": 1}


def test_answers_are_not_written_among_the_shards(tmp_path, tiny_llama, monkeypatch):
    """--out inside the input directory (or a folder of it) is refused; so is the default
    output where the current directory is the input (`generate .`, named after it)."""
    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    jsonl(d / "0.jsonl", LINES[:1])
    for out, said in ((d / "answers.jsonl", "--out"), (d / "sub" / "a.jsonl", "--out"),
                      (None, "the default output, in.out.jsonl")):
        monkeypatch.chdir(d if out is None else tmp_path)
        r = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
            "generate", "." if out is None else str(d), "--model", str(tiny_llama),
            "--store", str(tmp_path / "s"), "-q"] + ([] if out is None else ["--out", str(out)]))
        text = " ".join(r.output.split())
        assert r.exit_code != 0 and said in text and "inside the input directory" in text, text
    assert sorted(p.name for p in d.rglob("*")) == ["0.jsonl", "sub"]


def test_a_directorys_run_says_what_it_did_not_read_and_what_changed(tmp_path, tiny_llama):
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "0.jsonl", LINES[:1])
    (d / "notes.csv").write_text("a,b\n")

    def gen(*extra):
        r = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
            "generate", str(d), "--model", str(tiny_llama), "--store", str(tmp_path / "s"),
            "--out", str(tmp_path / "o.jsonl"), "--max-tokens", "2", "-q", *extra])
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split())
    assert "1 file not read (prompt shards are .jsonl, .ndjson, .json or .parquet): " \
        "notes.csv" in gen()
    jsonl(d / "1.jsonl", LINES[1:2])
    assert "read other contents: a line or shard changed, was added or removed since" in \
        gen("--resume")


def test_bench_on_a_directory_of_shards(tmp_path, tiny_llama):
    d = tmp_path / "in"
    d.mkdir()
    jsonl(d / "0.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
    parquet(d / "1.parquet", [{"prompt": "three"}])
    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "bench", str(d), "--model", str(tiny_llama), "--store", str(tmp_path / "s"),
        "--methods", "ar", "--batch-sizes", "1", "--repeats", "1", "--warmup", "0",
        "--max-tokens", "4", "--device", "cpu", "--dtype", "fp32"])
    assert r.exit_code == 0, r.output
    assert "3 prompts" in r.output


def test_a_pandas_integer_column_with_gaps_reads_as_integers(tmp_path):
    """pandas writes an integer column with missing values as floats (5.0, null): read as the
    integers they are; a fraction is still refused."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"prompt": ["a", "b", "c"], "max_tokens": [5, None, 7],
                       "question_id": [81, 82, None]})
    df.to_parquet(tmp_path / "p.parquet")
    a, b, c = read_prompts(tmp_path / "p.parquet")
    assert (a.max_tokens, b.max_tokens, c.max_tokens) == (5, None, 7)
    assert (a.id, a.id_field, c.id) == (81, "question_id", None)
    pq.write_table(pa.table({"prompt": ["a"], "max_tokens": [5.5]}), tmp_path / "f.parquet")
    with pytest.raises(SpecctlError, match="max_tokens: must be a positive integer, got 5.5"):
        read_prompts(tmp_path / "f.parquet")


def test_parquet_page_checksums_are_verified(tmp_path):
    """The probe's file: page checksums written (Spark does by default), one prompt's bytes
    altered in place; it was read as sound. A file without checksums reads as before."""
    rows = [{"prompt": "What color is the sky?"}, {"prompt": "Name a river"}]
    table = pa.Table.from_pylist(rows)
    p = tmp_path / "c.parquet"
    flat = {"compression": "none", "use_dictionary": False, "write_statistics": False}
    pq.write_table(table, p, write_page_checksum=True, **flat)
    assert [r.raw_prompt for r in read_prompts(p)] == [r["prompt"] for r in rows]
    data = p.read_bytes()
    assert data.count(b"color") == 1
    p.write_bytes(data.replace(b"color", b"snake"))
    with pytest.raises(SpecctlError, match="c.parquet: cannot read the rows .*[Cc]hecksum"):
        read_prompts(p)
    plain_file = tmp_path / "n.parquet"
    pq.write_table(table, plain_file, **flat)
    plain_file.write_bytes(plain_file.read_bytes().replace(b"color", b"snake"))
    assert read_prompts(plain_file)[0].raw_prompt == "What snake is the sky?"


def test_two_columns_of_one_name_are_refused_naming_it(tmp_path):
    """Two `prompt` columns: the first's prompts were dropped and the run went on."""
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table([pa.array(["a one", "a two"]), pa.array(["b one", "b two"])],
                            names=["prompt", "prompt"]), p)
    with pytest.raises(SpecctlError, match="d.parquet: two columns are named 'prompt'"):
        read_prompts(p)
    with pytest.raises(SpecctlError, match="two columns are named 'prompt'"):
        read_prompts(p, skip_bad=True)
