"""--method auto: the fastest method on a pilot of the job's own prompts
(runtime/control/auto.py)."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from specctl.cli import app
from specctl.runtime.control import auto
from specctl.runtime.control.auto import Pilot, choose, explain
from specctl.speculative.draft_verify import SkipSet

TEXTS = ("one two three", "a b a b a b a b", "x", "the cat sat on the mat and the cat")


def test_choose_takes_the_fastest_and_ar_on_a_tie():
    ar = Pilot("ar", 8, tokens=100, seconds=1.0)
    sd = Pilot("self-draft", 8, tokens=150, seconds=1.0)
    dv = Pilot("draft-verify", 8, tokens=90, seconds=1.0)
    kg = Pilot("kangaroo", skipped="no Kangaroo adapter for this model in the store")
    assert choose([ar, sd, dv, kg]).method == "self-draft"
    assert choose([ar, Pilot("self-draft", 8, tokens=100, seconds=1.0)]).method == "ar"
    assert choose([dv, ar]).method == "ar"
    line = explain(sd, [ar, sd, dv, kg])
    assert line.startswith("--method auto: self-draft")
    assert "self-draft 150.0 tok/s (1.50x ar)" in line and "draft-verify" in line
    assert "kangaroo: no Kangaroo adapter" in line


@pytest.fixture
def job(tmp_path, tiny_llama):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS))
    store = tmp_path / "store"
    common = ["--model", str(tiny_llama), "--store", str(store), "--max-tokens", "8",
              "--device", "cpu", "--dtype", "fp32", "-q", "-b", "2"]

    def run(*args, out="o.jsonl"):
        out = tmp_path / out
        r = CliRunner().invoke(app, ["generate", str(prompts), "-o", str(out), *common, *args])
        assert r.exit_code == 0, r.output
        return [json.loads(l)["text"] for l in out.read_text().splitlines()], r.output
    return run, store, tmp_path


def _metrics(store, method):
    return [json.loads(f.read_text()) for f in (store / "runs").glob("*/metrics.json")
            if json.loads(f.read_text())["method"] == method]


def test_a_small_job_runs_ar_without_a_pilot(job, monkeypatch):
    """4 prompts x 8 tokens: the pilot passes of every method would cost more than the job
    (and a quarter of it is the most they may cost)."""
    run, store, _ = job
    monkeypatch.setattr(auto, "pilot", lambda *a, **kw: pytest.fail("piloted a small job"))
    got, said = run("--method", "auto")
    assert "--method auto: ar, without a pilot" in " ".join(said.split())
    (m,) = _metrics(store, "ar")
    assert m["method_auto"] == {"chosen": "ar", "pilot_s": 0.0, "pilots": [], "small_job": 32}


def test_auto_pilots_every_method_with_artifacts_and_answers_as_ar(job, monkeypatch):
    monkeypatch.setattr(auto, "PILOT_SHARE", 1e9)
    run, store, tmp = job
    ref, _ = run("--method", "ar", out="ar.jsonl")
    skip = tmp / "skip.json"
    skip.write_text(json.dumps(SkipSet(4, attn=frozenset({1})).to_json()))
    got, said = run("--method", "auto", "--skip-set", str(skip))
    assert got == ref
    assert "--method auto:" in said and "kangaroo: no Kangaroo adapter" in said
    (m,) = [m for f in (store / "runs").glob("*/metrics.json")
            if "method_auto" in (m := json.loads(f.read_text()))]
    a = m["method_auto"]
    assert m["method"] == a["chosen"]
    ran = {p["method"]: p for p in a["pilots"] if "skipped" not in p}
    assert set(ran) == {"ar", "self-draft", "draft-verify"}
    assert all(p["tokens"] > 0 and p["seconds"] > 0 and p["prompts"] == 4 for p in ran.values())
    rates = {m: p["tokens_per_s"] for m, p in ran.items()}
    best = max(rates, key=rates.get)
    assert a["chosen"] == ("ar" if rates["ar"] >= rates[best] else best)


def test_auto_runs_the_pilots_winner_and_resumes_its_run(job, monkeypatch):
    monkeypatch.setattr(auto, "PILOT_SHARE", 1e9)
    run, store, _ = job
    ref, _ = run("--method", "ar", out="ar.jsonl")

    def rigged(cfg, model, tk, drafters, records, **profiles):   # self-draft wins the race
        return [Pilot(m, 4, tokens=200 if m == "self-draft" else 100, seconds=1.0)
                for m in drafters]
    monkeypatch.setattr(auto, "pilot", rigged)
    got, said = run("--method", "auto", "--limit", "2")
    assert got == ref[:2]
    assert "--method auto: self-draft" in said
    (m,) = _metrics(store, "self-draft")
    assert m["method_auto"]["chosen"] == "self-draft"

    def no_pilot(*a, **kw):
        raise AssertionError("a resumed auto run pilots nothing")
    monkeypatch.setattr(auto, "pilot", no_pilot)
    # (the job's run with the most answers: ar's, complete, over self-draft's newer 2 of 4;
    # it took the newest and made 2 answers again)
    got, said = run("--method", "auto", "--resume")
    said = " ".join(said.split())
    assert got == ref and "resuming the ar run" in said and "already complete" in said
    # (and where self-draft's is the furthest on, self-draft's)
    for f in (store / "runs").glob("ar-*/records*.jsonl"):
        f.write_text("".join(f.read_text().splitlines(True)[:1]))
    got, said = run("--method", "auto", "--resume")
    assert got == ref and "resuming the self-draft run" in said
    assert len(list((store / "runs").iterdir())) == 2   # ar's, and self-draft's resumed
    # (its metrics, written again as it ends, keep the race that chose it: its manifest has
    # it, for a run killed before its first metrics.json)
    (m,) = _metrics(store, "self-draft")
    assert m["method_auto"]["chosen"] == "self-draft" and m["method_auto"]["pilots"]


def test_pilots_leave_the_jobs_drafter_untouched(tiny_llama, tmp_path):
    """Each pilot pass runs a fresh drafter: Self-Draft's context cache, filled with the
    pilot's own answers, would otherwise draft those answers perfectly in the job."""
    from specctl.engine.loader import load_model
    from specctl.runtime.jobs.config import GenerateConfig
    from specctl.runtime.jobs.tokenization import Tokenization
    from specctl.io.prompts import prompt_record
    from specctl.store import Store

    model = load_model(tiny_llama, "cpu", "fp32")
    cfg = GenerateConfig(input="-", model=str(tiny_llama), method="auto", max_tokens=8,
                         batch_size=2, chat=False)
    drafters, said, skipped = auto.candidates(cfg, model, tiny_llama, Store(tmp_path / "s"))
    assert set(drafters) == {"ar", "self-draft"}
    assert {p.method for p in skipped} == {"draft-verify", "kangaroo"}
    records = [prompt_record({"prompt": t}, i) for i, t in enumerate(TEXTS)]
    tk = Tokenization(tiny_llama, False)
    pilots = auto.pilot(cfg, model, tk, drafters, records, store=Store(tmp_path / "s"),
                        fingerprint="fp")
    assert [p.method for p in pilots] == ["ar", "self-draft"]
    assert len(drafters["self-draft"].ctx) == 0


