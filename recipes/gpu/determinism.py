"""Which kernel makes bf16 decoding non-repeatable on the GPU? (issue 7's open question)

    python recipes/gpu/determinism.py PROMPTS.jsonl [--prompts 8] [--max-tokens 128]
                                      [--batch-sizes 1,8] [--repeats 3] [--settings ...]
    CUBLAS_WORKSPACE_CONFIG=:4096:8 python recipes/gpu/determinism.py PROMPTS.jsonl \
        --settings deterministic      (cuBLAS reads it at start: a process of its own)

On the lent H100, `ar` in bf16 gave different tokens from one repeat to the next (same inputs,
same captured graphs), and so did transformers' eager `generate` at batch 8 and 32, while
Self-Draft's and draft-verify's repeats at batch 1 were identical. This runs `specctl bench`
for `ar` alone (demo model from the store) under each setting and says, per setting and batch
size, whether its repeats agree and, where outputs differ, the logit gap at the first
divergences (bench.divergence_gaps). Each setting is a bench run of its own: the model loaded
and its graphs captured anew, a warm-up first, so every repeat replays the same graphs.
Settings, in this order:

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
from contextlib import contextmanager

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

    from specctl.bench import BenchConfig, parse_list, run_bench
    from specctl.store import Store

    store = Store(a.store)
    cuda = torch.cuda.is_available() and a.device in ("auto", "cuda")
    names = (["default", "eager", "bf16-reduction-off", "sdpa-math"] if cuda
             else ["default", "eager"])
    if a.settings:
        names = a.settings.split(",")
    print(f"ar, {a.prompts} prompts, {a.max_tokens} new tokens, {a.repeats} repeats per "
          "setting (each a `specctl bench` run: warm-up, graphs captured anew, stored)")
    print("| setting | batch | repeats identical | first divergences |")
    print("|---|---|---|---|")
    for name in names:
        cfg = BenchConfig(a.input, methods=("ar",), batch_sizes=parse_list(
            a.batch_sizes, "--batch-sizes", int), max_tokens=a.max_tokens, repeats=a.repeats,
            warmup=1, limit=a.prompts, device=a.device, dtype=a.dtype,
            cuda_graphs=name != "eager")
        try:
            with setting(name):
                res = run_bench(cfg, store, log=lambda m: None)
        except Exception as e:   # noqa: BLE001 - report it, go on with the next
            print(f"| {name} | - | error: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''} | |", flush=True)
            continue
        for r in res["rows"]:   # (bench.divergence_gaps: vs ar at batch 1, else the repeats)
            d = r.get("divergence")
            gap = (f"{d['differing']} sequences, logit gap up to {d['max_gap']:.3g} "
                   f"(vs {d['vs']})" if d else "-")
            print(f"| {name} | {r['batch_size']} | {'yes' if r['repeats_identical'] else 'no'} "
                  f"| {gap} |", flush=True)


if __name__ == "__main__":
    main()
