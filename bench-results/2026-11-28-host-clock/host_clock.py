"""The host-charged clock's ratios to `ar` (tests/test_host_clock.py's workload, printed rather
than asserted): every method under auto on the tiny model, with the trace's chains (real text's
acceptance), at batch 1/8/32/64, requests waiting (4x the batch) and a pure drain; least time
of 2 rounds for each; steps, guard trips and prefill forwards of each run.

    python bench-results/2026-11-28-host-clock/host_clock.py   (from the repo root)
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests")
import torch  # noqa: E402

import test_host_clock as T  # noqa: E402
from conftest import make_tiny_model  # noqa: E402
from specctl.engine.loader import load_model  # noqa: E402


class Patch:   # (pytest's monkeypatch, without undo: one process, one model)
    def setattr(self, obj, name, value):
        setattr(obj, name, value)


torch.set_num_threads(1)
m = load_model(make_tiny_model(Path(tempfile.mkdtemp()), "llama"), "cpu", "fp32")
print("| batch | work | " + " | ".join(["trace", "draft-verify", "kangaroo", "self-draft"])
      + " | ar steps, prefill forwards | each method's steps / guard trips / prefill forwards |")
print("|---|---|---|---|---|---|---|---|")
for b in (1, 8, 32, 64):
    for w in ("waiting", "drain"):
        r, st, ar = T.host_charged_ratios(m, b, 4 * b if w == "waiting" else b, Patch())
        print(f"| {b} | {w} | " + " | ".join(f"{r[k]:.3f}x" for k in r)
              + f" | {ar.steps}, {ar.prefill_forwards} | "
              + "; ".join(f"{k} {s.steps}/{s.guard_trips}/{s.prefill_forwards}"
                          for k, s in st.items()) + " |", flush=True)
