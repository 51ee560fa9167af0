"""Oracle chains of one acceptance (or 0 / 0.3 / 0.6 / 0.9 by turn: "uneven") under a controller
against `ar`, on the H100 table with a fixed prefill forward, no host charge (deterministic):
ms, prefill forwards, steps. The variants blind / persist / crit (README: A, AB, ABC) need the
two dropped rules: run from a tree with `git apply clump-rules.patch`; on the kept code only
`ar` and A run.

    python hetero.py BATCH N MAX_TOKENS PREFILL_MS uneven|P
"""
import sys
sys.path.insert(0, "tests")
import random
from sim import OracleChains, SimClock, h100_table, sim_controller, sim_run, timed_model, script_model, h200_fused_table, prefill_table, HOST
from helpers import run_ids
from specctl.runtime.step.admission import Admission
import pytest
m, patch = script_model()
b, n, mt, pf = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
def prompts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(30) for _ in range(rng.randint(3, 12))] for _ in range(n)]
P = prompts(n, 5)
ps = [0.9 * (i % 4) / 3 for i in range(n)] if sys.argv[5] == "uneven" else [float(sys.argv[5])] * n
table = h100_table()
ref, _ = run_ids(m, P, batch_size=b, max_tokens=mt)
clock = SimClock(table, b, prefill_ms=pf, token_us=5.0)
timed_model(m, clock, patch)
real_st, real_cl = Admission.stepped, getattr(Admission, "clumped", None)
rules = hasattr(Admission, "clumped")
for name in ("ar", "blind", "persist", "crit") if rules else ("ar", "A"):
    if not rules:
        clock.t = 0.0
        dr = OracleChains(ref, ps) if name != "ar" else None
        got, st = sim_run(m, P, dr, clock, batch_size=b, max_tokens=mt,
                          controller=sim_controller(dr, table) if dr else None)
        assert got == ref
        print(name, round(clock.t * 1e3, 1), st.prefill_forwards, st.steps)
        continue
    Admission.stepped = real_st if name != "blind" else (lambda self, ms, freed, at_budget=0: real_st(self, ms, freed, 0))
    Admission.clumped = real_cl if name == "crit" else (lambda self: False)
    clock.t = 0.0
    dr = OracleChains(ref, ps) if name != "ar" else None
    got, st = sim_run(m, P, dr, clock, batch_size=b, max_tokens=mt, controller=sim_controller(dr, table) if dr else None)
    assert got == ref
    print(name, round(clock.t * 1e3, 1), st.prefill_forwards, st.steps)
