"""Run the Runner directly on token-id prompts (no tokenizer, no store) for exact comparisons."""

from __future__ import annotations

import torch

from specctl.runtime.runner import Runner
from specctl.runtime.sequence import Request
from specctl.spec.drafter import NoDraft
from specctl.spec.verify import SamplingParams


def run_ids(model, prompts: list[list[int]], *, batch_size: int = 1, max_tokens: int = 16,
            drafter=None, sampling: SamplingParams | None = None, eos_ids=(),
            max_len: int = 256):
    """Returns (list of generated id lists in input order, RunStats)."""
    reqs = [Request(i, [[{"role": "user", "content": str(i)}]], max_tokens)
            for i in range(len(prompts))]
    results: dict[int, list[int]] = {}
    runner = Runner(model, drafter or NoDraft(), sampling or SamplingParams(),
                    batch_size=batch_size, max_len=max_len, eos_ids=set(eos_ids),
                    render=lambda r: prompts[r.index], decode=lambda ids: " ".join(map(str, ids)))
    stats = runner.run(reqs, lambda r: results.__setitem__(r.index, r.answer_ids[0]))
    return [results[i] for i in range(len(prompts))], stats


def hf_greedy(model_dir, prompt: list[int], max_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = m.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0, min_new_tokens=max_tokens)
    return out[0, len(prompt):].tolist()
