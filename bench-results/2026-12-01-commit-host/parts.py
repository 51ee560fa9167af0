"""A b64 host_profile run (../2026-11-30-grid-calls/harness.py's arguments: the tiny model,
128 prompts x 48 tokens, `ar` and self-draft:grid:fixed, CUDA's schedule, --graphs), with the
median wall of a step's parts: the plans, the commits and `ar`'s verify. Run from the tree to
measure: PYTHONPATH=$TREE:$TREE/recipes python parts.py"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "2026-11-30-grid-calls"))
from harness import T, profile_argv, wrap  # noqa: E402

profile_argv("ar,self-draft:grid:fixed")
from specctl.runtime.step import runner as RN, step as SP  # noqa: E402

wrap(SP.Planner, "plan", lambda a, out: f"Planner.plan ({'grid' if out.grid else 'ar'})")
wrap(RN, "commit_grid", "commit_grid")
wrap(RN, "commit", "commit")
wrap(RN, "verify", "verify")
import host_profile  # noqa: E402

host_profile.main()
for k in sorted(T):
    print(f"{k:28s} n={len(T[k]):5d} median {statistics.median(T[k]):7.1f} us")
