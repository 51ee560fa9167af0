"""Self-Draft's draft tree and probe from token lists: candidates merged into a trie below the
root (a shared prefix computed once, sibling order their priority), branches as chains."""

from __future__ import annotations

from specctl.speculative.verify import DraftTree


def build_trie(candidates: list[list[int]], budget: int,
               sizes: list[int] | None = None) -> DraftTree:
    """Candidates (in priority order) merged into a tree below the root, at most `budget` nodes
    (a candidate that does not fit is cut; a prefix of a candidate is still a valid draft).
    `sizes`, if given, receives the node count after each candidate."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}   # (parent node, token) -> node
    n = 0
    for cand in candidates:
        at = -1
        for t in cand:
            key = (at, t)
            nxt = child.get(key)
            if nxt is None:
                if n >= budget:
                    break
                child[key] = nxt = n
                n += 1
                tokens.append(t)
                parents.append(at)
            at = nxt
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
