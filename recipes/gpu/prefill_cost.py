"""What a prefill forward costs by its tokens: the fixed part F that admitting requests in groups
saves (specctl/runtime/step/admission.py), on the machine it runs on; and on CUDA what a
prefill piece's replay costs (runtime/step/prefill.py: PIECE tokens a prompt, a captured graph).

    python recipes/gpu/prefill_cost.py [--shape demo] [--tokens 1,8,32,128,512]
        [--prompts 1,4,16] [--repeats 10] [--out FILE.json]

Random weights of a shape (recipes/gpu/shapes.py; a forward's time does not depend on their
values), bf16 on CUDA (fp32 on a CPU), eager as the runner prefills: `Model.forward` over one
packed batch of `prompts` prompts of `tokens` tokens each, then a host read of its last row (as
the runner's finite check). Prints a markdown table of the median ms and writes JSON with
every point and F and the ms a token, fit by least squares (ms = F + s x tokens, over the
one-prompt rows). On CUDA a last row: each prompt count's replay of PIECE tokens a prompt
(`pieces` in the JSON), beside the eager forward of the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_model  # noqa: E402

from specctl.engine.batch import FULL, ForwardBatch, SeqInput  # noqa: E402
from specctl.engine.graphs import PIECE, CudaGraphs  # noqa: E402


def measure(model, kv, prompts: int, tokens: int, repeats: int, piece: bool = False) -> float:
    """Median ms of an eager forward over `prompts` prompts of `tokens` tokens each (piece:
    a replay of them, padded to PIECE tokens a prompt)."""
    batch = ForwardBatch([SeqInput(i, [(7 * i + j) % 1000 + 1 for j in range(tokens)], 0)
                          for i in range(prompts)], model.device)
    times = []
    for r in range(repeats + 2):   # (two untimed: the allocator and kernels' first use)
        t = time.perf_counter()
        h = model.run(batch, kv, pad_n=PIECE) if piece else model.forward(batch, kv)
        bool(torch.isfinite(h[-1:]).all())
        if r >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(F, s) of ms = F + s x tokens by least squares."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    s = sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0
    return my - s * mt, s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="demo")
    ap.add_argument("--tokens", default="1,8,32,128,512")
    ap.add_argument("--prompts", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    model = random_model(a.shape, "cuda" if cuda else "cpu",
                         torch.bfloat16 if cuda else torch.float32)
    toks = [int(x) for x in a.tokens.split(",")]
    ps = [int(x) for x in a.prompts.split(",")]
    if cuda:   # (the runner's graphs: prefill's pieces replay their captured shapes)
        model.graphs = CudaGraphs(model)
    kv = model.new_kv_cache(max(ps), max(max(toks), PIECE) + 16, None)
    rows = [{"prompts": p, "tokens": t, "ms": round(measure(model, kv, p, t, a.repeats), 3)}
            for p in ps for t in toks]
    F, s = fit([(r["tokens"], r["ms"]) for r in rows if r["prompts"] == 1])
    out = {"shape": a.shape, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "dtype": str(model.dtype).removeprefix("torch."), "rows": rows,
           "fixed_ms": round(F, 3), "ms_per_token": round(s, 5)}
    print("| prompts \\ tokens each | " + " | ".join(map(str, toks)) + " |")
    print("|---" * (len(toks) + 1) + "|")
    for p in ps:
        print(f"| {p} | " + " | ".join(f"{r['ms']:.2f}" for r in rows if r["prompts"] == p)
              + " |")
    print(f"\none prompt: F = {F:.2f} ms a forward, {s * 1e3:.1f} us a token (least squares)")
    if cuda:
        model.graphs.warm(kv, [], [(FULL, max(ps))])
        out["pieces"] = [{"prompts": p, "tokens": PIECE,
                          "eager_ms": round(measure(model, kv, p, PIECE, a.repeats), 3),
                          "replay_ms": round(measure(model, kv, p, PIECE, a.repeats, True), 3)}
                         for p in ps]
        print(f"\n| prompts of {PIECE} tokens | eager ms | replay ms |\n|---|---|---|")
        for r in out["pieces"]:
            print(f"| {r['prompts']} | {r['eager_ms']:.2f} | {r['replay_ms']:.2f} |")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
