"""The goodput controller: how many draft tokens each sequence gets this step (issue 16).

Speculation pays only while verifying the extra tokens (and drafting them) costs less than
the tokens it is expected to add. Every step the controller gives each running sequence a
draft budget k_i in [0, K] (K: the method's maximum; k_i = 0 is an `ar` step for that
sequence) that maximizes the goodput of the whole step:

    goodput(k) = E[emitted tokens of the step] / predicted step ms
               = sum_i gain_i(k_i) / cost(k_1 .. k_B)

Expected emitted tokens (gain)
- Chain drafters (draft-verify, Kangaroo): with a_j the acceptance of draft position j given
  that positions 1..j-1 were accepted, a chain of k drafts emits in expectation
      gain(k) = 1 + sum_{i=1..k} P(first i accepted) = 1 + sum_{i=1..k} prod_{j<=i} a_j.
  The bonus token makes the 1: budget 0 still emits one token. a_j is estimated online per
  sequence and per position (accepted / tried at position j, where position j is "tried" when
  the budget allowed it and 1..j-1 were accepted: a draft the drafter's own confidence exit
  dropped after its draft forward ran is a miss, since the forward was paid for), shrunk
  toward the run's pooled estimate of the same position with `prior_weight` pseudo-trials,
  which itself starts from `prior_accept` with `prior_weight` pseudo-trials: a short sequence
  is never guessed blind, and a sequence that accepts more than the pool gets larger budgets
  as soon as its own counts say so.
  The budget is a cap, chosen before anything is drafted. While drafting, each chain draft's
  confidence c (the drafter's probability of its token) updates the sequence's prospects:
  acceptance given confidence is learnt online over the run (`calib`: accepted / tried per
  confidence bin of tenths, each bin shrunk toward the run's pooled acceptance with
  `prior_weight` pseudo-trials, so it says nothing until the run has evidence). A draft of
  confidence c is r(c) = calib(c) / pooled times as likely to be accepted as the average one,
  so after its j-th draft a sequence's first j drafts are all accepted with probability
  q_j = min(1, P_j * r(c_1) ... r(c_j)) (P_j: its own positional estimate, the search's), and
  drafting on to its budget k adds q_j / P_j * (gain(k) - gain(j)) expected tokens. It stops
  (`stop_rule`) when that is less than the step's goodput times what stopping saves
  (cost(k) - cost(j) with the other budgets as planned): a low-confidence draft ends the chain
  early, its further draft forwards and verify rows unspent. (The drafter's own confidence
  exit, the paper's threshold, still applies too.) Not in an exploring step: its extra drafts
  are there to be measured.
- Trees (Self-Draft's trie of cache candidates, verified in node order): the accepted path's
  nodes have increasing indices (parents precede children), so a trie cut to its first n nodes
  keeps exactly the accepted nodes with index < n. The controller counts, per node index j,
  how often node j was on the accepted path (hits[j]) over the steps that drafted (S):
      gain(n) = 1 + sum_{j<n} hits[j] / S
  i.e. the tree is trimmed by expected value in the trie's own priority order (candidate
  rank = expected value order). Same pooled prior as chains (node j's prior rate is
  prior_accept ** (j + 1)). A sequence's branches (the probe) run only when k_i > 0, and count
  against the step cost (below); at k_i = 0 they are dropped (an `ar` step). Their value is
  not modelled (it comes later, as n-grams for the context cache), so they run only where they
  are nearly free: in a step whose probes would cost more than `probe_share` (10%) over the
  same step without them, no sequence runs its probe (`probe_on`; the runner drops them). On a
  2-core CPU 36 branch tokens double a batch-1 step; on the H100 they cost little at batch 1.

Predicted step time (cost), from the step-cost table (engine/steptable.py: StepTable.ms(b, n) =
ms of one verify step of b sequences with n new tokens each) and the method's draft cost:
    cost(k) = verify_frac * verify_ms + sum_{d=1..D} draft_frac * table.ms(n_d, 1)
- verify_ms: with n_i = 1 + k_i (+ probe tokens when k_i > 0) the tokens sequence i puts into
  the verify forward,
    padded (CUDA: the captured graphs pad every sequence to a common bucket n):
        verify_ms = table.ms(B, max_i n_i)
    packed (CPU: no padding, cost follows the total packed tokens, the matmuls dominate):
        verify_ms = table.ms(B, sum_i n_i / B)      (the batch-B row at the mean tokens)
  The CPU row is read at a fractional n (linear interpolation), which is the total-token model
  while keeping the measured per-sequence attention overhead of batch B, after rounding the
  rows up to the tile they cost (StepTable.ms, tile_rows): at batch 8 one draft token makes
  9 rows and costs what 16 do, so a CPU step's cost is a staircase in its total tokens.
- draft forwards: drafting runs in lockstep, one forward per draft depth over the sequences
  still drafting; n_d = #{i: k_i + extra >= d} sequences are in the d-th forward. For
  draft-verify extra = 0 (budget 0: no draft forward at all), draft_frac = the share of the
  model's weights (blocks kept + LM head) the skip set runs. For Kangaroo extra = 1 (the
  shallow forward of the pending token always runs: the verify starts at its layer-l states),
  draft_frac = (l layers + adapter + head) / model, verify_frac = (L - l layers + head) / model;
  its last shallow forward drafts nothing when no sequence has budget left, and then costs only
  the l layers (tail_frac: the adapter's KV rows are written without its attention or head).
  Self-Draft's host work per candidate is negligible against a forward (not modelled).
Measured against predicted: the table is measured once, on an idle moment, at one context
length, and prices the model's forwards only; a run's steps also pay the drafter's host
work, attention over longer contexts, and whatever else shares the machine (on the 2-core CPU
the same batch-8 step timed 67 ms in one minute and 100 the next, and the cost of a draft
token for each sequence moved from +40% to +10% of it). So every step's measured ms is fed
back (`timed`, StepCost.learn): x = log(measured / table ms) is modelled as a drift (what
every step costs beyond the table now: the last ~16 steps) plus a class (whether the step
drafts) plus a kind (its batch size, the table point its verify is priced at, its draft
forwards), the last two learnt over their last ~64 steps each and shrunk toward 0 with 2
steps, so a kind never run is priced by the drift and its class; a step more than twice off
its expected cost counts as twice (one page-in must not price a kind for a dozen steps),
but for the first of its class. The predicted cost of a step is the table's times exp(x): a
stair of drafts that turns out dearer than the table says is priced at what it costs, and
drafted less. (A uniform drift changes no decision: only ratios between kinds do.) Classes
and kinds are learnt only from steps that run, and a run that drafts in every step never
times a step without drafts, the one it must beat (on the 2-core CPU at batch 8 the table
had a draft token for each sequence at +10%, and every step drafted): so, once steps are
timed, after 2, 4, 8 and 16 drafting steps in a row and then every `explore_every` (32; 0:
never), one step runs without drafts (a contrast step; early ones come sooner as one step's
timing is noisy and a short run must learn the contrast too). Past the first ~30 steps that
costs at most the speculation's gain in one step of 32.

Exploration: a sequence at budget 0 drafts nothing, so nothing new is learnt about it, and an
estimate that once ruled drafting out would rule it out for good (a sequence that turns
repetitive later, a pooled prior that was too low). So every `explore_every` steps (default 32)
every sequence with room gets `explore_budget` more drafts (chains 2, trees 4 nodes) than the
search gave it, in that one step (budget 0 sequences learn their first positions, drafting
ones the next deeper; a chain position never tried takes the deepest tried position's pooled
rate): all of them in the same step, because with padded graphs a step costs by its
longest sequence, so one exploring sequence would cost as much as all. Its price is held to
`explore_cost` (2%) of the steps it is spread over: an exploring step whose predicted extra
cost is e steps waits at least e / explore_cost steps after the last one (on a 2-core CPU at
batch 1 two layer-skip draft forwards cost ~2 steps, so it explores every ~100 steps; on the
H100's demo-model table, batch 32, n 1 -> 5 costs ~0.7 of a step, so every 35), and part of it
comes back as accepted drafts. The measured acceptance then updates the sequence's own
estimate, and the next steps' search uses it.

The table is measured on first use (a small grid, a few seconds), or ahead by `specctl
prepare`, and kept in the store, per model, device, dtype, attention backend and batch size:
`step_table_for`. It is the one cost profile: search-skip and train-adapter's exit-layer sweep
price on the batch-1 table with the same shares (skip_draft_frac, kangaroo_cost).

Search. By the best prefix (`_fill`): every draft token of every sequence in the order of the
tokens it is expected to add (each sequence's upper concave hull of gain(k), steepest
first), and the prefix of that order with the best goodput taken. On a staircase cost (the
CPU's tiles) no single draft pays for the first stair while a stair's worth of them may,
which a one-change-at-a-time search never finds. Greedy marginal goodput (`_greedy`):
start from k = 0; each round, for every sequence, try raising its budget to every larger
value (a jump, not only +1: the first draft forward is paid once and shared, so goodput is
not concave in one sequence's k), keep the single change with the highest goodput, stop
when none improves it. Where the step is priced by its total tokens alone (unpadded steps
without draft forwards or probes: Self-Draft on the CPU, or on CUDA without graphs) the
prefix search runs alone (exact there for concave gains); unpadded steps with draft forwards
or probes take the better of the two; padded steps (CUDA graphs: a step costs by its
longest sequence's bucket) the greedy search. Either way a steep verify cost gives every
sequence 0 (exactly `ar`'s steps); a flat one gives the full budget; in a mixed batch the
sequences that accept more get larger budgets.
"""

