"""A generate job on Ray Data (`--ray local|auto|ADDRESS`): the job's requests stream through
an actor pool, each actor loading the model, the method's drafter and its artifacts once and
running the same pipeline as one process (Generator: requests in groups of equal settings, one
Runner each). Everything else is the job's, in the driver: the input read and checked, the run
opened or resumed, bad lines recorded, and each finished line persisted through the run's
record writer as its batch comes back, then the ordered output and one metrics record.

So a driver killed mid-job loses only lines still in flight: --resume runs them again (with any
actor count); a finished line is never lost nor repeated. An actor that dies is restarted by
Ray and its batch run again (MAX_RESTARTS). Work moves: a batch goes to whichever actor is free
(Ray Data's back-pressure keeps a few in flight per actor), so a slow actor holds only its own.

Rows travel as Arrow columns: the job sends each request's prompt record as JSON text
("record") and gets the output line back as JSON text ("output"), with the batch's step
statistics on its first row ("stats"). Ray moves the actors' constructor options between the
job's own processes with its serializer; nothing read from a file or the store is unpickled.

`GenerateBatches` is also the entry for a user's own pipeline:

    ds.map_batches(GenerateBatches, fn_constructor_kwargs={"method": "self-draft"},
                   concurrency=2, batch_size=64, batch_format="pyarrow")

adds "text" and "output" to rows in any prompt-file line format ("prompt", "messages",
"turns", ... columns; an "index" column keys sampled draws as a line's place in a file does).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import time
import uuid
import warnings
from dataclasses import asdict

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, prompt_record, record_from_json
from specctl.runtime.jobs.records import dumps, output_line
from specctl.runtime.step.stats import in_turn

MAX_RESTARTS = 2    # an actor that dies is restarted, its batch run again, this many times
TASK_BATCHES = 2    # a task's rows: this many times --batch-size (fewer drains, still moving)


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise SpecctlError("--ray needs Ray Data: pip install 'specctl[ray]'") from None
    return ray


class GenerateBatches:
    """A Ray Data callable class: one Generator per actor (see the module docstring)."""

    def __init__(self, model: str | None = None, method: str = "ar", store: str | None = None,
                 starts: str | None = None, **options):
        """starts: the named actor a job counts its actor processes in (_Starts)."""
        from specctl.runtime.jobs.generator import Generator
        self.gen = Generator(model, method, store=store, **options)
        self.who = f"{os.uname().nodename}:{os.getpid()}"
        if starts is not None:
            import ray
            ray.get(ray.get_actor(starts).add.remote(self.who))

    def __call__(self, batch):
        rows = _rows(batch)
        t0 = time.perf_counter()
        records = [_record(r, i) for i, r in enumerate(rows)]
        done, stats, device, peak = self.gen.run_records(records)
        by = {q.index: q for q in done}
        lines = [output_line(by[rec.index]) for rec in records]
        out = {k: [r.get(k) for r in rows] for k in rows[0]} if rows else {}
        out["output"] = [dumps(line) for line in lines]
        out["text"] = [line["text"] for line in lines]
        info = {"actor": self.who, "device": device, "peak_memory_mb": peak, "requests": len(rows),
                "wall_time_s": time.perf_counter() - t0, "stats": asdict(stats)}
        out["stats"] = [json.dumps(info)] + [""] * (len(rows) - 1)
        return out


def _rows(batch) -> list[dict]:
    """A batch in any of Ray Data's formats as row dicts of plain Python values."""
    if hasattr(batch, "to_pylist"):           # pyarrow
        return batch.to_pylist()
    if hasattr(batch, "to_dict"):             # pandas
        return [{k: _plain(v) for k, v in r.items()} for r in batch.to_dict("records")]
    cols = {k: [_plain(v) for v in vals] for k, vals in batch.items()}   # numpy
    n = len(next(iter(cols.values()), []))
    return [{k: cols[k][i] for k in cols} for i in range(n)]


def _plain(v):
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _record(row: dict, i: int) -> PromptRecord:
    """The job's record (its JSON, as the driver checked it), or a user's row read as a prompt
    line (the prompt file's strict schema)."""
    if "record" in row:
        return record_from_json(json.loads(row["record"]))
    line = {k: v for k, v in row.items() if v is not None and k not in ("index", "text",
                                                                     "output", "stats")}
    return prompt_record(line, int(row.get("index", i)))


