"""`specctl bench` and `specctl report` end to end on the tiny random Llama (CPU): the stored
fields, exact repeatability of the acceptance numbers, the outputs-match check catching a broken
method, skipped methods with reasons, per-category rows, and report's tables, markdown and plots."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import specctl.bench.peers as peers
from helpers import fails
from specctl.bench import compare, spread
from specctl.cli import app
from specctl.speculative.draft_verify import SkipSet
from specctl.speculative.drafter import NoDraft
from specctl.runtime.step.sequence import Request

runner = CliRunner(env={"COLUMNS": "200"})

ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem", "Make it shorter"]},
    {"prompt": "The quick brown fox", "category": "reasoning"},
    {"prompt": "To be or not to be", "category": "writing"},
    {"prompt": "A journey of a thousand miles", "category": "reasoning"},
    {"messages": [{"role": "user", "content": "Paris is the capital of"}], "category": "math"},
]
ROW_KEYS = {"method", "engine", "batch_size", "requests", "new_tokens", "steps", "tokens_per_s",
            "wall_s", "speedup_vs_ar", "speedup_runs", "mean_accepted_tokens", "acceptance_rate", "ctar",
            "zero_accept_share", "padding_ratio", "peak_memory_mb", "run_memory_mb",
            "exact", "matches_ar", "matches_ar_b1", "mismatch", "repeats_identical", "speculation",
            "effective_batch", "drain_bound", "captures", "captures_runs", "time_split",
            "accepted_from"}
ACCEPT_KEYS = ("new_tokens", "steps", "mean_accepted_tokens", "acceptance_rate", "ctar",
               "zero_accept_share", "padding_ratio")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(r):
    assert r.exit_code == 0, r.output
    assert r.exception is None, r.exception
    return r


def benches(store: Path) -> list[Path]:
    d = store / "benches"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and lose a lot when other processes hold the CPUs."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def prompts(work) -> Path:
    p = work / "prompts.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def skip_file(work) -> Path:
    # no sublayer skipped: the drafter is the target itself, so drafts are accepted
    p = work / "skip.json"
    p.write_text(json.dumps(SkipSet(4).to_json()))
    return p


def bench(prompts, store, model, *extra):
    return invoke("bench", prompts, "--model", model, "--store", store, "--max-tokens", 6,
                  "--repeats", 2, "--warmup", 1, "--device", "cpu", "--dtype", "fp32", "-q",
                  *extra)


SPEC = ("--methods", "ar,draft-verify", "--batch-sizes", "1,3", "--gamma0", 0, "--max-draft", 4,
        "--speculate", "fixed")


@pytest.fixture(scope="module")
def full(work, prompts, skip_file, tiny_llama):
    store = work / "store"
    r = ok(bench(prompts, store, tiny_llama, "--methods", "ar,draft-verify,hf,hf-prompt-lookup",
                 "--batch-sizes", "1,3", "--skip-set", skip_file, "--gamma0", 0,
                 "--max-draft", 4, "--speculate", "fixed"))   # (drafting whatever it costs)
    (d,) = benches(store)
    return {"r": r, "store": store, "dir": d, "res": json.loads((d / "results.json").read_text())}


def test_bench_writes_the_expected_fields(full):
    res, d = full["res"], full["dir"]
    assert (d / "manifest.json").is_file() and (d / "table.md").is_file()
    man = json.loads((d / "manifest.json").read_text())
    assert man["kind"] == "bench" and man["id"] == d.name == res["id"]
    assert res["ok"] is True and res["prompts"] == len(ROWS)
    assert res["categories"] == ["math", "reasoning", "writing"]
    assert res["peak_memory_kind"] == "process_rss_high_water"
    got = {(r["method"], r["batch_size"]) for r in res["rows"]}
    assert got == {("ar", 1), ("draft-verify", 1), ("hf", 1), ("hf-prompt-lookup", 1),
                   ("ar", 3), ("draft-verify", 3), ("hf", 3)}
    assert res["skipped"] == [{"method": "hf-prompt-lookup", "batch_size": 3,
                               "reason": "transformers' prompt lookup decoding supports batch "
                                         "size 1 only"}]
    for r in res["rows"]:
        assert set(r) == ROW_KEYS, r["method"]
        t = r["tokens_per_s"]
        assert len(t["runs"]) == 2 and t["min"] <= t["median"] <= t["max"] and t["median"] > 0
        assert t["iqr"] >= 0 and t["spread_pct"] >= 0 and len(r["wall_s"]["runs"]) == 2
        assert r["repeats_identical"] and r["peak_memory_mb"] > 0
        assert r["requests"] == len(ROWS) and r["new_tokens"] > len(ROWS)
        if r["engine"] == "specctl":
            assert r["matches_ar"] and r["matches_ar_b1"] and r["mismatch"] is None
            assert set(r["ctar"]) == {str(w) for w in range(1, 7)}
            assert 0 <= r["zero_accept_share"] <= 1 and 0 <= r["padding_ratio"] < 1
            assert r["steps"] > 0
            ts = r["time_split"]   # (decode steps and prefill: within the first repeat's wall)
            assert ts["steps_s"] > 0 and ts["prefill_s"] > 0 and ts["prefill_forwards"] > 0
            assert ts["steps_s"] + ts["prefill_s"] <= r["wall_s"]["runs"][0] + 0.002   # (rounded)
            assert ts["learn_s"] == 0.0   # (a CPU learns at the step: no forward to hide it)
            assert ts["prefill_chunk"] == 512   # (a CPU's: runtime/jobs/sizing.prefill_chunk)
        else:
            assert r["engine"] == "transformers" and r["method"].startswith("hf")
            assert r["mean_accepted_tokens"] is None and r["ctar"] is None
            assert isinstance(r["matches_ar"], bool)
    by = {(r["method"], r["batch_size"]): r for r in res["rows"]}
    assert by[("ar", 1)]["speedup_vs_ar"] == 1.0 and by[("ar", 1)]["mean_accepted_tokens"] == 1.0
    dv = by[("draft-verify", 1)]
    assert dv["mean_accepted_tokens"] > 1.5 and dv["ctar"]["1"] > 0   # the drafter is the target
    assert dv["zero_accept_share"] < by[("ar", 1)]["zero_accept_share"] == 1.0
    import statistics   # paired: each round's ratio to ar's round, then their median
    pairs = [x / a for x, a in zip(dv["tokens_per_s"]["runs"],
                                   by[("ar", 1)]["tokens_per_s"]["runs"])]
    assert dv["speedup_runs"] == pytest.approx(pairs, rel=1e-3)
    assert dv["speedup_vs_ar"] == pytest.approx(statistics.median(pairs), rel=1e-3)
    assert by[("hf", 1)]["matches_ar"] and by[("hf-prompt-lookup", 1)]["matches_ar"]   # fp32
    # every method generated the same tokens
    assert len({r["new_tokens"] for r in res["rows"]}) == 1
    # per category: every (method, batch size, category)
    cats = {(c["method"], c["batch_size"], c["category"]) for c in res["category_rows"]}
    assert cats == {(m, b, c) for m, b in got for c in res["categories"]}
    for c in res["category_rows"]:
        assert c["tokens_per_s"]["median"] > 0 and c["speedup_vs_ar"] is not None
    assert sum(c["new_tokens"] for c in res["category_rows"]
               if c["method"] == "ar" and c["batch_size"] == 1) == by[("ar", 1)]["new_tokens"]
    # the printed table and notes
    out = " ".join(full["r"].output.split())
    assert "draft-verify" in out and "hf-prompt-lookup" in out and "per category" in out
    assert "skipped hf-prompt-lookup at batch size 3" in out and d.name in out


def test_acceptance_numbers_repeat_exactly(full, work, prompts, skip_file, tiny_llama):
    store = work / "store-again"
    ok(bench(prompts, store, tiny_llama, *SPEC, "--skip-set", skip_file))
    (d,) = benches(store)
    again = json.loads((d / "results.json").read_text())
    first = {(r["method"], r["batch_size"]): r for r in full["res"]["rows"]}
    for r in again["rows"]:
        ref = first[(r["method"], r["batch_size"])]
        assert {k: r[k] for k in ACCEPT_KEYS} == {k: ref[k] for k in ACCEPT_KEYS}
    same = [c for c in full["res"]["category_rows"] if c["method"] in ("ar", "draft-verify")]
    key = lambda c: (c["method"], c["batch_size"], c["category"])   # noqa: E731
    strip = lambda c: {k: c[k] for k in ("new_tokens", "mean_accepted_tokens", "ctar",  # noqa
                                         "zero_accept_share")}
    assert sorted(map(strip, sorted(again["category_rows"], key=key)), key=str) == \
        sorted(map(strip, sorted(same, key=key)), key=str)


class WrongToken(NoDraft):
    """A broken method: after its third step it changes sequence 0's last emitted token."""
    name = "broken"

    def __init__(self):
        self.calls = 0

    def observe_lean(self, seqs):   # (its every step `ar`'s)
        self.calls += 1
        if self.calls == 3:
            s = seqs[0]
            s.out_ids[-1] = (s.out_ids[-1] + 1) % 200
            s.pending = s.out_ids[-1]
        return None


