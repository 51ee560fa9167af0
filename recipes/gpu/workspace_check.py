"""Do captured graphs survive another library clearing cuBLAS workspaces, and are repeats equal?

    compute-sanitizer --tool memcheck python3 recipes/gpu/workspace_check.py [--shape demo]

The crash seen after transformers' compiled `generate` (an unspecified launch failure in the
next replay) fits captured graphs that used a cuBLAS workspace they did not own. This runs the
sequence that exposes it: `ar` at batch 1, `ar` at batch 8 (graphs captured), then what
inductor's cudagraph trees do around their own captures (clear cuBLAS workspaces, empty the
allocator's cache), then `ar` at batch 8 again (replays) and once more; under compute-sanitizer
any access to freed memory is reported. It also says whether the batch-8 runs gave identical
tokens (bf16 repeatability of replays on the same inputs). Random weights (shapes.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_model  # noqa: E402

from specctl.engine.graphs import CudaGraphs  # noqa: E402
from specctl.runtime.step.runner import Runner  # noqa: E402
from specctl.runtime.step.sequence import Request  # noqa: E402
from specctl.speculative.drafter import NoDraft  # noqa: E402
from specctl.speculative.sampling import SamplingParams  # noqa: E402


def run(model, prompts, batch_size: int, max_tokens: int, trace: list | None = None):
    reqs = [Request(i, [[]], max_tokens) for i in range(len(prompts))]
    out: dict[int, list[int]] = {}
    runner = Runner(model, NoDraft(), SamplingParams(), batch_size=batch_size, max_len=512,
                    eos_ids=set(), render=lambda r: prompts[r.index], decode=lambda ids: "")
    if trace is not None:   # per forward: what ran, and a checksum of each live slot's KV rows
        step, prefill = runner.step, runner._prefill

        def sums(seqs):
            kv = runner.kv
            return [(s.req.index, kv.lens[s.slot], float(kv.k_all[:, s.slot, :kv.lens[s.slot]]
                     .double().sum())) for s in seqs]

        def traced_step(seqs):
            before = sums(seqs)
            step(seqs)
            trace.append(("step", before, [s.out_ids[-1] for s in seqs],
                          len(model.graphs.cache)))

        def traced_prefill(seqs, under=None):
            eager = prefill(seqs, under)
            trace.append(("prefill", sums(seqs), [s.out_ids[-1] for s in seqs],
                          len(model.graphs.cache)))
            return eager
        runner.step, runner._prefill = traced_step, traced_prefill
    runner.run(reqs, lambda r: out.__setitem__(r.index, r.answer_ids[0]))
    return [out[i] for i in range(len(prompts))]


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x[:3] != y[:3]:
            kind, sx, tx, gx = x
            _, sy, ty, gy = y
            rows = [f"req {p[0]} len {p[1]} kvsum {p[2]:.9g} vs {q[2]:.9g}"
                    for p, q in zip(sx, sy) if p != q]
            return (f"forward {i} ({kind}, graphs held {gx} / {gy}): tokens "
                    f"{'equal' if tx == ty else 'differ'}; KV sums differing before it: "
                    f"{rows[:4] or 'none'}")
    return "no difference"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="demo")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (eager replays)")
    ap.add_argument("--trace", action="store_true",
                    help="find the first forward where the first two batch-8 runs differ")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    model = random_model(a.shape, a.device, torch.bfloat16 if cuda else torch.float32)
    model.graphs = CudaGraphs(model)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.cfg.vocab_size, (40 + 7 * i,), generator=g).tolist()
               for i in range(a.prompts)]
    run(model, prompts, 1, a.max_tokens)
    traces = [[], []]
    first = run(model, prompts, 8, a.max_tokens, traces[0] if a.trace else None)
    if cuda:
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    second = run(model, prompts, 8, a.max_tokens, traces[1] if a.trace else None)
    third = run(model, prompts, 8, a.max_tokens)
    if cuda:
        torch.cuda.synchronize()
    print(f"replays {model.graphs.replays}; batch-8 repeats identical: "
          f"{first == second == third} ({sum(x != y for x, y in zip(first, second))} and "
          f"{sum(x != y for x, y in zip(second, third))} of {len(first)} sequences differ)")
    if a.trace:
        print("first two batch-8 runs:", first_difference(*traces))


if __name__ == "__main__":
    main()
