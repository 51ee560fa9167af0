"""One verifier for every method: greedy verification and lossless speculative sampling over
draft trees. Pure functions of (tree, target distribution, random draws); no model.

Sampled tokens come from counter-based uniforms, one per output position of an answer, through
the inverse CDF (sampling.py: position_uniforms, sample_rows). ar samples that way, and so does
the verification of deterministic drafts, so their text is ar's for the same seed at any batch
size; drafts drawn from a drafter's q use speculative sampling with the request's generator.

Terms (used the same way everywhere in specctl):
- p: the target model's next-token distribution (after temperature/top-k/top-p).
- q: the drafter's distribution a draft token was drawn from. Deterministic drafts (n-grams,
  greedy drafts) have no q: they count as one-hot on the drafted token.
- accepted: draft tokens the verifier keeps; bonus: the target's own token after the last
  accepted draft. Every verification step emits accepted + 1 tokens.

A draft tree hangs below the root, the sequence's pending token (emitted, not yet in the KV
cache). Node j has a token and a parent (-1 = the root); a chain is a tree whose parents are
[-1, 0, 1, ...]. The target runs once over [root, node 0, ..., node n-1], giving n + 1 rows of
logits: row 0 predicts the token after the root, row j + 1 the token after node j. Sibling
order is candidate priority.

    tokens  = [a, b, c, d]        root -> a -> b
    parents = [-1, 0, -1, 2]      root -> c -> d
    depth   = [1, 2, 1, 2]  ->  positions (root at 7) = [7, 8, 9, 8, 9]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specctl.speculative.sampling import sample_rows


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: torch.Tensor | None = None   # [n, V] drafter distribution of each node, or None (one-hot)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        for j, p in enumerate(self.parents):
            if not -1 <= p < j:
                raise ValueError(f"node {j}: parent {p} must precede it")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def trusted(cls, tokens: list[int], parents: list[int],
                q: torch.Tensor | None = None) -> "DraftTree":
        """A tree valid by construction (a prefix or extension of valid trees, a trie): no
        per-node check (the step's ForwardBatch checks every tree's parents at once)."""
        if len(tokens) != len(parents):
            raise ValueError("tokens and parents differ in length")
        t = cls.__new__(cls)
        t.tokens, t.parents, t.q = tokens, parents, q
        return t

    @classmethod
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q)

    @property
    def is_chain(self) -> bool:
        ps = self.parents   # (a tree of two roots or more, a trie's, is told at C speed)
        return ps.count(-1) <= 1 and ps == list(range(-1, len(self.tokens) - 1))

    def prefix(self, n: int) -> "DraftTree":
        """The first n nodes (still a tree: parents precede their children)."""
        return DraftTree.trusted(self.tokens[:n], self.parents[:n],
                                 None if self.q is None else self.q[:n])

    def extend(self, other: "DraftTree") -> "DraftTree":
        """This tree's nodes, then `other`'s below the same root (q is dropped: extension
        nodes are never verified)."""
        off = len(self.tokens)
        return DraftTree.trusted(self.tokens + other.tokens,
                                 self.parents + [p if p < 0 else p + off for p in other.parents])

    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self) -> list[list[int]]:
        """children[r] for r in 0..n: r = 0 is the root, r = j + 1 is node j."""
        ch: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for j, p in enumerate(self.parents):
            ch[p + 1].append(j)
        return ch


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]   # accepted node indices, root to leaf
    bonus: int            # the target's token after the last accepted node

    def tokens(self, tree: DraftTree) -> list[int]:
        """Emitted tokens: accepted drafts then the bonus."""
        return [tree.tokens[j] for j in self.accepted] + [self.bonus]


class RowVerdicts(Sequence):
    """An `ar` step's verdicts, greedy (a row a sequence): nothing accepted, each sequence's
    bonus its row's argmax (`bonus`, what commit reads whole). Their Verdicts are made the
    first time anything else reads them, all at once, as verify made them before: a lean
    step's commit never does (a Verdict a sequence was ~15% of an `ar` step's opcodes at
    batch 64, bench-results/2026-12-01-commit-host); a step that drafted nothing but is not
    lean has its controller and drafter read them, and a second read gets the same ones."""

    def __init__(self, bonus: list[int]):
        self.bonus = bonus
        self._made: tuple[Verdict, ...] | None = None

    def _all(self) -> tuple[Verdict, ...]:
        if self._made is None:
            self._made = tuple([Verdict([], t) for t in self.bonus])
        return self._made

    def __len__(self) -> int:
        return len(self.bonus)

    def __iter__(self):
        return iter(self._all())

    def __getitem__(self, i):
        return self._all()[i]


def verify_greedy(tree: DraftTree, target: list[int]) -> Verdict:
    """target: the target's token for each of the n + 1 rows: its argmax, or (sampling, one-hot
    drafts: verify_sampling_batch) its draw. Follow the child that equals the target's choice
    as long as one exists."""
    tokens, parents = tree.tokens, tree.parents
    accepted, at, want = [], -1, target[0]
    if want not in tokens:   # (most trees: no node has the root's token; a raise costs more)
        return Verdict(accepted, want)
    # (one scan for the wanted token at C speed, from the last accepted node on: a node's
    # children come after it, so the first node there with its token and parent `at` is the
    # first such child; no children lists, ~3x less a tree of 50 nodes)
    j = 0
    try:
        while True:
            j = tokens.index(want, j)   # (ValueError: no node past j has it)
            if parents[j] == at:
                accepted.append(j)
                at, want = j, target[j + 1]
            j += 1
    except ValueError:
        return Verdict(accepted, want)


def verify_sampling(tree: DraftTree, p: torch.Tensor, rng: torch.Generator | None = None,
                    u: list[float] | None = None) -> Verdict:
    """Lossless speculative sampling over one tree: verify_sampling_batch for a batch of one.
    p: [n + 1, V] target probabilities (rows as in the module docstring); rng: for a tree with
    q; u: for a one-hot tree, the uniforms of the output positions at depths 0 .. max depth."""
    return verify_sampling_batch([tree], p, [0], [rng], [u])[0]


def verify_sampling_batch(trees: list[DraftTree], probs: torch.Tensor, starts: list[int],
                          rngs: list, us: list) -> list[Verdict]:
    """Speculative sampling for a batch: probs [R, V] (on any device) holds tree b's n_b + 1
    rows from starts[b].

    A one-hot tree (deterministic drafts: n-grams, candidates; or none) is verified against the
    target's own draws: each row's token is sampled at the uniform of its output position
    (us[b][depth], sample_rows) and the tree is walked as greedy verification walks the argmax.
    The emitted tokens are then exactly those ar samples with the same uniforms, whatever the
    drafts; a child x is accepted with probability p(x), as by the sequential rejection of
    Self-Draft / SpecInfer (which a sibling's turn renormalizes the same way), and the bonus
    follows p restricted to the tokens not drafted there.

    A tree with q (drafts sampled from the drafter's distribution: draft-verify, Kangaroo) uses
    speculative sampling with the request's generator rngs[b]: at a node each child x is
    accepted with probability min(1, p(x) / q(x)); on rejection p becomes norm(max(p - q, 0))
    and the next child is tried; the bonus is drawn from p as the walk left it. Done in two
    halves so that a batch needs two small transfers: walk_sampling decides from each draft
    token's probability at its parent's row (and whole rows only where a rejected child has a
    sibling), draw_bonus then needs the one row the walk stopped at.
    """
    idx = dict(dtype=torch.long, device=probs.device)
    plain = [b for b, t in enumerate(trees) if t.q is None]
    withq = [b for b, t in enumerate(trees) if t.q is not None]
    rows = [starts[b] + p + 1 for b in withq for p in trees[b].parents]
    toks = [x for b in withq for x in trees[b].tokens]
    if any(us[b] is None for b in plain):
        raise ValueError("a tree without q is verified at its positions' uniforms: pass them")
    prow = [starts[b] + r for b in plain for r in range(len(trees[b]) + 1)]
    u = [us[b][d] for b in plain for d in [0] + trees[b].depths()]
    parts = [probs[torch.tensor(rows, **idx), torch.tensor(toks, **idx)].double()]
    if prow:
        parts.append(sample_rows(probs[torch.tensor(prow, **idx)], u).double())
    got = torch.cat(parts).tolist()   # one transfer: the q-drafts' p, the one-hot rows' draws
    px, drawn = got[:len(rows)], [int(t) for t in got[len(rows):]]
    out: list[Verdict | None] = [None] * len(trees)
    k = 0
    for b in plain:
        n = len(trees[b]) + 1
        out[b] = verify_greedy(trees[b], drawn[k:k + n])
        k += n
    walks, k = {}, 0
    for b in withq:
        t = trees[b]
        walks[b] = walk_sampling(t, px[k:k + len(t)], lambda r, b=b: probs[starts[b] + r].cpu(),
                                 rngs[b])
        k += len(t)
    if walks:
        last = probs[[starts[b] + walks[b].row for b in withq]].cpu()   # [B_q, V]
        for i, b in enumerate(withq):
            out[b] = Verdict(walks[b].accepted, draw_bonus(walks[b], last[i], rngs[b]))
    return out


@dataclass
class SampleWalk:
    accepted: list[int]                 # accepted nodes, root to leaf
    row: int                            # the row the bonus is drawn from
    minus: torch.Tensor | None = None   # the rejected drafter distribution: max(p - q, 0)
    residual: torch.Tensor | None = None   # or the residual itself (after a sibling's turn)


def walk_sampling(tree: DraftTree, px: list[float], full, rng) -> SampleWalk:
    """The acceptance half of speculative sampling for a tree with q. px[j]: p of node j's
    token at its parent's row; full(r): row r itself, fetched only for a rejection followed by
    a sibling (no drafter makes such trees today)."""
    ch = tree.children()
    accepted, row = [], 0
    while True:
        minus, res = None, None
        kids = ch[row]
        for i, j in enumerate(kids):
            x = tree.tokens[j]
            qx = float(tree.q[j][x])
            u = torch.rand((), generator=rng, dtype=torch.float64).item()
            px_ = float(res[x]) if res is not None else px[j]
            if qx > 0 and u < min(1.0, px_ / qx):
                accepted.append(j)
                row = j + 1
                break
            if res is not None or i + 1 < len(kids):   # a sibling follows: residual needed
                if res is None:
                    base = res = full(row).double()   # (fetched once per row)
                res = _minus(res, tree.q[j].double(), base)
            else:
                minus = tree.q[j].double()
        else:
            return SampleWalk(accepted, row, minus, res)


def _minus(pr: torch.Tensor, q: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """norm(max(pr - q, 0)), or the row as it was (base) where nothing is left."""
    r = torch.clamp(pr - q, min=0.0)
    s = r.sum()
    return r / s if s > 0 else base


def draw_bonus(walk: SampleWalk, p_row: torch.Tensor, rng: torch.Generator) -> int:
    """The bonus token from the row the walk stopped at, as the walk left it."""
    pr = p_row.double()
    if walk.residual is not None:
        pr = walk.residual
    elif walk.minus is not None:
        pr = _minus(pr, walk.minus, pr)
    return int(torch.multinomial(pr.float(), 1, generator=rng).item())
