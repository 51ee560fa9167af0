"""Requests that carry their own sampling settings (a line's `sampling`, an OpenAI batch body's
temperature, seed, stop, logprobs ...): run in groups of equal settings, one runner each, in
the order their first line comes. A runner draws, stops and verifies by one set of settings for
all its sequences, so a group never mixes them. Groups run one after another: a file in which
every line has its own temperature runs a line at a time. A line's greedy answer, and under
sampling ar's and Self-Draft's, depend on its own settings alone (draws are keyed by seed,
request and position); draft-verify and Kangaroo draw their drafts from their own
distribution, so their sampled answers are exact in distribution, not in tokens. Lines
without settings of their own make one group with the run's, and so do lines that differ only
in their seed."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.sizing import make_runner
from specctl.runtime.step.stats import RunStats, merged


def settings(cfg: GenerateConfig, req: Request) -> GenerateConfig:
    """The run's settings with the request's own over them (checked as the command's are),
    but its seed (checked when read, io/prompts.py): a request carries that itself
    (Request.seed), so seeds never split a group."""
    own = {k: v for k, v in (req.sampling or {}).items() if k not in ("seed", "n")}
    try:
        return replace(cfg, **own) if own else cfg
    except SpecctlError as e:
        raise SpecctlError(f"prompt {req.index}: {e}") from None


def run_groups(cfg: GenerateConfig, model, drafter, tk, items: list[tuple[Request, int]],
               on_done: Callable[[Request], None], on_tokens=None, **profiles) -> RunStats:
    """Run `items` ((request, KV rows) pairs) in groups of equal settings; their stats summed.
    profiles: make_runner's store, fingerprint and log."""
    groups: dict[GenerateConfig, list] = {}
    items, on_done = samples(cfg, items, on_done)
    for req, rows in items:
        groups.setdefault(settings(cfg, req), []).append((req, rows))
    stats = []
    for gcfg, part in groups.items():
        runner = make_runner(gcfg, model, drafter.sampled(gcfg.sampling()), tk,
                             [r for _, r in part], **profiles)
        stats.append(runner.run([q for q, _ in part], on_done, on_tokens=on_tokens))
    return merged(stats)


def samples(cfg: GenerateConfig, items: list, on_done: Callable[[Request], None]):
    """A request asking for n > 1 answers as n requests, sample j drawn with seed + j (the
    line's seed, else the run's); on_done hears of it once, when all n are done, as the first
    with `samples` holding them all. Returns (the items, that on_done)."""
    out, waiting = [], {}
    for req, rows in items:
        n = (req.sampling or {}).get("n", 1)
        if n == 1:
            out.append((req, rows))
            continue
        own = {k: v for k, v in req.sampling.items() if k != "n"}
        # (a line's own seed: seed + j, wherever the line is; else the run's seed + j and the
        # line's position, as for every line without a seed: as the run's seed, j's draws made
        # every such line's samples the same, and the same as a line seeded with it)
        subs = [Request(req.index, req.stages, req.max_tokens, req.raw_prompt, req.meta,
                        sampling={**own, "seed": (req.seed + j) % 2**63}
                        if req.seed is not None else own, sample=j) for j in range(n)]
        waiting[req.index] = subs
        out += [(q, rows) for q in subs]
    if not waiting:
        return out, on_done

    def done(req: Request) -> None:
        subs = waiting.get(req.index)
        if subs is None:
            return on_done(req)
        if all(q.done for q in subs):
            del waiting[req.index]
            subs[0].samples = subs
            on_done(subs[0])
    return out, done
