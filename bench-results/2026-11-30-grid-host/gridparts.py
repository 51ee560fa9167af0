"""Wall us of the host's parts of a grid drafting step at b64 (the tiny model at /tmp/tiny,
recipes/tiny_model.py; self-draft:grid:fixed), timed inside host_profile's run: the plan
(Planner._grid, GridStep.plan, ForwardBatch.grid, GridDrafts.make), device_step, verify with its
read-back, and commit_grid. From the repo root."""
import sys, time, collections, statistics
sys.argv = ["host_profile.py", "--model", "/tmp/tiny", "--input", "recipes/prompts/specbench128.jsonl",
            "--store", "/tmp/tiny-store", "--batch-sizes", "64", "--threads", "1", "--max-tokens", "48",
            "--prompts", "128", "--methods", "ar,self-draft:grid:fixed", "--schedule", "cuda",
            "--repeats", "3", "--skip-set", "/tmp/tiny/skip.json"]
sys.path.insert(0, "recipes")
from specctl.runtime.step import step as SP, runner as RN, grid as GR, commit as CM
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[key].append((time.perf_counter() - t) * 1e6)
    setattr(obj, name, w)
wrap(SP.Planner, "_grid", "plan(_grid)")
wrap(GR.GridStep, "plan", "  GridStep.plan")
wrap(GR.GridStep, "device_step", "device_step")
wrap(GR.GridStep, "verify", "verify(all)")
wrap(RN, "commit_grid", "commit_grid")
wrap(GR.ForwardBatch, "grid", "  ForwardBatch.grid")
wrap(GR.GridDrafts, "make", "  GridDrafts.make")
import host_profile
host_profile.main()
for k, v in T.items():
    print(f"{k:22s} n={len(v):5d} median {statistics.median(v):7.1f} us")
