"""Training the adapter on cached target states (fit), with checkpoints that a resumed run
continues from exactly.

    loss = sum over positions predicting an assistant token of
           CE( softmax(lm_head(norm(h_L))) , log_softmax(lm_head(adapter(h_l))) )  / count

AdamW (betas 0.9/0.95), linear warm-up, gradient clipping; batches are packed up to
`batch_tokens` tokens in a seeded order per epoch. A held-out share of the conversations reports
top-1 agreement with the target on the same positions: the acceptance proxy. Checkpoints
(adapter, optimizer state, step) are written atomically every `checkpoint_every` steps;
`resume` picks up at the next step with the same data order, so a resumed run ends where an
uninterrupted one does.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from specctl.errors import SpecctlError
from specctl.prep.adapter.train import Prepared, TrainConfig
from specctl.reporting import quiet
from specctl.speculative.kangaroo import Adapter
from specctl.store import atomic_write_json


def train_dtype(cfg: TrainConfig, model) -> torch.dtype | None:
    """The autocast dtype of training (None = plain fp32)."""
    if cfg.dtype == "bf16" or (cfg.dtype == "auto" and model.device.type == "cuda"):
        return torch.bfloat16
    return None


def trainable_adapter(model, l: int) -> Adapter:
    """A fresh adapter at exit layer l with fp32 master weights (whatever the compute dtype) on
    the model's device, ready for the optimizer."""
    adapter = Adapter.init_from_model(model, l)
    for k in adapter.w:
        adapter.w[k] = adapter.w[k].to(model.device, torch.float32).requires_grad_(True)
    return adapter


