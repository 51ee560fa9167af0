"""Skip sets in the store, keyed by model.

    skipsets/<model-fp>-<objective>/   skipset.json, probes.jsonl, search.png, manifest.json
    work/search-<model-fp>-<objective>/probes.jsonl   the live log of a running search

runtime/jobs/artifacts.py finds them again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specctl.store import Store, atomic_write_json, make_manifest


def work_dir(store: Store, ident: str) -> Path:
    return store.root / "work" / f"search-{ident}"


def save_skipset(store: Store, ident: str, result: dict, log_path: Path,
                 plot: Path | None, fingerprint: str) -> Path:
    with store.building("skipsets", ident, make_manifest(
            "skipset", ident, model_fingerprint=fingerprint,
            speedup_estimate=result["speedup_estimate"], objective=result["objective"],
            pays=result["pays"], interrupted=bool(result.get("interrupted")))) as d:
        atomic_write_json(d / "skipset.json", result)
        shutil.copyfile(log_path, d / "probes.jsonl")
        if plot is not None and plot.exists():
            shutil.copyfile(plot, d / "search.png")
    return store.path("skipsets", ident)
