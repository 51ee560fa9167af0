"""Choosing the exit layer (`--exit-layer auto`): a short adapter trained at each shallow
candidate layer, priced by its held-out agreement on this machine's step costs as
`--speculate auto` prices a Kangaroo step; the best estimated speedup wins. plan_sweep fits the
sweep to a time budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from specctl.prep.adapter.fit import fit
from specctl.prep.adapter.train import Prepared, TrainConfig
from specctl.reporting import quiet
from specctl.runtime.control.stepcost import StepCost, padded_steps
from specctl.speculative.kangaroo import kangaroo_price


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
    return tokens * cost.table.ms(1, 1) / cost.step_ms([gamma])


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
    """The ids the sweep trains on and evaluates on."""
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
