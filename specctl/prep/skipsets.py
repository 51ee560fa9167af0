"""Skip sets and cost profiles in the store, keyed by model (and machine, for profiles).

    skipsets/<model-fp>-<objective>/   skipset.json, probes.jsonl, search.png, manifest.json
    profiles/<model-fp>-<device>-<dtype>/   profile.json, manifest.json
    work/search-<model-fp>-<objective>/probes.jsonl   the live log of a running search

`generate --method draft-verify` takes the stored skip set of the model with the best estimated
speedup unless `--skip-set FILE|ID` names one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.prep.costs import CostProfile, measure_costs
from specctl.spec.draft_verify import SkipSet
from specctl.store import Store, atomic_write_json, make_manifest, read_json


def load_profile(store: Store, model, fingerprint: str, log=print) -> CostProfile:
    """The model's cost profile on this device/dtype: measured once, then read back."""
    ident = f"{fingerprint}-{model.device.type}-{str(model.dtype).replace('torch.', '')}"
    path = store.path("profiles", ident) / "profile.json"
    if path.exists():
        try:
            return CostProfile.from_json(read_json(path))
        except (TypeError, KeyError) as e:
            log(f"{path}: unreadable profile ({e}); measuring again")
    log("measuring per-block costs on this machine (once per model, device and dtype) ...")
    prof = measure_costs(model)
    with store.building("profiles", ident, make_manifest(
            "profile", ident, model_fingerprint=fingerprint, **prof.to_json())) as d:
        atomic_write_json(d / "profile.json", prof.to_json())
    return prof


def work_dir(store: Store, ident: str) -> Path:
    return store.root / "work" / f"search-{ident}"


def save_skipset(store: Store, ident: str, result: dict, log_path: Path,
                 plot: Path | None, fingerprint: str) -> Path:
    with store.building("skipsets", ident, make_manifest(
            "skipset", ident, model_fingerprint=fingerprint,
            speedup_estimate=result["speedup_estimate"], objective=result["objective"])) as d:
        atomic_write_json(d / "skipset.json", result)
        shutil.copyfile(log_path, d / "probes.jsonl")
        if plot is not None and plot.exists():
            shutil.copyfile(plot, d / "search.png")
    return store.path("skipsets", ident)


def resolve_skip_set(spec: str | None, store: Store, fingerprint: str, num_layers: int,
                     log=print, device=None, dtype=None) -> tuple[SkipSet, str]:
    """--skip-set FILE | ID, or the model's best stored skip set. Returns (set, where from).
    Given the run's device (and dtype), says so when the set was priced on another one."""
    if spec:
        p = store.locate(spec, "skipsets")
        if p.is_dir():
            p = p / "skipset.json"
        data, where = read_json(p), str(p)
    else:
        best = store.best_for_model("skipsets", fingerprint, "speedup_estimate")
        if best is None:
            raise SpecctlError("no skip set for this model in the store: run "
                               "`specctl search-skip` (with the same --model) first, or pass "
                               "--skip-set FILE")
        data, where = read_json(best.path / "skipset.json"), f"skipsets/{best.id}"
    try:
        skip = SkipSet.from_json(data)
    except (ValueError, AttributeError) as e:
        raise SpecctlError(f"{where}: {e}") from None
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
    GPU at about 1x), so the set that is fastest there need not be here."""
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


def describe(skip: SkipSet) -> str:
    return (f"{len(skip.attn)} attention + {len(skip.mlp)} MLP of {2 * skip.num_layers} blocks "
            f"skipped (attn {sorted(skip.attn)}, mlp {sorted(skip.mlp)})")
