# A feasibility probe of the design in README.md (not product code): Self-Draft's context-cache
# drafting and greedy verification as fixed-shape tensor operations over the batch.
#  1. Exactness: on random caches and targets, the tokens a step emits equal the host path's
#     (ContextCache.get -> build_trie -> verify_greedy), B sequences at a time.
#  2. Launches: the torch ops one step runs, counted by a dispatch mode, at B = 1, 8, 64 (a
#     CUDA graph would replay them as one launch; on the host path they grow with B).
#  3. CPU time of one step at B = 1, 8, 64 (torch's per-op cost on this CPU: what a device's
#     launches are not).
#   python bench-results/2026-11-29-drafting-host/device_draft.py
import random
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, ".")
from specctl.speculative.context_cache import ContextCache  # noqa: E402
from specctl.speculative.trie import build_trie  # noqa: E402
from specctl.speculative.verify import verify_greedy  # noqa: E402

V, R, G, C = 320, 10, 4, 4   # vocabulary, grams kept a key, gram continuation, candidates


class DeviceContext:
    """The context cache as tensors: conts[key, slot] (G tokens), newest at ptr[key] - 1, and
    how many a key holds. (A push that repeats a gram adds it again: the host's LRU moves it to
    the front; here it is only the newest copy, which drafts the same.)"""

    def __init__(self):
        self.conts = torch.zeros(V, R, G, dtype=torch.long)
        self.ptr = torch.zeros(V, dtype=torch.long)
        self.count = torch.zeros(V, dtype=torch.long)

    def load(self, ctx: ContextCache):
        for k, q in ctx.grams.items():
            for c in q:   # oldest first
                self.conts[k, self.ptr[k] % R] = torch.tensor(c)
                self.ptr[k] += 1
                self.count[k] = min(R, self.count[k] + 1)

    def candidates(self, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, C, G] the C newest continuations of each pending token, and [B, C] which exist."""
        i = torch.arange(C)
        slot = (self.ptr[pending][:, None] - 1 - i[None, :]) % R
        return self.conts[pending[:, None], slot], i[None, :] < self.count[pending][:, None]


def layout(B: int):
    """The fixed step shape: a root and C chains of G below it; positions (depths) and the
    ancestor mask are one template for every sequence."""
    n = 1 + C * G
    depth = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, G + 1).repeat(C)])
    anc = torch.zeros(n, n, dtype=torch.bool)
    anc[:, 0] = True
    for c in range(C):
        for j in range(G):
            r = 1 + c * G + j
            anc[r, 1 + c * G:r + 1] = True
    return depth.expand(B, n), anc.expand(B, n, n)


def verify(cands: torch.Tensor, valid: torch.Tensor, target: torch.Tensor):
    """target [B, 1 + C G]: the target's argmax after the root and after each node. Per chain
    the agreeing prefix (cumprod of draft == the argmax at its parent); the longest chain, the
    first on a tie; the emitted tokens [B, G + 1] (accepted drafts, then the bonus) and their
    count [B]."""
    B = cands.shape[0]
    parent = torch.cat([target[:, :1].expand(B, C)[:, :, None],
                        target[:, 1:].view(B, C, G)[:, :, :G - 1]], dim=2)   # [B, C, G]
    agree = (cands == parent) & valid[:, :, None]
    lens = agree.long().cumprod(dim=2).sum(dim=2)                           # [B, C]
    best_len, best = lens.max(dim=1)                                        # (first max)
    chain = cands[torch.arange(B), best]                                    # [B, G]
    bonus_row = torch.where(best_len > 0, 1 + best * G + best_len - 1, torch.zeros_like(best))
    bonus = target[torch.arange(B), bonus_row]
    j = torch.arange(G + 1)[None, :]
    out = torch.where(j < best_len[:, None], torch.cat([chain, chain[:, :1]], 1),
                      torch.full((B, G + 1), -1))
    out = out.scatter(1, best_len[:, None], bonus[:, None])
    return out, best_len + 1


def host_path(ctx: ContextCache, pending: list[int], target: torch.Tensor) -> list[list[int]]:
    """The product's path: ContextCache.get, build_trie, verify_greedy, rows mapped from the
    device layout's chains to the trie's nodes by each node's path."""
    out = []
    for b, p in enumerate(pending):
        cands = ctx.get(p, C)
        tree = build_trie(cands, 1 << 20)
        # the target's argmax after each trie node: the chain layout's row of the same path
        rows = [int(target[b, 0])]
        paths = {}
        for j, (t, par) in enumerate(zip(tree.tokens, tree.parents)):
            paths[j] = (paths[par] if par >= 0 else ()) + (t,)
        for j in range(len(tree.tokens)):
            path = paths[j]
            c = next(i for i, cand in enumerate(cands) if tuple(cand[:len(path)]) == path)
            rows.append(int(target[b, 1 + c * G + len(path) - 1]))
        v = verify_greedy(tree, rows)
        out.append(v.tokens(tree))
    return out


