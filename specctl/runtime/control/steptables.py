"""The step-cost table of a run: measured on first use (a small grid, a few seconds) or ahead
by `specctl prepare`, kept for the process and in the store (profiles/), per model, device,
dtype, attention backend and batch size. It is the one cost profile: the controller prices
steps on it (runtime/control/stepcost.py), search-skip and train-adapter's exit-layer sweep on its
batch-1 table.
"""

from __future__ import annotations

import fcntl
import json
import platform
import re
import time
from contextlib import contextmanager
from dataclasses import replace

import torch

from specctl.engine.steptable import ENGINE_COSTS, StepTable, measure_step_table
from specctl.runtime.step.threads import usable_cpus
from specctl.store import atomic_write_json, make_manifest

_TABLES: dict = {}


def device_tag(model) -> str:
    """What prices a step besides the model and dtype: on a CPU its model and the threads a
    step runs on; on CUDA the GPU's model (an H100 costs unlike an A10) and whether steps
    replay captured graphs."""
    if model.device.type == "cuda":
        name = torch.cuda.get_device_name(model.device)
        how = "graphs" if model.graphs is not None else "eager"
    else:
        name = _cpu_name()
        how = f"t{torch.get_num_threads()}"
    return f"{model.device.type}-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{how}"


def _cpu_name() -> str:
    return cpuinfo(("model name",)) or platform.processor() or platform.machine()


def cpuinfo(keys: tuple[str, ...]) -> str | None:
    """The value of the first /proc/cpuinfo line naming one of keys (None where there is
    none, or no such file: not Linux)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


STEP_NS = (1, 2, 4, 8, 16, 32, 64)   # tokens per sequence a stored table measures (the graph
                                     # grid's points: engine/graphs.py)
STEP_WARMUP, STEP_REPEATS = 1, 5     # runs of each of its points: untimed, then timed
STEP_CONTEXT = 128                   # committed rows of every sequence it measures
STEP_TABLE_ROWS = STEP_CONTEXT + max(STEP_NS) + 1   # KV rows a cache needs to measure it on


def step_table_id(fingerprint: str, model, batch_size: int) -> str:
    return (f"{fingerprint}-{device_tag(model)}-{str(model.dtype).replace('torch.', '')}"
            f"-{model.attention}{'-exact' if model.exact else ''}-steps-b{batch_size}")


def step_table_path(store, fingerprint: str, model, batch_size: int):
    """Where step_table_for keeps the table of `model` for `batch_size` slots."""
    ident = step_table_id(fingerprint, model, batch_size)
    return store.path("profiles", ident) / "steptable.json"


def step_table_seconds(batch_size: int, step_s) -> float:
    """About how long step_table_for measures, given step_s(b, n): seconds of a step of b
    sequences x n tokens (for an estimate before measuring). Each round runs its first step
    once more, untimed (measure_step_table)."""
    batches = sorted({1, batch_size})
    steps = sum(step_s(b, n) for b in batches for n in STEP_NS) + \
        sum(step_s(b, STEP_NS[0]) for b in batches)
    return (STEP_WARMUP + STEP_REPEATS) * steps


def step_table_for(model, batch_size: int, *, store=None, fingerprint: str | None = None,
                   log=lambda msg: None, ns=STEP_NS, context: int = STEP_CONTEXT,
                   repeats: int = STEP_REPEATS, warmup: int = STEP_WARMUP,
                   fresh: bool = False, kv=None) -> StepTable:
    """The step-cost table of `model` for runs of `batch_size` slots (batches {1, batch_size},
    a small grid of tokens per sequence): kept for the process, and with a store and the
    model's fingerprint kept in the store too (profiles/), so it is measured once per model,
    device, dtype, attention backend and batch size; a batch size between two stored ones is
    interpolated from them instead (`interpolated`). fresh: measure it again. kv: the run's
    idle cache, measured on when it can hold the table's steps (so the run's graphs and cache
    stay; measure_step_table), else a cache of the table's own."""
    batches = tuple(sorted({1, batch_size}))
    key = (id(model), str(model.device), str(model.dtype), model.exact, batches, tuple(ns))
    t = None if fresh else _TABLES.get(key)
    if t is not None:
        return t
    kept = store is not None and fingerprint is not None
    if kept and not fresh:   # (a refused table said once: the calls after read it quietly)
        t = _stored(store, fingerprint, model, batch_size, ns, context, log) or \
            interpolated(store, fingerprint, model, batch_size, ns, context, log)
    if t is None:
        with _measuring(store if kept else None, fingerprint, model, batch_size, log):
            if kept and not fresh:   # (another process may have measured it meanwhile)
                t = _stored(store, fingerprint, model, batch_size, ns, context, _quiet)
            if t is None:
                t = _measure(model, batch_size, batches, ns, context, repeats, warmup, kv,
                             store if kept else None, fingerprint, log)
    _TABLES[key] = t
    return t


