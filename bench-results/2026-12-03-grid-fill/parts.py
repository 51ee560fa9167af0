"""In-run component timings (us/step) of host_profile rows: wraps named functions."""
import sys, time, collections, runpy
import specctl.runtime.step.step as stepm, specctl.runtime.step.grid as gridm
import specctl.runtime.step.stepping as steppingm
import specctl.engine.graphs as graphsm, specctl.engine.batch as batchm
import specctl.speculative.context_table as ctm
acc = collections.Counter(); cnt = collections.Counter()
def wrap(obj, name, label):
    fn = getattr(obj, name, None)
    if fn is None: return
    def w(*a, **k):
        t = time.perf_counter()
        try: return fn(*a, **k)
        finally: acc[label] += time.perf_counter() - t
    setattr(obj, name, w)
wrap(stepm.Planner, "plan", "plan")
wrap(stepm.Planner, "_room", "plan.room")
wrap(gridm.GridStep, "plan", "plan.grid")
wrap(graphsm.CudaGraphs, "_stage_fill", "graphs.stage.fill")
wrap(gridm.GridDrafts, "make", "plan.grid.make")
wrap(gridm.GridStep, "verify", "verify(+device)")
wrap(gridm.GridStep, "device_step", "verify.device")
wrap(steppingm, "commit_grid", "commit")
wrap(steppingm, "commit", "commit")
wrap(steppingm, "read", "read(+argmax)")
wrap(graphsm.CudaGraphs, "run", "graphs.run")
wrap(graphsm.CudaGraphs, "_stage_inputs", "graphs.stage")
wrap(graphsm._EagerReplay, "replay", "graphs.replay")
wrap(batchm.ForwardBatch, "decode", "plan.batch")
wrap(batchm.ForwardBatch, "grid", "plan.batch")
wrap(steppingm.Stepping, "under_forward", "under_forward")
orig = steppingm.Stepping.step
def step(self, *a, **k):
    t = time.perf_counter()
    try: return orig(self, *a, **k)
    finally: acc["STEP"] += time.perf_counter() - t; cnt["steps"] += 1
steppingm.Stepping.step = step
sys.argv = ["host_profile.py"] + sys.argv[1:]   # (run from the repo root)
runpy.run_path("recipes/host_profile.py", run_name="__main__")
n = cnt["steps"]
for k in sorted(acc): print(f"{k:18s} {acc[k]/n*1e6:8.1f} us/step")
