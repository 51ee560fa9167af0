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
  the accepted path (hits[j]) over the steps that drafted (S):
      gain(n) = 1 + sum_{j<n} hits[j] / S
  i.e. the tree is trimmed by expected value in the trie's own priority order. Same pooled
  prior as chains (node j's prior rate is prior_accept ** (j + 1)).
- Confidence (chains): acceptance given the drafter's probability of its token, learnt over
  the run per bin of tenths (`calibrated`), each bin shrunk toward the pooled acceptance with
  `prior_weight` pseudo-trials, so it says nothing until the run has evidence. The policy's
  stop rule reads it (runtime/policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONF_BINS = 10


def conf_bin(conf: float) -> int:
    """A draft confidence's bin: tenths of [0, 1]."""
    return min(CONF_BINS - 1, max(0, int(conf * CONF_BINS)))


@dataclass
class AcceptStats:
    """Per-position acceptance counts: tried[j] / hit[j] for draft position (chain) or node
    index (tree) j; steps = verify steps that drafted (trees)."""
    tried: list[float] = field(default_factory=list)
    hit: list[float] = field(default_factory=list)
    steps: int = 0

    def _grow(self, n: int) -> None:
        while len(self.tried) < n:
            self.tried.append(0.0)
            self.hit.append(0.0)


class Acceptance:
    """Per-sequence (by key: its KV slot) and pooled acceptance estimates (module docstring)."""

    def __init__(self, max_budget: int, tree: bool, prior_accept: float = 0.7,
                 prior_weight: float = 4.0):
        self.K, self.tree = max_budget, tree
        self.prior_accept, self.prior_weight = prior_accept, prior_weight
        self.pool = AcceptStats()
        self.seqs: dict = {}
        self.calib = AcceptStats()   # chains: tried / hit by confidence bin (CONF_BINS)
        self._pooled: list[float] | None = None   # _pool_rate(0 .. K-1) until the next learn

    def _pool_rate(self, j: int) -> float:
        base = self.prior_accept ** (j + 1) if self.tree else self.prior_accept
        p = self.pool
        if j < len(p.tried) and p.tried[j]:
            if self.tree:
                return (p.hit[j] + self.prior_weight * base) / (p.steps + self.prior_weight)
            return (p.hit[j] + self.prior_weight * base) / (p.tried[j] + self.prior_weight)
        if not self.tree and j and any(p.tried[:j]):
            return self._pool_rate(max(i for i in range(min(j, len(p.tried))) if p.tried[i]))
        return base

    def rates(self, key) -> list[float]:
        """Chains: a_j (conditional acceptance of position j); trees: hits per step of node j."""
        if self._pooled is None:
            self._pooled = [self._pool_rate(j) for j in range(self.K)]
        st = self.seqs.get(key)
        if st is None:
            return list(self._pooled)
        out = []
        w = self.prior_weight
        for j, prior in enumerate(self._pooled):
            if j >= len(st.tried):
                out.append(prior)
            elif self.tree:
                out.append((st.hit[j] + w * prior) / (st.steps + w))
            else:
                out.append((st.hit[j] + w * prior) / (st.tried[j] + w))
        return out

    def gains(self, key, cap: int) -> list[float]:
        """gain(k) for k = 0..cap: expected emitted tokens with a budget of k."""
        g = [1.0]
        run = 1.0
        for a in self.rates(key)[:cap]:
            if self.tree:
                g.append(g[-1] + a)
            else:
                run *= a
                g.append(g[-1] + run)
        return g

    def pool_mean(self) -> float:
        """The run's pooled acceptance of a chain draft (any position), with its prior."""
        p, w = self.pool, self.prior_weight
        return (sum(p.hit) + w * self.prior_accept) / (sum(p.tried) + w)

    def calibrated(self, conf: float) -> float:
        """P(a chain draft is accepted | its predecessors were, its confidence `conf`)."""
        b = conf_bin(conf)
        c, w = self.calib, self.prior_weight
        if b < len(c.tried) and c.tried[b]:
            return (c.hit[b] + w * self.pool_mean()) / (c.tried[b] + w)
        return self.pool_mean()

    def learn(self, key, tried: int, accepted: list[int], confs: list[float] = ()) -> None:
        """One verified step of sequence `key`: `tried` draft positions (chains: its budget as
        spent, where a draft forward whose token the drafter's own exit dropped still counts;
        trees: the nodes verified), `accepted` node indices in path order, and (chains) the
        drafter's confidence of each draft."""
        if tried <= 0:
            return
        self._pooled = None
        if not self.tree and confs:
            c = self.calib
            c._grow(CONF_BINS)
            for j in range(min(tried, len(accepted) + 1, len(confs))):   # drafted and tried
                b = conf_bin(confs[j])
                c.tried[b] += 1
                c.hit[b] += j < len(accepted)
        st = self.seqs.get(key)
        if st is None:
            st = self.seqs[key] = AcceptStats()
        for s in (st, self.pool):
            s.steps += 1
            if self.tree:
                s._grow(tried)
                for j in range(tried):
                    s.tried[j] += 1
                for j in accepted:
                    if j < tried:
                        s.hit[j] += 1
            else:   # position j is tried when allowed and 1..j-1 accepted
                top = min(tried, len(accepted) + 1)
                s._grow(top)
                for j in range(top):
                    s.tried[j] += 1
                    if j < len(accepted):
                        s.hit[j] += 1

    def forget(self, key) -> None:
        self.seqs.pop(key, None)