BUSY = 0.4   # the least share of its threads' time a CPU measurement's process may have run
BUSY_WALL_S = 0.5   # (a shorter one is judged by nothing: CPU time ticks are coarse)


def _measure(model, batch_size, batches, ns, context, repeats, warmup, kv, store,
             fingerprint, log) -> StepTable:
    """measure_step_table, kept in the store when one is given, unless
    - it is implausible twice running (StepTable.implausible: measured again once, then it
      serves this run only; spinning threads on a shared CPU pass the check below), or
    - a CPU was too busy to measure on: the process ran less than BUSY of the time its
      threads could have (another process had the cores; two jobs measuring at once stored
      tables 3-8x slow, a 2-token step at 2.2x a 1-token one where a quiet machine times
      1.02x), so the table serves this run only and the next measures again."""
    t0, c0 = time.perf_counter(), time.process_time()
    fits = kv is not None and kv.num_slots >= max(batches) and \
        kv.max_len >= context + max(ns) + 1 and \
        (not kv.paged or len(kv.free) >= max(batches) * -(-(context + max(ns) + 1) // kv.block))
    for again in (False, True):
        t = measure_step_table(model, batches=batches, ns=ns, context=context,
                               repeats=repeats, warmup=warmup, kv=kv if fits else None)
        why = t.implausible()
        if why is None or again:
            break
        log(f"the step-cost table measured wrong ({why}): measuring it again")
    wall = time.perf_counter() - t0
    # (the process's CPU time over what its threads could have had: torch's threads, at most
    # the CPUs it may run on; the calling thread's alone read 14% on an idle machine with 8
    # threads on 2 CPUs, its workers doing the work)
    cpus = min(torch.get_num_threads(), usable_cpus())
    ran = (time.process_time() - c0) / (wall * max(1, cpus)) if wall > BUSY_WALL_S else 1.0
    if model.device.type == "cpu" and ran < BUSY:
        log(f"warning: the CPU was busy while the step-cost table was measured (this process "
            f"ran {ran:.0%} of the {wall:.1f} s): its prices serve this run only, and the next "
            "run measures again")
        return t
    if why is not None:   # (twice: the machine, not a moment of it)
        log(f"warning: the step-cost table measured wrong twice ({why}); its prices serve this "
            "run only, and the next run measures again")
        return t
    if store is None:
        return t
    ident = step_table_id(fingerprint, model, batch_size)
    try:
        with store.building("profiles", ident, make_manifest(
                "step-table", ident, model_fingerprint=fingerprint,
                device=device_tag(model))) as d:
            atomic_write_json(d / "steptable.json", t.to_json())
        log(f"step-cost table measured in {wall:.1f} s, kept as profiles/{ident}")
    except OSError as e:   # a cache: a store that cannot keep it costs a measurement
        log(f"step-cost table measured, not kept in the store ({e})")
    return t


@contextmanager
def _measuring(store, fingerprint, model, batch_size: int, log):
    """One process at a time measures a stored table (a second job started beside the first
    waits, then reads what the first kept: measuring side by side slowed both and priced
    both wrong). No store, or a filesystem without locks: nothing to wait for."""
    if store is None:
        yield
        return
    # (one lock a model, device and dtype: any batch size's measuring loads the same CPU or
    # GPU; in work/, where no listing of the store's artifacts counts it)
    ident = step_table_id(fingerprint, model, 0)
    try:
        (store.root / "work").mkdir(parents=True, exist_ok=True)
        f = open(store.root / "work" / f".measuring-{ident}", "a")
    except OSError:
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another process is measuring a step-cost table of this model here: waiting "
                "for it")
            try:
                fcntl.flock(f, fcntl.LOCK_EX)
            except OSError:
                pass
        except OSError:
            pass
        yield


AGREE = 1.5   # how far apart stored tables' batch-1 rows may be, at most, to be read together


def _quiet(msg: str) -> None:   # (a log that says nothing)
    pass


def _stored(store, fingerprint: str, model, batch_size: int, ns, context: int,
            log) -> StepTable | None:
    """The stored table of this batch size, if it is one the run can use (else None, and a
    message when it is unreadable or from an earlier engine)."""
    path = step_table_path(store, fingerprint, model, batch_size)
    if not path.is_file():
        return None
    try:
        t = StepTable.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as e:
        log(f"{path}: unreadable step-cost table ({e}); measuring again")
        return None
    if t.engine != ENGINE_COSTS:
        log(f"{path}: measured by an earlier engine; measuring again")
        return None
    why = t.implausible()
    if why is not None:
        log(f"{path}: measured wrong ({why}); measuring again")
        return None
    ok = t.batches == tuple(sorted({1, batch_size})) and t.ns == tuple(ns) and \
        t.context == context
    return t if ok else None


def interpolated(store, fingerprint: str, model, batch_size: int, ns, context: int,
                 log) -> StepTable | None:
    """A table for batch_size from the rows the store has measured (same model, machine,
    dtype and attention; every stored table has batch 1's row and its own batch's): its row
    linear in the batch size between the nearest measured batch sizes below and above it, or
    the measured row itself; None when batch_size is past the measured ones (a step's cost
    there is not a line to extend)."""
    stem = step_table_id(fingerprint, model, 0)[:-1]   # "...-steps-b"
    rows: dict[int, tuple] = {}
    ones = []   # each table's own batch-1 row
    base = None
    for e in store.entries("profiles"):
        size = e.id[len(stem):] if e.id.startswith(stem) else ""
        t = _stored(store, fingerprint, model, int(size), ns, context, _quiet) \
            if re.fullmatch(r"[0-9]+", size) else None   # (a refused one: not used here)
        if t is not None:
            base = base or t
            rows.update(zip(t.batches, t.table))
            ones.append(t.table[t.batches.index(1)])
    lo = max((b for b in rows if b <= batch_size), default=None)
    hi = min((b for b in rows if b >= batch_size), default=None)
    if lo is None or hi is None:
        return None
    # (tables measured apart, each plausible, may not be together: a machine slower at one
    # measurement than at another prices its batch sizes apart, so their batch-1 rows must
    # agree)
    off = max(max(c) / min(c) for c in zip(*ones))
    if off > AGREE:
        log(f"the stored step-cost tables of batches {sorted(rows)} disagree (their batch 1 "
            f"rows up to {off:.2f}x apart): measuring batch {batch_size}'s")
        return None
    w = (batch_size - lo) / (hi - lo) if hi > lo else 0.0
    row = tuple((1 - w) * x + w * y for x, y in zip(rows[lo], rows[hi]))
    log(f"step-cost table for batch {batch_size}: the stored row of batch {batch_size}"
        if hi == lo else f"step-cost table for batch {batch_size} read off the stored batches "
        f"{sorted(rows)} (between {lo} and {hi}, not measured)")
    if batch_size == 1:
        return replace(base, batches=(1,), table=(row,))
    return replace(base, batches=(1, batch_size), table=(rows[1], row))
