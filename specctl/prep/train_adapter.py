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

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.errors import SpecctlError
from specctl.reporting import quiet
from specctl.speculative.kangaroo import Adapter, adapter_config
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

    def __post_init__(self):
        if self.exit_layer < 0:
            raise SpecctlError("--exit-layer must be a layer number >= 1 or 'auto'")
        if self.sweep_layers is not None and (not self.sweep_layers
                                              or min(self.sweep_layers) < 1):
            raise SpecctlError("--sweep-layers must list layer numbers >= 1")
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


def _encode_split(tok, conversations, cfg: TrainConfig) -> tuple[list, list[int], list[int]]:
    """The usable conversations encoded, and a seeded split into held-out and training ids."""
    data = []
    for c in conversations:
        enc = encode(tok, c.messages, cfg.max_len)
        if enc is not None:
            data.append(enc)
    if len(data) < 2:
        raise SpecctlError(f"only {len(data)} usable conversations: need at least 2")
    order = list(range(len(data)))
    random.Random(cfg.seed).shuffle(order)
    n_held = max(1, int(len(data) * cfg.heldout))
    return data, order[:n_held], order[n_held:]


def _cached_features(model, data: list, l: int, work: Path, log) -> list:
    """The target's layer-l and final states of every conversation, computed once and kept in
    the work folder (a resumed run reads them back)."""
    feat_file = work / f"features-l{l}.safetensors"
    if feat_file.exists() and json.loads(feat_file.with_suffix(".json").read_text()).get(
            "n") == len(data):
        ft = load_file(str(feat_file))
        log(f"reusing cached target features ({feat_file})")
        return [(ft[f"{i}.l"], ft[f"{i}.L"]) for i in range(len(data))]
    log(f"computing the target's layer-{l} and final states for {len(data)} conversations ...")
    feats = [features(model, ids, l) for ids, _ in data]
    flat = {f"{i}.{k}": t for i, (a, b) in enumerate(feats) for k, t in (("l", a), ("L", b))}
    save_file(flat, str(feat_file.with_suffix(".tmp")))
    feat_file.with_suffix(".tmp").replace(feat_file)
    atomic_write_json(feat_file.with_suffix(".json"), {"n": len(data), "exit_layer": l})
    return feats


def _batches(data: list, train_idx: list[int], cfg: TrainConfig, epoch: int) -> list[list[int]]:
    """One epoch's batches of training ids, shuffled by epoch, up to cfg.batch_tokens tokens."""
    idx = list(train_idx)
    random.Random(cfg.seed * 1000 + epoch).shuffle(idx)
    out, cur, n = [], [], 0
    for i in idx:
        t = len(data[i][0])
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


