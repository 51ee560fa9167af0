"""`specctl search-skip`: Bayesian optimization of Draft & Verify's skip set (papers/002 §3.3).

The search: GP-UCB directly over the 2L bits of the skip set (`BitGP`): a Gaussian process
(Matern 2.5, alpha 1e-2, as the paper's code) over the probed bit vectors, UCB with kappa 2.576
maximized over bit vectors (random sets, one/two-bit flips of the best probes, single-flip hill
climbing) instead of `bayes_opt`'s 10,000 random points + L-BFGS-B over a continuous relaxation;
GP hyperparameters refit every 50 probes, not at every probe. Two seed sets and the set that
skips every block (the opposite corner of the bit space) are probed first.
A suggestion so costs well under a second with 1,000 probes registered (bayes_opt's: 16-42 s).

The objective is time per generated token of greedy draft-verify decoding of a small dev set (8
prompts, 32 new tokens), relative to ar, lower is better:

- `model` (default): one packed teacher-forced forward of the skipped model over the dev
  prompts' full-model continuations, drafting simulated from its top-1 agreement and confidence
  arrays (prep/tf_probe.py, which says what is exact), the counts priced by `run_cost` on the
  machine's step-cost table (the one `--speculate auto` prices with). The best few sets are
  then decoded for real (`decode`'s measurement) and the best of those is saved, with the
  decoded counts and estimate.
- `decode`: the dev set decoded with the skip set (one batch, from a KV cache prefilled once),
  its counts (drafted, accepted, draft forwards per step) priced by `run_cost`. Exact but
  a probe costs 3-4 s on the demo model on a 2-core CPU.
- `wall`: the clock, decoding the dev prompts one at a time (batch 1) as the paper does. Slow,
  and noisy from one probe to the next.

The saved skip set records the step-cost table it was priced with (its id, device, dtype);
`generate` warns when it runs on another device type or dtype. Every probe is appended to a log
(`<store>/work/search-<id>/probes.jsonl`) the moment it is measured, its settings beside it
(`search.json`); `--resume` re-reads the logged probes and continues: each suggestion depends only
on the probes before it, the iteration and the seed (hyperparameter refits at fixed points, on
the probes before them), and the model and decode objectives are deterministic, so a resumed
search makes the same probes as an uninterrupted one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from specctl.engine.steptable import StepTable
from specctl.runtime.runner import Runner
from specctl.runtime.sequence import Request, Sequence
from specctl.speculative.draft_verify import (ExitParams, LayerSkipDrafter, SkipSet,
                                              skip_draft_frac)
from specctl.speculative.sampling import SamplingParams

EARLY_STOP_RATIO = 1.25    # stop a probe once it costs this much more per token than the best
EARLY_STOP_AFTER = 0.25    # ... after this share of the dev tokens


def run_cost(table: StepTable, draft_lengths: list[int], draft_forwards: int,
             draft_frac: float) -> float:
    """Modelled seconds of one sequence's decoding from its counts, priced at batch 1 as
    stepcost.cost_for prices draft-verify: a step that drafted d tokens verifies d + 1
    (table.ms(1, d + 1)), a draft forward costs draft_frac * table.ms(1, 1) (skip_draft_frac).
    Two runs with the same counts cost the same: the clock is read once, for the table."""
    ms = sum(table.ms(1, d + 1) for d in draft_lengths) + \
        draft_forwards * draft_frac * table.ms(1, 1)
    return ms / 1e3


def ar_per_token(table: StepTable) -> float:
    """ar's seconds per token on the same table: one 1-token step each."""
    return table.ms(1, 1) / 1e3


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

    def evaluate(self, skip: SkipSet, table: StepTable | None,
                 best_per_token: float | None = None) -> DevEval:
        """table given: counted, priced by run_cost (batched); None: wall clock, batch 1."""
        drafter = LayerSkipDrafter(self.model, skip, SamplingParams(), self.params)
        self.runner.drafter = drafter
        seqs = self._sequences()
        for s in seqs:
            drafter.admit(s)
        frac = skip_draft_frac(self.model, skip)
        total = len(seqs) * self.max_new
        early = False
        t0 = time.perf_counter()
        if table is None:
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
                    cost = sum(run_cost(table, s.req.draft_lengths,
                                        s.state.draft_forwards, frac) for s in seqs)
                    # the first token of each sequence came from prefill: not priced, not counted
                    if cost / (done - len(seqs)) > EARLY_STOP_RATIO * best_per_token:
                        early = True
                        break
        wall = time.perf_counter() - t0
        per_seq = [{"tokens": len(s.out_ids) - 1, "draft_lengths": s.req.draft_lengths,
                    "accept_lengths": s.req.accept_lengths,
                    "draft_forwards": s.state.draft_forwards} for s in seqs]
        tokens = sum(p["tokens"] for p in per_seq)
        cost = wall if table is None else sum(
            run_cost(table, p["draft_lengths"], p["draft_forwards"], frac) for p in per_seq)
        return DevEval(tokens, sum(sum(p["draft_lengths"]) for p in per_seq),
                       sum(sum(p["accept_lengths"]) for p in per_seq),
                       sum(len(p["draft_lengths"]) for p in per_seq), cost, early, per_seq)

    def ar_per_token(self, table: StepTable | None) -> float:
        """The AR baseline of the same objective: priced (ar_per_token) or, wall, measured."""
        if table is not None:
            return ar_per_token(table)
        # ar through the same runner: a drafter that never drafts (K drafts of 0 tokens)
        from specctl.speculative.drafter import NoDraft
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


