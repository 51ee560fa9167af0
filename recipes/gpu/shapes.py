"""Models with random weights, built in memory, for measuring the engine at a given size.

    from shapes import random_model
    model = random_model("7b", device="cuda", dtype=torch.bfloat16)

A step's speed does not depend on the weights' values, only on their shapes, so the engine can be
timed at real model size without a checkpoint. Weights are drawn small (std 0.02) so activations
stay finite and the kernels see realistic, non-zero data (zeros can run faster than real data).
"""

from __future__ import annotations

import torch

from specctl.engine.config import ModelConfig, RopeConfig
from specctl.engine.model import Model

SHAPES = {
    # SmolLM2-135M-Instruct, the demo model
    "demo": ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                        num_heads=9, num_kv_heads=3, head_dim=64, rms_eps=1e-5,
                        max_position=8192, tie_embeddings=True,
                        rope=RopeConfig(theta=100000.0)),
    # Llama-2-7B: 32 layers, 32 heads (no GQA), 4096 hidden, 11008 MLP, 32000 vocab
    "7b": ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32,
                      num_heads=32, num_kv_heads=32, head_dim=128, rms_eps=1e-5,
                      max_position=4096),
    # a small model of the same structure (GQA, untied head), for running the recipes on a CPU
    "mini": ModelConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=32, rms_eps=1e-5,
                        max_position=4096),
}


def random_weights(cfg: ModelConfig, device, dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    D, I, H, KV, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                       cfg.head_dim)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
                * 0.02).to(dtype)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    w = {"model.embed_tokens.weight": rnd(cfg.vocab_size, D), "model.norm.weight": ones(D)}
    if not cfg.tie_embeddings:
        w["lm_head.weight"] = rnd(cfg.vocab_size, D)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": ones(D), p + "post_attention_layernorm.weight": ones(D),
                  p + "self_attn.q_proj.weight": rnd(H * hd, D),
                  p + "self_attn.k_proj.weight": rnd(KV * hd, D),
                  p + "self_attn.v_proj.weight": rnd(KV * hd, D),
                  p + "self_attn.o_proj.weight": rnd(D, H * hd),
                  p + "mlp.gate_proj.weight": rnd(I, D), p + "mlp.up_proj.weight": rnd(I, D),
                  p + "mlp.down_proj.weight": rnd(D, I)})
    return w


def random_model(shape: str, device="cuda", dtype=torch.bfloat16, seed: int = 0) -> Model:
    cfg = SHAPES[shape]
    w = random_weights(cfg, torch.device(device), dtype, seed)
    model = Model(cfg, w)
    del w   # Model keeps fused copies (qkv, gate_up): drop the unfused ones
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return model


def weight_bytes(model: Model) -> int:
    """Bytes one decoding step must read: every layer's weights, the final norm and LM head."""
    n = model.lm_head.numel() + model.norm.numel()
    for L in model.layers:
        n += sum(t.numel() for t in (L.attn_norm, L.mlp_norm, L.wqkv, L.wo, L.w_gate_up, L.w_down))
    return n * model.lm_head.element_size()
