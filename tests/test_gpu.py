"""CUDA only (skipped elsewhere): the graph-replayed forwards equal the eager ones, and decoding
through them is still lossless."""

from __future__ import annotations

import pytest
import torch

from helpers import prefill_slots, random_prompts, run_ids, tree_input
from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.engine.loader import load_model
from specctl.speculative.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
from specctl.speculative.sampling import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]



def test_graph_logits_equal_eager(tiny_llama):
    g = load_model(tiny_llama, "cuda", "fp32")
    e = load_model(tiny_llama, "cuda", "fp32", cuda_graphs=False)
    prompts = random_prompts(3)
    for plan in (LayerPlan(), LayerPlan(skip_attn=frozenset({1}), skip_mlp=frozenset({2}))):
        for n in (1, 3):
            outs = []
            for m in (g, e):
                kv = prefill_slots(m, m.new_kv_cache(4, 64), prompts, "cuda")
                b = ForwardBatch([SeqInput(s, list(range(7, 7 + n)), len(p))
                                  for s, p in enumerate(prompts)], "cuda")
                outs.append(m.logits(m.run(b, kv, plan)).clone())
            torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    assert g.graphs.replays > 0 and e.graphs is None


def test_the_context_tables_device_rows_follow_its_pushes():
    """A grid step's forward gathers from the table's rows on the GPU (ContextTable.device_rows):
    a copy kept equal to the host's through pushes and trims, copied in stream order."""
    import numpy as np
    from specctl.speculative.context_table import ContextTable
    t, rng = ContextTable(300, 6, 4), np.random.default_rng(0)
    rows = t.device_rows(torch.device("cuda"))
    for i in range(30):
        t.push_texts([rng.integers(0, 40, 50).tolist() for _ in range(3)])
        if i % 10 == 9:
            t.trim(3)
        assert t.device_rows(torch.device("cuda")) is rows
        assert torch.equal(rows.cpu(), torch.from_numpy(t.ready))


@pytest.mark.parametrize("batch_size", [1, 8])
def test_graphs_keep_decoding_lossless(tiny_llama, batch_size):
    cpu = load_model(tiny_llama, "cpu", "fp32")
    gpu = load_model(tiny_llama, "cuda", "fp32")
    prompts = random_prompts(10, seed=1)
    ref, _ = run_ids(cpu, prompts, batch_size=batch_size, max_tokens=16)
    got, _ = run_ids(gpu, prompts, batch_size=batch_size, max_tokens=16)
    assert got == ref
    dr = LayerSkipDrafter(gpu, SkipSet(4, frozenset({2})), SamplingParams(), ExitParams(K=4))
    got, _ = run_ids(gpu, prompts, batch_size=batch_size, max_tokens=16, drafter=dr)
    assert got == ref
    assert gpu.graphs.replays > 0


def test_graph_tree_logits_equal_eager(tiny_llama):
    """A masked (tree + branches) step replayed from a graph equals the eager forward, its
    masks and positions laid out by the layout kernel (engine/layout_kernel.py: it passed its
    check against tree_closure on this device, or the graphs would have fallen back)."""
    from specctl.speculative.self_draft import branch_probe, build_trie
    g = load_model(tiny_llama, "cuda", "fp32")
    e = load_model(tiny_llama, "cuda", "fp32", cuda_graphs=False)
    prompts = random_prompts(3)
    nodes = build_trie([[5, 6, 7], [5, 8]], 10).extend(branch_probe([[9, 10], [11]]))
    n = len(nodes) + 1
    outs = []
    for m in (g, e):
        kv = prefill_slots(m, m.new_kv_cache(4, 64), prompts, "cuda")
        b = ForwardBatch([tree_input(s, 3, nodes, len(p)) for s, p in enumerate(prompts)], "cuda")
        assert b.num_new == [n] * 3
        outs.append(m.logits(m.run(b, kv)).clone())
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    assert g.graphs.replays > 0 and g.graphs._kernel is not None