def run(job, records: list[PromptRecord], on_line) -> dict:
    """Generate `records` on the cluster cfg.ray names; on_line(output line) in the driver as
    each batch comes back. Returns {"ranks": one dict per actor process (merged_metrics'),
    "pool": what the run's metrics say of the pool (_pool)}."""
    ray = import_ray()
    cfg = job.cfg
    started = not ray.is_initialized()
    for name in ("ray", "ray.data"):   # (the job reports progress; Ray's notes are noise)
        logging.getLogger(name).setLevel(logging.ERROR)
    if started:
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")   # (its C++ notes too)
        try:
            with _no_stderr():   # (Ray's C++ logs that it read that level, whatever the level)
                ray.init(address=None if cfg.ray == "local" else cfg.ray,
                         include_dashboard=False, log_to_driver=False,
                         logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SpecctlError(f"--ray {cfg.ray}: no Ray cluster there ({_reason(e)}); "
                               "local starts one on this machine") from None
    try:
        return _stream(ray, job, records, on_line)
    finally:
        if started:
            ray.shutdown()


def _stream(ray, job, records: list[PromptRecord], on_line) -> dict:
    import ray.data
    cfg = job.cfg
    size = max(1, TASK_BATCHES * cfg.batch_size)
    blocks = max(1, -(-len(records) // size))
    actors = min(cfg.actors, blocks)   # (an actor with no task would only load the model)
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // actors) if not gpus else 1
    from specctl.runtime.jobs.generator import _FIELDS
    opts = {k: v for k, v in asdict(cfg).items() if k in _FIELDS
            and k not in ("model", "method", "ray", "actors", "limit", "skip_bad")}
    if opts.get("threads") is None and not gpus:
        opts["threads"] = cpus
    ray.data.DataContext.get_current().enable_progress_bars = False   # (the job's bar shows)
    starts = f"specctl-starts-{uuid.uuid4().hex}"
    counter = ray.remote(num_cpus=0)(_Starts).options(name=starts).remote()
    opts["starts"] = starts
    items = [{"record": json.dumps(asdict(r))} for r in records]
    ds = ray.data.from_items(items, override_num_blocks=blocks)
    with warnings.catch_warnings():   # (Ray 2.60 takes restarts only as remote arguments,
        warnings.simplefilter("ignore")  # which it warns of: the extra pins ray < 2.64)
        out = ds.map_batches(
            GenerateBatches, batch_size=size, batch_format="pyarrow",
            # (one task at a time an actor: the first actor up does not queue every task)
            compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
            num_cpus=cpus, num_gpus=gpus,
            max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
            fn_constructor_kwargs={"model": str(job.model_dir), "method": cfg.method,
                                   "store": str(job.store.root), **opts})
    shares: dict[str, dict] = {}
    try:
        for batch in out.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.select(["output", "stats"]).to_pylist():
                on_line(json.loads(row["output"]))
                if row["stats"]:
                    _tally(shares, json.loads(row["stats"]))
    except Exception as e:
        if isinstance(e, SpecctlError):
            raise
        raise SpecctlError(f"--ray: the job failed on the cluster: {_reason(e)}") from None
    started = ray.get(counter.count.remote())
    ray.kill(counter)
    return {"ranks": [{"rank": i, **a} for i, a in enumerate(shares.values())],
            "pool": _pool(len(shares), actors, started)}


class _Starts:
    """Counts a job's actor processes as they start (a Ray actor of its own)."""

    def __init__(self):
        self.who: list[str] = []

    def add(self, who: str) -> None:
        self.who.append(who)

    def count(self) -> int:
        return len(self.who)


def _tally(actors: dict, info: dict) -> None:
    """A task's statistics into its actor process's running totals."""
    a = actors.get(info["actor"])
    if a is None:
        actors[info["actor"]] = {"device": info["device"], "requests": info["requests"],
                                 "errors": 0,
                                 "stats": info["stats"], "wall_time_s": info["wall_time_s"],
                                 "peak_memory_mb": info["peak_memory_mb"]}
        return
    a["stats"] = asdict(in_turn([a["stats"], info["stats"]]))   # (its tasks: one at a time)
    a["requests"] += info["requests"]
    a["wall_time_s"] += info["wall_time_s"]
    a["peak_memory_mb"] = max(a["peak_memory_mb"], info["peak_memory_mb"])


def check_address(address: str, timeout: float = 5.0) -> None:
    """--ray HOST:PORT where nothing answers fails in seconds, before the job loads anything,
    not after Ray's own connect timeout of minutes. (Other forms, ray:// and bare IPv6
    addresses among them, are Ray's to check.)"""
    if address in ("local", "auto") or "://" in address or address.count(":") != 1:
        return
    host, port = address.rsplit(":", 1)
    if not (port.isdigit() and 0 < int(port) < 65536):
        raise SpecctlError(f"--ray {address}: {port!r} is not a port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        why = f"no answer in {timeout:g} s" if isinstance(e, TimeoutError) else \
            e.strerror or str(e)
        raise SpecctlError(f"--ray {address}: nothing answers there ({why}); start the head "
                           "with `ray start --head`, or use --ray local") from None


@contextlib.contextmanager
def _no_stderr():
    """File descriptor 2 to /dev/null for a while (Ray's C++ core writes there directly)."""
    sys.stderr.flush()
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:   # (no fd 2 to quiet: a daemon's)
        yield
        return
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _reason(e: BaseException) -> str:
    """What went wrong on an actor, in one line: the first task error (Ray wraps it in errors
    of its own, whose last line is advice on retries). The innermost cause Ray kept, else
    the last line of the text before Ray's "direct cause" (the task's own traceback)."""
    cause = getattr(e, "cause", None) or e.__cause__ or e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is not e and not type(cause).__module__.startswith("ray."):
        first = str(cause).strip().split("\n")[0]
        return f"{type(cause).__name__}: {first}" if first else type(cause).__name__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).split("The above exception was the direct")[0]
    lines = [l.strip() for l in text.strip().split("\n") if l.strip()]
    return lines[-1] if lines else type(cause).__name__


def _pool(with_work: int, actors: int, started: int) -> dict:
    """Actors asked for, actor processes started (one that died and was restarted, or
    replaced, counts again), the restarts, and the processes that returned work."""
    return {"actors": actors, "started": started, "restarts": max(0, started - actors),
            "processes_with_work": with_work}
