"""Model configuration for the Llama-family decoder, read from a Hugging Face `config.json`.

Covers Llama 2/3 (incl. `llama3` and `linear` rope scaling), Mistral, Qwen2 (qkv bias) and
SmolLM2: they share one block structure (RMSNorm -> GQA attention with RoPE -> RMSNorm -> SwiGLU).
Both the transformers v4 (`rope_theta` / `rope_scaling`) and v5 (`rope_parameters`) spellings are
understood. Configs are frozen: nothing mutates a config at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specctl.models.checkpoint import SUPPORTED_TYPES   # (a folder is checked there first)


class ConfigError(ValueError):
    """The checkpoint's config is not one this engine can run (message says why)."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


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
            head_dim = int(cfg.get("head_dim") or hidden // heads)
            act = cfg.get("hidden_act", "silu")
            if act not in ("silu", "swish"):
                raise ConfigError(f"hidden_act {act!r} is not supported (only silu)")
            max_pos = int(cfg.get("max_position_embeddings", 4096))
            window = cfg.get("sliding_window")
            if window and (mtype == "mistral" or cfg.get("use_sliding_window")):
                # Tokens further than the window would be masked by the reference model; we
                # keep full attention and so cap the context at the window instead.
                max_pos = min(max_pos, int(window))
            attn_bias = bool(cfg.get("attention_bias", False))
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
                rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position=max_pos,
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=attn_bias or mtype == "qwen2",
                o_bias=attn_bias and mtype != "qwen2",
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                rope=_rope_from_hf(cfg),
                model_type=mtype,
            )
        except KeyError as e:
            raise ConfigError(f"config.json lacks the field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"config.json has a field of the wrong type ({e})") from None


def _rope_from_hf(cfg: dict[str, Any]) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=float(merged["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta, kind="llama3", factor=float(merged["factor"]),
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
            original_max_position=int(merged.get("original_max_position_embeddings", 8192)))
    raise ConfigError(f"rope scaling {kind!r} is not supported (default, linear, llama3)")
