"""`specctl prepare --recipe FILE`: run the preparation steps a recipe names, in order, skipping
those whose artifact is already in the store (the one `generate` would pick; one made with other
settings than the recipe's is kept too, and said: made_otherwise):

    step-table     the model's step-cost tables (always first)   ([generate] batch_size ..)
    build-cache    a corpus cache for the model's tokenizer      ([self-draft.build-cache])
    search-skip    a skip set for the model                      ([draft-verify.search])
    train-adapter  an adapter for the model (and exit layer)      ([kangaroo.train])

The step-cost tables price a step at batch 1 (search-skip's and train-adapter's estimates) and
at the recipe's batch size (`generate --speculate auto`), measured on the model as `generate`
loads it (the recipe's device, dtype, attention, CUDA graphs), so that no later job stops to
measure one. Each step shows its own progress under a `[i/n] step` header, and a table at the
end gives each step's status, artifact and wall time. Long steps resume: an interrupted search
or training continues from its log / checkpoint when prepare is run again.
"""

from __future__ import annotations

import time
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.models.checkpoint import resolve_model
from specctl.models.fingerprint import model_fingerprint
from specctl.recipe import STEPS, Recipe
from specctl.reporting import Reporter, reporter
from specctl.store import Store
from specctl.store.files import read_json


TABLES = "step-table"


def _stamp(path: Path):
    """What tells a file rewritten from the one there before (a stored table is replaced
    whole: another inode)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def step_tables(recipe: Recipe, store: Store, model_dir: Path, force: bool,
                log) -> tuple[str, str]:
    """Measure the step-cost tables that are not in the store yet (all of them with force);
    returns the status and where they are."""
    from specctl.engine.loader import load_model
    from specctl.runtime.jobs.config import GenerateConfig
    from specctl.runtime.jobs.sizing import set_exact
    from specctl.runtime.control.steptables import step_table_for, step_table_path

    cfg = GenerateConfig("", **recipe.generate_options())
    fp = model_fingerprint(model_dir)
    model = load_model(model_dir, cfg.device, cfg.model_dtype(), cuda_graphs=cfg.cuda_graphs,
                       attention=cfg.attention, cudnn_attention=cfg.cudnn_attention)
    set_exact(model, cfg)
    status, where = "skipped", []
    for b in sorted({1, cfg.batch_size}):
        path = step_table_path(store, fp, model, b)
        if force or not path.is_file():
            before = _stamp(path)
            step_table_for(model, b, store=store, fingerprint=fp, log=log, fresh=True)
            kept = path.is_file() and _stamp(path) != before
            if not kept:   # (a busy CPU's: steptables said why; a run measures it again)
                log(f"{TABLES} b{b}: measured, not kept in the store")
            status = "ran" if kept and status != "not kept" else "not kept"
        else:
            log(f"{TABLES} b{b}: already in the store ({path.parent}); skipped")
        where.append(str(path.parent))
    return status, ", ".join(where)


def existing_artifact(step: str, recipe: Recipe, store: Store, model_dir: Path) -> str | None:
    """The stored artifact that makes `step` unnecessary, or None."""
    fp = model_fingerprint(model_dir)
    if step == "build-cache":
        from specctl.runtime.jobs.artifacts import resolve_corpus_cache
        from specctl.speculative.corpus_cache import ARTIFACT_FILE, KIND
        name = recipe.section("self-draft.build-cache").get("name")
        if name:   # (the recipe's own cache, of this model's tokenizer; no other is it)
            p = store.path(KIND, str(name).lower())
            if not (p / ARTIFACT_FILE).is_file():
                return None
            try:
                resolve_corpus_cache(store, model_dir, str(p), lambda *_: None)
            except SpecctlError:   # (another tokenizer's: run_step rebuilds it)
                return None
            return str(p)
        try:
            p = resolve_corpus_cache(store, model_dir, None, lambda *_: None)
        except SpecctlError:
            return None
        return str(p) if p is not None else None
    if step == "search-skip":   # (an interrupted search's best so far is not done: resumed)
        e = store.best_for_model("skipsets", fp, "speedup_estimate",
                                 keep=lambda m: not m.get("interrupted"))
        return str(e.path) if e else None
    if step == "train-adapter":
        layer = recipe.section("kangaroo.train").get("exit_layer", 0)
        if layer:
            from specctl.prep.adapter.train import adapter_ident
            p = store.path("adapters", adapter_ident(fp, layer))
            return str(p) if (p / "adapter.safetensors").exists() else None
        e = store.best_for_model("adapters", fp, "heldout_top1")
        return str(e.path) if e else None
    raise SpecctlError(f"unknown step {step!r}")


# what each step's artifact records of the settings it was made with: (recipe section, file in
# the artifact, its key holding them, the settings compared)
_MADE_WITH = {
    "build-cache": ("self-draft.build-cache", "manifest.json", "settings",
                    ("max_key_len", "gram_len", "top", "min_count")),
    "search-skip": ("draft-verify.search", "skipset.json", "config",
                    ("iters", "init_points", "objective", "prompts", "max_new", "seed")),
    "train-adapter": ("kangaroo.train", "train_log.json", "config",
                      ("epochs", "lr", "max_len", "batch_tokens", "limit", "heldout", "seed")),
}


def made_otherwise(step: str, recipe: Recipe, artifact: str) -> list[str]:
    """The settings the recipe gives `step` that its stored artifact was not made with, as
    'name X (the recipe's Y)' (an artifact that records none, or another value's type: none
    said). A user's earlier experiment (3 probes, a 12-conversation adapter) would otherwise
    stand for the recipe's step unsaid."""
    section, name, key, keys = _MADE_WITH[step]
    want = recipe.section(section)
    try:
        made = read_json(Path(artifact) / name).get(key)
    except (SpecctlError, AttributeError):
        return []
    if not isinstance(made, dict):
        return []
    out = []
    for k in keys:
        if k in want and k in made and isinstance(made[k], (int, float, str)) and \
                not isinstance(made[k], bool) and made[k] != want[k]:
            out.append(f"{k} {made[k]} (the recipe's {want[k]})")
    return out


