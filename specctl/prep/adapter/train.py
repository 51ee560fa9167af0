"""train-adapter's settings (TrainConfig), its data (conversations encoded with the loss mask
and split into training and held-out ids: Prepared) and the trained adapter's place in the store
(save_adapter). The training itself is in features.py (the frozen target's states), fit.py
(the adapter's loss and optimizer), sweep.py (choosing the exit layer) and cost.py (the time
estimate); command.py runs the command.

The method (papers/001, authors' code): the target is frozen; an adapter on its layer-l states
learns the target's next-token distribution on the assistant tokens of real conversations.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from safetensors.torch import save_file

from specctl.errors import SpecctlError
from specctl.speculative.kangaroo import Adapter, adapter_config
from specctl.store import Store, atomic_write_json, make_manifest

MAX_LEN = 2048      # tokens per conversation by default
CPU_MAX_LEN = 256   # ... training on a CPU, so that a run given no sizes stays short there
CPU_LIMIT = 100     # conversations by default training on a CPU (elsewhere: all of them)


@dataclass(frozen=True)
class TrainConfig:
    model: str | None = None
    data: str | None = None
    exit_layer: int = 0         # 0 = auto: a quick sweep picks it (sweep_exit_layer)
    epochs: int = 1
    lr: float = 5e-5
    max_len: int | None = None  # None: the device's default (with_device_defaults)
    batch_tokens: int = 4096
    limit: int | None = None    # None: the device's default (with_device_defaults)
    heldout: float = 0.05
    warmup: float = 0.03
    clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100
    strict: bool = False
    device: str = "auto"
    dtype: str = "auto"         # compute: auto = bf16 autocast on CUDA, fp32 elsewhere
    sweep_conversations: int = 64   # conversations per candidate in the exit-layer sweep
    gamma: int = 6              # drafts per step assumed when the sweep prices a layer
    sweep_layers: tuple[int, ...] | None = None   # the sweep's candidates (None: the default)
    sweep_budget: float | None = None   # seconds the sweep may add (None: a quarter of the rest)

    def __post_init__(self):
        if self.exit_layer < 0:
            raise SpecctlError("--exit-layer must be a layer number >= 1 or 'auto'")
        if self.sweep_layers is not None and (not self.sweep_layers
                                              or min(self.sweep_layers) < 1):
            raise SpecctlError("--sweep-layers must list layer numbers >= 1")
        if self.sweep_budget is not None and self.sweep_budget < 0:
            raise SpecctlError("--sweep-budget must be seconds >= 0")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise SpecctlError("--dtype must be auto, fp32 or bf16")
        if self.epochs < 1 or self.lr <= 0 or (self.max_len is not None and self.max_len < 8) \
                or self.batch_tokens < 8:
            raise SpecctlError("--epochs >= 1, --lr > 0, --max-len >= 8, --batch-tokens >= 8")
        if not 0.0 <= self.heldout < 1.0:
            raise SpecctlError("--heldout must be in [0, 1)")
        if self.checkpoint_every < 1:   # (it divided by 0, or checkpointed every step at -5)
            raise SpecctlError("--checkpoint-every must be at least 1 (steps)")


def with_device_defaults(cfg: TrainConfig, on_cpu: bool) -> tuple[TrainConfig, str | None]:
    """cfg with the max_len and limit it leaves to the device filled in: MAX_LEN tokens of every
    conversation, or on a CPU (far slower per token) at most CPU_LIMIT conversations of
    CPU_MAX_LEN tokens. Also the line that says so when a CPU default was taken."""
    if not on_cpu:
        return replace(cfg, max_len=cfg.max_len or MAX_LEN), None
    if cfg.max_len is not None and cfg.limit is not None:
        return cfg, None
    out = replace(cfg, max_len=cfg.max_len or CPU_MAX_LEN,
                  limit=CPU_LIMIT if cfg.limit is None else cfg.limit)
    return out, (f"on a CPU: at most {out.limit} conversations of {out.max_len} tokens "
                 "(--limit / --max-len to change)")


def encode(tok, messages: list[dict], max_len: int) -> tuple[list[int], list[bool]] | None:
    """Token ids of the rendered conversation and, per position t, whether t predicts an
    assistant token (i.e. token t + 1 belongs to an assistant turn). Spans come from rendering
    growing prefixes of the conversation with the same template."""
    def ids(msgs, gen=False):
        text = tok.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
        return tok.encode(text, add_special_tokens=False)
    full = ids(messages)[:max_len]
    target = [False] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = len(ids(messages[:i], gen=True)), len(ids(messages[:i + 1]))
        for t in range(start, min(end, len(full))):
            target[t] = True
    pred = target[1:] + [False]   # position t predicts token t + 1
    return (full, pred) if any(pred) else None


@dataclass
class Prepared:
    """The usable conversations encoded ((ids, mask) each), their seeded split into held-out
    and training ids, and a key naming the encoded data (cached features are checked by it)."""
    data: list[tuple[list[int], list[bool]]]
    held: list[int]
    train: list[int]
    key: str
    dropped: int = 0   # conversations with no assistant token within max_len (left out)

    @property
    def lens(self) -> list[int]:
        return [len(ids) for ids, _ in self.data]


def split(n: int, cfg: TrainConfig) -> tuple[list[int], list[int]]:
    """A seeded split of n conversations into held-out and training ids."""
    order = list(range(n))
    random.Random(cfg.seed).shuffle(order)
    n_held = max(1, int(n * cfg.heldout))
    return order[:n_held], order[n_held:]


def prepare_data(tok, conversations, cfg: TrainConfig, encoded: list = (),
                 on_item: Callable[[object], None] | None = None) -> Prepared:
    """Encode the conversations (`encoded`: the encodings of the first ones, already made) and
    split them; on_item(conversation) after each one encoded here."""
    if cfg.max_len is None:   # (encode would keep every token)
        raise ValueError("prepare_data: cfg.max_len unset (with_device_defaults sets it)")
    encs = list(encoded)
    for c in conversations[len(encs):]:
        encs.append(encode(tok, c.messages, cfg.max_len))
        if on_item:
            on_item(c)
    data = [e for e in encs if e is not None]
    dropped = len(encs) - len(data)
    if len(data) < 2:
        raise SpecctlError(f"only {len(data)} usable conversations: need at least 2"
                           + (f" ({dropped} had no assistant token within --max-len "
                              f"{cfg.max_len} tokens)" if dropped else ""))
    h = hashlib.sha256()
    for ids, mask in data:
        h.update(array("q", ids).tobytes() + bytes(mask) + b"|")
    return Prepared(data, *split(len(data), cfg), h.hexdigest()[:16], dropped)


def adapter_ident(fingerprint: str, exit_layer: int) -> str:
    """The store id of a model's adapter at one exit layer."""
    return f"{fingerprint}-l{exit_layer}"


def save_adapter(store: Store, model, adapter: Adapter, fingerprint: str, summary: dict) -> Path:
    """Stored beside any earlier adapter of the same model and exit layer (`<id>-2`, ...), never
    over it: which one generate takes is decided by held-out agreement, not by recency."""
    base = ident = adapter_ident(fingerprint, adapter.l)
    n = 1
    while store.path("adapters", ident).exists():
        n += 1
        ident = f"{base}-{n}"
    with store.building("adapters", ident, make_manifest(
            "adapter", ident, model_fingerprint=fingerprint, exit_layer=adapter.l,
            heldout_top1=summary["heldout_top1"])) as d:
        save_file({k: v.float().cpu().contiguous() for k, v in adapter.w.items()},
                  str(d / "adapter.safetensors"))
        atomic_write_json(d / "config.json", adapter_config(model, adapter.l))
        atomic_write_json(d / "train_log.json", summary)
    return store.path("adapters", ident)