def test_outputs_match_check_catches_a_broken_method(work, prompts, tiny_llama, monkeypatch):
    real = peers.make_drafter

    def make(cfg, *a, **kw):
        return WrongToken() if cfg.method == "draft-verify" else real(cfg, *a, **kw)
    monkeypatch.setattr(peers, "make_drafter", make)
    store = work / "store-broken"
    r = bench(prompts, store, tiny_llama, "--methods", "ar,draft-verify", "--batch-sizes", "1",
              "--repeats", 1)
    err = fails(r, "outputs differ from ar greedy", "draft-verify b1", "benches")
    assert r.exit_code == 1 and "1 of 5 prompts" in err
    (d,) = benches(store)                      # the run is stored all the same
    res = json.loads((d / "results.json").read_text())
    assert res["ok"] is False
    by = {r["method"]: r for r in res["rows"]}
    assert by["ar"]["matches_ar"] and by["ar"]["mismatch"] is None
    bad = by["draft-verify"]
    assert bad["matches_ar"] is False and bad["matches_ar_b1"] is False
    assert bad["mismatch"]["first"]["index"] == 0 and bad["mismatch"]["prompts"] == 1
    # the divergence is no near-tie: fp32 logits far apart (a bug, not rounding)
    div = bad["divergence"]
    assert div["vs"] == "ar b1" and div["analyzed"] == 1 and div["gaps"][0]["index"] == 0
    assert div["max_steps"] > 1000 and div["max_gap"] > 1e-3
    assert div["near_ties"] is False and div["gaps"][0]["near_tie"] is False
    assert "NO (1/5 vs ar b1; gap up to" in (d / "table.md").read_text()


