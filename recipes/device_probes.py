"""recipes/host_profile.py's looks at a step's device side: what a GPU's host launches a step
(--launches), which kernels a step runs (--torch-profile), and a step's device work on a core
of its own (--device-core), as a GPU's host waits for its device."""

from __future__ import annotations

import torch


def launch_counts(row, requests) -> str:
    """One untimed run of row's runner, its steps' launches counted (engine/launches.py, as
    CUDA launches them): a graph replay is one (on a CPU the stand-in's forward inside it is
    not counted), every other kernel one each. A GPU's host pays each eager launch, ~5-10 us,
    where a replay's kernels cost it one. A grid step verifies as on CUDA, with its kernel
    (runtime/step/grid_kernel.py: under Triton's interpreter on a CPU, where Triton is)."""
    import contextlib
    import os
    import sys
    from unittest import mock
    from specctl.engine.graphs import _EagerReplay
    from specctl.engine.launches import counting
    from specctl.runtime.step.grid import GridStep
    g, runner = row.runner.model.graphs, row.runner
    n = {"steps": 0, "eager": 0, "replays": 0, "hidden": 0, "grid": 0}
    step, replay, device_step = runner.step, _EagerReplay.replay, GridStep.device_step
    as_cuda = contextlib.nullcontext()
    if not row.cuda and "triton" not in sys.modules:   # (the interpreter is chosen at import)
        os.environ["TRITON_INTERPRET"] = "1"
    kernel = row.cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if not row.cuda and kernel:
        as_cuda = mock.patch.object(GridStep, "kernel", True)
    with counting(as_cuda=True) as ops, as_cuda:
        def quiet_replay(self):   # (its forward's launches, Triton's too, are the replay's)
            ops.quiet += 1
            t = ops.live()
            try:
                return replay(self)
            finally:
                ops.quiet -= 1
                n["hidden"] += ops.live() - t

        def counted(seqs, drain=False):
            c, r = ops.live() - n["hidden"], g.replays if g else 0   # (live: with Triton's
            try:                                                      # launches)
                return step(seqs, drain)
            finally:
                n["steps"] += 1
                n["eager"] += ops.live() - n["hidden"] - c
                n["replays"] += (g.replays if g else 0) - r

        def grid_step(self, *a, **kw):
            n["grid"] += 1
            return device_step(self, *a, **kw)
        runner.step, _EagerReplay.replay, GridStep.device_step = counted, quiet_replay, grid_step
        try:
            runner.run(requests, lambda r: None)
        finally:
            runner.step, _EagerReplay.replay, GridStep.device_step = step, replay, device_step
        # (the run's grid step, still under the patch: where its warm fell back, or the cache
        # does not fit the kernel, the tensor operations verified)
        run_grid = runner.planner.grid
        used = run_grid is not None and kernel and _fits(runner.kv) and \
            run_grid._kernel(runner.kv.k_all.device) is not None
    k = max(n["steps"], 1)
    grid = "-" if not n["grid"] else "its kernel" if used else "tensor operations"
    return (f"| {row.method} | {row.b} | {n['steps']} | {n['replays'] / k:.2f} | "
            f"{n['eager'] / k:.1f} | {grid} |")


def _fits(kv) -> bool:
    """Whether grid_kernel moves kv's rows (its fits), where Triton imports."""
    try:
        from specctl.runtime.step import grid_kernel
    except ImportError:
        return False
    return grid_kernel.fits(kv)


def torch_profile(row, requests, path: str) -> None:
    """One untimed run of row's runner under torch.profiler, its ops by self time (the
    device's on CUDA: which kernels a drafting step launches, and what the host does between
    them) to path. Not in the timed rows: the profiler's own overhead is large."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if row.cuda else [])
    with profile(activities=acts) as prof:
        row.runner.run(requests, lambda r: None)
    keys = ["self_cuda_time_total"] * row.cuda + ["self_cpu_time_total"]
    with open(path, "w") as f:
        for key in keys:   # (on CUDA the host's ops too: a lean step's host beside `ar`'s,
            # which the kernels' table alone did not show, 2026-12-04)
            table = prof.key_averages().table(sort_by=key, row_limit=40)
            f.write(f"{row.method} at batch {row.b}: one run of {len(requests)} prompts, "
                    f"ops by {key}\n\n{table}\n\n")
    print(f"torch profile: {path}", flush=True)


def device_elsewhere(model, core: int, graphs: bool, threads: int | None) -> None:
    """--device-core: the device's work of every step (graph replays, the argmax, a grid
    step's device_step, Kangaroo's adapter) on a worker thread pinned to core, under
    inference mode and with `threads` threads, this thread pinned to the other cores and
    blocked (the GIL released) while the worker runs. Prefills and eager forwards stay on this
    thread; the hand-off between threads is in the model's column."""
    import os
    import queue
    import threading
    cores = os.sched_getaffinity(0)
    if not graphs or model.device.type != "cpu" or core not in cores or len(cores) < 2 \
            or threads is None:
        raise SystemExit(f"--device-core: needs --graphs and --threads on a CPU, and core {core}"
                         f" among this process's {sorted(cores)}, with another beside it")
    jobs, done = queue.Queue(), queue.Queue()

    def worker():
        os.sched_setaffinity(0, {core})
        torch.set_num_threads(threads)   # (a thread's own setting: the runner's is this one's)
        while True:
            fn, args, kw = jobs.get()
            try:
                with torch.inference_mode():
                    done.put((True, fn(*args, **kw)))
            except BaseException as e:   # (raised again in the caller)
                done.put((False, e))
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    os.sched_setaffinity(0, cores - {core})

    def there(fn):
        def wrapper(*args, **kw):
            if threading.current_thread() is thread:   # (device work within device work)
                return fn(*args, **kw)
            jobs.put((fn, args, kw))
            ok, out = done.get()
            if not ok:
                raise out
            return out
        return wrapper
    from specctl.engine.graphs import _EagerReplay
    from specctl.runtime.step.grid import GridStep
    from specctl.speculative.kangaroo import Adapter
    _EagerReplay.replay = there(_EagerReplay.replay)
    GridStep.device_step = there(GridStep.device_step)
    Adapter.decode, Adapter.write_rows = there(Adapter.decode), there(Adapter.write_rows)
    model.argmax = there(model.argmax)
