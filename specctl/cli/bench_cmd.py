"""`specctl bench` and `specctl report`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from specctl.cli.common import (RichReporter, StoreOpt, Terminated, _stdout, app, console,
                                friendly)
from specctl.cli.options import BENCH, config_options

# the options that are BenchConfig's own fields (the rest pass to every run's GenerateConfig)
BENCH_FIELDS = ("model", "max_tokens", "seed", "chat", "device", "dtype", "attention",
                "cuda_graphs", "cudnn_attention", "prefill_chunk")
from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import VARIANTS
from specctl.store import Store


def _print_bench(res: dict) -> None:
    from specctl import bench as b

    out = _stdout()
    out.print(b.CARRIED, highlight=False, markup=False)
    t = Table(title=escape(b.title(res)), title_justify="left")
    for col in b.TABLE_COLUMNS:
        t.add_column(col, justify="left" if col in ("method", "= ar") else "right",
                     overflow="fold")
    for row in b.table_rows(res):
        t.add_row(*(escape(x) for x in row))
    out.print(t)
    if res.get("category_rows"):
        t = Table(title="per category (time attributed by residency in a slot)",
                  title_justify="left")
        for col in b.CATEGORY_COLUMNS:
            t.add_column(col, justify="left" if col in ("category", "method") else "right",
                         overflow="fold")
        for row in b.category_rows(res):
            t.add_row(*(escape(x) for x in row))
        out.print(t)
    for n in b.notes(res):
        out.print(n, highlight=False, markup=False)


@app.command(epilog="Examples:\n\n  specctl bench prompts.jsonl --methods ar,draft-verify,hf "
                    "--batch-sizes 1,8\n\n"
                    "  specctl bench mt_bench.jsonl --max-tokens 256 --repeats 3\n\n"
                    "  specctl bench --limit 16 --methods ar,hf,hf-prompt-lookup --batch-sizes 1")
@friendly
@config_options(BENCH)
def bench(
    input: Optional[Path] = typer.Argument(None, help="Prompts, as generate reads them (JSONL, "
                                           "Parquet, a directory of shards; a 'category' field "
                                           "gives per-category rows); default: ShareGPT first "
                                           "turns."),
    methods: str = typer.Option("ar,self-draft,draft-verify,hf,hf-prompt-lookup", "--methods",
                                help="Comma-separated: ar, draft-verify, kangaroo, self-draft, "
                                "hf, hf-prompt-lookup, hf-static (CUDA); variants "
                                + ", ".join(f"{m}:{v}" for m, vs in VARIANTS.items() for v in vs)
                                + "; any method may end in :auto or :fixed (its --speculate) "
                                "and :exact (--exact), e.g. self-draft:light:fixed:exact."),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="Comma-separated."),
    repeats: int = typer.Option(3, "--repeats", help="Timed runs per method and batch size."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed warm-up runs before them."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N prompts "
                                        "(ShareGPT default: 16)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    store: Optional[Path] = StoreOpt,
    options: dict = None,
):
    """Benchmark methods side by side on the same prompts, ar included: tokens/s, speedup,
    acceptance, memory, outputs checked against ar. Every run is built as `generate` builds
    it with the same options."""
    from specctl.bench import BenchConfig, mismatch_error, parse_list, run_bench

    common = {k: options.pop(k) for k in BENCH_FIELDS}
    cfg = BenchConfig(str(input) if input else None, methods=parse_list(methods, "--methods"),
                      batch_sizes=parse_list(batch_sizes, "--batch-sizes", int),
                      repeats=repeats, warmup=warmup, limit=limit, **common,
                      method_options=options)
    rep = RichReporter(bars=not quiet)
    try:
        res = run_bench(cfg, Store(store), rep)
    except KeyboardInterrupt as e:   # (SIGTERM too: cli.main, Terminated)
        rep.stop()
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        console.print(f"[yellow]{how}[/]: a bench run is stored only once it is complete")
        raise typer.Exit(143 if isinstance(e, Terminated) else 130)
    finally:
        rep.stop()
    _print_bench(res)
    console.print(f"bench: {res['path']}", highlight=False, markup=False)
    err = mismatch_error(res)
    if err is not None:
        raise err
    # (a script must not read a bench of nothing, or of `ar` alone against nothing, as a pass)
    # (a method added as a baseline, ar:exact for :exact rows, is not one compared)
    asked = [m for m in cfg.methods if m != "ar"]
    compared = [r for r in res["rows"] if r["method"] in asked]
    if not res["rows"] or asked and not compared:
        why = "; ".join(sorted({f"{s['method']}: {s['reason']}" for s in res["skipped"]}))
        what = "no row ran: every method was skipped" if not res["rows"] else \
            "only ar ran: every method to compare with it was skipped"
        raise SpecctlError(f"{what} ({why})")


def _no_matplotlib() -> str | None:
    """Why no plot can be drawn here, or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'specctl[plot]')"
    return None


@app.command(epilog="Examples:\n\n  specctl report\n\n"
                    "  specctl report bench-20261122 --md BENCH.md\n\n"
                    "  specctl report --all --plots plots/")
@friendly
def report(
    runs: list[str] = typer.Argument(None, help="Bench run ids or unique prefixes "
                                     "(default: the latest)."),
    all_runs: bool = typer.Option(False, "--all", help="Every stored bench run."),
    md: Optional[Path] = typer.Option(None, "--md", help="Also write the tables as markdown."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Folder for the PNG plots "
                                         "(default: each bench run's folder in the store)."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Tables only."),
    store: Optional[Path] = StoreOpt,
):
    """Tables (and PNG plots) of stored bench runs."""
    from specctl import bench as b

    if no_plots and plots is not None:
        raise SpecctlError("--plots writes plots and --no-plots none: pass one")
    if md is not None and md.is_dir():
        raise SpecctlError(f"--md {md} is a directory; pass a file path")
    if md is not None:   # (a pipe, a device: said now, not as a temporary file's path later)
        from specctl.store import writable_file
        writable_file(md, "--md")
    if plots is not None and plots.exists() and not plots.is_dir():
        raise SpecctlError(f"--plots {plots} exists and is no folder: pass a folder (made if "
                           "missing)")
    why = None if no_plots else _no_matplotlib()
    if why and plots is not None:   # (asked for, and before anything is written: a run that
        raise SpecctlError(f"--plots: {why}; --no-plots for the tables only")   # writes none fails)
    results = b.load_benches(Store(store), list(runs or []), all_runs)
    for res in results:
        _print_bench(res)
    if md is not None:
        from specctl.store import atomic_write_text
        atomic_write_text(md, b.markdown(results))
        console.print(f"markdown: {md}", highlight=False, markup=False)
    if no_plots:
        return
    if why:
        console.print(f"[yellow]{escape(why)}[/]: no plots written")
        return
    for res in results:
        where = plots if plots is not None else Path(res["path"])
        prefix = f"{res['id']}-" if plots is not None else ""
        for p in b.write_plots(res, where, prefix):
            console.print(f"plot: {p}", highlight=False, markup=False)
