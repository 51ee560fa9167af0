"""Per-request state: a Request is what the user asked for, a Sequence is one turn of it in flight.

A request has one or more stages (multi-turn prompts): stage k's messages are appended to the
conversation so far, the model answers, its answer is appended, then stage k + 1 follows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class Request:
    index: int                          # input order
    stages: list[list[dict]]            # messages appended before each answer
    max_tokens: int
    raw_prompt: str | None = None       # fed verbatim when no chat template is applied
    meta: dict = field(default_factory=dict)   # ids etc. carried to the output
    sampling: dict | None = None        # the line's own settings over the run's (io/prompts.py)
    # n > 1 on a line without a seed of its own: which of its samples (drawn with the run's
    # seed + sample, and keyed by its position as every such line's draws are)
    sample: int = 0
    # n > 1: every sampled Request, this one first (not compared: it holds this one)
    samples: list | None = field(default=None, compare=False, repr=False)
    # filled as stages finish
    answers: list[str] = field(default_factory=list)
    answer_ids: list[list[int]] = field(default_factory=list)
    steps: int = 0
    accept_lengths: list[int] = field(default_factory=list)   # accepted drafts per step
    draft_lengths: list[int] = field(default_factory=list)    # drafted tokens per step
    finish_reasons: list[str] = field(default_factory=list)
    started: float | None = None
    wall_time: float = 0.0
    prompt_tokens: int = 0
    first_ids: list[int] | None = None  # the first stage's prompt ids, once rendered (kv_rows)
    # with logprobs: per answer, per token [its log-probability, [[id, lp] of the top N]]
    logprobs: list[list] = field(default_factory=list)

    @property
    def seed(self) -> int | None:
        """Its own seed (a line's; None: the run's), which its draws are keyed by."""
        return (self.sampling or {}).get("seed")

    @property
    def stream(self) -> int:
        """The random stream of the current turn (its generator, its position uniforms): by
        the request's number and turn; with a seed of its own by its turn alone, so the same
        prompt with the same seed samples the same answer wherever its line is (as vLLM's
        per-request seeds do)."""
        return (0 if self.seed is not None else self.index * 64) + len(self.answers)

    @property
    def done(self) -> bool:
        return len(self.answers) == len(self.stages)

    def history(self) -> list[dict]:
        """Messages up to and including the next stage's user turn."""
        msgs: list[dict] = []
        for k in range(len(self.answers) + 1):
            msgs.extend(self.stages[k])
            if k < len(self.answers):
                msgs.append({"role": "assistant", "content": self.answers[k]})
        return msgs


@dataclass(eq=False)   # identity: the scheduler looks sequences up in its lists
class Sequence:
    """One stage of a request, living in a KV slot while it runs."""
    req: Request
    prompt_ids: list[int]
    slot: int
    rng: torch.Generator | None = None
    out_ids: list[int] = field(default_factory=list)
    pending: int | None = None          # last emitted token, not yet in the KV cache
    prefilled: int = 0                  # prompt tokens already in the KV cache
    finish_reason: str | None = None
    state: object = None                # the drafter's own per-sequence state (Drafter.admit)
    started: float = field(default_factory=time.perf_counter)
    admitted: int = 0                   # admission order (the newest is preempted first)
    # the request's step counters when this stage was admitted (a preempted stage's are undone)
    mark: tuple[int, int, int] = (0, 0, 0)
    logprobs: list = field(default_factory=list)   # per emitted token (Runner.logprobs)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def request_rng(seed: int, stream: int) -> torch.Generator:
    """A request turn's generator: same seed, same request -> same samples, whatever the batch."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + stream) % (2**63))
    return g
