"""How big a run is: its KV slots and rows, and the KV cache's memory budget."""

from __future__ import annotations

import time

import torch

from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import GenerateConfig, parse_size
from specctl.runtime.jobs.exactcheck import set_exact_kept
from specctl.runtime.control.controller import make_controller
from specctl.runtime.step.runner import Runner
from specctl.runtime.jobs.tokenization import Tokenization


def make_runner(cfg: GenerateConfig, model, drafter, tk: Tokenization, rows: list[int], *,
                store=None, fingerprint: str | None = None, log=lambda msg: None) -> Runner:
    """A Runner for requests needing `rows` KV rows each (see kv_rows), sized to the work:
    no more slots than requests (the KV cache is allocated for every slot), no more rows than
    the longest request needs (within the model's context). With --speculate auto its
    controller prices steps by the step-cost table, kept in `store` when one is given with the
    model's fingerprint."""
    # (before the controller: --exact steps have their own table)
    t0 = time.perf_counter()
    checked = set_exact(model, cfg, log, store=store, fingerprint=fingerprint)
    check_s = time.perf_counter() - t0 if checked else 0.0
    ctx = model.cfg.max_position
    max_len = min(ctx, max(rows, default=16) + 32)
    slots = min(cfg.batch_size, len(rows))
    budget = kv_budget(cfg, model, slots, drafter.step_rows, max_len)
    try:
        runner = Runner(model, drafter, cfg.sampling(), batch_size=slots, max_len=max_len,
                        eos_ids=tk.eos_ids, render=tk.render, decode=tk.decode,
                        stop=cfg.stop, prefill_chunk=cfg.prefill_chunk,
                        threads=cfg.threads, kv_budget=budget, logprobs=cfg.logprobs)
    except ValueError as e:   # a budget below one sequence (Model.new_kv_cache)
        if "KV cache budget" not in str(e):
            raise
        # (a sequence's rows: its prompt and answer, at most the context, and what the drafter
        # writes past them in a step: the rows the message names beyond the context)
        past = f" and what {drafter.name} writes past them in a step (drafts, probes)" \
            if drafter.kv_headroom else ""
        lower = ", or lower --max-tokens" if max_len < ctx else ""
        raise SpecctlError(f"{e}: a sequence here is up to {max_len} rows of prompt and "
                           f"answer{past}; raise --kv-memory (or --gpu-memory){lower}") from None
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not isinstance(e, torch.OutOfMemoryError) and "can't allocate" not in str(e):
            raise
        c = model.cfg
        gb = (2 * c.num_layers * slots * max_len * c.num_kv_heads * c.head_dim
              * model.embed.element_size() / 2**30)
        raise SpecctlError(
            f"not enough {model.device.type.upper()} memory for the KV cache of {slots} "
            f"sequences x {max_len} rows (about {gb:.1f} GiB): give it less with "
            "--kv-memory (a paged cache), or lower --batch-size or --max-tokens") from None
    runner.stats.exact_check_s = check_s   # (one-off: not in tokens/s)
    # (ar's too: on the H200's demo-shape tables grouping alone is 1.30x / 1.41x an ungrouped
    # ar at batch 32 / 64, every gain speculation showed there, bench-results/
    # 2026-11-29-ar-grouped; --speculate fixed keeps a schedule of the inputs alone)
    runner.grouped = cfg.speculate == "auto"
    if cfg.speculate == "auto" and drafter.price().max_draft > 0:   # (ar drafts nothing)
        # after the runner: a step-cost table measured now runs on its cache and graphs
        runner.set_controller(make_controller(drafter, model, slots, store=store,
                                              fingerprint=fingerprint, log=log, kv=runner.kv))
    return runner


def set_exact(model, cfg: GenerateConfig, log=lambda msg: None, *, store=None,
              fingerprint: str | None = None) -> bool:
    """The model's numerics as cfg says (--exact); a machine that cannot is a clean error.
    With a store and the model's fingerprint, the start-up check's verdict is kept there per
    machine (runtime/jobs/exactcheck.py). Whether --exact was set up now (its check made or
    its verdict taken)."""
    first = cfg.exact and model._exact_linear is None
    kept = first and store is not None and fingerprint is not None
    threads = torch.get_num_threads()
    try:
        if first and cfg.threads:   # (checked at the threads the run will use)
            torch.set_num_threads(cfg.threads)
        if kept:
            set_exact_kept(model, store, fingerprint, log)
        else:
            model.set_exact(cfg.exact)
    except ValueError as e:
        raise SpecctlError(str(e)) from None
    finally:
        torch.set_num_threads(threads)
    if first:
        log(f"--exact: batch-invariant {str(model.dtype).removeprefix('torch.')} numerics; "
            f"matmuls: {model.exact_check} (the check: one row's every operation gives the "
            "same bits alone as among 16 prompts, in a chain and in a tree; "
            f"{'kept in the store per machine, model and dtype; ' if kept else ''}"
            "its time is not counted in tokens/s)")
    return first


def kv_budget(cfg: GenerateConfig, model, slots: int, step_rows: int,
              max_len: int) -> int | None:
    """Bytes for the KV cache: --kv-memory; on CUDA else what --gpu-memory leaves after what
    the device already holds (weights, other processes) and the step's working memory; on
    the CPU else None (all it needs)."""
    if cfg.kv_memory is not None:
        return parse_size(cfg.kv_memory)
    if model.device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(model.device)
    # in use on the device, by anyone, less what torch holds cached but unallocated (reusable)
    used = total - free - (torch.cuda.memory_reserved(model.device)
                           - torch.cuda.memory_allocated(model.device))
    kept = getattr(model, "_kv", None)   # the model's last cache: reused, or let go for this one
    if kept is not None:
        used -= kept[1].bytes
    return max(0, int(cfg.gpu_memory * total) - used - work_bytes(
        model, slots, step_rows, cfg.prefill_chunk, max_len))


def work_bytes(model, slots: int, step_rows: int, prefill_chunk: int, max_len: int) -> int:
    """A generous estimate of a step's working memory beside weights and KV cache: the
    activations of the largest forward (a prefill chunk, or every slot's step with graph
    padding) in the model's dtype and fp32 logits of its rows, attention's gathered keys and
    values of one layer (every slot at max_len rows) and its mask, captured graphs' pools, plus
    a fixed 1 GiB for the CUDA context and libraries' workspaces."""
    c = model.cfg
    e = model.embed.element_size()
    rows = max(prefill_chunk, slots * max(step_rows, 16))
    width = 4 * c.hidden_size + 2 * c.intermediate_size + (c.num_heads + 2 * c.num_kv_heads) \
        * c.head_dim
    per_row = width * e + 4 * c.vocab_size
    gathered = 2 * slots * max_len * c.num_kv_heads * c.head_dim * e \
        + slots * max(step_rows, 16) * max_len * e
    return 3 * rows * per_row + 2 * gathered + 2**30
