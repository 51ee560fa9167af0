"""train-adapter's time estimate: the arithmetic of the phases, the correction as they run, the
sweep scaled to its budget, and the estimate said before the long work starts."""

from __future__ import annotations

import json
import re

import pytest
import torch

from specctl.prep.adapter.eta import Eta, duration, fit_cost, poly
from specctl.prep.adapter.cost import Costs, estimate_phases, sweep_cost, training_cost
from specctl.prep.adapter.fit import batches
from specctl.prep.adapter.sweep import SweepPlan, plan_sweep
from specctl.prep.adapter.train import TrainConfig

CONVS = [{"id": str(i), "conversations": [
    {"from": "human", "value": f"What is {i} plus {i}? Explain the answer step by step."},
    {"from": "gpt", "value": f"{i} plus {i} is {2 * i}. The quick brown fox jumps over the dog."}]}
    for i in range(12)]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_eta_sums_phases_and_corrects_by_the_work_done():
    clock = Clock()
    eta = Eta(started=90.0, clock=clock, min_evidence=5.0)
    eta.add("features", 40.0)
    eta.add("training", 60.0)
    assert eta.elapsed() == 10.0 and eta.remaining() == 100.0 and eta.total() == 110.0
    eta.begin("features")
    clock.t += 3.0
    eta.advance("features", 2.0)          # too little done to judge the machine yet
    assert eta.factor() == 1.0 and eta.total() == 13.0 + 38.0 + 60.0
    clock.t += 9.0
    eta.advance("features", 6.0)          # 8 predicted seconds took 12: 1.5x slower
    assert eta.factor() == pytest.approx(1.5)
    assert eta.remaining() == pytest.approx((32.0 + 60.0) * 1.5)
    clock.t += 2.0
    eta.end("features")                   # the rest of the phase's work, in 2 s
    assert eta.factor() == pytest.approx(14.0 / 40.0)
    assert eta.total() == pytest.approx(24.0 + 60.0 * 14.0 / 40.0)
    assert eta.left("features") == 0.0
    eta.drop("training")
    assert eta.remaining() == 0.0 and eta.total() == pytest.approx(24.0)


def test_duration_and_summary():
    assert duration(44.6) == "45 s" and duration(125) == "2 min 5 s"
    assert duration(1500) == "25 min" and duration(2 * 3600 + 180) == "2 h 3 min"
    clock = Clock()
    eta = Eta(started=100.0, clock=clock)
    eta.add("features", 300.0)
    eta.add("saving", 0.1)                # too small to list
    assert eta.summary() == "5 min 0 s (so far 0 s; features 5 min 0 s)"


def test_fit_cost_recovers_curves_and_never_goes_negative():
    curve = (0.03, 1.2e-3, 6e-7)
    pts = [(T, poly(curve, T)) for T in (256, 1024, 2048)]
    got = fit_cost(pts)
    for T in (100, 700, 2048):
        assert poly(got, T) == pytest.approx(poly(curve, T), rel=1e-6)
    # a negative intercept would price short conversations below zero: clamped, refit
    a, b, c = fit_cost([(256, 0.3), (1024, 1.9)], degree=1)
    assert a == 0.0 and b > 0 and c == 0.0
    assert all(x >= 0 for x in fit_cost([(100, 0.5), (200, 0.4), (300, 0.45)]))


COSTS = Costs(feature=(0.0, 0.01, 0.0), train=(0.5, 0.0, 0.0), heldout=(0.25, 0.0, 0.0),
              step=0.1, write=1e-6)


