"""One verifier for every method: greedy verification and lossless speculative sampling over
draft trees. Pure functions of (tree, target distribution, rng); no model.

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

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch


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
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def prefix(self, n: int) -> "DraftTree":
        """The first n nodes (still a tree: parents precede their children)."""
        return DraftTree(self.tokens[:n], self.parents[:n], None if self.q is None else self.q[:n])

    def extend(self, other: "DraftTree") -> "DraftTree":
        """This tree's nodes, then `other`'s below the same root (q is dropped: extension
        nodes are never verified)."""
        off = len(self.tokens)
        return DraftTree(self.tokens + other.tokens,
                         self.parents + [p if p < 0 else p + off for p in other.parents])

    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def mask(self) -> torch.Tensor:
        """[n+1, n+1] bool over [root, nodes]: each row sees itself and its ancestors."""
        n = len(self.tokens)
        m = np.zeros((n + 1, n + 1), dtype=bool)
        m[:, 0] = True
        for j, p in enumerate(self.parents):
            if p >= 0:
                m[j + 1] = m[p + 1]
            m[j + 1, j + 1] = True
        return torch.from_numpy(m)

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


def top1(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """Greedy drafting's read-back: each row's argmax and its softmax probability (the draft's
    confidence), computed without materializing the softmax and fetched in one transfer."""
    lf = logits.float()
    m, tok = lf.max(-1)
    conf = torch.exp(m - torch.logsumexp(lf, -1))
    toks, confs = torch.stack([tok.double(), conf.double()]).tolist()
    return [int(t) for t in toks], confs


def draw_drafts(logits: torch.Tensor, sp: SamplingParams, rngs: list) -> tuple:
    """One draft token per row of [B, V] draft logits, for the drafting loops: greedy, each
    row's argmax (q None); sampling, a draw from the warped distribution q [B, V] (kept on the
    host, where each request's generator is) with request i's generator. Returns (tokens, the
    confidence the draft exits on, q)."""
    if sp.greedy:
        toks, conf = top1(logits)
        return toks, conf, None
    q = warp(logits, sp).cpu()
    conf = q.max(-1).values.tolist()
    toks = [int(torch.multinomial(q[i], 1, generator=g).item()) for i, g in enumerate(rngs)]
    return toks, conf, q


def verify_greedy(tree: DraftTree, target: list[int]) -> Verdict:
    """target: argmax of the n + 1 target rows. Follow the child that equals the target's
    choice as long as one exists."""
    ch = tree.children()
    accepted, row = [], 0
    while True:
        want = target[row]
        nxt = next((j for j in ch[row] if tree.tokens[j] == want), None)
        if nxt is None:
            return Verdict(accepted, want)
        accepted.append(nxt)
        row = nxt + 1


def verify_sampling(tree: DraftTree, p: torch.Tensor, rng: torch.Generator) -> Verdict:
    """Lossless speculative sampling over a tree (recursive rejection over siblings).

    p: [n + 1, V] target probabilities (rows as in the module docstring).
    At a node, each child x in order is accepted with probability min(1, p(x) / q(x)); on
    rejection p becomes norm(max(p - q, 0)) (one-hot q: p(x) is zeroed and p renormalized) and
    the next child is tried. If all children fail (or there are none), the bonus is drawn from
    the current p. With one child this is standard speculative sampling; with one-hot q it is
    the sequential-candidate acceptance of Self-Draft / SpecInfer.

    Done in two halves so that a batch needs no more than two small transfers from the device
    (verify_sampling_batch): walk_sampling decides acceptance from each draft token's
    probability at its parent's row and the totals of rows with siblings; draw_bonus then needs
    the one row the walk stopped at.
    """
    return verify_sampling_batch([tree], p, [0], [rng])[0]


def verify_sampling_batch(trees: list[DraftTree], probs: torch.Tensor, starts: list[int],
                          rngs: list[torch.Generator]) -> list[Verdict]:
    """verify_sampling for a batch: probs [R, V] (on any device) holds tree b's n_b + 1 rows
    from starts[b]. Reads back the draft tokens' probabilities and the sibling rows' totals in
    one transfer, then the row each walk stopped at, one per tree, in another."""
    rows = [starts[b] + p + 1 for b, t in enumerate(trees) for p in t.parents]
    toks = [x for t in trees for x in t.tokens]
    multi = sorted(r for r, c in Counter(rows).items() if c > 1)   # totals: for siblings
    idx = dict(dtype=torch.long, device=probs.device)
    px = probs[torch.tensor(rows, **idx), torch.tensor(toks, **idx)]
    got = torch.cat([px.double(), probs[torch.tensor(multi, **idx)].double().sum(-1)]).tolist()
    px, total = got[:len(rows)], dict(zip(multi, got[len(rows):]))
    walks, k = [], 0
    for b, (t, rng) in enumerate(zip(trees, rngs)):
        sums = [total.get(starts[b] + r, 1.0) for r in range(len(t) + 1)]
        walks.append(walk_sampling(t, px[k:k + len(t)], sums,
                                   lambda r, b=b: probs[starts[b] + r].cpu(), rng))
        k += len(t)
    last = probs[[starts[b] + w.row for b, w in enumerate(walks)]].cpu()   # [B, V]
    return [Verdict(w.accepted, draw_bonus(w, last[b], rng))
            for b, (w, rng) in enumerate(zip(walks, rngs))]


@dataclass
class SampleWalk:
    accepted: list[int]                 # accepted nodes, root to leaf
    row: int                            # the row the bonus is drawn from
    zeroed: list[int]                   # its tokens rejected (one-hot drafts): p(x) := 0
    minus: torch.Tensor | None = None   # or the rejected drafter distribution: max(p - q, 0)
    residual: torch.Tensor | None = None   # or the residual itself (siblings with q)


def walk_sampling(tree: DraftTree, px: list[float], sums: list[float], full, rng) -> SampleWalk:
    """The acceptance half of verify_sampling. px[j]: p of node j's token at its parent's row;
    sums[r]: row r's total (it matters only for rows with several children: a row's only child
    rejected ends the walk there, and draw_bonus renormalizes the row itself); full(r): row r
    itself, fetched only for a drafter distribution's rejection followed by a sibling (no
    drafter makes such trees today)."""
    ch = tree.children()
    accepted, row = [], 0
    while True:
        zeroed, mass, minus, res = [], sums[row], None, None
        kids = ch[row]
        for i, j in enumerate(kids):
            x = tree.tokens[j]
            u = torch.rand((), generator=rng, dtype=torch.float64).item()
            if res is not None:                          # after a q rejection: the full residual
                qx = float(tree.q[j][x])
                ok = qx > 0 and u < min(1.0, float(res[x]) / qx)
            elif tree.q is None:
                pj = 0.0 if x in zeroed else px[j]
                ok = u < (pj / mass if zeroed else pj)   # (the first child: p as it is)
            else:
                qx = float(tree.q[j][x])
                ok = qx > 0 and u < min(1.0, px[j] / qx)
            if ok:
                accepted.append(j)
                row = j + 1
                break
            if tree.q is None:
                if x not in zeroed:
                    zeroed.append(x)
                    mass -= pj
                if mass <= 0:                            # nothing left: p as it was
                    zeroed, mass = [], sums[row]
            elif res is not None or i + 1 < len(kids):   # a sibling follows: residual needed
                if res is None:
                    base = res = full(row).double()   # (fetched once per row)
                res = _minus(res, tree.q[j].double(), base)
            else:
                minus = tree.q[j].double()
        else:
            return SampleWalk(accepted, row, zeroed, minus, res)


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
    elif walk.zeroed:
        pr = pr.clone()
        pr[walk.zeroed] = 0.0
        s = pr.sum()
        pr = pr / s if s > 0 else p_row.double()
    return int(torch.multinomial(pr.float(), 1, generator=rng).item())


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0    # 0 = greedy
    top_k: int = 0              # 0 = off
    top_p: float = 1.0          # 1 = off
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """[N, V] logits -> [N, V] probabilities with temperature, top-k and top-p applied
    (the same warping is applied to p and to q)."""
    x = logits.float() / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sp.top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_x, dim=-1) >= sp.top_p   # keep the smallest nucleus
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, idx, sorted_x)
    return torch.softmax(x, dim=-1)
