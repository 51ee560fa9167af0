"""The fused layer against the unfused one, step by step (issue 43: a step of fewer kernels).

    python recipes/gpu/fused_probe.py [--shapes 1x1,8x1,32x1,1x16,8x8] [--replays 200]
                                      [--inductor] [--json OUT]

For each shape (batch bucket x tokens per sequence) it captures the demo model's decoding
forward as specctl does (engine/graphs.py) with `--attention sdpa` and with `--attention
fused`, and prints the median ms of a replay (CUDA events), the launches a forward makes
(engine/launches.py: per layer and per step), how long the first capture took (the fused
variant's includes Triton's compile of its kernels, once per specialization; a warm Triton
cache, ~/.triton/cache, skips it) and how far the fused logits are from the unfused ones (bf16
rounds differently; the demo model's residual stream reaches ~5,000, where a step is 32) and
how many of their greedy tokens agree.
With --inductor a third variant: the unfused layer loop under torch.compile (inductor's
kernels, captured in our graph), the library alternative the fused kernels are measured against.

Off CUDA it is a dry run (under TRITON_INTERPRET=1, which it sets): it checks that every
variant captures, runs and agrees, not its speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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


def _variant(model, name: str, B: int, n: int, slots: int, a) -> dict:
    from specctl.engine.batch import FULL
    from specctl.engine.graphs import CudaGraphs
    from specctl.engine.launches import of_step
    cuda = model.device.type == "cuda"
    eager = type(model)._layers.__get__(model)
    model.set_attention("sdpa" if name != "fused" else "fused")
    if name == "inductor":
        torch._dynamo.reset()
        model._layers = torch.compile(eager, dynamic=False)
    launches = of_step(model, B, n) if name != "inductor" else (None, None)
    graphs = model.graphs = CudaGraphs(model, capture=cuda)
    kv = model.new_kv_cache(slots, a.context)
    t0 = time.perf_counter()
    cap = graphs._capture(kv, B, n, graphs.kv_columns(5 + n, kv.max_len), FULL)
    build = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)   # the same inputs for every variant
    cap.tokens.copy_(torch.randint(0, model.cfg.vocab_size, cap.tokens.shape, generator=g))
    if cap.parents is not None:   # (each sequence a chain: its row before it; the graph
        cap.parents.copy_((torch.arange(n) - 1).clamp(min=0).repeat(B))   # lays out positions)
    cap.prefix.fill_(5)
    cap.slots.copy_(torch.arange(B) % slots)
    ms = time_replays(cap.graph, a.replays, cuda)
    out = model.logits(cap.outputs[0]).clone()
    model.__dict__.pop("_layers", None)
    model.graphs = None
    return {"ms": ms, "build_s": build, "launches_step": launches[0],
            "launches_layer": launches[1], "out": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x1,8x1,32x1,1x16,8x8",
                    help="batch bucket x tokens per sequence, comma-separated")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--context", type=int, default=512, help="KV rows per slot (cache length)")
    ap.add_argument("--inductor", action="store_true", help="also torch.compile's layer loop")
    ap.add_argument("--store", default=None)
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    a = ap.parse_args()

    from specctl.models.checkpoint import resolve_model
    from specctl.engine.loader import load_model
    from specctl.store import Store

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(resolve_model(None, Store(a.store)), dev, "bf16", cuda_graphs=False)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    slots = max(b for b, _ in shapes)
    names = ["sdpa", "fused"] + (["inductor"] if a.inductor else [])
    print(f"{model.device} bf16, cache {a.context} rows, median of {a.replays} replays; "
          "launches: a step / a layer; first capture s (fused: with Triton's compile)")
    print("| batch x tokens | " + " | ".join(f"{v} ms" for v in names)
          + " | fused speedup | launches sdpa | launches fused | first capture s "
          + "| logits max abs diff | argmax agree |")
    print("|---" * (len(names) + 7) + "|")
    rows = []
    for B, n in shapes:
        got = {v: _variant(model, v, B, n, slots, a) for v in names}
        s, f = got["sdpa"], got["fused"]
        diff = float((s["out"] - f["out"]).abs().max())
        agree = float((s["out"].argmax(-1) == f["out"].argmax(-1)).float().mean())
        print(f"| {B} x {n} | " + " | ".join(f"{got[v]['ms']:.3f}" for v in names)
              + f" | {s['ms'] / f['ms']:.2f}x | {s['launches_step']} / {s['launches_layer']} "
              f"| {f['launches_step']} / {f['launches_layer']} | "
              + " / ".join(f"{got[v]['build_s']:.1f}" for v in names)
              + f" | {diff:.3g} | {agree:.0%} |", flush=True)
        rows.append({"batch": B, "tokens": n, "logits_max_abs_diff": diff, "argmax_agree": agree,
                     **{v: {k: x for k, x in got[v].items() if k != "out"} for v in names}})
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": str(model.device), "context": a.context, "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    with torch.inference_mode():   # as the engine runs (its static buffers are inference tensors)
        main()
