"""How big a run is: its KV slots and rows, and the KV cache's memory budget."""

from __future__ import annotations

import time

import torch

from specctl.engine.exact import PREFILL_ROWS
from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import GenerateConfig, parse_size
from specctl.runtime.jobs.exactcheck import set_exact_kept
from specctl.runtime.control.controller import make_controller
from specctl.runtime.step.prefill import PAD_BYTES
from specctl.runtime.step.runner import Runner
from specctl.runtime.jobs.tokenization import Tokenization


CUDA_CHUNKS = (4096, 2048, 1024)   # prefill_chunk's choices on CUDA, first the largest
CHUNK_SHARE = 0.02   # the most of a device's memory a prefill forward's activations may take


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
    chunk = prefill_chunk(cfg, model)
    budget = kv_budget(cfg, model, slots, drafter.step_rows, max_len, chunk)
    try:
        runner = Runner(model, drafter, cfg.sampling(), batch_size=slots, max_len=max_len,
                        eos_ids=tk.eos_ids, render=tk.render, decode=tk.decode,
                        stop=cfg.stop, prefill_chunk=chunk,
                        threads=cfg.threads, kv_budget=budget, logprobs=cfg.logprobs)
    except ValueError as e:   # a budget below one sequence (Model.new_kv_cache)
        if "KV cache budget" not in str(e):
            raise
        # (a sequence's rows: its prompt and answer, at most the context, and what the drafter
        # writes past them in a step: the rows the message names beyond the context)
        past = f" and what {drafter.name} writes past them in a step (drafts, probes)" \
            if drafter.kv_headroom else ""
        # (the longest request's budget may be its line's own: named both ways)
        lower = ", or lower --max-tokens (or the max_tokens a line gives itself)" \
            if max_len < ctx else ""
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


def prefill_chunk(cfg: GenerateConfig, model) -> int:
    """Prompt tokens a prefill forward takes: a recipe's prefill_chunk; else on CUDA the
    largest of CUDA_CHUNKS whose activations (prefill_bytes) take at most CHUNK_SHARE of the
    device's memory, and 512 on a CPU and under --exact (the rows its start-up check probes,
    engine/exact.PREFILL_ROWS).

    Why larger on CUDA: a prefill forward runs eagerly (steps replay graphs), so it costs its
    launches whatever its tokens. On the H200, an eager forward of the demo shape took ~12 ms
    for one token or 512, and 14.8 ms for 16 prompts of 512 (8,192 tokens)
    (bench-results/2026-11-30-gpu-7f4cca3/prefill-cost.json). At 512 tokens a forward, `ar`'s
    256 ShareGPT prompts at batch 32 took 44 prefill forwards, 0.64 s of its 1.69 s, and at
    batch 64 42 forwards, 0.57 of 1.18 s. A CPU's forward costs mostly its tokens (the demo
    model: 22 ms for 8 tokens, 290 for 512), so there a larger one gains little."""
    if cfg.prefill_chunk is not None:
        return cfg.prefill_chunk
    if model.device.type != "cuda" or cfg.exact:
        return PREFILL_ROWS
    total = torch.cuda.get_device_properties(model.device).total_memory
    return next((n for n in CUDA_CHUNKS if prefill_bytes(model, n) <= CHUNK_SHARE * total),
                PREFILL_ROWS)


def prefill_bytes(model, tokens: int) -> int:
    """A generous estimate of a prefill forward's working memory over `tokens` prompt
    tokens: each row's activations three times over (a prefill's logits are its last rows'
    only), and the attention mask and bias of its padded rows (PAD_BYTES, runtime/step/
    prefill.py)."""
    return 3 * tokens * _width(model.cfg) * model.embed.element_size() + PAD_BYTES


def _width(c) -> int:
    """The elements of one row's activations in a layer (norms, q/k/v, attention, MLP)."""
    return 4 * c.hidden_size + 2 * c.intermediate_size + (c.num_heads + 2 * c.num_kv_heads) \
        * c.head_dim


def kv_budget(cfg: GenerateConfig, model, slots: int, step_rows: int,
              max_len: int, chunk: int = PREFILL_ROWS) -> int | None:
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
        model, slots, step_rows, chunk, max_len))


def work_bytes(model, slots: int, step_rows: int, prefill_chunk: int, max_len: int) -> int:
    """A generous estimate of a step's working memory beside weights and KV cache: the
    activations of the largest forward (a prefill chunk, prefill_bytes; or every slot's step
    with graph padding, in the model's dtype with fp32 logits of its rows), attention's
    gathered keys and values of one layer (every slot at max_len rows) and its mask, captured
    graphs' pools, plus a fixed 1 GiB for the CUDA context and libraries' workspaces."""
    c = model.cfg
    e = model.embed.element_size()
    step = 3 * slots * max(step_rows, 16) * (_width(c) * e + 4 * c.vocab_size)
    gathered = 2 * slots * max_len * c.num_kv_heads * c.head_dim * e \
        + slots * max(step_rows, 16) * max_len * e
    return max(step, prefill_bytes(model, prefill_chunk)) + 2 * gathered + 2**30