from __future__ import annotations

import json
import math
import platform
import re
import time
from dataclasses import dataclass, field

import torch

from specctl.engine.steptable import ENGINE_COSTS, StepTable, measure_step_table
from specctl.store import atomic_write_json, make_manifest


@dataclass
class StepCost:
    """Predicted ms of one step from the step-cost table and the method's draft cost, corrected
    online by what the run's steps measure (`learn`, module docstring)."""
    table: StepTable
    padded: bool = False
    verify_frac: float = 1.0   # share of a full step the verify forward costs (Kangaroo < 1)
    draft_frac: float = 0.0    # one draft forward of b sequences = draft_frac * table.ms(b, 1)
    draft_extra: int = 0       # draft forwards a sequence runs beyond its budget (Kangaroo: 1)
    tail_frac: float | None = None   # a draft forward in which no sequence drafts (Kangaroo's
                                     # last, shallow layers only); None: draft_frac
    probe: int = 0             # probe tokens a speculating sequence adds (Self-Draft's branches)
    probe_on: bool = True      # whether this step's speculating sequences run their probes
    idle_whole: bool = False   # a step with no drafts is one plain forward (Kangaroo, eager)
    drift: float = 0.0         # log(measured / table ms) common to every step now (learn)
    steps: int = 0             # steps learnt from
    scale: dict = field(default_factory=dict, repr=False)   # a class of step (whether it
                     # drafts) or a kind (table_ms) -> [its log ratio beyond the drift, steps]
    _memo: dict = field(default_factory=dict, repr=False)

    def ms(self, b: int, n: float) -> float:
        key = (b, n)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = self.table.ms(b, n)
        return v

    def tokens(self, k: int) -> int:
        return 1 + k + (self.probe if k > 0 and self.probe_on else 0)

    def table_ms(self, ks: list[int]) -> tuple[float, tuple]:
        """(the table's ms of a step with budgets ks, the kind of step: its batch size, the
        table point its verify is priced at, its draft forwards, whether anything drafts)."""
        b = len(ks)
        if not b:
            return 0.0, ()
        if self.padded:
            v = self.ms(b, max(self.tokens(k) for k in ks))
        else:
            v = self.ms(b, sum(self.tokens(k) for k in ks) / b)
        if self.idle_whole and not any(ks):
            return v, step_kind(b, v, -1, False)
        total = self.verify_frac * v
        depth = 0
        if self.draft_frac:
            depth = max(ks) + self.draft_extra
            top = max(ks)
            for d in range(1, depth + 1):
                n_d = sum(1 for k in ks if k + self.draft_extra >= d)
                frac = self.draft_frac if d <= top or self.tail_frac is None else self.tail_frac
                total += frac * self.ms(n_d, 1)
        return total, step_kind(b, v, depth, any(ks))

    def _rel(self, key) -> float:
        s = self.scale.get(key)
        if s is None:
            return 0.0
        n = min(s[1], 4 * SCALE_MEMORY)
        return s[0] * n / (n + SCALE_PRIOR)

    def factor(self, kind: tuple) -> float:
        """measured / table ms expected of a step of this kind (learn)."""
        return math.exp(self.drift + self._rel(kind[3:]) + self._rel(kind))

    def step_ms(self, ks: list[int]) -> float:
        ms, kind = self.table_ms(ks)
        return ms * self.factor(kind) if ms else 0.0

    def learn(self, ks: list[int], measured_ms: float) -> None:
        """A step with budgets ks took measured_ms; x = log(measured / table ms) is modelled
        as drift + class + kind:
        - the drift, what every step costs beyond the table now (the machine's state, the
          context length): a moving average of x less the other two over the last
          ~SCALE_MEMORY steps;
        - the class (whether the step drafts: the drafter's host work, what the table's
          drafting points misprice) and the kind (table_ms: batch size, table point, draft
          forwards): moving averages of what is left of x over their last ~4 x SCALE_MEMORY
          steps, each shrunk toward 0 with SCALE_PRIOR steps, so a kind never run is priced
          by the drift and its class.
        In logs, and a step more than twice off what it was expected to cost counts as twice
        (one step that hit a page-in or a neighbour's burst must not price its kind for the
        next dozen), unless its class has never been timed: a contrast step's first timing
        is the news it was run for."""
        ms, kind = self.table_ms(ks)
        if not ms > 0 or not measured_ms > 0:
            return
        cls = kind[3:]
        x = math.log(measured_ms / ms)
        if cls in self.scale:
            e = math.log(self.factor(kind))
            x = min(e + math.log(2), max(e - math.log(2), x))
        self.steps += 1
        self.drift += (x - self._rel(cls) - self._rel(kind) - self.drift) / \
            min(self.steps, SCALE_MEMORY)
        x -= self.drift
        for key in (cls, kind):
            s = self.scale.setdefault(key, [0.0, 0])
            s[1] += 1
            s[0] += (x - s[0]) / min(s[1], 4 * SCALE_MEMORY)
            x -= self._rel(key)


