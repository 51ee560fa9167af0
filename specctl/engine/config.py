"""Model configuration of the decoder, read from a Hugging Face `config.json`: the one place that
reads one.

The families (docs/families.md) share one block structure -- norm -> GQA attention with RoPE ->
norm -> gated MLP -- and differ in declared options that the one decoder (engine/model.py)
honours: norm kind and placement, q/k norm, activation, multipliers, soft-caps, sliding-window
layers and the rope variant. Each family's options are set here, from its config.json
(`_family`); defaults are Llama's. Both the transformers v4 (`rope_theta` / `rope_scaling`) and v5
(`rope_parameters`) spellings are understood. Configs are frozen: nothing mutates one at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specctl.models.checkpoint import SUPPORTED_TYPES   # (a folder is checked there first)


class ConfigError(ValueError):
    """The checkpoint's config is not one this engine can run (message says why)."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3 | yarn | longrope | dynamic (see _rope)
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    attention_factor: float = 1.0     # yarn, longrope: cos and sin are multiplied by it
    beta_fast: float = 32.0           # yarn's ramp
    beta_slow: float = 1.0
    truncate: bool = True
    short_factor: tuple[float, ...] = ()   # longrope: per-frequency divisors below and from
    long_factor: tuple[float, ...] = ()    # original_max_position


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6
    max_position: int = 4096
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    model_type: str = "llama"
    # per-family options (defaults: Llama's); the field names are shared with engine/loader.py
    act: str = "silu"                  # silu | gelu_tanh
    norm_offset: float = 0.0           # RMSNorm multiplies by (norm_offset + w): Gemma's 1
    norm_place: str = "pre"            # pre | post (OLMo 2) | sandwich (Gemma 2/3)
    qk_norm: str = "none"              # none | head (Qwen3, Gemma 3) | full (OLMo 2)
    embed_scale: float = 1.0           # embeddings x it (Gemma sqrt(D), in the model dtype)
    residual_scale: float = 1.0        # each block's output x it before the add (Granite)
    attn_scale: float | None = None    # softmax scale; None: head_dim ** -0.5
    logit_scale: float = 1.0           # logits x it (Granite: 1 / logits_scaling)
    attn_softcap: float | None = None  # cap * tanh(score / cap) (Gemma 2)
    final_softcap: float | None = None
    layer_windows: tuple[int | None, ...] = ()   # per layer: sliding window, None = global
    local_rope: RopeConfig | None = None         # the windowed layers' rope where it differs

    def window(self, layer: int) -> int | None:
        """Layer's sliding window in tokens (a key is seen while q_pos - k_pos < window)."""
        return self.layer_windows[layer] if self.layer_windows else None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.act not in ACTS or self.norm_place not in ("pre", "post", "sandwich") or \
                self.qk_norm not in ("none", "head", "full"):
            raise ConfigError(f"unknown option act={self.act!r} norm_place={self.norm_place!r} "
                              f"qk_norm={self.qk_norm!r}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ConfigError(f"{len(self.layer_windows)} layer windows for "
                              f"{self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ConfigError(f"sliding windows must be positive, got {self.layer_windows}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """Build from a parsed HF config.json (raises ConfigError on what it cannot run)."""
        mtype = cfg.get("model_type", "llama")
        if mtype not in SUPPORTED_TYPES:
            raise ConfigError(
                f"model_type {mtype!r} is not supported (supported: {', '.join(SUPPORTED_TYPES)})")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
            layers = int(cfg["num_hidden_layers"])
            attn_bias = bool(cfg.get("attention_bias", False))
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position=_max_position(cfg),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", mtype in TIED_BY_DEFAULT)),
                qkv_bias=attn_bias or mtype == "qwen2",
                o_bias=attn_bias and mtype != "qwen2",
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                rope=_rope_from_hf(cfg),
                model_type=mtype,
                layer_windows=_windows(cfg, mtype, layers),
                **_family(cfg, mtype, hidden),
            )
        except KeyError as e:
            raise ConfigError(f"config.json lacks the field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"config.json has a field of the wrong type ({e})") from None


ACTS = ("silu", "gelu_tanh")
_HF_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
TIED_BY_DEFAULT = ("gemma2", "gemma3_text")   # their config classes tie unless told not to


def _family(cfg: dict[str, Any], mtype: str, hidden: int) -> dict[str, Any]:
    """The per-family options of ModelConfig from the family's own config fields."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in _HF_ACTS:
        raise ConfigError(f"hidden_act {act!r} is not supported "
                          f"(supported: {', '.join(_HF_ACTS)})")
    out: dict[str, Any] = {"act": _HF_ACTS[act]}
    if mtype in ("gemma2", "gemma3_text"):
        scalar = cfg.get("query_pre_attn_scalar")
        out.update(norm_offset=1.0, norm_place="sandwich", embed_scale=hidden ** 0.5,
                   attn_scale=float(scalar) ** -0.5 if scalar else None,
                   attn_softcap=_opt_float(cfg.get("attn_logit_softcapping")),
                   final_softcap=_opt_float(cfg.get("final_logit_softcapping")))
        if mtype == "gemma3_text":
            out.update(qk_norm="head", local_rope=_local_rope(cfg))
    elif mtype == "qwen3":
        out["qk_norm"] = "head"
    elif mtype == "olmo2":
        out.update(norm_place="post", qk_norm="full")
    elif mtype == "granite":
        out.update(embed_scale=float(cfg.get("embedding_multiplier", 1.0)),
                   residual_scale=float(cfg.get("residual_multiplier", 1.0)),
                   attn_scale=float(cfg.get("attention_multiplier", 1.0)),
                   logit_scale=1.0 / float(cfg.get("logits_scaling", 1.0)))
    return out


def _max_position(cfg: dict[str, Any]) -> int:
    """The context we run: max_position_embeddings, and under dynamic NTK rope no further than
    where its frequencies are still the default ones (see _rope)."""
    n = int(cfg.get("max_position_embeddings", 4096))
    rope = _rope_from_hf(cfg)
    return min(n, rope.original_max_position) if rope.kind == "dynamic" else n


def _opt_float(v) -> float | None:
    return None if v is None else float(v)


def _windows(cfg: dict[str, Any], mtype: str, layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window (an empty tuple where every layer is global): from
    `layer_types` where the config lists them, else by each family's own rule."""
    window = cfg.get("sliding_window")
    if not window:
        return ()
    types = cfg.get("layer_types")
    if isinstance(types, list):
        if len(types) != layers:
            raise ConfigError(f"layer_types lists {len(types)} layers, not {layers}")
        sliding = [t == "sliding_attention" for t in types]
    elif mtype in ("mistral", "phi3"):
        sliding = [True] * layers
    elif mtype in ("qwen2", "qwen3"):
        first = int(cfg.get("max_window_layers", layers))
        sliding = [bool(cfg.get("use_sliding_window")) and i >= first for i in range(layers)]
    elif mtype == "gemma2":
        sliding = [i % 2 == 0 for i in range(layers)]
    elif mtype == "gemma3_text":
        every = int(cfg.get("sliding_window_pattern", 6))
        sliding = [(i + 1) % every != 0 for i in range(layers)]
    else:
        sliding = [False] * layers
    return () if not any(sliding) else tuple(int(window) if s else None for s in sliding)


def _rope_from_hf(cfg: dict[str, Any]) -> RopeConfig:
    """The (global layers') rope. v5 nests Gemma 3's per layer type."""
    params = dict(cfg.get("rope_parameters") or {})
    if isinstance(params.get("full_attention"), dict):
        params = dict(params["full_attention"])
    return _rope(cfg, {**dict(cfg.get("rope_scaling") or {}), **params})


def _local_rope(cfg: dict[str, Any]) -> RopeConfig:
    """Gemma 3's sliding-window layers' rope (v5: rope_parameters.sliding_attention, v4:
    rope_local_base_freq, unscaled)."""
    params = cfg.get("rope_parameters") or {}
    if isinstance(params.get("sliding_attention"), dict):
        return _rope(cfg, dict(params["sliding_attention"]))
    return RopeConfig(theta=float(cfg.get("rope_local_base_freq", 10000.0)))


def _rope(cfg: dict[str, Any], p: dict[str, Any]) -> RopeConfig:
    """One rope from its parameters p (rope_scaling and rope_parameters merged), as
    transformers' modeling_rope_utils computes it."""
    theta = float(p.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    partial = float(p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ConfigError(f"partial_rotary_factor {partial} is not supported (only 1.0)")
    kind = p.get("rope_type", p.get("type", "default")) or "default"
    max_pos = int(cfg.get("max_position_embeddings", 4096))
    orig = int(p.get("original_max_position_embeddings")
               or cfg.get("original_max_position_embeddings") or max_pos)
    if kind in ("default", "dynamic"):
        # dynamic NTK equals the default up to max_position_embeddings, the context we run
        # (past it transformers rescales every position by the forward's length)
        return RopeConfig(theta=theta, kind=kind, original_max_position=orig)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=float(p["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta, kind="llama3", factor=float(p["factor"]),
            low_freq_factor=float(p.get("low_freq_factor", 1.0)),
            high_freq_factor=float(p.get("high_freq_factor", 4.0)),
            original_max_position=int(p.get("original_max_position_embeddings", 8192)))
    factor = float(p.get("factor") or max_pos / orig)
    att = p.get("attention_factor")
    if kind == "yarn":
        if att is None:
            m, m_all = p.get("mscale"), p.get("mscale_all_dim")
            att = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all \
                else _yarn_mscale(factor)
        return RopeConfig(theta=theta, kind="yarn", factor=factor, original_max_position=orig,
                          attention_factor=float(att),
                          beta_fast=float(p.get("beta_fast") or 32),
                          beta_slow=float(p.get("beta_slow") or 1),
                          truncate=bool(p.get("truncate", True)))
    if kind == "longrope":
        if att is None:
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return RopeConfig(theta=theta, kind="longrope", factor=factor,
                          original_max_position=orig, attention_factor=float(att),
                          short_factor=tuple(map(float, p["short_factor"])),
                          long_factor=tuple(map(float, p["long_factor"])))
    raise ConfigError(f"rope scaling {kind!r} is not supported "
                      "(default, linear, llama3, yarn, dynamic, longrope)")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
