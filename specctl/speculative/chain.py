"""The chain-drafting loop draft-verify and Kangaroo share (gpt-fast's one-function loop, over
a batch).

All sequences draft in lockstep: one draft forward per depth over the sequences still drafting,
each adding one token to its chain. A chain ends at its cap, when the drafter's own exit
rejects a draft (`keep`: the paper's confidence threshold; that draft is dropped), or when the
controller's confidence stop says so (`stop`, asked after each kept draft while under the cap;
the chain records where: `stopped_at`).

With `tail` (Kangaroo), a chain that ended at its cap or by `stop` runs one more forward that
drafts nothing (its last draft's states, which the verify starts from), and a sequence with
cap 0 runs that one forward for its pending token. A chain the drafter's exit ended needs none:
the forward that drafted the rejected token already ran its last input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from specctl.speculative.drafter import StopRule

# forward(rows, inputs, depth, drafting) -> (tokens, confidences, q) of the `drafting` positions
# (indices into rows), or (None, None, None) when nothing drafts: runs one draft forward over
# the sequences `rows` (indices into the batch), each on its input token, `depth` tokens past
# its committed length
Forward = Callable[[list[int], list[int], int, list[int]], tuple]


@dataclass
class Chain:
    tokens: list[int] = field(default_factory=list)
    conf: list[float] = field(default_factory=list)   # the drafter's probability of each token
    q: list[torch.Tensor] = field(default_factory=list)   # sampling: each draft's distribution
    forwards: int = 0                # draft forwards it ran
    stopped_at: int | None = None    # drafts when `stop` ended it


def draft_chains(caps: list[int], first: list[int], forward: Forward,
                 keep: Callable[[float], bool], stop: StopRule | None = None,
                 tail: bool = False) -> list[Chain]:
    """Chains of at most caps[i] drafts starting after first[i] (module docstring)."""
    chains = [Chain() for _ in caps]
    active = [(i, tail and c <= 0) for i, c in enumerate(caps) if tail or c > 0]
    last = list(first)
    depth = 0
    while active:
        rows = [i for i, _ in active]
        drafting = [j for j, (_, done) in enumerate(active) if not done]
        toks, conf, q = forward(rows, [last[i] for i in rows], depth, drafting)
        depth += 1
        at = {j: m for m, j in enumerate(drafting)}
        nxt = []
        for j, (i, done) in enumerate(active):
            c = chains[i]
            c.forwards += 1
            if done:
                continue
            m = at[j]
            if not keep(conf[m]):
                continue
            c.tokens.append(toks[m])
            c.conf.append(conf[m])
            if q is not None:
                c.q.append(q[m])
            last[i] = toks[m]
            n = len(c.tokens)
            if n < caps[i] and stop is not None and stop(i, n, conf[m]):
                c.stopped_at = n
            if n < caps[i] and c.stopped_at is None:
                nxt.append((i, False))
            elif tail:
                nxt.append((i, True))
        active = nxt
    return chains
