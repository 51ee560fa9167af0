"""Measure the step-cost table (specctl/engine/steptable.py) and keep it with the model's profile.

    python recipes/step_table.py [--model M] [--device auto] [--dtype auto]
        [--batches 1,8,32,64] [--ns 1,2,4,8,16,32,64,96] [--context 256] [--out FILE.json]
    python recipes/step_table.py --random 7b --batches 1,8,32,64 ...   # random weights, on CUDA
    python recipes/step_table.py --random demo --batches 32,64 --ns 5,8,9,16,17,32,41,64 \
        --exact-ns --out FILE.json   # a probe: each n captured as it is, not padded

With a checkpoint the table is written into the store beside the model's cost profile
(`profiles/<model>-<device>-<dtype>/steps-<attention>.json`), where a speculation controller
reads it; with --random (recipes/gpu/shapes.py: the demo or a 7B shape) only to --out.
Prints the table in markdown, ms per step (greedy: forward + argmax read back).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--random", default=None, metavar="SHAPE")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention", default="sdpa")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--ns", default="1,2,4,8,16,32,64,96")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--store", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--exact-ns", action="store_true",
                    help="capture each n as it is, not padded to the graph grid (next power of "
                         "two): what a step of exactly n tokens a sequence would cost were its "
                         "shape captured, e.g. a Self-Draft grid step's 1 + C G (a probe: "
                         "written to --out only, never to the store, whose table prices the "
                         "padded shapes a run replays)")
    a = ap.parse_args()
    from specctl.engine.steptable import measure_step_table
    from specctl.store import Store, atomic_write_json
    ident = None
    if a.random:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
        from shapes import random_model
        cuda = torch.cuda.is_available() and a.device != "cpu"
        model = random_model(a.random, "cuda" if cuda else "cpu",
                             torch.bfloat16 if cuda else torch.float32)
        if cuda:
            from specctl.engine.graphs import CudaGraphs
            model.graphs = CudaGraphs(model)
        model.set_attention(a.attention)
    else:
        from specctl.models.checkpoint import resolve_model
        from specctl.engine.loader import load_model, model_fingerprint
        store = Store(a.store)
        path = resolve_model(a.model, store)
        model = load_model(path, a.device, a.dtype, attention=a.attention)
        ident = (f"{model_fingerprint(path)}-{model.device.type}-"
                 f"{str(model.dtype).replace('torch.', '')}")
    if a.exact_ns:
        g = model.graphs
        if g is None or not a.out:
            raise SystemExit("--exact-ns: needs CUDA graphs and --out")
        g.padded_n = lambda n: n if n <= g.max_n else None
        ident = None
    t = measure_step_table(model, [int(x) for x in a.batches.split(",")],
                           [int(x) for x in a.ns.split(",")], a.context, a.repeats,
                           progress=lambda b, n, ms: print(f"  batch {b} x {n}: {ms:.3f} ms",
                                                           flush=True))
    print(f"\nstep ms ({t.device}, {t.dtype}, {t.attention}, context {t.context}; "
          f"{a.random or a.model or 'demo model'})\n")
    print(t.markdown())
    if a.out:
        Path(a.out).write_text(json.dumps(t.to_json(), indent=1))
    if ident:
        d = store.path("profiles", ident)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_json(d / f"steps-{t.attention}.json", t.to_json())
        print(f"\nsaved {d / f'steps-{t.attention}.json'}")


if __name__ == "__main__":
    main()
