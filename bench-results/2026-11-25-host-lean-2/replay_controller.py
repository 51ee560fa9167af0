"""Budgets of the controller over 2,000 planned steps with synthetic, seeded timings and acceptance
(no model): run under each checkout (PYTHONPATH=<checkout>) and compare the JSON lines."""
import random, json, sys
import numpy as np
from specctl.engine.steptable import StepTable
from specctl.runtime.control.controller import Controller
from specctl.runtime.control.stepcost import StepCost
NS = (1, 2, 4, 8, 16, 32, 64)
out = []
for tree, probe, dfrac, b in ((True, 0, 0.0, 1), (True, 36, 0.0, 1), (False, 0, 0.3, 1), (True, 0, 0.0, 8), (False, 0, 0.3, 8)):
    batches = (1, 2, 8, 64)
    t = StepTable("cpu", "float32", "sdpa", 128, batches, NS,
                  tuple(tuple(20.0 + 0.5 * b_ * n ** 0.8 for n in NS) for b_ in batches), tiles=True)
    cost = StepCost(t, probe=probe, draft_frac=dfrac)
    ctl = Controller(cost, 20, tree=tree)
    rng = random.Random(0)
    class P:  # a proposal
        def __init__(self, k): self.draft = [0] * k; self.stopped_at = None; self.forwards = k; self.conf = [0.5] * k
    class V:
        def __init__(self, acc): self.accepted = acc
    for step in range(400):
        keys = list(range(b))
        room = [rng.randint(0, 20) for _ in keys]
        bud = ctl.plan(keys, room)
        props = [P(k) for k in bud.ks]
        verd = [V(list(range(min(k, rng.randint(0, 3))))) for k in bud.ks]
        ms = cost.table_ms(list(bud.ks), bud.probes)[0] * rng.uniform(0.8, 1.3)
        ctl.observe(keys, bud, props, verd, ms)
        out.append(list(bud.ks))
print(json.dumps(out))
