"""Launches of a Kangaroo lean forward (whole model, its head) against ar's forward, counted as
CUDA would launch them (engine/launches.counting(as_cuda=True)): PYTHONPATH=TREE python launch.py"""
import sys, torch
from specctl.engine.loader import load_model
from specctl.engine.batch import ForwardBatch, SeqInput, LayerPlan
from specctl.engine.launches import counting
from specctl.speculative.kangaroo import Adapter, KangarooDrafter, KangarooParams
from specctl.speculative.sampling import SamplingParams
import specctl
m = load_model(sys.argv[1], "cpu", "fp32")
kv = m.new_kv_cache(8, 128)
for B in (1, 8):
    b = ForwardBatch([SeqInput(s, [3], 10) for s in range(B)])
    with torch.inference_mode(), counting(as_cuda=True) as c:
        m.run(b, kv)
    ar = c.count
    dr = KangarooDrafter(m, Adapter.init_from_model(m, 1), SamplingParams(), KangarooParams())
    plan, head = dr.lean_forward(kv)
    b = ForwardBatch([SeqInput(s, [3], 10) for s in range(B)])
    with torch.inference_mode(), counting(as_cuda=True) as c:
        m.run(b, kv, plan, head=head)
    print(f"{specctl.__file__}: b{B} ar forward {ar} launches, kangaroo lean forward {c.count}"
          f" (+{c.count - ar}: {c.names[-(c.count - ar) - 2:]})")