@pytest.mark.parametrize("batch_size", [1, 8])
def test_graphs_keep_self_draft_lossless(tiny_llama, batch_size):
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    cpu = load_model(tiny_llama, "cpu", "fp32")
    gpu = load_model(tiny_llama, "cuda", "fp32")
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8] + random_prompts(6, seed=2)
    ref, _ = run_ids(cpu, prompts, batch_size=batch_size, max_tokens=32)
    got, stats = run_ids(gpu, prompts, batch_size=batch_size, max_tokens=32,
                         drafter=SelfDraftDrafter(SelfDraftParams(), None))
    assert got == ref
    assert gpu.graphs.replays > 0 and sum(k * n for k, n in stats.accept_hist.items()) > 0


def test_the_grid_at_batch_32_is_lossless_through_graphs(tiny_llama):
    """Self-Draft's default from batch 32, the grid step (runtime/step/grid.py: verification
    and KV moves on the device, one read-back), through captured graphs at batch 32 under a
    controller whose budgets make steps of one to three chains, one chain cut to the budgets
    too (5, 3 and 2 rows a sequence on the CPU's stand-in), equals the CPU's ar greedy in
    fp32."""
    from helpers import step_table
    from specctl.runtime.control.controller import make_controller
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    cpu = load_model(tiny_llama, "cpu", "fp32")
    gpu = load_model(tiny_llama, "cuda", "fp32")
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, [20, 21, 22, 23] * 5, [3, 4] * 12] * 6 \
        + random_prompts(16, seed=11)
    ref, _ = run_ids(cpu, prompts, max_tokens=24)
    dr = SelfDraftDrafter(SelfDraftParams(branches=0, context_cands=4, prompt_grams=True,
                                          grid=True), None, vocab=gpu.cfg.vocab_size)
    # (rows nearly free: the controller drafts)
    table = step_table(lambda b, n: 10.0 + 0.02 * b * n, (1, 2, 4, 8, 16, 32), "cuda")
    # (a prior of some weight: the run's first two grid steps find nothing in the table for
    # the tiny model's tokens, and at weight 4 they taught it to draft no more, 2026-12-04;
    # tests/test_grid.py's twin runs this on the CPU, priced padded as here)
    ctl = make_controller(dr, gpu, 32, table, correct=False, guard=False, prior_accept=0.8,
                          prior_weight=32, explore_every=8)
    got, _ = run_ids(gpu, prompts, batch_size=32, max_tokens=24, drafter=dr, speculate="auto",
                     controller=ctl)
    assert got == ref
    assert gpu.graphs.replays > 0 and dr.accepted_from["context"] > 0


@pytest.mark.parametrize("batch_size, attention", [(1, "sdpa"), (8, "sdpa"), (1, "fused"),
                                                   (8, "fused"), (8, "flex")])
def test_every_method_lossless_through_graphs(tiny_llama, attention, batch_size):
    """Every method (kangaroo's draft and verify forwards included) on captured graphs, with
    every attention backend (flex compiled, fused's Triton kernels), equals the CPU's ar
    greedy in fp32."""
    from helpers import method_drafters
    cpu = load_model(tiny_llama, "cpu", "fp32")
    gpu = load_model(tiny_llama, "cuda", "fp32", attention=attention)
    prompts = random_prompts(10, seed=5)
    ref, _ = run_ids(cpu, prompts, batch_size=1, max_tokens=20)
    for name, dr in method_drafters(gpu, prompts, ref).items():
        got, stats = run_ids(gpu, prompts, batch_size=batch_size, max_tokens=20, drafter=dr)
        assert got == ref, name
        if dr is not None:
            assert sum(k * n for k, n in stats.accept_hist.items()) > 0, name
        if name == "kangaroo":   # (its draft forwards replayed graphs: checked before the next
            # method's run, whose KV cache may be another, and its graphs with it)
            assert ("kangaroo", 1) in {key[3] for key in gpu.graphs.cache}


