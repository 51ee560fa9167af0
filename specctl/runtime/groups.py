"""Requests that carry their own sampling settings (a line's `sampling`, an OpenAI batch body's
temperature, seed, stop, logprobs ...): run in groups of equal settings, one runner each, in
the order their first line comes. A runner draws, stops and verifies by one set of settings for
all its sequences, so a group never mixes them; a line's answer depends only on its own
settings, never on which group ran beside it (the draws are keyed by seed, request and
position). Lines without settings of their own make one group with the run's."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from specctl.errors import SpecctlError
from specctl.runtime.config import GenerateConfig
from specctl.runtime.sequence import Request
from specctl.runtime.sizing import make_runner
from specctl.runtime.stats import RunStats, merged


def settings(cfg: GenerateConfig, req: Request) -> GenerateConfig:
    """The run's settings with the request's own over them (checked as the command's are)."""
    own = req.sampling or {}
    try:
        return replace(cfg, **own) if own else cfg
    except SpecctlError as e:
        raise SpecctlError(f"prompt {req.index}: {e}") from None


def run_groups(cfg: GenerateConfig, model, drafter, tk, items: list[tuple[Request, int]],
               on_done: Callable[[Request], None], on_tokens=None, **profiles) -> RunStats:
    """Run `items` ((request, KV rows) pairs) in groups of equal settings; their stats summed.
    profiles: make_runner's store, fingerprint and log."""
    groups: dict[GenerateConfig, list] = {}
    for req, rows in items:
        groups.setdefault(settings(cfg, req), []).append((req, rows))
    stats = []
    for gcfg, part in groups.items():
        runner = make_runner(gcfg, model, drafter.sampled(gcfg.sampling()), tk,
                             [r for _, r in part], **profiles)
        stats.append(runner.run([q for q, _ in part], on_done, on_tokens=on_tokens))
    return merged(stats)
