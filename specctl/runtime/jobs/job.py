"""A `generate` job: prompts file -> requests -> Runner -> output file + a run record in the store.

The job reads as its phases: read the input, load the model and the method's drafter, open the
run (new, or the one --resume finds), plan this process's requests, generate them, merge.
Record files and resume are in runtime/jobs/records.py; several processes (torchrun, Slurm: RANK /
WORLD_SIZE) in runtime/jobs/dist.py: rank r appends to its own record file, rank 0 merges
(runtime/jobs/merge.py); a Ray actor pool (--ray) in runtime/jobs/ray_pool.py.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord
from specctl.io.shards import not_read
from specctl.models.checkpoint import resolve_model
from specctl.models.contents import DigestCache, model_contents
from specctl.models.fingerprint import model_fingerprint
from specctl.reporting import QUIET, Reporter, TokenProgress
from specctl.runtime.control import auto
from specctl.runtime.jobs import ray_pool
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.depends import run_depends
from specctl.runtime.jobs.dist import (DistEnv, Group, PeerProgress, dist_env, rank_device, ranges,
                                  shard, unranges)
from specctl.runtime.jobs.loaded import Kept, load
from specctl.runtime.jobs.methods import locate_artifacts, make_drafter
from specctl.runtime.jobs.locks import (OutLock, check_job_cache_file, check_out, lock_run,
                                        run_in_use)
from specctl.runtime.jobs.merge import finish
from specctl.runtime.jobs.records import (RecordWriter, drop_if_empty, find_resumable,
                                          is_error_record, nearest_run, output_line, per_line,
                                          read_done, read_input, record_file, recorded,
                                          recorded_lines, runs_of)
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.groups import run_groups
from specctl.runtime.jobs.job_cache_file import load_job_cache, save_job_cache
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows, record_meta, to_request
from specctl.store import Store, atomic_write_json, make_manifest, new_id


@dataclass
class _Job:
    """What the phases of one job hand on to each other."""
    cfg: GenerateConfig
    store: Store
    grp: Group
    say: Callable[[str], None]
    report: Reporter
    records: list[PromptRecord] = field(default_factory=list)
    model_dir: Path | None = None
    input_sha: str = ""                  # the input's identity (io/lines.py: from its one read)
    own_settings: bool = False           # a line of the input carries settings of its own
    tk: Tokenization | None = None
    model: object = None
    drafter: object = None
    key: str = ""
    legacy: str = ""
    run_dir: Path | None = None
    done: dict[int, dict] = field(default_factory=dict)   # rank 0: finished lines by index
    done_ix: set[int] = field(default_factory=set)
    requests: list[tuple[Request, int]] = field(default_factory=list)   # (request, KV rows)
    errors: list[dict] = field(default_factory=list)
    writer: RecordWriter | None = None
    plans: list[dict] = field(default_factory=list)
    lock: object = None                  # rank 0: the open lock file of the run folder
    out_lock: OutLock | None = None      # rank 0: the lock on --out
    created: bool = False                # rank 0: this job made the run folder (not --resume)
    depends: dict | None = None          # rank 0: what the answers depend on (jobs/depends.py)
    auto: dict | None = None             # --method auto: the pilots and the choice
    ray: dict | None = None              # --ray: the actors' shares and the pool (ray_pool.run)
    kept: Kept | None = None             # a Generator's last model and tokenizer (loaded.py)

    @property
    def lead(self) -> bool:
        return self.grp.env.rank == 0


def run_generate(cfg: GenerateConfig, store: Store, out: Path | None, resume: bool = False,
                 report: Reporter | None = None, kept: Kept | None = None) -> dict:
    """Run a whole job; returns {'run_dir', 'out', 'metrics', 'rank', 'world_size'}.

    report: messages, and a progress bar over the prompts with the tokens/s (rank 0 only).
    kept: a Generator's last model and tokenizer, taken where the job's are the same, and
    this job's kept in it (runtime/jobs/loaded.py; one process: a launcher's ranks load their
    own).

    Under a launcher that sets RANK / WORLD_SIZE (torchrun, Slurm; see runtime/jobs/dist.py) every
    process calls this with the same arguments and the processes make one job: rank 0 opens the
    run (new, or the one --resume finds) and tells the others its id and which requests are
    done; each rank generates its `shard` of the rest on its own device and appends to its own
    `records.rank<r>.jsonl` in the same run directory; after a barrier rank 0 merges the union of
    all record files into the ordered output and one metrics record. Only rank 0 logs, shows
    progress and writes `out`; the other ranks return metrics None.

    Every phase runs under try and ends in grp.check: if any rank failed, all ranks stop there
    (one process: the error is simply raised). A run this job made that ends (an error, Ctrl-C)
    before its first record is removed again: nothing in it to resume.
    """
    grp = Group(dist_env()).start()
    job = None
    try:
        report = (report or QUIET) if grp.env.rank == 0 else QUIET
        job = _Job(cfg, store, grp, report.log, report,
                   kept=None if grp.env.active else kept)
        _read(job, out)
        _load(job, resume)
        _open_run(job, resume)
        _plan(job)
        stats, mine_wall, wall = _generate(job)
        if cfg.job_cache_file and job.lead and not cfg.ray and \
                getattr(job.drafter, "job", None) is not None:   # (rank 0's: one file)
            save_job_cache(cfg.job_cache_file, job.drafter, job.model_dir)
        return finish(job, out, stats, mine_wall, wall)
    except BaseException:
        if job is not None and job.lead and job.created:
            drop_if_empty(job.run_dir)
        raise
    finally:
        if job is not None and job.writer is not None:
            _close_writer(job, None)   # (a job stopped between its plan and its steps)
        if job is not None and job.lock is not None:
            job.lock.close()   # (releases the run folder)
        if job is not None and job.out_lock is not None:
            job.out_lock.release()
        grp.close()


def _read(job: _Job, out: Path | None) -> None:
    """Rank 0 first, so that a model download or a bad input line happens and is reported once.
    Before anything: the store is usable, and --out is this job's alone (runtime/jobs/locks.py)."""
    cfg, in_path = job.cfg, Path(job.cfg.input)
    err = None
    try:
        job.store.check_writable()
    except Exception as e:
        err = e
    if job.lead and err is None:
        try:
            check_job_cache_file(cfg.job_cache_file, out, in_path)
            if out is not None:
                check_out(out, in_path, store=job.store)
                job.out_lock = OutLock(out)
            if cfg.ray:   # (before a large input is read)
                ray_pool.check_address(cfg.ray)
            _take_input(job, read_input(cfg, in_path, job.grp.env.world))
            _say_shared_ids(job)
            skipped = not_read(in_path) if in_path.is_dir() else []
            if skipped:
                job.say(f"note: {in_path}: {len(skipped)} file{'s' * (len(skipped) > 1)} not "
                        "read (prompt shards are .jsonl, .ndjson, .json or .parquet): "
                        + ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else ""))
            locate_artifacts(cfg, job.store)   # a typo fails before the model loads
            job.model_dir = resolve_model(cfg.model, job.store, log=job.say)
        except Exception as e:
            err = e
    job.grp.check(err)