def step_kind(b: int, verify_ms: float, depth: int, drafts: bool) -> tuple:
    """The kind of a step StepCost.learn prices apart: its batch size, the table point its
    verify is priced at, its draft forwards (-1: one plain forward), whether anything drafts
    (the last, alone, is its class)."""
    return b, round(verify_ms, 3), depth, drafts


SCALE_PRIOR = 2      # steps of no difference a class's or kind's own ratio is shrunk with
SCALE_MEMORY = 16    # steps the drift averages over (a class's or kind's ratio: 4x as many)


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


class Controller:
    """Per-sequence, per-step draft budgets (see the module docstring).

        ctl = Controller(cost, max_budget=12, tree=False)
        ks = ctl.budgets(keys, room)          # keys: one hashable per running sequence
        ... draft within ks, verify ...
        ctl.observe(keys, drafted, accepted)  # drafted: nodes verified; accepted: node indices
        ctl.forget(key)                       # when a sequence leaves its slot
    """

    def __init__(self, cost: StepCost, max_budget: int, *, tree: bool = False,
                 prior_accept: float = 0.7, prior_weight: float = 4.0, explore_every: int = 32,
                 explore_budget: int | None = None, explore_cost: float = 0.02,
                 probe_share: float = 0.1):
        if max_budget < 0:
            raise ValueError("max_budget must be >= 0")
        self.cost, self.K, self.tree = cost, max_budget, tree
        self.prior_accept, self.prior_weight = prior_accept, prior_weight
        self.explore_every = explore_every   # 0: never explore
        self.explore_budget = explore_budget if explore_budget is not None else (4 if tree else 2)
        self.explore_cost = explore_cost
        self.probe_share = probe_share
        self.last_explore = 0
        self.last_bare = 0     # the last step without drafts
        self.contrasts = 0     # steps run without drafts to measure them (contrast steps)
        self.steps = 0
        self.explored = 0   # sequence-steps given an exploration budget
        self.pool = AcceptStats()
        self.seqs: dict = {}
        self.calib = AcceptStats()   # chains: tried / hit by confidence bin (CONF_BINS)
        self.plan: tuple | None = None   # the last budgets' (gains, ms) for stop_rule
        self.conf_stops = 0   # chains ended early by stop_rule
        self.last_ks: list[int] = []   # the last budgets, cut where stop_rule ended a chain
                                       # (what observe learns against)
        # reporting
        self.hist: dict[int, int] = {}
        self.predicted_ms = 0.0
        self.last_predicted = 0.0
        self.last_gain = 0.0   # the last budgets' expected emitted tokens

    # -- estimates ----------------------------------------------------------------------------
    def _pool_rate(self, j: int) -> float:
        base = self.prior_accept ** (j + 1) if self.tree else self.prior_accept
        p = self.pool
        if j < len(p.tried) and p.tried[j]:
            if self.tree:
                return (p.hit[j] + self.prior_weight * base) / (p.steps + self.prior_weight)
            return (p.hit[j] + self.prior_weight * base) / (p.tried[j] + self.prior_weight)
        if not self.tree and j and any(p.tried[:j]):
            # a chain position never tried yet: as likely as the deepest one tried (a position's
            # conditional acceptance varies little with depth), not the blind prior
            return self._pool_rate(max(i for i in range(min(j, len(p.tried))) if p.tried[i]))
        return base

    def rates(self, key) -> list[float]:
        """Chains: a_j (conditional acceptance of position j); trees: hits per step of node j."""
        st = self.seqs.get(key)
        out = []
        w = self.prior_weight
        for j in range(self.K):
            prior = self._pool_rate(j)
            if st is None or j >= len(st.tried):
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

    def _pool_mean(self) -> float:
        """The run's pooled acceptance of a chain draft (any position), with its prior."""
        p, w = self.pool, self.prior_weight
        return (sum(p.hit) + w * self.prior_accept) / (sum(p.tried) + w)

    def calibrated(self, conf: float) -> float:
        """P(a chain draft is accepted | its predecessors were, its confidence `conf`)."""
        b = conf_bin(conf)
        c, w = self.calib, self.prior_weight
        if b < len(c.tried) and c.tried[b]:
            return (c.hit[b] + w * self._pool_mean()) / (c.tried[b] + w)
        return self._pool_mean()

    # -- the decision ---------------------------------------------------------------------------
    def budgets(self, keys: list, room: list[int]) -> list[int]:
        c = self.cost
        if c.probe and keys:   # probes only where they cost next to nothing (module docstring)
            one = [1] * len(keys)
            c.probe_on = False
            bare = c.step_ms(one)
            c.probe_on = True
            c.probe_on = c.step_ms(one) <= (1 + self.probe_share) * bare
        caps = [max(0, min(self.K, r)) for r in room]
        gains = [self.gains(k, c) for k, c in zip(keys, caps)]
        if c.padded:
            ks = self._greedy(gains, caps)
        elif not c.draft_frac and not (c.probe and c.probe_on):
            ks = self._fill(gains, caps)
        else:   # a staircase with draft forwards or probes on it: the better of the two

            def good(ks):
                t = c.step_ms(ks)
                return sum(g[k] for g, k in zip(gains, ks)) / t if t > 0 else 0.0
            ks = max(self._fill(gains, caps), self._greedy(gains, caps), key=good)
        self.steps += 1
        since = self.steps - self.last_explore
        if self.explore_every and since >= self.explore_every:
            wide = [min(c, k + self.explore_budget) for k, c in zip(ks, caps)]
            base = self.cost.step_ms(ks)
            if self.cost.step_ms(wide) - base <= self.explore_cost * since * base:
                self.explored += sum(w > k for w, k in zip(wide, ks))
                ks, self.last_explore = wide, self.steps
        if any(ks) and self.explore_every and self.cost.steps \
                and self.last_explore != self.steps \
                and self.steps - self.last_bare > min(self.explore_every,
                                                      2 ** (self.contrasts + 1)):
            ks = [0] * len(ks)   # a contrast step (module docstring)
            self.contrasts += 1
        if not any(ks):
            self.last_bare = self.steps
        self.last_predicted = self.cost.step_ms(ks)
        self.predicted_ms += self.last_predicted
        self.last_gain = sum(g[k] for g, k in zip(gains, ks))
        self.last_ks = list(ks)
        explored = self.last_explore == self.steps
        self.plan = None if self.tree or explored or not any(ks) else \
            (gains, self.last_predicted)
        for k in ks:
            self.hist[k] = self.hist.get(k, 0) + 1
        return ks

    def _greedy(self, gains: list[list[float]], caps: list[int]) -> list[int]:
        """Greedy marginal goodput over jumps (the module docstring's search)."""
        ks = [0] * len(gains)
        emitted = float(len(gains))
        t = self.cost.step_ms(ks)
        best = emitted / t if t > 0 else 0.0
        while True:
            pick = None
            for i, (g, c) in enumerate(zip(gains, caps)):
                k0 = ks[i]
                for k in range(k0 + 1, c + 1):
                    ks[i] = k
                    tt = self.cost.step_ms(ks)
                    good = (emitted + g[k] - g[k0]) / tt if tt > 0 else 0.0
                    if good > best * (1 + 1e-9):
                        best, pick = good, (i, k)
                ks[i] = k0
            if pick is None:
                return ks
            i, k = pick
            emitted += gains[i][k] - gains[i][ks[i]]
            ks[i] = k

    def _fill(self, gains: list[list[float]], caps: list[int]) -> list[int]:
        """The budgets by the best prefix (module docstring): every draft token of every
        sequence in the order of the tokens it is expected to add (each sequence's upper
        concave hull of gain(k), steepest first, so a sequence's own tokens stay in order),
        and the prefix of that order with the best goodput. For each total it is the
        allocation with the most expected tokens (exactly so for concave gains: chains, and
        trees whose earlier nodes hit more)."""
        units = []   # (tokens per draft token of its hull segment, sequence, budget)
        for i, (g, cap) in enumerate(zip(gains, caps)):
            hull = [0]   # the upper concave hull of (k, g[k]), k = 0..cap (monotone chain)
            for k in range(1, cap + 1):
                while len(hull) > 1 and (g[hull[-1]] - g[hull[-2]]) * (k - hull[-1]) <= \
                        (g[k] - g[hull[-1]]) * (hull[-1] - hull[-2]):
                    hull.pop()
                hull.append(k)
            top = math.inf
            for a, z in zip(hull, hull[1:]):
                top = min(top, (g[z] - g[a]) / (z - a))   # falling, whatever the rounding
                units += [(top, i, k) for k in range(a + 1, z + 1)]
        units.sort(key=lambda u: -u[0])   # stable: a sequence's tokens stay in order
        c, b = self.cost, len(gains)
        # with nothing but the verify to price, the cost follows the total tokens: O(1) a token
        packed = not c.padded and not c.draft_frac and not (c.probe and c.probe_on)
        ks = [0] * b
        emitted = float(b)
        t = c.step_ms(ks)
        best, take = (emitted / t if t > 0 else 0.0), 0
        for n, (_, i, k) in enumerate(units, 1):
            emitted += gains[i][k] - gains[i][k - 1]
            ks[i] = k
            if packed:
                v = c.ms(b, (b + n) / b)
                t = c.verify_frac * v * c.factor(step_kind(b, v, 0, True))
            else:
                t = c.step_ms(ks)
            if t > 0 and emitted / t > best * (1 + 1e-9):
                best, take = emitted / t, n
        ks = [0] * b
        for _, i, k in units[:take]:
            ks[i] = k
        return ks

    def stop_rule(self):
        """For the drafter of this step's chains (after budgets): stop(i, j, conf) -> whether
        sequence i (in the order budgets had them), having drafted j tokens the last of which
        had confidence `conf`, should draft no more (module docstring). None when there is
        nothing to decide (trees, an exploring step, every budget 0)."""
        if self.plan is None:
            return None
        gains, ms = self.plan
        ks = self.last_ks   # cut in place where a chain stops (and last_gain with it)
        ratio = [1.0] * len(ks)   # prod r(c) of each sequence's drafts so far

        def stop(i: int, j: int, conf: float) -> bool:
            nonlocal ms
            ratio[i] *= self.calibrated(conf) / self._pool_mean()
            k = ks[i]
            if j >= k or ms <= 0:
                return j >= k
            g = gains[i]
            # P_j: the positional model's probability that the first j drafts are accepted
            p_j = g[j] - g[j - 1] if j >= 1 else 1.0
            tail = min(1.0, p_j * ratio[i]) / p_j * (g[k] - g[j]) if p_j > 0 else 0.0
            shorter = ks[:i] + [j] + ks[i + 1:]
            saved = ms - self.cost.step_ms(shorter)
            if tail >= self.last_gain / ms * saved:
                return False
            # the plan without sequence i's rest: later decisions price against it
            self.last_gain -= g[k] - g[j]
            ms -= saved
            ks[i] = j
            self.conf_stops += 1
            return True
        return stop

    # -- learning ---------------------------------------------------------------------------------
    def observe(self, keys: list, drafted: list[int], accepted: list[list[int]],
                confs: list[list[float]] | None = None,
                attempted: list[bool] | None = None) -> None:
        """drafted[i]: nodes verified for sequence i this step; accepted[i]: the accepted node
        indices (in path order); confs[i] (chains): the drafter's confidence of each draft;
        attempted[i] (chains): whether the sequence ran draft forwards this step.

        With `attempted`, a chain is learnt against its budget, not against what it drafted:
        a draft forward whose token the drafter's own confidence exit dropped was paid for and
        added nothing, so the position counts as tried and missed (else a drafter that exits
        at once would keep its budget forever, paying a draft forward a step for no tokens).
        A chain that stop_rule ended is learnt up to where it ended."""
        for i, (key, n, acc) in enumerate(zip(keys, drafted, accepted)):
            if not self.tree and attempted is not None and i < len(self.last_ks):
                n = max(n, self.last_ks[i] if attempted[i] else 0)
            if n <= 0:
                continue
            if not self.tree and confs is not None:
                c = self.calib
                c._grow(CONF_BINS)
                for j in range(min(n, len(acc) + 1, len(confs[i]))):   # drafted and tried
                    b = conf_bin(confs[i][j])
                    c.tried[b] += 1
                    c.hit[b] += j < len(acc)
            st = self.seqs.get(key)
            if st is None:
                st = self.seqs[key] = AcceptStats()
            for s in (st, self.pool):
                s.steps += 1
                if self.tree:
                    s._grow(n)
                    for j in range(n):
                        s.tried[j] += 1
                    for j in acc:
                        if j < n:
                            s.hit[j] += 1
                else:
                    # position j is tried when allowed and 1..j-1 accepted
                    top = min(n, len(acc) + 1)
                    s._grow(top)
                    for j in range(top):
                        s.tried[j] += 1
                        if j < len(acc):
                            s.hit[j] += 1

    def timed(self, ms: float) -> None:
        """The step of the last budgets took `ms` (all of it: drafting, verify, bookkeeping)."""
        self.cost.learn(self.last_ks, ms)

    def forget(self, key) -> None:
        self.seqs.pop(key, None)

    def report(self) -> dict:
        return {"budget_hist": dict(sorted(self.hist.items())),
                "predicted_step_ms": round(self.predicted_ms, 3),
                "confidence_stops": self.conf_stops}


