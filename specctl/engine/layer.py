"""One decoder layer's weights, the per-family ops, and the layer loop of a family with options
on (family_layers; Llama's own stays in engine/model.py).

A layer's weights are plain tensors in HF layout, q/k/v and gate/up concatenated so a block does
two matmuls for attention and two for the MLP. Its norms sit where the family puts them
(ModelConfig.norm_place):

    pre       x + attn(norm(x));        x + mlp(norm(x))            Llama, Qwen, Phi-3, Granite
    sandwich  x + norm(attn(norm(x)));  x + norm(mlp(norm(x)))      Gemma 2/3
    post      x + norm(attn(x));        x + norm(mlp(x))            OLMo 2

so a block has an input norm (`attn_norm` / `mlp_norm`, None where there is none) and an output
norm (`attn_post` / `mlp_post`). Families whose RMSNorm multiplies in fp32 (Gemma's (1 + w),
OLMo 2's w * x) keep that weight in fp32 (the offset added once here); `norm` then normalises in
fp32 and casts back, as transformers does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specctl.engine import exact
from specctl.engine.attention import windowed
from specctl.engine.config import ModelConfig


def norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: torch's fused rms_norm (see model.rms_norm), in fp32
    where the weight is kept in fp32 (the families above)."""
    if w.dtype != x.dtype:
        return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def exact_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """gelu_tanh from basic operations and exact.det_tanh (--exact: the same bits wherever an
    element sits), in fp32."""
    x32 = x.float()
    inner = 0.7978845608028654 * (x32 + 0.044715 * x32 * x32 * x32)
    return (0.5 * x32 * (1.0 + exact.det_tanh(inner))).to(x.dtype)


ACTS = {"silu": (F.silu, exact.silu), "gelu_tanh": (gelu_tanh, exact_gelu_tanh)}


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2's soft-capping), or x."""
    return x if cap is None else torch.tanh(x / cap) * cap


def fp32_norms(cfg: ModelConfig) -> bool:
    """Whether the family's RMSNorm multiplies by its weight in fp32 (Gemma, OLMo 2)."""
    return cfg.norm_offset != 0.0 or cfg.norm_place == "post"


def norm_weight(w: torch.Tensor | None, cfg: ModelConfig) -> torch.Tensor | None:
    """A norm's weight as `norm` takes it: (norm_offset + w) in fp32 for fp32_norms."""
    if w is None or not fp32_norms(cfg):
        return w
    return w.float() + cfg.norm_offset


class Layer:
    def __init__(self, w: dict[str, torch.Tensor], cfg: ModelConfig):
        """w: the layer's HF-named tensors (prefix `model.layers.i.` removed), q/k/v and
        gate/up already split (engine/loader.py)."""
        nw = (lambda name: norm_weight(w.get(name), cfg))
        if cfg.norm_place == "pre":
            self.attn_norm, self.attn_post = nw("input_layernorm.weight"), None
            self.mlp_norm, self.mlp_post = nw("post_attention_layernorm.weight"), None
        elif cfg.norm_place == "sandwich":
            self.attn_norm = nw("input_layernorm.weight")
            self.attn_post = nw("post_attention_layernorm.weight")
            self.mlp_norm = nw("pre_feedforward_layernorm.weight")
            self.mlp_post = nw("post_feedforward_layernorm.weight")
        else:   # post
            self.attn_norm, self.attn_post = None, nw("post_attention_layernorm.weight")
            self.mlp_norm, self.mlp_post = None, nw("post_feedforward_layernorm.weight")
        a = "self_attn."
        self.q_norm = nw(a + "q_norm.weight")
        self.k_norm = nw(a + "k_norm.weight")
        self.wqkv = torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"],
                               w[a + "v_proj.weight"]])
        self.bqkv = (torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
                     if a + "q_proj.bias" in w else None)
        self.wo = w[a + "o_proj.weight"]
        self.bo = w.get(a + "o_proj.bias")
        m = "mlp."
        self.w_gate_up = torch.cat([w[m + "gate_proj.weight"], w[m + "up_proj.weight"]])
        self.b_gate_up = (torch.cat([w[m + "gate_proj.bias"], w[m + "up_proj.bias"]])
                          if m + "gate_proj.bias" in w else None)
        self.w_down = w[m + "down_proj.weight"]
        self.b_down = w.get(m + "down_proj.bias")