def _take_input(job: _Job, got) -> None:
    job.records, job.input_sha, job.own_settings = got.records, got.sha256, got.own_settings


def _say_shared_ids(job: _Job) -> None:
    """A note where lines share an id: their answers are told apart by `index` only (each
    line is answered, its id carried as given), which a join on the id would not."""
    seen: dict = {}
    for r in job.records:
        if r.id is not None:
            seen.setdefault((r.id_field, r.id), []).append(r.line_no)
    shared = [(k, v) for k, v in seen.items() if len(v) > 1]
    if shared:
        (field, ident), lines = shared[0]
        n = sum(len(v) - 1 for _, v in shared)
        job.say(f"note: {n} line{' shares its' if n == 1 else 's share their'} {field} with an "
                f"earlier line ({field} {ident!r} on lines {', '.join(map(str, lines[:4]))}"
                f"{', ...' if len(lines) > 4 else ''}): each is answered, told apart by its "
                "`index` in the output")


def _keys(job: _Job, cfg: GenerateConfig, drafter) -> tuple[str, str]:
    made = job.input_sha + str(job.model_dir) + drafter.signature() + per_line(job.own_settings)
    return cfg.key(made + f"{job.model.device.type}:{job.model.dtype}"), cfg.key(made, legacy=True)


def _profiles(job: _Job) -> dict:
    """Where the controller's step-cost tables are kept (make_runner's arguments)."""
    return {"store": job.store, "fingerprint": model_fingerprint(job.model_dir), "log": job.say}


