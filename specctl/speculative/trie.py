"""Self-Draft's draft tree and probe from token lists: candidates merged into a trie below the
root (a shared prefix computed once, sibling order their priority), branches as chains."""

from __future__ import annotations

from specctl.speculative.verify import DraftTree


def build_trie(candidates: list[list[int]], budget: int,
               sizes: list[int] | None = None) -> DraftTree:
    """Candidates (in priority order) merged into a tree below the root, at most `budget` nodes
    (a candidate that does not fit is cut; a prefix of a candidate is still a valid draft).
    `sizes`, if given, receives the node count after each candidate.
    A candidate walks the trie while its tokens are there; the rest of it is new (a new node
    has no children yet), so it is added in one go, as a chain below where the walk ended:
    a token a list operation, not a lookup (a b8 drafting step's tries were ~18% of its
    Python, bench-results/2026-12-01-commit-host)."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}   # (parent node, token) -> node
    get, n = child.get, 0
    for cand in candidates:
        at, j, m = -1, 0, len(cand)
        while j < m:
            nxt = get((at, cand[j]))
            if nxt is None:
                break
            at, j = nxt, j + 1
        k = min(m - j, budget - n)
        if k > 0:
            new = [at, *range(n, n + k - 1)]   # (the chain's parents)
            added = cand[j:j + k]
            child.update(zip(zip(new, added), range(n, n + k)))
            tokens += added
            parents += new
            n += k
        if sizes is not None:
            sizes.append(n)
    return DraftTree.trusted(tokens, parents)


def branch_probe(branches: list[list[int]]) -> DraftTree:
    """The branches as chains below the root, one after the other."""
    tokens: list[int] = []
    parents: list[int] = []
    for br in branches:
        if br:
            n = len(tokens)
            parents.append(-1)
            parents.extend(range(n, n + len(br) - 1))
            tokens.extend(br)
    return DraftTree.trusted(tokens, parents)
