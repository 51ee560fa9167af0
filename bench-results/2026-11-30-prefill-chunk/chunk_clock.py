"""`ar` and a method on the demo clock (../2026-11-29-host-clock-5/demo_clock.py: the demo model,
fp32 on this CPU, its forwards priced by the committed H200 step table, each prefill forward by
the H200's prefill table, the host's CPU time x sim.HOST) at prefill chunks of 512 and 4096
tokens: the clock's ms, prefill forwards and prefill ms of each. What the clock can say about
a larger chunk on CUDA: fewer eager prefill forwards, each priced by its prompts (the H200
measured 12 ms for one prompt of 1-512 tokens and 14.8 for 16 of 512).

    python bench-results/2026-11-30-prefill-chunk/chunk_clock.py BATCH [PROMPTS] [METHOD] [CUT]

PROMPTS (default 4 x BATCH) ShareGPT first turns cut to CUT tokens (default 96: whole turns on
2 cores would take longer than the run), answers of the demo model's real answers' lengths.
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import sim  # noqa: E402
from sim import (HOST, NoUndo, SimClock, h200_fused_table, prefill_table,  # noqa: E402
                 sim_controller, sim_run, timed_model, trace_lengths, traces)
from specctl.engine.loader import load_model  # noqa: E402
from specctl.io.sharegpt import first_human_turns  # noqa: E402
from specctl.models.checkpoint import resolve_model  # noqa: E402
from specctl.runtime.jobs.config import GenerateConfig, split_variant  # noqa: E402
from specctl.runtime.jobs.methods import make_drafter  # noqa: E402
from specctl.runtime.jobs.tokenization import Tokenization  # noqa: E402
from specctl.runtime.step.sequence import Request  # noqa: E402
from specctl.store import Store  # noqa: E402

b = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4 * b
METHOD = sys.argv[3] if len(sys.argv) > 3 else "self-draft"
cut = int(sys.argv[4]) if len(sys.argv) > 4 else 96
torch.set_num_threads(2)
store = Store(None)
model_dir = resolve_model(None, store)
model = load_model(model_dir, "cpu", "fp32")
tk = Tokenization(model_dir, chat=True)
prompts = [tk.render(Request(i, [[{"role": "user", "content": t}]], 64))[:cut]
           for i, t in enumerate(first_human_turns(n, store))]
print(f"{n} prompts, {sum(map(len, prompts))} tokens")
clock = SimClock(h200_fused_table(), b, host=HOST, prefill=prefill_table())
timed_model(model, clock, NoUndo())
lens = [min(x, 64) for x in trace_lengths(n, traces())]
name, opts = split_variant(METHOD)
SKIP = str(ROOT / "recipes/gpu/skip-attn-16-20-24-28.json")
cfg = GenerateConfig(input="x", method=name, batch_size=b, max_tokens=64,
                     skip_set=SKIP if name == "draft-verify" else None, **opts)
base = make_drafter(cfg, model, model_dir, store, lambda *_: None)
Runner = sim.Runner
ref = None
for chunk in (512, 4096):
    sim.Runner = lambda *a, _c=chunk, **kw: Runner(*a, prefill_chunk=_c, **kw)
    row = []
    for label, dr in (("ar", None), (METHOD, base.fresh())):
        clock.reset()
        got, st = sim_run(model, prompts, dr, clock, batch_size=b, max_tokens=lens,
                          controller=sim_controller(dr, clock.table) if dr else None)
        ref = ref or got
        assert got == ref, f"{label} at chunk {chunk} differs from ar at 512"
        row.append((label, clock() * 1e3, st.prefill_forwards, st.prefill_s * 1e3))
    ar_ms = row[0][1]
    print(f"chunk {chunk}: " + " | ".join(f"{lab} {ms:.1f} ms ({ar_ms / ms:.3f}x ar), prefill "
                                          f"{pf} forwards {ps:.1f} ms" for lab, ms, pf, ps in row))
