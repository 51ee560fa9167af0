"""A Generator's generate_file calls after a generate() call: seconds each, and the model
loads they made (one short line a job, the demo model on the CPU, 4 tokens).

    python bench-results/2026-12-03-generator-load/calls.py LABEL   # from the tree to time
"""
import json
import sys
import tempfile
import time
from pathlib import Path

import specctl.engine.loader as loader
from specctl import Generator

loads = []
real = loader.load_model


def counted(*a, **k):
    loads.append(a[0])
    return real(*a, **k)


loader.load_model = counted
for name in ("specctl.runtime.jobs.job", "specctl.runtime.jobs.generator",
             "specctl.runtime.jobs.loaded"):   # (whichever of them import it by name)
    try:
        mod = __import__(name, fromlist=["x"])
    except ImportError:
        continue
    if hasattr(mod, "load_model"):
        mod.load_model = counted
d = Path(tempfile.mkdtemp())
(d / "one.jsonl").write_text(json.dumps({"prompt": "hello"}) + "\n")
g = Generator(model="smollm2-135m-instruct", method="ar", batch_size=8, max_tokens=4,
              device="cpu")
g.generate(["hi"])
ts = []
for i in range(4):
    t = time.perf_counter()
    g.generate_file(d / "one.jsonl", out=d / f"o{i}.jsonl")
    ts.append(time.perf_counter() - t)
print(f"{sys.argv[1]}: generate_file s {[round(x, 2) for x in ts]}, model loads {len(loads)}")
