"""The bench's timing loop: warm-up, round-robin repeats, rows, divergence analysis, storing."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specctl import __version__
from specctl.bench.analysis import (_category_tps, accept_numbers, compare, divergence_gaps,
                                    spread)
from specctl.bench.conditions import batch_warnings, row_conditions
from specctl.bench.config import PEERS, WARMUP_TOKENS, BenchConfig
from specctl.bench.peers import HFMethod, SpecctlMethod, _load_hf
from specctl.bench.report import markdown
from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord
from specctl.io.shards import read_input
from specctl.reporting import Reporter, Task, reporter
from specctl.runtime.jobs.methods import locate_artifacts, warn_flex_off_cuda
from specctl.runtime.jobs.metrics import peak_mb
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows, require_raw_prompts, to_request
from specctl.runtime.step.threads import say_threads
from specctl.store import Store, atomic_write_json, atomic_write_text, make_manifest, new_id


def _load_prompts(cfg: BenchConfig, store: Store, log) -> tuple[list[PromptRecord], str, str]:
    """(records, input description, input sha256)."""
    if cfg.input is None:
        from specctl.io.sharegpt import first_human_turns
        texts = first_human_turns(cfg.limit or 16, store, log=log)
        recs = [PromptRecord(i, i + 1, None, None, None, (({"role": "user", "content": t},),),
                             None, t) for i, t in enumerate(texts)]
        sha = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
        return recs, f"sharegpt:{len(texts)}", sha
    path = Path(cfg.input)
    got = read_input(path)   # (once: its hash is of the bytes read)
    recs = got.records
    if cfg.limit:
        recs = recs[:cfg.limit]
    if not cfg.chat:
        require_raw_prompts(recs, path)
    own = sum(r.sampling is not None for r in recs)
    if own:
        log(f"note: {own} lines carry sampling settings of their own; bench times every line "
            "with the command's settings (generate applies them)")
    return recs, str(path.resolve()), got.sha256


def _env(device: torch.device) -> dict:
    import transformers
    return {"specctl": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}


@dataclass
class _Bench:
    """What the phases of one bench hand on to each other."""
    cfg: BenchConfig
    store: Store
    log: Callable[[str], None]
    report: Reporter
    recs: list[PromptRecord]
    model_dir: Path
    tk: Tokenization
    model: object
    progress: Task = field(default_factory=Task)
    runners: dict = field(default_factory=dict)        # method -> SpecctlMethod | HFMethod
    skipped: list[dict] = field(default_factory=list)
    plan: list[tuple[str, int]] = field(default_factory=list)
    runs_of: dict = field(default_factory=dict)        # (method, b) -> [RunResult]
    peak: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def cats(self) -> dict[int, str]:
        return {r.index: r.category or "uncategorized" for r in self.recs}

    @property
    def has_cats(self) -> bool:
        return any(r.category is not None for r in self.recs)


def _model_dtype(cfg: BenchConfig) -> str:
    """The dtype of the bench's one model: --dtype; but where every specctl row runs under
    --exact, "auto" is what `generate --exact` loads (GenerateConfig.model_dtype: bf16, the
    dtype a CPU can make batch-invariant). A bench of both kinds keeps --dtype: its plain
    rows are timed in the dtype asked for."""
    rows = [m for m in cfg.methods if m not in PEERS]
    if rows and all(cfg.generate_config(m, 1).exact for m in rows):
        return cfg.generate_config(rows[0], 1).model_dtype()
    return cfg.dtype


def run_bench(cfg: BenchConfig, store: Store, report: Reporter | None = None, *,
              log: Callable[[str], None] | None = None) -> dict:
    """Run the bench, store it as benches/<id>; returns the results (see RESULTS_SCHEMA).
    report: messages and the progress bar (log: a message callback instead)."""
    from specctl.models.checkpoint import resolve_model
    from specctl.engine.loader import load_model

    report = reporter(report, log)
    log = report.log
    store.check_writable()   # (before a prompt set or the model is downloaded into it)
    # (a skip set or adapter the command names that is not there is a mistake, as generate
    # says before loading: a store without one skips its method, a typo'd path stopped
    # nothing, the bench ran without the method it was asked for)
    for m in cfg.methods:
        if m not in PEERS:
            locate_artifacts(cfg.generate_config(m, 1), store)
    recs, input_desc, input_sha = _load_prompts(cfg, store, log)
    model_dir = resolve_model(cfg.model, store, log=log)
    tk = Tokenization(model_dir, cfg.chat)
    model = load_model(model_dir, cfg.device, _model_dtype(cfg), cuda_graphs=cfg.cuda_graphs,
                       attention=cfg.attention, cudnn_attention=cfg.cudnn_attention)
    warn_flex_off_cuda(model, log)
    say_threads(cfg.method_options.get("threads"), model, log)
    b = _Bench(cfg, store, log, report, recs, model_dir, tk, model)
    _check_lengths(b, input_desc)
    _methods(b)
    for warning in batch_warnings(len(recs), {bs for _, bs in b.plan}):
        log(warning)
    if cfg.warmup == 0:   # (a probe read kangaroo, drafting nothing, at 1.34x ar so)
        log("warning: --warmup 0: each method's first timed run pays its start-up (caches, "
            "lazily made tables) and ar runs first, so the ratios are not its steady state "
            "(the default warm-up is 3 runs)")
    need_ref = 1 not in cfg.batch_sizes
    progress = b.progress = report.task("bench", len(b.plan) * (cfg.warmup + cfg.repeats)
                                        + int(need_ref))
    reference, ref_b1 = "ar at batch size 1 (timed)", {}
    if need_ref:
        for base in {_baseline(b, m) for m, _ in b.plan}:
            progress.update(info=f"{base} b1 (reference outputs, untimed)")
            ref_b1[base] = b.runners[base].run(recs, 1, cfg.max_tokens).outputs
        progress.update(advance=1)
        reference = "ar at batch size 1 (one untimed reference run)"
    _time(b)
    rows, cat_rows = _rows(b, ref_b1)
    _analyze_divergence(b, rows, ref_b1)
    progress.close()
    return _store(b, rows, cat_rows, reference, input_desc, input_sha)


def _check_lengths(b: _Bench, input_desc: str) -> None:
    """Every prompt fits the model's context (the runs size their KV rows as generate does)."""
    ctx = b.model.cfg.max_position
    for r in (to_request(rec, b.cfg.max_tokens) for rec in b.recs):
        n, _ = kv_rows(b.tk, r)
        if n >= ctx:
            raise SpecctlError(f"{b.recs[r.index].where(input_desc)}: prompt is {n} tokens: "
                               f"the model's context ({ctx}) leaves no room for an answer")


