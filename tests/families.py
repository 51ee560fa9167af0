"""Tiny random checkpoints of every family the engine runs, built with transformers' own config
and model classes, every feature of the family on (q/k norm, soft-caps, sliding windows shorter
than the prompts, tied embeddings where the family ties, rope scaling), saved in shards."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny import make_tokenizer

WINDOW = 8          # sliding windows: shorter than the test prompts
LAYERS = 4          # what tests/helpers.method_drafters' skip set and adapter expect
HEAD_DIM = 16


def _llama_rope(kind: str) -> dict:
    if kind == "yarn":
        return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}
    return {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}


def _config(family: str, common: dict):
    """(config, model class) of a family, every feature on."""
    import transformers as t
    hd = common["hidden_size"] // common["num_attention_heads"]
    if family == "qwen3":   # per-head q/k norm; sliding windows in the upper layers; YaRN
        return t.Qwen3Config(**common, head_dim=hd, tie_word_embeddings=True,
                             use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                             rope_parameters=_llama_rope("yarn")), t.Qwen3ForCausalLM
    if family == "gemma2":  # (1 + w) sandwich norms, GeLU-tanh, scale, soft-caps, windows
        return t.Gemma2Config(**common, head_dim=hd, tie_word_embeddings=True,
                              sliding_window=WINDOW, query_pre_attn_scalar=24,
                              attn_logit_softcapping=4.0, final_logit_softcapping=6.0,
                              attn_implementation="eager"), t.Gemma2ForCausalLM
    if family == "gemma3":  # + per-head q/k norm, local rope base, scaled global rope
        rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
        types = ["sliding_attention", "sliding_attention", "full_attention",
                 "sliding_attention"]
        return t.Gemma3TextConfig(**common, head_dim=hd, tie_word_embeddings=True,
                                  sliding_window=WINDOW, query_pre_attn_scalar=24,
                                  final_logit_softcapping=6.0, layer_types=types,
                                  rope_parameters=rope, attn_implementation="eager"), \
            t.Gemma3ForCausalLM
    if family == "phi3":    # fused qkv / gate_up, LongRoPE, a window on every layer
        half = hd // 2
        rope = {"rope_type": "longrope", "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.1 * i for i in range(half)],
                "long_factor": [1.0 + 0.5 * i for i in range(half)]}
        return t.Phi3Config(**{**common, "max_position_embeddings": 512},
                            original_max_position_embeddings=128, rope_parameters=rope,
                            sliding_window=WINDOW, pad_token_id=0), t.Phi3ForCausalLM
    if family == "olmo2":   # norms after the blocks, q/k norm over the whole projection
        return t.Olmo2Config(**common, pad_token_id=0), t.Olmo2ForCausalLM
    if family == "granite":  # the four multipliers
        return t.GraniteConfig(**common, embedding_multiplier=3.0, residual_multiplier=0.5,
                               attention_multiplier=0.2, logits_scaling=2.0), \
            t.GraniteForCausalLM
    if family == "mistral":  # a window on every layer
        return t.MistralConfig(**common, sliding_window=WINDOW), t.MistralForCausalLM
    if family in ("llama-yarn", "llama-dynamic"):
        return t.LlamaConfig(**common, rope_parameters=_llama_rope(family[6:])), \
            t.LlamaForCausalLM
    raise ValueError(family)


FAMILIES = ("qwen3", "gemma2", "gemma3", "phi3", "olmo2", "granite", "llama-yarn")
LOGITS_ONLY = ("llama-dynamic", "mistral")   # (nothing in them the others' greedy tests miss)


def make_family_model(out: Path, family: str, seed: int = 0) -> Path:
    """Save a random `family` model (LAYERS layers, hidden 64) + tokenizer under `out` in
    several safetensors shards; return the folder."""
    return build_family_model(out, family, seed)[0]


def build_family_model(out: Path, family: str, seed: int = 0):
    """make_family_model, returning (the folder, transformers' model it saved, in eval mode)."""
    from transformers import GenerationConfig
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out, 320)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=192,
                  num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-5, eos_token_id=eos,
                  bos_token_id=eos)
    cfg, cls = _config(family, common)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():   # less uniform than the init, so greedy paths are decisive
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(4.0)
            elif "norm" in name:   # norms away from their init (1, or 0 for Gemma's 1 + w)
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB")
    GenerationConfig(eos_token_id=eos).save_pretrained(out)
    return out, model
