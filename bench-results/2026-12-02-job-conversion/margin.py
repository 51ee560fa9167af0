"""With margin.diff applied (policy.MARGIN): python margin.py BATCH METHODS MARGINS [WORK ROUNDS]:
x ar of each method under auto at each margin on the host-charged clock, one round each."""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.runtime.control import policy
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); methods = sys.argv[2].split(","); margins = [float(x) for x in sys.argv[3].split(",")]
work = sys.argv[4] if len(sys.argv) > 4 else "waiting"
n = 4 * b if work == "waiting" else b
for rnd in range(int(sys.argv[5]) if len(sys.argv) > 5 else 2):
    for mg in margins:
        policy.MARGIN = mg
        r, st, ar = T.host_charged_ratios(m, b, n, patch, methods=methods, rounds=1)
        print(f"b{b} {work} margin {mg}: " + " ".join(f"{k} {v:.3f} ({st[k].steps - st[k].lean_steps}d)" for k, v in r.items()), flush=True)
