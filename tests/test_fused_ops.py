"""The fused layer's ops for the families past Llama (engine/fused.py) under Triton's
interpreter on the CPU, each against a plain torch reference: RMSNorm's (1 + w) offset, per-head
q/k RMSNorm inside the RoPE kernel, GeLU-tanh, and attention with its own scale, a soft-cap and
a sliding window (trees, committed rows before the window, paged caches); and which configs
the fused layer leaves to the unfused one. Tolerances as tests/test_fused.py's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers import tree_input, triton_module

fused = triton_module("specctl.engine.fused")   # (under Triton's interpreter on a CPU)

from specctl.engine.attention import sdpa_meta  # noqa: E402
from specctl.engine.batch import ForwardBatch, SeqInput  # noqa: E402
from specctl.engine.kv import BLOCK, KVCache  # noqa: E402
from specctl.engine.model import apply_rope  # noqa: E402
from specctl.speculative.self_draft import build_trie  # noqa: E402
from test_fused import _close  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
F = torch.nn.functional
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_offset(dtype):
    """RMSNorm(x) * (1 + w) (Gemma), and an fp32 weight beside bf16 states (a weight kept in
    fp32 with its offset folded in): the product in fp32, rounded once."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 80, generator=g).to(DEV, dtype)
    w = (0.1 * torch.randn(80, generator=g)).to(DEV, dtype)
    ref = F.rms_norm(x.float(), (80,), 1.0 + w.float(), 1e-6).to(dtype)
    assert _close(fused.rms_norm(x, w, 1e-6, offset=1.0), ref, dtype)
    assert _close(fused.rms_norm(x, 1.0 + w.float(), 1e-6), ref, dtype)
    assert not _close(fused.rms_norm(x, w, 1e-6), ref, dtype)   # (the offset counts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_qk_norm_in_the_rope_kernel(dtype, offset):
    """Each query and key head RMS-normed over head_dim by its own weight (+ offset), then
    rotated; values stored as they came; rows not indexed untouched."""
    g = torch.Generator().manual_seed(2)
    H, KV, hd, T, eps = 6, 2, 32, 5, 1e-6
    qkv = (3 * torch.randn(T, (H + 2 * KV) * hd, generator=g)).to(DEV, dtype)
    qn, kn = ((0.2 * torch.randn(hd, generator=g) + 1 - offset).to(DEV, dtype)
              for _ in range(2))
    ang = torch.randn(T, 1, hd // 2, generator=g)
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(DEV, dtype)
    sin = torch.cat((-ang.sin(), ang.sin()), -1).to(DEV, dtype)
    kc, vc = (torch.zeros(20, KV, hd, device=DEV, dtype=dtype) for _ in range(2))
    index = torch.tensor([3, 9, 4, 17, 0], device=DEV)
    q = fused.rope_kv(qkv, cos, sin, index, kc, vc, H, KV, qn, kn, eps, offset)
    qk = qkv[:, :(H + KV) * hd].float().view(T, H + KV, hd)
    normed = torch.cat((F.rms_norm(qk[:, :H], (hd,), qn.float() + offset, eps),
                        F.rms_norm(qk[:, H:], (hd,), kn.float() + offset, eps)), dim=1)
    want = apply_rope(normed, cos.float(), sin.float()).to(dtype)
    assert _close(q, want[:, :H], dtype, steps=2) and _close(kc[index], want[:, H:], dtype, 2)
    assert torch.equal(vc[index], qkv[:, (H + KV) * hd:].view(T, KV, hd))
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[index.cpu()] = False
    assert not kc[untouched].any() and not vc[untouched].any()
    plain = fused.rope_kv(qkv, cos, sin, index, kc, vc, H, KV)
    assert not _close(plain, want[:, :H], dtype, steps=2)   # (the norm counts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_mul(dtype):
    g = torch.Generator().manual_seed(3)
    gu = (2 * torch.randn(6, 2 * 600, generator=g)).to(DEV, dtype)   # (two column blocks)
    gate, up = gu.float().chunk(2, dim=-1)
    want = (F.gelu(gate, approximate="tanh") * up).to(dtype)
    assert _close(fused.act_mul(gu, "gelu_tanh"), want, dtype)
    assert _close(fused.act_mul(gu), (F.silu(gate) * up).to(dtype), dtype)
    with pytest.raises(ValueError, match="no activation 'relu'"):
        fused.act_mul(gu, "relu")


def _scene(dtype, paged: bool):
    """A forward's attention inputs: random K/V caches of 4 sequences with 150-230 committed
    rows, then a decode row, a chain of 3 and two draft trees; queries [T, H, hd]."""
    H, KV, hd = 4, 2, 32
    g = torch.Generator().manual_seed(4)
    blocks = 4 * 256 // BLOCK - 8 if paged else None
    kv = KVCache(1, 4, 256, KV, hd, dtype, torch.device(DEV), num_blocks=blocks)
    assert kv.paged == paged
    lens = [230, 151, 199, 170]
    for s, n in enumerate(lens):
        kv.reserve(s, n + 8)
        kv.lens[s] = n
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=g))
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=g))
    tree = build_trie([[5, 6, 7], [5, 8], [9]], 8)
    batch = ForwardBatch([SeqInput(0, [11], lens[0]), SeqInput(1, [12, 13, 14], lens[1]),
                          tree_input(2, 4, tree, lens[2]), tree_input(3, 4, tree, lens[3])], DEV)
    meta = sdpa_meta(batch, kv)
    q = (2 * torch.randn(batch.num_tokens, H, hd, generator=g)).to(DEV, dtype)
    return q, kv, meta, batch.positions


