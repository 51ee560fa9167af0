"""How big a run's pieces are (runtime/jobs/sizing.py): the prefill chunk by the device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.sizing import prefill_bytes, prefill_chunk, work_bytes

DEMO = dict(hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3, head_dim=64,
            vocab_size=49152)
LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_heads=32, num_kv_heads=32,
                head_dim=128, vocab_size=32000)


def _model(shape: dict, device: str = "cuda"):
    return SimpleNamespace(device=torch.device(device), cfg=SimpleNamespace(**shape),
                           embed=torch.empty(0, dtype=torch.bfloat16))


def test_the_prefill_chunk_is_larger_on_cuda_within_its_share_of_memory(monkeypatch):
    """On CUDA a prefill forward costs its launches whatever its tokens, so the chunk is the
    largest of 4096, 2048, 1024 whose activations take at most 2% of the device's memory:
    4096 for the demo model on an H200 and a 7B on 80 GB, 1024 for a 7B on 40 GB, 512 on
    24 GB. On a CPU and under --exact (the rows its check probes) 512; a recipe's value wins
    everywhere."""
    gb = {}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: SimpleNamespace(total_memory=gb["total"] * 2**30))
    cfg = GenerateConfig(input="x")
    for shape, total, chunk in ((DEMO, 141, 4096), (LLAMA_7B, 80, 4096), (LLAMA_7B, 40, 1024),
                                (LLAMA_7B, 24, 512)):
        gb["total"] = total
        assert prefill_chunk(cfg, _model(shape)) == chunk, (shape, total)
        assert chunk == 512 or prefill_bytes(_model(shape), chunk) <= 0.02 * total * 2**30
    gb["total"] = 141
    assert prefill_chunk(cfg, _model(DEMO, "cpu")) == 512
    assert prefill_chunk(GenerateConfig(input="x", exact=True), _model(DEMO)) == 512
    assert prefill_chunk(GenerateConfig(input="x", prefill_chunk=300), _model(DEMO)) == 300


def test_the_working_memory_holds_the_chunk_it_runs():
    """The KV budget leaves room for the prefill forward the run makes (its chunk's rows
    without logits: a prefill reads its last rows' only) or a step, whichever is larger."""
    m = _model(LLAMA_7B)
    small, large = (work_bytes(m, 8, 2, chunk, 2048) for chunk in (512, 4096))
    assert large - small == prefill_bytes(m, 4096) - prefill_bytes(m, 512) > 0
    width = 4 * 4096 + 2 * 11008 + (32 + 2 * 32) * 128
    assert 3 * 4096 * width * 2 < prefill_bytes(m, 4096) < 3 * 4096 * (width * 2 + 4 * 32000)
    steps = work_bytes(m, 64, 8, 512, 2048)   # (64 slots' steps of 8 rows: more than a chunk)
    assert steps - work_bytes(m, 64, 8, 256, 2048) == 0


def test_a_prefill_chunk_that_cannot_run_is_refused_at_once():
    """Below one token a prefill forward takes nothing (the run would fail at its first
    admission); above 512 under --exact its forwards would have rows the start-up check never
    probed (engine/exact.PREFILL_ROWS)."""
    for bad in (0, -4):
        with pytest.raises(SpecctlError, match="^--prefill-chunk must be at least 1$"):
            GenerateConfig(input="x", prefill_chunk=bad)
    with pytest.raises(SpecctlError, match="--exact checks prefill forwards of up to 512"):
        GenerateConfig(input="x", exact=True, prefill_chunk=1024)
    assert GenerateConfig(input="x", exact=True, prefill_chunk=256).prefill_chunk == 256


def test_a_padded_rows_bytes_count_each_mask_the_attention_keeps():
    """A padded query row's bytes a key column (runtime/step/prefill._padded_bytes): the bool
    mask, the bias before its repeat over the g grouped heads, after it and its padded copy;
    again for each distinct sliding window; soft-capped scores and their fp32 softmax (Gemma
    2). Besides the columns, the padded queries, the output and its copy."""
    from specctl.runtime.step.prefill import _padded_bytes
    plain = dict(DEMO, layer_windows=(), attn_softcap=None)
    assert _padded_bytes(_model(plain)) == (1 + (1 + 2 * 3) * 2, 3 * 9 * 64 * 2)
    windows = dict(plain, layer_windows=(4096, None, 4096, None))
    assert _padded_bytes(_model(windows))[0] == 2 * _padded_bytes(_model(plain))[0]
    capped = dict(plain, attn_softcap=50.0)
    assert _padded_bytes(_model(capped))[0] == _padded_bytes(_model(plain))[0] + 9 * (4 + 4)
