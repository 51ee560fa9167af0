"""Per-step host CPU (thread time outside the model) of ar and the trace under auto, by step kind.
stephost.py BATCH waiting|drain [method]"""
import sys, time
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import HOST, TraceChains, sim_controller, sim_run, script_model
from specctl.runtime.step import runner as RN, step as SP, prefill as PF
m, patch = script_model()
b, work = int(sys.argv[1]), sys.argv[2]
meth = sys.argv[3] if len(sys.argv) > 3 else "trace"
n = 4 * b if work == "waiting" else b
known, prompts, lens, clock = T.workload(m, b, n, patch)
rec = []
orig_step, orig_plan = RN.Runner.step, SP.Planner.plan
last = {}
def plan(self, *a, **k):
    p = orig_plan(self, *a, **k); last["lean"] = p.lean or p.batch.num_tokens == len(p.seqs); return p
def step(self, seqs, drain=False):
    c0, i0 = time.thread_time(), clock.inside
    w = orig_step(self, seqs, drain)
    rec.append((last["lean"], len(seqs), (time.thread_time() - c0 - (clock.inside - i0)) * 1e3))
    return w
SP.Planner.plan, RN.Runner.step = plan, step
def summary(tag, tot):
    import collections
    d = collections.defaultdict(lambda: [0, 0.0])
    for lean, bs, ms in rec:
        d[lean][0] += 1; d[lean][1] += ms
    s = sum(ms for _, _, ms in rec)
    print(f"{tag}: run host CPU {tot:.2f} ms, in steps {s:.2f} ms ({len(rec)} steps); " + ", ".join(
        f"{'lean' if k else 'drafting'} {v[0]} steps {v[1]:.2f} ms ({v[1]/v[0]*1e3:.0f} us each)" for k, v in d.items()))
for r in range(2):
    rec.clear(); clock.reset()
    ref, st = sim_run(m, prompts, None, clock, batch_size=b, max_tokens=lens, ends_known=False)
    summary("ar   ", clock.host_s() / HOST * 1e3)
    if meth == "trace": dr = TraceChains(ref, known)
    elif meth == "sd-grid":
        from dataclasses import replace
        from specctl.speculative.self_draft import SelfDraftDrafter
        sd = T._drafters(m, prompts, ref, ["self-draft"])["self-draft"]
        dr = SelfDraftDrafter(replace(sd.prm, grid=True), sd.corpus, vocab=m.cfg.vocab_size)
    else: dr = T._drafters(m, prompts, ref, [meth])[meth]
    rec.clear(); clock.reset()
    got, st2 = sim_run(m, prompts, dr, clock, batch_size=b, max_tokens=lens, ends_known=False,
                       controller=sim_controller(dr, clock.table))
    summary(meth, clock.host_s() / HOST * 1e3)
