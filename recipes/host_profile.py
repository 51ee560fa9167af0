"""What a decoding step costs on the host, per method and batch size (issue: the GPU fast path).

    python recipes/host_profile.py [--methods ar,draft-verify:auto,kangaroo,self-draft:light]
                                   [--batch-sizes 1,8,32] [--prompts 16] [--max-tokens 64]
                                   [--device cpu|cuda] [--store DIR] [--threads N]
                                   [--model DIR] [--input FILE] [--skip-set FILE]
                                   [--repeats N] [--cprofile FILE]

With a tiny model (recipes/tiny_model.py: 2 layers, hidden 64) a forward costs almost nothing,
so the host column is the runtime's own work per step, what issue "A host-lean step" bounds:
    python recipes/tiny_model.py /tmp/tiny --input FILE --store /tmp/tiny-store
    python recipes/host_profile.py --model /tmp/tiny --input FILE --store /tmp/tiny-store \
        --skip-set /tmp/tiny/skip.json --batch-sizes 1,64 --threads 1 --max-tokens 48 --prompts 128

Runs each method through the one Runner (built as `generate` builds it) on the input's
prompts (default: real ShareGPT first turns) and splits every step's wall time into model work
(the verify forward and any draft forwards, Kangaroo's adapter layer, synchronized on CUDA,
and the argmax over their logits) and everything else: the host's share (the controller,
drafting logic, n-gram lookups, tree and mask assembly, input tensors, verification, KV
commit, bookkeeping). On a GPU the host share is serial with the launches, so it is what a
method must keep small. Prints one markdown table; host us/seq-step is the host's share per
step divided by the sequences in it, rows/seq-step the verify forward's packed rows (tokens)
per sequence a step: what the model computes for it (a GPU's step time at that many rows per
sequence, recipes/step_table.py, is the scale to hold the host's against).
"""

from __future__ import annotations

import argparse
import cProfile
import time

import torch

