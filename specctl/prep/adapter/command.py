"""The `train-adapter` job: conversations -> features -> adapter -> store.

Before the long work starts the job says how long the whole command will take: it encodes the
conversations (a sample first when there are many; the rest are priced by their length in
characters), times the work on the longest one (cost.calibrate), plans the exit-layer
sweep within its time budget, and sums the phases (cost.estimate_phases). The estimate
is refined as the phases run (eta.Eta) and shown on the progress bars. Training on a CPU, the
conversations and their length are capped unless given (train.with_device_defaults), and
the estimate is of the capped run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.conversations import read_conversations
from specctl.io.sharegpt import download_sharegpt_json
from specctl.models.checkpoint import load_tokenizer, resolve_model
from specctl.models.fingerprint import model_fingerprint
from specctl.engine.loader import load_config, load_model, resolve_device
from specctl.prep.adapter.cost import (Costs, calibrate, estimate_phases, sweep_cost,
                                       training_cost)
from specctl.prep.adapter.features import cached_features, features_cached, sweep_features
from specctl.prep.adapter.fit import fit, mark_saved, train_dtype
from specctl.prep.adapter.sweep import (SweepPlan, exit_layer_candidates, plan_sweep,
                                        sweep_config, sweep_exit_layer, sweep_sets)
from specctl.prep.adapter.eta import Eta, duration, poly
from specctl.prep.adapter.train import (Prepared, TrainConfig, encode, prepare_data, save_adapter,
                                        split, with_device_defaults)
from specctl.reporting import Reporter, Task, reporter
from specctl.runtime.control.steptables import step_table_for, step_table_path, step_table_seconds
from specctl.store import Store, atomic_write_json

ENCODE_SAMPLE = 32     # conversations encoded before anything is priced
ENCODE_EARLY_S = 5.0   # when the rest would take longer to encode, the estimate comes first
SWEEP_SHARE = 0.25     # the sweep's default time budget: this share of the rest of the command
SWEEP_MIN_S = 60.0     # ... and at least this


def run_train_adapter(cfg: TrainConfig, store: Store, resume: bool,
                      report: Reporter | None = None, started: float | None = None,
                      estimate_only: bool = False) -> dict:
    """started: time.monotonic() when the command began (default: now), for its estimate. A
    max_len or limit left None takes the training device's default (with_device_defaults).
    estimate_only: stop once the estimate is said (returns {'path': None, 'estimate_s': ...})."""
    report = reporter(report)
    log = report.log
    eta = Eta(started)
    model_dir = resolve_model(cfg.model, store, log=log)
    layers = load_config(model_dir)[0].num_layers
    if not cfg.exit_layer < layers:   # before the data is read (fit() checks it again)
        raise SpecctlError(f"--exit-layer must be in [1, {layers - 1}]")
    if cfg.sweep_layers and max(cfg.sweep_layers) >= layers:
        raise SpecctlError(f"--sweep-layers must be in [1, {layers - 1}]")
    tok = load_tokenizer(model_dir)
    cfg, note = with_device_defaults(cfg, resolve_device(cfg.device).type == "cpu")
    if note:
        log(note)
    source = cfg.data or download_sharegpt_json(store.root / "data", log)
    convs, read = read_conversations(source, strict=cfg.strict, limit=cfg.limit, log=log)
    log(f"{source}: {read.summary()}")
    model = load_model(model_dir, cfg.device, "fp32" if cfg.device in ("cpu", "auto") and
                       not _cuda() else "bf16")
    fp = model_fingerprint(model_dir)
    work = store.root / "work" / f"train-{fp}"
    # (one training a checkpoint folder: store rm work/NAME refuses it while held)
    held = store.hold_work(work, "train-adapter for this model")
    try:
        job = _Job(cfg, store, model, fp, work, resume, report, eta)
        prep = job.prepare(tok, convs, estimate_only)
        if prep is None:   # (a work folder it made and left empty is not a killed run's)
            if job.work.is_dir() and not any(p.name != ".lock" for p in job.work.iterdir()):
                shutil.rmtree(job.work)
            return {"path": None, "estimate_s": round(job.first, 1)}
        l, sweep, have = job.exit_layer(prep)
        adapter, summary = job.train(prep, replace(cfg, exit_layer=l), have)
        summary["data"] = {"source": str(source), "read": read.summary()}
        if sweep is not None:
            summary["exit_layer_sweep"] = sweep
        before = _stored_before(store, summary)
        if before is not None:
            log(f"this training (the same data and settings) finished before: its adapter is "
                f"adapters/{before.name}; nothing stored again")
            return {"path": before, "summary": summary, "reused": True}
        eta.begin("saving")
        path = save_adapter(store, model, adapter, fp, summary)
        mark_saved(job.work / f"ckpt-l{l}.safetensors", path.name)
        eta.end("saving")
        log(f"trained on {summary['train']} conversations ({summary['steps']} steps, "
            f"{summary['train_time_s']} s); held-out top-1 agreement {summary['heldout_top1']:.4f}")
        best = store.best_for_model("adapters", fp, "heldout_top1")
        if best is not None and best.path != path:
            log(f"kept beside the model's other adapters; generate picks adapters/{best.id} "
                f"(the best held-out top-1); pass --adapter {path.name} to use this one")
        log(f"train-adapter took {duration(eta.elapsed())} (estimated at the start: "
            f"{duration(job.first)})")
        return {"path": path, "summary": summary}
    finally:
        held.close()


class _Job:
    """One train-adapter run's state between its phases, and its time estimate."""

    def __init__(self, cfg: TrainConfig, store: Store, model, fp: str, work: Path, resume: bool,
                 report: Reporter, eta: Eta):
        from specctl.speculative.kangaroo import Adapter
        self.cfg, self.store, self.model, self.fp, self.work = cfg, store, model, fp, work
        self.resume, self.report, self.log, self.eta = resume, report, report.log, eta
        work.mkdir(parents=True, exist_ok=True)
        self.hidden = model.cfg.hidden_size
        self.adapter_bytes = sum(4 * t.numel() for t in Adapter.init_from_model(model, 1).w.values())
        self.costs: Costs | None = None
        self.first = 0.0              # the first estimate of the whole command, seconds
        self.plan: SweepPlan | None = None
        self.reused: dict | None = None   # the interrupted run's sweep (--resume)

    # -- encoding, timing, the estimate -------------------------------------------------------

    def prepare(self, tok, convs, estimate_only: bool = False) -> Prepared | None:
        """Encode the conversations and announce the estimate (before encoding them all when
        that alone would take a while); None after the estimate when that is all asked for."""
        cfg = self.cfg
        n = min(len(convs), ENCODE_SAMPLE)
        t = time.perf_counter()
        encs = [encode(tok, c.messages, cfg.max_len) for c in convs[:n]]
        per_char = (time.perf_counter() - t) / max(sum(_chars(c) for c in convs[:n]), 1)
        rest = convs[n:]
        rest_s = per_char * sum(_chars(c) for c in rest)
        got = [(e, _chars(c)) for e, c in zip(encs, convs) if e is not None]
        if rest_s <= ENCODE_EARLY_S or not got:
            prep = prepare_data(tok, convs, cfg, encs)
            self._say_dropped(prep)
            self._calibrate(prep.data)
            self._announce(prep.lens, prep.train, prep.held, prep.key)
            return None if estimate_only else prep
        # many conversations: price the rest by their characters at the sample's tokens per
        # character (conversations cut at max_len left out of that ratio)
        whole = [(len(e[0]), ch) for e, ch in got if len(e[0]) < cfg.max_len] or \
            [(len(e[0]), ch) for e, ch in got]
        ratio = sum(t for t, _ in whole) / max(sum(ch for _, ch in whole), 1)
        lens = [len(e[0]) for e, _ in got] + [min(cfg.max_len, max(1, round(_chars(c) * ratio)))
                                              for c in rest]
        self._calibrate([e for e, _ in got])
        self.eta.add("encoding", rest_s)
        held, train_idx = split(len(lens), cfg)
        self._announce(lens, train_idx, held, None)
        if estimate_only:
            return None
        self.eta.begin("encoding")
        task = self.report.task("encode", len(rest))

        def on_item(c) -> None:
            self.eta.advance("encoding", per_char * _chars(c))
            task.update(advance=1, info=self._info())
        try:
            prep = prepare_data(tok, convs, cfg, encs, on_item)
        finally:
            task.close()
        self.eta.end("encoding")
        self._say_dropped(prep)
        self._announce(prep.lens, prep.train, prep.held, prep.key, again=True)
        return prep

    def _say_dropped(self, prep: Prepared) -> None:
        if prep.dropped:   # (a first prompt longer than --max-len leaves nothing to learn)
            self.log(f"{prep.dropped} of {prep.dropped + len(prep.data)} conversations left out: "
                     f"no assistant token within --max-len {self.cfg.max_len} tokens")

    def _calibrate(self, data: list) -> None:
        ids, mask = max(data, key=lambda d: len(d[0]))
        share = sum(sum(m) for _, m in data) / max(sum(len(m) for _, m in data), 1)
        self.costs = calibrate(self.model, ids, share, train_dtype(self.cfg, self.model),
                               self.work)

    def _sweep_key(self, key: str) -> str:
        """What the sweep's plan and result depend on: the data and the training settings."""
        keep = {k: v for k, v in asdict(self.cfg).items()
                if k not in ("model", "data", "limit", "strict", "checkpoint_every", "device")}
        return hashlib.sha256((key + json.dumps(keep, sort_keys=True)).encode()).hexdigest()[:16]

    def _reused_sweep(self, key: str | None) -> dict | None:
        f = self.work / "sweep.json"
        if not (self.resume and key and f.exists()):
            return None
        got = json.loads(f.read_text())
        return got if got.get("key") == self._sweep_key(key) else None

    def _layer_known(self) -> int | None:
        if self.cfg.exit_layer:
            return self.cfg.exit_layer
        if self.reused and self.reused.get("layer"):
            return int(self.reused["layer"])
        return None

    def _phases(self, lens, train_idx, held, key, plan, layer) -> dict[str, float]:
        """estimate_phases with what this run finds done: the cached features of `layer`, the
        interrupted run's sweep and checkpoint (--resume), the stored step-cost table."""
        cached, step = False, 0
        if key is not None and layer is not None:
            cached = features_cached(self.work, layer, len(lens), key)
            ck = self.work / f"ckpt-l{layer}.json"
            if self.resume and ck.exists():
                step = int(json.loads(ck.read_text())["step"])
        profile_s = 0.0
        if plan is not None and not (self.reused and self.reused.get("table")) and \
                not step_table_path(self.store, self.fp, self.model, 1).exists():
            # a step of n tokens at batch 1 costs about a target forward over n tokens
            profile_s = step_table_seconds(1, lambda b, n: poly(self.costs.feature, n))
        return estimate_phases(self.costs, lens, train_idx, held, self.cfg, hidden=self.hidden,
                               adapter_bytes=self.adapter_bytes, sweep=plan,
                               sweep_done=bool(self.reused and self.reused.get("table")),
                               profile_s=profile_s, features_cached=cached, step=step)

    def _announce(self, lens, train_idx, held, key, again: bool = False) -> None:
        """Plan the sweep, price every phase, say how long the whole command will take."""
        cfg, log, eta = self.cfg, self.log, self.eta
        self.reused = self._reused_sweep(key)
        note = ""
        if cfg.exit_layer:
            self.plan = None
        elif self.reused is not None:
            self.plan = SweepPlan(**{**self.reused["plan"], "layers": tuple(
                self.reused["plan"]["layers"])}) if self.reused.get("plan") else None
            note = "the interrupted run's exit-layer sweep plan, reused"
        else:
            self.plan, note = self._plan_sweep(lens, train_idx, held)
        phases = self._phases(lens, train_idx, held, key, self.plan, self._layer_known())
        for name in [n for n in eta.phases if not eta.phases[n].finished]:
            if name != "encoding":
                eta.drop(name)
        for name, seconds in _merged(phases).items():
            eta.add(name, seconds)
        if not again:
            self.first = eta.total()
            log(f"estimated time for the whole command: {eta.summary()}")
            T = max(lens)
            c = self.costs
            log(f"timed on this machine at {T} tokens: target forward {poly(c.feature, T):.2f} s, "
                f"adapter training {poly(c.train, T):.2f} s per conversation")
        else:
            log(f"with every conversation encoded, the estimate is {eta.summary()}")
        if note:
            log(note)

    def _plan_sweep(self, lens, train_idx, held) -> tuple[SweepPlan | None, str]:
        """The exit-layer sweep that fits its time budget, and what to say about it."""
        cfg, L = self.cfg, self.model.cfg.num_layers
        layers = tuple(cfg.sweep_layers or exit_layer_candidates(L))
        main = sum(self._phases(lens, train_idx, held, None, None, None).values())
        budget = cfg.sweep_budget if cfg.sweep_budget is not None else max(SWEEP_MIN_S,
                                                                            SWEEP_SHARE * main)
        n_max = min(cfg.sweep_conversations, len(train_idx))

        def cost(ls, n, epochs):
            return sweep_cost(self.costs, lens, train_idx, held, cfg, SweepPlan(ls, n, epochs),
                              self.hidden, with_features=False)
        plan = plan_sweep(layers, cfg.sweep_layers is not None, n_max, budget, cost)
        full = SweepPlan(layers, n_max, 2)
        why = (f"its time budget is {duration(budget)} (" + ("--sweep-budget" if cfg.sweep_budget
               is not None else "a quarter of the rest of the command; --sweep-budget sets it")
               + f"); the default sweep (layers {_layers(full.layers)} on {n_max} conversations "
               f"for 2 epochs) would add {duration(cost(full.layers, n_max, 2))}")
        if plan is None:
            return None, (f"no exit-layer sweep: {why}, and the smallest one does not fit; "
                          f"taking layer {min(2, L - 1)} (as --no-sweep does)")
        S, H = sweep_sets(train_idx, held, plan)
        what = (f"exit-layer sweep: layers {_layers(plan.layers)}, each trained on {len(S)} "
                f"conversations for {plan.epochs} epoch{'s' * (plan.epochs > 1)} and evaluated "
                f"on {len(H)} held-out ones")
        if plan == full:
            return plan, what
        return plan, f"{what} (scaled down: {why}; --sweep-layers or --no-sweep choose yourself)"

    def _info(self) -> str:
        return (f"whole command ~{duration(self.eta.total())}, "
                f"{duration(self.eta.remaining())} left")

    def _refined(self, what: str) -> None:
        self.log(f"{what}; whole command now estimated at {duration(self.eta.total())} "
                 f"({duration(self.eta.remaining())} left)")

    # -- the phases ---------------------------------------------------------------------------

    def exit_layer(self, prep: Prepared) -> tuple[int, list | None, dict | None]:
        """The exit layer (given, swept or the default), the sweep's table, and the sweep's
        features for the main run to reuse."""
        cfg, L, log, eta = self.cfg, self.model.cfg.num_layers, self.log, self.eta
        if cfg.exit_layer:
            return cfg.exit_layer, None, None
        plan = self.plan
        if plan is None:
            return min(2, L - 1), None, None
        S, H = sweep_sets(prep.train, prep.held, plan)
        ids = sorted(set(S) | set(H))
        lens, c = prep.lens, self.costs
        if self.reused and self.reused.get("table"):
            l = int(self.reused["layer"])
            log(f"exit layer {l}: the interrupted run's sweep, reused")
            have = None
            if not features_cached(self.work, l, len(lens), prep.key):
                have = sweep_features(self.model, prep, ids, plan.layers, self.work, log)
            return l, self.reused["table"], have
        state = self.work / "sweep.json"
        atomic_write_json(state, {"key": self._sweep_key(prep.key), "plan": asdict(plan),
                                  "table": None, "layer": None})
        eta.begin("profile")
        prices = step_table_for(self.model, 1, store=self.store, fingerprint=self.fp, log=log)
        eta.end("profile")
        eta.begin("exit-layer sweep")
        steps = len(plan.layers) * training_cost(
            c, lens, S, H, sweep_config(cfg, plan.layers[0], plan.epochs))[2]
        task = self.report.task("exit-layer sweep", len(ids) + steps)

        def on_feature(i: int) -> None:
            eta.advance("exit-layer sweep", poly(c.feature, lens[i]))
            task.update(advance=1, info=self._info())

        def on_step(rec: dict) -> None:
            eta.advance("exit-layer sweep", c.train_s([lens[i] for i in rec["batch"]]) + c.step)
            task.update(advance=1, info=self._info())

        def on_heldout(held: list[int]) -> None:
            eta.advance("exit-layer sweep", c.heldout_s([lens[i] for i in held]))
        try:
            log(f"computing the target's states at layers {_layers(plan.layers)} for "
                f"{len(ids)} conversations ...")
            have = sweep_features(self.model, prep, ids, plan.layers, self.work, log,
                                  on_feature)
            l, table = sweep_exit_layer(self.model, prep, plan, cfg, have, prices, log,
                                        on_step, on_heldout)
        finally:
            task.close()
        eta.end("exit-layer sweep")
        atomic_write_json(state, {"key": self._sweep_key(prep.key), "plan": asdict(plan),
                                  "table": table, "layer": l})
        self._refined(f"exit layer {l} chosen")
        return l, table, have

    def train(self, prep: Prepared, cfg: TrainConfig, have: dict | None):
        """The main run's features (the sweep's reused) and training with held-out agreement."""
        eta, log, lens, c, l = self.eta, self.log, prep.lens, self.costs, cfg.exit_layer
        plan = self.plan if not self.cfg.exit_layer else None
        phases = _merged(self._phases(lens, prep.train, prep.held, prep.key, plan, l))
        for name in ("features", "training"):   # re-priced now that the layer is known
            if name in phases:
                eta.add(name, phases[name])
            else:
                eta.drop(name)
        eta.begin("features")
        todo = 0 if "features" not in phases else len(lens) - len(have or ())
        task = self.report.task("features", todo) if todo else Task()

        def on_feature(i: int) -> None:
            eta.advance("features", poly(c.feature, lens[i]))
            task.update(advance=1, info=self._info())
        try:
            feats = cached_features(self.model, prep, l, self.work, log, have, on_feature)
        finally:
            task.close()
        eta.end("features")
        del have
        self._refined("target features ready")
        eta.begin("training")
        task = self.report.task("train-adapter", None, info="loss - - tok/s")

        def on_step(rec: dict) -> None:
            eta.advance("training", c.train_s([lens[i] for i in rec["batch"]]) + c.step)
            task.update(total=rec["total"], completed=rec["step"],
                        info=f"loss {rec['loss']:.4f} {rec['tokens_per_s']} tok/s, "
                             + self._info())

        def on_heldout(held: list[int]) -> None:
            eta.advance("training", c.heldout_s([lens[i] for i in held]))
        try:
            out = fit(self.model, prep, feats, cfg, self.work / f"ckpt-l{l}.safetensors",
                      self.resume, on_step, log, on_heldout=on_heldout)
        finally:
            task.close()
        eta.end("training")
        return out


def _stored_before(store: Store, summary: dict) -> Path | None:
    """The adapter a finished training's checkpoint was stored as (fit's saved_before), where
    the store still holds it as this training's: its log's settings and steps are these (an
    id removed and taken again by another training's adapter is not it)."""
    ident = summary.pop("saved_before", None)
    if ident is None:
        return None
    try:
        log = json.loads((store.path("adapters", ident) / "train_log.json").read_text())
    except (OSError, ValueError):
        return None
    same = isinstance(log, dict) and log.get("config") == json.loads(json.dumps(
        summary["config"])) and \
        log.get("steps") == summary["steps"] and log.get("train") == summary["train"]
    return store.path("adapters", ident) if same else None


def _merged(phases: dict[str, float]) -> dict[str, float]:
    """The job's phases as they run: held-out evaluation happens inside training."""
    out = {("exit-layer sweep" if k == "sweep" else k): v for k, v in phases.items()
           if k != "held-out"}
    if "training" in out:
        out["training"] += phases.get("held-out", 0.0)
    return out


def _chars(conv) -> int:
    return sum(len(m["content"]) for m in conv.messages)


def _layers(layers) -> str:
    return ", ".join(str(x) for x in layers)


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()
