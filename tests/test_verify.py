"""The verifier on hand-built trees and distributions: greedy paths, and that speculative
sampling is lossless (emitted tokens follow p whatever the drafts)."""

from __future__ import annotations

import random

import pytest
import torch

from specctl.speculative.verify import (DraftTree, RowVerdicts, Verdict, verify_greedy,
                                        verify_sampling)
from specctl.speculative.sampling import SamplingParams, sample_rows, warp
from helpers import chi_square_ok
from specctl.engine.batch import tree_layout


def test_tree_mask_positions_worked_example():
    t = DraftTree([10, 11, 12, 13], [-1, 0, -1, 2])
    assert t.depths() == [1, 2, 1, 2]
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],
                             [1, 0, 0, 1, 0],
                             [1, 0, 0, 1, 1]], dtype=torch.bool)
    anc, depth = tree_layout([t.parents], len(t) + 1)   # (the step lays trees out so)
    assert torch.equal(torch.from_numpy(anc[0]), expected)
    assert depth[0].tolist() == [0] + t.depths()
    assert DraftTree.chain([1, 2, 3]).is_chain and not t.is_chain
    with pytest.raises(ValueError):
        DraftTree([1, 2], [1, -1])


def test_greedy_chain_and_tree():
    chain = DraftTree.chain([5, 6, 7])
    # target rows: after root -> 5, after 5 -> 6, after 6 -> 9 (rejects 7), after 7 -> 1
    v = verify_greedy(chain, [5, 6, 9, 1])
    assert v.accepted == [0, 1] and v.bonus == 9 and v.tokens(chain) == [5, 6, 9]
    assert verify_greedy(chain, [5, 6, 7, 1]).tokens(chain) == [5, 6, 7, 1]
    assert verify_greedy(chain, [4, 6, 7, 1]).tokens(chain) == [4]
    assert verify_greedy(DraftTree(), [3]).tokens(DraftTree()) == [3]
    # two branches: root -> 5 -> 6 and root -> 8 -> 9; the target wants 8 then 9 then 2
    tree = DraftTree([5, 6, 8, 9], [-1, 0, -1, 2])
    v = verify_greedy(tree, [8, 0, 0, 9, 2])
    assert v.accepted == [2, 3] and v.tokens(tree) == [8, 9, 2]



def _greedy_by_children(tree: DraftTree, target: list[int]) -> Verdict:
    """The definition: from the root, the first child (in node order) holding the target's
    token, while there is one."""
    ch = tree.children()
    accepted, row = [], 0
    while True:
        nxt = next((j for j in ch[row] if tree.tokens[j] == target[row]), None)
        if nxt is None:
            return Verdict(accepted, target[row])
        accepted.append(nxt)
        row = nxt + 1


def test_greedy_follows_the_first_matching_child_of_any_tree():
    """verify_greedy's one scan equals the walk by children lists, on trees whose siblings
    share tokens (a trie's never do; a hand-built tree's may) and whose nodes repeat tokens
    of their ancestors and cousins."""
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.choice([0, 1, 2, 5, 12, 40])
        tree = DraftTree([rng.randrange(3) for _ in range(n)],
                         [rng.randrange(-1, j) for j in range(n)])
        target = [rng.randrange(3) for _ in range(n + 1)]
        assert verify_greedy(tree, target) == _greedy_by_children(tree, target)
        assert tree.is_chain == (tree.parents == list(range(-1, n - 1)))


V = 6
P0 = torch.tensor([0.05, 0.40, 0.25, 0.10, 0.15, 0.05])
Q0 = torch.tensor([0.30, 0.10, 0.30, 0.10, 0.10, 0.10])


def _first_tokens(make_tree, p_rows, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, dtype=torch.float64)
    for _ in range(n):
        tree = make_tree(g)
        u = torch.rand(1 + max(tree.depths(), default=0), generator=g, dtype=torch.float64)
        tok = verify_sampling(tree, p_rows(tree), g, u.tolist()).tokens(tree)[0]
        counts[tok] += 1
    return counts


