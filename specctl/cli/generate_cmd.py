"""`specctl generate`: a prompt file through the Python API (runtime/jobs/generator.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from specctl.cli.common import RichReporter, StoreOpt, _log, _warn, app, console, friendly
from specctl.cli.options import GENERATE, METHOD_OPTIONS, NO_CORPUS, config_options, flag_of
from specctl.errors import SpecctlError


@app.command(epilog="Examples:\n\n  specctl generate prompts.jsonl --out answers.jsonl\n\n"
                    "  specctl generate mt_bench.jsonl --batch-size 16 --max-tokens 512\n\n"
                    "  specctl generate prompts.jsonl --temperature 0.7 --top-p 0.9 --seed 1")
@friendly
@config_options(GENERATE, (NO_CORPUS,))
def generate(
    ctx: typer.Context,
    input: Path = typer.Argument(..., help="Prompts: a JSONL file of prompt / messages / OpenAI "
                                 "batch / turns lines, a Parquet file of such rows, or a directory "
                                 "of .jsonl / .parquet shards."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output JSONL (default: "
                                      "<input stem>.out.jsonl in the current directory; a "
                                      "piped input has none)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the last run with the same input and settings."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="A recipe TOML (recipes/): its "
                                          "model and settings; options given here win."),
    store: Optional[Path] = StoreOpt,
    options: dict = None,
):
    """Generate answers for every line of a prompt file (JSONL, Parquet) or a directory of
    shards, in input order."""
    from specctl.runtime.jobs.generator import Generator
    from specctl.runtime.jobs.locks import check_out, out_path

    p = dict(options)
    extra = _apply_recipe(ctx, recipe, p) if recipe is not None else {}
    if p.pop("no_corpus_cache"):
        p["corpus_cache"] = "none"
    # under torchrun & co. (RANK/WORLD_SIZE) only rank 0 talks: progress, summary, the error
    from specctl.runtime.jobs.dist import RankStopped, dist_env
    lead = dist_env().rank == 0
    rep = RichReporter(bars=not quiet and lead, talk=lead)
    gen = Generator(p.pop("model"), p.pop("method"), store=store, report=rep, flags=True,
                    **p, **extra)
    _warn_unused(ctx, gen.config(str(input)))
    given = out is not None   # (a directory's default name is its own: `.` is named too)
    if not given and input.exists() and (not (input.is_file() or input.is_dir()) or
                                         Path(os.path.abspath(input)).parts[1:2] in
                                         (("dev",), ("proc",))):
        # (`<(cat a.jsonl)` is /dev/fd/63, `< a.jsonl` /dev/stdin: every such run's default
        # would be 63.out.jsonl or stdin.out.jsonl, each writing over the last's answers)
        raise SpecctlError(f"{input} is a pipe or a device, not a file of its own: its answers "
                           "have no name of their own; pass --out FILE")
    out = out_path(out) if given else \
        Path(f"{input.resolve().name if input.is_dir() else input.stem}.out.jsonl")
    check_out(out, input, named=given, store=gen.store)   # (generate_file checks again)
    try:
        res = gen.generate_file(input, out, resume=resume)
    except RankStopped as e:   # another rank failed; rank 0 prints why
        raise typer.Exit(e.exit_code)
    finally:
        rep.stop()
    if not lead:
        return
    m = res["metrics"]
    console.print(f"[green]done[/]: {_n(m['requests'] - m['errors'], 'request')}, "
                  f"{m['new_tokens']} new tokens, "
                  + _rate(m)
                  + ", mean accepted tokens "
                  f"{m['mean_accepted_tokens']}"
                  + (f", {_n(m['errors'], 'bad line')}" if m["errors"] else "")
                  + _processes(m))
    _say_gain(m)
    kvm = m.get("kv_cache", {})
    if kvm.get("layout") == "paged":
        console.print(f"KV cache: paged, {kvm['blocks']} blocks ({kvm['mib']} MiB); "
                      f"{kvm['preemptions']} preempted and restarted "
                      f"({kvm['recomputed_tokens']} tokens again)", highlight=False)
    console.print(f"output: {res['out']}\nrun:    {res['run_dir']}", highlight=False, markup=False)
    if m["requests"] and m["errors"] == m["requests"]:
        raise SpecctlError(f"no line of {input} could be used ({_n(m['errors'], 'bad line')}: see "
                           "their errors in the output)", exit_code=1)


def _processes(m: dict) -> str:
    """Who ran the job, where it was more than this process: ranks, or Ray's actors (and how
    many actor processes were restarts)."""
    pool = m.get("ray")
    if pool:
        return (f" (Ray: {_n(pool['actors'], 'actor')}, {_n(pool['restarts'], 'restart')}, "
                f"{pool['processes_with_work']} with work)")
    return f" ({m['world_size']} processes)" if m.get("world_size", 1) > 1 else ""


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _warn_unused(ctx: typer.Context, cfg) -> None:
    """A warning for each option given on the command line that the run does not use, and for
    a --stop whose backslash a shell did not make a newline."""
    given = {n for n in ctx.params
             if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"}
    for method, names in METHOD_OPTIONS.items():
        unused = [flag_of(n, ctx.params[n]) for n in names
                  if n in given and cfg.method not in (method, "auto")]
        if unused:
            _warn(f"{', '.join(unused)} only appl{'y' if len(unused) > 1 else 'ies'} to "
                  f"--method {method}; ignored with --method {cfg.method}")
    samp = [flag_of(n, ctx.params[n]) for n in ("top_p", "top_k") if n in given]
    if samp and cfg.temperature == 0:   # (greedy: the run took no sampling settings, unsaid)
        _warn(f"{', '.join(samp)} only appl{'y' if len(samp) > 1 else 'ies'} to sampling "
              "(--temperature above 0); ignored: this run is greedy")
    if "actors" in given and cfg.ray is None:
        _warn("--actors only applies with --ray; ignored")
    if "gpu_memory" in given and cfg.kv_memory is not None:
        _warn("--gpu-memory is ignored with --kv-memory (the KV cache's own size)")
    elif "gpu_memory" in given and (cfg.device == "cpu" or
                                    cfg.ray is None and not _cuda(cfg.device)):
        _warn("--gpu-memory only applies on CUDA; ignored on the CPU")
    for stop in cfg.stop:   # (a shell's "\n" is a backslash and an n, not a newline)
        if "\\n" in stop or "\\t" in stop:
            _warn(f"stop string {stop!r} holds a backslash: it stops at those characters as "
                  "written (a newline or a tab, in bash: --stop $'\\n', --stop $'\\t')")
    if cfg.method == "self-draft":
        if {"corpus_cache", "no_corpus_cache"} <= given:
            _warn("--corpus-cache is ignored with --no-corpus-cache")
        if cfg.corpus_cache == "none" and not cfg.context_cache:
            _warn("with no corpus cache and no context cache self-draft has no candidates: it "
                  "decodes as ar does, one token per step")
        if cfg.grid and (not cfg.context_cache or cfg.context_cands <= 0):
            _warn("--grid drafts the context cache's candidates (and the job cache's): with "
                  "none (--context-cands 0 or --no-context-cache) its steps are the "
                  "per-sequence path's")


def _cuda(device: str) -> bool:
    """Whether the run's --device is a CUDA one (auto: where CUDA is there)."""
    if device == "auto":
        import torch
        return torch.cuda.is_available()
    return device.startswith("cuda")