def test_a_pass_slowed_by_a_neighbour_does_not_decide_the_race(tiny_llama, tmp_path,
                                                              monkeypatch):
    """The methods' passes take turns, and of each method's timed passes the quicker counts: a
    burst on a shared CPU during one timed pass of `ar` once made a method that accepted
    nothing "154x ar"."""
    from specctl.engine.loader import load_model
    from specctl.runtime.jobs.config import GenerateConfig
    from specctl.runtime.jobs.tokenization import Tokenization
    from specctl.io.prompts import prompt_record
    from specctl.store import Store

    model = load_model(tiny_llama, "cpu", "fp32")
    cfg = GenerateConfig(input="-", model=str(tiny_llama), method="auto", max_tokens=8,
                         batch_size=2, chat=False)
    drafters, _, _ = auto.candidates(cfg, model, tiny_llama, Store(tmp_path / "s"))
    order, real, burst = [], auto.make_runner, [0.0]

    class Clock:   # (the pilot's clock, with a neighbour's burst of 1,000 s in one pass)
        @staticmethod
        def perf_counter():
            return time.perf_counter() + burst[0]

    def runner(pcfg, model, drafter, *a, **kw):
        r = real(pcfg, model, drafter, *a, **kw)
        order.append(drafter.name)
        if order[-1] == "ar" and order.count("ar") == 2:   # ar's first timed pass
            run = r.run

            def slow(*a, **kw):
                out = run(*a, **kw)
                burst[0] += 1000.0
                return out
            r.run = slow
        return r
    monkeypatch.setattr(auto, "make_runner", runner)
    monkeypatch.setattr(auto, "time", Clock)
    records = [prompt_record({"prompt": t}, i) for i, t in enumerate(TEXTS)]
    pilots = auto.pilot(cfg, model, Tokenization(tiny_llama, False), drafters, records,
                        store=Store(tmp_path / "s"), fingerprint="fp")
    assert order == ["ar", "self-draft"] * auto.PILOT_PASSES
    ar = next(p for p in pilots if p.method == "ar")
    assert 0 < ar.seconds < 1000.0 and ar.tokens > 0 and burst[0] == 1000.0


def test_auto_with_a_named_artifact_that_is_missing_is_an_error(job, tiny_llama):
    run, store, tmp = job
    r = CliRunner().invoke(app, ["generate", str(tmp / "p.jsonl"), "--method", "auto",
                                 "--adapter", "no-such-adapter", "--model", str(tiny_llama),
                                 "--store", str(store), "--device", "cpu", "-q"])
    assert r.exit_code != 0 and "no-such-adapter" in r.output
