"""ar and methods on the demo clock at one prefill chunk: each run's prefill forwards, its
prefill ms on the clock, and the host CPU inside prefill (outside the model), split into the
`under` callback (the controller's search) and the rest.
    prefill_split.py BATCH PROMPTS CHUNK CUT METHOD[,METHOD..]"""
import sys, time
from pathlib import Path
import torch
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import sim
from sim import (HOST, NoUndo, SimClock, h200_fused_table, prefill_table, sim_controller,
                 sim_run, timed_model, trace_lengths, traces)
from specctl.engine.loader import load_model
from specctl.io.sharegpt import first_human_turns
from specctl.models.checkpoint import resolve_model
from specctl.runtime.jobs.config import GenerateConfig, split_variant
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.jobs.tokenization import Tokenization
from specctl.runtime.step.sequence import Request
from specctl.runtime.step import runner as RN
from specctl.store import Store
b, n, chunk, cut = (int(x) for x in sys.argv[1:5])
methods = sys.argv[5].split(",")
torch.set_num_threads(2)
store = Store(None)
model_dir = resolve_model(None, store)
model = load_model(model_dir, "cpu", "fp32")
tk = Tokenization(model_dir, chat=True)
prompts = [tk.render(Request(i, [[{"role": "user", "content": t}]], 64))[:cut]
           for i, t in enumerate(first_human_turns(n, store))]
print(f"{n} prompts, {sum(map(len, prompts))} tokens, chunk {chunk}", flush=True)
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(model, clock, NoUndo())
lens = [min(x, 64) for x in trace_lengths(n, traces())]
Runner = sim.Runner
sim.Runner = lambda *a, **kw: Runner(*a, prefill_chunk=chunk, **kw)
orig = RN.prefill
acc = {}
def prefill(*a, **kw):
    under = a[9] if len(a) > 9 else kw.get("under")
    def timed_under():
        c0 = time.thread_time(); i0 = clock.inside
        try:
            return under()
        finally:
            acc["under"] += time.thread_time() - c0 - (clock.inside - i0)
    if under is not None:
        if len(a) > 9:
            a = a[:9] + (timed_under,) + a[10:]
        else:
            kw["under"] = timed_under
    c0 = time.thread_time(); i0 = clock.inside
    try:
        return orig(*a, **kw)
    finally:
        acc["all"] += time.thread_time() - c0 - (clock.inside - i0)
        acc["calls"] += 1
RN.prefill = prefill
SKIP = str(ROOT / "recipes/gpu/skip-attn-16-20-24-28.json")
for rnd in range(2):
    for m in ["ar"] + methods:
        dr = None
        if m != "ar":
            name, opts = split_variant(m)
            cfg = GenerateConfig(input="x", method=name, batch_size=b, max_tokens=64,
                                 skip_set=SKIP if name == "draft-verify" else None, **opts)
            dr = make_drafter(cfg, model, model_dir, store, lambda *_: None)
        acc.update(all=0.0, under=0.0, calls=0)
        clock.reset()
        got, st = sim_run(model, prompts, dr, clock, batch_size=b, max_tokens=lens,
                          controller=sim_controller(dr, clock.table) if dr else None)
        print(f"r{rnd} {m:22s} total {clock()*1e3:7.1f} ms; prefill {st.prefill_forwards} fwd "
              f"{st.prefill_s*1e3:6.1f} ms ({st.prefill_s*1e3/max(1,st.prefill_forwards):.2f}/fwd); "
              f"host cpu in prefill {acc['all']*1e3:6.1f} ms ({acc['calls']} calls), of it under "
              f"{acc['under']*1e3:5.1f}; steps {st.steps} {st.step_s*1e3:.1f} ms", flush=True)
