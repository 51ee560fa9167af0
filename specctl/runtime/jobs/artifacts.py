"""Finding the stored artifacts a run needs, each by what it depends on.

    kind           keyed by                       picked when none is named
    skipsets       model fingerprint              best speedup_estimate (search-skip)
    adapters       model fingerprint              best heldout_top1 (train-adapter)
    profiles       model fingerprint, device,     the one for this machine, dtype, attention
                   dtype, attention, batch size   and batch size (controller.step_table_for)
    ngram-caches   tokenizer fingerprint          the newest (build-cache)

A named artifact is a path or a store id (or unique prefix), looked up by `Store.locate`.
Fingerprints are computed in models/fingerprint.py; the prep commands write the artifacts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from specctl.errors import SpecctlError
from specctl.io.schema import SchemaError, fields, integer, string
from specctl.models.fingerprint import _legacy_fingerprint, tokenizer_fingerprint, tokenizer_name
from specctl.reporting import quiet
from specctl.speculative.corpus_cache import ARTIFACT_FILE, KIND as CORPUS_KIND, read_config
from specctl.speculative.draft_verify import SkipSet
from specctl.speculative.kangaroo import Adapter
from specctl.store import Store, read_json


def resolve_skip_set(spec: str | None, store: Store, fingerprint: str, num_layers: int,
                     log=quiet, device=None, dtype=None) -> tuple[SkipSet, str]:
    """--skip-set FILE | ID, or the model's best stored skip set. Returns (set, where from).
    Given the run's device (and dtype), says so when the set was priced on another one."""
    if spec:
        p = store.locate(spec, "skipsets")
        if p.is_dir():
            p = p / "skipset.json"
        where = str(p)
    else:
        best = store.best_for_model("skipsets", fingerprint, "speedup_estimate",
                                    keep=lambda m: m.get("pays") is not False)
        if best is None:
            idle = store.best_for_model("skipsets", fingerprint, "speedup_estimate")
            raise SpecctlError(
                "no skip set for this model in the store" + (
                    f" that pays (search-skip's best, skipsets/{idle.id}, is estimated at "
                    f"{idle.manifest.get('speedup_estimate')}x ar; pass --skip-set "
                    f"{idle.id} to use it anyway)" if idle else
                    ": run `specctl search-skip` (with the same --model) first, or pass "
                    "--skip-set FILE"))
        p, where = best.path / "skipset.json", f"skipsets/{best.id}"
    data = read_json(p)
    try:
        skip = SkipSet.from_json(data)
    except ValueError as e:   # (SchemaError: the field and what is wrong with it)
        raise SpecctlError(f"{p}: not a usable skip set: {e}") from None
    if skip.num_layers != num_layers:
        raise SpecctlError(f"{where}: skip set is for {skip.num_layers} layers, the model has "
                           f"{num_layers}")
    if device is not None:
        warning = profile_mismatch(data.get("profile"), device, dtype)
        if warning:
            log(f"warning: {where}: {warning}")
    return skip, where


def profile_mismatch(profile: dict | None, device, dtype=None) -> str | None:
    """A warning when a skip set was searched (priced) on another device type or dtype than
    the run's: costs differ between machines (a CPU verifies 2 tokens at 1.7x the cost of 1, a
    GPU at about 1x), so the set that is fastest there need not be here. `profile` is the
    skip set's record of its pricing: the step-cost table's id with its device and dtype
    (sets searched before step tables priced them have the device and dtype alone)."""
    if not isinstance(profile, dict) or "device" not in profile:
        return None
    there = str(profile["device"]).split(":")[0]
    here = str(device).split(":")[0]
    dt_there = str(profile.get("dtype", ""))
    dt_here = str(dtype).replace("torch.", "") if dtype is not None else dt_there
    if there == here and dt_there == dt_here:
        return None
    return (f"this skip set was searched with {there} {dt_there} costs; this run is on {here} "
            f"{dt_here}: its speedup estimate does not carry over (run `specctl search-skip` "
            f"on this machine for a set priced here)")


def describe_skip_set(skip: SkipSet) -> str:
    return (f"{len(skip.attn)} attention + {len(skip.mlp)} MLP of {2 * skip.num_layers} blocks "
            f"skipped (attn {sorted(skip.attn)}, mlp {sorted(skip.mlp)})")


# an adapter's config.json (kangaroo.adapter_config): the exit layer and the model's shape
ADAPTER_FORMAT = "specctl-kangaroo-1"
ADAPTER_CONFIG = {"exit_layer": integer(1)}
ADAPTER_SHAPE = {"hidden_size": integer(1), "num_heads": integer(1), "num_kv_heads": integer(1),
                 "head_dim": integer(1), "format": string()}


