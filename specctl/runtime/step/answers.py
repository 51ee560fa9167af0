"""Where an answer ends, and what a finished one leaves in its request.

    answers = Answers(eos_ids, stop, decode, kv, max_len, stats, logprobs)
    answers.emit(seq, tokens)     # a step's (or a prefill's) tokens, each checked
    answers.finish(seq)           # the stage's text, ids and reason into its request

Each token is checked as `ar` checks its one token a step: the answer ends at the token that
completes EOS, the token budget or a stop string, or where the context is full, not at the
end of a step's accepted drafts, so every method's answers end where `ar`'s do.
"""

from __future__ import annotations

from typing import Callable

from specctl.runtime.step.sequence import Sequence
from specctl.runtime.step.stats import RunStats


class Answers:
    def __init__(self, eos_ids: set[int], stop: tuple[str, ...],
                 decode: Callable[[list[int]], str], kv, max_len: int, stats: RunStats,
                 logprobs: int | None = None):
        self.eos_ids, self.stop = set(eos_ids), tuple(s for s in stop if s)
        self.decode, self.kv, self.max_len, self.stats = decode, kv, max_len, stats
        self.logprobs = logprobs
        # the tokens a stop check decodes: a stop string ends in the newest token's text (an
        # earlier end would have ended the answer there), so its length in UTF-8 bytes (every
        # token but a skipped special one is at least a byte: a character may take several
        # tokens) and a slack for tokens that decode to nothing find it; at most 64 (decoding
        # 64 tokens per emitted token cost more than a small model's step)
        self.stop_window = min(64, 8 + max((len(x.encode("utf-8", "surrogatepass"))
                                            for x in self.stop), default=0))

    def emit(self, s: Sequence, tokens: list[int]) -> int:
        """Append a step's tokens to s, each checked (module docstring); returns how many
        were appended (fewer where the answer ends inside them). (Locals and one count, not
        attribute updates a token: every step emits so for every sequence.)"""
        out, eos, stop = s.out_ids, self.eos_ids, self.stop
        left, reason, n = s.req.max_tokens - len(out), None, 0
        for t in tokens:
            if left <= 0:
                reason = "length"
                break
            out.append(t)
            left -= 1
            n += 1
            if t in eos:
                reason = "stop"
                break
            if stop:
                text = self.decode(out[-self.stop_window:])
                if any(x in text for x in stop):
                    reason = "stop_string"
                    break
        self.stats.generated += n
        if reason is not None:
            s.finish_reason = reason
        elif s.finish_reason is None:
            if left <= 0:
                s.finish_reason = "length"
            elif self.kv.lens[s.slot] + 1 >= self.max_len:
                s.finish_reason = "context"
        s.pending = out[-1] if out else None
        return n

    def finish(self, seq: Sequence) -> bool:
        """The finished stage's answer into its request (its text cut at a stop string, EOS
        left out); True when the request is done (a full context ends its later stages,
        each an empty answer)."""
        req, ids = seq.req, seq.out_ids
        text = self.decode([t for t in ids if t not in self.eos_ids])
        if seq.finish_reason == "stop_string":
            cut = min((text.find(s) for s in self.stop if s in text), default=-1)
            text = text[:cut] if cut >= 0 else text
        self._add(req, text, ids, seq.logprobs[:len(ids)], seq.finish_reason or "length")
        if seq.finish_reason == "context":
            while not req.done:   # later stages cannot run once the context is full
                self._add(req, "", [], [], "context")
        return req.done

    def _add(self, req, text: str, ids: list[int], logprobs: list, reason: str) -> None:
        req.answers.append(text)
        req.answer_ids.append(ids)
        if self.logprobs is not None:
            req.logprobs.append(logprobs)
        req.finish_reasons.append(reason)
