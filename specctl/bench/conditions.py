"""What a bench row's tokens/s stands on: how many sequences really ran at once, whether much of
each run was the batch draining, and CUDA graphs captured inside the timed repeats (their
capture time is timed as if it were decoding). The rows store these and the tables mark them,
so a number is not read as more than it measured."""

from __future__ import annotations

# below this many prompts per slot a run is drain-bound: with 4 x batch prompts the batch is
# full for at most ~3/4 of the run, and the tail runs ever fewer sequences per step, so the row
# does not measure its batch size's steady state (the H100's "b64" over 32 prompts was b32)
DRAIN_FACTOR = 4


def graph_captures(model) -> int:
    """CUDA-graph shapes `model` has captured so far (0 without graphs). The graphs --exact
    sets aside (Model._graphs, while it runs eagerly) count too: an :exact row swaps them out
    and back, and a count of the active ones alone would read the swap as captures."""
    seen = {id(g): g for g in (model.graphs, getattr(model, "_graphs", None)) if g is not None}
    # (`captures` counts every capture; the cache's size is a floor where it is not kept)
    return sum(getattr(g, "captures", len(g.cache)) for g in seen.values())


def effective_batch(prompts: int, batch_size: int) -> int:
    """The sequences a run of `batch_size` slots really has at once (no more than its prompts:
    the runner sizes its slots to the work, transformers' batches are the prompts)."""
    return min(batch_size, prompts)


def drain_bound(prompts: int, batch_size: int) -> bool:
    """(batch 1 never drains: its one slot is full from a prompt's start to its end)"""
    return batch_size > 1 and prompts < DRAIN_FACTOR * batch_size


def batch_warnings(prompts: int, batch_sizes) -> list[str]:
    """One warning per batch size whose rows will not measure what their batch size says."""
    out = []
    for bs in sorted(set(batch_sizes)):
        if bs > prompts:
            out.append(f"warning: batch size {bs} is more than the {prompts} "
                       f"prompt{'s' * (prompts != 1)}: its rows run at batch {prompts} (and "
                       "drain from the first step)")
        elif drain_bound(prompts, bs):
            out.append(f"warning: batch size {bs}: {prompts} prompts < {DRAIN_FACTOR} x {bs}, so "
                       "much of each run is the batch draining (fewer sequences in flight than "
                       f"slots); give at least {DRAIN_FACTOR * bs} prompts for its steady state")
    return out


def row_conditions(prompts: int, batch_size: int, captures_runs: list[int]) -> dict:
    """A row's fields for the above (see bench.config.RESULTS_SCHEMA)."""
    return {"effective_batch": effective_batch(prompts, batch_size),
            "drain_bound": drain_bound(prompts, batch_size),
            "captures": sum(captures_runs), "captures_runs": list(captures_runs)}