CONF_BINS = 10


def conf_bin(conf: float) -> int:
    """A draft confidence's bin: tenths of [0, 1]."""
    return min(CONF_BINS - 1, max(0, int(conf * CONF_BINS)))


# -- the step-cost table of a run ----------------------------------------------------------------

_TABLES: dict = {}


def device_tag(model) -> str:
    """What prices a step besides the model and dtype: on a CPU its model and the threads a
    step runs on; on CUDA the GPU's model (an H100 costs unlike an A10) and whether steps
    replay captured graphs."""
    if model.device.type == "cuda":
        name = torch.cuda.get_device_name(model.device)
        how = "graphs" if model.graphs is not None else "eager"
    else:
        name = _cpu_name()
        how = f"t{torch.get_num_threads()}"
    return f"{model.device.type}-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{how}"


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


STEP_NS = (1, 2, 4, 8, 16, 32, 64)   # tokens per sequence a stored table measures
STEP_WARMUP, STEP_REPEATS = 1, 5     # runs of each of its points: untimed, then timed


def step_table_id(fingerprint: str, model, batch_size: int) -> str:
    return (f"{fingerprint}-{device_tag(model)}-{str(model.dtype).replace('torch.', '')}"
            f"-{model.attention}-steps-b{batch_size}")


def step_table_path(store, fingerprint: str, model, batch_size: int):
    """Where step_table_for keeps the table of `model` for `batch_size` slots."""
    ident = step_table_id(fingerprint, model, batch_size)
    return store.path("profiles", ident) / "steptable.json"


