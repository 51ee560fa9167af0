"""Controller.decide's CPU time (thread time, median and p90 of 200 searches) at batch 8/32/64 on
the committed H100 table, with learnt acceptance: chains (K 8), trees with probes (Self-Draft: K 24,
36 probe tokens), layer-skip chains with draft forwards (K 12). Half the searches price a drain.

    python bench-results/2026-11-28-host-clock/decide_cost.py   (from the repo root)
"""
import sys, time, random
sys.path.insert(0, "tests")
import numpy as np
from sim import h100_table
from specctl.runtime.control.controller import Controller
from specctl.runtime.control.stepcost import StepCost
from specctl.speculative.drafter import DraftPrice
table = h100_table()
for name, price in [("chain", DraftPrice(max_draft=8)), ("tree", DraftPrice(max_draft=24, tree=True, probe=36)), ("dv", DraftPrice(max_draft=12, draft_frac=0.6))]:
  for b in (8, 32, 64):
    ctl = Controller(StepCost.of(table, price, padded=True), price.max_draft, tree=price.tree)
    rng = random.Random(0)
    keys = list(range(b))
    # learn some acceptance
    for s in range(50):
        tried = [rng.randint(1, price.max_draft) for _ in keys]
        acc = [list(range(rng.randint(0, t))) for t in tried]
        ctl.acc.learn_many(keys, tried, acc, None if price.tree else [[0.5]*t for t in tried])
    room = [60] * b
    ts = []
    for s in range(200):
        # learning between steps invalidates caches, as in a run
        tried = [rng.randint(1, 4) for _ in keys]
        ctl.acc.learn_many(keys, tried, [list(range(rng.randint(0, t))) for t in tried], None if price.tree else [[0.5]*t for t in tried])
        ctl.lean_until = 0
        t0 = time.thread_time()
        ctl.decide(keys, room, drain=(s % 2 == 1))
        ts.append(time.thread_time() - t0)
    ts.sort()
    print(name, b, "median %.3f ms  p90 %.3f ms" % (ts[len(ts)//2]*1e3, ts[int(len(ts)*.9)]*1e3))
