"""`specctl generate`: a prompt file through the Python API (runtime/generator.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from specctl.cli.common import (AdapterOpt, AlphaOpt, AttentionOpt, Beta1Opt, Beta2Opt,
                                BranchesOpt, BranchLenOpt, CorpusCandsOpt, CorpusOpt, CtxCandsOpt,
                                EpsOpt, EtaOpt, Gamma0Opt, GraphsOpt, GramOpt, KGammaOpt,
                                MaxDraftOpt, NoContextOpt, NoCorpusOpt, PromptGramsOpt,
                                RichReporter, SkipSetOpt, SpeculateOpt, StoreOpt, _log, _warn,
                                app, console, friendly)
from specctl.errors import SpecctlError


def _check_writable(out: Path) -> None:
    """--out must be writable before the job runs, not found unwritable after it."""
    import tempfile
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".probe"):
            pass
    except OSError as e:
        raise SpecctlError(f"--out {out}: cannot write there ({e.strerror or e})") from None


@app.command(epilog="Examples:\n\n  specctl generate prompts.jsonl --out answers.jsonl\n\n"
                    "  specctl generate mt_bench.jsonl --batch-size 16 --max-tokens 512\n\n"
                    "  specctl generate prompts.jsonl --temperature 0.7 --top-p 0.9 --seed 1")
@friendly
def generate(
    ctx: typer.Context,
    input: Path = typer.Argument(..., help="JSONL prompts: prompt / messages / OpenAI batch / turns lines."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local HF folder, hub id, or "
                                        "'smollm2-135m-instruct' (the default demo model)."),
    method: str = typer.Option("ar", "--method", help="Decoding method: ar, draft-verify, "
                               "kangaroo, self-draft, or auto (the fastest of those whose "
                               "artifacts are in the store, timed on a short pilot of the "
                               "first prompts)."),
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
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads per step "
                                          "(default: measured as the run goes, so a busy "
                                          "machine does not stall the step)."),
    kv_memory: Optional[str] = typer.Option(None, "--kv-memory", help="Memory for the KV "
                                            "cache, e.g. 8GB. Less than --batch-size "
                                            "full-length sequences need: a paged cache, "
                                            "filled by actual lengths (default: CPU all it "
                                            "needs, CUDA set by --gpu-memory)."),
    gpu_memory: float = typer.Option(0.9, "--gpu-memory", help="CUDA: the share of the GPU's "
                                     "memory that weights, KV cache and work may use "
                                     "together (vLLM's gpu_memory_utilization)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="A recipe TOML (recipes/): its "
                                          "model and settings; options given here win."),
    store: Optional[Path] = StoreOpt,
):
    """Generate answers for every line of a JSONL prompt file, in input order."""
    from specctl.runtime.generator import Generator

    p = dict(ctx.params)
    extra = _apply_recipe(ctx, recipe, p) if recipe is not None else {}
    # under torchrun & co. (RANK/WORLD_SIZE) only rank 0 talks: progress, summary, the error
    from specctl.runtime.dist import RankStopped, dist_env
    lead = dist_env().rank == 0
    rep = RichReporter(bars=not quiet and lead, talk=lead)
    gen = Generator(p["model"], p["method"], store=store, report=rep, **_options(p), **extra)
    _warn_unused(ctx, gen.config(str(input)))
    out = out or Path(f"{input.stem}.out.jsonl")
    if out.is_dir():
        raise SpecctlError(f"--out {out} is a directory; pass a file path")
    if out.exists() and input.exists() and os.path.samefile(out, input):
        raise SpecctlError(f"--out {out} is the input file: answers would replace the prompts")
    _check_writable(out)
    try:
        res = gen.generate_file(input, out, resume=resume)
    except RankStopped as e:   # another rank failed; rank 0 prints why
        raise typer.Exit(e.exit_code)
    finally:
        rep.stop()
    if not lead:
        return
    m = res["metrics"]
    console.print(f"[green]done[/]: {m['requests']} requests, {m['new_tokens']} new tokens, "
                  f"{m['tokens_per_s']} tokens/s, mean accepted tokens "
                  f"{m['mean_accepted_tokens']}" + (f", {m['errors']} bad lines" if m["errors"] else "")
                  + (f" ({m['world_size']} processes)" if m.get("world_size", 1) > 1 else ""))
    kvm = m.get("kv_cache", {})
    if kvm.get("layout") == "paged":
        console.print(f"KV cache: paged, {kvm['blocks']} blocks ({kvm['mib']} MiB); "
                      f"{kvm['preemptions']} preempted and restarted "
                      f"({kvm['recomputed_tokens']} tokens again)", highlight=False)
    console.print(f"output: {res['out']}\nrun:    {res['run_dir']}", highlight=False, markup=False)
    if m["requests"] and m["errors"] == m["requests"]:
        raise SpecctlError(f"no line of {input} could be used ({m['errors']} bad lines: see "
                           "their errors in the output)", exit_code=1)


# options that are GenerateConfig fields as they are
_PLAIN = ("batch_size", "max_tokens", "temperature", "top_p", "top_k", "seed", "chat", "device",
          "dtype", "skip_bad", "attention", "cuda_graphs", "limit", "skip_set", "max_draft",
          "gamma0", "alpha", "eps", "beta1", "beta2", "adapter", "eta", "kangaroo_gamma",
          "branches", "branch_len", "gram", "context_cands", "corpus_cands", "prompt_grams",
          "speculate", "threads", "kv_memory", "gpu_memory")


def _options(p: dict) -> dict:
    """The command line's options (after a recipe filled them) as GenerateConfig settings."""
    return {**{k: p[k] for k in _PLAIN}, "stop": tuple(p["stop"]),
            "corpus_cache": "none" if p["no_corpus_cache"] else p["corpus_cache"],
            "context_cache": not p["no_context_cache"]}


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
        unused = [flag(n) for n in names if n in given and cfg.method not in (method, "auto")]
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