def test_exact_rows_are_checked_against_ar_exact_in_bf16(work, prompts, tiny_llama,
                                                         monkeypatch):
    """:exact rows compare with ar:exact (plain bf16 ar may differ from them) and, unlike plain
    bf16 rows, fail the bench when their tokens differ."""
    def run(store, methods, sizes):
        return invoke("bench", prompts, "--model", tiny_llama, "--store", store,
                      "--max-tokens", 6, "--repeats", 1, "--warmup", 0, "--device", "cpu",
                      "--dtype", "bf16", "-q", "--methods", methods, "--batch-sizes", sizes,
                      "--corpus-cache", "none")
    r = ok(run(work / "store-exact", "ar,ar:exact,self-draft:auto:exact", "1,3"))
    assert "--warmup 0: each method's first timed run" in " ".join(r.output.split())
    (d,) = benches(work / "store-exact")
    by = {(r["method"], r["batch_size"]): r
          for r in json.loads((d / "results.json").read_text())["rows"]}
    assert by[("ar:exact", 3)]["exact"] and not by[("ar", 3)]["exact"]
    assert by[("ar:exact", 3)]["speedup_vs_ar"] is not None   # the cost of --exact
    for key in (("ar:exact", 3), ("self-draft:auto:exact", 1), ("self-draft:auto:exact", 3)):
        assert by[key]["matches_ar"] and by[key]["matches_ar_b1"], by[key]["mismatch"]

    # fp32: skipped with the reason where this machine's fp32 matmuls cannot be made invariant
    # (and then `ar` alone ran: the bench fails, a script must not read it as a pass)
    r = bench(prompts, work / "store-exact-fp32", tiny_llama, "--methods", "ar,ar:exact",
              "--batch-sizes", "1", "--repeats", 1)
    (d,) = benches(work / "store-exact-fp32")
    res = json.loads((d / "results.json").read_text())
    skipped = [s for s in res["skipped"] if s["method"] == "ar:exact"]
    assert r.exit_code == 0 and skipped == [] and len(res["rows"]) == 2 or \
        "fp32 matmuls" in skipped[0]["reason"] and r.exit_code != 0 and \
        "only ar ran: every method to compare with it was skipped" in r.output, r.output

    # a global --exact with --dtype auto loads bf16, as `generate --exact` does (a probe saw
    # it load fp32 on this CPU and skip every row)
    ok(bench(prompts, work / "store-exact-auto", tiny_llama, "--methods", "ar,self-draft",
             "--batch-sizes", "1", "--repeats", 1, "--exact", "--corpus-cache", "none",
             "--dtype", "auto"))
    (d,) = benches(work / "store-exact-auto")
    res = json.loads((d / "results.json").read_text())
    assert res["dtype"] == "bfloat16" and res["skipped"] == [], res["skipped"]
    assert [r["exact"] for r in res["rows"]] == [True, True]
    # (in fp32 on a machine whose fp32 cannot be made invariant every row is skipped: then
    # the bench fails, where it exited 0 with an empty table)
    r = bench(prompts, work / "store-exact-none", tiny_llama, "--methods", "ar",
              "--batch-sizes", "1", "--repeats", 1, "--exact")
    assert r.exit_code == 0 or "no row ran: every method was skipped" in r.output, r.output

    real = peers.make_drafter
    monkeypatch.setattr(peers, "make_drafter", lambda cfg, *a, **kw: WrongToken()
                        if cfg.method == "self-draft" else real(cfg, *a, **kw))
    r = run(work / "store-exact-broken", "self-draft:exact", "1")   # (ar:exact is added)
    fails(r, "outputs differ from ar greedy", "self-draft:exact b1 vs ar:exact b1")