def _skip(b: _Bench, m: str, batch_size: int | None, reason: str) -> None:
    b.skipped.append({"method": m, "batch_size": batch_size, "reason": reason})
    where = f" at batch size {batch_size}" if batch_size is not None else ""
    b.log(f"skipping {m}{where}: {reason}")


def _methods(b: _Bench) -> None:
    """Which (method, batch size) run, which are skipped and why; ar first."""
    cfg, dev, log = b.cfg, b.model.device, b.log
    methods = list(cfg.methods)
    if "ar" not in methods:
        methods.insert(0, "ar")
        log("ar is added: it is the baseline for speedups and outputs")
    else:
        methods.remove("ar")
        methods.insert(0, "ar")
    exact = [m for m in methods if m not in PEERS and cfg.generate_config(m, 1).exact]
    if exact and exact[0] != "ar":   # (under a global --exact ar is exact itself)
        if "ar:exact" in methods:
            methods.remove("ar:exact")
        else:
            log("ar:exact is added: the :exact rows' outputs are compared with it")
        methods.insert(1, "ar:exact")
    hf_model = None
    for m in methods:
        if m in PEERS:
            if m == "hf-static" and dev.type != "cuda":
                _skip(b, m, None, "transformers' static-cache (compiled) generate is measured "
                      "on CUDA only")
                continue
            if m == "hf-prompt-lookup" and 1 not in cfg.batch_sizes:
                continue   # skipped below, per batch size
            if hf_model is None:
                try:
                    hf_model = _load_hf(b.model_dir, b.model, log)
                except SpecctlError as e:
                    _skip(b, m, None, str(e))
                    continue
            b.runners[m] = HFMethod(m, hf_model, b.tk, dev)
        else:
            try:
                b.runners[m] = SpecctlMethod(cfg, m, b.model, b.model_dir, b.tk, b.store, log)
            except SpecctlError as e:
                _skip(b, m, None, str(e))
    for bs in sorted(set(cfg.batch_sizes)):
        for m in methods:
            if m == "hf-prompt-lookup" and bs != 1:
                _skip(b, m, bs, "transformers' prompt lookup decoding supports batch size 1 only")
                continue
            if m in b.runners:   # else its artifact is missing (said above)
                b.plan.append((m, bs))


