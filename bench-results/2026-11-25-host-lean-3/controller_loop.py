"""The controller's own cost at batch 1: plan + observe of one sequence over 6,000 steps with
synthetic timings and acceptance (a learn almost every step), no model. Run under each
checkout: PYTHONPATH=<checkout> python controller_loop.py tree|chain"""
import random, time, sys
from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import Controller
from specctl.runtime.control.stepcost import StepCost
NS = (1, 2, 4, 8, 16, 32, 64)
batches = (1, 2, 8, 64)
t = StepTable("cpu", "float32", "sdpa", 128, batches, NS,
              tuple(tuple(20.0 + 0.5 * b_ * n ** 0.8 for n in NS) for b_ in batches), tiles=True)
tree = sys.argv[1] == "tree"
cost = StepCost(t, probe=36 if tree else 0, draft_frac=0 if tree else 0.3)
ctl = Controller(cost, 52 if tree else 8, tree=tree)
rng = random.Random(0)
class P:
    def __init__(self, k): self.draft = [0] * k; self.stopped_at = None; self.forwards = k; self.conf = [0.5] * k
class V:
    def __init__(self, acc): self.accepted = acc
N = 6000
tp = to = 0.0
for step in range(N):
    keys = [0]
    room = [47 - step % 48]
    a = time.perf_counter()
    bud = ctl.plan(keys, room)
    b_ = time.perf_counter()
    props = [P(k) for k in bud.ks]
    verd = [V(list(range(min(k, rng.randint(0, 3))))) for k in bud.ks]
    ms = cost.table_ms(list(bud.ks), bud.probes)[0] * rng.uniform(0.8, 1.3)
    c = time.perf_counter()
    ctl.observe(keys, bud, props, verd, ms)
    d = time.perf_counter()
    tp += b_ - a; to += d - c
print(f"plan {tp/N*1e6:.1f} us observe {to/N*1e6:.1f} us")
