"""Self-Draft light (the per-sequence path) against the same settings on the grid
(runtime/step/grid.py), under auto on the host-charged clock of tests/test_host_clock.py
(forwards priced by the committed H200 table, this process's CPU time outside them charged
x3, real-text lengths): N rounds, each round ar then each method; medians of x ar.

    python bench-results/2026-11-29-grid/paired.py BATCH waiting|drain N
"""
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402
from specctl.speculative.self_draft import SelfDraftDrafter, SelfDraftParams  # noqa: E402

m, patch = script_model()
real = T._drafters


def drafters(model, prompts, ref, methods=None):
    sd = real(model, prompts, ref)["self-draft"]
    light = SelfDraftParams(prompt_grams=True, branches=0, context_cands=4, corpus_cands=1)
    return {"light": SelfDraftDrafter(light, sd.corpus),
            "grid": SelfDraftDrafter(replace(light, grid=True), sd.corpus,
                                     vocab=model.cfg.vocab_size)}


T._drafters = drafters
b = int(sys.argv[1])
n = 4 * b if sys.argv[2] == "waiting" else b
got = {}
for _ in range(int(sys.argv[3])):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1)
    for k, v in ratios.items():
        got.setdefault(k, []).append((v, stats[k].steps, stats[k].controlled_steps
                                      - stats[k].lean_steps))
for k, v in got.items():
    xs = sorted(x for x, _, _ in v)
    print(f"b{b} {sys.argv[2]} {k}: median {statistics.median(xs):.3f}x "
          f"({xs[0]:.3f}-{xs[-1]:.3f}), median steps {statistics.median(s for _, s, _ in v)}, "
          f"drafting steps {statistics.median(d for _, _, d in v)}", flush=True)