def plain(cfg: ModelConfig) -> bool:
    """Whether the layers are Llama's (what the fused layer, engine/fused.py, runs): none of
    the per-layer family options on."""
    return (cfg.act == "silu" and cfg.norm_place == "pre" and cfg.norm_offset == 0.0
            and cfg.qk_norm == "none" and cfg.residual_scale == 1.0 and cfg.attn_scale is None
            and cfg.attn_softcap is None and not cfg.layer_windows and cfg.local_rope is None)


def qk_normed(qkv: torch.Tensor, L: Layer, cfg: ModelConfig) -> torch.Tensor:
    """The [T, H + KV, hd] queries and keys of a QKV projection, q/k-normed as the family does
    (per head: Qwen3, Gemma 3; over the whole projection: OLMo 2)."""
    T, H, KV, hd = qkv.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qk = qkv[:, :(H + KV) * hd]
    if cfg.qk_norm == "none":
        return qk.view(T, H + KV, hd)
    if cfg.qk_norm == "full":
        q = norm(qk[:, :H * hd], L.q_norm, cfg.rms_eps)
        k = norm(qk[:, H * hd:], L.k_norm, cfg.rms_eps)
        return torch.cat((q, k), dim=-1).view(T, H + KV, hd)
    qk = qk.view(T, H + KV, hd)
    return torch.cat((norm(qk[:, :H], L.q_norm, cfg.rms_eps),
                      norm(qk[:, H:], L.k_norm, cfg.rms_eps)), dim=1)


def family_layers(model, x, positions, meta, kv, plan, end: int):
    """Model._layers (same contract) with the family's options on: norms where it puts them,
    q/k norm, its activation, attention scale and soft-cap, residual multiplier, and
    sliding-window layers (their own mask, and rope where it differs)."""
    c = model.cfg
    ropes = {False: model._rope(positions)}
    if len(model._ropes) > 1:
        ropes[True] = model._rope(positions, local=True)
    T, H, KV, hd = x.shape[0], c.num_heads, c.num_kv_heads, c.head_dim

    def block(x, pre, post, out):   # x + residual_scale * post(out(pre(x)))
        y = out(norm(x, pre, c.rms_eps) if pre is not None else x)
        y = norm(y, post, c.rms_eps) if post is not None else y
        return x + y if c.residual_scale == 1.0 else x + y * c.residual_scale

    def attn(i, x):
        L, w = model.layers[i], c.window(i)

        def run(h):
            qkv = model.linear(h, L.wqkv, L.bqkv)
            cos, sin = ropes[w is not None and len(ropes) > 1]
            qk = model.apply_rope(qk_normed(qkv, L, c), cos, sin)
            kv.write(i, meta.index, qk[:, H:], qkv[:, (H + KV) * hd:].view(T, KV, hd))
            m = meta if w is None else windowed(meta, positions, w)
            o = model.attend(qk[:, :H], kv.k[i], kv.v[i], m, scale=c.attn_scale,
                             softcap=c.attn_softcap)
            return model.linear(o.reshape(T, H * hd), L.wo, L.bo)
        return block(x, L.attn_norm, L.attn_post, run)

    def mlp(i, x):
        L = model.layers[i]

        def run(h):
            g, u = model.linear(h, L.w_gate_up, L.b_gate_up).chunk(2, dim=-1)
            return model.linear(model.act(g) * u, L.w_down, L.b_down)
        return block(x, L.mlp_norm, L.mlp_post, run)
    return plan.run(x, end, attn, mlp)
