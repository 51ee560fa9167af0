"""A run's numbers: the metrics record of `generate` (metrics.json), also used by `bench`,
and its merge over several processes."""

from __future__ import annotations

import resource
from dataclasses import fields

import torch

from specctl.runtime.config import GenerateConfig
from specctl.runtime.runner import RunStats


def peak_mb(device: torch.device) -> float:
    """CUDA: the most memory allocated on `device`; CPU: the process's RSS high-water mark."""
    return (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def metrics(cfg: GenerateConfig, lines: list[dict], stats: RunStats | None, wall: float,
            device: torch.device) -> dict:
    good = [l for l in lines if "error" not in l]
    new = sum(l["new_tokens"] for l in good)
    steps = sum(l["steps"] for l in good)
    acc = [a for l in good for a in l["accept_lengths"]]
    drafted = sum(sum(l.get("draft_lengths", [])) for l in good)
    ctar = {w: round(sum(a > w for a in acc) / len(acc), 4) if acc else 0.0 for w in range(1, 7)}
    peak = peak_mb(device)
    return {
        "method": cfg.method, "batch_size": cfg.batch_size, "requests": len(lines),
        "errors": len(lines) - len(good), "new_tokens": new, "steps": steps,
        # throughput counts only what this invocation generated (a resumed run did less)
        "wall_time_s": round(wall, 3),
        "tokens_per_s": round(stats.generated / wall, 3) if stats and wall else 0.0,
        "mean_accepted_tokens": round(new / steps, 4) if steps else 0.0,
        "acceptance_rate": round(sum(acc) / drafted, 4) if drafted else 0.0,
        "ctar": ctar, "padding_ratio": round(stats.padding_ratio, 4) if stats else 0.0,
        "step_tokens": stats.step_tokens if stats else 0,
        "prefill_tokens": stats.prefill_tokens if stats else 0,
        "peak_memory_mb": round(peak, 1), "device": str(device),
        "speculation": speculation_metrics(cfg, stats),
        "kv_cache": kv_metrics(stats),
        "per_sample": [{k: l.get(k) for k in ("index", "new_tokens", "steps", "wall_time_s")}
                       for l in good],
    }


def _sum_stats(parts: list[dict]) -> RunStats:
    """Per-rank RunStats (as dicts) added up: counters summed, histograms merged, so ratios
    such as the padding ratio come out pooled over every step of every rank."""
    total = RunStats()
    for p in parts:
        for f in fields(RunStats):
            v = p.get(f.name)
            cur = getattr(total, f.name)
            if isinstance(v, dict) and isinstance(cur, dict):
                for k, c in v.items():
                    try:
                        k = int(k)   # JSON made the histogram's int keys strings
                    except ValueError:
                        pass
                    cur[k] = cur.get(k, 0) + c
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and \
                    isinstance(cur, (int, float)):
                setattr(total, f.name, cur + v)
    return total


def merged_metrics(cfg: GenerateConfig, lines: list[dict], ranks: list[dict], wall: float,
                   device: torch.device) -> dict:
    """One metrics record for a job run by several processes. Per-output numbers (requests,
    new tokens, steps, mean accepted tokens, acceptance rate, CTAR) come from the merged lines,
    so they are pooled over every step of every rank, exactly as for one process; tokens/s is
    the tokens all ranks generated in this invocation over the job's wall time (first rank
    starting to the last one finishing); step counters are summed; peak memory is the largest
    rank's. `per_rank` lists each rank's own share."""
    parts = [r["stats"] for r in ranks if r.get("stats")]
    m = metrics(cfg, lines, _sum_stats(parts) if parts else None, wall, device)
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


def speculation_metrics(cfg, stats) -> dict:
    """--speculate auto's record (runtime/controller.py): the budgets chosen (budget ->
    sequence-steps), the predicted and measured mean step ms, the expected and verified tokens
    per step (the bonus token and accepted drafts of every sequence: the controller's two
    estimates checked), and the goodput (emitted tokens per second of step time)."""
    out: dict = {"mode": cfg.speculate}
    n = stats.controlled_steps if stats else 0
    if n:
        out.update({
            "budget_hist": {str(k): v for k, v in sorted(stats.budget_hist.items())},
            "controlled_steps": n,
            "explored_sequence_steps": stats.explored,
            "contrast_steps": stats.contrasts,
            "confidence_stops": stats.confidence_stops,
            "predicted_step_ms": round(stats.predicted_step_ms / n, 3),
            "measured_step_ms": round(stats.measured_step_ms / n, 3),
            "predicted_tokens_per_step": round(stats.predicted_tokens / n, 3),
            "verified_tokens_per_step": round(stats.verified_tokens / n, 3),
            "goodput_tokens_per_s": round(stats.generated / (stats.measured_step_ms / 1e3), 3)
            if stats.measured_step_ms else 0.0,
            "profile_s": round(stats.profile_s, 3)})
    return out


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
