# Self-Draft at batch 32, requests waiting, held slots uncharged (no guard trip): how many of the
# drain steps (no request waiting) drafted, in 3 rounds. python drain_tail.py
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model, SimClock, HOST, h200_fused_table, prefill_table, timed_model, sim_run, traces, trace_lengths, sim_controller
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.accounting import Accounting
Accounting._held = lambda self, n, h: 0.0   # (noheld: no guard trip)
m, patch = script_model()
b = 32; n = 4 * b
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
ref, _ = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
log = []
inner = Runner.step
def step(self, seqs, drain=False):
    d0 = self.stats.step_tokens; w = inner(self, seqs, drain)
    log.append((drain, len(seqs), self.stats.step_tokens - d0 > len(seqs), self.controller.guard.hold > 0))
    return w
Runner.step = step
for r in range(3):
    log.clear()
    dr = T._drafters(m, prompts, ref, ["self-draft"])["self-draft"].fresh(); clock.reset()
    got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False, controller=sim_controller(dr, clock.table))
    assert got == ref
    dl = [x for x in log if x[0]]
    print(f"round {r}: steps {len(log)}, trips {st.guard_trips}; drain steps {len(dl)}, drafting among them {sum(x[2] for x in dl)}, "
          f"held by the guard {sum(x[3] for x in dl)}; waiting steps {len(log) - len(dl)}, drafting {sum(x[2] for x in log if not x[0])}")