def _choose_method(job: _Job, drafters: dict, skipped: list, resume: bool) -> str:
    """--method auto, on rank 0: the method of this job's run that --resume finds, or else the
    fastest in a pilot of every method there are artifacts for (runtime/control/auto.py)."""
    cfg = job.cfg
    if resume:   # the run of this job with the most answers (the newest of those), whichever
        # method ran it, of those whose artifacts and model are as they were, as --resume
        # takes (find_resumable): the newest, a run stopped early, hid a complete one and made
        # its answers again
        keys = {k: m for m, d in drafters.items() for k in _keys(job, replace(cfg, method=m), d)}
        runs = runs_of(job.store, keys)
        if runs:
            cache = DigestCache(job.store)
            have = model_contents(job.model_dir, cache)
            deps = {m: run_depends(replace(cfg, method=m), have, d, job.model, cache)
                    for m, d in drafters.items()}
            cache.save()
            runs = [e for e in runs if e.manifest.get("depends") == deps[keys[e.manifest["key"]]]]
        if runs:
            m = keys[max(runs, key=lambda e: recorded_lines(e.path)).manifest["key"]]
            job.say(f"--method auto: resuming the {m} run of this job")
            return m
    method, job.auto = auto.race(cfg, job.model, job.tk, drafters, skipped, job.records,
                                 **_profiles(job))
    return method


def _load(job: _Job, resume: bool = False) -> None:
    """Tokenizer, model and drafter; the run's key (same input, settings, model and method
    artifact, on the same kind of device in the same dtype)."""
    cfg, env, err = job.cfg, job.grp.env, None
    try:
        if not job.lead:
            _take_input(job, read_input(cfg, Path(cfg.input), env.world))
            job.model_dir = resolve_model(cfg.model, job.store, log=job.say)
        device = rank_device(cfg.device, env)
        if env.active and device.startswith("cuda:"):
            torch.cuda.set_device(torch.device(device))
        job.tk, job.model = load(cfg, job.model_dir, device, job.say, job.kept)
        if cfg.method == "auto":
            drafters, said, skipped = auto.candidates(cfg, job.model, job.model_dir, job.store)
            chosen = _choose_method(job, drafters, skipped, resume) if job.lead else None
        else:
            job.drafter = make_drafter(cfg, job.model, job.model_dir, job.store, job.say)
    except Exception as e:
        err = e
    job.grp.check(err)
    if cfg.method == "auto":
        chosen = job.grp.broadcast(chosen)
        job.grp.check(None if chosen in drafters else SpecctlError(
            f"--method auto: rank 0 chose {chosen}, whose artifact rank {env.rank} cannot find: "
            "with several nodes the store must be on a filesystem all nodes share"))
        job.cfg = cfg = replace(cfg, method=chosen)
        job.drafter = drafters[chosen]
        for line in said[chosen]:
            job.say(line)
    job.key, job.legacy = _keys(job, cfg, job.drafter)
    err = None
    if job.lead:   # (after the load: a store model's weights are checked against its manifest)
        try:
            cache = DigestCache(job.store)
            job.depends = run_depends(cfg, model_contents(job.model_dir, cache), job.drafter,
                                      job.model, cache)
            cache.save()
        except Exception as e:
            err = e
    job.grp.check(err)
    if env.active:   # the model path may differ between nodes; everything else must not
        same = cfg.key(job.input_sha + job.drafter.signature() + f"{job.model.dtype}:{cfg.limit}")
        job.grp.check(SpecctlError(
            "the ranks disagree on the input file contents, the options or the method's "
            "artifact: every rank must get the same command line and see the same files")
            if len(set(job.grp.gather(same))) > 1 else None)


