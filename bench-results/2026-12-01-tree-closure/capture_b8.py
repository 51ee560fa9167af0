"""The inputs of every drafting step's batch in a host_profile run of self-draft:fixed at b8
(../2026-11-30-grid-calls/harness.py's arguments, 32 prompts, one repeat): per step, per
sequence (slot, pending token, prefix, draft tokens, draft parents, probe tokens, probe
parents), as JSON to ARGV[1] (default steps-b8.json). Run from the repo root:
    PYTHONPATH=$PWD:$PWD/recipes python bench-results/2026-12-01-tree-closure/capture_b8.py OUT"""
import json, sys
out = sys.argv.pop(1) if len(sys.argv) > 1 else "steps-b8.json"
sys.path.insert(0, "bench-results/2026-11-30-grid-calls")
from harness import profile_argv
profile_argv("self-draft:fixed")
sys.argv[sys.argv.index("--batch-sizes") + 1] = "8"
sys.argv[sys.argv.index("--prompts") + 1] = "32"
sys.argv[sys.argv.index("--repeats") + 1] = "1"
from specctl.runtime.step import step as SP
steps = []
orig = SP.Planner._planned
def planned(self, seqs, budgets, props, *a, **k):
    lens = self.kv.lens
    steps.append([[s.slot, s.pending, lens[s.slot], p.draft.tokens, p.draft.parents,
                   p.probe.tokens, p.probe.parents] for s, p in zip(seqs, props)])
    return orig(self, seqs, budgets, props, *a, **k)
SP.Planner._planned = planned
import host_profile
host_profile.main()
json.dump(steps, open(out, "w"))
print(len(steps), "steps")
