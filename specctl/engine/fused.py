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

from specctl.engine.bi_matmul import IN_LAUNCH, LAUNCHES, launch as _launch  # noqa: F401

FUSED_N = 128    # most tokens a sequence a fused forward takes (graphs' max_n); past it, unfused
ROWS = 8         # tokens a program of the row-wise kernels takes (a decoding step's few rows
                 # keep their programs small; the interpreter's cost is per program)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# (Triton compiles a kernel anew for an int argument that is 1, or a multiple of 16, where it
# was not: the row counts and mask widths that change from forward to forward are exempt, so
# the kernels compile once a dtype and tile shape, when a runner's graphs are captured)

def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


@triton.jit
def _cast(v, ty: tl.constexpr, FIX: tl.constexpr):
    """v (fp32) in ty, rounded to nearest even as the GPU's conversion rounds (the interpreter
    truncates to bf16, FIX: so there the rounding is done on the bits first)."""
    if FIX and ty == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        v = u.to(tl.float32, bitcast=True)
    return v.to(ty)


@triton.jit(do_not_specialize=["T"])
def _rms_kernel(x, w, out, T, D, s_x, s_o, eps, ROWS: tl.constexpr, BD: tl.constexpr,
                FIX: tl.constexpr):
    r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    d = tl.arange(0, BD)[None, :]
    m = (r < T) & (d < D)
    v = tl.load(x + r * s_x + d, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=1) / D + eps)
    wt = tl.load(w + d, mask=d < D, other=0.0).to(tl.float32)
    tl.store(out + r * s_o + d, _cast(v * rstd[:, None] * wt, out.dtype.element_ty, FIX),
             mask=m)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, D] -> RMSNorm(x) * w, in x's dtype."""
    T, D = x.shape
    out = torch.empty_like(x)
    if T:
        _launch(_rms_kernel, (triton.cdiv(T, ROWS),), x, w, out, T, D, x.stride(0),
                out.stride(0), eps, ROWS=ROWS, BD=_pow2(D), FIX=_INTERPRET)
    return out


@triton.jit(do_not_specialize=["T"])
def _rope_kv_kernel(qkv, cos, sin, index, q, kc, vc, T, s_t, s_cs, s_q, s_kc, s_vc, H, KV,
                    ROWS: tl.constexpr, HD: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr,
                    FIX: tl.constexpr):
    j = tl.arange(0, ROWS * HP)[:, None]             # (token, head) pairs of ROWS tokens
    t = (tl.program_id(0) * ROWS + j // HP).to(tl.int64)
    h = j % HP
    d = tl.arange(0, DP)[None, :]
    dm = (d < HD) & (t < T)
    rot = tl.where(d < HD // 2, d + HD // 2, d - HD // 2)    # rotate_half's source column
    src = qkv + t * s_t + h * HD
    x = tl.load(src + d, mask=(h < H + 2 * KV) & dm, other=0.0).to(tl.float32)
    xr = tl.load(src + rot, mask=(h < H + KV) & dm, other=0.0).to(tl.float32)
    c = tl.load(cos + t * s_cs + d, mask=dm, other=0.0).to(tl.float32)
    s = tl.load(sin + t * s_cs + d, mask=dm, other=0.0).to(tl.float32)
    y = _cast(tl.where(h < H + KV, x * c + xr * s, x), q.dtype.element_ty, FIX)
    row = tl.load(index + t, mask=t < T, other=0).to(tl.int64)
    tl.store(q + t * s_q + h * HD + d, y, mask=(h < H) & dm)
    tl.store(kc + row * s_kc + (h - H) * HD + d, y, mask=(h >= H) & (h < H + KV) & dm)
    tl.store(vc + row * s_vc + (h - H - KV) * HD + d, y,
             mask=(h >= H + KV) & (h < H + 2 * KV) & dm)


def rope_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: torch.Tensor,
            k_cache: torch.Tensor, v_cache: torch.Tensor, H: int, KV: int) -> torch.Tensor:
    """qkv [T, (H + 2 KV) hd]; cos, sin [T, 1, hd] (Model._rope); index [T] cache rows; a
    layer's caches [rows, KV, hd]. Stores the rotated keys and the values at `index`, returns
    the rotated queries [T, H, hd]."""
    T, hd = qkv.shape[0], k_cache.shape[-1]
    q = torch.empty(T, H, hd, dtype=qkv.dtype, device=qkv.device)
    if T:
        _launch(_rope_kv_kernel, (triton.cdiv(T, ROWS),), qkv, cos, sin, index, q, k_cache,
                v_cache, T, qkv.stride(0), cos.stride(0), q.stride(0), k_cache.stride(0),
                v_cache.stride(0), H, KV, ROWS=ROWS, HD=hd, HP=_pow2(H + 2 * KV),
                DP=_pow2(hd), FIX=_INTERPRET)
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


@triton.jit(do_not_specialize=["s_tb", "s_mb", "s_mi", "block", "L"])
def _attn_kernel(q, kc, vc, o, table, starts, counts, prefix, mask, s_qt, s_kr, s_vr, s_ot,
                 s_tb, s_mb, s_mi, block, L, scale,
                 G: tl.constexpr, HD: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    r = tl.program_id(2) * BM + tl.arange(0, BM)     # query row: token i, grouped head j
    n = tl.load(counts + b)
    i, j = r // G, r % G
    live = i < n
    tok = tl.load(starts + b).to(tl.int64) + i
    d = tl.arange(0, DP)
    dm = d < HD
    head = (kvh * G + j) * HD
    qv = tl.load(q + tok[:, None] * s_qt + head[:, None] + d[None, :],
                 mask=live[:, None] & dm[None, :], other=0.0)
    kv_len = tl.minimum(tl.load(prefix + b) + n, L)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, DP), tl.float32)
    for c0 in range(0, kv_len, BN):
        c = c0 + tl.arange(0, BN)
        cm = c < kv_len
        blk = tl.load(table + b * s_tb + c // block, mask=cm, other=0).to(tl.int64)
        row = blk * block + c % block
        kt = tl.load(kc + row[None, :] * s_kr + kvh * HD + d[:, None],
                     mask=cm[None, :] & dm[:, None], other=0.0)              # [DP, BN]
        s = _dot(qv, kt, IEEE, UPCAST) * scale
        seen = tl.load(mask + b * s_mb + i[:, None] * s_mi + c[None, :],
                       mask=live[:, None] & cm[None, :], other=0)
        s = tl.where(seen != 0, s, float("-inf"))
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
              meta, fixed: bool = False) -> torch.Tensor:
    """q [T, H, hd]; a layer's caches [rows, KV, hd]; meta: attention.SdpaMeta with its
    per-sequence starts, counts, prefix and blocks -> [T, H, hd]. fixed (--exact): one tile
    shape whatever the rows, so a row's products run the same instructions in any batch."""
    T, H, hd = q.shape
    KV = k_cache.shape[1]
    G = H // KV
    o = torch.empty_like(q)
    B = meta.blocks.shape[0]
    if not T:
        return o
    rows = meta.n_max * G
    BM = 16 if fixed or rows <= 16 else 64
    mask = meta.mask.view(torch.uint8)          # [B, 1, N_max, L]
    _launch(
        _attn_kernel, (B, KV, triton.cdiv(rows, BM)), q, k_cache, v_cache, o, meta.blocks,
        meta.starts, meta.counts, meta.prefix, mask,
        q.stride(0), k_cache.stride(0), v_cache.stride(0), o.stride(0), meta.blocks.stride(0),
        mask.stride(0), mask.stride(2), meta.block, mask.shape[-1], 1.0 / math.sqrt(hd),
        G=G, HD=hd, DP=max(16, _pow2(hd)), BM=BM, BN=64, IEEE=q.dtype == torch.float32,
        UPCAST=_INTERPRET, num_warps=8 if BM == 64 else 4)   # (BM 64 spills at 4 warps)
    return o


