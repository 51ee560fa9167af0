"""`ar` at batch 1 on a CPU, quiet and beside a busy process: does decoding degrade gracefully?

    python bench-results/2026-11-23-cpu/cpu_contention.py [--prompts 4] [--max-tokens 48] [--model M]

Runs the same greedy `ar` decode (demo model by default, fp32) four ways in one script: on a
quiet machine and with one other CPU-bound process running (a busy loop started by this
script), each with the thread tuner (runtime/step/threads.py, the default) and with every core's
thread fixed (torch's default, what specctl did before the tuner). Prints tokens/s per case and
the busy/quiet ratio; the machine must be otherwise idle for the quiet numbers to mean anything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch


def decode(model, prompts, max_tokens: int, threads: int | None) -> float:
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    from specctl.speculative.drafter import NoDraft
    from specctl.speculative.sampling import SamplingParams
    reqs = [Request(i, [[]], max_tokens) for i in range(len(prompts))]
    runner = Runner(model, NoDraft(), SamplingParams(), batch_size=1, max_len=1024,
                    eos_ids=set(), render=lambda r: prompts[r.index], decode=lambda ids: "",
                    threads=threads)
    t = time.perf_counter()
    stats = runner.run(reqs, lambda r: None)
    return stats.generated / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--store", default=None)
    a = ap.parse_args()
    from specctl.models.checkpoint import resolve_model
    from specctl.engine.loader import load_model
    from specctl.store import Store
    model = load_model(resolve_model(a.model, Store(a.store)), "cpu", "fp32")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.cfg.vocab_size, (64,), generator=g).tolist()
               for _ in range(a.prompts)]
    cores = torch.get_num_threads()
    decode(model, prompts[:1], 8, None)   # warm-up
    rows = []
    for busy in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(0.5 if busy else 0)
            for name, threads in (("tuner", None), (f"fixed {cores}", cores)):
                rows.append((busy, name, decode(model, prompts, a.max_tokens, threads)))
        finally:
            if hog:
                hog.kill()
                hog.wait()
    print(f"ar, batch 1, {a.prompts} prompts x {a.max_tokens} tokens, {cores} cores")
    print("| threads | quiet tokens/s | one busy process | busy / quiet |")
    print("|---|---|---|---|")
    for name in ("tuner", f"fixed {cores}"):
        q = next(v for b, n, v in rows if n == name and not b)
        b = next(v for bb, n, v in rows if n == name and bb)
        print(f"| {name} | {q:.1f} | {b:.1f} | {b / q:.2f} |")


if __name__ == "__main__":
    main()