@pytest.mark.parametrize("case", ["chain_with_q", "one_hot_candidates", "no_draft"])
def test_sampling_first_token_follows_p(case):
    if case == "chain_with_q":
        def make(g):   # the draft is a sample of q, as a real drafter's is
            x = int(torch.multinomial(Q0, 1, generator=g))
            return DraftTree.chain([x], Q0[None])
    elif case == "one_hot_candidates":
        def make(g):   # deterministic candidates (n-grams), duplicates included
            return DraftTree([2, 2, 4, 1], [-1, -1, -1, -1])
    else:
        def make(g):
            return DraftTree()
    counts = _first_tokens(make, lambda t: P0.expand(len(t) + 1, V), n=20000)
    assert chi_square_ok(counts, P0)


def test_sampling_wrong_verifier_is_caught():
    """The test above can fail: accepting drafts unconditionally biases towards q."""
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(V, dtype=torch.float64)
    for _ in range(20000):
        counts[int(torch.multinomial(Q0, 1, generator=g))] += 1
    assert not chi_square_ok(counts, P0)


def test_sampling_two_tokens_follow_joint_p():
    """Depth 2 with a q-drawn chain: the pair of emitted tokens follows p(x1) p(x2 | x1)."""
    cond = torch.softmax(torch.arange(V * V, dtype=torch.float64).view(V, V).sin() * 2, -1).float()
    q1 = torch.softmax(torch.arange(V * V, dtype=torch.float64).view(V, V).cos() * 2, -1).float()
    g = torch.Generator().manual_seed(1)
    n = 30000
    counts = torch.zeros(V * V, dtype=torch.float64)
    for _ in range(n):
        x1 = int(torch.multinomial(Q0, 1, generator=g))
        x2 = int(torch.multinomial(q1[x1], 1, generator=g))
        tree = DraftTree.chain([x1, x2], torch.stack([Q0, q1[x1]]))
        rows = torch.stack([P0, cond[x1], P0])   # row 2 (after x2) unused for the first pair
        toks = verify_sampling(tree, rows, g).tokens(tree)
        if len(toks) == 1:   # x1 rejected: the second token would come from the next step
            toks.append(int(torch.multinomial(cond[toks[0]], 1, generator=g)))
        counts[toks[0] * V + toks[1]] += 1
    joint = (P0[:, None] * cond).reshape(-1)
    assert chi_square_ok(counts, joint)


def test_warp_top_k_top_p():
    logits = torch.log(P0)[None]
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))[0]
    assert torch.allclose(p, torch.tensor([0, 0.4, 0.25, 0, 0, 0]) / 0.65)
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.7))[0]   # 0.40 + 0.25 + 0.15
    assert torch.allclose(p, torch.tensor([0, 0.4, 0.25, 0, 0.15, 0]) / 0.8)
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.35))[0]   # the top token alone
    assert torch.allclose(p, torch.tensor([0, 1.0, 0, 0, 0, 0]))


def test_top1_is_argmax_and_softmax_max():
    from specctl.speculative.sampling import top1
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 49152, generator=g) * 4
    logits[2, 40000] = 60.0                              # a confident row, a late token id
    toks, conf = top1(logits)
    p = torch.softmax(logits, -1)
    assert toks == p.argmax(-1).tolist() and toks[2] == 40000
    assert torch.allclose(torch.tensor(conf, dtype=torch.float64), p.max(-1).values.double(),
                          rtol=1e-5)


def _reference_sampling(tree, p, rng):
    """verify_sampling as it was before the two-phase split (chi-square tested above): the
    walk over whole rows."""
    ch = tree.children()
    accepted, row = [], 0
    while True:
        pr = p[row].double().clone()
        moved = False
        for j in ch[row]:
            x = tree.tokens[j]
            u = torch.rand((), generator=rng, dtype=torch.float64).item()
            qj = tree.q[j].double()
            if qj[x] > 0 and u < min(1.0, (pr[x] / qj[x]).item()):
                moved = True
            else:
                pr = torch.clamp(pr - qj, min=0.0)
            if moved:
                accepted.append(j)
                row = j + 1
                break
            s = pr.sum()
            pr = pr / s if s > 0 else p[row].double().clone()
        if not moved:
            return Verdict(accepted, int(torch.multinomial(pr.float(), 1, generator=rng).item()))


