"""cuDNN's SDPA kernel is off in specctl's attention on CUDA unless asked for (--cudnn-attention):
in bf16 it made two identical H100 runs differ (2 of 32 outputs; 0 with it off). What the CPU
can check: the switch around the call (on a device type made to stand for CUDA), that loading a
CUDA model sets it, and that the option parses and reaches the loader."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import specctl.engine.attention as attention
import specctl.engine.loader as loader
from specctl.cli import app
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.runtime.jobs.config import GenerateConfig

CUDNN = torch.backends.cuda


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[bool]:
    """Whether torch's cuDNN switch was on at each SDPA call (the switch restored after)."""
    seen: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(CUDNN.cudnn_sdp_enabled())
        return real(*a, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    was = CUDNN.cudnn_sdp_enabled()
    yield seen
    CUDNN.enable_cudnn_sdp(was)


def _forward(model) -> torch.Tensor:
    kv = model.new_kv_cache(2, 32)
    return model.forward(ForwardBatch([SeqInput(0, [1, 2, 3], 0), SeqInput(1, [4, 5], 0)]), kv)


@pytest.mark.parametrize("allowed", [False, True])
def test_sdpa_runs_without_cudnn_on_cuda_unless_allowed(model, sdpa_calls, monkeypatch,
                                                         allowed):
    """The CPU stands in for CUDA here: the switch is off in every layer's call (even where
    other code turned torch's switch on before), on again after; --cudnn-attention leaves it."""
    eager = _forward(model)
    sdpa_calls.clear()
    # (what cudnn_attention(allowed) makes of "cuda", for "cpu")
    monkeypatch.setattr(attention, "_NO_CUDNN", set() if allowed else {"cpu"})
    CUDNN.enable_cudnn_sdp(True)
    out = _forward(model)
    assert len(sdpa_calls) == model.cfg.num_layers
    assert sdpa_calls == [allowed] * len(sdpa_calls)
    assert CUDNN.cudnn_sdp_enabled()   # the caller's process keeps torch's setting
    assert torch.equal(out, eager)     # (the CPU has no cuDNN: the same kernel either way)


def test_cudnn_attention_switch_is_for_cuda_only(monkeypatch):
    monkeypatch.setattr(attention, "_NO_CUDNN", {"cuda"})
    attention.cudnn_attention(True)
    assert "cuda" not in attention._NO_CUDNN
    attention.cudnn_attention(False)
    assert attention._NO_CUDNN == {"cuda"}


def test_loading_a_cuda_model_sets_the_switch(tiny_llama, monkeypatch):
    """A model whose weights say cuda (the CPU cannot hold CUDA tensors) sets the switch from
    cudnn_attention; a CPU model leaves it as it is."""
    got: list[bool] = []
    monkeypatch.setattr(loader, "cudnn_sdpa", got.append)   # (the process's switch untouched)
    loader.load_model(tiny_llama, "cpu", "fp32")
    assert got == []

    class CudaModel(loader.Model):
        def __init__(self, *a):
            super().__init__(*a)
            self.device = torch.device("cuda")
    monkeypatch.setattr(loader, "Model", CudaModel)
    for asked in (False, True):
        m = loader.load_model(tiny_llama, "cpu", "fp32", cuda_graphs=False,
                              cudnn_attention=asked)
        assert m.device.type == "cuda"
    assert got == [False, True]   # (off unless asked)


def test_option_parses_and_keys_the_run_only_when_set():
    assert GenerateConfig(input="x").cudnn_attention is False
    on = GenerateConfig(input="x", cudnn_attention=True)
    # at its default the key is what it was before the option existed (runs resume)
    assert on.key("k") != GenerateConfig(input="x").key("k")
    assert "cudnn_attention" not in json.dumps(GenerateConfig(input="x").key("k"))


def _spy_loads(monkeypatch, module) -> list[dict]:
    """The keyword arguments of every module.load_model call (the call still happens)."""
    loads: list[dict] = []
    real = module.load_model

    def spy(*a, **kw):
        loads.append(kw)
        return real(*a, **kw)
    monkeypatch.setattr(module, "load_model", spy)
    return loads


@pytest.mark.parametrize("flag,want", [((), False), (("--cudnn-attention",), True),
                                       (("--no-cudnn-attention",), False)])
def test_bench_option_reaches_the_loader(tmp_path, tiny_llama, monkeypatch, flag, want):
    loads = _spy_loads(monkeypatch, loader)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "one two"}) + "\n")
    r = CliRunner().invoke(app, ["bench", str(prompts), "--model", str(tiny_llama), "--store",
                                 str(tmp_path / "s"), "--methods", "ar", "--batch-sizes", "1",
                                 "--max-tokens", "2", "--repeats", "1", "--warmup", "0",
                                 "--device", "cpu", "--dtype", "fp32", "-q", *flag])
    assert r.exit_code == 0, r.output
    assert [kw["cudnn_attention"] for kw in loads] == [want]


