"""The frozen target's states that train the adapter: h_l (the adapter's input) and h_L (the
final states the target's next-token distribution comes from), fp16 on the CPU, computed once per
conversation and kept in the run's work folder (safetensors; a resumed run reads them back).

Two stores, one format: features-l<l>.safetensors holds the main run's ("<i>.l", "<i>.L"),
sweep-features.safetensors the exit-layer sweep's ("<i>.l<l>" for each candidate l, "<i>.L");
each has a .json beside it naming what it was computed from, and is reused only when that
matches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.prep.adapter.train import Prepared
from specctl.reporting import quiet
from specctl.store import atomic_write_json


@torch.inference_mode()
def features(model, ids: list[int], l: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_l, h_L) of one sequence, fp16 on the CPU."""
    kv = model.new_kv_cache(1, len(ids))
    b = ForwardBatch([SeqInput(0, ids, 0)], model.device)
    h_L, h_l = model.forward(b, kv, LayerPlan(capture=l))
    return h_l.half().cpu(), h_L.half().cpu()


@torch.inference_mode()
def features_at(model, ids: list[int], layers) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({l: h_l} for every l in layers, h_L) of one sequence from one forward, run in pieces
    that end at the layers asked for; fp16 on the CPU."""
    kv = model.new_kv_cache(1, len(ids))
    b = ForwardBatch([SeqInput(0, ids, 0)], model.device)
    out, x, start = {}, None, 0
    for l in sorted(set(layers)):
        x = model.forward(b, kv, LayerPlan(start=start, end=l), x)
        out[l], start = x.half().cpu(), l
    return out, model.forward(b, kv, LayerPlan(start=start), x).half().cpu()


def _meta_matches(path: Path, **want) -> bool:
    """Whether the stored file `path` exists and its .json has every `want` entry."""
    meta = path.with_suffix(".json")
    if not (path.exists() and meta.exists()):
        return False
    got = json.loads(meta.read_text())
    return all(got.get(k) == v for k, v in want.items())


def _stored(path: Path, want: dict, meta: dict, compute: Callable[[], object],
            flat: Callable[[object], dict], unflat: Callable[[dict], object],
            log, what: str):
    """The tensors in `path` (unflat of its contents) when its .json matches `want`; else
    compute() them, save flat(them) and the .json `meta`, both atomically."""
    if _meta_matches(path, **want):
        log(f"reusing {what} ({path})")
        return unflat(load_file(str(path)))
    out = compute()
    save_file(flat(out), str(path.with_suffix(".tmp")))
    path.with_suffix(".tmp").replace(path)
    atomic_write_json(path.with_suffix(".json"), meta)
    return out


def _feature_file(work: Path, l: int) -> Path:
    return work / f"features-l{l}.safetensors"


def features_cached(work: Path, l: int, n: int, key: str) -> bool:
    """Whether the work folder holds layer l's features of the n conversations `key` names."""
    return _meta_matches(_feature_file(work, l), n=n, key=key)


def cached_features(model, prep: Prepared, l: int, work: Path, log=quiet, have=None,
                    on_item: Callable[[int], None] | None = None) -> list:
    """[(h_l, h_L)] of every conversation, read back from the work folder or computed there.
    have: {i: ({l: h_l, ...}, h_L)} already computed (by the exit-layer sweep); on_item(i)
    after each one computed here."""
    n = len(prep.data)

    def compute() -> list:
        todo = n - len(have or ())
        if todo:
            log(f"computing the target's layer-{l} and final states for {todo} conversations ...")
        feats = []
        for i, (ids, _) in enumerate(prep.data):
            if have is not None and i in have:
                feats.append((have[i][0][l], have[i][1]))
            else:
                feats.append(features(model, ids, l))
                if on_item:
                    on_item(i)
        return feats
    return _stored(
        _feature_file(work, l), {"n": n, "key": prep.key},
        {"n": n, "exit_layer": l, "key": prep.key}, compute,
        lambda feats: {f"{i}.{k}": t for i, (a, b) in enumerate(feats)
                       for k, t in (("l", a), ("L", b))},
        lambda ft: [(ft[f"{i}.l"], ft[f"{i}.L"]) for i in range(n)],
        log, "cached target features")


def sweep_features(model, prep: Prepared, ids: list[int], layers, work: Path, log=quiet,
                   on_item: Callable[[int], None] | None = None) -> dict:
    """{i: ({l: h_l for l in layers}, h_L)} for the conversations `ids`, one forward each, read
    back from the work folder or computed there; on_item(i) after each one computed."""
    layers = sorted(layers)

    def compute() -> dict:
        out = {}
        for i in ids:
            out[i] = features_at(model, prep.data[i][0], layers)
            if on_item:
                on_item(i)
        return out

    def flat(out: dict) -> dict:
        ft = {f"{i}.l{l}": t for i, (hs, _) in out.items() for l, t in hs.items()}
        ft.update({f"{i}.L": h for i, (_, h) in out.items()})
        return ft
    want = {"key": prep.key, "ids": list(ids), "layers": layers}
    return _stored(work / "sweep-features.safetensors", want, want, compute, flat,
                   lambda ft: {i: ({l: ft[f"{i}.l{l}"] for l in layers}, ft[f"{i}.L"])
                               for i in ids},
                   log, "the sweep's cached target features")