def _targets(rng, cands, valid):
    """The target's argmax after each row as a model's would be: a function of the row's path
    (rows of one path agree). A sequence's text to come follows one of its candidates for a
    while (70%), then tokens of the path's own hash."""
    B = cands.shape[0]
    target = torch.zeros(B, 1 + C * G, dtype=torch.long)
    for b in range(B):
        n = int(valid[b].sum())
        follow = cands[b, rng.randrange(n)].tolist()[:rng.randrange(G + 1)] \
            if n and rng.random() < 0.7 else []
        salt = rng.randrange(1 << 30)

        def after(path):
            if tuple(path) == tuple(follow[:len(path)]) and len(path) < len(follow):
                return follow[len(path)]
            return hash((salt, tuple(path))) % 12
        target[b, 0] = after([])
        for c in range(C):
            for j in range(G):
                target[b, 1 + c * G + j] = after(cands[b, c, :j + 1].tolist())
    return target


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def main():
    torch.set_num_threads(1)
    rng = random.Random(0)
    bad = steps = 0
    for trial in range(300):
        ctx = ContextCache(R)
        text = [rng.randrange(12) for _ in range(400)]   # (a small alphabet: grams repeat)
        ctx.push_many((text[j], tuple(text[j + 1:j + G + 1])) for j in range(len(text) - G))
        dev = DeviceContext()
        dev.load(ctx)
        B = rng.choice([1, 8, 64])
        pending = [rng.randrange(14) for _ in range(B)]
        pt = torch.tensor(pending)
        cands, valid = dev.candidates(pt)
        target = _targets(rng, cands, valid)
        out, n = verify(cands, valid, target)
        got = [out[b, :n[b]].tolist() for b in range(B)]
        want = host_path(ctx, pending, target)
        steps += B
        bad += sum(g != w for g, w in zip(got, want))
    print(f"exactness: {steps} sequence-steps, {bad} differ from the host path")
    for B in (1, 8, 64):
        dev = DeviceContext()
        ctx = ContextCache(R)
        text = [rng.randrange(12) for _ in range(400)]
        ctx.push_many((text[j], tuple(text[j + 1:j + G + 1])) for j in range(len(text) - G))
        dev.load(ctx)
        pt = torch.tensor([rng.randrange(14) for _ in range(B)])
        target = torch.randint(0, 12, (B, 1 + C * G))
        with Count() as cnt:
            cands, valid = dev.candidates(pt)
            out, n = verify(cands, valid, target)
        ts = []
        for _ in range(200):
            t = time.perf_counter()
            cands, valid = dev.candidates(pt)
            verify(cands, valid, target)
            ts.append(time.perf_counter() - t)
        ts.sort()
        print(f"B={B:3d}: {cnt.ops} torch ops a step (candidates + verify), CPU "
              f"{ts[len(ts) // 2] * 1e6:.0f} us a step (median of 200), "
              f"{ts[len(ts) // 2] * 1e6 / B:.1f} us a sequence")


if __name__ == "__main__":
    main()
