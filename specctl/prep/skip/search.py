"""`specctl search-skip`: Bayesian optimization of Draft & Verify's skip set (papers/002 §3.3).

The search: GP-UCB directly over the 2L bits of the skip set (`BitGP`, prep/skip/bit_gp.py, which
says how it differs from `bayes_opt`'s and why a suggestion costs well under a second with
1,000 probes registered). Two seed sets and the set that skips every block (the opposite corner
of the bit space) are probed first.

The objective is time per generated token of greedy draft-verify decoding of a small dev set (8
prompts, 32 new tokens), relative to ar, lower is better:

- `model` (default): one packed teacher-forced forward of the skipped model over the dev
  prompts' full-model continuations, drafting simulated from its top-1 agreement and confidence
  arrays (prep/skip/tf_probe.py, which says what is exact), the counts priced by `run_cost`
  (prep/skip/evaluate.py) on the machine's step-cost table (the one `--speculate auto` prices
  with). The best few sets are then decoded for real (`decode`'s measurement) and the best of
  those is saved, with the decoded counts and estimate.
- `decode`: the dev set decoded with the skip set (`DevSet`, prep/skip/evaluate.py: one batch, from
  a KV cache prefilled once), its counts (drafted, accepted, draft forwards per step) priced by
  `run_cost`. Exact but a probe costs 3-4 s on the demo model on a 2-core CPU.
- `wall`: the clock, decoding the dev prompts one at a time (batch 1) as the paper does. Slow,
  and noisy from one probe to the next.

The saved skip set records the step-cost table it was priced with (its id, device, dtype);
`generate` warns when it runs on another device type or dtype. Every probe is appended to a log
(`<store>/work/search-<id>/probes.jsonl`) the moment it is measured, its settings beside it
(`search.json`); `--resume` re-reads the logged probes and continues: each suggestion depends only
on the probes before it, the iteration and the seed (hyperparameter refits at fixed points, on
the probes before them), and the model and decode objectives are deterministic, so a resumed
search makes the same probes as an uninterrupted one.

This module is the loop (which sets are probed, in what order), the probe log and its resume,
the confirmation of a simulated search by real decoding, and the plot. It knows nothing of how a
probe is scored (the dev set's `evaluate`) nor of how the GP suggests.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from specctl.engine.steptable import StepTable
from specctl.prep.skip.bit_gp import BitGP
from specctl.prep.skip.evaluate import DevEval, DevSet
from specctl.speculative.draft_verify import SkipSet
from specctl.store import atomic_write_text, jsonl_lines, writable_file


def seed_sets(L: int) -> list[SkipSet]:
    """Two starting points: attention of every other layer in the second half, and of every
    fourth (attention blocks are the least harmful single skips, and late layers more than
    early ones)."""
    half = range(L // 2, L)
    return [SkipSet(L, frozenset(i for i in half if (i - L // 2) % 2 == 1)),
            SkipSet(L, frozenset(i for i in half if (i - L // 2) % 4 == 1))]


@dataclass
class Probe:
    iteration: int
    bits: list[int]
    per_token: float
    relative: float          # per_token / AR per token: < 1 means faster than ar
    accept_rate: float
    mean_accepted: float
    early_stopped: bool
    seconds: float
    x: dict | None = None    # the continuous point (legacy bayes_opt search only)

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        if d["x"] is None:
            del d["x"]
        return d


def _read_log(log_path: Path) -> list[Probe]:
    probes = []
    for line in jsonl_lines(log_path.read_text(encoding="utf-8")):
        try:
            probes.append(Probe(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            break   # a line torn by an interruption (the last): probed again
    return probes


def _target(p: Probe) -> float:
    """What the GP maximizes: -log of the probe's time per token relative to ar."""
    return -float(np.log(max(p.relative, 1e-9)))


