"""Clock span, device time and CPU (the model's included) of each of a drain's first steps,
ar beside a method under auto. spans.py BATCH METHOD [STEPS]"""
import sys, time
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import TraceChains, sim_controller, sim_run, script_model
from specctl.runtime.step import runner as RN
m, patch = script_model()
b = int(sys.argv[1]); meth = sys.argv[2]; N = int(sys.argv[3]) if len(sys.argv) > 3 else 10
known, prompts, lens, clock = T.workload(m, b, b, patch)
orig = RN.Runner.step; rec = []
def step(self, seqs, drain=False):
    t0, c0, d0 = clock(), time.thread_time(), clock.t
    w = orig(self, seqs, drain)
    rec.append((clock() - t0, clock.t - d0, time.thread_time() - c0))
    return w
RN.Runner.step = step
for r in range(2):
    rec.clear(); clock.reset()
    ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
    a = list(rec); ta = clock()
    dr = TraceChains(ref, known) if meth == "trace" else T._drafters(m, prompts, ref, [meth], b)[meth]
    rec.clear(); clock.reset()
    got, st2 = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False,
                       controller=sim_controller(dr, clock.table))
    print(f"round {r} x{ta/clock():.3f}  ar total {ta*1e3:.1f} {meth} {clock()*1e3:.1f}")
    for i in range(N):
        print(f"  step {i}: ar span {a[i][0]*1e3:.2f} dev {a[i][1]*1e3:.2f} cpu {a[i][2]*1e3:.2f} | {meth} span {rec[i][0]*1e3:.2f} dev {rec[i][1]*1e3:.2f} cpu {rec[i][2]*1e3:.2f}")
    print("  sum rest: ar", sum(x[0] for x in a[N:])*1e3, meth, sum(x[0] for x in rec[N:])*1e3)