def test_one_hot_trees_emit_exactly_ar_samples():
    """A tree of deterministic drafts (siblings, duplicates, several levels, zero-probability
    tokens) emits exactly the tokens ar draws one by one at the same position uniforms, with
    each row's distribution depending on the path to it; and accepts drafts that way."""
    from specctl.speculative.sampling import position_uniforms, sample_rows
    vocab = 5
    g = torch.Generator().manual_seed(0)

    def dist(path):   # the target's p after `path`: a function of the whole path
        h = torch.Generator().manual_seed(hash(tuple(path)) % 2**31)
        p = torch.softmax(torch.randn(vocab, generator=h) * 2, -1)
        p[len(path) % vocab] = 0.0                   # a warped-away token
        return p / p.sum()
    accepted = 0
    for case in range(400):
        n = int(torch.randint(0, 7, (), generator=g))
        parents = [int(torch.randint(-1, j, (), generator=g)) for j in range(n)]
        tree = DraftTree(torch.randint(0, vocab, (n,), generator=g).tolist(), parents)
        paths = [[]]
        for j, par in enumerate(parents):
            paths.append(paths[par + 1] + [tree.tokens[j]])
        u = position_uniforms(case, 7, 3, 1 + max(tree.depths(), default=0))
        v = verify_sampling(tree, torch.stack([dist(pth) for pth in paths]), None, u)
        ar = []   # ar: one draw per position from the path so far
        for d in range(len(v.accepted) + 1):
            ar.append(int(sample_rows(dist(ar)[None], [u[d]])[0]))
        assert v.tokens(tree) == ar, (case, tree, v)
        accepted += len(v.accepted)
    assert accepted > 50
    with pytest.raises(ValueError, match="uniforms"):
        verify_sampling(DraftTree([1], [-1]), torch.full((2, vocab), 0.2), None)


def test_sample_rows_follows_p_and_skips_zeros():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.2, 0.0, 0.0, 0.0, 0.8]]).double()
    u = torch.linspace(0, 1 - 2 ** -53, 1001).tolist()
    got = [sample_rows(p, [x, x]).tolist() for x in u]
    assert {a for a, _ in got} == {1, 3} and {b for _, b in got} == {0, 4}
    assert abs(sum(a == 1 for a, _ in got) / len(u) - 0.5) < 0.01
    assert abs(sum(b == 0 for _, b in got) / len(u) - 0.2) < 0.01


@pytest.mark.parametrize("kind", ["q_chain", "q_siblings"])
def test_two_phase_sampling_equals_whole_row_walk(kind):
    """Same trees, same random streams: the two-phase verifier decides exactly as the whole-row
    walk did, including sibling rejections and warped (zero-mass) rows."""
    g = torch.Generator().manual_seed(3)
    vocab = 7
    for case in range(1500):
        n = int(torch.randint(0, 6, (), generator=g))
        parents = [int(torch.randint(-1, j, (), generator=g)) if kind != "q_chain" else j - 1
                   for j in range(n)]
        tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
        p = torch.softmax(torch.randn(n + 1, vocab, generator=g) * 2, -1)
        p[:, int(torch.randint(0, vocab, (), generator=g))] = 0.0   # warped-away tokens
        if case % 7 == 0:                                            # a one-token row
            p[0] = torch.nn.functional.one_hot(torch.tensor(tokens[0] if n else 0), vocab)
        p = p / p.sum(-1, keepdim=True)
        q = torch.softmax(torch.randn(n, vocab, generator=g), -1)
        tree = DraftTree(tokens, parents, q)
        seed = 1000 + case
        want = _reference_sampling(tree, p, torch.Generator().manual_seed(seed))
        got = verify_sampling(tree, p, torch.Generator().manual_seed(seed))
        assert got == want, (case, tree, got, want)


def test_an_ar_steps_verdicts_are_made_where_asked_for_and_equal_verdicts():
    """RowVerdicts (an ar step's, greedy): each item, slice and iteration gives the Verdict a
    row's argmax makes (nothing accepted, that token the bonus); commit reads `bonus` whole."""
    v = RowVerdicts([7, 3, 9])
    assert len(v) == 3 and v.bonus == [7, 3, 9]
    assert list(v) == [Verdict([], 7), Verdict([], 3), Verdict([], 9)]
    assert v[1] == Verdict([], 3) and v[-1] == Verdict([], 9) and list(v[1:]) == list(v)[1:]
    assert v[0] is v[0]   # (made once: read again, the same Verdict)
    assert v[0].tokens(DraftTree([], [])) == [7] and not any(x.accepted for x in v)
    with pytest.raises(IndexError):
        v[3]