from specctl.engine.launches import on_cuda
from specctl.models.fingerprint import model_fingerprint
from specctl.runtime.jobs.config import GenerateConfig, split_variant
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.sizing import make_runner
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows
from specctl.store import Store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="ar,draft-verify,kangaroo,self-draft")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--store", default=None)
    ap.add_argument("--input", default=None, help="JSONL prompts (default: ShareGPT first turns)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: tuned)")
    ap.add_argument("--skip-set", default=None)
    ap.add_argument("--model", default=None, help="model DIR (default: the demo model)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed runs of each row; the row shows the one of least host time")
    ap.add_argument("--cprofile", default=None,
                    help="write a cProfile of the timed runs to FILE.<method>.b<batch>")
    a = ap.parse_args()
    store = Store(a.store)
    from specctl.io.sharegpt import first_human_turns
    from specctl.models.checkpoint import resolve_model
    from specctl.engine.loader import load_model
    model_dir = resolve_model(a.model, store)
    model = load_model(model_dir, a.device)
    launches = on_cuda(model)   # (before the timing wrappers below go on)
    tk = Tokenization(model_dir, chat=True)
    if a.input:
        from specctl.io.prompts import read_prompts
        texts = [r.turns[0][-1]["content"] for r in read_prompts(a.input)][:a.prompts]
    else:
        texts = first_human_turns(a.prompts, store)
    cuda = model.device.type == "cuda"
    fp = model_fingerprint(model_dir)

    fwd = {"t": 0.0, "depth": 0}

    def timed(fn):
        def wrapper(*args, **kw):   # only the outermost call counts (run nests)
            fwd["depth"] += 1
            if fwd["depth"] == 1:
                if cuda:
                    torch.cuda.synchronize()
                t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                if fwd["depth"] == 1:
                    if cuda:
                        torch.cuda.synchronize()
                    fwd["t"] += time.perf_counter() - t
                fwd["depth"] -= 1
        return wrapper
    model.forward = timed(model.forward)
    model.run = timed(model.run)
    model.logits = timed(model.logits)
    model.argmax = timed(model.argmax)
    # the argmax over a step's [T, V] logits is device work too (on a CPU it is a large
    # share of what would otherwise show as host time: T x 49k scores for self-draft)
    torch.Tensor.argmax = timed(torch.Tensor.argmax)
    # Kangaroo's adapter layer is a forward too (its drafts and the rows it writes)
    from specctl.speculative.kangaroo import Adapter
    Adapter.decode = timed(Adapter.decode)
    Adapter.write_rows = timed(Adapter.write_rows)

    if launches:
        print(f"{model.attention} attention: {launches['step']} kernel launches an ar step at "
              f"batch 1, {launches['layer']} a layer (engine/launches.py)\n")
    print("| method | batch | steps | ms/step | model ms/step | host ms/step "
          "| host us/seq-step | host share | graph replays per step (shapes captured) "
          "| rows/seq-step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in a.methods.split(","):
        for b in [int(x) for x in a.batch_sizes.split(",")]:
            name, opts = split_variant(m)
            cfg = GenerateConfig(input="x", method=name, batch_size=b, max_tokens=a.max_tokens,
                                 threads=a.threads, skip_set=a.skip_set, **opts)
            try:
                drafter = make_drafter(cfg, model, model_dir, store, lambda *_: None)
            except Exception as e:   # a missing artifact: say so and go on
                print(f"| {m} | {b} | skipped: {e} ||||||||")
                continue
            def reqs():
                return [Request(i, [[{"role": "user", "content": t}]], a.max_tokens)
                        for i, t in enumerate(texts)]
            # built as `generate` builds it: sized to the work, with the controller (and its
            # stored step table) for ':auto'
            runner = make_runner(cfg, model, drafter, tk, [kv_rows(tk, r)[1] for r in reqs()],
                                 store=store, fingerprint=fp)
            step_t = {"t": 0.0, "n": 0, "fwd": 0.0, "seqs": 0}
            inner = runner.step

            def step(seqs, drain=False):
                f0 = fwd["t"]
                t = time.perf_counter()
                work = inner(seqs, drain)   # (the thread tuner's unit of work)
                if cuda:
                    torch.cuda.synchronize()
                step_t["t"] += time.perf_counter() - t
                step_t["fwd"] += fwd["t"] - f0
                step_t["n"] += 1
                step_t["seqs"] += len(seqs)
                return work
            runner.step = step
            # warm-up (every graph shape was captured when the runner started: none is new in
            # the timed run, the last column says so)
            runner.run(reqs()[:b], lambda r: None)
            g = model.graphs
            replays0, shapes0 = (g.replays, len(g.cache)) if g else (0, 0)
            rows0 = runner.stats.step_tokens
            prof = cProfile.Profile() if a.cprofile else None
            best = None   # (the run of least host time: another process only adds to it)
            for _ in range(a.repeats):
                step_t.update(t=0.0, n=0, fwd=0.0, seqs=0)
                if prof:
                    prof.enable()
                runner.run(reqs(), lambda r: None)
                if prof:
                    prof.disable()
                if best is None or step_t["t"] - step_t["fwd"] < best["t"] - best["fwd"]:
                    best = dict(step_t)
            step_t = best
            if prof:
                prof.dump_stats(f"{a.cprofile}.{m.replace(':', '_')}.b{b}")
            n = max(step_t["n"], 1)
            tot, f = step_t["t"] / n * 1e3, step_t["fwd"] / n * 1e3
            graphs = (f"{(g.replays - replays0) / a.repeats / n:.0%} "
                      f"({len(g.cache) - shapes0} new)"
                      if g else "-")
            per_seq = (tot - f) * 1e3 * step_t["n"] / max(step_t["seqs"], 1)
            rows = (runner.stats.step_tokens - rows0) / a.repeats / max(step_t["seqs"], 1)
            print(f"| {m} | {b} | {step_t['n']} | {tot:.2f} | {f:.2f} | {tot - f:.2f} | "
                  f"{per_seq:.1f} | {(tot - f) / tot:.0%} | {graphs} | {rows:.1f} |", flush=True)


if __name__ == "__main__":
    main()
