"""The start-up self-check of `--exact`: the model's own weights and shapes, this machine.

engine/exact.py fixes every reduction's order in specctl's code where it can (attention's sum
over keys in fixed blocks, exp from basic operations) and uses library matmuls only on shapes
its probe found row-invariant on random weights. Neither is proof for the model at hand: a
kernel may pick another path for another weight shape or value range. So before `--exact`
runs, one token's row is computed alone and then inside a prefill of 16 prompts, inside a
chain and inside a tree among other sequences' drafts, every operation's output for that row
recorded (each linear, RoPE, attention, the activation, the LM head): all bits equal, or the first
operation that differed is named and `--exact` refused. ~1.5 s on the demo model on 2 cores.
"""

from __future__ import annotations

import random

import torch

from specctl.engine.batch import ForwardBatch, SeqInput

LINEARS = ("QKV projection", "output projection", "gate/up projection", "down projection")
PROMPT = 37            # the checked prompt's tokens
OTHERS = 15            # other prompts beside it in the batched prefill
LONG = 100             # one of them this long


class Recorder:
    """Wraps the model's per-op callables; records one row's output of each call."""

    def __init__(self, model):
        self.model, self.row, self.log = model, 0, []
        self.saved = (model.linear, model.attend, model.act, model.apply_rope)
        lin, att, act, rope = self.saved
        model.linear = lambda x, w, b=None: self._keep("linear", lin(x, w, b))
        model.attend = lambda q, k, v, meta, **kw: self._keep("attention", att(q, k, v, meta,
                                                                                **kw))
        model.act = lambda x: self._keep(model.cfg.act, act(x))
        model.apply_rope = lambda x, c, s: self._keep("rope", rope(x, c, s))

    def _keep(self, kind: str, out: torch.Tensor) -> torch.Tensor:
        self.log.append((kind, out[self.row].clone()))
        return out

    def take(self, row: int, run) -> list:
        """The ops' outputs for `row` while run() runs."""
        self.row, self.log = row, []
        run()
        return self.log

    def restore(self) -> None:
        m = self.model
        m.linear, m.attend, m.act, m.apply_rope = self.saved


def op_name(log: list, at: int, num_layers: int) -> str:
    """Which operation the at-th recorded output is, for a message."""
    kind = log[at][0]
    k = sum(1 for q, _ in log[:at] if q == kind)
    if kind == "linear":
        return "the LM head" if k >= 4 * num_layers else \
            f"layer {k // 4}'s {LINEARS[k % 4]} (a matmul)"
    return f"layer {k}'s {kind}"


def first_difference(a: list, b: list, num_layers: int) -> str | None:
    for i, ((ka, x), (kb, y)) in enumerate(zip(a, b)):
        if ka != kb or not torch.equal(x, y):
            return op_name(a, i, num_layers)
    return None if len(a) == len(b) else "the forward's operations"


@torch.inference_mode()
def self_check(model) -> str | None:
    """None if one row's every operation gives the same bits alone and in a batch of 16, in a
    chain and in a tree (module docstring); else where they first differed."""
    rng = random.Random(0)
    V, L = model.cfg.vocab_size, model.cfg.num_layers
    prompt = [rng.randrange(V) for _ in range(PROMPT)]
    step = [rng.randrange(V) for _ in range(5)]
    rec = Recorder(model)
    try:
        kv = model.new_kv_cache(1, 64)
        kv.reserve(0, 64)   # (the prompt's keys in one block of 64: exact.KEY_BLOCK)
        fwd = (lambda kv_, seqs: model.logits(model.forward(ForwardBatch(seqs, model.device),
                                                            kv_)))
        alone = rec.take(PROMPT - 1, lambda: fwd(kv, [SeqInput(0, prompt, 0)]))
        kv.lens[0] = PROMPT
        decode = rec.take(0, lambda: fwd(kv, [SeqInput(0, step[:1], PROMPT)]))
        second = rec.take(1, lambda: fwd(kv, [SeqInput(0, step[:2], PROMPT)]))
        # the same prompt among 15 others (of 1 to 40 tokens, and one of LONG: the forward's
        # longest key group is then longer than the prompt's, the variance of issue 44)
        others = [[rng.randrange(V) for _ in range(rng.randint(1, 40))] for _ in range(OTHERS)]
        others[3] = [rng.randrange(V) for _ in range(LONG)]
        prompts = others[:7] + [prompt] + others[7:]
        kv = model.new_kv_cache(len(prompts), LONG + 16)
        for s, p in enumerate(prompts):
            kv.reserve(s, len(p) + 6)
        at = sum(len(p) for p in prompts[:8]) - 1
        batched = rec.take(at, lambda: fwd(kv, [SeqInput(s, p, 0) for s, p in
                                                enumerate(prompts)]))
        where = first_difference(alone, batched, L)
        if where:
            return f"{where}, a prompt's row alone vs among {len(prompts)} prompts"
        for s, p in enumerate(prompts):
            kv.lens[s] = len(p)
        depth, mask = [0, 1, 1, 2, 2], torch.eye(5, dtype=torch.bool)
        for i, par in enumerate([-1, 0, 0, 1, 2][1:], 1):
            mask[i] |= mask[par]
        mine = {"chain": SeqInput(7, step, PROMPT),
                "tree": SeqInput(7, step, PROMPT, [PROMPT + d for d in depth], mask)}
        for kind, seq in mine.items():
            seqs = [SeqInput(s, [rng.randrange(V) for _ in range(rng.randint(1, 5))],
                             kv.lens[s]) for s in range(len(prompts)) if s != 7]
            seqs.insert(5, seq)
            row = sum(len(q.tokens) for q in seqs[:5])
            for at, ref in ((0, decode), (1, second)):   # (the root, and a node after it)
                got = rec.take(row + at, lambda: fwd(kv, seqs))
                where = first_difference(ref, got, L)
                if where:
                    return f"{where}, a decoded token's row alone vs in a {kind} among " \
                           f"{len(seqs)} sequences"
        return None
    finally:
        rec.restore()
