"""In a host_profile run at b64 (ar and self-draft:grid:fixed, the tiny model at /tmp/tiny), each
grid step's plan (GridStep.plan, which changes nothing) run three times in a row, and each ar
step's (Planner._lean) twice: the first call's cost is what the step pays, the later ones the
same work with the host's caches warm from the first. From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-12-01-grid-host2/plan_twice.py [--device-core 1]"""
import sys, time, collections, statistics
sys.argv = ["host_profile.py", "--model", "/tmp/tiny", "--input", "recipes/prompts/specbench128.jsonl",
            "--store", "/tmp/tiny-store", "--batch-sizes", "64", "--threads", "1", "--max-tokens", "48",
            "--prompts", "128", "--methods", "ar,self-draft:grid:fixed", "--schedule", "cuda",
            "--repeats", "3", "--skip-set", "/tmp/tiny/skip.json", "--graphs"] + sys.argv[1:]
sys.path.insert(0, "recipes")
from specctl.runtime.step import grid as GR, step as SP, commit as CM, runner as RN
T = collections.defaultdict(list)
pc = time.perf_counter
f = GR.GridStep.plan
def plan(self, *a):
    t = pc(); out = f(self, *a); t1 = pc(); f(self, *a); t2 = pc(); f(self, *a); t3 = pc()
    T["plan 1st"].append((t1 - t) * 1e6); T["plan 2nd"].append((t2 - t1) * 1e6); T["plan 3rd"].append((t3 - t2) * 1e6)
    return out
GR.GridStep.plan = plan
g = SP.Planner._lean
def lean(self, *a):
    t = pc(); out = g(self, *a); t1 = pc(); g(self, *a); t2 = pc()
    T["ar plan 1st"].append((t1 - t) * 1e6); T["ar plan 2nd"].append((t2 - t1) * 1e6)
    return out
SP.Planner._lean = lean
import host_profile
host_profile.main()
for k, v in T.items():
    print(f"{k:12s} median {statistics.median(v):7.1f}")