def test_divergence_gap_is_the_models_logit_gap_at_the_first_difference(tiny_llama, model):
    """Against transformers' own forward of the checkpoint: the gap between the reference's token
    and the other's, at the first differing position, after the common prefix."""
    import torch
    from transformers import AutoModelForCausalLM

    from specctl.bench import divergence_gaps
    from specctl.io.prompts import read_prompts
    from specctl.runtime.jobs.tokenization import Tokenization

    tk = Tokenization(tiny_llama, True)
    p = Path(tiny_llama) / "div.jsonl"
    p.write_text(json.dumps({"prompt": "The quick brown fox"}) + "\n"
                 + json.dumps({"prompt": "To be or not to be"}) + "\n")
    recs = read_prompts(p)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    prompt = tk.render(Request(recs[1].index, [list(t) for t in recs[1].turns], 1))
    ref_ids = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):]
    ref_ids = ref_ids.tolist()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + ref_ids[:3]])).logits[0, -1]
    alt = int(logits.topk(2).indices[1])                 # the runner-up at position 3
    got = {1: [ref_ids[:3] + [alt] + ref_ids[4:]], 0: [[5, 6]]}
    ref = {1: [ref_ids], 0: [[5, 6]]}                    # request 0 equal: not analyzed
    (g,) = divergence_gaps(model, tk.render, recs, got, ref)
    assert g["index"] == 1 and g["token"] == 3
    assert abs(g["gap"] - float(logits[ref_ids[3]] - logits[alt])) < 1e-4 and g["gap"] >= 0
    assert g["step"] == torch.finfo(torch.float32).eps * 2.0 ** math.floor(
        math.log2(float(logits.max())))


