"""B per step and lean/draft for SD: traj.py BATCH METHOD [nojob]"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
from specctl.runtime.control import controller as C, guard as G
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
if len(sys.argv) > 3 and sys.argv[3] == "nojob":
    G.JOB_SLACK = 1e9
ids = {}; log = []
def wrap(name):
    orig = getattr(C.Controller, name)
    def f(self, *a, **kw):
        r = orig(self, *a, **kw)
        if r is None: return r
        drain = a[1] if name == "plan_lean" and len(a) > 1 else (a[2] if len(a) > 2 else kw.get("drain", False))
        log.append((ids.setdefault(id(self), len(ids)), self.steps, len(r.ks), sum(k > 0 for k in r.ks), max(r.ks), "D" if drain else "W", self.guard.hold))
        return r
    setattr(C.Controller, name, f)
wrap("plan_lean"); wrap("decide")
ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=sys.argv[2].split(","), rounds=1)
print(ratios)
for who in (0, 1):
    line = []
    for r in log:
        if r[0] == who:
            line.append(f"{r[2]}{r[5]}{'*' + str(r[3]) if r[3] else ''}{'h' if r[6] else ''}")
    print(who, " ".join(line))
