"""`ar` at real model size: a random-weight model (shapes.py), ShareGPT-length requests, every
batch size, the paged KV cache against the contiguous one.

    PYTHONPATH=$PWD python recipes/gpu/kv_scale.py --shape 7b --requests 1000 \
        --batches 1,8,32,64,128,256 --out results.json

Requests: prompt and answer lengths drawn (seeded) from lognormals with ShareGPT-like medians
(--prompt-median 220, --answer-median 260 tokens, each cut to --cut), random token ids (a
step's cost does not depend on the values); every answer runs to its length (no EOS).
The KV cache gets what --gpu-memory (0.9) leaves after the weights and the step's working
memory, the same sizing `specctl generate` uses (runtime/jobs/job.py kv_budget); at each batch size
the paged cache (admission by free blocks, preemption when short) runs all requests. Beside it
the contiguous cache (every slot preallocated at --max-len rows) runs at the largest batch that
the same budget holds. At batch 1 the result is set against the weight-bandwidth floor: bytes
of weights per step over the measured device-to-device copy bandwidth.

On a CPU (`--shape mini`) it runs the same code small, which the tests use.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_model, weight_bytes  # noqa: E402

from specctl.engine.kv import BLOCK, row_bytes  # noqa: E402
from specctl.runtime.jobs.config import GenerateConfig  # noqa: E402
from specctl.runtime.jobs.sizing import kv_budget  # noqa: E402
from specctl.runtime.step.runner import Runner  # noqa: E402
from specctl.runtime.step.sequence import Request  # noqa: E402
from specctl.speculative.drafter import NoDraft  # noqa: E402
from specctl.speculative.sampling import SamplingParams  # noqa: E402


def lengths(n: int, median: float, cut: int, rng: random.Random) -> list[int]:
    return [max(1, min(cut, round(math.exp(rng.gauss(math.log(median), 0.9))))) for _ in range(n)]


def copy_bandwidth(device) -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read + write counted once each)."""
    if device.type != "cuda":
        return 0.0
    a = torch.empty(2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    del a, b
    return 2 * 10 * 2**30 / (time.perf_counter() - t)


def run(model, prompts, answers, batch: int, max_len: int, budget: int | None) -> dict:
    reqs = [Request(i, [[{}]], answers[i]) for i in range(len(prompts))]
    if model.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    runner = Runner(model, NoDraft(), SamplingParams(), batch_size=batch, max_len=max_len,
                    eos_ids=set(), render=lambda r: prompts[r.index], decode=lambda ids: "",
                    kv_budget=budget)
    done = []
    t = time.perf_counter()
    stats = runner.run(reqs, done.append)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    out = {"batch": batch, "layout": "paged" if runner.kv.paged else "contiguous",
           "kv_gib": round(runner.kv.bytes / 2**30, 2), "requests_done": len(done),
           "generated": stats.generated, "wall_s": round(wall, 2),
           "tokens_per_s": round(stats.generated / wall, 1), "steps": stats.steps,
           "preemptions": stats.preemptions, "recomputed_tokens": stats.recomputed}
    if model.device.type == "cuda":
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del runner
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="7b")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--b1-requests", type=int, default=8, help="requests of the batch-1 run")
    ap.add_argument("--max-len", type=int, default=4096, help="the context limit (rows a "
                    "contiguous slot preallocates)")
    ap.add_argument("--prompt-median", type=float, default=220)
    ap.add_argument("--answer-median", type=float, default=260)
    ap.add_argument("--cut", type=int, default=1024)
    ap.add_argument("--gpu-memory", type=float, default=0.9)
    ap.add_argument("--kv-memory", default=None, help="a fixed budget instead (e.g. 64MB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    model = random_model(a.shape, dev, torch.bfloat16 if cuda else torch.float32)
    if cuda:
        from specctl.engine.graphs import CudaGraphs
        model.graphs = CudaGraphs(model)
    c = model.cfg
    rng = random.Random(a.seed)
    pl = lengths(a.requests, a.prompt_median, a.cut, rng)
    al = lengths(a.requests, a.answer_median, a.cut, rng)
    prompts = [[rng.randrange(3, c.vocab_size) for _ in range(n)] for n in pl]
    cfg = GenerateConfig(input="-", gpu_memory=a.gpu_memory, kv_memory=a.kv_memory)
    per_row = row_bytes(c.num_layers, c.num_kv_heads, c.head_dim, model.dtype)
    res = {"shape": a.shape, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "dtype": str(model.dtype).replace("torch.", ""), "weights_gib":
           round(weight_bytes(model) / 2**30, 2), "kv_row_kib": per_row / 1024,
           "requests": a.requests, "mean_prompt": sum(pl) / len(pl),
           "mean_answer": sum(al) / len(al), "max_len": a.max_len, "runs": []}
    bw = copy_bandwidth(dev)
    if bw:
        res["copy_gb_s"] = round(bw / 1e9, 1)
        res["floor_tokens_per_s_b1"] = round(bw / weight_bytes(model), 1)
    for b in [int(x) for x in a.batches.split(",")]:
        n = a.b1_requests if b == 1 else a.requests
        budget = kv_budget(cfg, model, b, 1, a.max_len)
        r = run(model, prompts[:n], al[:n], b, a.max_len, budget)
        r["budget_gib"] = round(budget / 2**30, 2) if budget else None
        if b == 1 and "floor_tokens_per_s_b1" in res:
            r["of_floor"] = round(r["tokens_per_s"] / res["floor_tokens_per_s_b1"], 3)
        print(json.dumps(r), flush=True)
        res["runs"].append(r)
    # the contiguous cache: every slot at max_len rows, as many slots as the budget holds
    budget = kv_budget(cfg, model, 1, 1, a.max_len)
    if budget is not None:
        slot_bytes = -(-a.max_len // BLOCK) * BLOCK * per_row
        b = max(1, budget // slot_bytes)
        r = run(model, prompts, al, int(b), a.max_len, None)
        r["note"] = "contiguous: the largest batch the budget holds at max_len rows a slot"
        print(json.dumps(r), flush=True)
        res["contiguous"] = r
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
