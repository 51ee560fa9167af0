"""`specctl search-skip`: Bayesian optimization of Draft & Verify's skip set (papers/002 §3.3).

Each of the 2L sublayers is a continuous parameter in [0, 1] (> 0.5 = skip), as in the authors'
code; a Gaussian process (Matern 2.5, alpha 1e-2) with UCB (kappa 2.576) from the
`bayesian-optimization` package proposes the next set; two seed sets are probed first. The
objective is time per generated token of draft-verify decoding of a small dev set (8 prompts, 32
new tokens, greedy), lower is better:

- `model` (default): the dev set's measured counts (drafted, accepted, draft forwards per step)
  priced by a cost profile of per-block times measured once per machine (prep/costs.py).
  Repeatable, and cheap: the dev set decodes as one batch.
- `wall`: the clock, decoding the dev prompts one at a time (batch 1) as the paper does. Slow,
  and noisy from one probe to the next.

Every probe is appended to a log (`<store>/work/search-<id>/probes.jsonl`) the moment it is
measured; `--resume` re-registers the logged probes and continues, and because each suggestion
is drawn with a generator seeded by (seed, iteration) and the model objective is deterministic,
a resumed search makes the same probes as an uninterrupted one. The dev prompts are prefilled
once; every probe restarts decoding from that KV cache.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from specctl.prep.costs import CostProfile, run_cost
from specctl.runtime.runner import Runner
from specctl.runtime.sequence import Request, Sequence
from specctl.spec.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
from specctl.spec.verify import SamplingParams

EARLY_STOP_RATIO = 1.25    # stop a probe once it costs this much more per token than the best
EARLY_STOP_AFTER = 0.25    # ... after this share of the dev tokens


@dataclass
class DevEval:
    tokens: int
    drafted: int
    accepted: int
    steps: int
    cost: float               # modelled (model) or measured (wall) seconds
    early_stopped: bool = False
    per_seq: list[dict] = field(default_factory=list)

    @property
    def per_token(self) -> float:
        return self.cost / max(self.tokens, 1)

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


class DevSet:
    """Dev prompts prefilled once; each evaluation decodes `max_new` greedy tokens per prompt
    from that cache with a given skip set."""

    def __init__(self, model, prompts: list[list[int]], max_new: int = 32, K: int = 12):
        self.model, self.prompts, self.max_new = model, prompts, max_new
        self.params = ExitParams(K=K)
        n = len(prompts)
        max_len = max(len(p) for p in prompts) + max_new + K + 2
        self.runner = Runner(model, LayerSkipDrafter(model, SkipSet(model.cfg.num_layers),
                                                     SamplingParams()),
                             SamplingParams(), batch_size=n, max_len=max_len, eos_ids=set(),
                             render=lambda r: prompts[r.index], decode=lambda ids: "")
        self.first = []
        for i in range(n):   # prefill one by one: the rows are the full model's, kept forever
            seq = Sequence(Request(i, [[]], max_new), prompts[i], i)
            self.runner._prefill([seq])
            self.first.append(seq.out_ids[0])

    def _sequences(self) -> list[Sequence]:
        seqs = []
        for i, p in enumerate(self.prompts):
            s = Sequence(Request(i, [[]], self.max_new), p, i)
            s.prefilled, s.out_ids, s.pending = len(p), [self.first[i]], self.first[i]
            self.runner.kv.lens[i] = len(p)
            seqs.append(s)
        return seqs

    def evaluate(self, skip: SkipSet, profile: CostProfile | None,
                 best_per_token: float | None = None) -> DevEval:
        """profile given: the model objective (batched, counted); None: wall clock, batch 1."""
        drafter = LayerSkipDrafter(self.model, skip, SamplingParams(), self.params)
        self.runner.drafter = drafter
        seqs = self._sequences()
        na, nm = len(skip.attn), len(skip.mlp)
        total = len(seqs) * self.max_new
        early = False
        t0 = time.perf_counter()
        if profile is None:
            for s in seqs:
                while not s.finished:
                    self.runner.step([s])
        else:
            live = seqs
            while live:
                self.runner.step(live)
                live = [s for s in live if not s.finished]
                done = sum(len(s.out_ids) for s in seqs)
                if best_per_token and live and done >= EARLY_STOP_AFTER * total:
                    cost = sum(run_cost(profile, s.req.draft_lengths,
                                        s.state.get("draft_forwards", 0), na, nm) for s in seqs)
                    # the first token of each sequence came from prefill: not priced, not counted
                    if cost / (done - len(seqs)) > EARLY_STOP_RATIO * best_per_token:
                        early = True
                        break
        wall = time.perf_counter() - t0
        per_seq = [{"tokens": len(s.out_ids) - 1, "draft_lengths": s.req.draft_lengths,
                    "accept_lengths": s.req.accept_lengths,
                    "draft_forwards": s.state.get("draft_forwards", 0)} for s in seqs]
        tokens = sum(p["tokens"] for p in per_seq)
        cost = wall if profile is None else sum(
            run_cost(profile, p["draft_lengths"], p["draft_forwards"], na, nm) for p in per_seq)
        return DevEval(tokens, sum(sum(p["draft_lengths"]) for p in per_seq),
                       sum(sum(p["accept_lengths"]) for p in per_seq),
                       sum(len(p["draft_lengths"]) for p in per_seq), cost, early, per_seq)

    def ar_per_token(self, profile: CostProfile | None) -> float:
        """The AR baseline of the same objective: every forward is verify[1]; wall: measured."""
        if profile is not None:
            return profile.ar_per_token
        # ar through the same runner: a drafter that never drafts (K drafts of 0 tokens)
        from specctl.spec.drafter import NoDraft
        self.runner.drafter = NoDraft()
        seqs = self._sequences()
        t0 = time.perf_counter()
        for s in seqs:
            while not s.finished:
                self.runner.step([s])
        return (time.perf_counter() - t0) / sum(len(s.out_ids) - 1 for s in seqs)


def seed_sets(L: int) -> list[SkipSet]:
    """Two starting points: attention of every other layer in the second half, and of every
    fourth (attention blocks are the least harmful single skips, and late layers more than
    early ones)."""
    half = range(L // 2, L)
    return [SkipSet(L, frozenset(i for i in half if (i - L // 2) % 2 == 1)),
            SkipSet(L, frozenset(i for i in half if (i - L // 2) % 4 == 1))]


def _bits_of(x: dict, L: int) -> list[int]:
    return [int(x[f"b{i:03d}"] > 0.5) for i in range(2 * L)]


def _params_of(skip: SkipSet) -> dict:
    return {f"b{i:03d}": (0.75 if b else 0.25) for i, b in enumerate(skip.bits())}


@dataclass
class Probe:
    iteration: int
    x: dict
    bits: list[int]
    per_token: float
    relative: float          # per_token / AR per token: < 1 means faster than ar
    accept_rate: float
    mean_accepted: float
    early_stopped: bool
    seconds: float

    def to_json(self) -> dict:
        return self.__dict__


def run_search(dev: DevSet, profile: CostProfile | None, iters: int, log_path: Path,
               resume: bool, seed: int = 0, init_points: int = 0,
               on_probe: Callable[[Probe, Probe], None] | None = None) -> list[Probe]:
    """Probe `iters` skip sets (the seeds, `init_points` random ones, then GP suggestions),
    appending each to `log_path`; returns all probes (logged ones included on resume)."""
    from bayes_opt import BayesianOptimization, acquisition

    L = dev.model.cfg.num_layers
    opt = BayesianOptimization(
        f=None, pbounds={f"b{i:03d}": (0.0, 1.0) for i in range(2 * L)},
        acquisition_function=acquisition.UpperConfidenceBound(kappa=2.576),
        random_state=seed, verbose=0, allow_duplicate_points=True)
    opt.set_gp_params(alpha=1e-2)
    probes: list[Probe] = []
    if resume and log_path.exists():
        for line in log_path.read_text().splitlines():
            try:
                probes.append(Probe(**json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                continue   # a line torn by an interruption is probed again
        for p in probes:
            opt.register(params=p.x, target=-p.relative)
    elif log_path.exists():
        log_path.unlink()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ar = dev.ar_per_token(profile)
    fixed = [_params_of(s) for s in seed_sets(L)]
    rng = np.random.RandomState(seed)
    fixed += [{f"b{i:03d}": float(v) for i, v in enumerate(rng.uniform(size=2 * L))}
              for _ in range(init_points)]
    with open(log_path, "a") as log:
        for it in range(len(probes), iters):
            if it < len(fixed):
                x = fixed[it]
            else:
                # a fresh generator per iteration: the same probes whether resumed or not
                opt._random_state = np.random.RandomState(seed * 1_000_003 + it)
                opt._gp.random_state = seed
                x = {k: float(v) for k, v in opt.suggest().items()}
            bits = _bits_of(x, L)
            best = min(probes, key=lambda p: p.per_token) if probes else None
            t = time.perf_counter()
            ev = dev.evaluate(SkipSet.from_bits(bits), profile,
                              best.per_token if best and profile is not None else None)
            p = Probe(it, x, bits, ev.per_token, ev.per_token / ar, round(ev.accept_rate, 4),
                      round(ev.mean_accepted, 4), ev.early_stopped,
                      round(time.perf_counter() - t, 3))
            opt.register(params=x, target=-p.relative)
            probes.append(p)
            log.write(json.dumps(p.to_json()) + "\n")
            log.flush()
            if on_probe:
                on_probe(p, min(probes, key=lambda q: q.per_token))
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
