"""Load a local HF checkpoint folder (config.json + safetensors) into the engine's Model.

Only safetensors are read (never pickle). Every expected tensor is checked for presence and shape
against the config, so a corrupt or mismatched checkpoint fails with a one-line SpecctlError that
names the file and the tensor, not deep inside a matmul.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specctl.engine.attention import cudnn_attention as cudnn_sdpa
from specctl.engine.config import ConfigError, ModelConfig
from specctl.engine.model import Model
from specctl.engine.weights import read_tensor, tensor_index
from specctl.errors import SpecctlError
from specctl.models.checkpoint import refusal

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA, fp32 elsewhere."""
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise SpecctlError(f"unknown dtype {name!r} (choose fp32, bf16, fp16 or auto)")
    return DTYPES[name]


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SpecctlError(f"unknown device {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecctlError("--device cuda was asked for but no CUDA device is available")
    return dev


def load_config(path: Path) -> tuple[ModelConfig, dict]:
    f = Path(path) / "config.json"
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecctlError(f"{f}: not found (a model folder needs config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecctlError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise SpecctlError(f"{f}: expected a JSON object")
    why = refusal(raw)   # (a mixture of experts or a vision model: said before any weight)
    if why:
        raise SpecctlError(f"{f}: {why}")
    try:
        return ModelConfig.from_hf(raw), raw
    except ConfigError as e:
        raise SpecctlError(f"{f}: {e}") from None


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, by its HF name, with its shape: the family's
    names (its norms, q/k norms, Phi-3's fused projections)."""
    D, hd, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, D)
    norms = {"pre": ("input_layernorm", "post_attention_layernorm"),
             "sandwich": ("input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"),
             "post": ("post_attention_layernorm", "post_feedforward_layernorm")}[cfg.norm_place]
    fused = cfg.model_type in FUSED_TYPES
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + n + ".weight": (D,) for n in norms})
        shapes[p + "self_attn.o_proj.weight"] = (D, q)
        shapes[p + "mlp.down_proj.weight"] = (D, I)
        if fused:
            shapes[p + "self_attn.qkv_proj.weight"] = (q + 2 * kv, D)
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * I, D)
        else:
            shapes.update({
                p + "self_attn.q_proj.weight": (q, D), p + "self_attn.k_proj.weight": (kv, D),
                p + "self_attn.v_proj.weight": (kv, D), p + "mlp.gate_proj.weight": (I, D),
                p + "mlp.up_proj.weight": (I, D)})
        if cfg.qk_norm != "none":
            full = cfg.qk_norm == "full"
            shapes[p + "self_attn.q_norm.weight"] = (q if full else hd,)
            shapes[p + "self_attn.k_norm.weight"] = (kv if full else hd,)
        if cfg.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (D,)
        if cfg.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (I,), p + "mlp.up_proj.bias": (I,),
                           p + "mlp.down_proj.bias": (D,)})
    return shapes


FUSED_TYPES = ("phi3",)   # families whose checkpoints fuse q/k/v and gate/up


def split_fused(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Phi-3's fused qkv_proj and gate_up_proj as the q/k/v and gate/up tensors the model
    takes (views of them); other families' weights as they are."""
    if cfg.model_type not in FUSED_TYPES:
        return weights
    q, kv, I = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, \
        cfg.intermediate_size
    out = {}
    for name, t in weights.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            pre = name[:-len("qkv_proj.weight")]
            for part, w in zip(("q", "k", "v"), t.split([q, kv, kv])):
                out[f"{pre}{part}_proj.weight"] = w
        elif name.endswith("mlp.gate_up_proj.weight"):
            pre = name[:-len("gate_up_proj.weight")]
            out[pre + "gate_proj.weight"], out[pre + "up_proj.weight"] = t.split([I, I])
        else:
            out[name] = t
    return out


def load_model(path: Path | str, device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None, cuda_graphs: bool = True,
               attention: str = "auto", cudnn_attention: bool = False) -> Model:
    """Load a checkpoint; on CUDA, decoding forwards replay captured graphs unless
    cuda_graphs=False (engine/graphs.py). attention: auto, sdpa, fused or flex
    (engine/attention.py);
    cudnn_attention: on CUDA, let SDPA use cuDNN's kernel (off: bf16 runs repeat exactly)."""
    path = Path(path)
    cfg, _ = load_config(path)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    dt = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, dev)
    want = expected_shapes(cfg)
    found = tensor_index(path)
    missing = [k for k in want if k not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise SpecctlError(f"{path}: checkpoint lacks tensor {missing[0]}{more}; "
                           "it does not match config.json")
    for k, shape in want.items():
        if found[k].shape != shape:
            raise SpecctlError(f"{path}: tensor {k} has shape {found[k].shape}, "
                               f"config.json implies {shape}")
    weights = split_fused({k: read_tensor(found[k], dt, dev) for k in want}, cfg)
    model = Model(cfg, weights)
    model.name = str(path)
    try:
        model.set_attention(attention)
    except ValueError as e:
        raise SpecctlError(str(e)) from None
    if model.device.type == "cuda":
        _on_cuda(model, cuda_graphs, cudnn_attention)
    return model


def _on_cuda(model: Model, cuda_graphs: bool, cudnn_attention: bool) -> None:
    """A CUDA model's set-up: its graphs, and whether SDPA may use cuDNN (for the process:
    torch's switch is process-wide; only a CUDA load sets it, so a CPU model loaded beside it
    changes nothing)."""
    cudnn_sdpa(cudnn_attention)
    if cuda_graphs:
        from specctl.engine.graphs import CudaGraphs
        model.graphs = CudaGraphs(model)
