# live sequences a step and slots held or empty, `ar` against a method, on the host-charged clock
# (requests waiting, 4x the batch, ends not foreseen): python occupancy.py BATCH METHOD
import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model, SimClock, HOST, h200_fused_table, prefill_table, timed_model, sim_run, traces, trace_lengths, sim_controller
from specctl.runtime.step.runner import Runner
m, patch = script_model()
b = int(sys.argv[1]); method = sys.argv[2]
n = 4*b
known = traces(); prompts = T._prompts(n, seed=b)
lens = [min(x, T.MAX_TOKENS) for x in trace_lengths(n, known)]
print("tokens", sum(lens), "lens<64:", sum(l < 64 for l in lens))
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(m, clock, patch)
occ = []
inner = Runner.step
def step(self, seqs, drain=False):
    t0 = clock(); w = inner(self, seqs, drain); occ.append((len(seqs), clock() - t0, self._held)); return w
Runner.step = step
ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
tar = clock()
def rep(tag, t):
    print(tag, "ms", round(t*1e3,1), "steps", len(occ), "slot-steps", sum(o[0] for o in occ), "step ms", round(sum(o[1] for o in occ)*1e3,1),
          "steps not full", sum(o[0] < b for o in occ), "empty slot-steps", sum(b - o[0] for o in occ), "held slot-steps", sum(o[2] for o in occ))
rep("ar", tar); print("ar live per step:", [o[0] for o in occ]); occ.clear()
dr = T._drafters(m, prompts, ref, [method])[method].fresh(); clock.reset()
got, st = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False, controller=sim_controller(dr, clock.table))
rep(method, clock())
print("SD live per step:", [o[0] for o in occ])
