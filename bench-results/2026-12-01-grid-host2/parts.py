"""Wall us of the host's parts of a grid drafting step at b64 (the tiny model at /tmp/tiny,
recipes/tiny_model.py; self-draft:grid:fixed, --graphs --schedule cuda), timed inside
host_profile's run. From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-12-01-grid-host2/parts.py [--device-core 1]"""
import sys, time, collections, statistics
extra = sys.argv[1:]
sys.argv = ["host_profile.py", "--model", "/tmp/tiny", "--input", "recipes/prompts/specbench128.jsonl",
            "--store", "/tmp/tiny-store", "--batch-sizes", "64", "--threads", "1", "--max-tokens", "48",
            "--prompts", "128", "--methods", "ar,self-draft:grid:fixed", "--schedule", "cuda",
            "--repeats", "3", "--skip-set", "/tmp/tiny/skip.json", "--graphs", *extra]
sys.path.insert(0, "recipes")
from specctl.runtime.step import step as SP, runner as RN, grid as GR
from specctl.engine import graphs as GG, batch as BA
from specctl.speculative import context_table as CT, self_draft as SD
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
wrap(SP.Planner, "_grid", "plan (Planner._grid)")
wrap(SP.Planner, "_room", "  _room")
wrap(GR.GridStep, "plan", "  GridStep.plan")
wrap(CT.ContextTable, "candidates", "    table.candidates")
wrap(GR.GridDrafts, "make", "    GridDrafts.make")
wrap(BA.ForwardBatch, "grid", "    ForwardBatch.grid")
wrap(GG.CudaGraphs, "run", "graphs.run (staging, replay, rows)")
wrap(GG.CudaGraphs, "_stage_inputs", "  _stage_inputs")
wrap(GG._EagerReplay, "replay", "  replay (device)")
wrap(GR.GridStep, "verify", "verify (device_step + read)")
wrap(GR.GridStep, "device_step", "  device_step (device)")
wrap(RN, "commit_grid", "commit_grid")
wrap(RN.Runner, "under_forward", "under_forward")
wrap(RN.Runner, "step", "Runner.step (all)")
wrap(SP.Planner, "_lean", "ar: plan (Planner._lean)")
wrap(SP.Planner, "plan", "Planner.plan (all)")
wrap(SP.Planner, "execute", "Planner.execute (all)")
from specctl.runtime.control import controller as CO
wrap(CO.Controller, "decide", "Controller.decide")
wrap(CO.Controller, "plan_lean", "Controller.plan_lean")
wrap(CO.Controller, "verified", "Controller.verified")
wrap(SD.SelfDraftDrafter, "grid_learned", "SelfDraft.grid_learned")
wrap(SD.SelfDraftDrafter, "catch_up", "SelfDraft.catch_up")
wrap(BA.ForwardBatch, "decode", "  ar: ForwardBatch.decode")
wrap(RN, "read", "ar: read (argmax + tolist)")
wrap(RN, "verify", "ar: verify")
wrap(RN, "commit", "ar: commit")
import host_profile
host_profile.main()
for k, v in T.items():
    print(f"{k:38s} n={len(v):5d} median {statistics.median(v):7.1f} us")
