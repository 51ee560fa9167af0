"""What a step costs: the step-cost table of a run, priced for a drafter, corrected online.

The speculation policy (runtime/control/policy.py) needs the ms of a step with draft budgets
k_1 .. k_B before it runs. `StepCost` predicts it from the step-cost table (engine/steptable.py:
StepTable.ms(b, n) = ms of one verify step of b sequences with n new tokens each) and what the
drafter says its steps cost (DraftPrice, speculative/drafter.py):
    cost(k) = verify_frac * verify_ms + sum_{d=1..D} draft_frac * table.ms(n_d, 1)
- verify_ms: with n_i = 1 + k_i (+ probe tokens when k_i > 0) the tokens sequence i puts into
  the verify forward,
    padded (CUDA: the captured graphs pad every sequence to a common n on their grid):
        verify_ms = table.ms(B, grid(max_i n_i))
    packed (CPU: no padding, cost follows the total packed tokens, the matmuls dominate):
        verify_ms = table.ms(B, sum_i n_i / B)      (the batch-B row at the mean tokens)
    a grid (Self-Draft's grid step, DraftPrice.chain): every sequence runs the longest's
        rows, 1 + k_max within one chain, else whole chains (and that onto the graph grid
        where padded): verify_ms = table.ms(B, n(k_max))
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
- host work: what a drafting sequence costs the host (its proposal, its tree's layout, its
  verification and commit) grows with the sequences drafting, not with the forward. The
  runner times each step's host work apart from its forward (its planning, and all after
  the forward's output is read) and what drafting adds beyond a lean step's is fitted as a
  step's part plus a part per drafting sequence (host_fit, learn_host; on a grid, per
  sequence of a step that drafts at all: StepCost.hosted), added to every candidate's
  price: at batch 64 on a GPU a drafting step's host work may cost more than its forward,
  while at batch 1 the same work is a small share of one; a ratio on the table's
  price cannot be right at both.
Measured against predicted: the table is measured once, on an idle moment, at one context
length, and prices the model's forwards only; a run's steps also pay the drafter's host
work, attention over longer contexts, and whatever else shares the machine (on the 2-core CPU
the same batch-8 step timed 67 ms in one minute and 100 the next). So every step's measured ms
is fed back (StepCost.learn): x = log(measured / table ms) is modelled as a drift (what
every step costs beyond the table now: the last ~16 steps) plus a class (whether the step
drafts) plus a kind (its batch size, the table point its verify is priced at, its draft
forwards), the last two learnt over their last ~64 steps each and shrunk toward 0 with 2
steps, so a kind never run is priced by the drift and its class; a step more than twice off
its expected cost counts as twice (one page-in must not price a kind for a dozen steps),
but for the first of its class. The predicted cost of a step is the table's times exp(x): a
stair of drafts that turns out dearer than the table says is priced at what it costs, and
drafted less. (A uniform drift changes no decision: only ratios between kinds do.) Classes
and kinds are learnt only from steps that run: a run that drafts in every step never times a
step without drafts, the one it must beat, so the controller runs contrast steps
(runtime/control/controller.py).

The table is measured on first use or by `specctl prepare` and kept in the store
(runtime/control/steptables.py); search-skip and train-adapter's sweep price on its batch-1 table
with the same drafter prices (StepCost.of).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from specctl.engine.steptable import StepTable
from specctl.speculative.drafter import DraftPrice


@dataclass
class StepCost:
    """Predicted ms of one step from the step-cost table and the method's draft cost, corrected
    online by what the run's steps measure (`learn`, module docstring). `probes`: whether the
    step's speculating sequences run their probes (the policy decides it per step)."""
    table: StepTable
    padded: bool = False
    verify_frac: float = 1.0   # share of a full step the verify forward costs (Kangaroo < 1)
    draft_frac: float = 0.0    # one draft forward of b sequences = draft_frac * table.ms(b, 1)
    draft_extra: int = 0       # draft forwards a sequence runs beyond its budget (Kangaroo: 1)
    tail_frac: float | None = None   # a draft forward in which no sequence drafts (Kangaroo's
                                     # last, shallow layers only); None: draft_frac
    probe: int = 0             # probe tokens a speculating sequence adds (Self-Draft's branches)
    idle_whole: bool = False   # a step with no drafts is one plain forward (Kangaroo)
    chain: int = 0             # a grid's chain (DraftPrice.chain): rows follow the top budget
    drift: float = 0.0         # log(measured / table ms) common to every step now (learn)
    steps: int = 0             # steps learnt from
    scale: dict = field(default_factory=dict, repr=False)   # a class of step (whether it
                     # drafts) or a kind (table_ms) -> [its log ratio beyond the drift, steps]
    # fixed for the run: the table's price of a step by its budget counts, and by batch size
    # ms(n, 1) and the verify's ms by rows; until learn changes them: the factor by kind, and
    # by batch size the learnt kinds as sorted codes and their _rel (kind_rel)
    _tables: dict = field(default_factory=dict, repr=False)
    _ones: dict = field(default_factory=dict, repr=False)
    _ar: dict = field(default_factory=dict, repr=False)   # b -> ar_table_ms(b)
    _verify: dict = field(default_factory=dict, repr=False)
    _factors: dict = field(default_factory=dict, repr=False)
    _kinds: dict = field(default_factory=dict, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)   # prices(memo=): table side
    lean_host: float = 0.0     # ms of host time a sequence of a step without drafts costs
    lean_steps: int = 0        # steps lean_host was learnt from
    # a step without drafts by its batch size: [host ms, steps learnt] (lean_at)
    _lean_b: dict = field(default_factory=dict, repr=False)
    # the last drafting steps (host ms, batch size, sequences hosted): host_fit's
    _drafted: deque = field(default_factory=lambda: deque(maxlen=SCALE_MEMORY), repr=False)
    _host: tuple | None = None   # host_fit as of the last learn_host (None: to work out)
    draining: bool = False       # the search being priced is a drain's (untimed_host)

    @classmethod
    def of(cls, table: StepTable, price: DraftPrice, padded: bool) -> "StepCost":
        """The cost of a drafter's steps (its DraftPrice) on `table`; padded: steps replay
        captured graphs, which pad every sequence to the step's longest."""
        return cls(table, padded, verify_frac=price.verify_frac, draft_frac=price.draft_frac,
                   draft_extra=price.draft_extra, tail_frac=price.tail_frac,
                   probe=price.probe, idle_whole=price.idle_whole, chain=price.chain)

    @property
    def by_top(self) -> bool:
        """Whether a step's price follows its largest budget alone: every sequence runs as
        many rows as the longest (padded onto captured graphs, or a grid's), and no draft
        forward is priced (policy._search_levels)."""
        return (self.padded or self.chain > 0) and not self.draft_frac

    def tokens(self, k, probes: bool = True):
        """The verify tokens of a sequence with budget k (an int or an array of them); on a
        grid, of every sequence of a step whose largest budget is k: whole chains past one."""
        if self.chain:
            c = self.chain
            k = np.where(k > c, -(-np.asarray(k) // c) * c, k)
        return 1 + k + np.where(k > 0, self.probe if probes else 0, 0)

    def _verify_ms(self, b: int, rows: np.ndarray) -> np.ndarray:
        """table ms(b, rows / b) for each count of rows (a lookup: the rows are whole)."""
        have = self._verify.get(b)
        top = int(rows.max(initial=0))
        if have is None or len(have) <= top:
            have = self._verify[b] = self.table.ms_many(b, np.arange(max(top + 1, 4 * b)) / b)
        return have[rows]

    def _ms_one(self, b: int) -> np.ndarray:
        """table ms(n, 1) for n = 0 .. b (a draft forward of n sequences)."""
        one = self._ones.get(b)
        if one is None:   # (a prefix of the largest batch's: a draining batch meets every b)
            big = max((x for x in self._ones if x > b), default=None)
            one = self._ones[b] = self._ones[big][:b + 1] if big is not None else \
                np.array([0.0] + [self.table.ms(n, 1) for n in range(1, b + 1)])
        return one

    def table_prices(self, sh: Shapes, probes: bool = True):
        """(the table's ms of every candidate step in sh, its verify's table point in us, its
        draft forwards (-1: one plain forward)): the kinds' parts, all candidates at once."""
        b = sh.b
        if self.padded:   # every sequence padded to the longest, and that onto the graph grid
            rows = b * grid_n_many(self.tokens(sh.top, probes))
        elif self.chain:   # (a grid's: every sequence as the longest)
            rows = b * self.tokens(sh.top, probes)
        else:
            rows = b + sh.tokens + (self.probe * sh.drafting if probes else 0)
        v = self._verify_ms(b, rows)
        total = self.verify_frac * v
        depth = np.zeros_like(sh.top)
        if self.draft_frac:   # the d-th draft forward runs over at_least[d - extra]
            depth = sh.top + self.draft_extra
            d = np.arange(1, int(depth.max(initial=0)) + 1)
            cols = np.minimum(np.maximum(d - self.draft_extra, 0), sh.at_least.shape[1] - 1)
            frac = self.draft_frac if self.tail_frac is None else \
                np.where(d[None, :] <= sh.top[:, None], self.draft_frac, self.tail_frac)
            fwd = frac * self._ms_one(b)[sh.at_least[:, cols]]
            total = total + np.where(d[None, :] <= depth[:, None], fwd, 0.0).sum(axis=1)
        if self.idle_whole:
            idle = sh.top == 0
            total, depth = np.where(idle, v, total), np.where(idle, -1, depth)
        return total, np.rint(v * 1e3).astype(np.int64), depth

    def prices(self, sh: Shapes, probes: bool = True, memo=None) -> np.ndarray:
        """Predicted ms of every candidate step in sh: the table's, corrected as learnt.
        memo: a key under which sh's table prices are kept (candidates the caller builds the
        same every step, e.g. one sequence's budgets 0 .. cap): only the correction is redone.
        The key must name sh, batch size included: the same key, the same candidates."""
        got = self._memo.get((memo, probes)) if memo is not None else None
        if got is None:
            ms, vkey, depth = self.table_prices(sh, probes)
            drafts = sh.top > 0
            # (+ the learnt kinds' codes it was matched against, and its kinds' index there)
            got = [ms, kind_code(vkey, depth, drafts), drafts, None, None, depth]
            if memo is not None:
                for a in got[:3]:
                    a.flags.writeable = False   # (every later step reads them)
                self._memo[(memo, probes)] = got
        ms, code, drafts, matched, at, depth = got
        codes, rel = self.kind_rel(sh.b)
        if matched is not codes:   # (a new kind learnt since: kind_rel's arrays are new)
            got[3], got[4] = codes, _kind_index(codes, code)
            at = got[4]
        base = np.where(drafts, self._rel((True,)) + self.drift, self._rel((False,)) + self.drift)
        return ms * np.exp(base + rel[at]) + self.host_ms(self.hosted(sh.b, sh.drafting)) + \
            self.untimed_host(sh.b, depth, sh.drafting)

    def kind_rel(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The learnt kinds of batch size b: their codes (sorted) and _rel, with a 0 after the
        last (for the codes not learnt; kept up to date by learn, kind by kind: re-sorting
        every kind each step grows with the kinds seen)."""
        got = self._kinds.get(b)
        if got is None:
            pairs = sorted((kind_code(*k[1:]), self._rel(k)) for k in self.scale
                           if len(k) == 4 and k[0] == b)
            codes = [c for c, _ in pairs]
            got = self._kinds[b] = (np.array(codes, dtype=np.int64),
                                    np.array([r for _, r in pairs] + [0.0]),
                                    {c: i for i, c in enumerate(codes)})
        return got[:2]

    def _relearnt(self, kind: tuple) -> None:
        """kind_rel's arrays after learn changed kind's _rel (a new kind: built anew)."""
        got = self._kinds.get(kind[0])
        if got is not None:
            at = got[2].get(kind_code(*kind[1:]))
            if at is None:
                del self._kinds[kind[0]]
            else:
                got[1][at] = self._rel(kind)

    def table_ms(self, ks, probes: bool = True) -> tuple[float, tuple]:
        """(the table's ms of a step with budgets ks, the kind of step: its batch size, the
        table point its verify is priced at, its draft forwards, whether anything drafts).
        It depends on the budgets' counts only, not on which sequence has which."""
        return self.counts_ms(budget_counts(ks), probes)

    def counts_ms(self, counts: tuple, probes: bool = True) -> tuple[float, tuple]:
        """table_ms of a step in which counts[k] sequences have budget k (budget_counts)."""
        key = (counts, probes)
        got = self._tables.get(key)
        if got is None:
            if not counts:
                return 0.0, ()
            sh = Shapes.of_counts(counts, self.draft_frac > 0)
            ms, vkey, depth = self.table_prices(sh, probes)
            got = self._tables[key] = (float(ms[0]), (sh.b, int(vkey[0]), int(depth[0]),
                                                      bool(sh.top[0] > 0)))
        return got

    def _rel(self, key) -> float:
        s = self.scale.get(key)
        if s is None:
            return 0.0
        n = min(s[1], 4 * SCALE_MEMORY)
        return s[0] * n / (n + SCALE_PRIOR)

    def factor(self, kind: tuple) -> float:
        """measured / table ms expected of a step of this kind (learn)."""
        f = self._factors.get(kind)
        if f is None:
            f = self._factors[kind] = math.exp(self.drift + self._rel(kind[3:]) + self._rel(kind))
        return f

    def ar_table_ms(self, b: int) -> float:
        """The table's ms of an `ar` step of b sequences (one plain forward)."""
        got = self._ar.get(b)
        if got is None:
            got = self._ar[b] = float(self._ms_one(b)[b])
        return got

    def ar_ms(self, b: int) -> float:
        """Predicted ms of an `ar` step of b sequences (a plain forward, table ms(b, 1)),
        corrected as this run's steps without drafts were (their class and the drift)."""
        return self.ar_table_ms(b) * math.exp(self.drift + self._rel((False,)))

    def step_ms(self, ks, probes: bool = True) -> float:
        """Predicted ms of a step with budgets ks."""
        return self.counts_step_ms(budget_counts(ks), probes)

    def counts_step_ms(self, counts: tuple, probes: bool = True) -> float:
        ms, kind = self.counts_ms(counts, probes)
        if not ms:
            return 0.0
        drafting = sum(counts) - counts[0]
        return ms * self.factor(kind) + float(self.host_ms(self.hosted(kind[0], drafting))) + \
            float(self.untimed_host(kind[0], kind[2], drafting))

    def learn(self, ks: list[int], measured_ms: float, probes: bool = True,
              extra_host: float = 0.0) -> float:
        """learn_counts of a step with budgets ks."""
        return self.learn_counts(budget_counts(ks), measured_ms, probes, extra_host)

    def learn_counts(self, counts: tuple, measured_ms: float, probes: bool = True,
                     extra_host: float = 0.0) -> float:
        """A step in which counts[k] sequences had budget k (budget_counts: a lean step of b,
        (b,)) took measured_ms (returns its table ms); x = log(measured /
        table ms) is modelled
        as drift + class + kind:
        - the drift, what every step costs beyond the table now (the machine's state, the
          context length): a moving average of x less the other two over the last
          ~SCALE_MEMORY steps;
        - the class (whether the step drafts: what the table's drafting points misprice,
          the host's measured share taken off first, extra_host) and the kind (table_ms:
          batch size, table point, draft forwards): moving averages of what is left of x over their last ~4 x SCALE_MEMORY
          steps, each shrunk toward 0 with SCALE_PRIOR steps, so a kind never run is priced
          by the drift and its class.
        In logs, and a step more than twice off what it was expected to cost counts as twice
        (one step that hit a page-in or a neighbour's burst must not price its kind for the
        next dozen); where its class has never been timed, FIRST_OFF times: a contrast
        step's first timing is the news it was run for, but a first lean step that paid 26
        ms of page faults (43x its table price) priced lean steps at 5-20x theirs for ~60
        steps of a b8 run, and all of them drafted at a loss. extra_host: the ms of it that
        drafting's host work added (learn_host: priced per drafting sequence, not as a
        ratio)."""
        ms, kind = self.counts_ms(counts, probes)
        if not ms > 0 or not measured_ms > 0:
            return ms
        self._factors.clear()
        cls = kind[3:]
        rel_cls, rel_kind = self._rel(cls), self._rel(kind)   # (as they stand before it)
        measured_ms = max(measured_ms - extra_host, 0.1 * measured_ms)
        x = math.log(measured_ms / ms)
        # (log factor(kind) as it stands: not cached, the step moves it)
        e = self.drift + rel_cls + rel_kind
        off = math.log(2 if cls in self.scale else FIRST_OFF)
        x = min(e + off, max(e - off, x))
        self.steps += 1
        self.drift += (x - rel_cls - rel_kind - self.drift) / min(self.steps, SCALE_MEMORY)
        x -= self.drift
        for key in (cls, kind):
            s = self.scale.setdefault(key, [0.0, 0])
            s[1] += 1
            s[0] += (x - s[0]) / min(s[1], 4 * SCALE_MEMORY)
            x -= self._rel(key)
        self._relearnt(kind)
        return ms

    def host_fit(self) -> tuple[float, float]:
        """(a, s): a drafting step's host time beyond what a step without drafts of as many
        sequences spends there (lean_at), fitted as a + s x its sequences
        drafting over the last SCALE_MEMORY drafting steps. Each step's host time is
        measured (its planning, and all after its forward's output was read), not inferred
        from its total. Theil-Sen (one page-in is not a price): s the median slope between
        steps of different drafting counts, a the median of what is left; while every step
        had as many drafting, a is 0 and s that count's median share. Both at least 0."""
        if self._host is None:
            pts = [(n, h - self.lean_at(b)) for h, b, n in self._drafted]
            slopes = [(e2 - e1) / (n2 - n1) for i, (n1, e1) in enumerate(pts)
                      for n2, e2 in pts[i + 1:] if n2 != n1]
            if slopes:
                sl = max(0.0, statistics.median(slopes))
                self._host = (max(0.0, statistics.median(e - sl * n for n, e in pts)), sl)
            else:
                self._host = (0.0, max(0.0, statistics.median(e / n for n, e in pts))
                              if pts else 0.0)
        return self._host

    def hosted(self, b: int, drafting):
        """The sequences whose host work a step with `drafting` sequences drafting (an int or
        an array) pays drafting's share of: those drafting, but on a grid (`chain`) every
        sequence of the step once any drafts: its plan, verification and commit run every
        sequence's rows, a budget of 0 or not. (Fitted per drafting sequence, a b64 trace-grid
        step of a few drafting was priced 3.9 ms and took 8.6, ar's 3.1: it drafted at a loss,
        bench-results/2026-12-02-grid-host-price.)"""
        if not self.chain:
            return drafting
        if isinstance(drafting, (int, np.integer)):
            return b if drafting > 0 else 0
        return np.where(np.asarray(drafting) > 0, b, 0)

    def host_ms(self, drafting):
        """The host time a step with `drafting` sequences drafting adds (an int or an array of
        them): host_fit's a + s x drafting, 0 where none drafts. (One step's in Python:
        numpy's where on a scalar took ~9 us a call, and each drafting step's plan prices 2-3
        steps at b8, bench-results/2026-11-30-plan-host.)"""
        a, sl = self.host_fit()
        if not (a or sl):
            return 0.0
        if isinstance(drafting, int):
            return a + sl * drafting if drafting > 0 else 0.0
        return np.where(np.asarray(drafting) > 0, a + sl * np.asarray(drafting), 0.0)

    def untimed_host(self, b: int, depth, drafting):
        """Until a drafting step has been timed (host_fit prices drafting's host from then
        on), what its host work is priced at (0 before a lean step is timed: Controller.decide
        waits for one where this matters). Its draft forwards (`depth`, an int or an array),
        each priced as a lean step of b sequences spends it (lean_at: a forward's batch, its
        launch and its read-back are the host's work in both): Kangaroo's first drafting step
        on the host-charged clock at batch 1 took 5.2-5.8 ms where its forwards were priced
        3.2, its three draft forwards' host work, which nothing priced. And while the batch
        drains (`draining`, set by the controller for its search), DRAIN_HOST lean steps more
        for a step where any sequence (`drafting`) drafts: a drain's job ends with its
        sequences, so a first drafting step priced at no host work is a lesson that comes too
        late to pay (DRAIN_HOST's numbers; controller.py's docstring)."""
        if self._drafted or not self.lean_steps:
            return 0.0
        lean = self.lean_at(b)
        if isinstance(drafting, int):   # (one step's in Python, as host_ms)
            got = max(depth, 0) * lean if self.draft_frac else 0.0
            return got + DRAIN_HOST * lean if self.draining and drafting > 0 else got
        got = np.maximum(depth, 0) * lean if self.draft_frac else 0.0
        if self.draining:
            got = got + np.where(np.asarray(drafting) > 0, DRAIN_HOST * lean, 0.0)
        return got

    def learn_host(self, b: int, host_ms: float, drafting: int = 0, steps: int = 1) -> float:
        """A step of b sequences, `drafting` of them drafting (0: a lean step; `steps` of
        them, host_ms their mean), spent host_ms of host time (host_fit). Returns the ms of
        it that drafting added (what the ratio model is not to learn)."""
        if not drafting:
            self.lean_steps += steps
            self.lean_host += (host_ms / b - self.lean_host) * \
                min(1.0, steps / min(self.lean_steps, SCALE_MEMORY))
            at = self._lean_b.setdefault(b, [0.0, 0])
            at[1] += steps
            at[0] += (host_ms - at[0]) * min(1.0, steps / min(at[1], SCALE_MEMORY))
            self._host = None
            return 0.0
        self._drafted.append((host_ms, b, self.hosted(b, drafting)))
        self._host = None
        return max(0.0, host_ms - self.lean_at(b))

    def lean_at(self, b: int) -> float:
        """The host ms of a step without drafts of b sequences: as steps of that size took,
        else lean_host's share a sequence times b. (A lean step's host is part a step's, part
        a sequence's: one share a sequence learnt as a drain shrinks to batch 1, ~190 us a
        sequence against ~40 at batch 8 on the demo model's clock, priced batch 8's lean step
        above its drafting steps, and drafting's host work at nothing.)"""
        at = self._lean_b.get(b)
        return at[0] if at is not None else self.lean_host * b


def grid_n_many(n: np.ndarray) -> np.ndarray:
    """engine/graphs.py grid_n of every n: the next power of two (a captured step pads onto it,
    so 17 rows a sequence cost what 32 do)."""
    n = np.maximum(np.asarray(n, dtype=np.int64), 1)
    return (1 << np.ceil(np.log2(n)).astype(np.int64)).astype(np.int64)


def _kind_index(codes: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Each of `code`'s index in the sorted `codes`, or len(codes) where it is not there."""
    if not len(codes):
        return np.zeros(len(code), dtype=np.int64)
    at = np.minimum(np.searchsorted(codes, code), len(codes) - 1)
    return np.where(codes[at] == code, at, len(codes))


def kind_code(vkey, depth, drafts):
    """A kind (less its batch size) as one integer, for array lookups."""
    return (vkey * 4096 + depth + 1) * 2 + drafts


@dataclass(frozen=True)
class Shapes:
    """Candidate steps of b sequences as their cost sees them, one entry per candidate: the
    sum of the budgets, the sequences drafting, the largest budget and, where draft forwards
    are priced, at_least[c, d] = sequences with budget >= d (d = 0 .. max top)."""
    b: int
    tokens: np.ndarray
    drafting: np.ndarray
    top: np.ndarray
    at_least: np.ndarray | None = None

    @classmethod
    def of_counts(cls, counts: tuple, forwards: bool) -> "Shapes":
        """The one candidate in which counts[k] sequences have budget k."""
        c = np.asarray(counts, dtype=np.int64)
        al = np.cumsum(c[::-1])[::-1][None, :] if forwards else None
        return cls(int(c.sum()), np.array([c @ np.arange(len(c))]), np.array([c[1:].sum()]),
                   np.array([len(c) - 1]), al)


def budget_counts(ks) -> tuple:
    """(sequences with budget 0, with 1, ..., with the largest): what prices a step."""
    c = [0] * (max(ks, default=-1) + 1)
    for k in ks:
        c[k] += 1
    return tuple(c)


def moved(counts: tuple, k: int, j: int) -> tuple:
    """counts with one sequence's budget changed from k to j (trailing zeros dropped)."""
    c = list(counts) + [0] * (j + 1 - len(counts))
    c[k] -= 1
    c[j] += 1
    while len(c) > 1 and not c[-1]:
        c.pop()
    return tuple(c)


SCALE_PRIOR = 2      # steps of no difference a class's or kind's own ratio is shrunk with
SCALE_MEMORY = 16    # steps the drift averages over (a class's or kind's ratio: 4x as many)
DRAIN_HOST = 10.0    # lean steps of host a drain's first drafting step is priced to add
# (untimed_host), as measured: on the host-charged clock at batch 32-64 the trace's first
# drafting steps took 6.9-7.6 more, Self-Draft's grid 6.7 and 3.4 more in the step after it; on
# the H200 at 7f4cca3 Self-Draft's drafting steps took 3.4 / 2.9 ms more than a lean step at
# batch 32 / 64, ~7-10 lean steps' host with their extra rows in it; at batch 1 and 8 here 2.7
# and 4.6-5.4, where a drafting step gains more and the higher price changed no drain
# (bench-results/2026-11-30-drain-prior). 8 until a lean step's host fell (its verdicts made
# lazily, 2026-12-01): Self-Draft's first grid step at batch 32 then took 8.9 lean steps more,
# was priced below it and drafted a drain at 0.97x (bench-results/2026-12-01-commit-host). A
# price in lean steps moves with a lean step's host: re-measure it when that changes.
FIRST_OFF = 4        # how far off its expected cost a class's first timed step counts, at most


def padded_steps(model) -> bool:
    """Whether the model's steps replay captured graphs (CUDA), which pad every sequence."""
    return model.device.type == "cuda" and model.graphs is not None


def cost_for(drafter, model, table: StepTable) -> StepCost:
    """The StepCost of a drafter's steps on `model`, from the price it states."""
    return StepCost.of(table, drafter.price(), padded_steps(model))