def step_table_seconds(batch_size: int, step_s) -> float:
    """About how long step_table_for measures, given step_s(b, n): seconds of a step of b
    sequences x n tokens (for an estimate before measuring). Each round runs its first step
    once more, untimed (measure_step_table)."""
    batches = sorted({1, batch_size})
    steps = sum(step_s(b, n) for b in batches for n in STEP_NS) + \
        sum(step_s(b, STEP_NS[0]) for b in batches)
    return (STEP_WARMUP + STEP_REPEATS) * steps


def step_table_for(model, batch_size: int, *, store=None, fingerprint: str | None = None,
                   log=lambda msg: None, ns=STEP_NS, context: int = 128,
                   repeats: int = STEP_REPEATS, warmup: int = STEP_WARMUP,
                   fresh: bool = False) -> StepTable:
    """The step-cost table of `model` for runs of `batch_size` slots (batches {1, batch_size},
    a small grid of tokens per sequence): kept for the process, and with a store and the
    model's fingerprint kept in the store too (profiles/), so it is measured once per model,
    device, dtype, attention backend and batch size. fresh: measure it again."""
    batches = tuple(sorted({1, batch_size}))
    key = (id(model), str(model.device), str(model.dtype), batches, tuple(ns))
    t = None if fresh else _TABLES.get(key)
    if t is not None:
        return t
    ident = step_table_id(fingerprint, model, batch_size) if store and fingerprint else None
    if ident is not None and not fresh:
        path = step_table_path(store, fingerprint, model, batch_size)
        if path.is_file():
            try:
                t = StepTable.from_json(json.loads(path.read_text()))
                if t.engine != ENGINE_COSTS:
                    log(f"{path}: measured by an earlier engine; measuring again")
                    t = None
                elif t.batches != batches or t.ns != tuple(ns) or t.context != context:
                    t = None
            except (ValueError, TypeError, KeyError) as e:
                log(f"{path}: unreadable step-cost table ({e}); measuring again")
                t = None
    if t is None:
        t0 = time.perf_counter()
        t = measure_step_table(model, batches=batches, ns=ns, context=context,
                               repeats=repeats, warmup=warmup)
        if ident is not None:
            try:
                with store.building("profiles", ident, make_manifest(
                        "step-table", ident, model_fingerprint=fingerprint,
                        device=device_tag(model))) as d:
                    atomic_write_json(d / "steptable.json", t.to_json())
                log(f"step-cost table measured in {time.perf_counter() - t0:.1f} s, kept as "
                    f"profiles/{ident}")
            except OSError as e:   # a cache: a store that cannot keep it costs a measurement
                log(f"step-cost table measured, not kept in the store ({e})")
    _TABLES[key] = t
    return t


