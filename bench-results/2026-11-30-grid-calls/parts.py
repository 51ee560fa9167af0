"""Wall us (medians) of the host's parts of ar's and the grid's steps at b64, timed with
perf_counter inside recipes/host_profile.py's run (harness.py's arguments). Extra arguments go
to host_profile (e.g. --device-core 1). From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-11-30-grid-calls/parts.py [--device-core 1]"""
import statistics

from harness import T, profile_argv, wrap

profile_argv("ar,self-draft:grid:fixed")
from specctl.engine import graphs as GP
from specctl.runtime.step import grid as GR, runner as RN, step as SP
from specctl.speculative import context_table as CT

wrap(SP.Planner, "plan", lambda a, out: f"Planner.plan ({'grid' if out.grid else 'ar'})")
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
wrap(GP.CudaGraphs, "_stage_inputs",   # (self, cap, batch, ...)
     lambda a, out: "stage grid" if a[2].template is not None else "stage other")
import host_profile
host_profile.main()
for k in sorted(T):
    print(f"{k:22s} n={len(T[k]):5d} median {statistics.median(T[k]):7.1f} us")