def adapter_exit_layer(path: Path, model) -> int:
    """The exit layer an adapter folder's config.json names, every field checked (never
    coerced) and its model shape compared with `model`'s."""
    f = path / "config.json"
    try:
        cfg = fields(read_json(f), ADAPTER_CONFIG, ADAPTER_SHAPE, what="adapter config")
    except SchemaError as e:
        raise SpecctlError(f"{f}: not a usable adapter config: {e}") from None
    if cfg.get("format", ADAPTER_FORMAT) != ADAPTER_FORMAT:
        raise SpecctlError(f"{f}: adapter format {cfg['format']!r} is not {ADAPTER_FORMAT!r}, "
                           "the one this specctl reads")
    c = model.cfg
    have = {"hidden_size": c.hidden_size, "num_heads": c.num_heads,
            "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim}
    for k, v in have.items():
        if k in cfg and cfg[k] != v:
            raise SpecctlError(f"{f}: the adapter is for a model with {k} {cfg[k]}, this one "
                               f"has {v}: train one for this model with `specctl train-adapter`")
    return cfg["exit_layer"]


def load_adapter(path: Path, model) -> Adapter:
    from safetensors.torch import load_file
    exit_layer = adapter_exit_layer(path, model)
    try:
        try:
            w = load_file(str(path / "adapter.safetensors"))
        except Exception as e:   # (safetensors' own error for a truncated or corrupt file too)
            raise ValueError(f"adapter.safetensors: {e}") from None
        return Adapter(model, exit_layer, w)   # (checks the layer and shapes against the model)
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise SpecctlError(f"{path}: not a usable adapter ({e})") from None


def resolve_adapter(spec: str | None, store: Store, fingerprint: str, model) -> tuple[Adapter, str]:
    """--adapter PATH | ID, or the model's stored adapter with the best held-out agreement."""
    if spec:
        p = store.locate(spec, "adapters")
        return load_adapter(p, model), str(p)
    best = store.best_for_model("adapters", fingerprint, "heldout_top1")
    if best is None:
        raise SpecctlError("no Kangaroo adapter for this model in the store: run "
                           "`specctl train-adapter` (with the same --model) first, or pass "
                           "--adapter DIR")
    return load_adapter(best.path, model), f"adapters/{best.id}"


def _fingerprints(model_dir: Path | str) -> tuple[str, set[str]]:
    """(today's fingerprint, every one a corpus cache made for this model may carry: today's
    and the older form; never None, so a cache without one matches neither)."""
    legacy = _legacy_fingerprint(model_dir)
    fp = tokenizer_fingerprint(model_dir)
    return fp, {fp} if legacy is None else {fp, legacy}


def resolve_corpus_cache(store, model_dir: Path | str, choice: str | None,
                         log: Callable[[str], None] = quiet) -> Path | None:
    """The n-gram cache to use with the model in `model_dir`.

    choice None: the newest cache in the store made with this model's tokenizer, or None if
    there is none. Otherwise `choice` is a path (artifact folder or its .safetensors) or a store
    id (or unique prefix). A cache made with another tokenizer is a SpecctlError.
    """
    if choice is None:
        cands = [e for e in store.entries(CORPUS_KIND) if (e.path / ARTIFACT_FILE).is_file()]
        if not cands:   # (no fingerprint to work out: ~0.5 s of a run's start on a 49k
            return None  # vocabulary, for a store that holds no cache, as most do)
        accepted = _fingerprints(model_dir)[1]
        cands = [e for e in cands if e.manifest.get("tokenizer_fingerprint") in accepted]
        if not cands:
            return None
        best = max(cands, key=lambda e: (str(e.manifest.get("created", "")), e.id))
        log(f"corpus cache: {CORPUS_KIND}/{best.id}")
        return best.path
    path = store.locate(choice, CORPUS_KIND)   # a path, else a store id
    where = str(path) if path == Path(choice).expanduser() else f"{CORPUS_KIND}/{path.name}"
    cfg = read_config(path)
    got = cfg.get("tokenizer_fingerprint")
    fp, accepted = _fingerprints(model_dir)
    if got not in accepted:
        raise SpecctlError(
            f"n-gram cache {where} was built with another tokenizer "
            f"({cfg.get('tokenizer', '?')}, fingerprint {str(got)[:12]}) than the model's "
            f"({tokenizer_name(model_dir)}, {fp[:12]}): build one for this model with "
            f"`specctl build-cache CORPUS --model {model_dir}`")
    log(f"corpus cache: {where}")
    return path