def _reference(q, kv, meta, positions, scale, cap, window):
    """Attention spelled out per query row in fp64: the forward's mask, the window by
    positions (a committed row's is its column), soft-cap, softmax."""
    T, H, hd = q.shape
    G = H // kv.k[0].shape[1]
    out = torch.zeros(T, H, hd, dtype=torch.float64)
    blocks, starts, counts, prefix = (t.cpu() for t in (meta.blocks, meta.starts, meta.counts,
                                                        meta.prefix))
    for b in range(blocks.shape[0]):
        L = int(prefix[b] + counts[b])
        cols = torch.arange(L)
        rows = blocks[b, cols // meta.block] * meta.block + cols % meta.block
        k, v = kv.k[0].cpu()[rows].double(), kv.v[0].cpu()[rows].double()
        new = cols - prefix[b]
        kpos = torch.where(new < 0, cols, positions.cpu()[starts[b] + new.clamp(0, None)])
        for i in range(int(counts[b])):
            t = int(starts[b]) + i
            seen = meta.mask[b, 0, i, :L].cpu()
            if window is not None:
                seen = seen & (kpos > positions[t].cpu() - window)
            for h in range(H):
                s = k[:, h // G] @ q[t, h].cpu().double() * scale
                if cap is not None:
                    s = cap * torch.tanh(s / cap)
                p = torch.softmax(s.masked_fill(~seen, float("-inf")), 0)
                out[t, h] = p @ v[:, h // G]
    return out


@pytest.mark.parametrize("dtype,paged", [(torch.float32, False), (torch.bfloat16, True)])
def test_attention_scale_softcap_window(dtype, paged):
    """Scale, soft-cap and a window of 40 (shorter than every sequence: blocks before it are
    skipped, the trees' keys are seen by their positions) together; a soft-cap alone; a
    window of one token; a window past every key is no window, to the bit."""
    q, kv, meta, pos = _scene(dtype, paged)
    for scale, cap, window in [(0.2, 3.0, 40), (None, 5.0, None), (None, None, 1)]:
        got = fused.attention(q, kv.k[0], kv.v[0], meta, scale=scale, softcap=cap,
                              window=window, positions=pos)
        want = _reference(q, kv, meta, pos, scale or q.shape[-1] ** -0.5, cap, window)
        tol = 1e-5 if dtype == torch.float32 else 2 ** -7
        err = (got.cpu().double() - want).abs().max()
        assert err <= tol * want.abs().max().clamp_min(1), (scale, cap, window, float(err))
    full = fused.attention(q, kv.k[0], kv.v[0], meta)
    assert torch.equal(fused.attention(q, kv.k[0], kv.v[0], meta, window=10 ** 6,
                                       positions=pos), full)


def test_a_window_needs_positions():
    q, kv, meta, _ = _scene(torch.float32, False)
    with pytest.raises(ValueError, match="needs the tokens' positions"):
        fused.attention(q, kv.k[0], kv.v[0], meta, window=8)


def test_what_the_fused_layer_leaves_to_the_unfused_one():
    """A config without the family fields is Llama's (runs); q/k norm over a whole projection
    (OLMo 2) does not."""
    llama = SimpleNamespace()
    assert fused.unsupported(llama) is None
    assert fused.unsupported(SimpleNamespace(qk_norm="head", act="gelu_tanh",
                                             norm_place="sandwich")) is None
    assert fused.unsupported(SimpleNamespace(qk_norm="full")) == "q/k norm 'full'"
    assert fused.unsupported(SimpleNamespace(act="relu")) == "activation 'relu'"


def test_a_model_it_cannot_run_runs_unfused_and_says_so(tiny_llama, monkeypatch):
    """A config the fused layer cannot run: set_attention("fused") warns, naming what it
    cannot run, and the model is an sdpa one (forwards, --exact and graphs alike)."""
    import warnings
    from specctl.engine.loader import load_model
    monkeypatch.setattr(fused, "unsupported", lambda cfg: "q/k norm 'full'")
    calls = []
    monkeypatch.setattr(fused, "layers", lambda *a: calls.append(1))
    with pytest.warns(UserWarning, match="cannot run this llama model's q/k norm 'full': it "
                                         "runs the unfused layer"):
        m = load_model(tiny_llama, DEV, "fp32", attention="fused")
    assert m.attention == "sdpa"
    kv = m.new_kv_cache(1, 64)
    kv.reserve(0, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.forward(ForwardBatch([SeqInput(0, [3, 4, 5], 0)], DEV), kv)
    assert calls == []
    monkeypatch.undo()
    m.set_attention("fused")
    before = fused.LAUNCHES[0]
    m.forward(ForwardBatch([SeqInput(0, [6], 3)], DEV), kv)   # (a runnable one: fused)
    assert fused.LAUNCHES[0] > before


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """tests/families.py's tiny random checkpoints of the families whose layers have ops of
    their own (Phi-3's and Llama's are Llama's layers; their rope is made outside the layer),
    skipped where the decoder runs only Llama's (that module comes with it)."""
    fam = pytest.importorskip("families")
    return {f: fam.make_family_model(tmp_path_factory.mktemp(f), f)
            for f in ("qwen3", "gemma2", "gemma3", "olmo2", "granite")}


def _family_forward(path, attention: str):
    """A family model's states after a mixed forward (a decode row, a chain, a draft tree,
    each after a 24-40 token prefill: past every test window) and its K/V rows."""
    import warnings
    from specctl.engine.loader import load_model
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        m = load_model(path, DEV, "fp32", attention=attention)
    kv = m.new_kv_cache(3, 96)
    lens = [24, 33, 40]
    for s, n in enumerate(lens):
        kv.reserve(s, n + 8)
        m.forward(ForwardBatch([SeqInput(s, [5 + (7 * s + 3 * j) % 290 for j in range(n)], 0)],
                               DEV), kv)
        kv.lens[s] = n
    tree = build_trie([[5, 6, 7], [5, 8], [9]], 8)
    batch = ForwardBatch([SeqInput(0, [11], lens[0]), SeqInput(1, [12, 13, 14], lens[1]),
                          tree_input(2, 4, tree, lens[2])], DEV)
    return m.forward(batch, kv).double(), kv, [str(w.message) for w in said]


def test_every_family_through_the_fused_layer(family_models, monkeypatch):
    """Each family's decoding forward (q/k norms, GeLU-tanh, sandwich and post norms, soft-cap,
    sliding windows with their own rope, multipliers) through the fused kernels within 1e-5 of
    the unfused layer's, states and every K/V row; the one it cannot run (OLMo 2's q/k norm
    over the projection) runs unfused and says so."""
    for family, path in family_models.items():
        want, kv0, _ = _family_forward(path, "sdpa")
        before = fused.LAUNCHES[0]
        with monkeypatch.context() as mp:
            mp.setattr(fused, "FUSED_N", 8)   # (the prefills unfused, the step fused)
            got, kv1, said = _family_forward(path, "fused")
        ran = fused.LAUNCHES[0] > before
        assert ran == (family != "olmo2"), family
        if family == "olmo2":
            assert any("cannot run this olmo2 model's q/k norm 'full'" in s for s in said), said
        assert _close(got, want, torch.float32), (family, float((got - want).abs().max()))
        for i in range(len(kv0.k)):
            assert _close(kv1.k[i], kv0.k[i], torch.float32), (family, i)
            assert _close(kv1.v[i], kv0.v[i], torch.float32), (family, i)