@pytest.mark.parametrize("graphs, other", [(True, "flex"), (False, "flex"), (True, "fused"),
                                           (False, "fused")])
def test_other_attention_equals_sdpa_on_cuda(tiny_llama, graphs, other):
    """The compiled flex kernel and the fused layer's Triton kernels against SDPA: on one
    masked (tree + branches) graph step, and without graphs (prefill and eager steps: flex's
    dynamic-shape compile) on a packed batch of unequal lengths, a tree among them."""
    from specctl.speculative.self_draft import branch_probe, build_trie
    prompts = random_prompts(3, seed=0 if graphs else 8)
    nodes = build_trie([[5, 6, 7], [5, 8]], 10)
    if graphs:
        nodes = nodes.extend(branch_probe([[9, 10], [11]]))
        seqs = [tree_input(s, 3, nodes, len(p)) for s, p in enumerate(prompts)]
    else:
        seqs = [SeqInput(0, [4], len(prompts[0])), tree_input(1, 3, nodes, len(prompts[1])),
                SeqInput(2, [4, 5, 6], len(prompts[2]))]
    outs = []
    for attention in ("sdpa", other):
        m = load_model(tiny_llama, "cuda", "fp32", cuda_graphs=graphs, attention=attention)
        kv = prefill_slots(m, m.new_kv_cache(4, 256), prompts, "cuda")
        outs.append(m.logits(m.run(ForwardBatch(seqs, "cuda"), kv)).clone())
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention", ["sdpa", "fused"])
def test_prefill_forwards_of_thousands_of_tokens_keep_every_method_lossless(tiny_llama,
                                                                          attention):
    """CUDA's prefill chunk (4096 tokens a forward, runtime/jobs/sizing.prefill_chunk): 24
    prompts of 20-300 tokens admitted together go in one or two prefill forwards (the fused
    layer where no prompt's piece passes 128 tokens, the unfused one past it), and every
    method's greedy output equals the CPU's `ar` at 512 tokens a forward."""
    import random
    from helpers import method_drafters
    rnd = random.Random(11)
    prompts = [[rnd.randrange(3, 300) for _ in range(rnd.randrange(20, 300))] for _ in range(24)]
    cpu = load_model(tiny_llama, "cpu", "fp32")
    gpu = load_model(tiny_llama, "cuda", "fp32", attention=attention)
    ref, _ = run_ids(cpu, prompts, batch_size=24, max_tokens=12, max_len=400)
    for name, dr in method_drafters(gpu, prompts, ref).items():
        got, st = run_ids(gpu, prompts, batch_size=24, max_tokens=12, drafter=dr, max_len=400,
                          prefill_chunk=4096)
        assert got == ref, name
        assert st.prefill_forwards <= 2 and st.prefill_chunk == 4096, (name, st.prefill_forwards)


