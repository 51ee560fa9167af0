"""ab.py's workload under a variant of the two dropped rules (README): V=A (the kept code),
AB, ABC, from a tree with `git apply clump-rules.patch` (on the kept code, V=A only).

    V=A python abv.py BATCH waiting|drain METHODS ROUNDS
"""
import os, statistics, sys
sys.path.insert(0, "tests")
import test_host_clock as T
import sim
from specctl.runtime.step.admission import Admission
V = os.environ.get("V", "ABC")
real_st = Admission.stepped
if V == "A" and hasattr(Admission, "clumped"):
    Admission.stepped = lambda self, ms, freed, at_budget=0: real_st(self, ms, freed, 0)
if V == "AB":
    Admission.clumped = lambda self: False
m, patch = sim.script_model()
b = int(sys.argv[1]); n = 4 * b if sys.argv[2] == "waiting" else b
times, got, ms = [], {}, []
real = T.sim_run
def timed(model, prompts, drafter, clock, **kw):
    r = real(model, prompts, drafter, clock, **kw); times.append(clock()); return r
T.sim_run = timed
for _ in range(int(sys.argv[4])):
    times.clear()
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[3].split(","), rounds=1)
    ms.append(times[0] * 1e3)
    for k, v in ratios.items():
        got.setdefault(k, []).append((v, stats[k].steps, stats[k].prefill_forwards))
a = statistics.median(ms)
print(f"{V} b{b} {sys.argv[2]}: ar {a:.1f} ms pf {ar.prefill_forwards} | " + " | ".join(
    f"{k} {statistics.median(x for x,_,_ in v):.3f}x ({a/statistics.median(x for x,_,_ in v):.0f} ms, st {statistics.median(s for _,s,_ in v)}, pf {statistics.median(p for _,_,p in v)})" for k, v in got.items()))