def _time(b: _Bench) -> None:
    """Per batch size: every method's warm-up, then the repeats round-robin over the methods
    (drift and background load hit every method alike)."""
    cfg, progress = b.cfg, b.progress
    for bs in sorted(set(cfg.batch_sizes)):
        here = [m for m, bb in b.plan if bb == bs]
        for m in here:
            for w in range(cfg.warmup):
                progress.update(info=f"{m} b{bs}  warm-up {w + 1}/{cfg.warmup}")
                if m == "hf-static":
                    # compiled per shape: warm up once on the timed shapes, so the timed runs
                    # do not compile. (specctl's runners capture every graph shape as they are
                    # built, before the clock starts: a short warm-up does for them.)
                    b.runners[m].run(b.recs, bs, cfg.max_tokens)
                else:
                    b.runners[m].run(b.recs[:bs], bs, min(cfg.max_tokens, WARMUP_TOKENS),
                                     size_like=(b.recs, cfg.max_tokens))
                progress.update(advance=1)
        for k in range(cfg.repeats):
            for m in here:
                progress.update(info=f"{m} b{bs}  repeat {k + 1}/{cfg.repeats}")
                _timed_run(b, m, bs)
                progress.update(advance=1)


def _timed_run(b: _Bench, m: str, bs: int) -> None:
    """One timed repeat of (m, bs), with its memory peak (the run counts its own captures)."""
    dev = b.model.device
    base_mb = 0.0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base_mb = torch.cuda.memory_allocated(dev) / 2**20
    run = b.runners[m].run(b.recs, bs, b.cfg.max_tokens)
    st = run.stats
    if (m, bs) not in b.runs_of and getattr(st, "captures", 0):
        # (the one-off cost a `generate` run pays before its first step: shown, not timed)
        b.log(f"{m} b{bs}: its runner captured {st.captures} CUDA graph shapes as it started, "
              f"in {st.capture_s:.1f} s (before the clock)")
    b.runs_of.setdefault((m, bs), []).append(run)
    p = round(peak_mb(dev), 1)
    b.peak[(m, bs)] = max(b.peak.get((m, bs), 0.0), p)
    if dev.type == "cuda":
        b.extra[(m, bs)] = max(b.extra.get((m, bs), 0.0), round(p - base_mb, 1))


def _row(b: _Bench, m: str, bs: int) -> dict:
    runs = b.runs_of[(m, bs)]
    first = runs[0]
    tps = [r.new_tokens / r.wall if r.wall > 0 else 0.0 for r in runs]
    row = {"method": m, "engine": b.runners[m].engine, "batch_size": bs,
           "requests": len(first.outputs), "new_tokens": first.new_tokens, "steps": None,
           "tokens_per_s": spread(tps), "wall_s": {"median": round(statistics.median(
               r.wall for r in runs), 4), "runs": [round(r.wall, 4) for r in runs]},
           "speedup_vs_ar": None, "speedup_runs": None, "mean_accepted_tokens": None,
           "acceptance_rate": None,
           "ctar": None, "zero_accept_share": None, "padding_ratio": None,
           "speculation": None, "time_split": None, "accepted_from": None,
           "peak_memory_mb": b.peak[(m, bs)], "run_memory_mb": b.extra.get((m, bs)),
           "exact": b.runners[m].engine == "specctl" and b.cfg.generate_config(m, bs).exact,
           "matches_ar": None, "matches_ar_b1": None,
           "mismatch": None,
           "repeats_identical": all(r.outputs == first.outputs for r in runs[1:]),
           **row_conditions(len(b.recs), bs, [r.captures for r in runs])}
    if row["engine"] == "specctl":
        row.update(accept_numbers(b.cfg.generate_config(m, bs), first.lines, first.stats,
                                  b.model.device))
    return row


