"""The end of a generate job (runtime/jobs/job.py): rank 0 merges every rank's lines (or the
Ray actors' returned lines, all persisted by the driver) into the ordered output and one
metrics record, and writes --out."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.runtime.jobs.metrics import merged_metrics, metrics, peak_mb
from specctl.runtime.jobs.records import dumps, read_done, unwritten
from specctl.store import atomic_write_json, atomic_write_text


def finish(job, out: Path | None, stats, mine_wall: float, wall: float) -> dict:
    """Rank 0 merges every rank's lines into the ordered output and one metrics record."""
    cfg, env, model, run_dir = job.cfg, job.grp.env, job.model, job.run_dir
    ranks = job.grp.gather({"rank": env.rank, "device": str(model.device),
                            "requests": len(job.requests), "errors": len(job.errors),
                            "stats": asdict(stats) if stats else None,
                            "wall_time_s": mine_wall, "peak_memory_mb": peak_mb(model.device)})
    result = {"run_dir": run_dir, "out": None, "metrics": None, "rank": env.rank,
              "world_size": env.world}
    if not job.lead:
        return result
    done = job.done
    if env.active:
        # the ranks started together (right after the last gather); the job lasted until the
        # slowest one finished: rank 0's own view of that, or a rank's own clock if longer
        wall = max([wall] + [r["wall_time_s"] for r in ranks])
        done = read_done(run_dir, job.records)
    lines = [done[i] for i in sorted(done)]
    text = "".join(dumps(l) + "\n" for l in lines)
    merged = [done[i] for i in sorted(done) if done[i].get("index") is not None]
    mpath = run_dir / "metrics.json"
    m = _complete(job, mpath, len(merged))
    # a resumed run's lines within a narrower --limit: --out and the summary get them, the
    # run keeps its outputs and metrics (throughput included) as they were
    narrower = m is not None and m["requests"] > len(merged)
    if narrower:
        m = None
    else:
        _store(run_dir / "outputs.jsonl", atomic_write_text, text)
    if m is None:
        plain = job.drafter.price().max_draft == 0   # ar (or --method auto chose it)
        if job.ray:   # (the actors' shares; the driver generated nothing)
            m = merged_metrics(cfg, merged, job.ray["ranks"], wall, model.device, plain)
            m["ray"] = job.ray["pool"]
        else:
            m = (merged_metrics(cfg, merged, ranks, wall, model.device, plain) if env.active
                 else metrics(cfg, merged, stats, wall, model.device, plain))
        m["model"] = str(job.model_dir)
        if job.auto is not None:
            m["method_auto"] = job.auto
        if not narrower:
            _store(mpath, atomic_write_json, m)
    if out is not None:
        try:
            atomic_write_text(out, text)
        except OSError as e:   # the answers are safe in the run: say how to get them out
            raise SpecctlError(
                f"could not write {out} ({e.strerror or e}); the answers are stored in run "
                f"{run_dir.name} ({run_dir / 'outputs.jsonl'}): run the same command with "
                "--resume and another --out to write them") from None
    return {**result, "out": out, "metrics": m}


def _complete(job, mpath: Path, n: int) -> dict | None:
    """A resumed run's metrics where it has nothing left to do and they are those of these n
    requests or of more (an earlier run past this --limit), else None: metrics made anew
    (not those of an earlier, narrower --limit, say)."""
    if any(p["requests"] or p["errors"] for p in job.plans) or not mpath.is_file():
        return None
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or not isinstance(m.get("requests"), int) or m["requests"] < n:
        return None
    more = f" ({n} of its {m['requests']} requests within --limit)" if m["requests"] > n else ""
    job.say(f"{job.run_dir.name} is already complete{more}: nothing to generate")
    # (as this invocation's: it made nothing; metrics.json keeps the invocation's that did)
    return {**m, "generated_tokens": 0}


def _store(path: Path, write, what) -> None:
    """A run's file written; a failure (a full store) names it and --resume."""
    try:
        write(path, what)
    except OSError as e:
        raise unwritten(path, e) from None