def test_a_near_tie_is_told_from_a_real_difference_by_what_a_batch_shape_moves(tiny_llama):
    """tie_gap: two tokens made to tie (the same head row plus 1e-7 of noise: the fp32 argmax
    between them follows rounding) are a near-tie; the model's runner-up is not. The shape
    term is measured: this CPU's fp32 GEMMs round a row by the matrix's row count, so a row
    computed behind others moves (on some machines by 0: then the rounding steps decide)."""
    import torch
    from specctl.bench.analysis import tie_gap
    from specctl.engine.batch import ForwardBatch, SeqInput
    from specctl.engine.loader import load_model
    m = load_model(tiny_llama, "cpu", "fp32")
    ids = [3, 17, 5, 9, 11, 2, 8]
    top2 = m.logits(m.forward(ForwardBatch([SeqInput(0, ids, 0)], m.device),
                              m.new_kv_cache(1, 16))[-1:])[0].topk(2).indices.tolist()
    real = tie_gap(m, ids, top2[0], top2[1])
    assert real["gap"] > 0 and not real["near_tie"] and real["shape"] < 1e-3, real
    a, b = top2
    with torch.inference_mode():
        m.lm_head[b] = m.lm_head[a] + 1e-7 * torch.randn_like(m.lm_head[a])
    tie = tie_gap(m, ids, a, b)
    assert tie["near_tie"] and abs(tie["gap"]) < 1e-5, tie


def test_missing_artifact_skips_the_method(tmp_path, prompts, tiny_llama):
    """Skipped with its reason, and the bench kept; as nothing was left to compare with `ar`,
    it fails (it exited 0: a script read a typo'd --skip-set as a pass)."""
    r = bench(prompts, tmp_path / "store", tiny_llama, "--methods", "draft-verify",
              "--batch-sizes", "2", "--repeats", 1, "--warmup", 0)
    out = " ".join(r.output.split())
    assert "ar is added" in out and "skipping draft-verify" in out and "search-skip" in out
    assert r.exit_code != 0 and "only ar ran: every method to compare with it was skipped " \
        "(draft-verify: " in out, out
    # (ar:exact, added as the :exact rows' baseline, is not a method compared either)
    r = bench(prompts, tmp_path / "store2", tiny_llama, "--methods", "draft-verify:exact",
              "--batch-sizes", "2", "--repeats", 1, "--warmup", 0, "--dtype", "bf16")
    assert r.exit_code != 0 and "skipped (draft-verify:exact: " in " ".join(r.output.split())
    # (a skip set the command names that is not there: an error before anything runs, as in
    # generate; it was skipped, and the other methods' bench exited 0)
    r = bench(prompts, tmp_path / "store3", tiny_llama, "--methods", "ar,self-draft,draft-verify",
              "--skip-set", tmp_path / "typo.json", "--batch-sizes", "2", "--repeats", 1,
              "--warmup", 0)
    out = " ".join(r.output.split())
    assert r.exit_code != 0 and "typo.json: no such file or folder" in out, out
    assert not (tmp_path / "store3" / "benches").exists()
    r = bench(prompts, tmp_path / "store4", tiny_llama, "--methods",
              "ar,self-draft,self-draft:no-corpus",
              "--corpus-cache", tmp_path / "typo-cache", "--batch-sizes", "2", "--repeats", 1,
              "--warmup", 0)
    out = " ".join(r.output.split())
    assert r.exit_code != 0 and "typo-cache: no such file or folder" in out, out
    (d,) = benches(tmp_path / "store")
    res = json.loads((d / "results.json").read_text())
    assert [(x["method"], x["batch_size"]) for x in res["rows"]] == [("ar", 2)]
    assert res["skipped"][0]["method"] == "draft-verify" and "search-skip" in res["skipped"][0]["reason"]
    assert res["reference"].startswith("ar at batch size 1 (one untimed")
    assert res["rows"][0]["matches_ar_b1"] is True


