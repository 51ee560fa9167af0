"""What train-adapter's work costs on this machine, for the command's time estimate: calibrate
times the real work on one conversation and fits cost curves (Costs); training_cost, sweep_cost
and estimate_phases price every phase from the data with them (eta.Eta sums and corrects them).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from specctl.prep.adapter.features import features
from specctl.prep.adapter.fit import batches, loss_and_agreement, new_optimizer, trainable_adapter
from specctl.prep.adapter.sweep import SweepPlan, sweep_config, sweep_sets
from specctl.prep.adapter.eta import fit_cost, poly
from specctl.prep.adapter.train import TrainConfig


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
    adapter = trainable_adapter(model, 1)
    opt = new_optimizer(adapter, 1e-9)

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
    steps = sum(len(batches(lens, train_idx, cfg, e)) for e in range(cfg.epochs))
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
