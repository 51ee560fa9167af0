"""Where a step's host time goes, lean steps apart from drafting steps, on the host-charged
clock (tests/sim.py: forwards priced by the committed H200 tables, this process's CPU time
outside them charged x sim.HOST). Each part is the thread CPU time of a call (a call under
the forward, Runner.under_forward, is marked [under]: hidden behind the forward on CUDA);
a step's "charged ms" is its time on the clock.

    python bench-results/2026-11-30-plan-host/parts.py demo|tiny BATCH PROMPTS METHOD ROUNDS

demo: the demo model and its real drafter on ShareGPT first turns cut to 96 tokens, answers
of the real lengths (../2026-11-29-host-clock-5/demo_clock.py's workload; METHOD a bench
variant); tiny: tests/test_host_clock.py's workload (METHOD one of its rows: trace,
self-draft, ...). Another tree: PYTHONPATH=TREE python .../parts.py ...
"""
import sys, time
from collections import defaultdict
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import torch
import sim
from sim import (HOST, NoUndo, SimClock, h200_fused_table, prefill_table, sim_controller, sim_run, timed_model, trace_lengths, traces, TraceChains)
from specctl.runtime.step import step as S, runner as R, accounting as A
from specctl.runtime.control import controller as CT
from specctl.engine import batch as FB
from specctl.speculative import self_draft as SD
kind_, b, n, METHOD, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
TT = defaultdict(float); N = defaultdict(int)
cur = {"k": "lean", "uf": 0}
def wrap(obj, name, key=None):
    f = getattr(obj, name); key = key or f"{getattr(obj,'__name__','?')}.{name}"
    def timed(*a, **k):
        t = time.thread_time()
        try: return f(*a, **k)
        finally:
            kk = (cur["k"], key + (" [under]" if cur["uf"] and name != "under_forward" else ""))
            TT[kk] += time.thread_time() - t; N[kk] += 1
    setattr(obj, name, timed)
if kind_ == "demo":
    from specctl.engine.loader import load_model
    from specctl.io.sharegpt import first_human_turns
    from specctl.models.checkpoint import resolve_model
    from specctl.runtime.jobs.config import GenerateConfig, split_variant
    from specctl.runtime.jobs.methods import make_drafter
    from specctl.runtime.jobs.tokenization import Tokenization
    from specctl.runtime.step.sequence import Request
    from specctl.store import Store
    torch.set_num_threads(2)
    store = Store(None); model_dir = resolve_model(None, store)
    model = load_model(model_dir, "cpu", "fp32")
    tk = Tokenization(model_dir, chat=True)
    texts = first_human_turns(n, store)
    prompts = [tk.render(Request(i, [[{"role": "user", "content": t}]], 64))[:96] for i, t in enumerate(texts)]
    clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
    timed_model(model, clock, NoUndo())
    lens = [min(x, 64) for x in trace_lengths(n, traces())]
    name, opts = split_variant(METHOD)
    cfg = GenerateConfig(input="x", method=name, batch_size=b, max_tokens=64, **opts)
    base = make_drafter(cfg, model, model_dir, store, lambda *_: None)
    ends = True
else:
    import test_host_clock as T
    model, patch = sim.script_model()
    known, prompts, lens, clock = T.workload(model, b, n, patch)
    ends = False
for obj, nm in [(S.Planner, "plan"), (CT.Controller, "decide"), (R, "read"), (R, "verify"), (R, "commit"),
                (R, "commit_grid"), (A.Accounting, "step"), (R.Runner, "under_forward"), (sim.Staging, "__call__"),
                (R.Runner, "_retire"), (R.Runner, "_prefill"), (R.Runner, "under_prefill"), (R.Runner, "_admit"), (SD.SelfDraftDrafter, "admit"), (S.Planner, "_planned"), (FB.ForwardBatch, "__init__"),
                (CT.Controller, "stop_rule"), (SD.SelfDraftDrafter, "propose"), (SD.SelfDraftDrafter, "catch_up"), (SD.SelfDraftDrafter, "observe"), (CT.Controller, "observe")]:
    wrap(obj, nm)
fu = R.Runner.under_forward
def uf_(self, *a, **k):
    cur["uf"] += 1
    try: return fu(self, *a, **k)
    finally: cur["uf"] -= 1
R.Runner.under_forward = uf_
fp = S.Planner.plan
def plan_(self, *a, **k):
    p = fp(self, *a, **k)
    cur["k"] = "lean" if (p.lean or self.controller is None) else "draft"
    return p
S.Planner.plan = plan_
fs = R.Runner.step
def step_(self, *a, **k):
    c0 = clock()
    cur["k"] = "pre"
    try: return fs(self, *a, **k)
    finally:
        TT[(cur["k"], "STEP charged ms")] += clock() - c0; N[(cur["k"], "STEP charged ms")] += 1
        for key in [x for x in list(TT) if x[0] == "pre"]:
            TT[(cur["k"], key[1])] += TT.pop(key); N[(cur["k"], key[1])] += N.pop(key)
        cur["k"] = "between"
R.Runner.step = step_
def go(d):
    clock.reset()
    return sim_run(model, prompts, d, clock, batch_size=b, max_tokens=lens, ends_known=ends,
                   controller=sim_controller(d, clock.table) if d else None)
for r in range(rounds):
    TT.clear(); N.clear()
    ref, ar = go(None); t_ar = clock()
    ar_step = TT[("lean", "STEP charged ms")] / N[("lean", "STEP charged ms")]
    print(f"ar: prefill {ar.prefill_s*1e3:.1f} ms ({ar.prefill_forwards} fwd), steps {ar.step_s*1e3:.1f} ms")
    for (k, key) in sorted([x for x in TT if x[0] == "lean" and x[1] != "STEP charged ms"], key=lambda x: -TT[x]):
        print(f"     ar {key:36s} {TT[(k,key)]/ar.steps*1e6:8.1f} us/step  (n={N[(k,key)]})")
    if kind_ == "demo":
        d = base.fresh()
    else:
        d = TraceChains(ref, known) if METHOD == "trace" else T._drafters(model, prompts, ref, [METHOD], b)[METHOD]
        d = d.fresh()
    TT.clear(); N.clear()
    got, st = go(d); t = clock(); assert got == ref
    print(f"round {r}: ar {t_ar*1e3:.1f} ms ({ar.steps} steps, {ar_step*1e3:.3f} ms/step), {METHOD} {t*1e3:.1f} ms ({st.steps} steps) {t_ar/t:.3f}x; tokens/seq-step drafting {st.verified_tokens/max(1,sum(v for k,v in st.budget_hist.items())):.2f}")
    print(f"{METHOD}: prefill {st.prefill_s*1e3:.1f} ms ({st.prefill_forwards} fwd), steps {st.step_s*1e3:.1f} ms, search {st.search_ms:.1f} ms, learn {st.learn_s*1e3:.1f}")
    for kind in ("lean", "draft"):
        ns = N[(kind, "STEP charged ms")]
        if not ns: continue
        print(f"  {kind}: {ns} steps, {TT[(kind,'STEP charged ms')]/ns*1e3:.3f} ms/step charged")
        for (k, key) in sorted([x for x in TT if x[0] == kind and x[1] != "STEP charged ms"], key=lambda x: -TT[x]):
            print(f"     {key:36s} {TT[(k,key)]/ns*1e6:8.1f} us/step  (n={N[(k,key)]})")
