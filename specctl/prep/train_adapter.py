"""`specctl train-adapter`: train Kangaroo's adapter on conversations (papers/001, authors' code).

The target is frozen. For each conversation (rendered with the model's chat template, at most
max_len tokens) the target's layer-l states h_l and final states h_L are computed once and cached
on disk (safetensors, fp16); training then only runs the adapter:

    loss = sum over positions predicting an assistant token of
           CE( softmax(lm_head(norm(h_L))) , log_softmax(lm_head(adapter(h_l))) )  / count

AdamW (betas 0.9/0.95), linear warm-up, gradient clipping; batches are packed up to
`batch_tokens` tokens. A held-out share of the conversations reports top-1 agreement with the
target on the same positions after every epoch: the acceptance proxy. Checkpoints (adapter,
optimizer state, step) are written atomically every `checkpoint_every` steps; `--resume` picks
up at the next step with the same data order, so a resumed run ends where an uninterrupted one
does. The final adapter goes to the store as adapters/<model>-l<l>/ (adapter.safetensors,
config.json, train_log.json).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from array import array
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.errors import SpecctlError
from specctl.prep.eta import fit_cost, poly
from specctl.reporting import quiet
from specctl.runtime.stepcost import StepCost, padded_steps
from specctl.speculative.kangaroo import Adapter, adapter_config, kangaroo_price
from specctl.store import Store, atomic_write_json, make_manifest


@dataclass(frozen=True)
class TrainConfig:
    model: str | None = None
    data: str | None = None
    exit_layer: int = 0         # 0 = auto: a quick sweep picks it (sweep_exit_layer)
    epochs: int = 1
    lr: float = 5e-5
    max_len: int = 2048
    batch_tokens: int = 4096
    limit: int | None = None
    heldout: float = 0.05
    warmup: float = 0.03
    clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100
    strict: bool = False
    device: str = "auto"
    dtype: str = "auto"         # compute: auto = bf16 autocast on CUDA, fp32 elsewhere
    sweep_conversations: int = 64   # conversations per candidate in the exit-layer sweep
    gamma: int = 6              # drafts per step assumed when the sweep prices a layer
    sweep_layers: tuple[int, ...] | None = None   # the sweep's candidates (None: the default)
    sweep_budget: float | None = None   # seconds the sweep may add (None: a quarter of the rest)

    def __post_init__(self):
        if self.exit_layer < 0:
            raise SpecctlError("--exit-layer must be a layer number >= 1 or 'auto'")
        if self.sweep_layers is not None and (not self.sweep_layers
                                              or min(self.sweep_layers) < 1):
            raise SpecctlError("--sweep-layers must list layer numbers >= 1")
        if self.sweep_budget is not None and self.sweep_budget < 0:
            raise SpecctlError("--sweep-budget must be seconds >= 0")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise SpecctlError("--dtype must be auto, fp32 or bf16")
        if self.epochs < 1 or self.lr <= 0 or self.max_len < 8 or self.batch_tokens < 8:
            raise SpecctlError("--epochs >= 1, --lr > 0, --max-len >= 8, --batch-tokens >= 8")
        if not 0.0 <= self.heldout < 1.0:
            raise SpecctlError("--heldout must be in [0, 1)")


def encode(tok, messages: list[dict], max_len: int) -> tuple[list[int], list[bool]] | None:
    """Token ids of the rendered conversation and, per position t, whether t predicts an
    assistant token (i.e. token t + 1 belongs to an assistant turn). Spans come from rendering
    growing prefixes of the conversation with the same template."""
    def ids(msgs, gen=False):
        text = tok.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
        return tok.encode(text, add_special_tokens=False)
    full = ids(messages)[:max_len]
    target = [False] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = len(ids(messages[:i], gen=True)), len(ids(messages[:i + 1]))
        for t in range(start, min(end, len(full))):
            target[t] = True
    pred = target[1:] + [False]   # position t predicts token t + 1
    return (full, pred) if any(pred) else None


@torch.inference_mode()
def features(model, ids: list[int], l: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_l, h_L) of one sequence, fp16 on the CPU."""
    kv = model.new_kv_cache(1, len(ids))
    b = ForwardBatch([SeqInput(0, ids, 0)], model.device)
    h_L, h_l = model.forward(b, kv, LayerPlan(capture=l))
    return h_l.half().cpu(), h_L.half().cpu()


