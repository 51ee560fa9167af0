"""Wall us (medians, and totals) of a grid run's learning at b64 (its text into the context
table, under the forward on CUDA's schedule), inside recipes/host_profile.py's run. From the
repo root: PYTHONPATH=$PWD python bench-results/2026-11-30-grid-calls/learn.py"""
import sys, time, collections, statistics
sys.argv = ["host_profile.py", "--model", "/tmp/tiny", "--input", "recipes/prompts/specbench128.jsonl",
            "--store", "/tmp/tiny-store", "--batch-sizes", "64", "--threads", "1", "--max-tokens", "48",
            "--prompts", "128", "--methods", "self-draft:grid:fixed", "--schedule", "cuda",
            "--repeats", "3", "--skip-set", "/tmp/tiny/skip.json", "--graphs"] + sys.argv[1:]
sys.path.insert(0, "recipes")
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
wrap(CT.ContextTable, "push", "push")
wrap(CT.ContextTable, "push_texts", "push_texts")
wrap(CT, "_hash", "_hash")
wrap(SD.SelfDraftDrafter, "_settle", "_settle")
import host_profile
host_profile.main()
for k, v in T.items():
    print(f"{k:22s} n={len(v):5d} median {statistics.median(v):7.1f} us  sum {sum(v)/1e3:.1f} ms")
