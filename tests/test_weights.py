"""Loading checkpoints as users' come (engine/weights.py, engine/loader.py): sharded with an
index, bf16/fp16/fp32 cast to the run's dtype, tied embeddings, read lazily (peak memory near the
weights' size), and models the engine cannot run refused from their config alone."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specctl.engine import weights as wt
from specctl.engine.loader import load_model
from specctl.errors import SpecctlError
from specctl.models.checkpoint import SUPPORTED_TYPES, validate_hf_folder

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench-results/2026-11-28-real-size-load/real_size.py"
SOURCE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _real_size():
    spec = importlib.util.spec_from_file_location("real_size", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hf_tied(tmp_path_factory):
    """A tiny tied-embedding HF Llama and its state dict (fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def _save(model, out: Path, dtype: torch.dtype) -> Path:
    """save_pretrained in `dtype`, in several shards with an index."""
    model.to(dtype).save_pretrained(out, max_shard_size="60KB")
    model.to(torch.float32)
    assert (out / "model.safetensors.index.json").is_file()
    assert len(list(out.glob("*.safetensors"))) >= 3
    return out


@pytest.mark.parametrize("source", ["bf16", "fp16", "fp32"])
def test_sharded_checkpoint_in_any_dtype_loads_cast(hf_tied, tmp_path, source):
    """Every weight of a sharded bf16/fp16/fp32 checkpoint arrives in the run's dtype, equal to
    the stored tensor cast by torch; the tied head is the embedding, not a copy."""
    d = _save(hf_tied, tmp_path / source, SOURCE[source])
    sd = {k: v.to(SOURCE[source]) for k, v in hf_tied.state_dict().items()}
    for run in (torch.float32, torch.bfloat16):
        m = load_model(d, "cpu", run)
        assert m.lm_head is m.embed and m.embed.dtype == run
        assert torch.equal(m.embed, sd["model.embed_tokens.weight"].to(run))
        p = "model.layers.2."
        qkv = torch.cat([sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]).to(run)
        assert torch.equal(m.layers[2].wqkv, qkv)
        assert torch.equal(m.layers[2].w_down, sd[p + "mlp.down_proj.weight"].to(run))


def test_chunked_reads_equal_whole_ones(hf_tied, tmp_path, monkeypatch):
    """A tensor bigger than CHUNK is read in row chunks (one file opening each) to the same
    bits."""
    d = _save(hf_tied, tmp_path / "m", torch.bfloat16)
    whole = load_model(d, "cpu", "fp32")
    opened = []
    real = wt.safe_open
    monkeypatch.setattr(wt, "safe_open", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(wt, "CHUNK", 2048)   # 8 rows of the embedding a read
    chunked = load_model(d, "cpu", "fp32")
    assert len(opened) > 300 // 8
    assert torch.equal(whole.embed, chunked.embed)
    for a, b in zip(whole.layers, chunked.layers):
        assert torch.equal(a.w_gate_up, b.w_gate_up) and torch.equal(a.wqkv, b.wqkv)


def test_no_file_stays_mapped(hf_tied, tmp_path):
    """The loaded weights own their memory: none is a view of a mapped file (whose pages would
    stay resident beside a copy)."""
    d = _save(hf_tied, tmp_path / "m", torch.float32)
    m = load_model(d, "cpu", "fp32")   # (same dtype: torch's .to would have kept the mapping)
    for t in [m.embed, m.norm, m.layers[0].wo, m.layers[0].attn_norm]:
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _one_file(d: Path, tensors: dict, name="model.safetensors"):
    save_file(tensors, str(d / name))


def test_shard_errors_are_named_before_any_weight_is_read(hf_tied, tmp_path, monkeypatch):
    """An index that puts a tensor in another shard than holds it, a missing tensor: said from
    the headers, before any weight is read."""
    d = _save(hf_tied, tmp_path / "m", torch.float32)
    monkeypatch.setattr("specctl.engine.loader.read_tensor",
                        lambda *a: pytest.fail("a weight was read"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shared = [f for f in index["weight_map"].values()
              if list(index["weight_map"].values()).count(f) > 1]
    name = next(k for k, f in index["weight_map"].items() if f in shared)
    elsewhere = next(f for f in sorted(set(index["weight_map"].values()))
                     if f != index["weight_map"][name])
    bad = {**index, "weight_map": {**index["weight_map"], name: elsewhere}}
    (d / "model.safetensors.index.json").write_text(json.dumps(bad))
    with pytest.raises(SpecctlError, match=f"puts {name} in {elsewhere}, but it is in"):
        load_model(d, "cpu", "fp32")
    del index["weight_map"][name]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    only = {k: v for k, v in hf_tied.state_dict().items() if k != "lm_head.weight"}
    for f in d.glob("*.safetensors"):
        f.unlink()
    del only[name]
    _one_file(d, only, sorted(set(index["weight_map"].values()))[0])
    index["weight_map"] = {k: sorted(set(index["weight_map"].values()))[0] for k in only}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecctlError, match=f"lacks tensor {name}"):
        load_model(d, "cpu", "fp32")


def test_tensor_stored_twice_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _one_file(tmp_path, {"a": torch.zeros(2)}, "a.safetensors")
    _one_file(tmp_path, {"a": torch.ones(2)}, "b.safetensors")
    with pytest.raises(SpecctlError, match="tensor a is stored twice"):
        wt.tensor_index(tmp_path)


def test_wrong_shape_and_integer_weights_are_refused(hf_tied, tmp_path):
    d = tmp_path / "m"
    hf_tied.save_pretrained(d)
    from safetensors.torch import load_file
    sd = load_file(str(d / "model.safetensors"))
    sd["model.norm.weight"] = torch.ones(65)
    _one_file(d, sd)
    with pytest.raises(SpecctlError, match=r"model.norm.weight has shape \(65,\)"):
        load_model(d, "cpu", "fp32")
    sd["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    _one_file(d, sd)
    with pytest.raises(SpecctlError, match="model.norm.weight is stored as I32"):
        load_model(d, "cpu", "fp32")


REFUSED = [
    ({"model_type": "mixtral", "num_local_experts": 8, "architectures": ["MixtralForCausalLM"]},
     "'mixtral' \\(MixtralForCausalLM\\) is not supported \\(a mixture of experts: "
     "num_local_experts 8\\)"),
    ({"model_type": "qwen2_moe", "num_experts": 60}, "\\(a mixture of experts: num_experts 60"),
    ({"model_type": "qwen3_moe"}, "'qwen3_moe' is not supported \\(a mixture of experts\\)"),
    ({"model_type": "llama", "num_experts": 4}, "'llama' is not supported \\(a mixture of"),
    ({"model_type": "llava", "vision_config": {"model_type": "clip_vision_model"},
      "text_config": {"model_type": "llama"}}, "\\(multimodal: it has a vision_config; its "
     "text model, model_type 'llama', runs from a checkpoint of its own\\)"),
    ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}},
     "\\(multimodal: it wraps a text_config"),
    ({"model_type": "gpt2"}, "'gpt2' is not supported: "),
]


@pytest.mark.parametrize("cfg,says", REFUSED, ids=[c["model_type"] for c, _ in REFUSED])
def test_models_it_cannot_run_are_refused_in_one_line(tmp_path, cfg, says):
    """From the config alone (the folder has no weights at all), by the CLI's check and by
    load_model, in one line that names the families it runs."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, **cfg}))
    runs = (f"specctl runs dense text decoders of the families {', '.join(SUPPORTED_TYPES)} "
            "(no mixture of experts, no vision-language)")
    for load in (validate_hf_folder, lambda p: load_model(p, "cpu", "fp32")):
        with pytest.raises(SpecctlError, match=says) as e:
            load(tmp_path)
        assert "\n" not in str(e.value) and str(e.value).endswith(runs)


def test_peak_memory_of_a_load_is_near_the_weights(tmp_path):
    """A ~160 MB bf16 checkpoint in 3 shards: loading it (in a process of its own) and reading
    every weight raises peak RSS by at most 1.3x the weights (a load that kept the mapped files
    resident beside its copies took ~1.6x)."""
    rs = _real_size()
    shape = dict(hidden=768, layers=8, heads=12, kv_heads=4, inter=3072, vocab=16000)
    size = rs.build(tmp_path / "ckpt", shape)
    load = rs.measure_load(tmp_path / "ckpt")
    grew = (load["peak_kb"] - load["base_kb"]) * 1024
    assert 0.95 * size <= grew <= 1.3 * size, (grew / size, load)


@pytest.mark.slow
def test_real_size_script_runs_small(tmp_path):
    """bench-results/2026-11-28-real-size-load/real_size.py end to end on a small shape: build,
    load, generate 16 tokens for 4 prompts, bench ar and self-draft."""
    from tiny import make_tokenizer
    make_tokenizer(tmp_path / "tok")
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "w"), "--small",
                        "--tokenizer", str(tmp_path / "tok")], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "w/results.json").read_text())
    assert res["generate"]["answers"] == 4 and res["generate"]["new_tokens"] == 64
    load, size = res["load"], res["weights_bytes_on_disk"]   # (12 MB: the allocator's own
    assert (load["peak_kb"] - load["base_kb"]) * 1024 <= 1.3 * size + (16 << 20)   # counts)
    assert "self-draft" in (tmp_path / "w/bench.log").read_text()