def test_generate_option_reaches_the_loader(tmp_path, tiny_llama, monkeypatch):
    import specctl.runtime.jobs.loaded as loaded   # (a job's load: runtime/jobs/loaded.py)
    loads = _spy_loads(monkeypatch, loaded)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "one two"}) + "\n")
    r = CliRunner().invoke(app, ["generate", str(prompts), "--model", str(tiny_llama),
                                 "--store", str(tmp_path / "s"), "--max-tokens", "2",
                                 "--device", "cpu", "--dtype", "fp32", "-q",
                                 "-o", str(tmp_path / "o.jsonl"), "--cudnn-attention"])
    assert r.exit_code == 0, r.output
    assert [kw.get("cudnn_attention") for kw in loads] == [True]


def _reference(q, k, v, mask):
    """Attention with K/V expanded per query head (GQA as repeat_interleave), in float64."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).double(), v.repeat_interleave(g, 1).double()
    s = (q.double() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("counts", [[1, 1, 1], [3, 1, 5]])
def test_grouped_queries_fold_into_rows(model, sdpa_calls, monkeypatch, counts):
    """Each KV head's g query heads attend as g x N rows of one head: what SDPA is handed has
    as many query heads as K/V and no enable_gqa (so on CUDA without cuDNN it may take the
    memory-efficient kernel), and every token's output is GQA attention's."""
    c = model.cfg
    assert c.num_heads > c.num_kv_heads   # (the fixture model groups its queries)
    kv = model.new_kv_cache(3, 32)
    prefix = [4, 0, 7]
    batch = ForwardBatch([SeqInput(s, list(range(1, n + 1)), p)
                          for s, (n, p) in enumerate(zip(counts, prefix))])
    kv.lens[:3] = [p + n for p, n in zip(prefix, counts)]
    meta = attention.sdpa_meta(batch, kv)
    gen = torch.Generator().manual_seed(0)
    T, H, KV, hd = batch.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim
    q = torch.randn(T, H, hd, generator=gen)
    kc, vc = (torch.randn(kv.k[0].shape, generator=gen) for _ in range(2))
    handed = []
    real = F.scaled_dot_product_attention

    def spy(qf, k, v, **kw):
        handed.append((qf.shape, k.shape, sorted(kw)))
        return real(qf, k, v, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = attention.sdpa_attention(q, kc, vc, meta)
    [(qs, ks, kws)] = handed
    assert qs[1] == ks[1] == KV and qs[2] == (H // KV) * meta.n_max
    assert "attn_mask" in kws and "enable_gqa" not in kws   # (scale: the family's, or None)
    rows = attention._rows
    ref = _reference(attention._per_seq(q, meta), rows(kc, meta), rows(vc, meta), meta.mask)
    ref = attention._packed(ref.float(), meta, T)
    assert out.shape == (T, H, hd)
    assert torch.allclose(out, ref, atol=1e-5)