def _open_run(job: _Job, resume: bool) -> None:
    """Rank 0 opens the run (new, or the one --resume finds) and tells the others."""
    cfg, store, opened, err = job.cfg, job.store, None, None
    if job.lead:
        try:
            run_dir, why = (find_resumable(store, (job.key, job.legacy), job.depends)
                            if resume else (None, ""))
            if resume and run_dir is None:
                job.say(why or "no earlier run with this input and these settings; starting a "
                        "new one" + nearest_run(store, job.input_sha, cfg))
            if not resume:
                _hint_unfinished(job)
            if run_dir is not None:
                job.lock = lock_run(run_dir)
                if job.auto is None:   # (--method auto resumed: the race that chose the run's
                    job.auto = _raced(run_dir)   # method, for its metrics.json again)
            job.done = read_done(run_dir, job.records) if run_dir else {}
            if not cfg.skip_bad:   # (a bad line recorded by a --skip-bad run stops this one)
                job.done = {i: r for i, r in job.done.items() if not is_error_record(r)}
            if run_dir is None:
                run_id = new_id(f"{cfg.method}-")
                run_dir = store.path("runs", run_id)
                run_dir.mkdir(parents=True)
                job.run_dir, job.created = run_dir, True
                job.lock = lock_run(run_dir)
                atomic_write_json(run_dir / "manifest.json", make_manifest(
                    "run", run_id, key=job.key, input=str(Path(cfg.input).resolve()),
                    input_sha256=job.input_sha, model=str(job.model_dir), config=asdict(cfg),
                    depends=job.depends, **({} if job.auto is None else
                                            {"method_auto": job.auto})))
            if job.done:
                job.say(f"resuming {run_dir.name}: {len(job.done)} of {len(job.records)} "
                        "requests already done")
            opened = {"id": run_dir.name, "done": ranges(sorted(job.done))}
        except Exception as e:
            err = e
    job.grp.check(err)
    opened = job.grp.broadcast(opened)
    job.run_dir = store.path("runs", opened["id"])
    job.done_ix = set(job.done) if job.lead else unranges(opened["done"])
    if job.model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _raced(run_dir: Path) -> dict | None:
    """The --method auto race a run's manifest kept (an object, else None): metrics.json is
    written as a run ends, so a run killed before that lost it at its resume."""
    try:
        got = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    got = got.get("method_auto") if isinstance(got, dict) else None
    return got if isinstance(got, dict) else None


def _hint_unfinished(job: _Job) -> None:
    """Without --resume a job starts a new run; where an unfinished one of the same job would
    have resumed, say so (its answers are kept either way), or that it is still going."""
    try:
        prev, _ = find_resumable(job.store, (job.key, job.legacy), job.depends)
        # (a finished --skip-bad run recorded its bad lines' errors: it is no unfinished one)
        done, seen = recorded(prev, job.records) if prev is not None else (0, 0)
        ended = prev is not None and (prev / "metrics.json").is_file()
        if not done or seen == len(job.records) and ended:
            return
        pid = run_in_use(prev)
    except (OSError, ValueError):   # (a word only: an unreadable old run is --resume's to say)
        return
    if pid is not None:   # (not unfinished: going on, and --resume would be refused)
        job.say(f"{prev.name}, a run of this job, is still going in another specctl process"
                f"{f' (pid {pid})' if pid else ''}; starting a new run")
    elif seen < len(job.records):
        job.say(f"{prev.name}, an unfinished run of this job, has {done} of "
                f"{len(job.records)} requests done: add --resume to continue it; starting a "
                "new run")
    else:   # (stopped after its last answer, before its output was written)
        job.say(f"{prev.name}, a run of this job, has every answer but was stopped before "
                "writing its output: add --resume to write it; starting a new run")


def _plan(job: _Job) -> None:
    """This process's share of the requests still to do, sized against the model's context;
    bad lines cost nothing: rank 0 records them all, real requests are sharded."""
    cfg, env, ctx, err, plan = job.cfg, job.grp.env, job.model.cfg.max_position, None, None
    try:
        if not job.lead and not (job.run_dir / "manifest.json").is_file():
            raise SpecctlError(f"rank {env.rank} cannot see {job.run_dir}, which rank 0 created: "
                               "with several nodes the store (--store or $SPECCTL_HOME) must be on "
                               "a filesystem all nodes share")
        todo = [r for r in job.records if r.index not in job.done_ix]
        good = shard([r for r in todo if r.error is None], env.rank, env.world)
        mine = sorted(good + ([r for r in todo if r.error is not None] if job.lead else []),
                      key=lambda r: r.index)
        for rec in mine:
            if rec.error is not None:
                job.errors.append({**record_meta(rec), "error": rec.error})
                continue
            req = to_request(rec, cfg.max_tokens)
            n, rows = kv_rows(job.tk, req)
            if n >= ctx:
                msg = (f"{rec.where(cfg.input)}: prompt is {n} tokens: the model's context "
                       f"({ctx}) leaves no room for an answer")
                if not cfg.skip_bad:
                    raise SpecctlError(msg + " (use --skip-bad to record it and go on)")
                job.errors.append({**record_meta(rec), "error": msg})
                continue
            job.requests.append((req, rows))
        if cfg.job_cache_file:
            load_job_cache(cfg.job_cache_file, job.drafter, job.model_dir, job.say)
        _rebuild_job_cache(job)
        job.writer = RecordWriter(record_file(job.run_dir, env))
        for e in job.errors:
            _persist(job, e)
        plan = {"requests": len(job.requests), "errors": len(job.errors),
                "offset": job.writer.size()}
    except Exception as e:
        err = e
        if job.writer is not None:
            _close_writer(job, err)
    job.grp.check(err)
    job.plans = job.grp.gather(plan)
    if any(rows + 32 > ctx for _, rows in job.requests):
        job.say(f"note: some answers can reach the model's context ({ctx} tokens) before their "
                "token limit; they stop there")
    if env.active:
        n = [p["requests"] for p in job.plans]
        job.say(f"{env.world} processes: {sum(n)} requests to generate, {min(n)} to {max(n)} "
                "per rank")


