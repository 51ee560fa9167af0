"""train-adapter end to end on a tiny model; resume continues identically; a trained adapter
stays lossless; loss masking covers only assistant tokens."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from helpers import fails

from specctl.cli import app
from specctl.prep.adapter.train import encode

CONVS = [{"id": str(i), "conversations": [
    {"from": "human", "value": f"What is {i} plus {i}? Explain the answer step by step."},
    {"from": "gpt", "value": f"{i} plus {i} is {2 * i}. The quick brown fox jumps over the dog."},
    {"from": "human", "value": "Write a short poem about the sea."},
    {"from": "gpt", "value": "A journey of a thousand miles begins with a single step."}]}
    for i in range(12)]


@pytest.fixture()
def data(tmp_path):
    f = tmp_path / "sharegpt.json"
    f.write_text(json.dumps(CONVS))
    return f


def test_mask_covers_only_assistant_tokens(tiny_llama):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    msgs = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Paris"}]
    ids, pred = encode(tok, msgs, 512)
    targets = [ids[t + 1] for t, m in enumerate(pred) if m]
    answer = tok.encode("Paris", add_special_tokens=False)
    # exactly the answer's tokens and the end-of-turn marker the template puts after them
    assert targets[:len(answer)] == answer
    assert tok.decode(targets[len(answer):]).strip().startswith("<|im_end|>")
    prompt = tok.apply_chat_template(msgs[:1], add_generation_prompt=True, tokenize=False)
    assert not any(pred[:len(tok.encode(prompt, add_special_tokens=False)) - 1])


def _train(tiny, data, store, *extra):
    return CliRunner().invoke(app, ["train-adapter", "--model", str(tiny), "--data", str(data),
                                    "--exit-layer", "2", "--epochs", "2", "--lr", "1e-3",
                                    "--batch-tokens", "200", "--heldout", "0.2",
                                    "--checkpoint-every", "2", "--store", str(store),
                                    "--device", "cpu", *extra])


def test_estimate_only_says_how_long_and_trains_nothing(tiny_llama, data, tmp_path):
    r = _train(tiny_llama, data, tmp_path / "s", "--estimate")
    assert r.exit_code == 0, r.output
    assert "estimated time for the whole command" in r.output
    assert "--estimate: nothing trained" in r.output
    assert not (tmp_path / "s" / "adapters").exists()
    assert not list((tmp_path / "s").glob("work/train-*"))   # nothing left as if killed


def test_conversations_left_out_by_max_len_are_counted(tiny_llama, tmp_path):
    """A conversation whose first prompt uses up --max-len has no assistant token to learn:
    it is left out, and said so (it vanished without a word)."""
    long = " ".join(["word"] * 200)
    convs = CONVS[:4] + [{"id": f"l{i}", "conversations": [
        {"from": "human", "value": long}, {"from": "gpt", "value": "Short."}]} for i in range(3)]
    f = tmp_path / "mixed.json"
    f.write_text(json.dumps(convs))
    r = _train(tiny_llama, f, tmp_path / "s", "--max-len", "64", "--estimate")
    assert r.exit_code == 0, r.output
    assert "3 of 7 conversations left out: no assistant token within --max-len 64 tokens" in \
        " ".join(r.output.split())


def test_train_resume_and_generate(tiny_llama, data, tmp_path):
    r = _train(tiny_llama, data, tmp_path / "a")
    assert r.exit_code == 0, r.output
    (ad,) = list((tmp_path / "a" / "adapters").iterdir())
    log = json.loads((ad / "train_log.json").read_text())
    assert log["steps"] > 2 and 0.0 <= log["heldout_top1"] <= 1.0
    losses = [x["loss"] for x in log["log"] if "loss" in x]
    assert losses[-1] < losses[0]   # it learns
    full = load_file(str(ad / "adapter.safetensors"))
    # interrupted after the step-2 checkpoint, then resumed: the same final weights
    work = tmp_path / "b"
    r = _train(tiny_llama, data, work, "--epochs", "1")   # a first run that stops early ...
    assert r.exit_code == 0, r.output
    ck = next((work / "work").glob("train-*/ckpt-l2.json"))
    meta = json.loads(ck.read_text())
    assert meta["step"] >= 2
    r = _train(tiny_llama, data, work, "--resume")          # ... resumed to 2 epochs
    assert r.exit_code == 0 and "resuming at step" in r.output, r.output
    # a resume with other settings (here --lr, --seed: the held-out split) starts over, saying so
    again = tmp_path / "c"
    assert _train(tiny_llama, data, again, "--epochs", "1").exit_code == 0
    r = _train(tiny_llama, data, again, "--resume", "--lr", "0.5", "--seed", "7")
    assert r.exit_code == 0 and "resuming at step" not in r.output, r.output
    assert "checkpoint was made with other settings or data: training starts over" in \
        " ".join(r.output.split())
    # (the early stop saved an adapter too; the resumed run's is kept beside it, as "-2")
    (ad2,) = [p for p in (work / "adapters").iterdir() if p.name.endswith("-2")]
    resumed = load_file(str(ad2 / "adapter.safetensors"))
    for k in full:
        torch.testing.assert_close(resumed[k], full[k], atol=1e-6, rtol=1e-5)
    # a finished training resumed again (a script that always passes --resume): its adapter
    # named, not the same weights stored a third time
    r = _train(tiny_llama, data, work, "--resume")
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert f"finished before: its adapter is adapters/{ad2.name}" in said
    assert "already stored: " in said and "saved: " not in said
    assert len(list((work / "adapters").iterdir())) == 2
    # generate with the trained adapter equals ar
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": c["conversations"][0]["value"]}) + "\n"
                               for c in CONVS[:5]))
    texts = {}
    for method in ("ar", "kangaroo"):
        out = tmp_path / f"{method}.jsonl"
        r = CliRunner().invoke(app, ["generate", str(prompts), "--model", str(tiny_llama),
                                     "--method", method, "--max-tokens", "16", "-b", "3",
                                     "--store", str(tmp_path / "a"), "--out", str(out), "-q",
                                     "--device", "cpu"])
        assert r.exit_code == 0, r.output
        texts[method] = [json.loads(x)["text"] for x in out.read_text().splitlines()]
    assert texts["ar"] == texts["kangaroo"]
    assert "kangaroo: adapter adapters/" in r.output


def test_cpu_defaults_bound_the_run_unless_given(tiny_llama, data, tmp_path, monkeypatch):
    """Training on a CPU without --limit / --max-len: at most CPU_LIMIT conversations of
    CPU_MAX_LEN tokens, said in one line, and the job (which prices every phase) has them;
    values given are kept; elsewhere the defaults are MAX_LEN tokens of every conversation."""
    from specctl.errors import SpecctlError
    from specctl.prep.adapter import command as train_cmd, train as train_adapter
    from specctl.prep.adapter.train import (CPU_MAX_LEN, MAX_LEN, TrainConfig,
                                            with_device_defaults)
    monkeypatch.setattr(train_adapter, "CPU_LIMIT", 5)   # (the data has 12)
    seen = []

    def stop(job, tok, convs, estimate_only=False):   # before any of the long work
        seen.append((job.cfg, len(convs)))
        raise SpecctlError("stopped")
    monkeypatch.setattr(train_cmd._Job, "prepare", stop)

    def run(*extra):
        r = CliRunner().invoke(app, ["train-adapter", "--model", str(tiny_llama), "--data",
                                     str(data), "--exit-layer", "2", "--store", str(tmp_path),
                                     "--device", "cpu", *extra])
        assert "stopped" in r.output, r.output
        return " ".join(r.output.split())   # (unwrapped)
    out = run()
    assert (f"on a CPU: at most 5 conversations of {CPU_MAX_LEN} tokens (--limit / --max-len "
            "to change)") in out
    cfg, n = seen[-1]
    assert (cfg.limit, cfg.max_len, n) == (5, CPU_MAX_LEN, 5)
    out = run("--limit", "7", "--max-len", "512")
    assert "on a CPU" not in out
    cfg, n = seen[-1]
    assert (cfg.limit, cfg.max_len, n) == (7, 512, 7)
    out = run("--limit", "7")
    assert f"on a CPU: at most 7 conversations of {CPU_MAX_LEN} tokens" in out
    assert with_device_defaults(TrainConfig(), False) == (TrainConfig(max_len=MAX_LEN), None)
    assert with_device_defaults(TrainConfig(max_len=64, limit=3), True) == \
        (TrainConfig(max_len=64, limit=3), None)


def test_missing_adapter_names_the_command(tiny_llama, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    r = CliRunner().invoke(app, ["generate", str(prompts), "--model", str(tiny_llama), "--method",
                                 "kangaroo", "--store", str(tmp_path / "s"), "-q"])
    assert r.exit_code != 0 and "specctl train-adapter" in r.output


def test_exit_layer_auto_sweeps_and_picks_the_best_estimate(tiny_llama, data, tmp_path):
    r = CliRunner().invoke(app, ["train-adapter", "--model", str(tiny_llama), "--data", str(data),
                                 "--epochs", "1", "--lr", "1e-3", "--batch-tokens", "400",
                                 "--heldout", "0.2", "--store", str(tmp_path), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    (ad,) = list((tmp_path / "adapters").iterdir())
    log = json.loads((ad / "train_log.json").read_text())
    sweep = log["exit_layer_sweep"]
    assert [row["exit_layer"] for row in sweep] == [1, 2]   # tiny: 4 layers -> 1 .. 2
    best = max(sweep, key=lambda row: row["speedup_estimate"])
    assert json.loads((ad / "config.json").read_text())["exit_layer"] == best["exit_layer"]
    assert f"exit layer {best['exit_layer']} chosen" in r.output
    # priced on this machine's batch-1 step-cost table, kept in the store
    assert [e.name for e in (tmp_path / "profiles").iterdir()][0].endswith("-steps-b1")


def test_expected_speedup_prices_acceptance_and_depth(model):
    from specctl.engine.steptable import StepTable
    from specctl.prep.adapter.sweep import exit_layer_candidates, expected_speedup
    from specctl.runtime.control.stepcost import StepCost
    from specctl.speculative.kangaroo import Adapter, kangaroo_price
    ns = (1, 2, 4, 8)
    flat = StepTable("cpu", "float32", "sdpa", 128, (1,), ns, ((30.0,) * 4,))
    one, three = (StepCost.of(flat, kangaroo_price(model, Adapter.init_from_model(model, l)),
                              False) for l in (1, 3))
    # more agreement is better at the same depth; the same agreement is worth more shallower
    assert expected_speedup(0.8, one, 6) > expected_speedup(0.5, one, 6)
    assert expected_speedup(0.6, one, 6) > expected_speedup(0.6, three, 6)
    # the step is priced as --speculate auto prices it: verify [l, L) over gamma + 1 tokens,
    # gamma draft forwards of [0, l) + adapter + head, one more of [0, l) alone
    c = one
    step = 30.0 * (c.verify_frac + 2 * c.draft_frac + c.tail_frac)
    assert expected_speedup(0.0, one, 2) == pytest.approx(30.0 / step)
    assert exit_layer_candidates(32) == [1, 2, 3, 4] and exit_layer_candidates(30) == [1, 2, 3, 4]
    assert exit_layer_candidates(4) == [1, 2]


def test_bf16_autocast_training_keeps_fp32_weights(tiny_llama, data, tmp_path):
    r = _train(tiny_llama, data, tmp_path, "--dtype", "bf16")
    assert r.exit_code == 0, r.output
    assert "bf16 autocast" in r.output or "bfloat16 autocast" in r.output
    (ad,) = list((tmp_path / "adapters").iterdir())
    w = load_file(str(ad / "adapter.safetensors"))
    assert all(t.dtype == torch.float32 for t in w.values())
    log = json.loads((ad / "train_log.json").read_text())
    losses = [x["loss"] for x in log["log"] if "loss" in x]
    assert all(l == l for l in losses) and losses[-1] < losses[0]


def test_exit_layer_option_is_checked(tiny_llama, data, tmp_path):
    for bad in ("zero", "0", "-1", "4"):   # (the tiny model has 4 layers)
        r = CliRunner().invoke(app, ["train-adapter", "--model", str(tiny_llama), "--data",
                                     str(tmp_path / "not-read.json" if bad == "4" else data),
                                     "--exit-layer", bad, "--store", str(tmp_path)])
        assert r.exit_code != 0 and "--exit-layer" in r.output, r.output
    for bad in ("0", "-5"):   # (0 divided by zero in the estimate: a traceback)
        r = CliRunner().invoke(app, ["train-adapter", "--model", str(tiny_llama), "--data",
                                     str(data), "--checkpoint-every", bad, "--estimate",
                                     "--store", str(tmp_path)])
        assert r.exit_code != 0 and "--checkpoint-every must be at least 1" in r.output, \
            r.output


@pytest.mark.parametrize("damage", ["truncated", "shape"])
def test_damaged_adapter_is_one_line(tiny_llama, tmp_path, damage):
    """A truncated adapter file or one with the wrong shapes for the model: a one-line error
    naming the adapter, never a SafetensorError traceback or a shape error mid-step."""
    from safetensors.torch import save_file
    from specctl.engine.loader import load_model
    from specctl.speculative.kangaroo import Adapter
    model = load_model(tiny_llama, "cpu", "fp32")
    w = Adapter.init_from_model(model, 1).w
    if damage == "shape":
        w = {**w, "q_proj.weight": w["q_proj.weight"][:, :-1].contiguous()}
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "config.json").write_text(json.dumps({"exit_layer": 1}))
    save_file(w, str(ad / "adapter.safetensors"))
    if damage == "truncated":
        f = ad / "adapter.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    r = CliRunner().invoke(app, ["generate", str(prompts), "--model", str(tiny_llama), "--method",
                                 "kangaroo", "--adapter", str(ad), "--store", str(tmp_path / "s"),
                                 "--max-tokens", "4", "-q"])
    fails(r, str(ad))


def test_a_second_adapter_is_kept_beside_the_first(tiny_llama, data, tmp_path):
    assert _train(tiny_llama, data, tmp_path).exit_code == 0
    r = _train(tiny_llama, data, tmp_path, "--epochs", "1")
    assert r.exit_code == 0, r.output
    ids = sorted(p.name for p in (tmp_path / "adapters").iterdir() if not p.name.startswith("."))
    assert len(ids) == 2 and ids[1] == ids[0] + "-2"


def test_sweep_layers_and_no_sweep(tiny_llama, data, tmp_path):
    base = ["train-adapter", "--model", str(tiny_llama), "--data", str(data), "--epochs", "1",
            "--lr", "1e-3", "--batch-tokens", "400", "--heldout", "0.2", "--device", "cpu"]
    r = CliRunner().invoke(app, base + ["--sweep-layers", "2", "--store", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    (ad,) = list((tmp_path / "a" / "adapters").iterdir())
    log = json.loads((ad / "train_log.json").read_text())
    assert [row["exit_layer"] for row in log["exit_layer_sweep"]] == [2]
    r = CliRunner().invoke(app, base + ["--no-sweep", "--store", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    (ad,) = list((tmp_path / "b" / "adapters").iterdir())
    assert "exit_layer_sweep" not in json.loads((ad / "train_log.json").read_text())
    assert json.loads((ad / "config.json").read_text())["exit_layer"] == 2
    for bad in ("x", "9", "0"):
        r = CliRunner().invoke(app, base + ["--sweep-layers", bad, "--store", str(tmp_path / "c")])
        fails(r, "--sweep-layers")
