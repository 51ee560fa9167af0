"""A per-sequence drafting step's host by part (median us a call) in a host_profile run
(../2026-11-30-grid-calls/harness.py's arguments) of METHOD at batch B:
    cd $TREE && PYTHONPATH=$TREE:$TREE/recipes python parts.py self-draft:fixed B"""
import statistics, sys, time
sys.path.insert(0, "/work/main/bench-results/2026-11-30-grid-calls")  # (this checkout's)
from harness import T, profile_argv, wrap
meth, B = sys.argv.pop(1), sys.argv.pop(1)
profile_argv(meth)
sys.argv[sys.argv.index("--batch-sizes") + 1] = B
sys.argv[sys.argv.index("--prompts") + 1] = str(max(16, 4 * int(B)))
from specctl.runtime.step import runner as RN, step as SP
from specctl.engine import graphs as GP
from specctl.speculative import self_draft as SD
for obj, name in [(SP.Planner, "_planned"), (GP.CudaGraphs, "_stage_inputs"),
                  (RN, "commit"), (RN, "verify"), (SD.SelfDraftDrafter, "propose"),
                  (SD.SelfDraftDrafter, "catch_up"), (SD.SelfDraftDrafter, "observe"),
                  (RN.Runner, "under_forward")]:
    wrap(obj, name, f"{getattr(obj, '__name__', '')}.{name}")
wrap(SP.Planner, "plan", lambda a, out: f"plan ({'lean' if out.lean else 'draft'})")
_rep = GP._EagerReplay.replay
_cur = [0.0]
def rep(self):
    t = time.perf_counter(); _rep(self); _cur[0] += time.perf_counter() - t
GP._EagerReplay.replay = rep
_run = GP.CudaGraphs.run
def run(self, batch, *a, **k):
    _cur[0] = 0.0
    t = time.perf_counter(); out = _run(self, batch, *a, **k)
    T[f"graphs.run-minus-replay n={max(batch.num_new)}"].append((time.perf_counter() - t - _cur[0]) * 1e6)
    return out
GP.CudaGraphs.run = run
import host_profile
host_profile.main()
for k in sorted(T):
    print(f"{k:40s} n={len(T[k]):5d} median {statistics.median(T[k]):8.1f} us  mean {statistics.mean(T[k]):8.1f}")
