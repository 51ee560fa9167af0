"""Stored JSON read through one strict schema each (io/schema.py): skip sets, adapter configs,
n-gram cache configs, step tables, run records and manifests. A wrong type, an out-of-range
value or an unknown key is an error naming the file and the field, never a coerced value
(the probe: `"attn": "12"` read as layers [1, 2], `[1.9, true]` as [1], a bare list as "list
indices must be integers or slices, not str")."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from helpers import fails
from specctl.cli import app
from specctl.errors import SpecctlError
from specctl.io.schema import SchemaError
from specctl.speculative.draft_verify import SkipSet

runner = CliRunner(env={"COLUMNS": "200"})
GOOD = {"num_layers": 4, "attn": [1, 2], "mlp": [3]}


@pytest.mark.parametrize("data, needle", [
    ({**GOOD, "attn": "12"}, "attn: must be a list, got a string"),
    ({**GOOD, "attn": [1.9, True]}, "attn[0]: must be an integer, got a non-integer number"),
    ({**GOOD, "attn": [1, True]}, "attn[1]: must be an integer, got a boolean"),
    ({**GOOD, "mlp": ["3"]}, "mlp[0]: must be an integer, got a string"),
    ([99, -1], "expected a JSON skip set"),
    ({**GOOD, "attn": [99]}, "attn: layer 99 is out of range [0, 3]"),
    ({**GOOD, "mlp": [-1]}, "mlp: layer -1 is out of range"),
    ({**GOOD, "attn": [1, 1]}, "attn: 1 is listed twice"),
    ({**GOOD, "num_layers": "4"}, "num_layers: must be an integer"),
    ({**GOOD, "num_layers": 4.0}, "num_layers: must be an integer"),
    ({**GOOD, "num_layers": 0}, "num_layers: 0 is out of range"),
    ({"num_layers": 4, "attn": [1]}, "mlp: missing"),
    ({**GOOD, "atn": [1]}, "atn: unknown key"),
    ({**GOOD, "speedup_estimate": "fast"}, "speedup_estimate: must be a finite number"),
    ({**GOOD, "profile": [1]}, "profile: must be an object"),
], ids=["attn-string", "attn-float-bool", "attn-bool", "mlp-string", "bare-list", "attn-range",
        "mlp-negative", "duplicate", "num-layers-string", "num-layers-float", "num-layers-0",
        "missing", "unknown-key", "speedup-string", "profile-list"])
def test_skip_set_schema(data, needle):
    with pytest.raises(SchemaError) as e:
        SkipSet.from_json(data)
    assert needle in str(e.value)


def test_skip_set_schema_accepts_what_search_skip_writes():
    assert SkipSet.from_json(GOOD) == SkipSet(4, frozenset({1, 2}), frozenset({3}))
    result = {**GOOD, "objective": "model", "speedup_estimate": 1.2, "acceptance_rate": 0.5,
              "profile": {"device": "cpu"}, "config": {"iters": 3}, "confirmed": [],
              "simulated_relative_time_per_token": 0.8}
    assert SkipSet.from_json(result).attn == frozenset({1, 2})


def test_a_bad_skip_set_file_is_named(tmp_path, tiny_llama):
    skip = tmp_path / "skip.json"
    skip.write_text(json.dumps({"num_layers": 4, "attn": "12", "mlp": []}))
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    r = runner.invoke(app, ["generate", str(inp), "--model", str(tiny_llama), "--store",
                            str(tmp_path / "s"), "--out", str(tmp_path / "o.jsonl"), "--method",
                            "draft-verify", "--skip-set", str(skip), "--device", "cpu", "-q"])
    fails(r, str(skip), "attn: must be a list")
    skip.write_text("[99, -1]")
    r = runner.invoke(app, ["generate", str(inp), "--model", str(tiny_llama), "--store",
                            str(tmp_path / "s"), "--out", str(tmp_path / "o.jsonl"), "--method",
                            "draft-verify", "--skip-set", str(skip), "--device", "cpu", "-q"])
    fails(r, str(skip), "expected a JSON skip set")
    assert not any((tmp_path / "s" / "runs").glob("*"))


@pytest.mark.parametrize("config, needle", [
    ({"exit_layer": "2"}, "exit_layer: must be an integer"),
    ({"exit_layer": 2.0}, "exit_layer: must be an integer"),
    ({"exit_layer": True}, "exit_layer: must be an integer"),
    ({"exit_layer": 2, "exit": 1}, "exit: unknown key"),
    ({"exit_layer": 2, "hidden_size": 999}, "hidden_size 999"),
    ({"exit_layer": 2, "format": "other"}, "format 'other'"),
    (["exit_layer"], "expected a JSON adapter config"),
])
def test_adapter_config_schema(tmp_path, model, config, needle):
    from specctl.runtime.jobs.artifacts import load_adapter
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecctlError) as e:
        load_adapter(tmp_path, model)
    assert str(tmp_path / "config.json") in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("config, needle", [
    ({"max_key_len": "2", "gram_len": 2, "tokenizer_fingerprint": "f"}, "max_key_len"),
    ({"max_key_len": 2.5, "gram_len": 2, "tokenizer_fingerprint": "f"}, "max_key_len"),
    ({"max_key_len": 2, "gram_len": 99, "tokenizer_fingerprint": "f"}, "gram_len: 99"),
    ({"max_key_len": 2, "gram_len": 2, "tokenizer_fingerprint": 7}, "tokenizer_fingerprint"),
    ({"max_key_len": 2, "gram_len": 2, "tokenizer_fingerprint": "f", "top": "20"}, "top"),
    ({"max_key_len": 2, "gram_len": 2, "tokenizer_fingerprint": "f", "grams": 1}, "grams"),
    ({"max_key_len": 2, "gram_len": 2, "tokenizer_fingerprint": "f", "format": 99}, "newer"),
    ([2, 2], "expected a JSON n-gram cache config"),
])
def test_corpus_cache_config_schema(tmp_path, config, needle):
    from specctl.speculative.corpus_cache import read_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecctlError) as e:
        read_config(tmp_path)
    assert "config.json" in str(e.value) and needle in str(e.value)


def test_step_table_schema():
    from specctl.engine.steptable import StepTable
    t = StepTable("cpu", "float32", "sdpa", 256, (1, 8), (1, 2), ((1.0, 2.0), (3.0, 4.0)),
                  tiles=True)
    stored = json.loads(json.dumps(t.to_json()))
    assert StepTable.from_json(stored) == t
    for field, value, needle in (("context", "256", "context: must be an integer"),
                                 ("batches", [1, 8.5], "batches[1]"),
                                 ("ns", [1, True], "ns[1]"),
                                 ("table", [[1.0, "2"], [3.0, 4.0]], "table[0][1]"),
                                 ("table", [[1.0, -2.0], [3.0, 4.0]], "out of range"),
                                 ("device", 1, "device"),
                                 ("engine", "7", "engine"),
                                 ("tiles", "no", "tiles")):
        with pytest.raises(ValueError, match="malformed step table") as e:
            StepTable.from_json({**stored, field: value})
        assert needle in str(e.value)
    with pytest.raises(ValueError, match="unknown key"):
        StepTable.from_json({**stored, "extra": 1})
    with pytest.raises(ValueError, match="malformed"):
        StepTable.from_json([1, 2])


def test_run_records_and_manifests_are_not_coerced(tmp_path):
    from specctl.runtime.jobs.records import _valid, nearest_run
    from specctl.runtime.jobs.config import GenerateConfig
    from specctl.store import Store
    rec = {"index": 1, "text": "x", "new_tokens": 1, "steps": 1, "prompt_tokens": 2,
           "accept_lengths": [], "draft_lengths": [], "wall_time_s": 0.1}
    assert _valid(rec)
    for k, v in (("index", True), ("new_tokens", False), ("steps", "1"), ("index", -1),
                 ("wall_time_s", True), ("accept_lengths", [True])):
        assert not _valid({**rec, k: v}), k
    st = Store(tmp_path / "s")
    for name, manifest in (("a", [1, 2]), ("b", {"input_sha256": "i", "created": 5,
                                                 "config": "not an object"}),
                           ("c", {"input_sha256": "i", "created": "2026", "config": [1]})):
        (st.root / "runs" / name).mkdir(parents=True)
        (st.root / "runs" / name / "manifest.json").write_text(json.dumps(manifest))
    assert st.entries("runs")[0].manifest == {"error": "unreadable manifest"}
    assert "(the newest run of this input, b," in nearest_run(st, "i", GenerateConfig("x"))
    (st.root / "skipsets" / "x").mkdir(parents=True)
    (st.root / "skipsets" / "x" / "manifest.json").write_text(json.dumps(
        {"model_fingerprint": "f", "speedup_estimate": "fast"}))
    assert st.best_for_model("skipsets", "f", "speedup_estimate").id == "x"   # no TypeError


def test_schema_messages_name_json_types():
    from specctl.io.schema import fields, integer, list_of
    with pytest.raises(SchemaError, match=r"a\[0\]: must be an integer, got a string \('1'\)"):
        fields({"a": ["1"]}, {"a": list_of(integer())})