def test_prefill_in_pieces_on_cuda(tiny_llama):
    """Prefill's pieces on real graphs (runtime/step/prefill.py): a CUDA runner captures
    their shapes as it starts and measures their price (both forwards timed, positive), and
    a run forced into pieces (1 to 3 a prompt) replays every prefill forward, captures
    nothing more, and its output is the CPU's `ar`'s: `ar`'s and Kangaroo's (its exit-layer
    states captured by the pieces' graphs; the other methods prefill as `ar` does)."""
    import random
    from helpers import method_drafters
    from specctl.engine.graphs import PIECE
    from specctl.runtime.step.prefill import PiecePrice
    from specctl.runtime.step.runner import Runner
    from specctl.speculative.drafter import NoDraft
    rnd = random.Random(5)
    prompts = [[rnd.randrange(3, 300) for _ in range(rnd.choice((3, 40, PIECE + 9, 150)))]
               for _ in range(12)]
    cpu = load_model(tiny_llama, "cpu", "fp32")
    gpu = load_model(tiny_llama, "cuda", "fp32")
    ref, _ = run_ids(cpu, prompts, batch_size=4, max_tokens=12, max_len=512)
    r = Runner(gpu, NoDraft(), SamplingParams(), batch_size=4, max_len=512, eos_ids=set(),
               render=lambda q: [], decode=str, prefill_chunk=4096)
    price = r.prefill_price
    assert price is not None and price.most == 4 and min(price.eager + price.replay) > 0
    print("prefill price (tiny model):", price)
    cheap = PiecePrice(4, eager=(1e6, 1e6), replay=(1.0, 1.0))
    for name, dr in method_drafters(gpu, prompts, ref).items():
        if name not in ("ar", "kangaroo"):
            continue
        captures = gpu.graphs.captures
        got, st = run_ids(gpu, prompts, batch_size=4, max_tokens=12, drafter=dr, max_len=512,
                          prefill_chunk=4096, prefill_price=cheap)
        assert got == ref, name
        assert st.prefill_replays == st.prefill_forwards > len(prompts) // 4, name
        # (every shape captured as the runner started: none in a prefill or a step)
        assert gpu.graphs.captures - captures == st.captures, name


@pytest.mark.parametrize("batch_size", [1, 8])
def test_self_draft_samples_what_ar_samples_on_cuda(tiny_llama, batch_size):
    """Sampling on the graph path: Self-Draft's text is ar's, token for token (fp32), and the
    draws (inverse CDF on the device) never leave the warped support."""
    from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams
    gpu = load_model(tiny_llama, "cuda", "fp32")
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8] + random_prompts(6, seed=2)
    sp = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=4)
    ar, _ = run_ids(gpu, prompts, batch_size=1, max_tokens=24, sampling=sp)
    dr = SelfDraftDrafter(SelfDraftParams(), None)
    dr.sp = sp
    got, stats = run_ids(gpu, prompts, batch_size=batch_size, max_tokens=24, sampling=sp,
                         drafter=dr)
    assert got == ar and gpu.graphs.replays > 0


@pytest.mark.parametrize("attention", ["sdpa", "fused"])
def test_exact_in_bf16_on_cuda_is_ar_at_batch_1(tiny_llama, attention):
    """--exact on CUDA (the Triton matmul; the unfused layer eager, the fused one in captured
    graphs): every method at batch 1, 4 and 10 gives ar's batch-1 tokens in bf16."""
    from helpers import method_drafters
    m = load_model(tiny_llama, "cuda", "bf16", attention=attention)
    m.set_exact(True)
    assert (m.graphs is None) == (attention == "sdpa")
    prompts = random_prompts(10, seed=5)
    ref, _ = run_ids(m, prompts, batch_size=1, max_tokens=20)
    for name, dr in method_drafters(m, prompts, ref).items():
        for b in (1, 4, 10):
            got, _ = run_ids(m, prompts, batch_size=b, max_tokens=20, drafter=dr)
            assert got == ref, (name, b)
    m.set_exact(False)
    assert m.graphs is not None


@pytest.mark.parametrize("n", [1, 16])
def test_folded_attention_may_take_the_memory_efficient_kernel(n):
    """What sdpa_attention hands SDPA on CUDA in bf16 (the demo model's 9 query heads on 3 KV
    heads folded into rows, a float mask, 512 columns) is one the memory-efficient kernel
    takes: with cuDNN off nothing falls to the math backend."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention
    B, KV, g, hd, C = 8, 3, 3, 64, 512
    q = torch.randn(B, n, KV * g, hd, device="cuda", dtype=torch.bfloat16)
    q = q.transpose(1, 2).reshape(B, KV, g * n, hd)
    k = torch.randn(B, C, KV, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    bias = torch.zeros(B, 1, g * n, C, device="cuda", dtype=torch.bfloat16)
    assert can_use_efficient_attention(SDPAParams(q, k, k, bias, 0.0, False, False), True)
