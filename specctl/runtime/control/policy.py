"""The speculation policy: draft budgets that maximize a step's goodput, as pure functions of
numbers (expected gains, budget caps, a StepCost): nothing here learns or keeps state.

Speculation pays only while verifying the extra tokens (and drafting them) costs less than
the tokens it is expected to add. Each running sequence gets a draft budget k_i in [0, cap_i]
(k_i = 0 is an `ar` step for it) that maximizes the goodput of the whole step:

    goodput(k) = E[emitted tokens of the step] / predicted step ms
               = sum_i gain_i(k_i) / cost(k_1 .. k_B)

with gain_i from runtime/control/acceptance.py and cost from runtime/control/stepcost.py.

Search (`search`), over every sequence at once (numpy: no per-sequence or per-candidate
Python on the hot path, and linear in the batch): every draft token of every sequence is put
in the order of the tokens it is expected to add (each sequence's upper concave hull of
gain(k), steepest first: `hull_order`), and the prefix of that order with the best goodput is
taken; beside the prefixes, every level T (each sequence's budget min(cap, T)), for steps
whose cost follows their longest budget (padded graphs) or their depth (draft forwards): a
shallow step that drafts for every sequence may beat a deep one with as many tokens. All
candidates are priced in one StepCost.prices call. On a staircase cost (the CPU's tiles) no
single draft pays for the first stair while a stair's worth of them may, which a
one-change-at-a-time search never finds. Either way
a steep verify cost gives every sequence 0 (exactly `ar`'s steps); a flat one gives the full
budget; in a mixed batch the sequences that accept more get larger budgets.

Where a step's cost follows its longest budget alone (captured graphs pad every sequence to
it, or a grid step runs its rows for every sequence, and no draft forward is priced:
Self-Draft on CUDA, or on its grid: StepCost.by_top), the levels are every candidate there
is (`_search_levels`): a dozen array calls. A drain's critical paths of all the prefixes come
from one sort (`critical_paths`), not a [prefixes, batch] array.

Probes (Self-Draft's branches) run only with a sequence's drafts; their value is not modelled
(it comes later, as n-grams for the context cache), so they run only where they are nearly
free (`probes_pay`): in a step whose probes would cost more than `share` (10%) over the same
step without them, no sequence runs its probe. On a 2-core CPU 36 branch tokens double a
batch-1 step; on the H100 they cost little at batch 1.

Confidence stops (chains, `stop_rule`). The budget is a cap, chosen before anything is
drafted. While drafting, a draft of confidence c is r(c) = calibrated(c) / pooled times as
likely to be accepted as the average one, so after its j-th draft a sequence's first j drafts
are all accepted with probability q_j = min(1, P_j * r(c_1) ... r(c_j)) (P_j: its own
positional estimate, the search's), and drafting on to its budget k adds q_j / P_j *
(gain(k) - gain(j)) expected tokens. It stops when that is less than the step's goodput times
what stopping saves (cost(k) - cost(j) with the other budgets as planned): a low-confidence
draft ends the chain early, its further draft forwards and verify rows unspent. (The
drafter's own confidence exit, the paper's threshold, still applies too.)
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from specctl.runtime.control.stepcost import Shapes, StepCost, budget_counts, moved

def search(gains: np.ndarray, caps: np.ndarray, cost: StepCost, probes: bool,
           left: np.ndarray | None = None) -> list[int]:
    """The budgets of the best goodput (module docstring). gains [B, K + 1]: gains[i, k] for
    k <= caps[i]. left: with no request waiting (the batch drains), the tokens each sequence
    has left to emit: the budgets of the shortest critical path instead (`drain_best`)."""
    b = len(gains)
    if b == 1:   # one sequence: its candidates are its budgets 0 .. cap, in order (and its
        return [_search_one(gains[0], int(caps[0]), cost, probes)]   # path is the job's)
    if cost.by_top:
        return _search_levels(gains, np.asarray(caps), cost, probes, left)
    seq, k = hull_order(gains, caps)
    if not len(k):
        return [0] * b
    n, top = len(k), int(k.max())

    def prefixes(x):   # x summed over each prefix of the order (0 .. n units)
        c = np.zeros((n + 1,) + x.shape[1:], dtype=x.dtype)
        np.cumsum(x, axis=0, out=c[1:])
        return c
    # candidates 0 .. n: the prefixes; then n + T for T = 1 .. top - 1: every budget min(cap, T)
    levels = np.minimum(np.asarray(caps)[:, None], np.arange(1, top)[None, :])   # [B, top - 1]
    rows = np.arange(b)[:, None]
    emitted = b + np.concatenate((prefixes(gains[seq, k] - gains[seq, k - 1]),
                                  (gains[rows, levels] - gains[:, :1]).sum(axis=0)))
    tokens = np.concatenate((np.arange(n + 1), levels.sum(axis=0)))
    drafting = np.concatenate((prefixes((k == 1).astype(np.int64)),
                               np.full(top - 1, np.count_nonzero(caps))))
    tops = np.concatenate(([0], np.maximum.accumulate(k), levels.max(axis=0, initial=0)))
    at_least = None
    if cost.draft_frac:   # at_least[c, d]: sequences with budget >= d (b at d = 0)
        d = np.arange(top + 1)
        at_least = np.concatenate((prefixes((k[:, None] == d[None, :]).astype(np.int64)),
                                   (levels[:, :, None] >= d[None, None, :]).sum(axis=0)))
        at_least[:, 0] = b
    t = cost.prices(Shapes(b, tokens, drafting, tops, at_least), probes)
    if left is not None:
        best = drain_best(gains, t, seq, levels, left)
    else:
        good = emitted / np.where(t > 0, t, np.inf)
        best = int(np.argmax(good >= good.max() / (1 + 1e-9)))   # the first near the best
    if best > n:
        return levels[:, best - n - 1].tolist()
    return np.bincount(seq[:best], minlength=b).tolist()   # (a budget k: its units 1 .. k)


def drain_best(gains: np.ndarray, t: np.ndarray, seq: np.ndarray, levels: np.ndarray,
               left: np.ndarray) -> int:
    """The candidate (search's order: the prefixes of seq, then the levels) whose step makes
    the job end soonest while the batch drains. Then the job's time is its slowest sequence's:
    about t x max_i left_i / (1 + gain_i(k_i)) (steps left on the critical path times the
    step's cost), and the batch's goodput is beside the point: drafts for a sequence that ends
    early make every step dearer and the job no shorter. (At the H100's batch 32 most steps
    accepted nothing while each cost 1.4x: goodput per step was the wrong objective there.)"""
    left = np.asarray(left, dtype=np.float64)
    steps = np.concatenate((critical_paths(gains, seq, left), level_paths(gains, levels, left)))
    job = np.where(t > 0, t, np.inf) * steps
    return int(np.argmax(job <= job.min() * (1 + 1e-9)))   # the first near the best


def level_paths(gains: np.ndarray, levels: np.ndarray, left: np.ndarray) -> np.ndarray:
    """[levels]: the critical path (critical_paths) of each column of budgets levels [B, L]."""
    more = gains[np.arange(len(gains))[:, None], levels] - gains[:, :1]
    return (np.asarray(left, dtype=np.float64)[:, None] / (1 + more)).max(axis=0)


def critical_paths(gains: np.ndarray, seq: np.ndarray, left: np.ndarray) -> np.ndarray:
    """[len(seq) + 1]: for each prefix c of the order `seq` (c units given, a sequence's units
    in its own order), max_i left_i / (1 + gain_i(k_i(c)) - gain_i(0)): the steps the slowest
    sequence has left. In O(M log M) over the M = len(seq) + B values, not O(M B): a prefix's
    path is at most v iff every sequence has reached a budget whose value is at most v, so with
    the values in falling order, T(v) = the first prefix at which every sequence's value is at
    most v is a running maximum, and the path of prefix c is the least v with T(v) <= c.

    Worked example: two sequences, left (4, 2), the order (a, a, b); a's values by budget
    4/1, 4/1.5, 4/1.8 = (4, 2.67, 2.22) and b's 2/1, 2/1.4 = (2, 1.43). Prefix 0: max(4, 2) =
    4; prefix 1: max(2.67, 2) = 2.67; prefix 2: 2.22; prefix 3: max(2.22, 1.43) = 2.22."""
    b, n = len(gains), len(seq)
    # each unit's budget: its rank among its sequence's units (they come in budget order)
    order = np.argsort(seq, kind="stable")
    counts = np.bincount(seq, minlength=b)
    starts = np.cumsum(counts) - counts
    k = np.empty(n, dtype=np.int64)
    k[order] = np.arange(n) - np.repeat(starts, counts) + 1
    # the values: each sequence's at budget 0 (its steps left), then after each of its units
    vals = np.concatenate((left, left[seq] / (1 + gains[seq, k] - gains[seq, 0])))
    # the prefix from which a value no longer holds: its sequence's next unit's (n + 1 after
    # its last: never)
    unit_of = np.full((b, int(counts.max(initial=0)) + 2), n + 1, dtype=np.int64)
    unit_of[seq, k] = np.arange(1, n + 1)
    owner = np.concatenate((np.arange(b), seq))
    budget = np.concatenate((np.zeros(b, dtype=np.int64), k))
    until = unit_of[owner, budget + 1]
    # in falling order, the path of prefix c is at least a value iff c is before the `until`
    # of that value or of a larger one: reach[m] (a running max); its path is the value of the
    # first m whose reach is past c
    fall = np.argsort(-vals, kind="stable")
    reach = np.maximum.accumulate(until[fall])
    at = np.searchsorted(reach, np.arange(n + 1), side="right")
    return vals[fall][np.minimum(at, len(fall) - 1)]


def _search_levels(gains: np.ndarray, caps: np.ndarray, cost: StepCost, probes: bool,
                   left: np.ndarray | None) -> list[int]:
    """search() where a step's cost follows its longest budget alone (StepCost.by_top: captured
    graphs pad every sequence to it, or a grid runs its rows, and no draft forward is priced:
    Self-Draft on CUDA, or on its grid): for a longest
    budget T the most tokens, and the shortest critical path, come from giving every sequence
    min(cap, T) (gains never fall with the budget), so the levels T = 0 .. max cap are every
    candidate there is. O(B K) and a dozen array calls: the prefixes' [units, ...] arrays
    cost ~1-2 ms of CPU at batch 64, about a step of the GPU's."""
    b, top = len(gains), int(caps.max(initial=0))
    if top <= 0:
        return [0] * b
    levels = np.minimum(caps[:, None], np.arange(top + 1)[None, :])   # [B, top + 1]
    more = gains[np.arange(b)[:, None], levels] - gains[:, :1]        # tokens beyond 1
    t = cost.prices(Shapes(b, levels.sum(axis=0), np.count_nonzero(levels, axis=0),
                           levels.max(axis=0)), probes)
    t = np.where(t > 0, t, np.inf)
    if left is None:
        good = (b + more.sum(axis=0)) / t
        best = int(np.argmax(good >= good.max() / (1 + 1e-9)))   # the first near the best
    else:
        job = t * level_paths(gains, levels, left)
        best = int(np.argmax(job <= job.min() * (1 + 1e-9)))
    return levels[:, best].tolist()


def _search_one(gains: np.ndarray, cap: int, cost: StepCost, probes: bool) -> int:
    """search() for one sequence: what its general path computes for b = 1 (the hull order of
    one sequence is its budgets in order, its prefixes the budgets), without building it."""
    if cap <= 0:
        return 0
    sh = _ONE.get((cap, bool(cost.draft_frac)))
    if sh is None:
        k = np.arange(cap + 1)
        at_least = (k[:, None] >= k[None, :]).astype(np.int64) if cost.draft_frac else None
        sh = Shapes(1, k, (k > 0).astype(np.int64), k, at_least)
        for a in (sh.tokens, sh.drafting, sh.at_least):
            if a is not None:
                a.flags.writeable = False   # (shared by every later step and controller)
        _ONE[(cap, bool(cost.draft_frac))] = sh
    t = cost.prices(sh, probes, memo=("one", cap))
    good = (1 + gains[:cap + 1] - gains[0]) / np.where(t > 0, t, np.inf)
    return int(np.argmax(good >= good.max() / (1 + 1e-9)))


_ONE: dict = {}   # (cap, draft forwards priced) -> _search_one's candidates (never change)


def probes_pay(cost: StepCost, b: int, share: float = 0.1) -> bool:
    """Whether a step of b sequences drafting one token each may run their probes: they add
    at most `share` to its cost (module docstring)."""
    if not cost.probe or not b:
        return False
    one = [1] * b
    return cost.step_ms(one, True) <= (1 + share) * cost.step_ms(one, False)


HULL_SPAN = 8   # nodes over which hull_order averages a rise (a window, so it stays linear)


def hull_order(gains: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every draft token (sequence i, its budget k) in the order of the tokens it is expected
    to add: each sequence's upper concave hull of (k, gain(k)), steepest segment first (ties:
    by sequence, then budget, so a sequence's own tokens stay in order). As (seqs, ks).

    The hull's slope over (k - 1, k] is min over j <= k of the best mean gain of the tokens
    from j on, max over z >= j of (gain(z) - gain(j - 1)) / (z - j + 1). With z at most
    HULL_SPAN past j it is exact wherever the hull's segments span at most HULL_SPAN tokens
    (always for chains: their gains are concave, every segment is one token) and otherwise a
    little low for the tokens of a long segment (a tree's good node far behind weak ones)."""
    b, width = gains.shape[0], gains.shape[1] - 1
    ks = np.arange(1, width + 1)
    caps = np.asarray(caps)
    valid = ks[None, :] <= caps[:, None]
    slope = np.diff(gains, axis=1)
    # a rise somewhere below a cap (chains never: concave; past a cap, gains are not read)
    if ((slope[:, 1:] > slope[:, :-1]) & valid[:, 1:]).any():
        span = np.arange(1, min(HULL_SPAN, width) + 1)
        z = np.minimum(ks[:, None] - 1 + span[None, :], width)   # [j, m]: j - 1 + m, capped
        mean = (gains[:, z] - gains[:, ks - 1][:, :, None]) / span
        mean = np.where(z[None] <= caps[:, None, None], mean, -np.inf)
        slope = np.minimum.accumulate(mean.max(axis=2), axis=1)
    seq, col = np.nonzero(valid)
    order = np.lexsort((col, seq, -slope[seq, col]))
    return seq[order], ks[col[order]]


StopRule = Callable[[int, int, float], bool]


def stop_rule(gains: np.ndarray, ks: Sequence[int], cost: StepCost, probes: bool,
              ratio: Callable[[float], float]) -> StopRule:
    """For a chain drafter, after budgets ks: stop(i, j, conf) -> whether sequence i, having
    drafted j tokens the last of which had confidence `conf`, should draft no more (module
    docstring). ratio(conf): how much likelier a draft of that confidence is accepted than the
    average one. Asked once per draft in drafting order; it keeps its own copy of the plan
    (later answers price against the chains already stopped) and changes nothing else."""
    ks = list(ks)
    counts = budget_counts(ks)
    ms = cost.counts_step_ms(counts, probes)
    expected = float(gains[np.arange(len(ks)), ks].sum())
    odds = [1.0] * len(ks)   # prod r(c) of each sequence's drafts so far

    def stop(i: int, j: int, conf: float) -> bool:
        nonlocal ms, expected, counts
        odds[i] *= ratio(conf)
        k = ks[i]
        if j >= k or ms <= 0:
            return j >= k
        g = gains[i]
        p_j = g[j] - g[j - 1] if j >= 1 else 1.0   # P(the first j drafts are accepted)
        tail = min(1.0, p_j * odds[i]) / p_j * (g[k] - g[j]) if p_j > 0 else 0.0
        fewer = moved(counts, k, j)
        saved = ms - cost.counts_step_ms(fewer, probes)
        if tail >= expected / ms * saved:
            return False
        expected -= g[k] - g[j]
        ms -= saved
        ks[i], counts = j, fewer
        return True
    return stop
