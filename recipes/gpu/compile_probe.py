"""Would torch.compile make a captured decoding step faster? (an experiment, not a product path)

    python recipes/gpu/compile_probe.py [--shapes 1x1,8x1,1x16,8x32] [--replays 200]

A step on the GPU is bound by the number of kernels it launches (issue 7): `ar` at batch 1 ran
487.6 tokens/s on the H100 after the hand fusions in engine/model.py. Inductor fuses the
elementwise work of a layer (norms, rotary, residual adds, SiLU x up) into a few kernels, so
the same forward compiled and then captured into our CUDA graph might replay in fewer, shorter
launches. This measures it before any product code depends on it: for each shape (batch bucket
x tokens per sequence) it captures the forward as specctl does (engine/graphs.py), once as is
and once with the layer loop compiled by torch.compile (default mode: inductor's kernels, no
cudagraphs of its own), and prints the median time of a replay (CUDA events), the compile time,
and how far the compiled logits are from the uncompiled ones (bf16 rounds differently after
fusion, so an exact match is not expected; greedy losslessness would hold because every method
would use the same compiled forward).

Off CUDA the "replays" run eagerly (a dry run: it checks that the compiled forward runs and
agrees, not its speed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def time_replays(graph, replays: int, cuda: bool) -> float:
    """Median milliseconds of one replay."""
    times = []
    for _ in range(replays):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            graph.replay()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x1,8x1,1x16,8x32",
                    help="batch bucket x tokens per sequence, comma-separated")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--context", type=int, default=512, help="KV rows per slot (cache length)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--store", default=None)
    ap.add_argument("--random", default=None, metavar="SHAPE",
                    help="random weights of a shapes.py shape instead of the demo checkpoint")
    a = ap.parse_args()

    from specctl.engine.batch import FULL
    from specctl.engine.graphs import CudaGraphs
    from specctl.models.checkpoint import resolve_model
    from specctl.engine.loader import load_model
    from specctl.store import Store

    if a.random:
        import sys
        from pathlib import Path
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from shapes import random_model
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        model = random_model(a.random, dev, torch.bfloat16 if dev == "cuda" else torch.float32)
    else:
        model = load_model(resolve_model(None, Store(a.store)), a.device, a.dtype)
    cuda = model.device.type == "cuda"
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    slots = max(b for b, _ in shapes)
    eager_layers = model._layers
    print(f"{model.device} {str(model.dtype).replace('torch.', '')}, cache {a.context} rows, "
          f"median of {a.replays} replays")
    print("| batch x tokens | captured ms | compiled + captured ms | speedup | compile s "
          "| logits max abs diff |")
    print("|---|---|---|---|---|---|")
    for B, n in shapes:
        row = []
        outs = []
        for compiled in (False, True):
            model._layers = eager_layers
            if compiled:
                torch._dynamo.reset()
                model._layers = torch.compile(eager_layers, dynamic=False)
            graphs = CudaGraphs(model, capture=cuda)
            model.graphs = graphs
            kv = model.new_kv_cache(slots, a.context)
            t0 = time.perf_counter()
            try:
                C = graphs.kv_columns(5 + n, kv.max_len)
                cap = graphs._capture(kv, B, n, C, FULL)   # warm-up (compiles) + capture
                g = torch.Generator().manual_seed(0)   # the same inputs for both variants
                cap.tokens.copy_(torch.randint(0, model.cfg.vocab_size, cap.tokens.shape,
                                               generator=g))
                cap.positions.copy_(torch.arange(n).repeat(B) + 5)
                cap.prefix.fill_(5)
                cap.slots.copy_(torch.arange(B) % slots)
            except Exception as e:   # noqa: BLE001 - report, go on with the next shape
                row.append(f"error: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
                break
            build = time.perf_counter() - t0
            ms = time_replays(cap.graph, a.replays, cuda)
            outs.append(cap.outputs[0].float().clone())
            row.append((ms, build))
        model._layers = eager_layers
        if len(row) == 2 and all(isinstance(r, tuple) for r in row):
            (m0, _), (m1, build) = row
            diff = float((outs[0] - outs[1]).abs().max())
            print(f"| {B} x {n} | {m0:.3f} | {m1:.3f} | {m0 / m1:.2f}x | {build:.1f} "
                  f"| {diff:.3g} |", flush=True)
        else:
            print(f"| {B} x {n} | {row[0] if row else '-'} | {row[-1]} | | | |", flush=True)


if __name__ == "__main__":
    with torch.inference_mode():   # as the engine runs (its static buffers are inference tensors)
        main()
