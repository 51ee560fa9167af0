"""The host-charged clock's ratios to `ar` (tests/test_host_clock.py's workload, printed rather
than asserted): every method under auto on the tiny model, with the trace's chains (real text's
acceptance), requests waiting (4x the batch) and a pure drain; least time of ROUNDS rounds for
each; steps, guard trips and prefill forwards of each run.

    python bench-results/2026-11-28-host-clock-2/host_clock.py [demo|7b] [ROUNDS]

demo: the demo shape's H200 tables (the tests'), batch 1/8/32/64. 7b: the 7B shape's step table
measured on the H200 (bench-results/2026-11-28-gpu-74f1c5f/step-table-7b.json, SDPA, batch
1/8/32: no batch-64 row), each prefill forward priced as that table's step of 64 tokens a
prompt (no 7B prefill was measured: an estimate), the host charged as for the demo shape.
"""
import json
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import ROOT, script_model  # noqa: E402
from specctl.engine.steptable import StepTable  # noqa: E402

shape = sys.argv[1] if len(sys.argv) > 1 else "demo"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
table = prefill = None
batches = (1, 8, 32, 64)
if shape == "7b":
    table = StepTable.from_json(json.loads(
        (ROOT / "bench-results/2026-11-28-gpu-74f1c5f/step-table-7b.json").read_text()))
    batches = (1, 8, 32)

    def prefill(p):
        return table.ms(p, 64)
m, patch = script_model()
print("| batch | work | " + " | ".join(["trace", "draft-verify", "kangaroo", "self-draft"])
      + " | ar steps, prefill forwards | each method's steps / guard trips / prefill forwards |")
print("|---|---|---|---|---|---|---|---|")
for b in batches:
    for w in ("waiting", "drain"):
        r, st, ar = T.host_charged_ratios(m, b, 4 * b if w == "waiting" else b, patch,
                                          rounds=rounds, table=table, prefill=prefill)
        print(f"| {b} | {w} | " + " | ".join(f"{r[k]:.3f}x" for k in r)
              + f" | {ar.steps}, {ar.prefill_forwards} | "
              + "; ".join(f"{k} {s.steps}/{s.guard_trips}/{s.prefill_forwards}"
                          for k, s in st.items()) + " |", flush=True)
