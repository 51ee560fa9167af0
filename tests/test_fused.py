"""The fused decoder layer (engine/fused.py, CUDA's default) under Triton's interpreter on the
CPU (on a GPU the compiled kernels): each kernel against the unfused ops, whole forwards
against SDPA's (chains, trees, padding, paged caches), every method lossless through it, and
its launches counted (engine/launches.py): at most 9 a decoder layer at the demo model's shapes.

Tolerances: fp32 within 1e-5 of the unfused result (the same math in another order); bf16
within one rounding step of the output (the fused kernels round once where the unfused ops
round two or three times); a whole bf16 forward within a few steps per layer."""

from __future__ import annotations

import pytest
import torch

from helpers import (HostReads, method_drafters, random_prompts, run_ids, tree_input,
                     triton_module)

fused = triton_module("specctl.engine.fused")   # (under Triton's interpreter on a CPU)

from specctl.engine import launches  # noqa: E402
from specctl.engine.batch import ForwardBatch, SeqInput  # noqa: E402
from specctl.engine.config import ModelConfig  # noqa: E402
from specctl.engine.graphs import CudaGraphs  # noqa: E402
from specctl.engine.kv import BLOCK, row_bytes  # noqa: E402
from specctl.engine.loader import load_model  # noqa: E402
from specctl.engine.model import Model, apply_rope  # noqa: E402
from specctl.speculative.self_draft import build_trie  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
F = torch.nn.functional