def _start_log(log_path: Path, settings: dict, resume: bool, log) -> list[Probe]:
    """The probes to continue from (none unless resuming with the same settings), left as the
    whole of `log_path`, the settings written beside it (search.json)."""
    meta = log_path.with_name("search.json")
    # (compared as stored: a step table's rows are tuples here, lists when read back, so the
    # settings never matched and every resume started over)
    settings = json.loads(json.dumps(settings))
    probes: list[Probe] = []
    if resume and log_path.exists():
        old = None
        try:
            old = json.loads(meta.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if old == settings:
            probes = _read_log(log_path)
            if probes:
                log(f"resuming after {len(probes)} logged probes")
        else:
            log(f"{log_path}: logged with other settings; starting over")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # the log holds exactly the probes kept (a torn last line is dropped)
    atomic_write_text(log_path, "".join(json.dumps(p.to_json()) + "\n" for p in probes))
    atomic_write_text(meta, json.dumps(settings))
    return probes


def _fixed_bits(L: int, seed: int, init_points: int) -> list[list[int]]:
    """The probes made before the GP suggests: the seeds, then every block skipped, then
    `init_points` random sets."""
    # every block skipped is the opposite corner (the cheapest draft forward; on the demo model
    # it drafts its input token back, confidently and wrongly: a bad set, which tells the GP
    # early that the region is bad)
    fixed = [s.bits() for s in seed_sets(L)] + [[1] * (2 * L)]
    rng = np.random.RandomState(seed)
    fixed += [[int(v > 0.5) for v in rng.uniform(size=2 * L)] for _ in range(init_points)]
    return fixed


def _probe(dev, table: StepTable | None, it: int, bits: list[int], ar: float,
           probes: list[Probe], t0: float) -> Probe:
    """Score `bits` on `dev`; a DevSet priced on a table may stop early once it is clearly worse
    than the best of `probes`. `t0`: when the probe began (its suggestion included)."""
    best = min(probes, key=lambda p: p.per_token) if probes else None
    skip = SkipSet.from_bits(bits)
    if isinstance(dev, DevSet):
        ev = dev.evaluate(skip, table,
                          best.per_token if best and table is not None else None)
    else:
        ev = dev.evaluate(skip, table)
    return Probe(it, bits, ev.per_token, ev.per_token / ar, round(ev.accept_rate, 4),
                 round(ev.mean_accepted, 4), ev.early_stopped,
                 round(time.perf_counter() - t0, 3))


def run_search(dev, table: StepTable | None, iters: int, log_path: Path,
               resume: bool, seed: int = 0, init_points: int = 0,
               on_probe: Callable[[Probe, Probe], None] | None = None,
               settings: dict | None = None, log=print, refit_every: int = 50) -> list[Probe]:
    """Probe `iters` skip sets (the seeds, `init_points` random ones, then GP-UCB suggestions
    over the bits), appending each to `log_path`; returns all probes (logged ones included on
    resume). `dev` is a TeacherForcedDev (model objective: simulated, priced on `table`) or a
    DevSet (decode: decoded, priced on `table`; wall: table None, clocked). `settings` are
    kept beside the log; a resume with other settings starts over."""
    L = dev.model.cfg.num_layers
    settings = {**(settings or {}), "seed": seed, "init_points": init_points, "search": 2}
    probes = _start_log(log_path, settings, resume, log)
    ar = dev.ar_per_token(table)
    fixed = _fixed_bits(L, seed, init_points)
    bo = BitGP(2 * L, seed, refit_every=refit_every)
    X = [p.bits for p in probes]
    y = [_target(p) for p in probes]
    every = 2 ** (2 * L)   # skip sets there are (a small model's run out before --iters)
    with open(writable_file(log_path), "a") as log_file:
        for it in range(len(probes), iters):
            if len({tuple(b) for b in X}) >= every:
                log(f"every one of this model's {every} skip sets has been probed: the search "
                    f"ends after {it} of --iters {iters}")
                break
            t = time.perf_counter()
            if it < len(fixed):
                bits = fixed[it]
            else:
                bits = bo.suggest(np.array(X, dtype=float), np.array(y), it)
            p = _probe(dev, table, it, bits, ar, probes, t)
            probes.append(p)
            X.append(bits)
            y.append(_target(p))
            log_file.write(json.dumps(p.to_json()) + "\n")
            log_file.flush()
            if on_probe:
                on_probe(p, min(probes, key=lambda q: q.per_token))
    return probes


def confirm(dev: DevSet, table: StepTable, probes: list[Probe], top: int = 5,
            log=print) -> tuple[Probe, DevEval, list[dict]]:
    """The `top` best distinct sets of a simulated search decoded for real (DevSet, priced on
    the same table); returns the best by that, its evaluation and all rows."""
    ar = dev.ar_per_token(table)
    seen, rows, best = set(), [], None
    for p in sorted(probes, key=lambda q: (q.per_token, q.iteration)):
        key = tuple(p.bits)
        if key in seen:
            continue
        seen.add(key)
        ev = dev.evaluate(SkipSet.from_bits(p.bits), table)
        rows.append({"iteration": p.iteration, "simulated_relative": p.relative,
                     "decoded_relative": ev.per_token / ar})
        if best is None or ev.per_token < best[1].per_token:
            best = (p, ev)
        if len(seen) >= top:
            break
    return best[0], best[1], rows


def run_search_legacy(dev: DevSet, table: StepTable | None, iters: int, log_path: Path,
                      seed: int = 0, init_points: int = 0) -> list[Probe]:
    """The previous search, kept as the reference the slow test compares with: each bit a
    continuous parameter of `bayes_opt` (its suggestion: GP refit + 10,000 random points +
    L-BFGS-B restarts, 16-42 s per probe with 60 bits on a 2-core CPU), DevSet probes."""
    from bayes_opt import BayesianOptimization, acquisition

    L = dev.model.cfg.num_layers
    opt = BayesianOptimization(
        f=None, pbounds={f"b{i:03d}": (0.0, 1.0) for i in range(2 * L)},
        acquisition_function=acquisition.UpperConfidenceBound(kappa=2.576),
        random_state=seed, verbose=0, allow_duplicate_points=True)
    opt.set_gp_params(alpha=1e-2)
    probes: list[Probe] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ar = dev.ar_per_token(table)
    fixed = [{f"b{i:03d}": (0.75 if b else 0.25) for i, b in enumerate(s.bits())}
             for s in seed_sets(L)]
    rng = np.random.RandomState(seed)
    fixed += [{f"b{i:03d}": float(v) for i, v in enumerate(rng.uniform(size=2 * L))}
              for _ in range(init_points)]
    with open(writable_file(log_path), "w") as log:
        for it in range(iters):
            if it < len(fixed):
                x = fixed[it]
            else:
                opt._random_state = np.random.RandomState(seed * 1_000_003 + it)
                opt._gp.random_state = seed
                x = {k: float(v) for k, v in opt.suggest().items()}
            bits = [int(x[f"b{i:03d}"] > 0.5) for i in range(2 * L)]
            best = min(probes, key=lambda p: p.per_token) if probes else None
            t = time.perf_counter()
            ev = dev.evaluate(SkipSet.from_bits(bits), table,
                              best.per_token if best and table is not None else None)
            p = Probe(it, bits, ev.per_token, ev.per_token / ar, round(ev.accept_rate, 4),
                      round(ev.mean_accepted, 4), ev.early_stopped,
                      round(time.perf_counter() - t, 3), x)
            opt.register(params=x, target=-p.relative)
            probes.append(p)
            log.write(json.dumps(p.to_json()) + "\n")
            log.flush()
    return probes


def plot_search(probes: list[Probe], best: Probe, L: int, path: Path) -> bool:
    """Objective vs iteration and the chosen skip map over layers (paper Fig. 6). Returns
    False when matplotlib is not installed (`pip install specctl[plot]`)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), gridspec_kw={"height_ratios": [3, 1.2]})
    it = [p.iteration for p in probes]
    rel = [p.relative for p in probes]
    a.scatter(it, rel, s=8, alpha=0.5, label="probe")
    a.plot(it, np.minimum.accumulate(rel), color="C3", label="best so far")
    a.axhline(1.0, color="gray", ls="--", lw=1, label="ar")
    a.set_xlabel("iteration")
    a.set_ylabel("time per token / ar")
    a.legend()
    grid = np.array([best.bits[:L], best.bits[L:]])
    b.imshow(grid, aspect="auto", cmap="Greys", vmin=0, vmax=1)
    b.set_yticks([0, 1], ["attention", "MLP"])
    b.set_xlabel("layer (black = skipped)")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return True
