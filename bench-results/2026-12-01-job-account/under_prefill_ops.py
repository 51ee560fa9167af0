"""Which torch ops each method dispatches inside the prefill's `under` (run before the prefill's
first read: on CUDA, device work there queues behind the prefill forward and delays that read),
on the tiny model (/tmp/tiny, recipes/tiny_model.py), CUDA's schedule, the graphs' stand-in,
128 prompts x 48 tokens, every method under auto.
    python bench-results/2026-12-01-job-account/under_prefill_ops.py BATCH METHODS"""
import sys, collections
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from specctl.store import Store
from specctl.models.checkpoint import resolve_model
from specctl.engine.loader import load_model
from specctl.engine.graphs import CudaGraphs
from specctl.runtime.jobs.config import GenerateConfig, split_variant
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.jobs.sizing import make_runner
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows
from specctl.runtime.step.sequence import Request
from specctl.runtime.step.step import Planner
from specctl.io.prompts import read_prompts
Planner.overlaps = property(lambda self: True)

class Rec(TorchDispatchMode):
    def __init__(self, c): super().__init__(); self.c = c
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.c[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

store = Store("/tmp/tiny-store"); md = resolve_model("/tmp/tiny", store)
model = load_model(md, "cpu"); model.graphs = CudaGraphs(model, capture=False)
tk = Tokenization(md, chat=True)
texts = [r.turns[0][-1]["content"] for r in read_prompts("recipes/prompts/specbench128.jsonl")][:128]
B = int(sys.argv[1])
for m in sys.argv[2].split(","):
    name, opts = split_variant(m)
    cfg = GenerateConfig(input="x", method=name, batch_size=B, max_tokens=48, skip_set="/tmp/tiny/skip.json", **opts)
    try:
        drafter = make_drafter(cfg, model, md, store, lambda *_: None)
    except Exception as e:
        print(m, "skipped", e); continue
    reqs = lambda: [Request(i, [[{"role": "user", "content": t}]], 48) for i, t in enumerate(texts)]
    runner = make_runner(cfg, model, drafter, tk, [kv_rows(tk, r)[1] for r in reqs()], store=store)
    under = collections.Counter(); calls = [0]
    inner = runner.under_prefill
    def up(*a, **k):
        calls[0] += 1
        with Rec(under):
            return inner(*a, **k)
    runner.under_prefill = up
    st = runner.run(reqs(), lambda r: None)
    print(f"{m}: prefill forwards {st.prefill_forwards}, under calls {calls[0]}, ops in under: {dict(under.most_common(12))}")
