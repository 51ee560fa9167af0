"""Which kernel makes bf16 decoding non-repeatable on the GPU? (issue 7's open question)

    python recipes/gpu/determinism.py PROMPTS.jsonl [--prompts 8] [--max-tokens 128]
                                      [--batch-sizes 1,8] [--repeats 3] [--settings ...]
    CUBLAS_WORKSPACE_CONFIG=:4096:8 python recipes/gpu/determinism.py PROMPTS.jsonl \
        --settings deterministic      (cuBLAS reads it at start: a process of its own)

On the lent H100, `ar` in bf16 gave different tokens from one repeat to the next (same inputs,
same captured graphs), and so did transformers' eager `generate` at batch 8 and 32, while
Self-Draft's and draft-verify's repeats at batch 1 were identical. This runs `ar` (the one
Runner, demo model from the store) `--repeats` times per setting and says, per setting and
batch size, whether the repeats agree and, where not, the logit gap at the first divergence
(bench.divergence_gaps). Settings, each on freshly captured graphs, with one untimed warm-up
run first (so every repeat replays the same graphs), in this order:

- default
- eager: no CUDA graphs
- bf16-reduction-off: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
  (no reduced-precision split-K reductions)
- sdpa-math: SDPA restricted to its math backend (with a mask and grouped-query attention the
  default may already be it)
- deterministic: torch.use_deterministic_algorithms(True); run it in its own process with
  CUBLAS_WORKSPACE_CONFIG=:4096:8 (see above), else cuBLAS may still vary
A setting that fails prints its error in the table and the next one runs. Off CUDA: default and
eager only (a dry run of the script).
"""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack, contextmanager

import torch


@contextmanager
def setting(name: str):
    if name == "bf16-reduction-off":
        old = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = old
    elif name == "deterministic":
        if not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
            print("(deterministic without CUBLAS_WORKSPACE_CONFIG: cuBLAS may still vary)")
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)
    elif name.startswith("sdpa-"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel({"sdpa-math": SDPBackend.MATH}[name]):
            yield
    else:
        yield


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--store", default=None)
    ap.add_argument("--settings", default=None,
                    help="comma-separated subset (default: all but deterministic on CUDA)")
    a = ap.parse_args()

    from specctl.bench import _requests, divergence_gaps
    from specctl.engine.graphs import CudaGraphs
    from specctl.io.prompts import read_prompts
    from specctl.models.checkpoint import resolve_model
    from specctl.models.loader import load_model
    from specctl.runtime import job
    from specctl.runtime.runner import Runner
    from specctl.spec.drafter import NoDraft
    from specctl.spec.verify import SamplingParams
    from specctl.store import Store

    store = Store(a.store)
    model_dir = resolve_model(None, store)
    model = load_model(model_dir, a.device, a.dtype)
    tk = job.Tokenization(model_dir, chat=True)
    recs = read_prompts(a.input)[:a.prompts]
    cuda = model.device.type == "cuda"
    names = (["default", "eager", "bf16-reduction-off", "sdpa-math"] if cuda
             else ["default", "eager"])
    if a.settings:
        names = a.settings.split(",")

    def run(b: int) -> dict:
        out = {}
        runner = Runner(model, NoDraft(), SamplingParams(), batch_size=b, max_len=1024,
                        eos_ids=tk.eos_ids, render=tk.render, decode=tk.decode)
        runner.run(_requests(recs, a.max_tokens), lambda r: out.__setitem__(r.index, r.answer_ids))
        return out

    graphs = model.graphs
    print(f"{model.device} {str(model.dtype).replace('torch.', '')}, {len(recs)} prompts, "
          f"{a.max_tokens} new tokens, {a.repeats} repeats per setting")
    print("| setting | batch | repeats identical | sequences differing | max logit gap |")
    print("|---|---|---|---|---|")
    for name in names:
        model.graphs = None if name == "eager" else graphs
        if model.graphs is not None:   # capture anew under this setting
            model.graphs = CudaGraphs(model) if cuda else CudaGraphs(model, capture=False)
        with ExitStack() as stack:
            stack.enter_context(setting(name))
            for b in [int(x) for x in a.batch_sizes.split(",")]:
                try:
                    run(b)   # warm-up: captures this setting's graphs
                    runs = [run(b) for _ in range(a.repeats)]
                    bad = [o for o in runs[1:] if o != runs[0]]
                    if not bad:
                        print(f"| {name} | {b} | yes | 0 | - |", flush=True)
                        continue
                    differing = sum(1 for i in runs[0] if bad[0].get(i) != runs[0][i])
                    gaps = divergence_gaps(model, tk.render, recs, bad[0], runs[0])
                    gap = f"{max(abs(g['gap']) for g in gaps):.3g}" if gaps else "-"
                    print(f"| {name} | {b} | no | {differing} | {gap} |", flush=True)
                except Exception as e:   # noqa: BLE001 - report it, go on with the next
                    print(f"| {name} | {b} | error: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''} | | |", flush=True)


if __name__ == "__main__":
    main()