def run_step(step: str, recipe: Recipe, store: Store, report: Reporter) -> str:
    """Run one step with the recipe's settings; returns the artifact's path."""
    model = recipe.model
    if step == "build-cache":
        from specctl.prep.cache.command import BuildCacheConfig, default_workers, run_build_cache
        s = recipe.section("self-draft.build-cache")
        if not s.get("corpus"):
            raise SpecctlError(f"recipe {recipe.path}: build-cache needs [self-draft.build-cache] "
                               "corpus = [...] (paths, or \"demo\")")
        from specctl.prep.cache.ngrams import CountConfig
        count = CountConfig(s.get("max_key_len", 4), s.get("gram_len", 4), s.get("top", 20),
                            s.get("min_count", 6), s.get("workers", default_workers()))
        cfg = BuildCacheConfig(tuple(s["corpus"]), model, count, s.get("name"),
                               force=True)   # (prepare runs a step only when it is due)
        return str(run_build_cache(cfg, store, report)["path"])
    if step == "search-skip":
        from specctl.prep.skip.command import SearchConfig, run_search_skip
        s = recipe.section("draft-verify.search")
        cfg = SearchConfig(model, s.get("dev"), s.get("iters", 1000), s.get("init_points", 0),
                           s.get("objective", "model"), s.get("prompts", 8),
                           s.get("max_new", 32), s.get("seed", 0))
        res = run_search_skip(cfg, store, True, report)
        if res["result"].get("interrupted"):   # (its best so far is saved; the next prepare
            raise KeyboardInterrupt             # resumes the search, not the next step)
        return str(res["path"])
    if step == "train-adapter":
        from specctl.prep.adapter.train import TrainConfig
        from specctl.prep.adapter.command import run_train_adapter
        s = recipe.section("kangaroo.train")
        cfg = TrainConfig(model, s.get("data"), s.get("exit_layer", 0), s.get("epochs", 1),
                          float(s.get("lr", 5e-5)), s.get("max_len", 2048),
                          s.get("batch_tokens", 4096), s.get("limit"), float(s.get("heldout", 0.05)),
                          seed=s.get("seed", 0))
        return str(run_train_adapter(cfg, store, True, report)["path"])
    raise SpecctlError(f"unknown step {step!r}")


def run_prepare(recipe: Recipe, store: Store, report: Reporter | None = None,
                only: list[str] | None = None, force: bool = False) -> list[dict]:
    report = reporter(report)
    log = report.log
    if not recipe.steps and not only:
        raise SpecctlError(f"recipe {recipe.path}: no [prepare] steps to run")
    steps = [TABLES] + recipe.steps
    if only:
        known = (TABLES,) + STEPS
        bad = [s for s in only if s not in known]
        if bad:
            raise SpecctlError(f"--only: unknown step {bad[0]!r} (known: {', '.join(known)})")
        steps = [s for s in steps if s in only] or list(only)
    model_dir = resolve_model(recipe.model, store, log=log)
    results = []
    for i, step in enumerate(steps, 1):
        report.section(f"[{i}/{len(steps)}] {step}")
        t0 = time.perf_counter()
        if step == TABLES:
            status, where = step_tables(recipe, store, model_dir, force, log)
            results.append({"step": step, "status": status, "artifact": where,
                            "wall_s": round(time.perf_counter() - t0, 1)})
            continue
        have = None if force else existing_artifact(step, recipe, store, model_dir)
        if have:
            other = made_otherwise(step, recipe, have)
            if other:
                log(f"warning: {step}: the one in the store ({have}) was not made with the "
                    f"recipe's settings: {', '.join(other)}; kept (--force --only {step} "
                    "makes the recipe's)")
            else:
                log(f"{step}: already in the store ({have}); skipped (--force redoes it)")
            results.append({"step": step, "status": "kept: other settings" if other else
                            "skipped", "artifact": have,
                            "wall_s": round(time.perf_counter() - t0, 1)})
            continue
        path = run_step(step, recipe, store, report)
        results.append({"step": step, "status": "ran", "artifact": path,
                        "wall_s": round(time.perf_counter() - t0, 1)})
    return results
