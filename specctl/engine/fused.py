"""The fused decoder layer for CUDA (`--attention fused`, the default there): a layer in nine
launches instead of 14, because a small model's decoding step is bound by launches, not by the
GPU (on an H100 the demo model's `ar` step took 1.81 ms where reading its weights takes 0.08).

    RMSNorm | QKV matmul | RoPE + K/V cache write | attention | O matmul + residual
    RMSNorm | gate/up matmul | SiLU-and-multiply | down matmul + residual

The matmuls stay cuBLAS's (the residual add in addmm's epilogue); the other four are Triton
kernels here, each one launch whatever the batch:
- rms_norm: a program per ROWS rows, each row's sum of squares in fp32;
- rope_kv: a program per ROWS tokens rotates their query and key heads (the rotate-half
  layout, rotate_half's sign folded into sin as Model._rope makes it), writes the queries
  [T, H, hd] and stores the keys and values straight into the cache rows `index` names (no
  index_put pair);
- attention: one program per (sequence, KV head, block of query rows), reading the sequence's
  cache rows in place through its block table (contiguous: one block per slot), the grouped
  query heads of a KV head as rows of one block (K/V read once per KV head), an online softmax
  in fp32 over blocks of BN keys under the forward's dense mask (trees and padding as SDPA sees
  them), the output written packed [T, H, hd], ready for the O matmul;
- silu_mul: silu(gate) * up in fp32, rounded once.
Results equal the unfused layer's up to rounding (bf16: a step or two; tests/test_fused.py).

It serves forwards of up to FUSED_N tokens a sequence (every decoding step, captured or not);
a prefill chunk is bound by its math, where SDPA's kernels are tuned, so it runs the unfused
layer. Under --exact it serves every forward: the row-wise kernels read one row's values
only, attention takes a row's keys in blocks of BN from column 0 on one tile shape (masked
keys add exact zeros), the matmuls are the probe's and the residual is added apart, so a row's
bits do not follow the batch (docs/internals.md). Nothing here synchronizes with the host: it
runs inside captured CUDA graphs.

Tested on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set before triton is first
imported). There a tl.dot is numpy's matmul, which multiplies bf16 wrongly (3.9), so under the
interpreter products are summed by one elementwise reduction instead (UPCAST), the operands
rounded to what tl.dot is given on the GPU. Imported only where the fused layer runs.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from specctl.engine.bi_matmul import IN_LAUNCH, LAUNCHES, launch as _launch, pow2  # noqa: F401

FUSED_N = 128    # most tokens a sequence a fused forward takes (graphs' max_n); past it, unfused
ROWS = 8         # tokens a program of the row-wise kernels takes (a decoding step's few rows
                 # keep their programs small; the interpreter's cost is per program)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# (Triton compiles a kernel anew for an int argument that is 1, or a multiple of 16, where it
# was not: the row counts and mask widths that change from forward to forward are exempt, so
# the kernels compile once a dtype and tile shape, when a runner's graphs are captured)

@triton.jit
def _cast(v, ty: tl.constexpr, FIX: tl.constexpr):
    """v (fp32) in ty, rounded to nearest even as the GPU's conversion rounds (the interpreter
    truncates to bf16, FIX: so there the rounding is done on the bits first)."""
    if FIX and ty == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        v = u.to(tl.float32, bitcast=True)
    return v.to(ty)


@triton.jit
def _tanh(x):
    """tanh in fp32 from exp (Triton's language has none), odd by construction."""
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit(do_not_specialize=["T"])
def _rms_kernel(x, w, out, T, D, s_x, s_o, eps, off, ROWS: tl.constexpr, BD: tl.constexpr,
                FIX: tl.constexpr):
    r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    d = tl.arange(0, BD)[None, :]
    m = (r < T) & (d < D)
    v = tl.load(x + r * s_x + d, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=1) / D + eps)
    wt = tl.load(w + d, mask=d < D, other=0.0).to(tl.float32) + off
    tl.store(out + r * s_o + d, _cast(v * rstd[:, None] * wt, out.dtype.element_ty, FIX),
             mask=m)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """x [T, D] -> RMSNorm(x) * (offset + w), in x's dtype (w in any dtype: the product is
    taken in fp32 and rounded once)."""
    T, D = x.shape
    out = torch.empty_like(x)
    if T:
        _launch(_rms_kernel, (triton.cdiv(T, ROWS),), x, w, out, T, D, x.stride(0),
                out.stride(0), eps, offset, ROWS=ROWS, BD=pow2(D), FIX=_INTERPRET)
    return out


