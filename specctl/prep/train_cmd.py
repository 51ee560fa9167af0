"""The `train-adapter` job: conversations -> features -> adapter -> store."""

from __future__ import annotations

from dataclasses import replace

from specctl.errors import SpecctlError
from specctl.io.conversations import read_conversations
from specctl.io.sharegpt import download_sharegpt_json
from specctl.models.checkpoint import load_tokenizer, resolve_model
from specctl.models.fingerprint import model_fingerprint
from specctl.models.loader import load_config, load_model
from specctl.prep.train_adapter import TrainConfig, save_adapter, sweep_exit_layer, train
from specctl.reporting import Reporter, reporter
from specctl.store import Store


def run_train_adapter(cfg: TrainConfig, store: Store, resume: bool,
                      report: Reporter | None = None) -> dict:
    report = reporter(report)
    log = report.log
    model_dir = resolve_model(cfg.model, store, log=log)
    layers = load_config(model_dir)[0].num_layers
    if not cfg.exit_layer < layers:   # before the data is read (train() checks it again)
        raise SpecctlError(f"--exit-layer must be in [1, {layers - 1}]")
    tok = load_tokenizer(model_dir)
    source = cfg.data or download_sharegpt_json(store.root / "data", log)
    convs, read = read_conversations(source, strict=cfg.strict, limit=cfg.limit, log=log)
    log(f"{source}: {read.summary()}")
    model = load_model(model_dir, cfg.device, "fp32" if cfg.device in ("cpu", "auto") and
                       not _cuda() else "bf16")
    fp = model_fingerprint(model_dir)
    work = store.root / "work" / f"train-{fp}"
    sweep = None
    if cfg.exit_layer == 0:
        from specctl.prep.skipsets import load_profile
        log(f"--exit-layer auto: a short adapter per candidate layer on "
            f"{min(len(convs), cfg.sweep_conversations)} conversations ...")
        l, sweep = sweep_exit_layer(model, tok, convs, cfg, work, load_profile(store, model, fp,
                                                                                log), log)
        log(f"exit layer {l} chosen")
        cfg = replace(cfg, exit_layer=l)
    task = report.task("train-adapter", None, info="loss - - tok/s")

    def on_step(rec: dict) -> None:
        task.update(total=rec["total"], completed=rec["step"],
                    info=f"loss {rec['loss']:.4f} {rec['tokens_per_s']} tok/s")
    try:
        adapter, summary = train(model, tok, convs, cfg, work, resume, on_step, log)
    finally:
        task.close()
    summary["data"] = {"source": str(source), "read": read.summary()}
    if sweep is not None:
        summary["exit_layer_sweep"] = sweep
    path = save_adapter(store, model, adapter, fp, summary)
    log(f"trained on {summary['train']} conversations ({summary['steps']} steps, "
        f"{summary['train_time_s']} s); held-out top-1 agreement {summary['heldout_top1']:.4f}")
    best = store.best_for_model("adapters", fp, "heldout_top1")
    if best is not None and best.path != path:
        log(f"kept beside the model's other adapters; generate picks adapters/{best.id} (the best "
            f"held-out top-1); pass --adapter {path.name} to use this one")
    return {"path": path, "summary": summary}


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()