def _rate(m: dict) -> str:
    """The summary's tokens/s, saying which tokens it counts where a resumed run had made some
    before this invocation (its new tokens are the whole run's)."""
    if m["tokens_per_s"] is None:
        return "tokens/s not measured (no answer was made by this invocation)"
    now = m.get("generated_tokens", m["new_tokens"])
    if now == 0:   # (a complete run resumed: the rate of the invocations that made it)
        return f"no answer made by this invocation (the run measured {m['tokens_per_s']} " \
            "tokens/s)"
    return f"{m['tokens_per_s']} tokens/s" if now == m["new_tokens"] else \
        f"{m['tokens_per_s']} tokens/s over the {now} made by this invocation"


def _say_gain(m: dict) -> None:
    """What speculation bought (metrics.gain_vs_ar), and the one-off work left out of tokens/s."""
    gain, spec = m.get("gain_vs_ar_est"), m.get("speculation", {}).get("mode")
    if gain is not None and m["method"] != "ar":
        console.print(f"vs ar: {gain:.2f}x, estimated (ar: ~{m['ar_tokens_per_s_est']:.1f} "
                      "tokens/s for the same tokens, priced by the ar steps this run timed; "
                      "`specctl bench` measures it)", highlight=False, markup=False)
    elif gain is None and spec == "fixed" and m["tokens_per_s"]:
        console.print("vs ar: not estimated under --speculate fixed (no step-cost table); "
                      "`specctl bench` measures it", highlight=False, markup=False)
    one = m.get("one_off_s", {})
    table, graphs = one.get("step_table", 0.0), one.get("graph_captures", 0.0)
    if table >= 0.5:
        console.print(f"step-cost table measured once: {table:.1f} s (kept in the store, not "
                      "counted in tokens/s)", highlight=False, markup=False)
    if graphs >= 0.5:
        console.print(f"CUDA graphs captured at start-up: {graphs:.1f} s (not counted in "
                      "tokens/s)", highlight=False, markup=False)


def _check_recipe_values(path: Path, taken: dict, sources: dict) -> None:
    """The recipe's values this run takes, checked as settings of their own: a bad one named
    as the recipe gives it (`--max-tokens must be at least 1` named a flag never typed)."""
    from specctl.runtime.jobs.config import GenerateConfig
    try:
        GenerateConfig(input="-", **taken)
    except SpecctlError as e:
        said = str(e)
        for name in taken:
            flag = flag_of(name, taken[name])
            if said.startswith(flag + " ") or said.startswith(flag + ":"):
                said = sources[name][1] + said[len(flag):]
                break
        raise SpecctlError(f"recipe {path}: {said}") from None


def _apply_recipe(ctx: typer.Context, path: Path, p: dict) -> dict:
    """Fill the options the user did not give from the recipe (in place); returns the recipe's
    GenerateConfig settings that have no option of their own."""
    from specctl.recipe import load_recipe

    r = load_recipe(path)
    extra, taken, sources = {}, {}, r.generate_sources()
    for name, (val, _) in sources.items():
        if name not in p:
            extra[name] = taken[name] = val
        elif getattr(ctx.get_parameter_source(name), "name", "DEFAULT") in ("DEFAULT",
                                                                          "DEFAULT_MAP"):
            p[name] = taken[name] = tuple(val) if name == "stop" else val
    _check_recipe_values(path, taken, sources)
    _log(f"recipe {r.name}: {path}")
    if r.model is None and getattr(ctx.get_parameter_source("model"), "name",
                                   "DEFAULT") in ("DEFAULT", "DEFAULT_MAP"):
        # (a recipe is a model's settings: one without its model ran the demo model unsaid)
        _log(f"recipe {r.name} names no model ([recipe] model) and --model is not given: "
             "the demo model runs")
    return extra
