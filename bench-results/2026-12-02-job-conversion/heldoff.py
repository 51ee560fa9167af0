import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from specctl.runtime.step import accounting as A
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); methods = sys.argv[2].split(",")
orig = A.Accounting._held
for rnd in range(int(sys.argv[3])):
    for off in (False, True):
        A.Accounting._held = (lambda self, n, h: 0.0) if off else orig
        r, st, ar = T.host_charged_ratios(m, b, 4 * b, patch, methods=methods, rounds=1)
        print(f"b{b} held-charge {'off' if off else 'on '}: " + " ".join(f"{k} {v:.3f} (d{st[k].steps - st[k].lean_steps} trips {st[k].guard_trips} jt {st[k].guard_job_trips if hasattr(st[k], 'guard_job_trips') else '?'} held {st[k].guard_held})" for k, v in r.items()), flush=True)
