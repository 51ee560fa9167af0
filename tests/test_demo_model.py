"""The real tier: the demo model (SmolLM2-135M-Instruct) against transformers."""

from __future__ import annotations

import pytest
import torch

from helpers import run_ids
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.loader import load_model

pytestmark = pytest.mark.demo

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves falling in the wind.",
    "Explain the difference between a list and a tuple in Python, with an example of each.",
    "hi",
    "Give me three tips for a job interview.",
    "Translate 'good morning, how are you today?' into Spanish and German.",
    "What causes the seasons on Earth? Answer in two sentences.",
    "Summarize the plot of Romeo and Juliet.",
]


@pytest.fixture(scope="module")
def demo(demo_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(demo_model_dir)
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}],
                                              add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False) for p in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(demo_model_dir, torch_dtype=torch.float32).eval()
    return load_model(demo_model_dir, "cpu", "fp32"), hf, ids


def test_demo_logits_match_transformers(demo):
    ours, hf, ids = demo
    for p in ids[:3]:
        kv = ours.new_kv_cache(1, 256)
        got = ours.logits(ours.forward(ForwardBatch([SeqInput(0, p, 0)]), kv))
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0]
        assert (got - ref).abs().max().item() < 1e-3   # logits of magnitude ~30
        torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-4)


N_NEW = 32


@pytest.fixture(scope="module")
def hf_reference(demo):
    """transformers' greedy generate, one prompt at a time, stopping at EOS like specctl."""
    _, hf, ids = demo
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False,
                            pad_token_id=0)[0, len(p):].tolist() for p in ids]


def test_demo_through_the_graph_path_drafts_ar_s_tokens(demo):
    """The demo model in fp32 through the graph path's eager stand-in (padded steps, each
    sequence's mask and positions laid out in the captured function from its rows' parents):
    Self-Draft's tries at batch 1 and 8 and its grid at batch 8 give ar's eager tokens."""
    from helpers import Oracle
    from specctl.engine.graphs import CudaGraphs
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    m, _, ids = demo
    ref, _ = run_ids(m, ids, max_tokens=16, max_len=320)
    m.graphs = CudaGraphs(m, capture=False)
    try:
        for name, b in (("tries", 1), ("tries", 8), ("grid", 8)):
            n = 2 if b == 1 else len(ids)   # (batch 1: two prompts, a step's one sequence)
            dr = SelfDraftDrafter(SelfDraftParams(job_cache=True),
                                  Oracle([p + r for p, r in zip(ids, ref)])) \
                if name == "tries" else SelfDraftDrafter(
                    SelfDraftParams(branches=0, context_cands=4, prompt_grams=True, grid=True),
                    vocab=m.cfg.vocab_size)
            replays = m.graphs.replays
            got, st = run_ids(m, ids[:n], batch_size=b, max_tokens=16, max_len=320,
                              drafter=dr)
            assert got == ref[:n], (name, b)
            assert m.graphs.replays > replays and st.step_tokens > st.steps, (name, b)
            assert sum(k * n for k, n in st.accept_hist.items()) > 0, (name, b)
    finally:
        m.graphs = None


@pytest.mark.parametrize("batch_size", [1, 8])
def test_demo_greedy_equals_hf_generate(demo, hf_reference, batch_size):
    ours, hf, ids = demo
    e = hf.generation_config.eos_token_id
    got, _ = run_ids(ours, ids, batch_size=batch_size, max_tokens=N_NEW,
                     eos_ids=set(e if isinstance(e, list) else [e]))
    assert got == hf_reference


@pytest.fixture(scope="module")
def exact_demo(demo_model_dir):
    """The demo model in bf16 under --exact, shared: its probe and self-check take ~20 s on an
    AVX2 CPU (bf16 matmuls without native support), once for the module's tests rather than
    once each."""
    m = load_model(demo_model_dir, "cpu", "bf16")
    m.set_exact(True)
    return m


def test_demo_under_exact_in_bf16(exact_demo, demo):
    """The demo model in bf16 under --exact: the probe finds a row-invariant matmul on this
    machine, and a row's logits are the same bits alone and among the other prompts' rows, for
    a prefill and for decode steps of 1 and of 5 tokens (where plain bf16 differs)."""
    from test_exact import _alone
    m = exact_demo
    ids = demo[2]
    toks = [ids[1][3:8], ids[2][3:8]]      # 5 tokens to feed after the first two prompts
    ref = [_alone(m, ids[i], toks[i]) for i in range(2)]
    kv = m.new_kv_cache(len(ids), 256)
    for s, p in enumerate(ids):
        kv.reserve(s, len(p) + 5)
    out = m.logits(m.forward(ForwardBatch([SeqInput(s, p, 0) for s, p in enumerate(ids)]), kv))
    ends = torch.tensor([len(p) for p in ids]).cumsum(0) - 1
    for i in range(2):
        assert torch.equal(out[ends[i]], ref[i][0]), i
        kv.lens[i] = len(ids[i])
    for s in range(2, len(ids)):
        kv.lens[s] = len(ids[s])
    step = [SeqInput(0, toks[0][:1], kv.lens[0]), SeqInput(1, toks[1], kv.lens[1])] + [
        SeqInput(s, [7, 8, 9][:s % 3 + 1], kv.lens[s]) for s in range(2, len(ids))]
    out = m.logits(m.forward(ForwardBatch(step), kv))
    assert torch.equal(out[0], ref[0][1])
    for j in range(5):
        assert torch.equal(out[1 + j], ref[1][1 + j]), j