def _baseline(b: _Bench, m: str) -> str:
    """The ar m's outputs must equal: ar:exact for a :exact method where the bench runs it
    (plain bf16 ar differs from it), else ar."""
    exact = b.runners[m].engine == "specctl" and b.cfg.generate_config(m, 1).exact
    return "ar:exact" if exact and "ar:exact" in b.runners else "ar"


def _outputs(b: _Bench, ref_b1: dict, vs: str) -> dict:
    """The outputs a comparison named ("ar:exact b8") was made against."""
    name, _, bs = vs.rpartition(" b")
    runs = b.runs_of.get((name, int(bs)))
    return runs[0].outputs if runs else ref_b1[name]


def _rows(b: _Bench, ref_b1: dict):
    """One row per (method, batch size), compared with ar; per-category rows."""
    log = b.log
    rows, cat_rows = [], []
    ar_rows: dict[int, dict] = {}
    ar_cat: dict[int, dict[str, float]] = {}
    for m, bs in b.plan:
        label = f"{m} b{bs}"
        runs = b.runs_of[(m, bs)]
        first = runs[0]
        row = _row(b, m, bs)
        if m == "ar":
            ar_rows[bs] = row
        base = ar_rows.get(bs)
        if base and all(base["tokens_per_s"]["runs"]):
            # paired by round: the repeats run round-robin, so round k of a method ran next to
            # round k of ar, and a slow spell of a shared machine lands on both
            ratios = [x / a for x, a in zip(row["tokens_per_s"]["runs"],
                                            base["tokens_per_s"]["runs"])]
            row["speedup_vs_ar"] = round(statistics.median(ratios), 4)
            row["speedup_runs"] = [round(x, 4) for x in ratios]
        ref = _baseline(b, m)
        d_same = compare(first.outputs, _outputs(b, ref_b1, f"{ref} b{bs}"), f"{ref} b{bs}")
        d_b1 = compare(first.outputs, _outputs(b, ref_b1, f"{ref} b1"), f"{ref} b1")
        row["matches_ar"], row["matches_ar_b1"] = d_same is None, d_b1 is None
        row["mismatch"] = d_same or d_b1
        if not row["repeats_identical"]:
            log(f"{label}: the repeats did not produce identical tokens")
        if row["engine"] == "specctl" and (row["mismatch"] or not row["repeats_identical"]):
            log(f"{label}: outputs differ from {row['mismatch']['vs'] if row['mismatch'] else 'its first repeat'}")
        rows.append(row)
        if b.has_cats:
            cat_rows += _category_rows(b, m, bs, ar_cat)
        log(f"{label}: {row['tokens_per_s']['median']:.1f} tokens/s"
            + (f", {row['speedup_vs_ar']:.2f}x ar" if row["speedup_vs_ar"] else "")
            + (f", mean accepted tokens {row['mean_accepted_tokens']}"
               if row["mean_accepted_tokens"] is not None else "")
            + (f"; {row['captures']} CUDA graph shapes captured inside its timed repeats"
               if row["captures"] else ""))
    return rows, cat_rows


def _category_rows(b: _Bench, m: str, bs: int, ar_cat: dict) -> list[dict]:
    cats, runs = b.cats, b.runs_of[(m, bs)]
    first = runs[0]
    per_run = [_category_tps(r, cats) for r in runs]
    if m == "ar":
        ar_cat[bs] = {c: [p[c] for p in per_run] for c in per_run[0]}
    out = []
    for c in per_run[0]:
        idx = [i for i in first.outputs if cats[i] == c]
        cr = {"method": m, "batch_size": bs, "category": c, "requests": len(idx),
              "new_tokens": sum(len(a) for i in idx for a in first.outputs[i]),
              "tokens_per_s": spread([p[c] for p in per_run]), "speedup_vs_ar": None,
              "mean_accepted_tokens": None, "ctar": None, "zero_accept_share": None}
        ar_c = ar_cat.get(bs, {}).get(c)
        if ar_c and all(ar_c):   # paired by round, as the rows
            cr["speedup_vs_ar"] = round(statistics.median(
                p[c] / a for p, a in zip(per_run, ar_c)), 4)
        if b.runners[m].engine == "specctl":
            sub = [l for l in first.lines if cats[l["index"]] == c]
            a = accept_numbers(b.cfg.generate_config(m, bs), sub, None, b.model.device)
            cr.update({k: a[k] for k in ("mean_accepted_tokens", "ctar", "zero_accept_share")})
        out.append(cr)
    return out


