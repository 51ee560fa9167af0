"""The `search-skip` job: dev prompts -> dev set (teacher-forced or decoded) -> Bayesian search
-> (model objective: the best sets decoded for real) -> skip-set artifact."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.prompts import read_prompts
from specctl.models.checkpoint import resolve_model
from specctl.models.fingerprint import model_fingerprint
from specctl.engine.loader import load_model
from specctl.engine.steptable import ENGINE_COSTS, StepTable
from specctl.prep.skip.search import confirm, plot_search, run_search
from specctl.prep.skip.evaluate import DevSet, ar_per_token
from specctl.prep.skip.skipsets import save_skipset, work_dir
from specctl.reporting import Reporter, reporter
from specctl.runtime.jobs.artifacts import describe_skip_set
from specctl.runtime.control.steptables import step_table_for, step_table_id
from specctl.runtime.jobs.tokenization import Tokenization
from specctl.runtime.step.sequence import Request
from specctl.speculative.draft_verify import SkipSet
from specctl.store import Store, remove_dir


OBJECTIVES = ("model", "decode", "wall")
CONFIRM_TOP = 5   # model objective: the best sets decoded for real before one is saved


@dataclass(frozen=True)
class SearchConfig:
    model: str | None = None
    dev: str | None = None
    iters: int = 1000
    init_points: int = 0
    objective: str = "model"
    prompts: int = 8
    max_new: int = 32
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise SpecctlError(f"--objective must be one of {', '.join(OBJECTIVES)}, got "
                               f"{self.objective!r}")
        if self.iters < 1 or self.prompts < 1 or self.max_new < 2 or self.init_points < 0:
            raise SpecctlError("--iters and --prompts must be >= 1, --max-new >= 2, "
                               "--init-points >= 0")


def dev_prompts(cfg: SearchConfig, store: Store, tk: Tokenization, log) -> list[list[int]]:
    if cfg.dev:
        recs = [r for r in read_prompts(cfg.dev) if r.turns][:cfg.prompts]
        reqs = [Request(r.index, [list(r.turns[0])], cfg.max_new, r.raw_prompt) for r in recs]
    else:
        from specctl.io.sharegpt import first_human_turns
        texts = first_human_turns(cfg.prompts, store, log=log)
        reqs = [Request(i, [[{"role": "user", "content": t}]], cfg.max_new, t)
                for i, t in enumerate(texts)]
    return [tk.render(r) for r in reqs]


def _dev_set(cfg: SearchConfig, model, prompts: list[list[int]], log):
    if cfg.objective == "model":
        from specctl.prep.skip.tf_probe import TeacherForcedDev
        log(f"decoding {len(prompts)} dev prompts ({sum(map(len, prompts))} prompt tokens) with "
            f"the full model, keeping its states for teacher-forced probes ...")
        return TeacherForcedDev(model, prompts, cfg.max_new)
    log(f"prefilling {len(prompts)} dev prompts ({sum(map(len, prompts))} tokens) ...")
    return DevSet(model, prompts, cfg.max_new)


def _probe(cfg: SearchConfig, dev, table, log_path, resume: bool, settings: dict, L: int,
           report: Reporter) -> tuple[list, KeyboardInterrupt | None]:
    """The search's probes (all of them, or those logged before a Ctrl-C or SIGTERM) and what
    stopped it, if anything."""
    task = report.task("search-skip", cfg.iters)

    def on_probe(p, best):
        task.update(completed=p.iteration + 1, info=(
            f"best: est. speedup {1 / best.relative:.3f}x ar (attn {sum(best.bits[:L])}, "
            f"mlp {sum(best.bits[L:])} skipped, accept {best.accept_rate:.2f})"))
    try:
        return run_search(dev, table, cfg.iters, log_path, resume, cfg.seed, cfg.init_points,
                          on_probe, settings, report.log), None
    except KeyboardInterrupt as e:
        from specctl.prep.skip.search import _read_log
        probes = _read_log(log_path)   # the log is complete up to the interruption
        if not probes:
            raise
        return probes, e
    finally:
        task.close()


def _best(cfg: SearchConfig, model, prompts, table, probes: list, log,
          stop: KeyboardInterrupt | None) -> tuple:
    """The best probe, its numbers and what stopped the search (stop, or a Ctrl-C or SIGTERM
    while the best were decoded); with the model objective the best few are decoded for real
    and the best of those wins, with its decoded numbers, unless the search was stopped: a
    SIGTERM's grace period is short, and that decoding can take minutes, so a stopped search
    keeps its simulated best (the saved set says `interrupted`; --resume decodes them)."""
    best = min(probes, key=lambda p: p.per_token)
    measured: dict = {"seconds_per_token": best.per_token, "relative": best.relative,
                      "accept_rate": best.accept_rate, "mean_accepted": best.mean_accepted}
    if cfg.objective != "model" or stop is not None:
        return best, measured, {}, stop
    log(f"decoding the dev set with the {CONFIRM_TOP} best sets (simulated) for real ...")
    try:
        best, ev, rows = confirm(DevSet(model, prompts, cfg.max_new), table, probes,
                                 CONFIRM_TOP)
    except KeyboardInterrupt as e:
        return best, measured, {}, e
    measured = {"seconds_per_token": ev.per_token, "relative": ev.per_token / ar_per_token(table),
                "accept_rate": round(ev.accept_rate, 4),
                "mean_accepted": round(ev.mean_accepted, 4)}
    return best, measured, {"simulated_relative_time_per_token": best.relative,
                            "confirmed": rows}, None


def _refuse_over(store: Store, ident: str, log_path: Path, force: bool) -> list[str]:
    """A new search would replace an earlier one's log (hours of probes, perhaps) and its
    stored set: only with force (build-cache refuses the same way); what it replaces."""
    have = [f"skipsets/{i}" for i in (ident, f"{ident}-no-gain")
            if store.path("skipsets", i).exists()]
    logged = _logged(log_path)
    if logged:
        have.append(f"a log of {logged} probes ({log_path})")
    if have and not force:
        raise SpecctlError(f"a search of this model and objective was run before: "
                           f"{', '.join(have)}. --resume continues its search; --force starts "
                           "over (its log is replaced now, its stored set when the new search "
                           "ends)")
    return have


def _logged_table(log_path: Path, model) -> StepTable | None:
    """On --resume: the step table the logged probes were priced on (search.json beside the
    log), where it is this model's device, dtype and attention. One measured again (a busy
    CPU's is never kept) would price the rest of the search on other numbers, and the settings
    would never match the log's: every such resume started over."""
    try:
        t = StepTable.from_json(json.loads(log_path.with_name("search.json").read_text())
                                ["step_table"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    here = (model.device.type, str(model.dtype).replace("torch.", ""), model.attention)
    ok = (t.device, t.dtype, t.attention) == here and t.engine == ENGINE_COSTS and \
        t.implausible() is None and t.batches == (1,)
    return t if ok else None


def _logged(log_path: Path) -> int:
    """Probes in a search log (its lines; 0 when there is none)."""
    try:
        with open(log_path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def run_search_skip(cfg: SearchConfig, store: Store, resume: bool,
                    report: Reporter | None = None, force: bool = False) -> dict:
    """force: start over where a search of this model and objective was run before (its log
    and stored set are replaced); resume: continue its log. Neither: refuse there."""
    report = reporter(report)
    log = report.log
    model_dir = resolve_model(cfg.model, store, log=log)
    fp = model_fingerprint(model_dir)
    ident = f"{fp}-{cfg.objective}"
    log_path = work_dir(store, ident) / "probes.jsonl"
    # (one search a log: store rm work/NAME refuses it while held)
    held = store.hold_work(log_path.parent, "search-skip for this model and objective")
    try:
        over = [] if resume else _refuse_over(store, ident, log_path, force)
        tk = Tokenization(model_dir, chat=True)
        model = load_model(model_dir, cfg.device, cfg.dtype)
        prompts = dev_prompts(cfg, store, tk, log)
        ctx = model.cfg.max_position
        if any(len(p) + cfg.max_new + 16 > ctx for p in prompts):
            raise SpecctlError("a dev prompt is too long for the model's context")
        # priced on the batch-1 step-cost table that --speculate auto prices draft-verify with
        table = None if cfg.objective == "wall" else \
            (resume and _logged_table(log_path, model)) or \
            step_table_for(model, 1, store=store, fingerprint=fp, log=log)
        L = model.cfg.num_layers
        dev = _dev_set(cfg, model, prompts, log)
        settings = {"objective": cfg.objective,
                    "prompts": hashlib.sha1(json.dumps(prompts).encode()).hexdigest(),
                    "max_new": cfg.max_new,
                    "step_table": table.to_json() if table is not None else None}
        if over:   # (said once the dev set and settings held: the log goes now)
            log(f"--force: starting over ({', '.join(over)} replaced)")
        t0 = time.perf_counter()
        probes, stop = _probe(cfg, dev, table, log_path, resume, settings, L, report)
        search_s = time.perf_counter() - t0
        best, measured, extra, stop = _best(cfg, model, prompts, table, probes, log, stop)
        interrupted = stop is not None
        skip = SkipSet.from_bits(best.bits)
        plot = log_path.with_name("search.png")
        plotted = plot_search(probes, best, L, plot)
        result = {
            **skip.to_json(), "objective": cfg.objective,
            "seconds_per_token": measured["seconds_per_token"],
            "relative_time_per_token": measured["relative"],
            "speedup_estimate": (round(1.0 / measured["relative"], 4)
                                 if measured["relative"] else 0.0),
            "acceptance_rate": measured["accept_rate"],
            "mean_accepted_tokens": measured["mean_accepted"],
            "iterations": len(probes), "best_iteration": best.iteration,
            "search_time_s": round(search_s, 1), "total_time_s": round(time.perf_counter() - t0, 1),
            "config": asdict(cfg), "interrupted": interrupted,
            # a set no faster than ar is kept (named so), never draft-verify's default
            "pays": bool(measured["relative"]) and 1.0 / measured["relative"] > 1.0,
            # what the estimate was priced with: it does not carry over to another device/dtype
            "profile": {"step_table": step_table_id(fp, model, 1) if table is not None else None,
                        "device": str(model.device),
                        "dtype": str(model.dtype).replace("torch.", ""),
                        "clock": cfg.objective == "wall"}, **extra,
        }
        saved = ident if result["pays"] else f"{ident}-no-gain"
        path = save_skipset(store, saved, result, log_path, plot if plotted else None, fp)
        other = f"{ident}-no-gain" if result["pays"] else ident
        if force and store.path("skipsets", other).exists():   # (replaced, as --force said:
            remove_dir(store.path("skipsets", other), f"skipsets/{other}")   # not the default)
        log(f"best of {len(probes)} probes (#{best.iteration}): {describe_skip_set(skip)}")
        log(f"acceptance rate {result['acceptance_rate']:.3f}, mean accepted tokens "
            f"{result['mean_accepted_tokens']:.2f}, estimated speedup over ar "
            f"{result['speedup_estimate']:.3f}x ({cfg.objective} objective"
            f"{', decoded' if cfg.objective == 'model' else ''}, priced on {model.device} "
            f"{result['profile']['dtype']})")
        if not result["pays"]:
            log(f"warning: no skip set found pays: the best is estimated at "
                f"{result['speedup_estimate']:.3f}x ar, so it is kept as skipsets/{saved} and is "
                "not draft-verify's default (pass --skip-set to use it anyway; more --iters, or "
                "a larger model, may find one)")
        if not plotted:
            log("no plot: install matplotlib (pip install 'specctl[plot]') for search.png")
        if interrupted:
            log("interrupted: the best skip set so far is saved; --resume continues the search")
            if type(stop) is not KeyboardInterrupt:   # (SIGTERM: the CLI exits 143, as said)
                raise stop
        return {"path": path, "result": result}
    finally:
        held.close()
