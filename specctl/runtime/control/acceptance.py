"""What each sequence's drafts are expected to add: acceptance learnt online, per position.

Expected emitted tokens of a step with draft budget k (gain):
- Chains (draft-verify, Kangaroo): with a_j the acceptance of draft position j given that
  positions 1..j-1 were accepted, a chain of k drafts emits in expectation
      gain(k) = 1 + sum_{i=1..k} P(first i accepted) = 1 + sum_{i=1..k} prod_{j<=i} a_j.
  The bonus token makes the 1: budget 0 still emits one token. a_j is estimated online per
  sequence and per position (accepted / tried at position j, where position j is "tried" when
  the budget allowed it and 1..j-1 were accepted: a draft the drafter's own confidence exit
  dropped after its draft forward ran is a miss, since the forward was paid for), shrunk
  toward the run's pooled estimate of the same position with `prior_weight` pseudo-trials,
  which itself starts from `prior_accept` with `prior_weight` pseudo-trials: a short sequence
  is never guessed blind, and a sequence that accepts more than the pool gets larger budgets
  as soon as its own counts say so. A chain position never tried yet takes the deepest tried
  position's pooled rate (a position's conditional acceptance varies little with depth).
- Trees (Self-Draft's trie of cache candidates, verified in node order): the accepted path's
  nodes have increasing indices (parents precede children), so a trie cut to its first n nodes
  keeps exactly the accepted nodes with index < n. Per node index j, how often node j was on
  the accepted path (hits[j]) over the steps whose budget allowed it (tried[j]), whether or
  not the drafter found that many nodes:
      gain(n) = 1 + sum_{j<n} hits[j] / tried[j]
  i.e. the tree is trimmed by expected value in the trie's own priority order, and a budget is
  priced by what it buys. (Counted only where found, a node's rate was its acceptance given
  that it exists: Self-Draft on the demo model finds no candidate in ~45% of its
  sequence-steps, and its budgets' gains read 1.4-2.1x the tokens their steps verified,
  bench-results/2026-11-30-tree-gain. A cold cache's first drafting step, where nothing can be
  found yet, counts too: left out, the demo model's runs drafted more and lost more at batch
  8-32, the same folder.) (Over every step that had a budget instead, a node past the usual
  budget, verified only in exploring steps, would read ~explore_every times too rare: a job
  cache's long right candidates stayed cut at the budget they started with.) Same pooled
  prior as chains (node j's prior rate is prior_accept ** (j + 1)).
- Confidence (chains): acceptance given the drafter's probability of its token, learnt over
  the run per bin of tenths (`calibrated`), each bin shrunk toward the pooled acceptance with
  `prior_weight` pseudo-trials, so it says nothing until the run has evidence. The policy's
  stop rule reads it (runtime/control/policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from statistics import NormalDist

import numpy as np

CONF_BINS = 10
SPREAD_MIN = 8       # finished sequences before their spread prices a fresh one
SPREAD_TRIALS = 4    # first-position trials a finished sequence needs to count
SPREAD_MAX = 256.0   # the most pseudo-trials the spread may stand for


def conf_bin(conf: float) -> int:
    """A draft confidence's bin: tenths of [0, 1] (a NaN from a broken forward: the first)."""
    return min(CONF_BINS - 1, max(0, int(conf * CONF_BINS))) if conf == conf else 0


@dataclass
class AcceptStats:
    """Per-position acceptance counts: tried[j] / hit[j] for draft position (chain) or node
    index (tree) j, tried meaning allowed by the budget (module docstring); steps = verify
    steps with a budget (trees)."""
    tried: np.ndarray
    hit: np.ndarray
    steps: int = 0


