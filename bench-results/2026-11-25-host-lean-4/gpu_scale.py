"""Each method's host work per sequence-step (host-rows.md: recipes/host_profile.py on the tiny
model, with the verify forward's rows per sequence-step) against what the H100 spends on the
model for a step of that many rows per sequence (its step table, ../2026-11-23-engine-step/
steps-demo.json: the demo model in bf16, CUDA graphs, context 256, batch x rows a sequence),
linear between the table's row counts. python gpu_scale.py [HOST_TABLE]"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
host = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "host-rows.md"
steps = json.loads((HERE / "../2026-11-23-engine-step/steps-demo.json").read_text())


def model_ms(batch: int, rows: float) -> float:
    ns, row = steps["ns"], steps["table"][steps["batches"].index(batch)]
    rows = min(max(rows, ns[0]), ns[-1])
    for (n0, t0), (n1, t1) in zip(zip(ns, row), zip(ns[1:], row[1:])):
        if rows <= n1:
            return t0 + (t1 - t0) * (rows - n0) / (n1 - n0)
    return row[-1]


print("| method | batch | rows/seq-step | host us/seq-step (this CPU) "
      "| H100 model us/seq-step at those rows | host / model |")
print("|---|---|---|---|---|---|")
for line in host.read_text().splitlines():
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) < 10 or not c[1].isdigit():
        continue
    b, h, rows = int(c[1]), float(c[6]), float(c[9])
    m = model_ms(b, rows) * 1e3 / b
    print(f"| {c[0]} | {b} | {rows:.1f} | {h:.1f} | {m:.0f} | {h / m:.2f} |")