@triton.jit(do_not_specialize=["T"])
def _silu_mul_kernel(gu, out, T, I, s_g, s_o, ROWS: tl.constexpr, BI: tl.constexpr,
                     FIX: tl.constexpr):
    t = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    c = (tl.program_id(1) * BI + tl.arange(0, BI))[None, :]
    m = (t < T) & (c < I)
    g = tl.load(gu + t * s_g + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu + t * s_g + I + c, mask=m, other=0.0).to(tl.float32)
    tl.store(out + t * s_o + c, _cast(g / (1.0 + tl.exp(-g)) * u, out.dtype.element_ty, FIX),
             mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2 I] (gate | up) -> silu(gate) * up [T, I]."""
    T, I2 = gu.shape
    out = torch.empty(T, I2 // 2, dtype=gu.dtype, device=gu.device)
    if T:
        BI = 512
        _launch(_silu_mul_kernel, (triton.cdiv(T, ROWS), triton.cdiv(I2 // 2, BI)), gu, out,
                T, I2 // 2, gu.stride(0), out.stride(0), ROWS=ROWS, BI=BI, FIX=_INTERPRET)
    return out


def layers(model, x: torch.Tensor, positions: torch.Tensor, meta, kv, plan, end: int):
    """Model._layers' loop in the fused kernels (same contract)."""
    c = model.cfg
    cos, sin = model._rope(positions)
    H, KV, hd, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_eps
    T = x.shape[0]
    # --exact: the matmuls its probe chose (a row's bits whatever the row count), the residual
    # added apart (addmm's epilogue is cuBLAS's), attention on one tile shape
    lin = model.linear if model.exact else torch.nn.functional.linear
    res = _residual if not model.exact else (lambda x, a, w, b: x + lin(a, w, b))

    def attn(i, x):
        L = model.layers[i]
        qkv = lin(rms_norm(x, L.attn_norm, eps), L.wqkv, L.bqkv)
        q = rope_kv(qkv, cos, sin, meta.index, kv.k[i], kv.v[i], H, KV)
        o = attention(q, kv.k[i], kv.v[i], meta, model.exact).view(T, H * hd)
        return res(x, o, L.wo, L.bo)

    def mlp(i, x):
        L = model.layers[i]
        gu = lin(rms_norm(x, L.mlp_norm, eps), L.w_gate_up, L.b_gate_up)
        return res(x, silu_mul(gu), L.w_down, L.b_down)
    return plan.run(x, end, attn, mlp)


def _residual(x, a, w, b):
    """x + a @ w.T (+ b), the add in the matmul's epilogue (one launch)."""
    return torch.addmm(x, a, w.t()) if b is None else torch.addmm(x + b, a, w.t())