def _numel(ts) -> int:
    return sum(t.numel() for t in ts if t is not None)


def weight_shares(model) -> tuple[list[int], list[int], int]:
    """(attention weights per layer, MLP weights per layer, LM head weights): the cost shares
    of the blocks a layer-skip or early-exit draft runs (matmul work ~ weights per token)."""
    attn = [_numel([L.wqkv, L.wo]) for L in model.layers]
    mlp = [_numel([L.w_gate_up, L.w_down]) for L in model.layers]
    return attn, mlp, model.lm_head.numel()


def skip_draft_frac(model, skip) -> float:
    """What one layer-skip draft forward costs, as a share of a full step: the weights of the
    blocks it keeps and the LM head over all of them."""
    attn, mlp, head = weight_shares(model)
    kept = sum(a for i, a in enumerate(attn) if i not in skip.attn) + \
        sum(m for j, m in enumerate(mlp) if j not in skip.mlp)
    return (kept + head) / (sum(attn) + sum(mlp) + head)


def kangaroo_cost(model, table: StepTable, adapter) -> StepCost:
    """The StepCost of Kangaroo drafting with `adapter` (a kangaroo.Adapter, exit layer l)."""
    attn, mlp, head = weight_shares(model)
    total = sum(attn) + sum(mlp) + head
    shallow = sum(attn[:adapter.l]) + sum(mlp[:adapter.l])
    return StepCost(table, _padded(model), verify_frac=(total - shallow) / total,
                    draft_frac=(shallow + _numel(adapter.w.values()) + head) / total,
                    draft_extra=1,
                    tail_frac=shallow / total, idle_whole=model.graphs is None)


