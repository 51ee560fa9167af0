"""The speculation policy: draft budgets that maximize a step's goodput, as pure functions of
numbers (expected gains, budget caps, a StepCost): nothing here learns or keeps state.

Speculation pays only while verifying the extra tokens (and drafting them) costs less than
the tokens it is expected to add. Each running sequence gets a draft budget k_i in [0, cap_i]
(k_i = 0 is an `ar` step for it) that maximizes the goodput of the whole step:

    goodput(k) = E[emitted tokens of the step] / predicted step ms
               = sum_i gain_i(k_i) / cost(k_1 .. k_B)

with gain_i from runtime/acceptance.py and cost from runtime/stepcost.py.

Search. By the best prefix (`fill`): every draft token of every sequence in the order of the
tokens it is expected to add (each sequence's upper concave hull of gain(k), steepest
first), and the prefix of that order with the best goodput taken. On a staircase cost (the
CPU's tiles) no single draft pays for the first stair while a stair's worth of them may,
which a one-change-at-a-time search never finds. Greedy marginal goodput (`greedy`): start
from k = 0; each round, for every sequence, try raising its budget to every larger value (a
jump, not only +1: the first draft forward is paid once and shared, so goodput is not concave
in one sequence's k), keep the single change with the highest goodput, stop when none
improves it. Where the step is priced by its total tokens alone (StepCost.packed: unpadded
steps without draft forwards or probes) the prefix search runs alone (exact there for
concave gains); unpadded steps with draft forwards or probes take the better of the two;
padded steps (CUDA graphs: a step costs by its longest sequence's bucket) the greedy search.
Either way a steep verify cost gives every sequence 0 (exactly `ar`'s steps); a flat one gives
the full budget; in a mixed batch the sequences that accept more get larger budgets.

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

import math
from typing import Callable, Sequence

from specctl.runtime.stepcost import StepCost

Gains = Sequence[Sequence[float]]   # gains[i][k]: sequence i's expected tokens at budget k


def goodput(gains: Gains, ks: list[int], cost: StepCost, probes: bool) -> float:
    t = cost.step_ms(ks, probes)
    return sum(g[k] for g, k in zip(gains, ks)) / t if t > 0 else 0.0


def search(gains: Gains, caps: list[int], cost: StepCost, probes: bool) -> list[int]:
    """The budgets of the best goodput (module docstring: which search for which cost)."""
    if cost.padded:
        return greedy(gains, caps, cost, probes)
    if cost.packed(probes):
        return fill(gains, caps, cost, probes)
    return max(fill(gains, caps, cost, probes), greedy(gains, caps, cost, probes),
               key=lambda ks: goodput(gains, ks, cost, probes))


def probes_pay(cost: StepCost, b: int, share: float = 0.1) -> bool:
    """Whether a step of b sequences drafting one token each may run their probes: they add
    at most `share` to its cost (module docstring)."""
    if not cost.probe or not b:
        return False
    one = [1] * b
    return cost.step_ms(one, True) <= (1 + share) * cost.step_ms(one, False)


def greedy(gains: Gains, caps: list[int], cost: StepCost, probes: bool) -> list[int]:
    """Greedy marginal goodput over jumps (the module docstring's search)."""
    ks = [0] * len(gains)
    emitted = float(len(gains))
    t = cost.step_ms(ks, probes)
    best = emitted / t if t > 0 else 0.0
    while True:
        pick = None
        for i, (g, c) in enumerate(zip(gains, caps)):
            k0 = ks[i]
            for k in range(k0 + 1, c + 1):
                ks[i] = k
                tt = cost.step_ms(ks, probes)
                good = (emitted + g[k] - g[k0]) / tt if tt > 0 else 0.0
                if good > best * (1 + 1e-9):
                    best, pick = good, (i, k)
            ks[i] = k0
        if pick is None:
            return ks
        i, k = pick
        emitted += gains[i][k] - gains[i][ks[i]]
        ks[i] = k


def hull_order(gains: Gains, caps: list[int]) -> list[tuple[int, int]]:
    """Every draft token (sequence i, its budget k) in the order of the tokens it is expected
    to add: each sequence's upper concave hull of (k, gain(k)), steepest segment first (stable:
    a sequence's own tokens stay in order)."""
    units = []   # (tokens per draft token of its hull segment, sequence, budget)
    for i, (g, cap) in enumerate(zip(gains, caps)):
        hull = [0]   # monotone chain over k = 0..cap
        for k in range(1, cap + 1):
            while len(hull) > 1 and (g[hull[-1]] - g[hull[-2]]) * (k - hull[-1]) <= \
                    (g[k] - g[hull[-1]]) * (hull[-1] - hull[-2]):
                hull.pop()
            hull.append(k)
        top = math.inf
        for a, z in zip(hull, hull[1:]):
            top = min(top, (g[z] - g[a]) / (z - a))   # falling, whatever the rounding
            units += [(top, i, k) for k in range(a + 1, z + 1)]
    units.sort(key=lambda u: -u[0])
    return [(i, k) for _, i, k in units]


def fill(gains: Gains, caps: list[int], cost: StepCost, probes: bool) -> list[int]:
    """The budgets by the best prefix of hull_order (module docstring). For each total it is
    the allocation with the most expected tokens (exactly so for concave gains: chains, and
    trees whose earlier nodes hit more)."""
    order = hull_order(gains, caps)
    b = len(gains)
    packed = cost.packed(probes)   # then O(1) a token
    ks = [0] * b
    emitted = float(b)
    t = cost.step_ms(ks, probes)
    best, take = (emitted / t if t > 0 else 0.0), 0
    for n, (i, k) in enumerate(order, 1):
        emitted += gains[i][k] - gains[i][k - 1]
        ks[i] = k
        t = cost.packed_ms(b, b + n) if packed else cost.step_ms(ks, probes)
        if t > 0 and emitted / t > best * (1 + 1e-9):
            best, take = emitted / t, n
    ks = [0] * b
    for i, k in order[:take]:
        ks[i] = k
    return ks


StopRule = Callable[[int, int, float], bool]


def stop_rule(gains: Gains, ks: Sequence[int], cost: StepCost, probes: bool,
              ratio: Callable[[float], float]) -> StopRule:
    """For a chain drafter, after budgets ks: stop(i, j, conf) -> whether sequence i, having
    drafted j tokens the last of which had confidence `conf`, should draft no more (module
    docstring). ratio(conf): how much likelier a draft of that confidence is accepted than the
    average one. Asked once per draft in drafting order; it keeps its own copy of the plan
    (later answers price against the chains already stopped) and changes nothing else."""
    ks = list(ks)
    ms = cost.step_ms(ks, probes)
    expected = sum(g[k] for g, k in zip(gains, ks))
    odds = [1.0] * len(ks)   # prod r(c) of each sequence's drafts so far

    def stop(i: int, j: int, conf: float) -> bool:
        nonlocal ms, expected
        odds[i] *= ratio(conf)
        k = ks[i]
        if j >= k or ms <= 0:
            return j >= k
        g = gains[i]
        p_j = g[j] - g[j - 1] if j >= 1 else 1.0   # P(the first j drafts are accepted)
        tail = min(1.0, p_j * odds[i]) / p_j * (g[k] - g[j]) if p_j > 0 else 0.0
        saved = ms - cost.step_ms(ks[:i] + [j] + ks[i + 1:], probes)
        if tail >= expected / ms * saved:
            return False
        expected -= g[k] - g[j]
        ms -= saved
        ks[i] = j
        return True
    return stop
