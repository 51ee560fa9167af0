"""Skip sets and cost profiles in the store, keyed by model (and machine, for profiles).

    skipsets/<model-fp>-<objective>/   skipset.json, probes.jsonl, search.png, manifest.json
    profiles/<model-fp>-<device>-<dtype>/   profile.json, manifest.json
    work/search-<model-fp>-<objective>/probes.jsonl   the live log of a running search

runtime/artifacts.py finds them again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specctl.prep.costs import CostProfile, measure_costs
from specctl.reporting import quiet
from specctl.runtime.artifacts import profile_id, profile_path
from specctl.store import Store, atomic_write_json, make_manifest, read_json


def load_profile(store: Store, model, fingerprint: str, log=quiet) -> CostProfile:
    """The model's cost profile on this device/dtype: measured once, then read back."""
    ident = profile_id(fingerprint, model)
    path = profile_path(store, fingerprint, model)
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
