"""What a decoding step costs on the host, per method and batch size (issue: the GPU fast path).

    python recipes/host_profile.py [--methods ar,draft-verify:auto,kangaroo,self-draft:light]
                                   [--batch-sizes 1,8,32] [--prompts 16] [--max-tokens 64]
                                   [--device cpu|cuda] [--store DIR] [--threads N]
                                   [--model DIR] [--input FILE] [--skip-set FILE]
                                   [--repeats N] [--schedule auto|cuda|cpu] [--graphs]
                                   [--device-core K]
                                   [--cprofile FILE] [--torch-profile FILE] [--launches]

With a tiny model (recipes/tiny_model.py: 2 layers, hidden 64) a forward costs almost nothing,
so the host column is the runtime's own work per step, what issue "A host-lean step" bounds:
    python recipes/tiny_model.py /tmp/tiny --input FILE --store /tmp/tiny-store
    python recipes/host_profile.py --model /tmp/tiny --input FILE --store /tmp/tiny-store \
        --skip-set /tmp/tiny/skip.json --batch-sizes 1,64 --threads 1 --max-tokens 48 --prompts 128

Runs each method through the one Runner (built as `generate` builds it) on the input's
prompts (default: real ShareGPT first turns) and splits every step's wall time into model work
(the verify forward and any draft forwards, a graph's replay or an eager forward,
Kangaroo's adapter layer, synchronized on CUDA, and the argmax over their logits) and
everything else: the host's share (the controller, drafting logic, n-gram lookups, tree and
mask assembly, input tensors, a graph replay's key, look-up and staging of them, verification,
KV commit, bookkeeping; before 2026-11-30 a replay's key and look-up were in the model's). On a GPU the host share is serial with the launches, so it is what a
method must keep small. What CUDA's schedule runs while a step's forward computes (the last
step's learning, the next step's search: Runner.under_forward) is timed apart, as "under fwd":
hidden on a GPU while it is shorter than the forward; `--schedule cuda` runs that schedule on a
CPU too (a CPU's own learns at the step: all of it host then), and `--graphs` a GPU's graph
path (padding every sequence to the grid, staging each step's inputs: host work a CPU's eager
steps skip); `--device-core K` with it runs a step's device work on core K while the host's
thread waits on another, as a GPU's host waits for its device: the forward then leaves the
host's own caches as they were, which on a CPU it does not (a plan cost ~5x in a run what it
cost warm, bench-results/2026-11-30-grid-host). The methods' runs alternate, and
each row shows its run of least host time. (Host ms/step holds the learning caught up between
steps, which ms/step, the steps' own wall, does not; a prefill's time, and the search run under
it, are in neither; loop ms/step is the step loop's own host a step outside them: its
scheduling, admissions and retirements.) Prints one markdown table; host us/seq-step is the
host's share per step divided by the sequences in it, rows/seq-step the verify forward's packed
rows (tokens) per sequence a step: what the model computes for it (a GPU's step time at that
many rows per sequence, recipes/step_table.py, is the scale to hold the host's against).
"""

from __future__ import annotations

import argparse
import cProfile
import sys
import time
from pathlib import Path

import torch

