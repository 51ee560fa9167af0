"""A drain's drafting decisions: the steps left of the critical path, the sequences on it, the
slowest's gains, the path the search predicts, the price; then what the critical sequences
accepted and the step's host as timed. drainwhy.py BATCH METHOD"""
import sys
sys.path.insert(0, "tests")
import numpy as np
import test_host_clock as T
from sim import TraceChains, sim_controller, sim_run, script_model
from specctl.runtime.control.controller import Controller
m, patch = script_model()
b = int(sys.argv[1]); meth = sys.argv[2]
n = b
known, prompts, lens, clock = T.workload(m, b, n, patch)
orig, obs = Controller.decide, Controller.observe
def decide(self, keys, room, drain=False):
    bd = orig(self, keys, room, drain)
    if not bd.lean:
        ks = np.asarray(bd.ks); left = np.asarray(room) + 1
        g = bd.gains
        top = left.max(); crit = left == top
        print(f" step {self.steps} b={len(keys)} left max {top} ({crit.sum()} seqs at it) ks {sorted(set(ks.tolist()))}"
              f" crit gain mean {np.mean([g[i,k]-g[i,0] for i,k in enumerate(ks) if crit[i]]):.2f}"
              f" path lean {top} -> {max(left[i]/(1+g[i,k]-g[i,0]) for i,k in enumerate(ks)):.1f}"
              f" pred {bd.predicted_ms:.2f} lean {self.cost.step_ms([0]*len(ks), False):.2f}")
        self.__dict__.setdefault("_crits", []).append(crit)   # (observed a step later)
    return bd
def observe(self, keys, bd, proposals, verdicts, *a, **k):
    if not bd.lean and getattr(self, "_crits", None):
        acc = [len(v.accepted) for v in verdicts]
        c = self._crits.pop(0)
        print(f"   accepted: crit {[a for a, x in zip(acc, c) if x]} all mean {np.mean(acc):.2f}")
    if not bd.lean:
        hm = a[1] if len(a) > 1 else k.get("host_ms")
        print(f"   observed step host {hm} lean_at {self.cost.lean_at(len(keys)):.3f} measured {a[0] if a else None}")
    return obs(self, keys, bd, proposals, verdicts, *a, **k)
Controller.decide, Controller.observe = decide, observe
clock.reset()
ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
ar_t = clock()
dr = TraceChains(ref, known) if meth == "trace" else T._drafters(m, prompts, ref, [meth], b)[meth]
clock.reset()
got, st2 = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False,
                   controller=sim_controller(dr, clock.table))
print(f"ar {ar_t*1e3:.1f} ms {st.steps} steps | {meth} {clock()*1e3:.1f} ms {st2.steps} steps x{ar_t/clock():.3f}")
