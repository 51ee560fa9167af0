"""The CPU matmul form, measured on the real model (engine/model.py `linear`).

    python bench-results/2026-11-23-cpu-gemm/cpu_matmul.py [--threads 2] [--batches 1,8] [--rounds 2]
    python bench-results/2026-11-23-cpu-gemm/cpu_matmul.py --rows 1-24,32,48,64     # the row padding (gemm_rows)

Times a greedy step (engine/steptable.py's measurement: b sequences x n new tokens over 128
committed rows) and a 512-token prefill with the model's matmuls as F.linear (x @ w.T, what
torch does by default) and as specctl's CPU form ((w @ x.T).T, rows padded by gemm_rows),
alternating the two forms for --rounds rounds and keeping each cell's fastest. Prints one
markdown table: ms of each form and their ratio.
With --rows: the model's matmuls (one layer's four weights and the LM head) at each row count,
as (w @ x.T).T on exactly those rows and padded as engine/model.py `gemm_rows` pads them; the
fastest of 30 runs each.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import specctl.engine.model as engine_model
from specctl.engine.batch import ForwardBatch, SeqInput
from specctl.engine.steptable import measure_step_table
from specctl.models.checkpoint import resolve_model
from specctl.engine.loader import load_model
from specctl.store import Store

FORMS = {"F.linear": lambda x, w, b=None: F.linear(x, w, b), "specctl": engine_model.linear}


@torch.inference_mode()
def prefill_ms(model, n: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        kv = model.new_kv_cache(1, n + 1)
        batch = ForwardBatch([SeqInput(0, list(range(100, 100 + n)), 0)], "cpu")
        t = time.perf_counter()
        model.argmax(model.run(batch, kv)[-1:]).tolist()
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best


def rows_table(model, spec: str) -> None:
    counts = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        counts += list(range(int(lo), int(hi or lo) + 1))
    layer = model.layers[0]
    ws = [layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, model.lm_head]

    def run(m: int, p: int) -> float:
        xs = [torch.randn(m, w.shape[1]) for w in ws]
        best = float("inf")
        for _ in range(30):
            t = time.perf_counter()
            for w, x in zip(ws, xs):
                xp = x if p == m else F.pad(x, (0, 0, 0, p - m))
                torch.mm(w, xp.t())[:, :m].t().contiguous()
            best = min(best, time.perf_counter() - t)
        return best * 1e3
    print("| rows | as is (ms) | padded to | padded (ms) |\n|---|---|---|---|")
    for m in counts:
        p = engine_model.gemm_rows(m)
        print(f"| {m} | {run(m, m):.2f} | {p} | {run(m, p):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ns", default="1,2,3,4,8,16,32,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--rows", default=None, help="row counts, e.g. 1-24,32: the padding table")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(resolve_model(None, Store()), "cpu")
    if a.rows:
        return rows_table(model, a.rows)
    batches = tuple(int(x) for x in a.batches.split(","))
    ns = tuple(int(x) for x in a.ns.split(","))
    best: dict[str, dict] = {f: {} for f in FORMS}
    try:
        for _ in range(a.rounds):
            for form, fn in FORMS.items():
                engine_model.linear = fn
                t = measure_step_table(model, batches=batches, ns=ns, context=128, repeats=5,
                                       warmup=1)
                for b, row in zip(t.batches, t.table):
                    for n, ms in zip(t.ns, row):
                        best[form][(b, n)] = min(best[form].get((b, n), ms), ms)
                p = prefill_ms(model, a.prefill)
                best[form]["prefill"] = min(best[form].get("prefill", p), p)
    finally:
        engine_model.linear = FORMS["specctl"]
    print(f"{model.cfg.num_layers}-layer model, {a.threads} threads, fastest of {a.rounds} "
          "rounds (ms)\n")
    print("| step | F.linear | specctl | ratio |\n|---|---|---|---|")
    for key in [(b, n) for b in batches for n in ns] + ["prefill"]:
        label = f"b{key[0]} x {key[1]} tokens" if key != "prefill" else f"prefill {a.prefill}"
        old, new = best["F.linear"][key], best["specctl"][key]
        print(f"| {label} | {old:.1f} | {new:.1f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
