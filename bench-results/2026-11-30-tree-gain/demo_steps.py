"""Per drafting step on the demo clock: budgets, expected vs verified tokens, pool rates."""
import runpy, sys
import numpy as np
from specctl.runtime.control import controller as C
o = C.Controller.observe
def observe(self, keys, b, proposals, verdicts, measured_ms, host_ms=None):
    r = o(self, keys, b, proposals, verdicts, measured_ms, host_ms)
    ks = np.array(b.ks)
    got = sum(len(v.accepted) for v in verdicts)
    exp = float(b.gains[np.arange(len(ks)), ks].sum() - len(ks))
    nodes = [len(p.draft) for p in proposals]
    pr = self.acc._pool_rates()[:16]
    print(f"step {self.steps} B {len(ks)} drafting {int((ks>0).sum())} ks mean {ks[ks>0].mean() if (ks>0).any() else 0:.1f} nodes mean {np.mean(nodes):.1f} "
          f"explored {b.explored} exp_acc {exp:.1f} got_acc {got} pred_ms {b.predicted_ms:.2f} meas {measured_ms if measured_ms is None else round(measured_ms,2)}")
    print("   pool", " ".join(f"{x:.2f}" for x in pr), "tried", " ".join(str(int(x)) for x in self.acc.pool.tried[:16]))
    return r
C.Controller.observe = observe
sys.argv = ["demo_clock.py"] + sys.argv[1:]
runpy.run_path(str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-29-host-clock-5/demo_clock.py"), run_name="__main__")
