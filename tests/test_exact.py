"""--exact (engine/exact.py): a row's logits have the same bits alone and inside any batch."""

from __future__ import annotations

import random

import pytest
import torch

from specctl.engine import exact
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.kv import BLOCK, row_bytes
from specctl.engine.loader import load_model


@pytest.fixture(scope="module", params=["bf16", "fp32"])
def xmodel(request, tiny_llama):
    """The tiny model under --exact; in fp32 only where this machine's BLAS is row-invariant
    (MKL's fp32 GEMM is not: set_exact refuses it, naming the dtype)."""
    m = load_model(tiny_llama, "cpu", request.param)
    try:
        m.set_exact(True)
    except ValueError as e:
        assert request.param == "fp32" and "fp32 matmuls" in str(e), e
        pytest.skip(f"refused: {e}")
    return m


def test_det_exp_is_exp_and_the_same_wherever_an_element_sits():
    x = torch.linspace(-87, 88, 100_003)
    got = exact.det_exp(x)
    assert ((got - torch.exp(x)).abs() / torch.exp(x)).max() < 1e-6
    for n in (1, 3, 17, 33, 1000, 40_001):   # vector body, scalar remainder, threads' chunks
        for at in (0, n - 1):
            y = torch.randn(n) * 20
            y[at] = x[12345]
            assert exact.det_exp(y)[at] == got[12345]


def _logits(m, kv, seqs):
    return m.logits(m.forward(ForwardBatch(seqs), kv))


def _alone(m, prompt, tokens):
    """Logits of prompt's last row and of each of `tokens` decoded one at a time, alone."""
    kv = m.new_kv_cache(1, 128)
    kv.reserve(0, 128)
    out = [_logits(m, kv, [SeqInput(0, prompt, 0)])[-1]]
    kv.lens[0] = len(prompt)
    for t in tokens:
        out.append(_logits(m, kv, [SeqInput(0, [t], kv.lens[0])])[0])
        kv.lens[0] += 1
    return out


# a tree over 5 new tokens: root, two children, a grandchild under each
PARENTS = [-1, 0, 0, 1, 2]


def _tree(slot, tokens, base):
    depth, mask = [0] * 5, torch.eye(5, dtype=torch.bool)
    for i, p in enumerate(PARENTS[1:], 1):
        depth[i] = depth[p] + 1
        mask[i] |= mask[p]
    return SeqInput(slot, tokens, base, [base + d for d in depth], mask)


def _filler(rng, slot, base, vocab):
    n = rng.randint(1, 5)
    toks = [rng.randrange(vocab) for _ in range(n)]
    return _tree(slot, toks + [1] * (5 - n), base) if n == 5 and rng.random() < 0.5 \
        else SeqInput(slot, toks, base)


@pytest.mark.parametrize("paged", [False, True])
def test_a_rows_logits_are_the_same_bits_in_any_batch(xmodel, paged):
    check_rows(xmodel, paged, (2, 3, 7, 16, 33, 64))


