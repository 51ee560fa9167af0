"""--exact's start-up check kept in the store (runtime/jobs/exactcheck.py): a later run on the
same machine, model and dtype takes the verdict without checking; any change of what decides
the kernels checks again; a refusal or an unreadable verdict is never taken."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specctl.cli import app
from specctl.engine import selfcheck
from specctl.engine.loader import load_model
from specctl.models.fingerprint import model_fingerprint
from specctl.runtime.jobs.exactcheck import exact_check_id, machine_facts, set_exact_kept
from specctl.store import Store


@pytest.fixture
def checks(monkeypatch) -> list:
    """Every self-check run from now on (each passes, as the real one does here)."""
    calls: list = []
    real = selfcheck.self_check

    def counted(model):
        calls.append(model)
        return real(model)
    monkeypatch.setattr(selfcheck, "self_check", counted)
    return calls


def kept_path(store, tiny_llama, m):
    return store.path("profiles", exact_check_id(model_fingerprint(tiny_llama),
                                                 machine_facts(m))) / "exact.json"


def test_a_kept_check_is_taken_without_checking_again(tiny_llama, tmp_path, checks):
    from helpers import random_prompts, run_ids
    store, fp = Store(tmp_path / "store"), model_fingerprint(tiny_llama)
    m = load_model(tiny_llama, "cpu", "bf16")
    set_exact_kept(m, store, fp)
    assert len(checks) == 1 and "on this model in" in m.exact_check
    assert json.loads(kept_path(store, tiny_llama, m).read_text()) == \
        {"linear": m._exact_linear.__name__}
    m2 = load_model(tiny_llama, "cpu", "bf16")
    set_exact_kept(m2, store, fp)
    assert len(checks) == 1 and m2.exact and m2._exact_linear is m._exact_linear
    assert "on this machine before" in m2.exact_check
    prompts = random_prompts(4, seed=5, max_len=30)
    assert run_ids(m2, prompts, batch_size=4, max_tokens=8)[0] == \
        run_ids(m, prompts, batch_size=1, max_tokens=8)[0]


def test_what_decides_the_kernels_keys_the_verdict(tiny_llama, tmp_path, checks, monkeypatch):
    store, fp = Store(tmp_path / "store"), model_fingerprint(tiny_llama)
    set_exact_kept(load_model(tiny_llama, "cpu", "bf16"), store, fp)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")   # (what oneDNN may use)
    set_exact_kept(load_model(tiny_llama, "cpu", "bf16"), store, fp)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    import torch
    n = torch.get_num_threads()
    try:   # (another thread count: the probe covered 1 and the run's count only)
        torch.set_num_threads(1 if n > 1 else 2)
        set_exact_kept(load_model(tiny_llama, "cpu", "bf16"), store, fp)
    finally:
        torch.set_num_threads(n)
    assert len(checks) == 3
    assert len(list((tmp_path / "store" / "profiles").iterdir())) == 3


@pytest.mark.parametrize("kept", ["{not json", '{"linear": "fast_linear"}',
                                  '{"linear": "linear2", "trust": true}', '{"linear": 2}'])
def test_an_unreadable_verdict_is_checked_again(tiny_llama, tmp_path, checks, kept):
    store, fp = Store(tmp_path / "store"), model_fingerprint(tiny_llama)
    m = load_model(tiny_llama, "cpu", "bf16")
    path = kept_path(store, tiny_llama, m)
    path.parent.mkdir(parents=True)
    path.write_text(kept)
    said = []
    set_exact_kept(m, store, fp, said.append)
    assert len(checks) == 1 and m.exact and "checking again" in said[0], said
    assert json.loads(path.read_text()) == {"linear": m._exact_linear.__name__}


def test_a_refusal_is_not_kept(tiny_llama, tmp_path, monkeypatch):
    store, fp = Store(tmp_path / "store"), model_fingerprint(tiny_llama)
    monkeypatch.setattr(selfcheck, "self_check",
                        lambda model: "layer 3's attention, a prompt's row alone vs among 16")
    with pytest.raises(ValueError, match="cannot hold here"):
        set_exact_kept(load_model(tiny_llama, "cpu", "bf16"), store, fp)
    assert not (tmp_path / "store" / "profiles").exists()


def test_generate_keeps_it_and_says_so(tiny_llama, tmp_path, checks):
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"prompt": w}) + "\n" for w in ("cats", "rain", "bread")))
    outs = []
    for i in range(2):
        out = tmp_path / f"o{i}.jsonl"
        r = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
            "generate", str(inp), "--model", str(tiny_llama), "--store", str(tmp_path / "s"),
            "--out", str(out), "--max-tokens", "8", "--device", "cpu", "--dtype", "bf16",
            "--exact", "-b", "3", "-q"])
        assert r.exit_code == 0, r.output
        assert ("on this machine before" in r.output) == (i == 1), r.output
        outs.append([json.loads(l)["token_ids"] for l in out.read_text().splitlines()])
        runs = sorted((tmp_path / "s" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
        m = json.loads((runs[-1] / "metrics.json").read_text())
        if i == 0:   # (the check is one-off work: out of tokens/s, as a step table is)
            assert m["one_off_s"]["exact_check"] > 0.05 and m["one_off_s"]["total"] >= \
                m["one_off_s"]["exact_check"]
        else:
            assert m["one_off_s"]["exact_check"] < 0.05
    assert len(checks) == 1 and outs[0] == outs[1]


def test_a_fixed_thread_count_is_the_one_checked(tiny_llama, tmp_path, monkeypatch):
    """--threads N: the check runs at N threads (its probe at 1, N // 2 and N), and the
    verdict is kept under N; the process's thread count is left as it was."""
    import torch
    seen = []
    real = selfcheck.self_check
    monkeypatch.setattr(selfcheck, "self_check",
                        lambda m: seen.append(torch.get_num_threads()) or real(m))
    inp = tmp_path / "p.jsonl"
    inp.write_text(json.dumps({"prompt": "cats"}) + "\n")
    before = torch.get_num_threads()
    r = CliRunner().invoke(app, [
        "generate", str(inp), "--model", str(tiny_llama), "--store", str(tmp_path / "s"),
        "--out", str(tmp_path / "o.jsonl"), "--max-tokens", "4", "--device", "cpu",
        "--dtype", "bf16", "--exact", "--threads", "1", "-q"])
    assert r.exit_code == 0, r.output
    assert seen == [1] and torch.get_num_threads() == before
    kept = [p.name for p in (tmp_path / "s" / "profiles").iterdir() if "exact-check" in p.name]
    assert len(kept) == 1 and "-t1-bfloat16-exact-check-" in kept[0], kept