@triton.jit(do_not_specialize=["T"])
def _rope_kv_kernel(qkv, cos, sin, index, q, kc, vc, qn, kn, T, s_t, s_cs, s_q, s_kc, s_vc, H, KV,
                    eps, off, ROWS: tl.constexpr, HD: tl.constexpr, HP: tl.constexpr,
                    DP: tl.constexpr, QKN: tl.constexpr, FIX: tl.constexpr):
    j = tl.arange(0, ROWS * HP)[:, None]             # (token, head) pairs of ROWS tokens
    t = (tl.program_id(0) * ROWS + j // HP).to(tl.int64)
    h = j % HP
    d = tl.arange(0, DP)[None, :]
    dm = (d < HD) & (t < T)
    rot = tl.where(d < HD // 2, d + HD // 2, d - HD // 2)    # rotate_half's source column
    src = qkv + t * s_t + h * HD
    x = tl.load(src + d, mask=(h < H + 2 * KV) & dm, other=0.0).to(tl.float32)
    xr = tl.load(src + rot, mask=(h < H + KV) & dm, other=0.0).to(tl.float32)
    if QKN:   # each query and key head RMS-normed over head_dim first (Qwen3, Gemma 3)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HD + eps)[:, None]
        isq = h < H
        wd = tl.where(isq, tl.load(qn + d, mask=d < HD, other=0.0).to(tl.float32),
                      tl.load(kn + d, mask=d < HD, other=0.0).to(tl.float32)) + off
        wr = tl.where(isq, tl.load(qn + rot, mask=d < HD, other=0.0).to(tl.float32),
                      tl.load(kn + rot, mask=d < HD, other=0.0).to(tl.float32)) + off
        qk = h < H + KV
        x = tl.where(qk, x * rstd * wd, x)
        xr = xr * rstd * wr
    c = tl.load(cos + t * s_cs + d, mask=dm, other=0.0).to(tl.float32)
    s = tl.load(sin + t * s_cs + d, mask=dm, other=0.0).to(tl.float32)
    y = _cast(tl.where(h < H + KV, x * c + xr * s, x), q.dtype.element_ty, FIX)
    row = tl.load(index + t, mask=t < T, other=0).to(tl.int64)
    tl.store(q + t * s_q + h * HD + d, y, mask=(h < H) & dm)
    tl.store(kc + row * s_kc + (h - H) * HD + d, y, mask=(h >= H) & (h < H + KV) & dm)
    tl.store(vc + row * s_vc + (h - H - KV) * HD + d, y,
             mask=(h >= H + KV) & (h < H + 2 * KV) & dm)


def rope_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: torch.Tensor,
            k_cache: torch.Tensor, v_cache: torch.Tensor, H: int, KV: int,
            q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
            eps: float = 1e-6, offset: float = 0.0) -> torch.Tensor:
    """qkv [T, (H + 2 KV) hd]; cos, sin [T, 1, hd] (Model._rope); index [T] cache rows; a
    layer's caches [rows, KV, hd]. Stores the rotated keys and the values at `index`, returns
    the rotated queries [T, H, hd]. q_norm, k_norm [hd]: each query / key head is first
    RMS-normed over head_dim and multiplied by (offset + w), in fp32 (rounded once, after the
    rotation)."""
    T, hd = qkv.shape[0], k_cache.shape[-1]
    q = torch.empty(T, H, hd, dtype=qkv.dtype, device=qkv.device)
    qkn = q_norm is not None
    if T:
        _launch(_rope_kv_kernel, (triton.cdiv(T, ROWS),), qkv, cos, sin, index, q, k_cache,
                v_cache, q_norm if qkn else qkv, k_norm if qkn else qkv, T, qkv.stride(0),
                cos.stride(0), q.stride(0), k_cache.stride(0), v_cache.stride(0), H, KV, eps,
                offset, ROWS=ROWS, HD=hd, HP=pow2(H + 2 * KV), DP=pow2(hd), QKN=qkn,
                FIX=_INTERPRET)
    return q


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """a [M, K] @ b [K, N] in fp32."""
    if UPCAST:   # (the interpreter: see the module docstring)
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit(do_not_specialize=["s_tb", "s_mb", "s_mi", "block", "L", "window"])
def _attn_kernel(q, kc, vc, o, table, starts, counts, prefix, mask, pos, s_qt, s_kr, s_vr, s_ot,
                 s_tb, s_mb, s_mi, block, L, scale, cap, window,
                 G: tl.constexpr, HD: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                 CAP: tl.constexpr, WIN: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    r = tl.program_id(2) * BM + tl.arange(0, BM)     # query row: token i, grouped head j
    n = tl.load(counts + b)
    i, j = r // G, r % G
    live = i < n
    start = tl.load(starts + b).to(tl.int64)
    tok = start + i
    d = tl.arange(0, DP)
    dm = d < HD
    head = (kvh * G + j) * HD
    qv = tl.load(q + tok[:, None] * s_qt + head[:, None] + d[None, :],
                 mask=live[:, None] & dm[None, :], other=0.0)
    pre = tl.load(prefix + b)
    kv_len = tl.minimum(pre + n, L)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, DP), tl.float32)
    c_lo = 0
    if WIN:   # a sliding-window layer: a key is seen while q_pos - k_pos < window
        qpos = tl.load(pos + tok, mask=live, other=0)
        # committed columns before every row's window hold no seen key: their blocks are
        # skipped (a block no row sees leaves the running sums as they were: the same bits)
        lo = tl.min(tl.where(live, qpos, 2147483647)) - window + 1
        c_lo = ((tl.maximum(tl.minimum(lo, pre), 0) // BN) * BN).to(tl.int32)
    for c0 in range(c_lo, kv_len, BN):
        c = c0 + tl.arange(0, BN)
        cm = c < kv_len
        blk = tl.load(table + b * s_tb + c // block, mask=cm, other=0).to(tl.int64)
        row = blk * block + c % block
        kt = tl.load(kc + row[None, :] * s_kr + kvh * HD + d[:, None],
                     mask=cm[None, :] & dm[:, None], other=0.0)              # [DP, BN]
        s = _dot(qv, kt, IEEE, UPCAST) * scale
        if CAP:   # soft-capped scores (Gemma 2)
            s = cap * _tanh(s / cap)
        seen = tl.load(mask + b * s_mb + i[:, None] * s_mi + c[None, :],
                       mask=live[:, None] & cm[None, :], other=0) != 0
        if WIN:   # a key's position: its column if committed, else its token's
            new = c - pre
            kpos = tl.where(new < 0, c, tl.load(pos + start + new, mask=cm & (new >= 0)
                                                & (new < n), other=0))
            seen = seen & (kpos[None, :] > qpos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # (a row that sees nothing yet)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(vc + row[:, None] * s_vr + kvh * HD + d[None, :],
                     mask=cm[:, None] & dm[None, :], other=0.0)              # [BN, DP]
        acc = acc * alpha[:, None] + _dot(p, vt.to(tl.float32), True, UPCAST)   # (p unrounded)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o + tok[:, None] * s_ot + head[:, None] + d[None, :],
             _cast(out, o.dtype.element_ty, UPCAST), mask=live[:, None] & dm[None, :])


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              meta, fixed: bool = False, scale: float | None = None,
              softcap: float | None = None, window: int | None = None,
              positions: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, hd]; a layer's caches [rows, KV, hd]; meta: attention.SdpaMeta with its
    per-sequence starts, counts, prefix and blocks -> [T, H, hd]. fixed (--exact): one tile
    shape whatever the rows, so a row's products run the same instructions in any batch.
    scale: the softmax scale (None: hd ** -0.5); softcap: scores capped to cap * tanh(s / cap);
    window (with the tokens' positions [T]): a sliding-window layer, a key seen while
    q_pos - k_pos < window (a committed row's position is its column)."""
    T, H, hd = q.shape
    KV = k_cache.shape[1]
    G = H // KV
    o = torch.empty_like(q)
    B = meta.blocks.shape[0]
    if not T:
        return o
    if window is not None and positions is None:
        raise ValueError("a sliding-window layer's attention needs the tokens' positions")
    rows = meta.n_max * G
    BM = 16 if fixed or rows <= 16 else 64
    mask = meta.mask.view(torch.uint8)          # [B, 1, N_max, L]
    _launch(
        _attn_kernel, (B, KV, triton.cdiv(rows, BM)), q, k_cache, v_cache, o, meta.blocks,
        meta.starts, meta.counts, meta.prefix, mask, q if window is None else positions,
        q.stride(0), k_cache.stride(0), v_cache.stride(0), o.stride(0), meta.blocks.stride(0),
        mask.stride(0), mask.stride(2), meta.block, mask.shape[-1],
        1.0 / math.sqrt(hd) if scale is None else scale, 1.0 if softcap is None else softcap,
        window or 0, G=G, HD=hd, DP=max(16, pow2(hd)), BM=BM, BN=64,
        IEEE=q.dtype == torch.float32, UPCAST=_INTERPRET, CAP=softcap is not None,
        WIN=window is not None, num_warps=8 if BM == 64 else 4)   # (BM 64 spills at 4 warps)
    return o


ACTS = ("silu", "gelu_tanh")   # the MLP activations act_mul runs (ModelConfig.act)


@triton.jit(do_not_specialize=["T"])
def _act_mul_kernel(gu, out, T, I, s_g, s_o, ROWS: tl.constexpr, BI: tl.constexpr,
                    GELU: tl.constexpr, FIX: tl.constexpr):
    t = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    c = (tl.program_id(1) * BI + tl.arange(0, BI))[None, :]
    m = (t < T) & (c < I)
    g = tl.load(gu + t * s_g + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu + t * s_g + I + c, mask=m, other=0.0).to(tl.float32)
    if GELU:   # gelu with the tanh approximation (gelu_pytorch_tanh)
        a = 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    else:
        a = g / (1.0 + tl.exp(-g))
    tl.store(out + t * s_o + c, _cast(a * u, out.dtype.element_ty, FIX), mask=m)


def act_mul(gu: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """gu [T, 2 I] (gate | up) -> act(gate) * up [T, I], act one of ACTS, in fp32 rounded
    once."""
    if act not in ACTS:
        raise ValueError(f"the fused layer has no activation {act!r} ({', '.join(ACTS)})")
    T, I2 = gu.shape
    out = torch.empty(T, I2 // 2, dtype=gu.dtype, device=gu.device)
    if T:
        BI = 512
        _launch(_act_mul_kernel, (triton.cdiv(T, ROWS), triton.cdiv(I2 // 2, BI)), gu, out,
                T, I2 // 2, gu.stride(0), out.stride(0), ROWS=ROWS, BI=BI,
                GELU=act == "gelu_tanh", FIX=_INTERPRET)
    return out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2 I] (gate | up) -> silu(gate) * up [T, I]."""
    return act_mul(gu, "silu")


def unsupported(cfg) -> str | None:
    """What of a model's layers the fused layer cannot run (the model then runs the unfused
    layer, and says so), or None. It runs Llama's layers and the family options of
    engine/config.py (read by name: a config without them is Llama's) but the q/k norm over a
    whole projection (OLMo 2): its sums span heads a program does not hold together."""
    if getattr(cfg, "qk_norm", "none") not in ("none", "head"):
        return f"q/k norm {cfg.qk_norm!r}"
    if getattr(cfg, "act", "silu") not in ACTS:
        return f"activation {cfg.act!r}"
    if getattr(cfg, "norm_place", "pre") not in ("pre", "post", "sandwich"):
        return f"norm placement {cfg.norm_place!r}"
    return None


def layers(model, x: torch.Tensor, positions: torch.Tensor, meta, kv, plan, end: int):
    """Model._layers' loop in the fused kernels (same contract), with the family's options
    (engine/config.py): norms before and/or after each block, per-head q/k norm in the RoPE
    kernel, GeLU-tanh, the attention's scale, soft-cap and sliding windows (their own rope
    where it differs), the residual multiplier. A norm weight is used as the layer holds it
    (a family's (1 + w) is folded into it at load, engine/layer.py)."""
    c = model.cfg
    cos, sin = model._rope(positions)
    local = model._rope(positions, local=True) if getattr(c, "local_rope", None) else None
    H, KV, hd, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_eps
    act, rs = getattr(c, "act", "silu"), getattr(c, "residual_scale", 1.0)
    scale, cap = getattr(c, "attn_scale", None), getattr(c, "attn_softcap", None)
    windows = getattr(c, "layer_windows", ())
    T = x.shape[0]
    # --exact: the matmuls its probe chose (a row's bits whatever the row count), the residual
    # added apart (addmm's epilogue is cuBLAS's), attention on one tile shape
    lin = model.linear if model.exact else torch.nn.functional.linear
    if model.exact:
        res = (lambda x, a, w, b: x + lin(a, w, b)) if rs == 1.0 else \
            (lambda x, a, w, b: x + lin(a, w, b) * rs)
    else:
        res = _residual if rs == 1.0 else (lambda x, a, w, b: _residual(x, a, w, b, rs))

    def block(x, pre, post, run):   # x + rs * post(run(pre(x))), the add in run's matmul
        h = x if pre is None else rms_norm(x, pre, eps)
        if post is None:
            return run(h, lambda a, w, b: res(x, a, w, b))
        y = rms_norm(run(h, lin), post, eps)
        return x + y if rs == 1.0 else x + y * rs

    def attn(i, x):
        L = model.layers[i]
        w = windows[i] if windows else None
        cs, sn = local if (w is not None and local is not None) else (cos, sin)

        def run(h, out):
            qkv = lin(h, L.wqkv, L.bqkv)
            q = rope_kv(qkv, cs, sn, meta.index, kv.k[i], kv.v[i], H, KV,
                        getattr(L, "q_norm", None), getattr(L, "k_norm", None), eps)
            o = attention(q, kv.k[i], kv.v[i], meta, model.exact, scale, cap, w, positions)
            return out(o.view(T, H * hd), L.wo, L.bo)
        return block(x, L.attn_norm, getattr(L, "attn_post", None), run)

    def mlp(i, x):
        L = model.layers[i]

        def run(h, out):
            return out(act_mul(lin(h, L.w_gate_up, L.b_gate_up), act), L.w_down, L.b_down)
        return block(x, L.mlp_norm, getattr(L, "mlp_post", None), run)
    return plan.run(x, end, attn, mlp)


def _residual(x, a, w, b, alpha: float = 1.0):
    """x + alpha (a @ w.T (+ b)), the add in the matmul's epilogue (one launch)."""
    if alpha == 1.0:
        return torch.addmm(x, a, w.t()) if b is None else torch.addmm(x + b, a, w.t())
    return torch.addmm(x if b is None else x + b * alpha, a, w.t(), alpha=alpha)
