import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.runtime.control import guard as G
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); methods = sys.argv[2].split(","); slacks = [float(x) for x in sys.argv[3].split(",")]
for rnd in range(int(sys.argv[4])):
    for sl in slacks:
        G.JOB_SLACK = sl
        r, st, ar = T.host_charged_ratios(m, b, 4 * b, patch, methods=methods, rounds=1)
        print(f"b{b} JOB_SLACK {sl}: " + " ".join(f"{k} {v:.3f} (d{st[k].steps - st[k].lean_steps} jt {st[k].guard_job_trips} trips {st[k].guard_trips} held {st[k].guard_held})" for k, v in r.items()), flush=True)
