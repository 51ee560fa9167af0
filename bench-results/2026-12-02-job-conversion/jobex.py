import sys, collections
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.runtime.control import guard as G
from specctl.runtime.step import accounting as A
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); methods = sys.argv[2].split(",")
acc = collections.Counter(); log = []
og = G.Guard.job
def job(self, excess, ms, steps=1):
    k = "drafting" if steps == 1 else ("lean-at-once" if steps == 0 else "flush")
    acc[k] += excess; acc[k + "#"] += 1
    t0 = self.job_trips
    og(self, excess, ms, steps)
    if self.job_trips > t0: log.append(f"TRIP after {k} excess {excess:.2f} ms {ms:.2f} step_ms {self.step_ms:.2f}")
G.Guard.job = job
oa = A.Accounting.step
def step(self, plan, out, seqs, had, drain, times, later=False):
    t0, t1, t2, end, ahead, new, held, caught = times
    if plan.budgets.lean:
        acc["lean.search"] += plan.search_ms + ahead; acc["lean.held"] += self._held(len(seqs), held)
        acc["lean.over"] += max(0.0, caught - self.ctl.cost.ar_table_ms(len(seqs))) if caught else 0
    return oa(self, plan, out, seqs, had, drain, times, later)
A.Accounting.step = step
for rnd in range(int(sys.argv[3])):
    acc.clear(); log.clear()
    r, st, ar = T.host_charged_ratios(m, b, 4 * b, patch, methods=methods, rounds=1)
    print(f"b{b}: " + " ".join(f"{k} {v:.3f} (d{st[k].steps - st[k].lean_steps} trips {st[k].guard_trips} jt {st[k].guard_job_trips} held {st[k].guard_held})" for k, v in r.items()))
    print("   ", {k: round(v, 1) for k, v in acc.items()}); print("   ", log[:5])
