"""How much Python a step's host runs, counted, not timed: the bytecode instructions and the
calls into C (numpy, torch's Python API, builtins) on the step's critical path, per step and
method, with what runs under the forward (Runner.under_forward) counted apart. A count does
not move with the machine's load, where host_profile's microseconds move by ~1 us a step
between runs at batch 1 (ab-*.txt), the size of what is measured there.

Device work is left out: a graph's replay (on a CPU, the model's forward run eagerly in its
place), the argmax, an eager forward, Kangaroo's adapter layer, a grid step's device_step. A
replay's host side (the graph's key, look-up and staging, CudaGraphs.run) is counted: a GPU's
host runs it, though host_profile's columns put it in the model's share.

    PYTHONPATH=TREE python bench-results/2026-11-30-lean-b1/opcodes.py [host_profile args]

runs recipes/host_profile.py (TREE's specctl, this script's host_profile) with its arguments
(default: the tiny model at /tmp/tiny, b1, 16 prompts x 48 tokens, CUDA's schedule, the graph
path, every method), counting over its timed runs, and prints a table after its own;
--by-function (first) then lists, for each method, the functions whose opcodes a step differ
most from `ar`'s.
"""
import sys
import threading
from collections import defaultdict
from pathlib import Path

root = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "recipes"))
import host_profile as HP   # noqa: E402
from specctl.engine import graphs as G   # noqa: E402
from specctl.engine.model import Model   # noqa: E402
from specctl.runtime.step.grid import GridStep   # noqa: E402
from specctl.runtime.step.runner import Runner   # noqa: E402
from specctl.speculative.kangaroo import Adapter   # noqa: E402

S = {"where": None, "dev": 0}
N = defaultdict(int)   # (method, where, kind) -> count
STEPS = defaultdict(int)
METHOD = {}   # id(runner) -> method


BY = defaultdict(int)   # (method, where, function) -> opcodes, with --by-function
BY_FUNCTION = "--by-function" in sys.argv


def _local(frame, event, arg):
    if event == "opcode" and S["where"] is not None and not S["dev"]:
        N[(S["where"][0], S["where"][1], "ops")] += 1
        if BY_FUNCTION:
            c = frame.f_code
            BY[(*S["where"], f"{Path(c.co_filename).name}:{c.co_qualname}")] += 1
    return _local


def _trace(frame, event, arg):
    frame.f_trace_opcodes = True
    return _local


def _prof(frame, event, arg):
    if event == "c_call" and S["where"] is not None and not S["dev"]:
        N[(S["where"][0], S["where"][1], "c")] += 1


def device(cls, name):
    f = getattr(cls, name)

    def dev(*a, **k):
        S["dev"] += 1
        try:
            return f(*a, **k)
        finally:
            S["dev"] -= 1
    setattr(cls, name, dev)


for cls, name in [(G._EagerReplay, "replay"), (Model, "forward"), (Model, "argmax"),
                  (Model, "logits"), (Adapter, "decode"), (Adapter, "write_rows"),
                  (GridStep, "device_step")]:
    device(cls, name)

step0, under0 = Runner.step, Runner.under_forward


def step(self, seqs, drain=False):
    m = METHOD.get(id(self))
    if m is None:   # (the warm-up run: not counted)
        return step0(self, seqs, drain)
    S["where"] = (m, "step")
    STEPS[m] += 1
    sys.settrace(_trace)
    sys.setprofile(_prof)
    try:
        return step0(self, seqs, drain)
    finally:
        sys.settrace(None)
        sys.setprofile(None)
        S["where"] = None


def under_forward(self, seqs, drain, *a):
    was = S["where"]
    S["where"] = (was[0], "under") if was else None
    try:
        return under0(self, seqs, drain, *a)
    finally:
        S["where"] = was


Runner.step, Runner.under_forward = step, under_forward

run0 = HP.Row.run


def run(self, requests):
    METHOD[id(self.runner)] = self.method
    try:
        return run0(self, requests)
    finally:
        METHOD.pop(id(self.runner), None)


HP.Row.run = run

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--by-function"] or [
        "--model", "/tmp/tiny", "--input", str(root / "recipes/prompts/specbench128.jsonl"),
        "--store", "/tmp/tiny-store", "--batch-sizes", "1", "--threads", "1",
        "--max-tokens", "48", "--prompts", "16", "--methods",
        "ar,self-draft,draft-verify,kangaroo", "--schedule", "cuda", "--repeats", "1",
        "--skip-set", "/tmp/tiny/skip.json", "--graphs"]
    sys.argv = ["host_profile.py", *args]
    assert threading.active_count() == 1   # (one thread: the counts are this one's)
    HP.main()
    print("\n| method | steps | opcodes/step | C calls/step | under fwd opcodes/step | "
          "under fwd C calls/step |\n|---|---|---|---|---|---|")
    for m, n in STEPS.items():
        g = lambda w, k: N[(m, w, k)] / n
        print(f"| {m} | {n} | {g('step', 'ops'):.0f} | {g('step', 'c'):.1f} | "
              f"{g('under', 'ops'):.0f} | {g('under', 'c'):.1f} |")
    if BY_FUNCTION:
        for m in STEPS:
            if m == "ar":
                continue
            for w in ("step", "under"):
                keys = {k[2] for k in BY if k[0] in (m, "ar") and k[1] == w}
                d = {k: BY[(m, w, k)] / STEPS[m] - BY[("ar", w, k)] / STEPS["ar"] for k in keys}
                print(f"\n{m}, {w}: opcodes a step over ar's, by function")
                for k in sorted(d, key=lambda k: -abs(d[k]))[:15]:
                    print(f"  {d[k]:+7.1f}  {k}")
