"""Drafting steps' tokens/ms vs lean steps', by batch size. tok.py BATCH METHOD ROUNDS [nojob]"""
import sys, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control import controller as C, guard as G
m, patch = script_model()
import os
PF = (lambda p: float(os.environ["PF"])) if os.environ.get("PF") else None
b = int(sys.argv[1]); n = 4 * b
if len(sys.argv) > 4 and sys.argv[4] == "nojob":
    G.JOB_SLACK = 1e9
ids = {}
D = collections.defaultdict(lambda: [0, 0, 0.0])   # (kind, bucket) -> steps, tokens, ms
o_obs, o_lean = C.Controller.observe, C.Controller.lean_done
def observe(self, keys, bud, proposals, verdicts, measured_ms, host_ms=None):
    r = o_obs(self, keys, bud, proposals, verdicts, measured_ms, host_ms)
    if measured_ms:
        d = D[(ids.setdefault(id(self), len(ids)), "draft", len(keys) // 8 * 8)]
        d[0] += 1; d[1] += sum(len(v.accepted) + 1 for v in verdicts); d[2] += measured_ms
    return r
def lean_done(self, bb, ms, steps=1, host=None, hosted=0):
    if ms is not None:
        d = D[(ids.setdefault(id(self), len(ids)), "lean", bb // 8 * 8)]
        d[0] += steps; d[1] += bb * steps; d[2] += ms * steps
    return o_lean(self, bb, ms, steps, host, hosted)
C.Controller.observe, C.Controller.lean_done = observe, lean_done
for r in range(int(sys.argv[3])):
    D.clear(); ids.clear()
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[2].split(","), rounds=1, prefill=PF)
    print(ratios, "ar", ar.steps, round(ar.step_s * 1e3, 1), "tok/ms", round(ar.generated / (ar.step_s * 1e3), 2))
    for k in sorted(D):
        s, t, ms = D[k]
        print(f"  {k} steps {s} tok {t} ms {ms:.1f} tok/step {t/s:.1f} ms/step {ms/s:.2f} tok/ms {t/ms:.2f}")