def _analyze_divergence(b: _Bench, rows: list[dict], ref_b1: dict) -> None:
    """After every timed run (the analysis runs the model on its own cache): where a row
    differs, how close to a tie the model was at each first differing token."""
    model, log = b.model, b.log
    for row in rows:
        m, bs = row["method"], row["batch_size"]
        runs = b.runs_of[(m, bs)]
        try:
            if row["mismatch"]:
                vs = row["mismatch"]["vs"]
                ref, got = _outputs(b, ref_b1, vs), runs[0].outputs
            elif not row["repeats_identical"]:
                vs = "its first repeat"
                ref = runs[0].outputs
                got = next(r.outputs for r in runs[1:] if r.outputs != ref)
            else:
                continue
            # (the numerics the row ran with)
            model.set_exact(b.runners[m].engine == "specctl" and b.cfg.generate_config(m, 1).exact)
            gaps = divergence_gaps(model, b.tk.render, b.recs, got, ref)
        except Exception as e:   # noqa: BLE001 - a diagnosis must not cost the timed results
            log(f"{m} b{bs}: the divergence analysis failed ({type(e).__name__}: {e})")
            continue
        steps = [g["steps"] for g in gaps]
        if gaps and None not in steps:
            row["divergence"] = {
                "vs": vs, "differing": sum(1 for i in ref if got.get(i) != ref[i]),
                "analyzed": len(gaps), "max_gap": max(abs(g["gap"]) for g in gaps),
                "max_steps": max(steps), "near_ties": all(g["near_tie"] for g in gaps),
                "gaps": gaps}
            d = row["divergence"]
            log(f"{m} b{bs}: first divergences from {vs} at logit gaps up to {d['max_gap']:.3g} "
                f"({d['max_steps']:g} rounding steps of the top logit in "
                f"{str(model.dtype).replace('torch.', '')}; {d['analyzed']} of {d['differing']} "
                "differing sequences read: first answers only): "
                + ("near-ties, within what another batch shape moves the logits"
                   if d["near_ties"] else "NOT all near-ties: a real difference"))


def _store(b: _Bench, rows, cat_rows, reference: str, input_desc: str, input_sha: str) -> dict:
    from specctl.engine.launches import on_cuda
    from specctl.models.fingerprint import model_fingerprint

    cfg, dev, model = b.cfg, b.model.device, b.model
    ok = all(r["matches_ar"] and r["matches_ar_b1"] and r["repeats_identical"]
             for r in rows if r["engine"] == "specctl")
    bench_id = new_id("bench-")
    res = {"schema": 1, "id": bench_id, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "config": asdict(cfg), "input": input_desc, "input_sha256": input_sha,
           "prompts": len(b.recs),
           "categories": sorted(set(b.cats.values())) if b.has_cats else [],
           "model": str(b.model_dir), "model_fingerprint": model_fingerprint(b.model_dir),
           "device": str(dev), "dtype": str(model.dtype).replace("torch.", ""), "env": _env(dev),
           "attention": model.attention,   # (config's auto as resolved on this machine)
           "launches": on_cuda(model),   # (an ar step's kernels at batch 1)
           "peak_memory_kind": "cuda_max_allocated" if dev.type == "cuda"
           else "process_rss_high_water", "reference": reference,
           "skipped": b.skipped, "rows": rows, "category_rows": cat_rows, "ok": ok}
    manifest = make_manifest("bench", bench_id, input=input_desc, input_sha256=input_sha,
                             model=str(b.model_dir), model_fingerprint=res["model_fingerprint"],
                             config=asdict(cfg), device=res["device"], ok=ok)
    with b.store.building("benches", bench_id, manifest) as d:
        atomic_write_json(d / "results.json", res)
        atomic_write_text(d / "table.md", markdown([res]))
    res["path"] = str(b.store.path("benches", bench_id))
    return res
