"""The forerunner of paths.py, run on 35075a2 (before the grid default) for before-paths.txt:
the tests' default Self-Draft (then its per-sequence steps) against the same settings on
the grid, tests' host-charged clock.  before_paths.py ROUNDS cells(b:work,...)"""
import statistics, sys
from dataclasses import replace
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.speculative.self_draft import SelfDraftDrafter
m, patch = script_model()
real = T._drafters
def drafters(model, prompts, ref, methods=None):
    sd = real(model, prompts, ref)["self-draft"]
    return {"self-draft": sd, "sd-grid": SelfDraftDrafter(replace(sd.prm, grid=True), sd.corpus, vocab=model.cfg.vocab_size)}
T._drafters = drafters
R = int(sys.argv[1])
for c in sys.argv[2].split(","):
    b, work = int(c.split(":")[0]), c.split(":")[1]
    n = 4 * b if work == "waiting" else b
    got = {}
    for _ in range(R):
        ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1)
        for k, v in ratios.items():
            got.setdefault(k, []).append((v, stats[k].steps, stats[k].controlled_steps - stats[k].lean_steps))
    print(b, work, {k: (round(statistics.median(x for x, _, _ in v), 3), sorted(round(x, 3) for x, _, _ in v), statistics.median(s for _, s, _ in v), statistics.median(d for _, _, d in v)) for k, v in got.items()}, flush=True)