def test_estimate_phases_adds_up():
    lens = [200] * 20   # two conversations a step: 9 steps an epoch
    cfg = TrainConfig(epochs=2, batch_tokens=400, checkpoint_every=5)
    held, train_idx = [0, 10], [i for i in range(20) if i not in (0, 10)]
    hidden, ab = 8, 1000
    ph = estimate_phases(COSTS, lens, train_idx, held, cfg, hidden=hidden, adapter_bytes=ab)
    steps = sum(len(batches(lens, train_idx, cfg, e)) for e in range(2))
    assert steps == 18
    assert set(ph) == {"features", "training", "held-out", "saving"}
    assert ph["features"] == pytest.approx(0.01 * 4000 + 1e-6 * 2 * 8 * 2 * 4000)
    assert ph["training"] == pytest.approx(2 * 18 * 0.5 + steps * 0.1
                                           + (steps // 5 + 1) * 3 * ab * 1e-6)
    assert ph["held-out"] == pytest.approx(2 * 2 * 0.25)
    assert ph["saving"] == pytest.approx(ab * 1e-6)
    # with a sweep: the profile and the sweep come first, and the conversations the sweep
    # computed features for are not computed again
    plan = SweepPlan((1, 2), 4, 1)
    sw = estimate_phases(COSTS, lens, train_idx, held, cfg, hidden=hidden, adapter_bytes=ab,
                         sweep=plan, profile_s=7.0)
    covered = set(train_idx[:4]) | set(held)
    assert sw["profile"] == 7.0
    assert sw["sweep"] == pytest.approx(sweep_cost(COSTS, lens, train_idx, held, cfg, plan, hidden))
    assert sw["features"] == pytest.approx(
        0.01 * sum(T for i, T in enumerate(lens) if i not in covered) + 1e-6 * 2 * 8 * 2 * 4000)
    assert sw["training"] == ph["training"] and sw["held-out"] == ph["held-out"]
    # resumed at half the steps, features cached, sweep done
    half = estimate_phases(COSTS, lens, train_idx, held, cfg, hidden=hidden, adapter_bytes=ab,
                           sweep=plan, sweep_done=True, features_cached=True, step=steps // 2)
    assert set(half) == {"training", "held-out", "saving"}
    tr, ev, _ = training_cost(COSTS, lens, train_idx, held, cfg)
    assert half["training"] < ph["training"] and half["training"] >= tr * (steps - steps // 2) / steps
    assert half["held-out"] == pytest.approx(ev / 2)


def test_sweep_cost_counts_every_candidate():
    lens = [200] * 30
    cfg = TrainConfig(batch_tokens=4096)
    train_idx, held = list(range(2, 30)), [0, 1]
    one = sweep_cost(COSTS, lens, train_idx, held, cfg, SweepPlan((1,), 8, 2), 4, False)
    two = sweep_cost(COSTS, lens, train_idx, held, cfg, SweepPlan((1, 2), 8, 2), 4, False)
    steps = sum(len(batches(lens, train_idx[:8], TrainConfig(batch_tokens=1024), e))
                for e in range(2))
    per = 2 * 8 * 0.5 + steps * 0.1 + 2 * 0.25   # 2 epochs, steps of <= 1024 tokens, held-out
    assert one == pytest.approx(per + 1e-6 * 2 * 4 * 2 * 2000)
    assert two == pytest.approx(2 * per + 1e-6 * 2 * 4 * 3 * 2000)
    with_f = sweep_cost(COSTS, lens, train_idx, held, cfg, SweepPlan((1, 2), 8, 2), 4)
    assert with_f == pytest.approx(two + 0.01 * 200 * 10)


def test_plan_sweep_scales_down_to_its_budget():
    def cost(layers, n, epochs):   # 1 s per conversation, epoch and layer
        return len(layers) * n * epochs
    layers = (1, 2, 3, 4)
    assert plan_sweep(layers, False, 64, 10**6, cost) == SweepPlan(layers, 64, 2)
    assert plan_sweep(layers, False, 64, 200, cost) == SweepPlan(layers, 50, 1)
    assert plan_sweep(layers, False, 64, 100, cost) == SweepPlan((1, 2, 3), 33, 1)
    assert plan_sweep(layers, False, 64, 40, cost) == SweepPlan((1, 2), 20, 1)
    assert plan_sweep(layers, False, 64, 20, cost) is None
    # named layers stay, on fewer conversations
    assert plan_sweep((2, 3), True, 64, 40, cost) == SweepPlan((2, 3), 20, 1)
    assert plan_sweep((2, 3), True, 64, 1, cost) == SweepPlan((2, 3), 16, 1)
    # little data: its whole training split is enough
    assert plan_sweep(layers, False, 10, 30, cost) == SweepPlan((1, 2, 3), 10, 1)


def test_features_at_equals_one_forward(model):
    from specctl.prep.adapter.features import features, features_at
    ids = list(range(5, 45))
    hs, h_L = features_at(model, ids, [2, 1])
    for l in (1, 2):
        a, b = features(model, ids, l)
        assert torch.equal(hs[l], a) and torch.equal(h_L, b)


def _run(tiny, data, store, *extra):
    from specctl.prep.adapter.train import TrainConfig
    from specctl.prep.adapter.command import run_train_adapter
    from specctl.reporting import Reporter
    lines = []
    cfg = TrainConfig(str(tiny), str(data), *extra, epochs=1, lr=1e-3, batch_tokens=400,
                      heldout=0.2, device="cpu")
    res = run_train_adapter(cfg, store, False, Reporter(lines.append))
    return lines, res


def _index(lines, text):
    return next(i for i, x in enumerate(lines) if text in x)


@pytest.fixture()
def data(tmp_path):
    f = tmp_path / "sharegpt.json"
    f.write_text(json.dumps(CONVS))
    return f


def test_estimate_is_said_before_the_work(tiny_llama, data, tmp_path):
    from specctl.store import Store
    lines, res = _run(tiny_llama, data, Store(tmp_path), 2)
    first = _index(lines, "estimated time for the whole command")
    assert first == _index(lines, f"{data}: ") + 1   # right after the data's summary
    assert first < _index(lines, "computing the target's") < _index(lines, "epoch 1/1")
    # The phases are named only when they take half a second or more (a fast machine trains
    # this tiny model in less), so only the line's shape is machine-independent.
    assert re.search(r"estimated time for the whole command: .+ \(so far .+\)", lines[first])
    assert "train-adapter took" in lines[-1]


def test_many_conversations_are_priced_before_they_are_encoded(tiny_llama, data, tmp_path,
                                                                monkeypatch):
    from specctl.prep.adapter import command as train_cmd
    from specctl.store import Store
    monkeypatch.setattr(train_cmd, "ENCODE_SAMPLE", 4)
    monkeypatch.setattr(train_cmd, "ENCODE_EARLY_S", 0.0)
    lines, _ = _run(tiny_llama, data, Store(tmp_path), 2)
    first = _index(lines, "estimated time for the whole command")
    assert first == _index(lines, f"{data}: ") + 1 and \
        first < _index(lines, "with every conversation encoded") < \
        _index(lines, "computing the target's")


def test_sweep_scaled_to_budget_is_said_and_resumed(tiny_llama, data, tmp_path):
    from specctl.prep.adapter.train import TrainConfig
    from specctl.prep.adapter.command import run_train_adapter
    from specctl.reporting import Reporter
    from specctl.store import Store
    store = Store(tmp_path)
    lines = []
    cfg = TrainConfig(str(tiny_llama), str(data), 0, 1, 1e-3, batch_tokens=400, heldout=0.2,
                      device="cpu", sweep_budget=0.0)
    run_train_adapter(cfg, store, False, Reporter(lines.append))
    assert any("no exit-layer sweep" in x and "--sweep-budget" in x for x in lines)
    cfg = TrainConfig(str(tiny_llama), str(data), 0, 1, 1e-3, batch_tokens=400, heldout=0.2,
                      device="cpu", sweep_layers=(1, 2), sweep_budget=0.0)
    lines = []
    res = run_train_adapter(cfg, store, False, Reporter(lines.append))
    assert any("scaled down" in x for x in lines)   # named layers run, on fewer conversations
    state = json.loads(next((tmp_path / "work").glob("train-*/sweep.json")).read_text())
    assert state["layer"] == res["summary"]["config"]["exit_layer"]
    lines = []
    again = run_train_adapter(cfg, store, True, Reporter(lines.append))
    assert any("the interrupted run's sweep, reused" in x for x in lines)
    assert again["summary"]["exit_layer_sweep"] == res["summary"]["exit_layer_sweep"]
