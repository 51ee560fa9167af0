"""A drafting step as array operations over the batch (issue 52: a Self-Draft drafting step
whose host work does not grow in Python with the batch; bench-results/2026-11-29-drafting-host):
the context cache's candidates as C chains of G tokens below each sequence's pending token,
one layout for every sequence.

    root, chain 0 (G nodes), chain 1, ... chain C-1:   n = 1 + C G rows a sequence

Its positions and mask are a template made once; its tokens are one gather from the context
table (speculative/context_table.py); greedy verification keeps, per chain, the prefix that
agrees with the target's own argmax, and takes the longest chain (the first on a tie: tied
chains emit the same tokens, the target's). A candidate its key lacks, or a node deeper than
the sequence's room, is never accepted; its slot still holds some token, which is safe: an
accepted draft equals the target's own token whatever it came from. So the step emits exactly
`ar`'s text, and what it does a sequence in Python is what `ar`'s step does: read its tokens
and emit them.

The price of one layout for every sequence and step: a chain costs more rows than the trie
the per-sequence path merges the same candidates into (~20% on the demo model, shape.py
there), and a sequence without candidates still runs its C G rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specctl.engine.batch import ForwardBatch
from specctl.speculative.context_table import ContextTable
from specctl.speculative.drafter import Proposal
from specctl.speculative.verify import DraftTree, Verdict


def chain_layout(C: int, G: int) -> tuple[np.ndarray, np.ndarray]:
    """(depth [n], ancestors [n, n] bool) of a root and C chains of G nodes below it, n = 1 +
    C G: node j of chain c is row 1 + c G + j, at depth j + 1, and sees the root, the nodes
    of its chain up to itself, and nothing else new."""
    n = 1 + C * G
    depth = np.concatenate([[0], np.tile(np.arange(1, G + 1), C)]).astype(np.int64)
    anc = np.zeros((n, n), dtype=bool)
    anc[:, 0] = True
    for c in range(C):
        for j in range(G):
            r = 1 + c * G + j
            anc[r, 1 + c * G:r + 1] = True
    return depth, anc


def verify_chains(cands: np.ndarray, usable: np.ndarray,
                  target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cands [B, C, G] drafts, usable [B, C, G] which of them may be accepted, target [B, n]
    the target's argmax after the root and after each node: (accepted [B], the chain they come
    from [B], the emitted tokens [B, G + 1]: the accepted drafts, then the target's token after
    the last, then anything)."""
    B, C, G = cands.shape
    after = np.empty_like(cands)   # the target's token after each node's parent
    after[:, :, 0] = target[:, :1]
    after[:, :, 1:] = target[:, 1:].reshape(B, C, G)[:, :, :G - 1]
    agree = (cands == after) & usable
    lens = np.cumprod(agree, axis=2).sum(axis=2)                     # [B, C]
    best = lens.argmax(axis=1)                                        # (the first longest)
    rows = np.arange(B)
    acc = lens[rows, best]
    out = np.empty((B, G + 1), dtype=cands.dtype)
    out[:, :G] = cands[rows, best]
    out[:, G] = 0
    out[rows, acc] = target[rows, np.where(acc > 0, best * G + acc, 0)]   # the bonus
    return acc, best, out


@dataclass(frozen=True)
class GridDrafts:
    """A grid step's drafts (GridStep.plan): candidates [B, C, G]; the slots each sequence's
    room and budget allow [B, C, G]; of those, the ones holding a candidate (`usable`: they
    may be accepted)."""
    cands: np.ndarray
    allowed: np.ndarray
    usable: np.ndarray

    def drafted(self) -> np.ndarray:
        """Drafts each sequence could accept [B]."""
        return self.usable.reshape(len(self.usable), -1).sum(axis=1)