def test_report_tables_and_markdown(full, tmp_path):
    store, ident = full["store"], full["dir"].name
    md = tmp_path / "BENCH.md"
    r = ok(invoke("report", ident[:-2], "--store", store, "--md", md, "--no-plots"))
    out = " ".join(r.output.split())
    assert ident in out and "hf-prompt-lookup" in out and "per category" in out
    text = md.read_text()
    assert text.startswith(f"### {ident}") and "| method | batch | tokens/s |" in text
    assert "| draft-verify | 3 |" in text and "Per category:" in text
    # where each specctl row's time went; transformers rows have no split
    assert "Where the time went" in text and "| method | batch | wall s | decode steps s |" in text
    split = text.split("Where the time went")[1]
    assert "| ar | 1 |" in split and "| draft-verify | 3 |" in split and "| hf |" not in split
    # the steps' own speedup beside the wall's: ar's decode seconds over the row's
    import re
    assert re.search(r"\| ar \| 1 \| [0-9.]+ \| [0-9.]+ \| 1\.00x \|", split), split
    from specctl.bench.report import time_rows
    res = json.loads((full["dir"] / "results.json").read_text())
    ar = {r["batch_size"]: r["time_split"]["steps_s"] for r in res["rows"]
          if r["method"] == "ar" and r.get("time_split")}
    got = {(r[0], int(r[1])): r[4] for r in time_rows(res)}
    checked = 0
    for r in res["rows"]:
        if r["method"] != "ar" and r.get("time_split") and r["batch_size"] in ar:
            want = ar[r["batch_size"]] / r["time_split"]["steps_s"]
            assert got[(r["method"], r["batch_size"])] == f"{want:.2f}x", r["method"]
            checked += 1
    assert checked
    assert text == (full["dir"] / "table.md").read_text()   # what bench stored
    r = ok(invoke("store", "ls", "--kind", "benches", "--store", store))
    assert ident in r.output


def test_report_plots(full, tmp_path):
    pytest.importorskip("matplotlib")
    store, ident = full["store"], full["dir"].name
    plots = tmp_path / "plots"
    ok(invoke("report", ident, "--store", store, "--plots", plots))
    for name in ("speedup.png", "category_tokens_per_s.png"):
        p = plots / f"{ident}-{name}"
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # default: the latest run, plots into its folder in the store
    ok(invoke("report", "--store", store))
    assert (full["dir"] / "speedup.png").is_file()
    assert (full["dir"] / "category_tokens_per_s.png").is_file()


