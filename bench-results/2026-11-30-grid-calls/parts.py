"""Wall us (medians) of the host's parts of ar's and the grid's steps at b64, timed with
perf_counter inside recipes/host_profile.py's run (the tiny model at /tmp/tiny; the graph path's
eager stand-in). Extra arguments go to host_profile (e.g. --device-core 1). From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-11-30-grid-calls/parts.py [--device-core 1]"""
import sys, time, collections, statistics
sys.argv = ["host_profile.py", "--model", "/tmp/tiny", "--input", "recipes/prompts/specbench128.jsonl",
            "--store", "/tmp/tiny-store", "--batch-sizes", "64", "--threads", "1", "--max-tokens", "48",
            "--prompts", "128", "--methods", "ar,self-draft:grid:fixed", "--schedule", "cuda",
            "--repeats", "3", "--skip-set", "/tmp/tiny/skip.json", "--graphs"] + sys.argv[1:]
sys.path.insert(0, "recipes")
from specctl.runtime.step import step as SP, runner as RN, grid as GR, commit as CM
from specctl.engine import graphs as GP, batch as BA
from specctl.speculative import context_table as CT
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[("", key)].append((time.perf_counter() - t) * 1e6)
    setattr(obj, name, w)
p0 = SP.Planner.plan
def plan(self, *a, **k):
    t = time.perf_counter()
    out = p0(self, *a, **k)
    T[("", "Planner.plan (grid)" if out.grid is not None else "Planner.plan (ar)")].append(
        (time.perf_counter() - t) * 1e6)
    return out
SP.Planner.plan = plan
wrap(GR.GridStep, "verify", "GridStep.verify (incl. device_step)")
wrap(SP.Planner, "_grid", "plan._grid")
wrap(SP.Planner, "_lean", "plan._lean")
wrap(GR.GridStep, "plan", "GridStep.plan")
wrap(CT.ContextTable, "candidates", "candidates")
wrap(GR.GridStep, "device_step", "device_step")
wrap(RN, "commit_grid", "commit_grid")
wrap(RN, "commit", "commit")
wrap(RN, "verify", "verify")
wrap(GR.ForwardBatch, "grid", "ForwardBatch.grid")
wrap(GR.ForwardBatch, "decode", "ForwardBatch.decode")
wrap(GR.GridDrafts, "make", "GridDrafts.make")
f0 = GP.CudaGraphs._stage_inputs
def st(self, cap, batch, *a):
    t = time.perf_counter()
    try:
        return f0(self, cap, batch, *a)
    finally:
        T[("", "stage grid" if batch.template is not None else "stage other")].append((time.perf_counter() - t) * 1e6)
GP.CudaGraphs._stage_inputs = st
import host_profile
host_profile.main()
for k in sorted(T, key=str):
    v = T[k]
    print(f"{k[1]:22s} n={len(v):5d} median {statistics.median(v):7.1f} us")