def _rebuild_job_cache(job: _Job) -> None:
    """--resume: Self-Draft's job cache learns the answers already written (index order), so a
    resumed job drafts as an unbroken one would. Rank 0 holds them (job.done); other ranks of a
    torchrun job start with an empty cache, as each process keeps its own."""
    learn = getattr(job.drafter, "learn_finished", None)
    if learn is None or getattr(job.drafter, "job", None) is None or not job.done:
        return
    recs = {r.index: r for r in job.records}
    n = 0
    for ix in sorted(job.done):
        line, rec = job.done[ix], recs.get(ix)
        ids = line.get("token_ids")
        if rec is None or rec.error is not None or "error" in line or not ids:
            continue
        learn(job.tk.render(to_request(rec, job.cfg.max_tokens)), ids[0])
        n += 1
    job.say(f"self-draft: the job cache learnt the {n} answers already written")


def _persist(job: _Job, line: dict) -> None:
    """A finished line: into this process's record file, and (rank 0) into the job's lines."""
    job.writer.persist(line)
    if job.lead:
        job.done[line["index"]] = line


def _close_writer(job: _Job, err: BaseException | None) -> BaseException | None:
    """This process's record file fsynced and closed; the job's error, else the close's."""
    try:
        job.writer.close()
    except OSError as e:
        return err or e
    return err


def _generate(job: _Job):
    """Run this process's requests; returns (RunStats or None, own wall, wall to the barrier)."""
    env, lock = job.grp.env, threading.Lock()
    progress = TokenProgress(job.report.task(
        "generate", len(job.records), len(job.done_ix) + sum(p["errors"] for p in job.plans),
        info="- tok/s"))
    peers = None
    if env.active and job.lead:
        peers = PeerProgress({record_file(job.run_dir, DistEnv(r, env.world, r)): p["offset"]
                              for r, p in enumerate(job.plans) if r != env.rank}, progress, lock)
    stats, err = None, None
    t0 = time.perf_counter()
    try:
        if peers:
            peers.start()
        if job.requests:

            def on_done(req: Request) -> None:
                _persist(job, output_line(req))
                with lock:
                    progress.advance(1)

            def on_tokens(n: int) -> None:
                with lock:
                    progress.tokens(n)

            if job.cfg.ray:
                stats = _on_ray(job, progress, lock)
            else:
                stats = run_groups(job.cfg, job.model, job.drafter, job.tk, job.requests,
                                   on_done, on_tokens, **_profiles(job))
    except Exception as e:
        err = e
    finally:
        err = _close_writer(job, err)   # (its error goes to every rank, as any other)
        if peers:
            peers.stop()
        progress.task.close()
    mine_wall = time.perf_counter() - t0
    job.grp.check(err)   # the barrier: every rank has finished its shard (or the job stops here)
    return stats, mine_wall, time.perf_counter() - t0


def _on_ray(job: _Job, progress, lock) -> None:
    """The requests on a Ray actor pool (runtime/jobs/ray_pool.py); lines persisted here."""
    if job.grp.env.active:
        raise SpecctlError("--ray runs one driver process: not under torchrun")

    def on_line(line: dict) -> None:
        _persist(job, line)
        with lock:
            progress.advance(1)
            progress.tokens(line.get("new_tokens", 0))
    recs = {r.index: r for r in job.records}
    job.ray = ray_pool.run(job, [recs[q.index] for q, _ in job.requests], on_line)