def _close(got, want, dtype, steps=1.0):
    """Within `steps` rounding steps of want's magnitude (bf16), or 1e-5 relative (fp32)."""
    got, want = got.double(), want.double()
    if dtype == torch.float32:
        return torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    ulp = want.abs().clamp_min(2 ** -10) * 2 ** -7
    return bool(((got - want).abs() <= steps * ulp).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_kernel_is_the_unfused_op(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 96, generator=g).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(96, generator=g)).to(DEV, dtype)
    ref = (F.rms_norm(x.float(), (96,), w.float(), 1e-5)).to(dtype)
    assert _close(fused.rms_norm(x, w, 1e-5), ref, dtype)
    gu = torch.randn(5, 2 * 70, generator=g).to(DEV, dtype)
    gate, up = gu.float().chunk(2, dim=-1)
    assert _close(fused.silu_mul(gu), (F.silu(gate) * up).to(dtype), dtype)
    H, KV, hd, T = 6, 2, 32, 5
    qkv = torch.randn(T, (H + 2 * KV) * hd, generator=g).to(DEV, dtype)
    ang = torch.randn(T, 1, hd // 2, generator=g)
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(DEV, dtype)
    sin = torch.cat((-ang.sin(), ang.sin()), -1).to(DEV, dtype)
    kc, vc = (torch.zeros(20, KV, hd, device=DEV, dtype=dtype) for _ in range(2))
    index = torch.tensor([3, 9, 4, 17, 0], device=DEV)
    q = fused.rope_kv(qkv, cos, sin, index, kc, vc, H, KV)
    want = apply_rope(qkv[:, :(H + KV) * hd].float().view(T, H + KV, hd), cos.float(),
                      sin.float()).to(dtype)
    assert _close(q, want[:, :H], dtype)
    assert _close(kc[index], want[:, H:], dtype)
    assert torch.equal(vc[index], qkv[:, (H + KV) * hd:].view(T, KV, hd))
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[index.cpu()] = False
    assert not kc[untouched].any() and not vc[untouched].any()


def _mixed_forward(path, dtype, attention, paged, monkeypatch):
    """Hidden states and caches of one mixed forward (a decode row, a chain, two trees, prompts
    of 60-130 tokens: several key blocks) after a prefill by the unfused layer."""
    m = load_model(path, DEV, dtype, attention=attention)
    c = m.cfg
    budget = 40 * BLOCK * row_bytes(c.num_layers, c.num_kv_heads, c.head_dim, m.dtype) \
        if paged else None   # (fewer blocks than 4 slots of 256 rows: a paged pool)
    kv = m.new_kv_cache(4, 256, budget)
    assert kv.paged == paged
    prompts = random_prompts(4, seed=3, max_len=150)
    with monkeypatch.context() as mp:
        mp.setattr(fused, "FUSED_N", 0)
        for s, p in enumerate(prompts):
            kv.reserve(s, len(p) + 8)
            m.forward(ForwardBatch([SeqInput(s, p, 0)], DEV), kv)
            kv.lens[s] = len(p)
    L = [len(p) for p in prompts]
    assert max(L) >= 2 * 64   # (several of the kernel's key blocks)
    tree = build_trie([[5, 6, 7], [5, 8], [9]], 8)
    batch = ForwardBatch([SeqInput(0, [11], L[0]), SeqInput(1, [12, 13, 14], L[1]),
                          tree_input(2, 4, tree, L[2]), tree_input(3, 4, tree, L[3])], DEV)
    before = fused.LAUNCHES[0]
    h = m.forward(batch, kv).double()
    assert (fused.LAUNCHES[0] > before) == (attention == "fused")
    return h, kv


@pytest.mark.parametrize("paged", [False, True])
def test_a_fused_forward_is_sdpas(tiny_llama, paged, monkeypatch):
    """fp32: the fused forward within 1e-5 of SDPA's (states and every K/V row written). bf16:
    no further from the fp32 result than the unfused bf16 forward is (it rounds less)."""
    (want, kv0), (got, kv1) = (_mixed_forward(tiny_llama, "fp32", a, paged, monkeypatch)
                               for a in ("sdpa", "fused"))
    assert _close(got, want, torch.float32)
    for i in range(len(kv0.k)):
        assert _close(kv1.k[i], kv0.k[i], torch.float32)
        assert _close(kv1.v[i], kv0.v[i], torch.float32)
    assert not torch.allclose(got[1:], want[:-1], atol=1e-3)   # (rows differ: a real check)
    errs = {}
    for a in ("sdpa", "fused"):
        h, _ = _mixed_forward(tiny_llama, "bf16", a, paged, monkeypatch)
        errs[a] = (h - want).abs()
    assert errs["fused"].max() <= 1.1 * errs["sdpa"].max(), errs
    assert errs["fused"].mean() <= 1.1 * errs["sdpa"].mean(), errs


def test_prefill_runs_unfused(tiny_llama, monkeypatch):
    """A forward of more than FUSED_N tokens a sequence (a prefill chunk) takes the unfused
    layer; a decoding forward the fused one."""
    m = load_model(tiny_llama, DEV, "fp32", attention="fused")
    calls = []
    real = fused.layers
    monkeypatch.setattr(fused, "layers", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(fused, "FUSED_N", 8)
    kv = m.new_kv_cache(1, 64)
    kv.reserve(0, 64)
    m.forward(ForwardBatch([SeqInput(0, list(range(1, 10)), 0)], DEV), kv)
    assert calls == []
    m.forward(ForwardBatch([SeqInput(0, [3, 4], 9)], DEV), kv)
    assert calls == [1]


def _recorded(m, monkeypatch) -> HostReads:
    """What m's graphs capture recorded by a HostReads (helpers.py); the Triton launches,
    compiled kernels on a GPU, run outside the recording."""
    reads = HostReads()
    monkeypatch.setattr(fused, "_launch", reads.outside(fused._launch))
    forward = m.graphs._forward

    def recorded(*args, **kwargs):
        with reads:
            return forward(*args, **kwargs)
    monkeypatch.setattr(m.graphs, "_forward", recorded)
    return reads


def _exact_fused_in_graphs(m, monkeypatch):
    """m (the tiny model, fused, bf16, under --exact in graphs) keeps its captured graphs,
    every forward (a prefill too: which kernels a row meets must not follow the batch) runs
    fused, and ar, Self-Draft and Kangaroo at batch 3 (padded to 4) give ar's batch-1 tokens,
    reading nothing on the host inside a capture."""
    from helpers import method_drafters
    assert m.graphs is not None
    calls = []
    real = fused.layers
    monkeypatch.setattr(fused, "layers", lambda *a: calls.append(a[-4].n_max) or real(*a))
    monkeypatch.setattr(fused, "FUSED_N", 8)
    prompts = random_prompts(3, seed=5)
    ref, _ = run_ids(m, prompts, batch_size=1, max_tokens=8)
    assert max(calls) > 8   # (prefills)
    reads = _recorded(m, monkeypatch)   # (no host read, RoPE's table included)
    drafters = method_drafters(m, prompts, ref)
    for name in ("ar", "self-draft", "kangaroo"):   # (Kangaroo's head eager under --exact)
        before = m.graphs.replays
        got, _ = run_ids(m, prompts, batch_size=3, max_tokens=8, drafter=drafters[name])
        assert got == ref, name
        assert m.graphs.replays > before, name
        assert reads.found == [], (name, sorted(set(reads.found)))
    m.graphs.cache["x"] = None
    m.set_exact(False)
    assert m.graphs is not None and m.graphs.cache == {}   # (captured with exact's kernels)


def _fused_bf16(path):
    m = load_model(path, DEV, "bf16", attention="fused")
    m.graphs = CudaGraphs(m, capture=DEV == "cuda")
    return m


def test_exact_runs_every_forward_fused_in_graphs(tiny_llama, monkeypatch):
    """--exact on the fused layer (CUDA's way: the probed matmuls, attention on one tile
    shape) with the matmul this machine's check chose for the unfused layer, as a job given
    its kept choice takes it (runtime/jobs/exactcheck.py): _exact_fused_in_graphs. (The fused
    layer's own self-check runs its kernels under Triton's interpreter, ~50 s on an AVX2 CPU:
    -m slow below; its refusal is the next test's.)"""
    plain = load_model(tiny_llama, DEV, "bf16")
    plain.set_exact(True)
    m = _fused_bf16(tiny_llama)
    m.set_exact(True, known=plain._exact_linear.__name__)
    _exact_fused_in_graphs(m, monkeypatch)


@pytest.mark.slow
def test_exact_self_checks_the_fused_layer_and_runs_it_in_graphs(tiny_llama, monkeypatch):
    """As above, the fused layer's own probe and self-check choosing the matmul."""
    m = _fused_bf16(tiny_llama)
    m.set_exact(True)
    assert "self-checked" in m.exact_check
    _exact_fused_in_graphs(m, monkeypatch)


def test_the_self_check_refuses_a_fused_kernel_that_follows_the_batch(tiny_llama, monkeypatch):
    """A fused kernel whose row result depends on the rows beside it: --exact refused, the
    first operation after it named."""
    import itertools
    from specctl.engine import exact, selfcheck
    real, probe = fused.rms_norm, exact.probe
    # (7 prompts beside the checked one, not 15, none past 40 tokens: the kernel follows any
    # batch, and the interpreter took ~33 s for the check's full prefill on an AVX2 CPU)
    monkeypatch.setattr(selfcheck, "OTHERS", 7)
    monkeypatch.setattr(selfcheck, "LONG", 40)
    monkeypatch.setattr(fused, "rms_norm",
                        lambda x, w, eps: real(x, w, eps) * (1 + x.shape[0] * 2 ** -6))
    # (the probe's first matmul only: each other one would be self-checked, and refused, too)
    monkeypatch.setattr(exact, "probe", lambda *a: itertools.islice(probe(*a), 1))
    m = load_model(tiny_llama, DEV, "bf16", attention="fused")
    with pytest.raises(ValueError, match="layer 0's QKV projection"):
        m.set_exact(True)
    assert not m.exact


def test_where_it_runs(tiny_llama, monkeypatch):
    m = load_model(tiny_llama, "cpu", "fp32")
    assert m.attention == "sdpa"           # auto off CUDA
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="runs on CUDA"):
        m.set_attention("fused")
    from specctl.errors import SpecctlError
    with pytest.raises(SpecctlError, match="use --attention auto or sdpa"):   # (one line)
        load_model(tiny_llama, "cpu", "fp32", attention="fused")


def test_every_method_is_lossless_through_the_fused_graph_path(tiny_llama, monkeypatch):
    """Every method's forwards through the fused layer and the graph path (3 sequences padded
    to a bucket of 4, the scratch slot, trees, Kangaroo's head and its verify from hidden
    states): greedy output is ar's (SDPA, eager, batch 1), and nothing a capture holds reads
    the device (the Triton launches, compiled kernels on a GPU, run outside the recording).
    (Small: the interpreter runs a forward of the tiny model in ~0.2 s.)"""
    eager = load_model(tiny_llama, DEV, "fp32")
    prompts = random_prompts(3, seed=5)
    ref, _ = run_ids(eager, prompts, batch_size=1, max_tokens=10)
    m = load_model(tiny_llama, DEV, "fp32", attention="fused")
    m.graphs = CudaGraphs(m, capture=False)
    reads = _recorded(m, monkeypatch)
    accepted = 0
    for name, dr in method_drafters(m, prompts, ref).items():
        before = fused.LAUNCHES[0], m.graphs.replays
        got, stats = run_ids(m, prompts, batch_size=3, max_tokens=10, drafter=dr)
        assert got == ref, name
        assert m.graphs.replays > before[1] and fused.LAUNCHES[0] > before[0], name
        assert reads.found == [], (name, sorted(set(reads.found)))
        accepted += sum(k * n for k, n in stats.accept_hist.items())
    assert accepted > 0


def _demo_shaped(layers: int = 2) -> Model:
    """A random model of the demo model's shapes (SmolLM2-135M: hidden 576, 9 query and 3 KV
    heads of 64, MLP 1536), two layers and a small vocabulary (the count is per layer)."""
    cfg = ModelConfig(hidden_size=576, intermediate_size=1536, num_layers=layers,
                      num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=512,
                      rms_eps=1e-5, tie_embeddings=True)
    g = torch.Generator().manual_seed(0)
    w = {"model.embed_tokens.weight": torch.randn(512, 576, generator=g),
         "model.norm.weight": torch.ones(576)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (576, 576)), ("self_attn.k_proj", (192, 576)),
                            ("self_attn.v_proj", (192, 576)), ("self_attn.o_proj", (576, 576)),
                            ("mlp.gate_proj", (1536, 576)), ("mlp.up_proj", (1536, 576)),
                            ("mlp.down_proj", (576, 1536))):
            w[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.02
        w[p + "input_layernorm.weight"] = torch.ones(576)
        w[p + "post_attention_layernorm.weight"] = torch.ones(576)
    return Model(cfg, {k: v.to(DEV, torch.bfloat16) for k, v in w.items()})


@pytest.mark.parametrize("batch", ["decode", "trees"])
def test_launches_per_layer_at_the_demo_shapes(batch):
    """The CUDA path's kernels a decoder layer launches (engine/launches.py, counted on the
    CPU): at most 9 fused, against the unfused layer's 14 (norm, QKV, RoPE in three, two
    K/V writes, attention, O + residual, norm, gate/up, SiLU, multiply, down + residual)."""
    m = _demo_shaped()
    counts = {}
    for attention in ("sdpa", "fused"):
        m.set_attention(attention)
        kv = m.new_kv_cache(4, 64)
        for s in range(4):
            kv.reserve(s, 64)
            kv.lens[s] = 20 + s
        tree = build_trie([[5, 6, 7], [5, 8]], 8)
        seqs = [SeqInput(s, [7], 20 + s) for s in range(4)] if batch == "decode" else \
            [tree_input(s, 4, tree, 20 + s) for s in range(4)]
        counts[attention] = launches.per_step(m, ForwardBatch(seqs, DEV), kv, as_cuda=True)
    step, layer, names = counts["fused"]
    assert layer <= 9 and names.count("triton") == 5, names   # (2 norms, rope, attn, silu)
    assert counts["sdpa"][1] == 14, counts["sdpa"][2]
    assert step < counts["sdpa"][0]


def test_the_counter_counts_what_runs():
    """An op more in a layer is a launch more; views are none; the layer is the second one."""
    x = torch.randn(4, 8)
    with launches.counting() as c:
        y = x.view(2, 16).t()[0]
        z = torch.empty(3)
    assert c.count == 0, c.names
    with launches.counting() as c:
        (x + 1).relu_().sum()
        F.rms_norm(x, (8,))
    assert c.count == 4 and c.names[-1] == "rms_norm", c.names
    assert y.shape == (2,) and z.numel() == 3


def test_a_cuda_bench_says_its_launches():
    """of_step counts an ar step as the bench records it on CUDA; the table's title says it."""
    from specctl.bench.report import title
    m = _demo_shaped()
    m.set_attention("fused")
    step, layer = launches.of_step(m)
    assert layer == 9 and step > 2 * 9
    res = {"config": {"max_tokens": 8, "repeats": 1}, "model": "/x/demo", "device": "cuda:0",
           "dtype": "bfloat16", "id": "bench-1", "prompts": 3, "attention": "fused",
           "launches": {"step": step, "layer": layer}}
    assert f"fused attention, CUDA graphs ({step} launches an ar step, 9 a layer)" in title(res)
    assert (launches.on_cuda(m) is None) == (DEV == "cpu")   # (CUDA only)