from specctl.engine.launches import on_cuda
from specctl.models.fingerprint import model_fingerprint
from specctl.runtime.jobs.config import GenerateConfig, split_variant
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.sizing import make_runner
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows
from specctl.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))   # (run by path or by runpy)
from device_probes import device_elsewhere, launch_counts, torch_profile  # noqa: E402


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
    ap.add_argument("--schedule", choices=("auto", "cuda", "cpu"), default="auto",
                    help="cuda: the host's work as CUDA schedules it (the last step's learning "
                         "and the next step's search run while the forward computes: timed "
                         "apart, 'under fwd'), on any device; cpu: all of it in the step, as "
                         "a CPU runs it; auto: the device's")
    ap.add_argument("--graphs", action="store_true",
                    help="where the model has no graphs (a CPU), steps through the graph "
                         "path's eager stand-in (its padding and the staging of each step's "
                         "inputs, which a GPU's steps run); by default a CPU's steps run "
                         "eagerly")
    ap.add_argument("--device-core", type=int, default=None,
                    help="with --graphs and --threads on a CPU: a step's device work (graph "
                         "replays, the argmax, a grid step's device_step, Kangaroo's adapter) "
                         "on a thread pinned to core K, the host's thread pinned to another "
                         "and waiting meanwhile, as a GPU's host waits for its device "
                         "(prefills and eager forwards stay on the host's thread)")
    ap.add_argument("--cprofile", default=None,
                    help="write a cProfile of the timed runs to FILE.<method>.b<batch>")
    ap.add_argument("--torch-profile", default=None,
                    help="after the timed runs, one more run of each row under torch.profiler "
                         "(CPU, and CUDA's kernels on a GPU): its ops by self time to "
                         "FILE.<method>.b<batch>.txt")
    ap.add_argument("--launches", action="store_true",
                    help="after the timed runs, one more run of each row counting what a GPU's "
                         "host launches a step: graph replays, and eager kernels as CUDA "
                         "launches them (engine/launches.py)")
    a = ap.parse_args()
    if a.launches and a.device_core is not None:   # (a dispatch mode is its thread's own: the
        # device thread's launches would go uncounted)
        raise SystemExit("--launches counts the launches of this thread: run it without "
                         "--device-core")
    store = Store(a.store)
    from specctl.io.sharegpt import first_human_turns
    from specctl.models.checkpoint import resolve_model
    from specctl.engine.loader import load_model
    model_dir = resolve_model(a.model, store)
    model = load_model(model_dir, a.device)
    launches = on_cuda(model)   # (before the timing wrappers below go on)
    if a.graphs and model.graphs is None:
        from specctl.engine.graphs import CudaGraphs
        model.graphs = CudaGraphs(model, capture=False)
    tk = Tokenization(model_dir, chat=True)
    if a.input:
        from specctl.io.prompts import read_prompts
        texts = [r.turns[0][-1]["content"] for r in read_prompts(a.input)][:a.prompts]
    else:
        texts = first_human_turns(a.prompts, store)
    cuda = model.device.type == "cuda"
    fp = model_fingerprint(model_dir)
    if a.schedule != "auto":
        # (CUDA's schedule: what a step learns waits for the next step's forward, and the
        # next search runs beside it, Runner.under_forward; a CPU's: all at the step. The
        # runner asks the planner which; here the forwards are synchronized either way, so
        # the work under the forward is timed apart and shown as such)
        from specctl.runtime.step.step import Planner
        Planner.overlaps = property(lambda self, o=a.schedule == "cuda": o)

    if a.device_core is not None:
        device_elsewhere(model, a.device_core, a.graphs, a.threads)
    fwd = {"t": 0.0, "depth": 0}

    def timed(fn):
        def wrapper(*args, **kw):   # only the outermost call counts (forwards nest)
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
    # the device's work: an eager forward, a graph's replay (on a CPU the forward run in its
    # place); the rest of Model.run (a replay's key, look-up, the staging of its inputs into
    # the graph's buffers, its outputs' rows) is the host's, serial with the launches on a GPU
    model.forward = timed(model.forward)
    from specctl.engine.graphs import _EagerReplay
    if cuda:
        torch.cuda.CUDAGraph.replay = timed(torch.cuda.CUDAGraph.replay)
    else:
        _EagerReplay.replay = timed(_EagerReplay.replay)
    model.logits = timed(model.logits)
    model.argmax = timed(model.argmax)
    # the argmax over a step's [T, V] logits is device work too (on a CPU it is a large
    # share of what would otherwise show as host time: T x 49k scores for self-draft)
    torch.Tensor.argmax = timed(torch.Tensor.argmax)
    # Kangaroo's adapter layer is a forward too (its drafts and the rows it writes)
    from specctl.speculative.kangaroo import Adapter
    Adapter.decode = timed(Adapter.decode)
    Adapter.write_rows = timed(Adapter.write_rows)
    # and so is a grid step's verification and KV moves: a fixed set of tensor operations
    # queued behind the forward, nothing read back (GridStep.device_step; tests/test_grid.py)
    from specctl.runtime.step.grid import GridStep
    GridStep.device_step = timed(GridStep.device_step)

    if launches:
        print(f"{model.attention} attention: {launches['step']} kernel launches an ar step at "
              f"batch 1, {launches['layer']} a layer (engine/launches.py)\n")
    print("| method | batch | steps | ms/step | model ms/step | host ms/step "
          "| host us/seq-step | under fwd ms/step | host share "
          "| graph replays per step (shapes captured) | rows/seq-step | loop ms/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    def reqs():
        out = [Request(i, [[{"role": "user", "content": t}]], a.max_tokens)
               for i, t in enumerate(texts)]
        for r in out:   # (rendered before the run, as a job's sizing renders every first
            tk.render(r)   # prompt, kv_rows: the runner's admission then reads them)
        return out
    for b in [int(x) for x in a.batch_sizes.split(",")]:
        rows = []
        for m in a.methods.split(","):
            name, opts = split_variant(m)
            cfg = GenerateConfig(input="x", method=name, batch_size=b, max_tokens=a.max_tokens,
                                 threads=a.threads, skip_set=a.skip_set, **opts)
            try:
                drafter = make_drafter(cfg, model, model_dir, store, lambda *_: None)
            except Exception as e:   # a missing artifact: say so and go on
                print(f"| {m} | {b} | skipped: {e} |||||||||")
                continue
            # built as `generate` builds it: sized to the work, with the controller (and its
            # stored step table) for ':auto'
            runner = make_runner(cfg, model, drafter, tk, [kv_rows(tk, r)[1] for r in reqs()],
                                 store=store, fingerprint=fp)
            rows.append(Row(m, b, runner, fwd, cuda, a.cprofile))
            # warm-up (every graph shape was captured when the runner started: none is new in
            # the timed runs, the graphs column says so)
            runner.run(reqs()[:b], lambda r: None)
        # (the methods' runs alternate, each row keeping its run of least host time: another
        # process, or the machine's state drifting, only adds to a run's)
        for _ in range(a.repeats):
            for r in rows:
                r.run(reqs())
        for r in rows:
            print(r.line(), flush=True)
        if a.launches:
            print("\n| method | batch | steps | graph replays/step | eager launches/step | "
                  "grid steps verify with |\n|---|---|---|---|---|---|")
            for r in rows:
                print(launch_counts(r, reqs()), flush=True)
        if a.torch_profile:
            for r in rows:
                torch_profile(r, reqs(), f"{a.torch_profile}.{r.method.replace(':', '_')}.b{b}.txt")


class Row:
    """One method at one batch size: its runner, timed step by step (the host's time apart
    from the model's and from what runs under the forward), and its best run."""

    def __init__(self, method: str, b: int, runner, fwd: dict, cuda: bool, cprofile):
        self.method, self.b, self.runner, self.fwd, self.cuda = method, b, runner, fwd, cuda
        self.prof = cProfile.Profile() if cprofile else None
        self.cprofile = cprofile
        self.t, self.best = _zero(), None   # (the run now; the warm-up's is dropped)
        self.replays = self.shapes = self.runs = 0
        self.rows0 = None
        self._wrap(runner)

    def _wrap(self, runner) -> None:
        inner, beside, catch = runner.step, runner.under_forward, runner.catch_up
        busy = [False]

        def step(seqs, drain=False):
            f0, t = self.fwd["t"], time.perf_counter()
            busy[0] = True
            try:
                work = inner(seqs, drain)   # (the thread tuner's unit of work)
            finally:
                busy[0] = False
            if self.cuda:
                torch.cuda.synchronize()
            st = self.t
            st["t"] += time.perf_counter() - t
            st["fwd"] += self.fwd["t"] - f0
            st["n"] += 1
            st["seqs"] += len(seqs)
            return work

        def under_forward(*a):   # (on CUDA: hidden while shorter than the forward)
            t = time.perf_counter()
            try:
                return beside(*a)
            finally:
                self.t["under"] += time.perf_counter() - t

        def catch_up(*a, **kw):   # (at a retirement or the run's end: no forward to hide
            t = time.perf_counter()   # it under)
            try:
                return catch(*a, **kw)
            finally:
                if not busy[0]:
                    self.t["off"] += time.perf_counter() - t
        runner.step, runner.under_forward, runner.catch_up = step, under_forward, catch_up

    def run(self, requests) -> None:
        g, runner = self.runner.model.graphs, self.runner
        if self.rows0 is None:
            self.rows0 = runner.stats.step_tokens
        replays, shapes = (g.replays, g.captures) if g else (0, 0)
        self.t = _zero()
        if self.prof:
            self.prof.enable()
        t, p = time.perf_counter(), runner.stats.prefill_s
        runner.run(requests, lambda r: None)
        self.t["run"] = time.perf_counter() - t
        self.t["prefill"] = runner.stats.prefill_s - p
        if self.prof:
            self.prof.disable()
        if g:
            self.replays += g.replays - replays
            self.shapes += g.captures - shapes
        self.runs += 1
        if self.best is None or _host(self.t) < _host(self.best):
            self.best = self.t

    def line(self) -> str:
        if self.prof:
            self.prof.dump_stats(f"{self.cprofile}.{self.method.replace(':', '_')}.b{self.b}")
        st, g = self.best, self.runner.model.graphs
        n = max(st["n"], 1)
        tot, f = st["t"] / n * 1e3, st["fwd"] / n * 1e3
        host, under = _host(st) / n * 1e3, st["under"] / n * 1e3
        graphs = f"{self.replays / self.runs / n:.0%} ({self.shapes} new)" if g else "-"
        per_seq = host * 1e3 * st["n"] / max(st["seqs"], 1)
        rows = (self.runner.stats.step_tokens - self.rows0) / self.runs / max(st["seqs"], 1)
        # (the step loop's own host a step, outside Runner.step: scheduling, admissions
        # and retirements; the prefills' time and the learning caught up between steps,
        # already in host ms/step, left out)
        loop = (st["run"] - st["t"] - st["prefill"] - st["off"]) / n * 1e3
        return (f"| {self.method} | {self.b} | {st['n']} | {tot:.2f} | {f:.2f} | {host:.3f} | "
                f"{per_seq:.1f} | {under:.3f} | {host / (f + host):.0%} | {graphs} | "
                f"{rows:.1f} | {loop:.3f} |")


def _zero() -> dict:
    return {"t": 0.0, "n": 0, "fwd": 0.0, "seqs": 0, "under": 0.0, "off": 0.0, "run": 0.0,
            "prefill": 0.0}


def _host(t: dict) -> float:
    """The host's seconds serial with the forwards: a step's apart from its model work and
    what ran under the forward, and the learning caught up between steps."""
    return t["t"] - t["fwd"] - t["under"] + t["off"]


if __name__ == "__main__":
    main()
