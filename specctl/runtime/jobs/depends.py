"""What a run's answers depend on, by content: recorded in the run's manifest (`depends`) and
compared by --resume, which continues a run only when all of it is unchanged.

    model config, tokenizer, weights <file>   models/contents.py (digests of the files)
    skip set | adapter | corpus cache         the method's artifact, as loaded
    options                                   the settings that decide the tokens (the keyed ones)
    device                                    the device type and dtype the model runs in

The run key (GenerateConfig.key) already holds the options, the input's hash, the model's path
and the drafter's signature; it finds the candidate runs. `depends` adds what a path or a name
cannot tell: the files behind them, which may have changed since the run began.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path

from specctl.models.contents import DigestCache
from specctl.runtime.jobs.config import UNKEYED, GenerateConfig
from specctl.speculative.draft_verify import LayerSkipDrafter
from specctl.speculative.kangaroo import KangarooDrafter
from specctl.speculative.self_draft import SelfDraftDrafter


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _tensors(w: dict) -> str:
    """A digest of tensors' values (in the dtype they run in), names and shapes."""
    import torch
    h = hashlib.sha256()
    for k in sorted(w):
        t = w[k].detach().to("cpu").contiguous()
        h.update(f"{k}:{t.dtype}:{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy())
    return h.hexdigest()[:32]


def drafter_depends(drafter, cache: DigestCache) -> dict[str, str]:
    """The content of the drafter's artifact: its skip set, adapter weights or corpus cache."""
    if isinstance(drafter, LayerSkipDrafter):
        return {"skip set": _sha(json.dumps(drafter.skip.to_json()).encode())}
    if isinstance(drafter, KangarooDrafter):
        return {"adapter": f"l{drafter.l}:{_tensors(drafter.adapter.w)}"}
    if isinstance(drafter, SelfDraftDrafter) and drafter.corpus is not None:
        path = getattr(drafter.corpus, "path", None)
        if path is not None:
            path = Path(path)
            st = path / "ngram.safetensors" if path.is_dir() else path
            return {"corpus cache": cache.digest(st)}
        return {"corpus cache": drafter.corpus_id or "?"}
    return {}


def options_digest(cfg: GenerateConfig) -> str:
    """The settings that decide the tokens (GenerateConfig's fields but UNKEYED), those at their
    default left out: an option a later specctl adds does not change an older run's digest."""
    inert = cfg.inert()   # (another method's options: they cannot change the answers)
    d = {f.name: getattr(cfg, f.name) for f in fields(cfg)
         if f.name not in UNKEYED and f.name not in inert and getattr(cfg, f.name) != f.default}
    return _sha(json.dumps(d, sort_keys=True, default=list).encode())


def run_depends(cfg: GenerateConfig, contents: dict[str, str], drafter, model,
                cache: DigestCache) -> dict[str, str]:
    """Everything a run depends on (see the module docstring), as {what: digest}."""
    return {**contents, **drafter_depends(drafter, cache), "options": options_digest(cfg),
            "device": f"{model.device.type}:{str(model.dtype).replace('torch.', '')}"}


def changed(old, new: dict[str, str]) -> list[str]:
    """What differs between a run's recorded `depends` and this one's (in this one's order)."""
    if not isinstance(old, dict):
        return ["everything (the run recorded no contents: it was begun by an older specctl)"]
    return [k for k in [*new, *(k for k in old if k not in new)] if old.get(k) != new.get(k)]
