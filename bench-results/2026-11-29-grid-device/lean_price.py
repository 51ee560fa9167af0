"""demo_clock.py logging each search (the lean step's price and goodput against the chosen
budgets') and what each lean step taught the controller (Controller.lean_done).

    python bench-results/2026-11-29-grid-device/lean_price.py BATCH PROMPTS THREADS ROUNDS METHOD
"""
import sys, runpy, collections
import numpy as np
import specctl.runtime.control.policy as policy
import specctl.runtime.control.controller as C
real = policy.search
rows, lean = [], []
def search(gains, caps, cost, probes, left=None):
    ks = real(gains, caps, cost, probes, left)
    b = len(gains)
    t0 = cost.step_ms([0] * b, probes); t1 = cost.step_ms(ks, probes)
    g1 = b + sum(gains[i, k] - gains[i, 0] for i, k in enumerate(ks))
    rows.append((b, left is not None, sum(ks), b / t0, g1 / t1, t0, t1, cost.ar_table_ms(b) if hasattr(cost,'ar_table_ms') else 0))
    return ks
policy.search = search
C.policy.search = search
rl = C.Controller.lean_done
def lean_done(self, b, ms, steps=1, host=None, timed=0):
    lean.append((b, ms, steps, host))
    return rl(self, b, ms, steps, host, timed)
C.Controller.lean_done = lean_done
import atexit
@atexit.register
def show():
    d = [r for r in rows if r[2]]
    print(f"searches {len(rows)}, drafting {len(d)}")
    for r in rows[16:60]:
        print("b %d drain %s tokens %d lean %.3f/ms (%.2f ms) chosen %.3f/ms (%.2f ms) table-ar %.2f" % (r[0], r[1], r[2], r[3], r[5], r[4], r[6], r[7]))
    print("lean_done:", [(b, round(ms, 2) if ms else ms, s, round(h, 2) if h else h) for b, ms, s, h in lean[:60]])
sys.argv = ['demo_clock.py'] + sys.argv[1:]
runpy.run_path('bench-results/2026-11-29-host-clock-5/demo_clock.py', run_name='__main__')