def train(model, tok, conversations, cfg: TrainConfig, work: Path, resume: bool,
          on_step: Callable[[dict], None] | None = None, log=quiet) -> tuple[Adapter, dict]:
    """Encode, cache features, train; returns the adapter and a summary."""
    l = cfg.exit_layer
    if not 1 <= l < model.cfg.num_layers:
        raise SpecctlError(f"--exit-layer must be in [1, {model.cfg.num_layers - 1}]")
    work.mkdir(parents=True, exist_ok=True)
    data, held, train_idx = _encode_split(tok, conversations, cfg)
    feats = _cached_features(model, data, l, work, log)
    masks = [torch.tensor(m) for _, m in data]
    amp = train_dtype(cfg, model)
    if amp is not None:
        log(f"training in {str(amp).replace('torch.', '')} autocast (fp32 weights and optimizer)")
    adapter = Adapter.init_from_model(model, l)
    for k in adapter.w:   # fp32 master weights whatever the compute dtype
        adapter.w[k] = adapter.w[k].to(model.device, torch.float32).requires_grad_(True)
    opt = _optimizer(adapter, cfg.lr)
    per_epoch = len(_batches(data, train_idx, cfg, 0))
    total = per_epoch * cfg.epochs
    warm = max(1, int(total * cfg.warmup))
    ckpt = work / f"ckpt-l{l}.safetensors"
    step, train_log = 0, []
    if resume and ckpt.exists():
        step, train_log = _load_ckpt(ckpt, adapter, opt)
        log(f"resuming at step {step} of {total}")
    t0, tokens = time.perf_counter(), 0
    for epoch in range(cfg.epochs):
        for bi, batch in enumerate(_batches(data, train_idx, cfg, epoch)):
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
                tokens += len(data[i][0])
            torch.nn.utils.clip_grad_norm_(adapter.parameters(), cfg.clip)
            lr = cfg.lr * min(1.0, (s + 1) / warm)   # linear warm-up, then constant
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            step = s + 1
            rec = {"step": step, "epoch": epoch, "loss": round(loss_sum, 5), "lr": lr,
                   "tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}
            if on_step:
                on_step({**rec, "total": total})
            if step % cfg.checkpoint_every == 0 or step == total:
                train_log.append(rec)
                _save_ckpt(ckpt, adapter, opt, step, train_log)
        top1 = _heldout_top1(model, adapter, feats, masks, held, amp)
        train_log.append({"epoch": epoch, "heldout_top1": round(top1, 4), "step": step})
        log(f"epoch {epoch + 1}/{cfg.epochs}: held-out top-1 agreement {top1:.4f}")
    for k in adapter.w:
        adapter.w[k] = adapter.w[k].detach()
    summary = {"conversations": len(data), "train": len(train_idx), "heldout": len(held),
               "steps": step, "heldout_top1": round(top1, 4),
               "train_time_s": round(time.perf_counter() - t0, 1), "log": train_log,
               "config": asdict(cfg)}
    return adapter, summary


def train_dtype(cfg: TrainConfig, model) -> torch.dtype | None:
    """The autocast dtype of training (None = plain fp32)."""
    if cfg.dtype == "bf16" or (cfg.dtype == "auto" and model.device.type == "cuda"):
        return torch.bfloat16
    return None


def exit_layer_candidates(num_layers: int) -> list[int]:
    """Shallow layers worth a try: 1 .. max(2, L / 8) (Kangaroo uses 2 on Vicuna-7B's 32
    layers and 3 on 13B's 40)."""
    return list(range(1, min(num_layers - 1, max(2, round(num_layers / 8))) + 1))


def expected_speedup(top1: float, l: int, profile, gamma: int) -> float:
    """Price exit layer l with held-out agreement `top1` on the machine's cost profile: a step
    drafts gamma tokens (layers [0, l) + the adapter + the head each), verifies them with
    layers [l, L) over gamma + 1 tokens, and emits (1 - a^(gamma+1)) / (1 - a) tokens on
    average (acceptance a = top1, independent per token). Returns tokens/s over ar's."""
    L = profile.num_layers
    a = min(max(top1, 0.0), 0.999)
    tokens = (1 - a ** (gamma + 1)) / (1 - a)
    draft = profile.base + profile.head + (l + 1) * profile.attn + l * profile.mlp
    verify = profile.verify_cost(gamma + 1) * (L - l) / L
    return tokens * profile.ar_per_token / (gamma * draft + verify)


def sweep_exit_layer(model, tok, conversations, cfg: TrainConfig, work: Path, profile,
                     log=quiet) -> tuple[int, list[dict]]:
    """`--exit-layer auto`: train a short adapter (2 epochs of 1024-token batches on
    `sweep_conversations` conversations) at each candidate layer, measure its held-out top-1 agreement, price it with
    expected_speedup, keep the best. Returns (layer, the table)."""
    from dataclasses import replace
    sub = conversations[:cfg.sweep_conversations]
    table = []
    L = model.cfg.num_layers
    layers = cfg.sweep_layers or exit_layer_candidates(L)
    if max(layers) >= L:
        raise SpecctlError(f"--sweep-layers must be in [1, {L - 1}]")
    for l in layers:
        # enough optimizer steps to separate the layers: 2 epochs of small batches
        c = replace(cfg, exit_layer=l, epochs=2, batch_tokens=min(cfg.batch_tokens, 1024),
                    checkpoint_every=10**9)
        _, summ = train(model, tok, sub, c, work / f"sweep-l{l}", False, None, lambda *_: None)
        est = expected_speedup(summ["heldout_top1"], l, profile, cfg.gamma)
        table.append({"exit_layer": l, "heldout_top1": summ["heldout_top1"],
                      "speedup_estimate": round(est, 4), "train_time_s": summ["train_time_s"]})
        log(f"exit layer {l}: held-out top-1 {summ['heldout_top1']:.4f}, estimated speedup "
            f"{est:.3f}x ({summ['train_time_s']} s)")
    best = max(table, key=lambda r: r["speedup_estimate"])
    return best["exit_layer"], table


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