def new_optimizer(adapter: Adapter, lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(adapter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def loss_and_agreement(model, adapter: Adapter, h_l, h_L, mask,
                       amp: torch.dtype | None = None) -> tuple[torch.Tensor, int, int]:
    """(the loss over the masked positions, how many of them agree on top-1, how many there
    are). amp: compute the adapter's forward in this dtype (autocast; the weights and the
    optimizer stay fp32), e.g. bf16 on a GPU."""
    dev = model.device
    h_l, h_L, mask = h_l.to(dev).float(), h_L.to(dev).float(), mask.to(dev)
    with torch.no_grad():
        # clone: the engine runs in inference mode, and p is saved for the backward pass
        p = torch.softmax(model.logits(h_L.to(model.dtype))[mask], -1).float().clone()
    with torch.autocast(dev.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        logits = adapter.train_logits(h_l)
    logq = torch.log_softmax(logits.float()[mask], -1)
    loss = -(p * logq).sum(-1).mean()
    agree = int((logq.argmax(-1) == p.argmax(-1)).sum())
    return loss, agree, int(mask.sum())


def _settings(cfg: TrainConfig, data_key: str, train_idx: list[int]) -> str:
    """What a checkpoint's steps depend on: the training settings and the data trained on (the
    encoded conversations' key and the training ids; not the path or --limit that led to
    them), as a key. Not --epochs: more of them continue the same steps (the warm-up, 3% of
    them, aside)."""
    keep = {k: v for k, v in asdict(cfg).items()
            if k not in ("model", "data", "limit", "device", "strict", "checkpoint_every",
                         "epochs")}
    keep["data"], keep["train"] = data_key, list(train_idx)
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()


def _save_ckpt(path: Path, adapter: Adapter, opt, step: int, log: list,
               settings: str = "") -> None:
    tensors = {f"adapter.{k}": v.detach().contiguous() for k, v in adapter.w.items()}
    for i, p in enumerate(adapter.parameters()):
        st = opt.state.get(p, {})
        for name in ("exp_avg", "exp_avg_sq"):
            if name in st:
                tensors[f"opt.{i}.{name}"] = st[name].contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    atomic_write_json(path.with_suffix(".json"), {"step": step, "log": log,
                                                  "settings": settings})


def mark_saved(ckpt: Path, ident: str) -> None:
    """The checkpoint's training finished and was stored as adapters/<ident>: a --resume of it
    says so rather than storing the same weights again (fit's summary, saved_before)."""
    meta = ckpt.with_suffix(".json")
    if meta.is_file():
        atomic_write_json(meta, {**json.loads(meta.read_text()), "saved": ident})


def _load_ckpt(path: Path, adapter: Adapter, opt) -> tuple[int, list]:
    t = load_file(str(path))   # safetensors: no code can run from a checkpoint
    meta = json.loads(path.with_suffix(".json").read_text())
    with torch.no_grad():
        for k in adapter.w:
            adapter.w[k].copy_(t[f"adapter.{k}"])
    for i, p in enumerate(adapter.parameters()):
        if f"opt.{i}.exp_avg" in t:
            opt.state[p] = {"step": torch.tensor(float(meta["step"])),
                            "exp_avg": t[f"opt.{i}.exp_avg"], "exp_avg_sq": t[f"opt.{i}.exp_avg_sq"]}
    return int(meta["step"]), list(meta["log"])


def batches(lens: list[int], train_idx: list[int], cfg: TrainConfig,
            epoch: int) -> list[list[int]]:
    """One epoch's batches of training ids, shuffled by epoch, up to cfg.batch_tokens tokens
    (lens[i]: conversation i's length)."""
    idx = list(train_idx)
    random.Random(cfg.seed * 1000 + epoch).shuffle(idx)
    out, cur, n = [], [], 0
    for i in idx:
        t = lens[i]
        if cur and n + t > cfg.batch_tokens:
            out.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += t
    return out + ([cur] if cur else [])


def fit(model, prep: Prepared, feats, cfg: TrainConfig, ckpt: Path | None, resume: bool,
        on_step: Callable[[dict], None] | None = None, log=quiet, *,
        train_idx: list[int] | None = None, held: list[int] | None = None,
        on_heldout: Callable[[list[int]], None] | None = None,
        heldout_each_epoch: bool = True) -> tuple[Adapter, dict]:
    """Train an adapter at cfg.exit_layer on feats[i] = (h_l, h_L) of the training ids
    (default: the split's); held-out agreement after every epoch (or the last only). on_step
    gets each step's record with its "batch" (ids); on_heldout the ids just evaluated.
    Checkpoints go to `ckpt` (None: none). Returns the adapter and the run's summary."""
    run = _Fit(model, prep, feats, cfg, prep.train if train_idx is None else train_idx,
               prep.held if held is None else held, log)
    if resume and ckpt is not None and ckpt.exists():
        meta = json.loads(ckpt.with_suffix(".json").read_text())
        if meta.get("settings") == run.settings:
            run.step, run.train_log = _load_ckpt(ckpt, run.adapter, run.opt)
            run.resumed, run.saved = run.step, meta.get("saved")
            log(f"resuming at step {run.step} of {run.total}")
        else:   # (its steps were other settings' or data's: continuing would mix them)
            log("--resume: the checkpoint was made with other settings or data: training "
                "starts over")
    elif resume and ckpt is not None:
        log("--resume: no checkpoint to resume from: training starts at step 0")
    run.t0 = time.perf_counter()
    for epoch in range(cfg.epochs):
        run.epoch(epoch, ckpt, on_step)
        if heldout_each_epoch or epoch == cfg.epochs - 1:
            run.heldout(epoch, on_heldout)
    return run.finish()


class _Fit:
    """One fit()'s adapter, optimizer and progress (the step reached, the log)."""

    def __init__(self, model, prep: Prepared, feats, cfg: TrainConfig, train_idx: list[int],
                 held: list[int], log):
        l = cfg.exit_layer
        if not 1 <= l < model.cfg.num_layers:
            raise SpecctlError(f"--exit-layer must be in [1, {model.cfg.num_layers - 1}]")
        self.model, self.prep, self.feats, self.cfg, self.log = model, prep, feats, cfg, log
        self.train_idx, self.held, self.lens = train_idx, held, prep.lens
        self.masks = {i: torch.tensor(prep.data[i][1]) for i in (*train_idx, *held)}
        self.amp = train_dtype(cfg, model)
        if self.amp is not None:
            log(f"training in {str(self.amp).replace('torch.', '')} autocast (fp32 weights and "
                "optimizer)")
        self.adapter = trainable_adapter(model, l)
        self.opt = new_optimizer(self.adapter, cfg.lr)
        self.per_epoch = len(batches(self.lens, train_idx, cfg, 0))
        self.total = self.per_epoch * cfg.epochs
        self.warm = max(1, int(self.total * cfg.warmup))
        self.step, self.train_log = 0, []
        self.resumed, self.saved = 0, None   # (a checkpoint's step, and the adapter it made)
        self.t0, self.tokens, self.top1 = time.perf_counter(), 0, 0.0
        self.settings = _settings(cfg, prep.key, train_idx)

    def epoch(self, epoch: int, ckpt: Path | None, on_step) -> None:
        """The epoch's steps from self.step on, checkpointed."""
        cfg = self.cfg
        for bi, batch in enumerate(batches(self.lens, self.train_idx, cfg, epoch)):
            s = epoch * self.per_epoch + bi
            if s < self.step:
                continue
            loss, lr = self._optimize(batch, s)
            self.step = s + 1
            rec = {"step": self.step, "epoch": epoch, "loss": round(loss, 5), "lr": lr,
                   "tokens_per_s": round(self.tokens / (time.perf_counter() - self.t0), 1)}
            if on_step:
                on_step({**rec, "total": self.total, "batch": batch})
            if ckpt is not None and (self.step % cfg.checkpoint_every == 0
                                     or self.step == self.total):
                self.train_log.append(rec)
                _save_ckpt(ckpt, self.adapter, self.opt, self.step, self.train_log,
                           self.settings)

    def _optimize(self, batch: list[int], s: int) -> tuple[float, float]:
        """Optimizer step s on one batch; (its loss, its learning rate)."""
        cfg, masks = self.cfg, self.masks
        self.opt.zero_grad()
        n_pos = sum(int(masks[i].sum()) for i in batch)
        loss_sum = 0.0
        for i in batch:
            loss, _, n = loss_and_agreement(self.model, self.adapter, *self.feats[i], masks[i],
                                            self.amp)
            (loss * n / n_pos).backward()
            loss_sum += loss.item() * n / n_pos
            self.tokens += self.lens[i]
        torch.nn.utils.clip_grad_norm_(self.adapter.parameters(), cfg.clip)
        lr = cfg.lr * min(1.0, (s + 1) / self.warm)   # linear warm-up, then constant
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        return loss_sum, lr

    def heldout(self, epoch: int, on_heldout) -> None:
        """Top-1 agreement with the target on the held-out ids, logged."""
        agree, count = 0, 0
        with torch.no_grad():
            for i in self.held:
                _, a, n = loss_and_agreement(self.model, self.adapter, *self.feats[i],
                                             self.masks[i], self.amp)
                agree, count = agree + a, count + n
        self.top1 = agree / max(count, 1)
        if on_heldout:
            on_heldout(self.held)
        self.train_log.append({"epoch": epoch, "heldout_top1": round(self.top1, 4),
                               "step": self.step})
        self.log(f"epoch {epoch + 1}/{self.cfg.epochs}: held-out top-1 agreement "
                 f"{self.top1:.4f}")

    def finish(self) -> tuple[Adapter, dict]:
        for k in self.adapter.w:
            self.adapter.w[k] = self.adapter.w[k].detach()
        summary = {"conversations": len(self.prep.data), "train": len(self.train_idx),
                   "heldout": len(self.held), "steps": self.step,
                   "heldout_top1": round(self.top1, 4),
                   "train_time_s": round(time.perf_counter() - self.t0, 1),
                   "log": self.train_log, "config": asdict(self.cfg)}
        if self.saved is not None and self.resumed == self.step == self.total:
            summary["saved_before"] = self.saved   # (finished, and nothing trained now)
        return self.adapter, summary
