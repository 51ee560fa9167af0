"""Wall us (medians, and totals) of a grid run's learning at b64 (its text into the context
table, under the forward on CUDA's schedule), inside recipes/host_profile.py's run
(harness.py's arguments). From the repo root:
    PYTHONPATH=$PWD python bench-results/2026-11-30-grid-calls/learn.py"""
import statistics

from harness import T, profile_argv, wrap

profile_argv("self-draft:grid:fixed")
from specctl.speculative import context_table as CT, self_draft as SD

wrap(CT.ContextTable, "push", "push")
wrap(CT.ContextTable, "push_texts", "push_texts")
wrap(CT, "_hash", "_hash")
wrap(SD.SelfDraftDrafter, "_settle", "_settle")
import host_profile
host_profile.main()
for k, v in T.items():
    print(f"{k:22s} n={len(v):5d} median {statistics.median(v):7.1f} us  sum {sum(v)/1e3:.1f} ms")
