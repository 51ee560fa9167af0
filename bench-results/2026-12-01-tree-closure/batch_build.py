"""A drafting step's batch (Planner._planned: seq_input a sequence, then ForwardBatch) built
from captured steps (capture_b8.py's JSON, ARGV[1]), then staged for a replay as the graph path
stages it (tests/sim.py Staging: CudaGraphs._stage_inputs into buffers of its own), each step's
median time warm and after a 32 MB sweep of the caches ("cold", as a CPU forward leaves them).
Run in the tree to measure:  cd $TREE && PYTHONPATH=$TREE python batch_build.py steps-b8.json"""
import json, sys, time, statistics
import numpy as np
from specctl.engine.batch import ForwardBatch
from specctl.speculative.verify import DraftTree
from specctl.runtime.step.step import seq_input
steps = json.load(open(sys.argv[1]))
class S: __slots__ = ("slot", "pending")
class P: __slots__ = ("draft", "probe")
data = []
for st in steps:
    seqs, props, lens = [], [], {}
    for slot, pend, L, dt, dp, pt, pp in st:
        s = S(); s.slot, s.pending = slot, pend
        p = P(); p.draft, p.probe = DraftTree.trusted(dt, dp), DraftTree.trusted(pt, pp)
        seqs.append(s); props.append(p); lens[slot] = L
    data.append((seqs, props, lens))
junk = np.ones(32 << 20 >> 3)
def run(fn, cold):
    ts = []
    for seqs, props, lens in data:
        if cold: junk.sum()
        t = time.perf_counter(); fn(seqs, props, lens); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6
def inputs(seqs, props, lens):
    return [seq_input(s, p, lens[s.slot]) for s, p in zip(seqs, props)]
def whole(seqs, props, lens):
    ForwardBatch(inputs(seqs, props, lens))
sys.path.insert(0, "tests")
from sim import Staging  # noqa: E402
stage = Staging()
built = [ForwardBatch(inputs(*d)) for d in data]
for b in built:
    stage(b, 8)
def staging(seqs, props, lens, _i={}):
    stage(built[_i.setdefault(id(seqs), len(_i))], 8)
for name, fn in [("seq_input x B", inputs), ("whole _planned batch", whole),
                 ("staging for a replay", staging)]:
    print(f"{name:30s} warm {run(fn, False):7.1f} us  cold {run(fn, True):7.1f} us")
