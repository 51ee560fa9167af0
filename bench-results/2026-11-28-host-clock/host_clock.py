"""The host-charged clock's ratios to `ar` (tests/test_host_clock.py's workload, printed rather
than asserted): every method under auto on the tiny model, with the trace's chains (real text's
acceptance), at batch 1/8/32/64, requests waiting (4x the batch) and a pure drain; least time
of 2 rounds for each; steps, guard trips and prefill forwards of each run.

    python bench-results/2026-11-28-host-clock/host_clock.py   (from the repo root)
"""
import sys

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402

m, patch = script_model()
print("| batch | work | " + " | ".join(["trace", "draft-verify", "kangaroo", "self-draft"])
      + " | ar steps, prefill forwards | each method's steps / guard trips / prefill forwards |")
print("|---|---|---|---|---|---|---|---|")
for b in (1, 8, 32, 64):
    for w in ("waiting", "drain"):
        r, st, ar = T.host_charged_ratios(m, b, 4 * b if w == "waiting" else b, patch)
        print(f"| {b} | {w} | " + " | ".join(f"{r[k]:.3f}x" for k in r)
              + f" | {ar.steps}, {ar.prefill_forwards} | "
              + "; ".join(f"{k} {s.steps}/{s.guard_trips}/{s.prefill_forwards}"
                          for k, s in st.items()) + " |", flush=True)
