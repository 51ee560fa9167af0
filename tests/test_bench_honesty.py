"""What a bench row stands on (bench/conditions.py): the batch it really ran at, drain-bound rows
(fewer than 4 x batch prompts) warned about and marked, CUDA graph shapes captured inside the
timed repeats counted and flagged, and the state a run carries stated with every table."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specctl.bench import CARRIED, BenchConfig, markdown, run_bench
from specctl.bench.conditions import batch_warnings, graph_captures, row_conditions
from specctl.bench.report import table_rows
from specctl.store import Store

PROMPTS = ("one two three", "a b a b a b", "x y z")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and lose a lot when other processes hold the CPUs."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _bench(tmp_path: Path, tiny_llama, **kw) -> tuple[dict, list[str]]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in PROMPTS))
    cfg = BenchConfig(str(prompts), model=str(tiny_llama), device="cpu", dtype="fp32",
                      **{"methods": ("ar",), "max_tokens": 4, "repeats": 2, "warmup": 0, **kw})
    said: list[str] = []
    return run_bench(cfg, Store(tmp_path / "store"), log=said.append), said


def test_rows_say_the_batch_they_ran_at_and_warn_when_drain_bound(tmp_path, tiny_llama):
    res, said = _bench(tmp_path, tiny_llama, batch_sizes=(1, 2, 8), repeats=1)
    rows = {r["batch_size"]: r for r in res["rows"]}
    assert {b: (r["effective_batch"], r["drain_bound"]) for b, r in rows.items()} == \
        {1: (1, False), 2: (2, True), 8: (3, True)}
    warned = [m for m in said if m.startswith("warning: batch size")]
    assert len(warned) == 2   # one per batch size, through the reporting protocol
    assert "batch size 2: 3 prompts < 4 x 2" in warned[0]
    assert "batch size 8 is more than the 3 prompts: its rows run at batch 3" in warned[1]
    cells = {r[1] for r in table_rows(res)}
    assert cells == {"1", "2†", "8 (ran 3)†"}
    md = markdown([res])
    assert "† drain-bound: 3 prompts < 4 x batch" in md
    assert "(ran 3): the batch size is more than the 3 prompts" in md


def test_enough_prompts_say_nothing():
    assert batch_warnings(32, [1, 8]) == [] and batch_warnings(2, [1]) == []
    assert batch_warnings(32, [16]) and batch_warnings(32, [64])[0].startswith(
        "warning: batch size 64 is more than the 32 prompts")
    assert row_conditions(32, 8, [0, 2]) == {"effective_batch": 8, "drain_bound": False,
                                             "captures": 2, "captures_runs": [0, 2]}


def test_captures_inside_timed_repeats_are_counted_and_flagged(tmp_path, tiny_llama,
                                                               monkeypatch):
    """Shapes captured while a runner is built (untimed) are not counted; shapes captured
    while it runs are, per repeat. (The model's capture counter is stood in for, so the test
    holds whatever the runner's capture policy.)"""
    import specctl.bench.peers as peers
    import specctl.runtime.jobs.sizing as sizing
    shapes = [0]
    monkeypatch.setattr(peers, "graph_captures", lambda model: shapes[0])
    timed_runs = []

    class Capturing(sizing.Runner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            shapes[0] += 5                      # at start-up, before the clock
        def run(self, *a, **kw):
            timed_runs.append(1)
            shapes[0] += 3 if len(timed_runs) == 1 else 0   # the first repeat meets new shapes
            return super().run(*a, **kw)
    monkeypatch.setattr(sizing, "Runner", Capturing)
    res, said = _bench(tmp_path, tiny_llama, batch_sizes=(1,))
    (row,) = res["rows"]
    assert row["captures_runs"] == [3, 0] and row["captures"] == 3
    assert table_rows(res)[0][-2] == "3 !"
    assert "captures !: CUDA graph shapes captured inside the row's timed repeats" in \
        markdown([res])
    assert any("3 CUDA graph shapes captured inside its timed repeats" in m for m in said)


def test_rows_without_graphs_count_no_captures(tmp_path, tiny_llama):
    res, _ = _bench(tmp_path, tiny_llama, batch_sizes=(1,))
    assert res["rows"][0]["captures"] == 0 and res["rows"][0]["captures_runs"] == [0, 0]
    assert table_rows(res)[0][-2] == "0"


def test_graph_captures_counts_the_graphs_exact_sets_aside():
    """--exact swaps the model's graphs out (Model._graphs) and back: the count must not read
    the swap as captures, and prefers the graphs' own counter over the size of their cache."""
    g = SimpleNamespace(captures=7, cache={1: 0, 2: 0})
    assert graph_captures(SimpleNamespace(graphs=g, _graphs=None)) == 7
    assert graph_captures(SimpleNamespace(graphs=None, _graphs=g)) == 7
    assert graph_captures(SimpleNamespace(graphs=SimpleNamespace(cache={1: 0}))) == 1
    assert graph_captures(SimpleNamespace(graphs=None)) == 0


def test_every_table_states_what_carries_across_runs(tmp_path, tiny_llama):
    from typer.testing import CliRunner

    from specctl.cli import app
    res, _ = _bench(tmp_path, tiny_llama, batch_sizes=(1,), repeats=1)
    md = markdown([res])
    assert md.splitlines()[2] == CARRIED and "fresh drafter and controller" in CARRIED
    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["report", res["id"], "--store",
                                                       str(tmp_path / "store"), "--no-plots"])
    assert r.exit_code == 0, r.output
    assert " ".join(CARRIED.split()[:8]) in " ".join(r.output.split())


def test_old_results_without_the_fields_still_render():
    row = {"method": "ar", "batch_size": 8, "tokens_per_s": {"median": 1.0, "min": 1.0,
           "max": 1.0}, "speedup_vs_ar": 1.0, "mean_accepted_tokens": None, "ctar": None,
           "zero_accept_share": None, "padding_ratio": None, "peak_memory_mb": 1.0,
           "matches_ar": None}
    (cells,) = table_rows({"rows": [row]})
    assert cells[1] == "8" and cells[-2] == "-"


@pytest.mark.parametrize("warmup", [0, 1])
def test_a_warm_up_captures_the_timed_runs_graphs(tmp_path, tiny_llama, monkeypatch, warmup):
    """With graphs (a CPU stand-in that captures nothing), the warm-up's runner is sized as the
    timed runs' are: it keeps the model's KV cache, and with it every shape its runner captured
    at start, for the timed runs, whose runners then capture nothing (without a warm-up the
    first timed run's runner captures them, and the bench says how many, in what time)."""
    import specctl.engine.loader as loader
    from specctl.engine.graphs import CudaGraphs
    real = loader.load_model

    def with_graphs(*a, **kw):
        m = real(*a, **kw)
        m.graphs = CudaGraphs(m, capture=False)
        return m
    monkeypatch.setattr(loader, "load_model", with_graphs)
    # (120 tokens: the timed runs' cache is longer than the 16-token warm-up's would be)
    res, said = _bench(tmp_path, tiny_llama, batch_sizes=(2,), warmup=warmup, repeats=1,
                       methods=("ar", "self-draft"), max_tokens=120)
    started = [m for m in said if "CUDA graph shapes as it started" in m]
    if warmup:
        assert started == [], started
    else:
        assert [m.split(":")[0] for m in started] == ["ar b2", "self-draft b2"], started
    assert all(r["captures"] == 0 for r in res["rows"])


def test_a_speedup_of_rounds_that_disagree_is_marked_noisy():
    """Rounds of 2.37x and 0.93x (a busy 2-core CPU) make a median of 1.65x that says little:
    the row is marked ~ and a note says why; rounds within NOISY of each other are not."""
    from specctl.bench.report import _row_marks, _speedup
    row = lambda runs: {"method": "self-draft", "batch_size": 1,   # noqa: E731
                        "speedup_vs_ar": sorted(runs)[len(runs) // 2], "speedup_runs": runs}
    busy, calm = row([2.37, 0.93]), row([1.10, 1.18])
    assert _speedup(busy).endswith(" ~") and not _speedup(calm).endswith("~")
    marks = _row_marks({"rows": [busy, calm], "prompts": 64})
    assert any(m.startswith("~ noisy") and "self-draft b1" in m for m in marks)
    assert not any("noisy" in m for m in _row_marks({"rows": [calm], "prompts": 64}))