def _padded(model) -> bool:
    return model.device.type == "cuda" and model.graphs is not None


def cost_for(drafter, model, table: StepTable) -> StepCost:
    """The StepCost of a drafter (draft-verify, kangaroo, self-draft, ar) on `model`."""
    name = getattr(drafter, "name", "")
    if name == "draft-verify":
        return StepCost(table, _padded(model), draft_frac=skip_draft_frac(model, drafter.skip))
    if name == "kangaroo":
        return kangaroo_cost(model, table, drafter.adapter)
    if name == "self-draft":
        p = drafter.prm
        return StepCost(table, _padded(model), probe=p.branches * p.branch_len)
    return StepCost(table, _padded(model))


def max_budget(drafter) -> int:
    name = getattr(drafter, "name", "")
    if name == "draft-verify":
        return drafter.prm.K
    if name == "kangaroo":
        return drafter.prm.gamma
    if name == "self-draft":
        p = drafter.prm
        glen = getattr(drafter.corpus, "gram_len", p.gram) if drafter.corpus is not None else p.gram
        return p.context_cands * p.gram + p.corpus_cands * glen
    return 0


def make_controller(drafter, model, batch_size: int, table: StepTable | None = None, *,
                    store=None, fingerprint: str | None = None, log=lambda msg: None,
                    **kw) -> Controller:
    """The controller of a run of `batch_size` slots; its step-cost table `table`, or else
    step_table_for's (kept in `store` when given with the model's fingerprint). Call it before
    the run's KV cache exists: a measurement makes its own."""
    t0 = time.perf_counter()
    table = table or step_table_for(model, batch_size, store=store, fingerprint=fingerprint,
                                    log=log)
    ctl = Controller(cost_for(drafter, model, table), max_budget(drafter),
                     tree=getattr(drafter, "name", "") == "self-draft", **kw)
    ctl.profile_s = time.perf_counter() - t0
    return ctl