def check_rows(m, paged: bool, sizes):
    """A prompt's prefill among others, then its chain of 4 tokens or a tree of 5 among other
    sequences' drafts, in steps of each of `sizes` rows: the same logits as decoded alone."""
    rng = random.Random(1)
    V = m.cfg.vocab_size
    prompt = [rng.randrange(V) for _ in range(21)]
    chain = [rng.randrange(V) for _ in range(4)]
    tree = [rng.randrange(V) for _ in range(5)]
    ref_chain = _alone(m, prompt, chain)
    ref_tree = {i: _alone(m, prompt, [tree[j] for j in path])[-1]
                for i, path in {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 2, 4]}.items()}
    for rows in sizes:
        slots = rows // 3 + 2
        c = m.cfg
        budget = (slots * 48 + 2 * BLOCK) * row_bytes(c.num_layers, c.num_kv_heads, c.head_dim,
                                                     m.dtype) if paged else None
        kv = m.new_kv_cache(slots, 96, budget)
        assert kv.paged == paged
        me = rng.randrange(slots)
        prompts = [prompt if s == me else [rng.randrange(V) for _ in range(rng.randint(1, 40))]
                   for s in range(slots)]
        for s, p in enumerate(prompts):
            kv.reserve(s, len(p) + 5)
        out = _logits(m, kv, [SeqInput(s, p, 0) for s, p in enumerate(prompts)])
        last = sum(len(p) for p in prompts[:me + 1]) - 1
        assert torch.equal(out[last], ref_chain[0]), f"prefill among {slots}"
        for s, p in enumerate(prompts):
            kv.lens[s] = len(p)
        for kind in ("chain", "tree"):
            seqs = []
            for s in range(slots):
                if s == me:
                    seqs.append(SeqInput(s, chain, len(prompt)) if kind == "chain"
                                else _tree(s, tree, len(prompt)))
                else:
                    seqs.append(_filler(rng, s, kv.lens[s], V))
            while sum(len(q.tokens) for q in seqs) > rows and len(seqs) > 1:
                seqs.pop(0 if seqs[0].slot != me else 1)
            rng.shuffle(seqs)
            out = _logits(m, kv, seqs)
            at = sum(len(q.tokens) for q in seqs[:[q.slot for q in seqs].index(me)])
            want = ref_chain[1:] if kind == "chain" else [ref_tree[i] for i in range(5)]
            for i, w in enumerate(want):
                assert torch.equal(out[at + i], w), f"{kind} row {i} among {rows} rows"


def test_probe_refuses_a_matmul_that_is_not_row_invariant():
    def varies(x, w, b=None):   # a kernel whose rounding follows the row count
        return torch.nn.functional.linear(x, w) * (1 + 1e-3 * (x.shape[0] % 3))
    assert not exact._invariant(varies, [torch.randn(8, 4)], exact.PROBE_ROWS)
    assert exact._invariant(exact.tiled_linear, [torch.randn(8, 4)], exact.PROBE_ROWS)


@pytest.mark.parametrize("speculate", ["fixed", "auto"])
def test_every_method_under_exact_in_bf16_is_ar_at_batch_1(tiny_llama, speculate):
    from helpers import method_drafters, random_prompts, run_ids
    m = load_model(tiny_llama, "cpu", "bf16")
    m.set_exact(True)
    prompts = random_prompts(9, seed=3, max_len=40)
    ref, _ = run_ids(m, prompts, max_tokens=24)
    for name, dr in method_drafters(m, prompts, ref).items():
        for b in (1, 4, 9):
            got, stats = run_ids(m, prompts, batch_size=b, max_tokens=24, drafter=dr,
                                 speculate=speculate)
            assert got == ref, (name, b)
            if dr is not None and speculate == "fixed":
                assert sum(k * n for k, n in stats.accept_hist.items()) > 0, name


def test_the_same_command_twice_gives_the_same_answers(tiny_llama, tmp_path):
    """The answers' bytes repeat: under --exact whatever the controller decides (its budgets
    follow measured timings, so they differ run to run), and with fixed drafting without it.
    And --exact at batch 3 is ar --exact at batch 1."""
    import json

    from typer.testing import CliRunner

    from specctl.cli import app
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n"
                           for w in ("cats", "the sea", "rain", "a fox", "bread", "stars")))

    def answers(tag, *args, dtype=("--dtype", "bf16")):
        out = tmp_path / f"{tag}.jsonl"
        r = CliRunner().invoke(app, ["generate", str(inp), "--model", str(tiny_llama),
                                     "--store", str(tmp_path / tag), "--out", str(out),
                                     "--max-tokens", "12", "--device", "cpu", "-q", *dtype,
                                     *args])
        assert r.exit_code == 0, r.output
        return [json.dumps({k: line[k] for k in ("text", "token_ids", "finish_reason")})
                for line in map(json.loads, out.read_text().splitlines())]

    sd = ["--method", "self-draft", "--corpus-cache", "none", "-b", "3"]
    # (--exact with --dtype auto runs bf16, on the CPU too: the first run's dtype is auto)
    ref = answers("ar", "--exact", "-b", "1", dtype=())
    assert answers("x1", "--exact", *sd) == answers("x2", "--exact", *sd) == ref
    fixed = sd + ["--speculate", "fixed"]
    assert answers("f1", *fixed) == answers("f2", *fixed)