class GridProposals(Sequence):
    """The step's proposals as the controller and the accounting read them (a draft of so many
    nodes, no probe, no confidence stop), made one at a time where they are asked for: the
    step itself never makes them. Their size is the slots the budget allowed, with or without
    a candidate: the step runs every one of them, so the controller learns what a slot of the
    grid is worth (an empty one accepts nothing), not only a candidate's (counting candidates
    alone, one b64 run expected 1.7x the tokens its drafting steps gave, and lost)."""

    def __init__(self, drafts: GridDrafts):
        self.sizes = drafts.allowed.reshape(len(drafts.allowed), -1).sum(axis=1).tolist()

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Proposal(DraftTree.trusted([0] * self.sizes[i], [-1] * self.sizes[i]))


class GridVerdicts(Sequence):
    """The step's verdicts, made one at a time where they are asked for. A verdict's accepted
    nodes are numbered as the controller learns them: the sequence's allowed slots chain after
    chain (GridProposals' sizes), so its chain's first node is the slots before it (`start`:
    c G where room lets every chain be whole)."""

    def __init__(self, acc: list[int], best: list[int], start: list[int],
                 out: list[list[int]]):
        self.acc, self.best, self.start, self.out = acc, best, start, out

    def __len__(self) -> int:
        return len(self.acc)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a, c = self.acc[i], self.start[i]
        return Verdict(list(range(c, c + a)), self.out[i][a])


class GridStep:
    """Self-Draft's drafting step over a batch, from a context table (greedy)."""

    def __init__(self, table: ContextTable, cands: int):
        self.table, self.C, self.G = table, min(cands, table.R), table.G
        self.at = np.arange(self.G)   # each node's depth - 1
        self._layouts: dict[int, tuple] = {}

    def layout(self, C: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(depth [n], ancestors [n, n], each draft's node index [C, G]) of C chains: made once."""
        got = self._layouts.get(C)
        if got is None:
            got = self._layouts[C] = (*chain_layout(C, self.G),
                                      np.arange(C * self.G).reshape(C, self.G))
        return got

    def plan(self, slots: list[int], lens: list[int], pending: list[int], room: list[int],
             budget: list[int] | None, device) -> tuple[ForwardBatch, GridDrafts]:
        """The step's batch and drafts: each sequence's C newest candidates (C: enough chains
        for the largest budget, at most the drafter's), accepted no deeper than its room and,
        chain after chain, within its budget of nodes (None: every node)."""
        B, G = len(slots), self.G
        C = self.C if budget is None else max(1, min(self.C, -(-max(budget) // G)))
        depth, anc, node = self.layout(C)
        pend = np.array(pending, dtype=np.int64)
        cands, held = self.table.candidates(pend, C)
        allowed = np.broadcast_to(self.at[None, None, :] < np.array(room)[:, None, None],
                                  (B, C, G))
        if budget is not None:
            allowed = allowed & (node[None, :, :] < np.array(budget)[:, None, None])
        tokens = np.concatenate([pend[:, None], cands.reshape(B, -1)], axis=1)
        return (ForwardBatch.grid(slots, lens, tokens, depth, anc, device),
                GridDrafts(cands, allowed, allowed & held[:, :, None]))

    def verify(self, drafts: GridDrafts, target) -> GridVerdicts:
        """The step's verdicts from the target's argmax over its rows (a tensor: its read-back
        is the step's first wait)."""
        B = len(drafts.cands)
        acc, best, out = verify_chains(drafts.cands, drafts.usable,
                                       target.cpu().numpy().reshape(B, -1))
        per = drafts.allowed.sum(axis=2)                  # allowed slots per chain [B, C]
        start = (np.cumsum(per, axis=1) - per)[np.arange(B), best]
        return GridVerdicts(acc.tolist(), best.tolist(), start.tolist(), out.tolist())

    def commit(self, kv, slots: list[int], acc: list[int], best: list[int]) -> None:
        """Each sequence keeps its root and its accepted rows: in place (kv.advance) unless
        they came from a chain past the first (kv.commit_many moves them)."""
        G, moved, still, kept = self.G, [], [], []
        for s, a, c in zip(slots, acc, best):
            if a and c:
                moved.append((s, [0, *range(1 + c * G, 1 + c * G + a)]))
            else:
                still.append(s)
                kept.append(a + 1)
        if moved:
            kv.commit_many(moved)
        kv.advance(still, kept)