def test_report_without_matplotlib(full, tmp_path, monkeypatch):
    """--plots asked for and impossible: an error with the install hint whole (rich must not
    take "[plot]" for markup); plots not asked for: a warning, the tables, exit 0."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    md = tmp_path / "report.md"
    err = fails(invoke("report", full["dir"].name, "--store", full["store"], "--plots",
                       tmp_path / "plots", "--md", md), "matplotlib is not installed", "--no-plots")
    assert "pip install 'specctl[plot]'" in err
    assert not (tmp_path / "plots").exists() and not md.exists()   # (refused before writing)
    fails(invoke("report", full["dir"].name, "--store", full["store"], "--plots",
                 tmp_path / "plots", "--no-plots"), "pass one")
    r = ok(invoke("report", full["dir"].name, "--store", full["store"]))
    assert "pip install 'specctl[plot]'" in " ".join(r.output.split())


def test_report_errors(tmp_path, full):
    fails(invoke("report", "--store", tmp_path / "empty"), "no bench runs", "specctl bench")
    fails(invoke("report", "nope", "--store", full["store"]), "nope")
    # where it writes, said first and as itself: a file as --plots, a pipe as --md
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    fails(invoke("report", full["dir"].name, "--store", full["store"], "--plots", afile),
          "is no folder")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fails(invoke("report", full["dir"].name, "--store", full["store"], "--md", fifo,
                 "--no-plots"), "FIFO")


@pytest.mark.parametrize("opts, needle", [
    (["--methods", "ar,nope"], "nope"),
    (["--methods", "ar,ar"], "twice"),
    (["--batch-sizes", "0"], "--batch-sizes"),
    (["--batch-sizes", "a,b"], "--batch-sizes"),
    (["--batch-sizes", "1,,4"], "an empty item"),
    (["--batch-sizes", "1,8,1"], "--batch-sizes names a batch size twice"),
    (["--repeats", "0"], "--repeats"),
    (["--alpha", "2"], "alpha"),
])
def test_bench_invalid_options(tmp_path, prompts, tiny_llama, opts, needle):
    fails(bench(prompts, tmp_path / "store", tiny_llama, *opts), needle)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("cmd", ["bench", "report"])
def test_help_shows_an_example(cmd):
    r = ok(invoke(cmd, "--help"))
    assert "Example" in r.output and f"specctl {cmd}" in r.output


def test_compare_and_spread():
    ref = {0: [[1, 2, 3]], 1: [[4, 5], [6]]}
    assert compare({0: [[1, 2, 3]], 1: [[4, 5], [6]]}, ref, "ar b1") is None
    d = compare({0: [[1, 2, 3]], 1: [[4, 5], [7, 8]]}, ref, "ar b1")
    assert d == {"vs": "ar b1", "prompts": 1, "of": 2, "first": {"index": 1, "turn": 1, "token": 0}}
    d = compare({0: [[1, 2]], 1: [[4, 5], [6]]}, ref, "ar b4")   # shorter: differs at its end
    assert d["first"] == {"index": 0, "turn": 0, "token": 2}
    s = spread([10.0, 12.0, 11.0])
    assert (s["median"], s["min"], s["max"], s["runs"]) == (11.0, 10.0, 12.0, [10.0, 12.0, 11.0])
    assert s["iqr"] == pytest.approx(1.0) and s["spread_pct"] == pytest.approx(100 * 2 / 11, abs=0.01)
    assert spread([5.0])["iqr"] == 0.0


def test_match_column_says_how_close_divergences_were():
    from specctl.bench.report import _match
    mm = {"vs": "ar b1", "prompts": 5, "of": 8, "first": None}
    row = {"matches_ar": False, "matches_ar_b1": False, "repeats_identical": True, "mismatch": mm}
    assert _match(row) == "NO (5/8 vs ar b1)"
    div = {"vs": "ar b1", "differing": 5, "analyzed": 5, "max_gap": 0.125, "max_steps": 1.0}
    assert _match({**row, "divergence": div}) == "NO (5/8 vs ar b1; near-ties, gap ≤ 0.125)"
    far = {**div, "max_gap": 3.5, "max_steps": 28.0, "analyzed": 4}
    assert _match({**row, "divergence": far}) == "NO (5/8 vs ar b1; gap up to 3.5 (4 of 5 read))"
    rep = {**row, "repeats_identical": False, "divergence": div}
    assert _match(rep) == "NO (repeats differ; vs ar b1: near-ties, gap ≤ 0.125)"
    own = {**rep, "mismatch": None, "divergence": {**div, "vs": "its first repeat"}}
    assert _match(own) == "NO (repeats differ; near-ties, gap ≤ 0.125)"


def test_bench_and_generate_build_the_same_runner(tmp_path, tiny_llama, monkeypatch):
    """A bench row times what `generate` runs: for the same options both build their runner
    through make_runner, with the same slots, KV rows and budget, threads, stop strings,
    prefill chunk and controller (method, budget cap, priced on the same step-cost table)."""
    import specctl.runtime.jobs.sizing as sizing
    built = []

    class Spy(sizing.Runner):
        def __init__(self, model, drafter, sampling, **kw):
            super().__init__(model, drafter, sampling, **kw)
            self.built = {**{k: v for k, v in kw.items() if k not in ("controller", "render",
                                                                       "decode")},
                          "drafter": drafter.signature(), "greedy": sampling.greedy}

        def run(self, *a, **kw):   # (by now the controller is set, however make_runner sets it)
            ctl = self.controller
            built.append({**self.built, "controller": None if ctl is None else
                          (ctl.K, ctl.tree, ctl.cost.table)})
            return super().run(*a, **kw)
    monkeypatch.setattr(sizing, "Runner", Spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n"
                               for t in ("one two three", "a b a b a b", "x")))
    skip = tmp_path / "skip.json"
    skip.write_text(json.dumps(SkipSet(4, frozenset({1})).to_json()))
    common = ["--model", str(tiny_llama), "--store", str(tmp_path / "store"), "--max-tokens", "6",
              "--device", "cpu", "--dtype", "fp32", "--skip-set", str(skip), "-q"]
    r = runner.invoke(app, ["generate", str(prompts), "--method", "draft-verify", "--speculate",
                            "auto", "-b", "2", "-o", str(tmp_path / "o.jsonl"), *common])
    assert r.exit_code == 0, r.output
    (gen,) = built
    built.clear()
    r = runner.invoke(app, ["bench", str(prompts), "--methods", "draft-verify:auto",
                            "--batch-sizes", "2", "--repeats", "1", "--warmup", "0", *common])
    assert r.exit_code == 0, r.output
    timed = [b for b in built if b["drafter"] == gen["drafter"]]   # (not ar's reference run)
    assert timed and all(b == gen for b in timed), (gen, timed)
    assert gen["controller"] is not None and gen["batch_size"] == 2