ALPHA = 1e-2                                   # GP noise (the paper's code: alpha 1e-2)
LENGTH_SCALES = tuple(float(v) for v in np.geomspace(0.5, 64.0, 15))
AMPLITUDES = (0.25, 1.0, 4.0)


def _solve_tri(Lc: np.ndarray, b: np.ndarray, trans: bool = False) -> np.ndarray:
    from scipy.linalg import solve_triangular
    return solve_triangular(Lc, b, lower=True, trans=1 if trans else 0, check_finite=False)


class BitGP:
    """GP-UCB over the skip set's bits directly (module docstring): a Matern 2.5 GP (alpha 1e-2,
    normalized targets) whose hyperparameters are refit every `refit_every` probes (on the probes
    before that point, so a resumed search refits on the same data) and otherwise only
    conditioned on the new probes (at most 400 of them: the best and the latest); UCB (kappa 2.576) maximized over bit vectors: random sets,
    one- and two-bit flips of the best probes, then single-flip hill climbing from the best
    candidates. Never proposes a set already probed (the objective is deterministic)."""

    def __init__(self, dim: int, seed: int = 0, kappa: float = 2.576, refit_every: int = 50,
                 n_random: int = 256, top: int = 8, climbs: int = 3, climb_steps: int = 6,
                 max_points: tuple[int, int] = (300, 100)):
        self.dim, self.seed, self.kappa, self.refit_every = dim, seed, kappa, refit_every
        self.n_random, self.top, self.climbs, self.climb_steps = n_random, top, climbs, climb_steps
        self.max_points = max_points
        self._kernel: tuple[int, object] | None = None   # (refit point, fitted kernel)

    def _subset(self, y: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """The probes the GP conditions on: all of them up to sum(max_points), then the best
        max_points[0] and the latest max_points[1] (the region the search works in), so a
        suggestion costs the same at probe 1,000 as at probe 400. scale < 1: fewer (refits)."""
        n = len(y)
        best, last = (int(v * scale) for v in self.max_points)
        if n <= best + last:
            return np.arange(n)
        keep = set(np.argsort(-y, kind="stable")[:best].tolist()) | set(range(n - last, n))
        return np.array(sorted(keep))

    @staticmethod
    def _kernel_of(A: np.ndarray, B: np.ndarray, ls: float, amp: float) -> np.ndarray:
        """Matern 2.5 over bit vectors: r = Euclidean distance = sqrt(Hamming distance)."""
        ham = A @ (1 - B).T + (1 - A) @ B.T
        z = np.sqrt(5.0 * np.maximum(ham, 0.0)) / ls
        return amp * (1.0 + z + z * z / 3.0) * np.exp(-z)

    def _fit(self, X: np.ndarray, y: np.ndarray, ls: float, amp: float):
        mu, sd = float(y.mean()), float(y.std()) or 1.0
        yn = (y - mu) / sd
        K = self._kernel_of(X, X, ls, amp) + ALPHA * np.eye(len(X))
        Lc = np.linalg.cholesky(K)
        w = _solve_tri(Lc, yn)
        lml = -0.5 * float(w @ w) - float(np.log(np.diag(Lc)).sum())
        return (X, Lc, _solve_tri(Lc, w, trans=True), mu, sd, ls, amp), lml

    def _gp(self, X: np.ndarray, y: np.ndarray):
        """The GP posterior on the subset; hyperparameters (length scale, amplitude on the
        normalized targets) by maximum marginal likelihood over a grid at each refit point."""
        n = len(X)
        r = max(n - n % self.refit_every, min(n, self.refit_every))  # the last refit point
        if self._kernel is None or self._kernel[0] != r:
            sub = self._subset(y[:r], 0.5)
            best = max(((ls, amp) for ls in LENGTH_SCALES for amp in AMPLITUDES),
                       key=lambda h: self._fit(X[:r][sub], y[:r][sub], *h)[1])
            self._kernel = (r, best)
        sub = self._subset(y)
        return self._fit(X[sub], y[sub], *self._kernel[1])[0]

    def _ucb(self, post, C: np.ndarray) -> np.ndarray:
        X, Lc, alpha, mu, sd, ls, amp = post
        Ks = self._kernel_of(C, X, ls, amp)
        v = _solve_tri(Lc, Ks.T)
        var = np.maximum(amp - (v * v).sum(0), 1e-12)
        return mu + sd * (Ks @ alpha + self.kappa * np.sqrt(var))

    def suggest(self, X: np.ndarray, y: np.ndarray, it: int) -> list[int]:
        """X: [n, dim] probed bits, y: [n] targets (higher is better); it: the iteration."""
        try:   # small matrices: BLAS threads only spin (10x slower on a busy 2-core CPU)
            from threadpoolctl import threadpool_limits
        except ImportError:
            return self._suggest(X, y, it)
        with threadpool_limits(1, user_api="blas"):
            return self._suggest(X, y, it)

    def _suggest(self, X: np.ndarray, y: np.ndarray, it: int) -> list[int]:
        rng = np.random.RandomState((self.seed * 1_000_003 + it) % (2**32))
        post = self._gp(X, y)
        seen = {row.tobytes() for row in X.astype(np.int8)}

        def ucb(C):
            return self._ucb(post, C.astype(float))

        dens = rng.uniform(0.0, 1.0, size=(self.n_random, 1))
        cands = [(rng.uniform(size=(self.n_random, self.dim)) < dens).astype(np.int8)]
        best = X[np.argsort(-y, kind="stable")[:self.top]].astype(np.int8)
        eye = np.eye(self.dim, dtype=np.int8)
        for b in best:
            cands.append(b[None, :] ^ eye)                                     # one flip
            two = rng.randint(0, self.dim, size=(self.dim, 2))
            pair = eye[two[:, 0]] | eye[two[:, 1]]
            cands.append(b[None, :] ^ pair)                                    # two flips
        C = np.unique(np.concatenate(cands), axis=0)
        u = ucb(C)
        order = np.argsort(-u, kind="stable")
        pool = {C[i].tobytes(): (u[i], C[i]) for i in order[:64]}
        for i in order[:self.climbs]:   # hill climbing on UCB, one flip at a time
            x, ux = C[i], u[i]
            for _ in range(self.climb_steps):
                nb = x[None, :] ^ eye
                un = ucb(nb)
                for k in np.argsort(-un, kind="stable")[:8]:
                    pool.setdefault(nb[k].tobytes(), (un[k], nb[k]))
                k = int(np.argmax(un))
                if un[k] <= ux:
                    break
                x, ux = nb[k], un[k]
        ranked = sorted(pool.values(), key=lambda t: (-t[0], t[1].tobytes()))
        for _, x in ranked:
            if x.tobytes() not in seen:
                return [int(v) for v in x]
        while True:   # everything proposed was probed already: a fresh random set
            x = (rng.uniform(size=self.dim) < rng.uniform(0.0, 0.5)).astype(np.int8)
            if x.tobytes() not in seen:
                return [int(v) for v in x]


def _read_log(log_path: Path) -> list[Probe]:
    probes = []
    for line in log_path.read_text().splitlines():
        try:
            probes.append(Probe(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            break   # a line torn by an interruption (the last): probed again
    return probes


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
    meta = log_path.with_name("search.json")
    settings = {**(settings or {}), "seed": seed, "init_points": init_points, "search": 2}
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
    tmp = log_path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(p.to_json()) + "\n" for p in probes))
    tmp.replace(log_path)
    meta.write_text(json.dumps(settings))
    ar = dev.ar_per_token(table)
    # the seeds, then every block skipped: the opposite corner (the cheapest draft forward; on
    # the demo model it drafts its input token back, confidently and wrongly: a bad set, which
    # tells the GP early that the region is bad)
    fixed = [s.bits() for s in seed_sets(L)] + [[1] * (2 * L)]
    rng = np.random.RandomState(seed)
    fixed += [[int(v > 0.5) for v in rng.uniform(size=2 * L)] for _ in range(init_points)]
    bo = BitGP(2 * L, seed, refit_every=refit_every)
    X = [p.bits for p in probes]
    y = [-float(np.log(max(p.relative, 1e-9))) for p in probes]
    with open(log_path, "a") as log_file:
        for it in range(len(probes), iters):
            t = time.perf_counter()
            if it < len(fixed):
                bits = fixed[it]
            else:
                bits = bo.suggest(np.array(X, dtype=float), np.array(y), it)
            best = min(probes, key=lambda p: p.per_token) if probes else None
            skip = SkipSet.from_bits(bits)
            if isinstance(dev, DevSet):
                ev = dev.evaluate(skip, table,
                                  best.per_token if best and table is not None else None)
            else:
                ev = dev.evaluate(skip, table)
            p = Probe(it, bits, ev.per_token, ev.per_token / ar, round(ev.accept_rate, 4),
                      round(ev.mean_accepted, 4), ev.early_stopped,
                      round(time.perf_counter() - t, 3))
            probes.append(p)
            X.append(bits)
            y.append(-float(np.log(max(p.relative, 1e-9))))
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
    with open(log_path, "w") as log:
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
