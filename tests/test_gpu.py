"""CUDA only (skipped elsewhere): the graph-replayed forwards equal the eager ones, and decoding
through them is still lossless."""

from __future__ import annotations

import pytest
import torch

from helpers import random_prompts, run_ids
from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.models.loader import load_model
from specctl.spec.draft_verify import ExitParams, LayerSkipDrafter, SkipSet
from specctl.spec.verify import SamplingParams

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
                kv = m.new_kv_cache(4, 64)
                for s, p in enumerate(prompts):
                    m.forward(ForwardBatch([SeqInput(s, p, 0)], "cuda"), kv)
                    kv.lens[s] = len(p)
                b = ForwardBatch([SeqInput(s, list(range(7, 7 + n)), len(p))
                                  for s, p in enumerate(prompts)], "cuda")
                outs.append(m.forward_logits(b, kv, plan).clone())
            torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    assert g.graphs.replays > 0 and e.graphs is None


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