@torch.inference_mode()
def features_at(model, ids: list[int], layers) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({l: h_l} for every l in layers, h_L) of one sequence from one forward, run in pieces
    that end at the layers asked for; fp16 on the CPU."""
    kv = model.new_kv_cache(1, len(ids))
    b = ForwardBatch([SeqInput(0, ids, 0)], model.device)
    out, x, start = {}, None, 0
    for l in sorted(set(layers)):
        x = model.forward(b, kv, LayerPlan(start=start, end=l), x)
        out[l], start = x.half().cpu(), l
    return out, model.forward(b, kv, LayerPlan(start=start), x).half().cpu()


def loss_and_agreement(model, adapter: Adapter, h_l, h_L, mask,
                       amp: torch.dtype | None = None) -> tuple[torch.Tensor, int, int]:
    """amp: compute the adapter's forward in this dtype (autocast; the weights and the
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


def _optimizer(adapter: Adapter, lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(adapter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def _save_ckpt(path: Path, adapter: Adapter, opt, step: int, log: list) -> None:
    tensors = {f"adapter.{k}": v.detach().contiguous() for k, v in adapter.w.items()}
    for i, p in enumerate(adapter.parameters()):
        st = opt.state.get(p, {})
        for name in ("exp_avg", "exp_avg_sq"):
            if name in st:
                tensors[f"opt.{i}.{name}"] = st[name].contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    atomic_write_json(path.with_suffix(".json"), {"step": step, "log": log})


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


@dataclass
class Prepared:
    """The usable conversations encoded ((ids, mask) each), their seeded split into held-out
    and training ids, and a key naming the encoded data (cached features are checked by it)."""
    data: list[tuple[list[int], list[bool]]]
    held: list[int]
    train: list[int]
    key: str

    @property
    def lens(self) -> list[int]:
        return [len(ids) for ids, _ in self.data]


def split(n: int, cfg: TrainConfig) -> tuple[list[int], list[int]]:
    """A seeded split of n conversations into held-out and training ids."""
    order = list(range(n))
    random.Random(cfg.seed).shuffle(order)
    n_held = max(1, int(n * cfg.heldout))
    return order[:n_held], order[n_held:]


def prepare_data(tok, conversations, cfg: TrainConfig, encoded: list = (),
                 on_item: Callable[[object], None] | None = None) -> Prepared:
    """Encode the conversations (`encoded`: the encodings of the first ones, already made) and
    split them; on_item(conversation) after each one encoded here."""
    encs = list(encoded)
    for c in conversations[len(encs):]:
        encs.append(encode(tok, c.messages, cfg.max_len))
        if on_item:
            on_item(c)
    data = [e for e in encs if e is not None]
    if len(data) < 2:
        raise SpecctlError(f"only {len(data)} usable conversations: need at least 2")
    h = hashlib.sha256()
    for ids, mask in data:
        h.update(array("q", ids).tobytes() + bytes(mask) + b"|")
    return Prepared(data, *split(len(data), cfg), h.hexdigest()[:16])


def _meta_matches(path: Path, **want) -> bool:
    meta = path.with_suffix(".json")
    if not (path.exists() and meta.exists()):
        return False
    got = json.loads(meta.read_text())
    return all(got.get(k) == v for k, v in want.items())


def _cached_features(model, prep: Prepared, l: int, work: Path, log=quiet, have=None,
                     on_item: Callable[[int], None] | None = None) -> list:
    """The target's layer-l and final states of every conversation, computed once and kept in
    the work folder (a resumed run reads them back). have: {i: ({l: h_l, ...}, h_L)} already
    computed (by the exit-layer sweep); on_item(i) after each one computed here."""
    feat_file = work / f"features-l{l}.safetensors"
    if _meta_matches(feat_file, n=len(prep.data), key=prep.key):
        ft = load_file(str(feat_file))
        log(f"reusing cached target features ({feat_file})")
        return [(ft[f"{i}.l"], ft[f"{i}.L"]) for i in range(len(prep.data))]
    todo = len(prep.data) - len(have or ())
    if todo:
        log(f"computing the target's layer-{l} and final states for {todo} conversations ...")
    feats = []
    for i, (ids, _) in enumerate(prep.data):
        if have is not None and i in have:
            feats.append((have[i][0][l], have[i][1]))
        else:
            feats.append(features(model, ids, l))
            if on_item:
                on_item(i)
    flat = {f"{i}.{k}": t for i, (a, b) in enumerate(feats) for k, t in (("l", a), ("L", b))}
    save_file(flat, str(feat_file.with_suffix(".tmp")))
    feat_file.with_suffix(".tmp").replace(feat_file)
    atomic_write_json(feat_file.with_suffix(".json"),
                      {"n": len(prep.data), "exit_layer": l, "key": prep.key})
    return feats


def _sweep_features(model, prep: Prepared, ids: list[int], layers, work: Path, log=quiet,
                    on_item: Callable[[int], None] | None = None) -> dict:
    """{i: ({l: h_l for l in layers}, h_L)} for the conversations `ids`, one forward each, kept
    in the work folder like the main run's features."""
    layers = sorted(layers)
    f = work / "sweep-features.safetensors"
    if _meta_matches(f, key=prep.key, ids=list(ids), layers=layers):
        ft = load_file(str(f))
        log(f"reusing the sweep's cached target features ({f})")
        return {i: ({l: ft[f"{i}.l{l}"] for l in layers}, ft[f"{i}.L"]) for i in ids}
    out = {}
    for i in ids:
        out[i] = features_at(model, prep.data[i][0], layers)
        if on_item:
            on_item(i)
    flat = {f"{i}.l{l}": t for i, (hs, _) in out.items() for l, t in hs.items()}
    flat.update({f"{i}.L": h for i, (_, h) in out.items()})
    save_file(flat, str(f.with_suffix(".tmp")))
    f.with_suffix(".tmp").replace(f)
    atomic_write_json(f.with_suffix(".json"), {"key": prep.key, "ids": list(ids), "layers": layers})
    return out


def _batches(lens: list[int], train_idx: list[int], cfg: TrainConfig,
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


def _heldout_top1(model, adapter, feats, masks, held: list[int], amp) -> float:
    agree, count = 0, 0
    with torch.no_grad():
        for i in held:
            _, a, n = loss_and_agreement(model, adapter, *feats[i], masks[i], amp)
            agree, count = agree + a, count + n
    return agree / max(count, 1)


def fit(model, prep: Prepared, feats, cfg: TrainConfig, ckpt: Path | None, resume: bool,
        on_step: Callable[[dict], None] | None = None, log=quiet, *,
        train_idx: list[int] | None = None, held: list[int] | None = None,
        on_heldout: Callable[[list[int]], None] | None = None,
        heldout_each_epoch: bool = True) -> tuple[Adapter, dict]:
    """Train an adapter at cfg.exit_layer on feats[i] = (h_l, h_L) of the training ids
    (default: the split's); held-out agreement after every epoch (or the last only). on_step
    gets each step's record with its "batch" (ids); on_heldout the ids just evaluated.
    Checkpoints go to `ckpt` (None: none)."""
    l = cfg.exit_layer
    if not 1 <= l < model.cfg.num_layers:
        raise SpecctlError(f"--exit-layer must be in [1, {model.cfg.num_layers - 1}]")
    train_idx = prep.train if train_idx is None else train_idx
    held = prep.held if held is None else held
    data, lens = prep.data, prep.lens
    masks = {i: torch.tensor(data[i][1]) for i in (*train_idx, *held)}
    amp = train_dtype(cfg, model)
    if amp is not None:
        log(f"training in {str(amp).replace('torch.', '')} autocast (fp32 weights and optimizer)")
    adapter = Adapter.init_from_model(model, l)
    for k in adapter.w:   # fp32 master weights whatever the compute dtype
        adapter.w[k] = adapter.w[k].to(model.device, torch.float32).requires_grad_(True)
    opt = _optimizer(adapter, cfg.lr)
    per_epoch = len(_batches(lens, train_idx, cfg, 0))
    total = per_epoch * cfg.epochs
    warm = max(1, int(total * cfg.warmup))
    step, train_log = 0, []
    if resume and ckpt is not None and ckpt.exists():
        step, train_log = _load_ckpt(ckpt, adapter, opt)
        log(f"resuming at step {step} of {total}")
    t0, tokens, top1 = time.perf_counter(), 0, 0.0
    for epoch in range(cfg.epochs):
        for bi, batch in enumerate(_batches(lens, train_idx, cfg, epoch)):
            s = epoch * per_epoch + bi
            if s < step:
                continue
            opt.zero_grad()
            n_pos = sum(int(masks[i].sum()) for i in batch)
            loss_sum = 0.0
            for i in batch:
                loss, _, n = loss_and_agreement(model, adapter, *feats[i], masks[i], amp)
                (loss * n / n_pos).backward()
                loss_sum += loss.item() * n / n_pos
                tokens += lens[i]
            torch.nn.utils.clip_grad_norm_(adapter.parameters(), cfg.clip)
            lr = cfg.lr * min(1.0, (s + 1) / warm)   # linear warm-up, then constant
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            step = s + 1
            rec = {"step": step, "epoch": epoch, "loss": round(loss_sum, 5), "lr": lr,
                   "tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}
            if on_step:
                on_step({**rec, "total": total, "batch": batch})
            if ckpt is not None and (step % cfg.checkpoint_every == 0 or step == total):
                train_log.append(rec)
                _save_ckpt(ckpt, adapter, opt, step, train_log)
        if heldout_each_epoch or epoch == cfg.epochs - 1:
            top1 = _heldout_top1(model, adapter, feats, masks, held, amp)
            if on_heldout:
                on_heldout(held)
            train_log.append({"epoch": epoch, "heldout_top1": round(top1, 4), "step": step})
            log(f"epoch {epoch + 1}/{cfg.epochs}: held-out top-1 agreement {top1:.4f}")
    for k in adapter.w:
        adapter.w[k] = adapter.w[k].detach()
    summary = {"conversations": len(data), "train": len(train_idx), "heldout": len(held),
               "steps": step, "heldout_top1": round(top1, 4),
               "train_time_s": round(time.perf_counter() - t0, 1), "log": train_log,
               "config": asdict(cfg)}
    return adapter, summary


def train(model, tok, conversations, cfg: TrainConfig, work: Path, resume: bool,
          on_step: Callable[[dict], None] | None = None, log=quiet) -> tuple[Adapter, dict]:
    """Encode, cache features, train at cfg.exit_layer; returns the adapter and a summary."""
    l = cfg.exit_layer
    if not 1 <= l < model.cfg.num_layers:
        raise SpecctlError(f"--exit-layer must be in [1, {model.cfg.num_layers - 1}]")
    work.mkdir(parents=True, exist_ok=True)
    prep = prepare_data(tok, conversations, cfg)
    feats = _cached_features(model, prep, l, work, log)
    return fit(model, prep, feats, cfg, work / f"ckpt-l{l}.safetensors", resume, on_step, log)


def train_dtype(cfg: TrainConfig, model) -> torch.dtype | None:
    """The autocast dtype of training (None = plain fp32)."""
    if cfg.dtype == "bf16" or (cfg.dtype == "auto" and model.device.type == "cuda"):
        return torch.bfloat16
    return None


def exit_layer_candidates(num_layers: int) -> list[int]:
    """Shallow layers worth a try: 1 .. max(2, L / 8) (Kangaroo uses 2 on Vicuna-7B's 32
    layers and 3 on 13B's 40)."""
    return list(range(1, min(num_layers - 1, max(2, round(num_layers / 8))) + 1))


def expected_speedup(top1: float, cost, gamma: int) -> float:
    """Price an exit layer with held-out agreement `top1` on its Kangaroo StepCost
    (kangaroo_price, the price --speculate auto uses) at batch 1: a step drafts gamma
    tokens and emits (1 - a^(gamma+1)) / (1 - a) on average (acceptance a = top1, independent
    per token). Returns tokens/s over ar's (one 1-token step per token)."""
    a = min(max(top1, 0.0), 0.999)
    tokens = (1 - a ** (gamma + 1)) / (1 - a)
    return tokens * cost.ms(1, 1) / cost.step_ms([gamma])


SWEEP_HELDOUT = 16   # held-out conversations the sweep evaluates each candidate on (at most)


@dataclass(frozen=True)
class SweepPlan:
    """The exit-layer sweep: a short adapter per layer, trained for `epochs` on the first
    `conversations` training conversations and evaluated on (up to SWEEP_HELDOUT of) the
    held-out ones."""
    layers: tuple[int, ...]
    conversations: int
    epochs: int


def sweep_config(cfg: TrainConfig, l: int, epochs: int) -> TrainConfig:
    """A sweep candidate's training: small batches (more optimizer steps to separate layers),
    no checkpoints."""
    return replace(cfg, exit_layer=l, epochs=epochs, batch_tokens=min(cfg.batch_tokens, 1024),
                   checkpoint_every=10**9)


def sweep_sets(train_idx: list[int], held: list[int], plan: SweepPlan) -> tuple[list, list]:
    return train_idx[:plan.conversations], held[:SWEEP_HELDOUT]


def plan_sweep(layers, explicit: bool, n_max: int, budget: float,
               cost: Callable[[tuple[int, ...], int, int], float],
               floors: tuple[int, ...] = (32, 16)) -> SweepPlan | None:
    """The largest sweep whose cost(layers, conversations, epochs) fits `budget` seconds, by
    preference: every layer on n_max conversations for 2 epochs; else 1 epoch on as many
    conversations as fit but at least floors[0] (every layer, then the deepest dropped one by
    one down to two); else the same with at least floors[1]. Layers the user named are never
    dropped: when nothing fits they run on floors[-1] conversations for 1 epoch. None: no
    sweep fits the budget."""
    full = tuple(layers)
    if cost(full, n_max, 2) <= budget:
        return SweepPlan(full, n_max, 2)

    def most(ls: tuple[int, ...]) -> int:   # cost grows with the conversations
        lo, hi, n = 1, n_max, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if cost(ls, mid, 1) <= budget:
                n, lo = mid, mid + 1
            else:
                hi = mid - 1
        return n
    counts = [len(full)] if explicit else range(len(full), min(2, len(full)) - 1, -1)
    for floor in floors:
        for k in counts:
            n = most(full[:k])
            if n >= min(floor, n_max):
                return SweepPlan(full[:k], n, 1)
    return SweepPlan(full, min(floors[-1], n_max), 1) if explicit else None


def sweep_exit_layer(model, prep: Prepared, plan: SweepPlan, cfg: TrainConfig, feats: dict,
                     prices, log=quiet, on_step: Callable[[dict], None] | None = None,
                     on_heldout: Callable[[list[int]], None] | None = None
                     ) -> tuple[int, list[dict]]:
    """`--exit-layer auto`: train a short adapter (plan) at each candidate layer on the sweep's
    features ({i: ({l: h_l}, h_L)}), measure its held-out top-1 agreement, price it with
    expected_speedup on the step-cost table `prices`, keep the best. Returns (layer, the
    table)."""
    S, H = sweep_sets(prep.train, prep.held, plan)
    table = []
    for l in plan.layers:
        c = sweep_config(cfg, l, plan.epochs)
        fl = {i: (feats[i][0][l], feats[i][1]) for i in (*S, *H)}
        adapter, summ = fit(model, prep, fl, c, None, False, on_step, train_idx=S, held=H,
                            on_heldout=on_heldout, heldout_each_epoch=False)
        cost = StepCost.of(prices, kangaroo_price(model, adapter), padded_steps(model))
        est = expected_speedup(summ["heldout_top1"], cost, cfg.gamma)
        table.append({"exit_layer": l, "heldout_top1": summ["heldout_top1"],
                      "speedup_estimate": round(est, 4), "train_time_s": summ["train_time_s"]})
        log(f"exit layer {l}: held-out top-1 {summ['heldout_top1']:.4f}, estimated speedup "
            f"{est:.3f}x ({summ['train_time_s']} s)")
    best = max(table, key=lambda r: r["speedup_estimate"])
    return best["exit_layer"], table


@dataclass(frozen=True)
class Costs:
    """What train-adapter's work costs on this machine, as calibrate() timed it: seconds per
    conversation of T tokens as a + b T + c T^2, per optimizer step, per byte saved."""
    feature: tuple[float, float, float]   # the target's forward (features)
    train: tuple[float, float, float]     # the adapter's loss, forward and backward
    heldout: tuple[float, float, float]   # the loss forward alone (held-out agreement)
    step: float = 0.0                     # clipping and the optimizer's step
    write: float = 0.0                    # seconds per byte saved

    def features_s(self, lens) -> float:
        return sum(poly(self.feature, T) for T in lens)

    def train_s(self, lens) -> float:
        return sum(poly(self.train, T) for T in lens)

    def heldout_s(self, lens) -> float:
        return sum(poly(self.heldout, T) for T in lens)


def calibrate(model, ids: list[int], share: float, amp: torch.dtype | None,
              scratch: Path) -> Costs:
    """Time train-adapter's work on `ids` (a long real conversation; `share` of its positions
    train, as in the data): the target's forward at 1/8, 1/4 and 1/2 of its length, the
    adapter's loss forward and backward at 1/4 and 1/2, an optimizer step, a file save; fit
    the cost curves (the forward's quadratic term is attention's). A throwaway adapter; about
    one target forward and one training step of the longest conversation in time."""
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)

    def timed(fn):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        return time.perf_counter() - t, out

    T = len(ids)
    sizes = sorted({min(T, max(8, T // d)) for d in (8, 4, 2)})
    adapter = Adapter.init_from_model(model, 1)
    for k in adapter.w:
        adapter.w[k] = adapter.w[k].to(model.device, torch.float32).requires_grad_(True)
    opt = _optimizer(adapter, 1e-9)

    def loss_at(n):
        h_l, h_L = hs[n]
        mask = torch.zeros(n, dtype=torch.bool)
        mask[:max(1, round(share * n))] = True
        return loss_and_agreement(model, adapter, h_l, h_L, mask, amp)[0]
    hs = {}
    f_pts, t_pts, e_pts = [], [], []
    hs[sizes[0]] = features(model, ids[:sizes[0]], 1)   # warm-up
    loss_at(sizes[0]).backward()
    for n in sizes:
        dt, hs[n] = timed(lambda: features(model, ids[:n], 1))
        f_pts.append((n, dt))
    for n in sizes[-2:]:
        dt_f, loss = timed(lambda: loss_at(n))
        dt_b, _ = timed(loss.backward)
        t_pts.append((n, dt_f + dt_b))
        e_pts.append((n, dt_f))
    dt_s, _ = timed(lambda: (torch.nn.utils.clip_grad_norm_(adapter.parameters(), 1.0),
                             opt.step()))
    h_l, h_L = hs[sizes[-1]]
    tmp = scratch / "calibrate.tmp"
    dt_w, _ = timed(lambda: save_file({"l": h_l, "L": h_L}, str(tmp)))
    nbytes = tmp.stat().st_size
    tmp.unlink()
    return Costs(fit_cost(f_pts), fit_cost(t_pts, 1), fit_cost(e_pts, 1), dt_s,
                 dt_w / max(nbytes, 1))


def feature_bytes(hidden: int, tokens: int, layers: int = 1) -> int:
    """Bytes of cached fp16 features: `layers` captured states and the final ones per token."""
    return 2 * hidden * (layers + 1) * tokens


def training_cost(costs: Costs, lens: list[int], train_idx: list[int], held: list[int],
                  cfg: TrainConfig, heldout_each_epoch: bool = True) -> tuple[float, float, int]:
    """(training seconds, held-out seconds, steps) of fit() over cfg.epochs."""
    steps = sum(len(_batches(lens, train_idx, cfg, e)) for e in range(cfg.epochs))
    tr = cfg.epochs * costs.train_s([lens[i] for i in train_idx]) + steps * costs.step
    ev = (cfg.epochs if heldout_each_epoch else 1) * costs.heldout_s([lens[i] for i in held])
    return tr, ev, steps


def sweep_cost(costs: Costs, lens: list[int], train_idx: list[int], held: list[int],
               cfg: TrainConfig, plan: SweepPlan, hidden: int,
               with_features: bool = True) -> float:
    """Seconds of the sweep: its features (one forward per conversation for every candidate;
    with_features=False leaves them out, as the main run needs them anyway), saving them, and
    per candidate its training and held-out evaluation."""
    S, H = sweep_sets(train_idx, held, plan)
    both = sorted(set(S) | set(H))
    tr, ev, _ = training_cost(costs, lens, S, H, sweep_config(cfg, plan.layers[0], plan.epochs),
                              heldout_each_epoch=False)
    tokens = sum(lens[i] for i in both)
    out = len(plan.layers) * (tr + ev) + costs.write * feature_bytes(hidden, tokens,
                                                                    len(plan.layers))
    return out + (costs.features_s([lens[i] for i in both]) if with_features else 0.0)


def estimate_phases(costs: Costs, lens: list[int], train_idx: list[int], held: list[int],
                    cfg: TrainConfig, *, hidden: int, adapter_bytes: int,
                    sweep: SweepPlan | None = None, sweep_done: bool = False,
                    profile_s: float = 0.0, features_cached: bool = False,
                    step: int = 0) -> dict[str, float]:
    """Predicted seconds of each phase of train-adapter still to run: the measuring of the
    step-cost table ("profile", profile_s) and the exit-layer sweep (when `sweep` is planned
    and not done), the target features of the conversations the sweep did not cover (unless
    cached), the training from `step` on, the held-out evaluations, saving. The command's
    estimate is their sum plus the time already spent."""
    out, covered = {}, set()
    if sweep is not None:
        S, H = sweep_sets(train_idx, held, sweep)
        covered = set(S) | set(H)
        if not sweep_done:
            out["profile"] = profile_s
            out["sweep"] = sweep_cost(costs, lens, train_idx, held, cfg, sweep, hidden)
    if not features_cached:
        out["features"] = (costs.features_s([T for i, T in enumerate(lens) if i not in covered])
                           + costs.write * feature_bytes(hidden, sum(lens)))
    tr, ev, steps = training_cost(costs, lens, train_idx, held, cfg)
    left = max(steps - step, 0) / max(steps, 1)
    checkpoints = max(steps - step, 0) // cfg.checkpoint_every + 1
    out["training"] = tr * left + checkpoints * 3 * adapter_bytes * costs.write
    out["held-out"] = ev if step == 0 else ev * math.ceil(left * cfg.epochs) / cfg.epochs
    out["saving"] = adapter_bytes * costs.write
    return out


def adapter_ident(fingerprint: str, exit_layer: int) -> str:
    """The store id of a model's adapter at one exit layer."""
    return f"{fingerprint}-l{exit_layer}"


def save_adapter(store: Store, model, adapter: Adapter, fingerprint: str, summary: dict) -> Path:
    """Stored beside any earlier adapter of the same model and exit layer (`<id>-2`, ...), never
    over it: which one generate takes is decided by held-out agreement, not by recency."""
    base = ident = adapter_ident(fingerprint, adapter.l)
    n = 1
    while store.path("adapters", ident).exists():
        n += 1
        ident = f"{base}-{n}"
    with store.building("adapters", ident, make_manifest(
            "adapter", ident, model_fingerprint=fingerprint, exit_layer=adapter.l,
            heldout_top1=summary["heldout_top1"])) as d:
        save_file({k: v.float().cpu().contiguous() for k, v in adapter.w.items()},
                  str(d / "adapter.safetensors"))
        atomic_write_json(d / "config.json", adapter_config(model, adapter.l))
        atomic_write_json(d / "train_log.json", summary)
    return store.path("adapters", ident)