def test_demo_long_prompt_under_exact_is_its_decoded_rows(exact_demo):
    """At the demo model's shapes: a 150-token prompt's every row in a prefill (alone, among
    prompts of 3 to 200 tokens, in two chunks) is the same bits as decoding it token by
    token (test_exact.check_long_prompt)."""
    from test_exact import check_long_prompt
    check_long_prompt(exact_demo)


def test_the_exact_self_check_covers_every_operation_of_the_demo_model(exact_demo):
    """At the demo model's real shapes (hidden 576, 9 query and 3 KV heads, a 49k vocabulary,
    30 layers) the self-check compares a row's every operation alone, among 16 prompts, in a
    chain and in a tree (two rows of each): each layer's 4 linears, RoPE, attention and SiLU
    and the LM head, all the same bits on this machine (where a kernel varies it names it:
    test_exact.py)."""
    from specctl.engine import selfcheck
    m = exact_demo
    seen = []
    inner = selfcheck.first_difference

    def counting(a, b, num_layers):
        seen.append(([k for k, _ in a], [k for k, _ in b]))
        return inner(a, b, num_layers)
    selfcheck.first_difference = counting
    try:
        assert selfcheck.self_check(m) is None
    finally:
        selfcheck.first_difference = inner
    L = m.cfg.num_layers
    assert len(seen) == 5   # among 16 prompts; a chain's and a tree's root and second node
    for a, b in seen:
        assert a == b and a.count("linear") == 4 * L + 1, a.count("linear")
        assert a.count("attention") == a.count("rope") == a.count("silu") == L


def _every_method_is_ar(m, ids, configs, max_tokens):
    """Each method on model m (Self-Draft with a corpus that knows the answers, so its trees
    are accepted; its grid step, runtime/step/grid.py, with a job cache; draft-verify with the
    repo's skip set; Kangaroo) at each (speculate, batch) of configs, and ar at the largest
    batch: ar's batch-1 tokens for every prompt."""
    from helpers import Oracle
    from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
    from specctl.speculative.kangaroo import Adapter, KangarooDrafter, KangarooParams
    from specctl.speculative.sampling import SamplingParams
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    run = dict(max_tokens=max_tokens, max_len=320)
    ref, _ = run_ids(m, ids, **run)
    got, _ = run_ids(m, ids, batch_size=max(b for _, b in configs), **run)
    assert got == ref, "ar at batch"
    skip = SkipSet(30, frozenset({16, 20, 24, 28}), frozenset())
    accepted = 0
    for speculate, b in configs:
        drafters = {
            "self-draft": SelfDraftDrafter(SelfDraftParams(job_cache=True),
                                           Oracle([p + r for p, r in zip(ids, ref)])),
            "draft-verify": LayerSkipDrafter(m, skip, SamplingParams(), ExitParams()),
            "self-draft:grid": SelfDraftDrafter(   # (its job cache's arrays, job_table.py)
                SelfDraftParams(branches=0, context_cands=4, prompt_grams=True, grid=True,
                                job_cache=True), vocab=m.cfg.vocab_size),
            # (its exit layer's own attention as the adapter: lean steps under auto keep
            # their states, and the drafting steps catch their adapter rows up)
            "kangaroo": KangarooDrafter(m, Adapter.init_from_model(m, 2), SamplingParams(),
                                        KangarooParams(eta=0.0, gamma=4)),
        }
        for name, dr in drafters.items():
            got, st = run_ids(m, ids, batch_size=b, drafter=dr, speculate=speculate, **run)
            assert got == ref, (name, speculate, b)
            accepted += sum(k * n for k, n in st.accept_hist.items())
            if name == "self-draft:grid" and speculate == "fixed" and b == 1:
                # (every step a grid step: its 1 + C G rows; and some drafts accepted)
                assert st.step_tokens == 17 * st.steps, st.step_tokens   # (1 + 4 x 4)
                assert dr.accepted_from["context"] > 0
    assert accepted > 0


def test_every_method_under_exact_at_the_demo_models_shapes_is_ar_at_batch_1(exact_demo, demo):
    """The issue-44 bar at the real shapes, where plain bf16 differs: the demo model in bf16
    under --exact, every method drafting every step at batch 3 gives ar's batch-1 tokens. (3
    prompts x 10 tokens: an AVX2 CPU computes bf16 without native support, ~13 ms a row of
    this model, and the whole matrix below took 400 s of the suite there.)"""
    _every_method_is_ar(exact_demo, demo[2][:3], [("fixed", 3)], 10)


@pytest.mark.slow
def test_every_method_under_exact_at_the_demo_models_shapes_at_every_batch(exact_demo, demo):
    """As above over all 8 prompts x 16 tokens, fixed at batch 1 and 8 and auto (the
    controller's budgets, lean steps among drafting ones) at batch 8."""
    _every_method_is_ar(exact_demo, demo[2],
                                    [("fixed", 1), ("fixed", 8), ("auto", 8)], 16)


def test_every_method_at_the_demo_models_shapes_is_ar_at_batch_1_and_8_in_fp32(demo):
    """fp32, the default dtype: every method drafting every step at batch 1 and at batch 8
    gives ar's batch-1 tokens on the 8 demo prompts (the bf16 --exact test above runs the
    whole matrix only under -m slow: bf16 is ~13 ms a row on an AVX2 CPU)."""
    _every_method_is_ar(demo[0], demo[2], [("fixed", 1), ("fixed", 8)], 16)
