"""Self-Draft's per-sequence steps against the same settings on the grid (runtime/step/grid.py),
both under auto on the host-charged clock of tests/test_host_clock.py (the H200's step and
prefill tables, this process's CPU time outside the forwards x3, real text's answer lengths),
ROUNDS rounds of ar then each; per cell the median x ar, every round, steps and drafting steps.

    PYTHONPATH=$PWD python bench-results/2026-11-30-grid-default/paths.py ROUNDS 32:waiting,64:drain,...

It runs on 35075a2 too (before-paths.txt was made by its forerunner there, the same
drafters named `self-draft` and `sd-grid`).
"""
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, "tests")
import test_host_clock as T  # noqa: E402
from sim import script_model  # noqa: E402
from specctl.speculative.self_draft import SelfDraftDrafter  # noqa: E402

m, patch = script_model()
real = T._drafters


def drafters(model, prompts, ref, methods=None, batch=1):
    # (the tests' Self-Draft at batch 1, the per-sequence steps, as at 35075a2, whose
    # _drafters took no batch: the grid's setting is made here either way)
    sd = real(model, prompts, ref, ["self-draft"])["self-draft"]
    return {p: SelfDraftDrafter(replace(sd.prm, grid=g), sd.corpus, vocab=model.cfg.vocab_size)
            for p, g in (("per-seq", False), ("grid", True))}


T._drafters = drafters
R = int(sys.argv[1])
for c in sys.argv[2].split(","):
    b, work = int(c.split(":")[0]), c.split(":")[1]
    n = 4 * b if work == "waiting" else b
    got = {}
    for _ in range(R):
        ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1)
        for k, v in ratios.items():
            got.setdefault(k, []).append((v, stats[k].steps,
                                          stats[k].controlled_steps - stats[k].lean_steps))
    print(b, work, {k: (round(statistics.median(x for x, _, _ in v), 3),
                        sorted(round(x, 3) for x, _, _ in v),
                        statistics.median(s for _, s, _ in v),
                        statistics.median(d for _, _, d in v)) for k, v in got.items()},
          flush=True)