class Acceptance:
    """Per-sequence (by key: its KV slot) and pooled acceptance estimates (module docstring),
    kept as arrays (a row per sequence) so that a step's gains and learning are array
    operations over the batch."""

    def __init__(self, max_budget: int, tree: bool, prior_accept: float = 0.7,
                 prior_weight: float = 4.0):
        self.K, self.tree = max_budget, tree
        self.prior_accept, self.prior_weight = prior_accept, prior_weight
        width = max(1, max_budget)
        # row 0: no sequence (all zero: the pooled estimate); rows are reused after forget
        self.tried = np.zeros((1, width))
        self.hit = np.zeros((1, width))
        self.steps = np.zeros(1)
        self.grown = np.zeros(1, dtype=np.int64)   # positions ever tried (trees' prior rule)
        self.rows: dict = {}
        self.free: list[int] = []
        self.pool = AcceptStats(np.zeros(width), np.zeros(width))
        self.calib = AcceptStats(np.zeros(CONF_BINS), np.zeros(CONF_BINS))   # chains
        self._pooled: np.ndarray | None = None   # the pool's rates until the next learn
        self._gains = None   # (keys, gains_many's answer), until the next learn
        # finished sequences' first-position rates (count, sum, sum of squares, sum of their
        # binomial variances): how far apart the run's sequences are (spread_weight)
        self.done = np.zeros(4)

    def _pool_rates(self) -> np.ndarray:
        """The pool's rate of each position: its counts with prior_accept's pseudo-trials;
        a chain position never tried takes the deepest tried one's before it."""
        if self._pooled is not None:
            return self._pooled
        j = np.arange(len(self.pool.tried))
        base = self.prior_accept ** (j + 1) if self.tree else np.full(len(j), self.prior_accept)
        p, w = self.pool, self.prior_weight
        seen = p.tried > 0
        r = np.where(seen, (p.hit + w * base) / (p.tried + w), base)
        if not self.tree:
            last = np.maximum.accumulate(np.where(seen, j, -1))   # deepest tried at or before
            r = np.where(~seen & (last >= 0), r[np.maximum(last, 0)], r)
        self._pooled = r
        return r

    def rates_many(self, keys, z: float | None = None) -> np.ndarray:
        """[B, K]: chains a_j (conditional acceptance of position j); trees hits per step of
        node j; for each key. z: not the estimate but that many standard deviations of it
        away (a normal approximation of its Beta posterior; z < 0: a pessimistic quantile)."""
        prior = self._pool_rates()[None, :]
        rows = np.array([self.rows.get(k, 0) for k in keys], dtype=np.int64)
        w = self.prior_weight
        hit, n = self.hit[rows], self.tried[rows]
        if z is None:
            return (hit + w * prior) / (n + w)
        W = self.spread_weight()   # (the centre shrunk as far as the width: a lucky short
        r = (hit + (W - 1) * prior) / (n + W - 1)   # history is no surer than the pool)
        return np.clip(r + z * np.sqrt(r * (1 - r) / (n + W)), 0.0, 1.0)

    def spread_weight(self) -> float:
        """The trials a sequence's acceptance is known by before any of its own: the prior's
        prior_weight + 1, or, once SPREAD_MIN sequences have finished with SPREAD_TRIALS
        first-position trials each, m(1 - m) / tau^2, tau^2 the variance of their rates less
        what their own counts explain (empirical Bayes). Sequences of a run that accept alike
        (one task, one drafter) make a fresh one's quantile near the pool's; a run whose
        sequences spread from 0 to 0.95 keeps it far below (the drain's slowest: a fresh
        sequence admitted last is priced like those before it, not like nothing known)."""
        k, sx, sxx, noise = self.done
        floor = self.prior_weight + 1
        if k < SPREAD_MIN:
            return floor
        m = sx / k
        tau2 = sxx / k - m * m - noise / k
        if tau2 <= 0:
            return SPREAD_MAX
        return float(min(SPREAD_MAX, max(floor, m * (1 - m) / tau2)))

    def gains_many(self, keys, slowest: int = 1) -> np.ndarray:
        """[B, K + 1]: gains[i, k] = expected emitted tokens of key i with a budget of k. (A
        cap is the caller's: gain(k) for k up to a cap does not depend on it.) Read-only: the
        same array is handed out again while nothing is learnt (a batch the controller keeps
        at budget 0 learns nothing, and its steps should cost the host next to nothing).
        slowest = m > 1: for the slowest of m sequences (a draining batch, whose job ends with
        its slowest), each key's acceptance at the 1 / (m + 1) quantile of what is known of
        it rather than its mean: the pool's mean is no one's floor. With nothing known, the
        prior's quantile (0.7, 4 pseudo-trials) is ~0.56 for m = 3, ~0.32 for m = 32 (where
        drafting at the mean cost 3% on the H100's table, batch 32, acceptance spread 0 to
        0.95, while the slowest gained nothing); a sequence's own evidence narrows it, and so
        do finished sequences that accepted alike (spread_weight)."""
        keys = tuple(keys)
        if self._gains is None or self._gains[0] != (keys, slowest):
            z = NormalDist().inv_cdf(1 / (slowest + 1)) if slowest > 1 else None
            r = self.rates_many(keys, z)[:, :self.K]
            out = np.empty((len(r), r.shape[1] + 1))
            out[:, 0] = 0.0
            np.cumsum(r if self.tree else np.cumprod(r, axis=1, out=r), axis=1, out=out[:, 1:])
            out += 1.0
            out.flags.writeable = False
            self._gains = ((keys, slowest), out)
        return self._gains[1]

    def gains(self, key, cap: int) -> list[float]:
        """gain(k) for k = 0..cap of one key."""
        return self.gains_many([key])[0, :cap + 1].tolist()

    def pool_mean(self) -> float:
        """The run's pooled acceptance of a chain draft (any position), with its prior."""
        p, w = self.pool, self.prior_weight
        return float((p.hit.sum() + w * self.prior_accept) / (p.tried.sum() + w))

    def calibrated(self, conf: float) -> float:
        """P(a chain draft is accepted | its predecessors were, its confidence `conf`)."""
        b = conf_bin(conf)
        c, w = self.calib, self.prior_weight
        if c.tried[b]:
            return float((c.hit[b] + w * self.pool_mean()) / (c.tried[b] + w))
        return self.pool_mean()

    def _row(self, key) -> int:
        r = self.rows.get(key)
        if r is None:
            if self.free:
                r = self.free.pop()
            else:
                r = len(self.steps)
                grow = max(1, r)
                self.tried = np.concatenate((self.tried, np.zeros((grow, self.tried.shape[1]))))
                self.hit = np.concatenate((self.hit, np.zeros((grow, self.hit.shape[1]))))
                self.steps = np.concatenate((self.steps, np.zeros(grow)))
                self.grown = np.concatenate((self.grown, np.zeros(grow, dtype=np.int64)))
                self.free = list(range(len(self.steps) - 1, r, -1))
            self.rows[key] = r
        return r

    def learn_many(self, keys, tried, accepted, confs=None) -> None:
        """A verified step of each sequence keys[i]: tried[i] draft positions (chains: its
        budget as spent, where a draft forward whose token the drafter's own exit dropped still
        counts; trees: the nodes its budget allowed), accepted[i] its accepted node indices in
        path order, and (chains) confs[i] the drafter's confidence of each draft."""
        width = self.tried.shape[1]
        pick = [i for i, t in enumerate(tried) if t > 0]
        if not pick:
            return
        self._pooled = self._gains = None
        if len(pick) == 1:   # (one sequence: slices, a third of the array calls)
            i = pick[0]
            return self._learn_one(self._row(keys[i]), min(tried[i], width), accepted[i],
                                   confs[i] if confs else None)
        rows = np.array([self._row(keys[i]) for i in pick], dtype=np.int64)
        t = np.minimum(np.array([tried[i] for i in pick]), width)
        n_acc = np.array([len(accepted[i]) for i in pick])
        pos = np.arange(width)[None, :]
        top = t if self.tree else np.minimum(t, n_acc + 1)   # chains: j tried when 1..j-1 hit
        tried_m = pos < top[:, None]
        if self.tree:
            hit_m = np.zeros_like(tried_m)
            seq = np.repeat(np.arange(len(pick)), n_acc)
            nodes = np.array([j for i in pick for j in accepted[i]], dtype=np.int64)
            keep = nodes < t[seq]
            hit_m[seq[keep], nodes[keep]] = True
        else:
            hit_m = pos < n_acc[:, None]
            if confs:
                self._calibrate([confs[i] for i in pick], top, n_acc)
        self.tried[rows] += tried_m
        self.hit[rows] += hit_m
        self.steps[rows] += 1
        self.grown[rows] = np.maximum(self.grown[rows], top)
        p = self.pool
        p.tried += tried_m.sum(0)
        p.hit += hit_m.sum(0)
        p.steps += len(pick)

    def _learn_one(self, r: int, t: int, accepted: list[int], confs) -> None:
        """learn_many's counts for one sequence (row r, t positions tried)."""
        p = self.pool
        if self.tree:
            top, hits = t, [j for j in accepted if j < t]
        else:
            top, hits = min(t, len(accepted) + 1), slice(0, len(accepted))
            c = self.calib
            for j, conf in enumerate(confs[:top] if confs else ()):   # (_calibrate's counts)
                b = conf_bin(conf)
                c.tried[b] += 1
                c.hit[b] += j < len(accepted)
        self.tried[r, :top] += 1
        self.hit[r, hits] += 1
        self.steps[r] += 1
        self.grown[r] = max(self.grown[r], top)
        p.tried[:top] += 1
        p.hit[hits] += 1
        p.steps += 1

    def _calibrate(self, confs, top, n_acc) -> None:
        """Tried / hit per confidence bin of the chain drafts that were drafted and tried."""
        cut = [cs[:tp] for cs, tp in zip(confs, top.tolist())]
        lens = np.array([len(c) for c in cut])
        if not lens.sum():
            return
        conf = np.fromiter(chain.from_iterable(cut), dtype=np.float64, count=int(lens.sum()))
        j = np.arange(len(conf)) - np.repeat(np.cumsum(lens) - lens, lens)   # draft position
        bins = np.clip((conf * CONF_BINS).astype(np.int64), 0, CONF_BINS - 1)   # (conf_bin)
        self.calib.tried += np.bincount(bins, minlength=CONF_BINS)
        self.calib.hit += np.bincount(bins, weights=j < np.repeat(n_acc, lens),
                                      minlength=CONF_BINS)

    def learn(self, key, tried: int, accepted: list[int], confs: list[float] = ()) -> None:
        """learn_many of one sequence."""
        self.learn_many([key], [tried], [accepted], [list(confs)])

    def seq_stats(self, key) -> AcceptStats:
        """A sequence's counts, over the positions it ever tried."""
        r = self.rows.get(key, 0)
        n = int(self.grown[r])
        return AcceptStats(self.tried[r, :n].copy(), self.hit[r, :n].copy(), int(self.steps[r]))

    def forget(self, key) -> None:
        self._gains = None
        r = self.rows.pop(key, None)
        if r is not None:
            n = self.steps[r] if self.tree else self.tried[r, 0]
            if n >= SPREAD_TRIALS:
                x = self.hit[r, 0] / n
                self.done += (1.0, x, x * x, x * (1 - x) / n)
            self.tried[r], self.hit[r], self.steps[r], self.grown[r] = 0, 0, 0, 0
            self.free.append(r)
