"""A run's numbers: the metrics record of `generate` (metrics.json), also used by `bench`,
and its merge over several processes."""

from __future__ import annotations

import resource
from dataclasses import asdict

import torch

from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.step.stats import RunStats, sum_stats


def peak_mb(device: torch.device) -> float:
    """CUDA: the most memory allocated on `device`; CPU: the process's RSS high-water mark."""
    return (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _one_off(stats: dict) -> float:
    """A run's one-off seconds (RunStats as a dict): the step-cost table's measurement, the
    graphs' captures and --exact's check, at start-up; left out of tokens/s."""
    return stats.get("profile_s", 0.0) + stats.get("capture_s", 0.0) + \
        stats.get("exact_check_s", 0.0)


def metrics(cfg: GenerateConfig, lines: list[dict], stats: RunStats | None, wall: float,
            device: torch.device, plain: bool = False, one_off: float | None = None,
            busy: float | None = None) -> dict:
    """plain: the run decoded as `ar` (its method, or --method auto's choice); one_off: the
    seconds of the wall spent on one-off work (default: measuring the step-cost table); busy:
    the seconds of decoding the gain is estimated over (default: wall - one_off; several
    processes: their own, summed)."""
    good = [l for l in lines if "error" not in l]
    new = sum(l["new_tokens"] for l in good)
    steps = sum(l["steps"] for l in good)
    acc = [a for l in good for a in l["accept_lengths"]]
    drafted = sum(sum(l.get("draft_lengths", [])) for l in good)
    # a line that never drafted lists no steps (records.step_lengths): its verification steps
    # (all but each turn's prefill token) accepted nothing
    idle = sum(max(0, l["steps"] - len(l.get("turns") or [0]) * len(l.get("samples") or [0]))
               for l in good if not l["accept_lengths"])
    verified = len(acc) + idle
    ctar = {w: round(sum(a > w for a in acc) / verified, 4) if acc else 0.0
            for w in range(1, 7)}
    zero = round((sum(a == 0 for a in acc) + idle) / verified, 4) if verified else 0.0
    peak = peak_mb(device)
    if one_off is None:   # (the step table's measurement, the graphs' captures at start-up)
        one_off = _one_off(asdict(stats)) if stats else 0.0
    # None: nothing generated in this invocation (a resumed run whose every answer was made
    # before, its metrics never written: a full store, say), so nothing measured: not 0.0
    tps = None if stats is None else \
        round(stats.generated / (wall - one_off), 3) if wall > one_off else 0.0
    return {
        "method": cfg.method, "batch_size": cfg.batch_size, "requests": len(lines),
        "errors": len(lines) - len(good), "new_tokens": new, "steps": steps,
        # throughput counts only what this invocation generated (a resumed run did less)
        "wall_time_s": round(wall, 3),
        # left out of tokens/s
        "one_off_s": {"step_table": round(stats.profile_s if stats else 0.0, 3),
                      "graph_captures": round(stats.capture_s if stats else 0.0, 3),
                      "exact_check": round(stats.exact_check_s if stats else 0.0, 3),
                      "total": round(one_off, 3)},
        "tokens_per_s": tps,
        # (what tokens/s counts: this invocation's tokens, fewer than new_tokens where a
        # resumed run had made some before)
        "generated_tokens": stats.generated if stats else 0,
        **gain_vs_ar(stats, tps, busy if busy is not None else wall - one_off, plain),
        "mean_accepted_tokens": round(new / steps, 4) if steps else 0.0,
        "acceptance_rate": round(sum(acc) / drafted, 4) if drafted else 0.0,
        "ctar": ctar, "zero_accept_share": zero,
        "padding_ratio": round(stats.padding_ratio, 4) if stats else 0.0,
        "step_tokens": stats.step_tokens if stats else 0,
        "prefill_tokens": stats.prefill_tokens if stats else 0,
        "peak_memory_mb": round(peak, 1), "device": str(device),
        "time_split": time_split(stats),
        "speculation": speculation_metrics(cfg, stats),
        "kv_cache": kv_metrics(stats),
        "accepted_from": accepted_shares(stats),
        "per_sample": [{k: l.get(k) for k in ("index", "new_tokens", "steps", "wall_time_s")}
                       for l in good],
    }


def gain_vs_ar(stats: RunStats | None, tps: float, busy: float, plain: bool) -> dict:
    """What speculation bought, estimated: `ar`'s tokens/s for the same work and the ratio.
    The run's busy time less its job excess (RunStats.job_excess_ms, the measured guard's job
    account: drafting steps against what their tokens cost as `ar` steps measured in this
    run, searches that found nothing, slots held for grouped admissions); the rest (prefill,
    output) is kept. A run that decoded as `ar` is its own estimate; a run without the
    controller (--speculate fixed) has no table to price by: None."""
    if plain:
        return {"ar_tokens_per_s_est": tps, "gain_vs_ar_est": 1.0 if tps else None}
    if stats is None or not stats.controlled_steps or busy <= 0 or not tps:
        return {"ar_tokens_per_s_est": None, "gain_vs_ar_est": None}
    ar_busy = busy - stats.job_excess_ms / 1e3
    if ar_busy <= 0:   # (steps timed longer than the run: counts that do not add up)
        return {"ar_tokens_per_s_est": None, "gain_vs_ar_est": None}
    gain = ar_busy / busy
    return {"ar_tokens_per_s_est": round(tps / gain, 3), "gain_vs_ar_est": round(gain, 3)}


def merged_metrics(cfg: GenerateConfig, lines: list[dict], ranks: list[dict], wall: float,
                   device: torch.device, plain: bool = False) -> dict:
    """One metrics record for a job run by several processes. Per-output numbers (requests,
    new tokens, steps, mean accepted tokens, acceptance rate, CTAR) come from the merged lines,
    so they are pooled over every step of every rank, exactly as for one process; tokens/s is
    the tokens all ranks generated in this invocation over the job's wall time (first rank
    starting to the last one finishing); step counters are summed; peak memory is the largest
    rank's. `per_rank` lists each rank's own share."""
    parts = [r["stats"] for r in ranks if r.get("stats")]
    total = sum_stats(parts) if parts else None
    # (the ranks measured their step tables at once; their decoding adds up)
    m = metrics(cfg, lines, total, wall, device, plain,
                one_off=max((_one_off(p) for p in parts), default=0.0),
                busy=sum(r["wall_time_s"] for r in ranks)
                - (_one_off(asdict(total)) if total else 0))
    m["peak_memory_mb"] = round(max(r["peak_memory_mb"] for r in ranks), 1)
    m["world_size"] = len(ranks)
    m["per_rank"] = []
    for r in ranks:
        st = r.get("stats") or {}
        gen, w = st.get("generated", 0), r["wall_time_s"]
        padded = st.get("padded_tokens", 0)
        m["per_rank"].append({
            "rank": r["rank"], "device": r["device"], "requests": r["requests"],
            "errors": r["errors"], "generated_tokens": gen, "wall_time_s": round(w, 3),
            "tokens_per_s": round(gen / w, 3) if w and gen else 0.0,
            "step_tokens": st.get("step_tokens", 0), "prefill_tokens": st.get("prefill_tokens", 0),
            "padding_ratio": round(1.0 - st.get("step_tokens", 0) / padded, 4) if padded else 0.0,
            "peak_memory_mb": round(r["peak_memory_mb"], 1)})
    return m


def time_split(stats) -> dict | None:
    """Where a run's time went: its decode steps and its prefill (every method, ar too: a
    method that ends sequences at other steps than ar admits and prefills them in other
    groups), and within the steps the controller's decisions that searched or could have, and
    the drafter's and controller's learning run under a forward (CUDA: RunStats.learn_s).
    The rest (admission, retiring, output) is the wall time less these; where several ranks
    ran, these are their sums (against the ranks' summed walls, not the job's)."""
    if stats is None:
        return None
    return {"steps_s": round(stats.step_s, 3), "prefill_s": round(stats.prefill_s, 3),
            "prefill_forwards": stats.prefill_forwards,
            "prefill_replays": stats.prefill_replays,   # (of those: runtime/step/prefill.py)
            "search_s": round(stats.search_ms / 1e3, 3),
            "learn_s": round(stats.learn_s, 3), "prefill_chunk": stats.prefill_chunk,
            # (what prefill's pieces were priced at, where a grouped run priced them)
            "piece_ms": {"prompts": stats.piece_prompts,
                         "eager": round(stats.piece_eager_ms, 3),
                         "replay": round(stats.piece_replay_ms, 3)}
            if stats.piece_prompts else None}


def speculation_metrics(cfg, stats) -> dict:
    """--speculate auto's record (runtime/control/controller.py): the budgets chosen (budget ->
    sequence-steps), the predicted and measured mean step ms, the expected and verified tokens
    per step (the bonus token and accepted drafts of every sequence: the controller's two
    estimates checked), and the goodput (emitted tokens per second of step time)."""
    out: dict = {"mode": cfg.speculate}
    n = stats.controlled_steps if stats else 0
    if stats and (stats.captures or stats.captures_in_steps):
        out["graphs"] = {"captured_at_start": stats.captures,
                         "capture_s": round(stats.capture_s, 3),
                         "captured_in_steps": stats.captures_in_steps}
    if n:
        drafting = n - stats.lean_steps   # (a lean step is predicted as nothing: ar's path)
        out.update({
            "budget_hist": {str(k): v for k, v in sorted(stats.budget_hist.items())},
            "controlled_steps": n,
            "lean_steps": stats.lean_steps, "searches": stats.searches,
            "guard_trips": stats.guard_trips, "guard_held_steps": stats.guard_held,
            "explored_sequence_steps": stats.explored,
            "contrast_steps": stats.contrasts,
            "confidence_stops": stats.confidence_stops,
            "predicted_step_ms": round(stats.predicted_step_ms / drafting, 3) if drafting else 0.0,
            "measured_step_ms": round(stats.measured_step_ms / n, 3),
            "lean_step_ms": round(stats.lean_step_ms / stats.lean_steps, 3)
            if stats.lean_steps else 0.0,
            "drafting_step_ms": round((stats.measured_step_ms - stats.lean_step_ms) / drafting,
                                      3) if drafting else 0.0,
            "predicted_tokens_per_step": round(stats.predicted_tokens / drafting, 3)
            if drafting else 0.0,
            "verified_tokens_per_step": round(stats.verified_tokens / drafting, 3)
            if drafting else 0.0,
            "goodput_tokens_per_s": round(stats.generated / (stats.measured_step_ms / 1e3), 3)
            if stats.measured_step_ms else 0.0,
            "profile_s": round(stats.profile_s, 3)})
    return out


def accepted_shares(stats) -> dict | None:
    """Self-Draft: the share of its accepted drafts each cache's candidates made (job, context,
    corpus; a path is the candidate's that made its deepest node), with the counts; None for
    a method without caches."""
    got = stats.accepted_from if stats is not None else {}
    if not got:
        return None
    n = sum(got.values())
    return {"tokens": n, **{k: round(v / n, 4) if n else 0.0 for k, v in sorted(got.items())}}


def kv_metrics(stats) -> dict:
    """The KV cache: its layout and size, and (paged) the stages preempted for blocks and the
    tokens they generated again."""
    if stats is None:
        return {}
    out = {"layout": "paged" if stats.kv_blocks else "contiguous",
           "mib": round(stats.kv_bytes / 2**20, 1)}
    if stats.kv_blocks:
        out.update({"blocks": stats.kv_blocks, "preemptions": stats.preemptions,
                    "recomputed_tokens": stats.recomputed})
    return out
