"""Each prefill forward of ar, the trace oracle and Self-Draft in one round of
tests/test_host_clock.py's workload (BATCH waiting: 4x the batch of requests): the step it came
at, forwards, prompts, ms, the group asked for and the fixed cost F fitted.

    python bench-results/2026-11-29-grid-device/admissions.py 32
"""
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
import specctl.runtime.step.admission as A
log = []
real = A.Admission.prefilled
def prefilled(self, forwards, tokens, ms, prompts=1):
    log.append((self.steps, forwards, prompts, round(ms, 1), self.group(), self._fixed and round(self._fixed, 1)))
    return real(self, forwards, tokens, ms, prompts)
A.Admission.prefilled = prefilled
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
orig = T.sim_run
def sim_run(*a, **kw):
    log.clear()
    r = orig(*a, **kw)
    print("drafter", type(a[2]).__name__ if len(a) > 2 and a[2] is not None else kw.get('drafter'), log)
    return r
T.sim_run = sim_run
ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, methods=["self-draft"], rounds=1)
print(ratios)
