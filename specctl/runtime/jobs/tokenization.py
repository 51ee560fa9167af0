"""The tokenizer-facing half of a job: chat rendering, decoding, EOS ids, and the one place a
prompt file's record becomes a `Request`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord
from specctl.models.checkpoint import load_tokenizer
from specctl.runtime.step.sequence import Request


class Tokenization:
    """The tokenizer-facing half of a job: chat rendering, decoding, EOS ids."""

    def __init__(self, model_dir: Path, chat: bool):
        self.tok = load_tokenizer(model_dir)
        self.chat = chat
        if chat and not getattr(self.tok, "chat_template", None):
            raise SpecctlError(f"{model_dir}: the tokenizer has no chat template; "
                               "pass --no-chat to feed prompts verbatim")
        eos = set()
        gen = model_dir / "generation_config.json"
        if gen.exists():
            try:
                e = json.loads(gen.read_text()).get("eos_token_id")
                eos.update(e if isinstance(e, list) else [e] if isinstance(e, int) else [])
            except (json.JSONDecodeError, AttributeError):
                pass
        if self.tok.eos_token_id is not None:
            eos.add(self.tok.eos_token_id)
        self.eos_ids = eos
        # a fast tokenizer that cleans up no spaces decodes as its Rust tokenizer does; called
        # directly that costs 2 us for a stop check's window against 5 through the wrapper,
        # and a stop check decodes once per emitted token
        fast = getattr(self.tok, "backend_tokenizer", None)
        self._fast = fast.decode if fast is not None and \
            not getattr(self.tok, "clean_up_tokenization_spaces", True) else None

    def render(self, req: Request) -> list[int]:
        """The prompt ids of the request's next stage; the first stage's are rendered once and
        kept on the request (sizing the job renders it before the runner admits it)."""
        if not req.answers and req.first_ids is not None:
            return req.first_ids
        ids = self._render(req)
        if not req.answers:
            req.first_ids = ids
        return ids

    def _render(self, req: Request) -> list[int]:
        if not self.chat:
            return self.tok.encode(req.raw_prompt)
        text = self.tok.apply_chat_template(req.history(), add_generation_prompt=True,
                                            tokenize=False)
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return self._fast(ids, skip_special_tokens=True)
        return self.tok.decode(ids, skip_special_tokens=True)


def kv_rows(tk: Tokenization, req: Request) -> tuple[int, int]:
    """(tokens of the first prompt, KV rows the whole request may need): the whole conversation
    with every later turn's own text, plus every answer with 16 tokens of slack each (an answer
    re-tokenized inside the template can come out a little longer)."""
    n = full = len(tk.render(req))
    if len(req.stages) > 1:
        saved, req.answers = req.answers, [""] * (len(req.stages) - 1)
        full = len(tk.render(req))
        req.answers = saved
    return n, full + len(req.stages) * (req.max_tokens + 16)


def record_meta(rec: PromptRecord) -> dict:
    """What an output line carries over from its input line: index, its ids, category."""
    m: dict = {"index": rec.index}
    if rec.id_field:
        m[rec.id_field] = rec.id
    m.update(rec.more_ids)
    if rec.category is not None:
        m["category"] = rec.category
    return m


def to_request(rec: PromptRecord, max_tokens: int) -> Request:
    """A fresh Request for a prompt record (a line's own max_tokens wins)."""
    return Request(rec.index, [list(s) for s in rec.turns], rec.max_tokens or max_tokens,
                   rec.raw_prompt, record_meta(rec), sampling=rec.sampling)


def require_raw_prompts(records: list[PromptRecord], path: str | None,
                        skip_bad: bool = False) -> list[PromptRecord]:
    """--no-chat feeds prompts verbatim: every usable line must be a 'prompt' line; the
    records, each other one a bad line under skip_bad (its error, as any bad line's), else
    SpecctlError naming the first. path: the file the records came from (None: the API's
    list, whose prompts are named by index, as its other messages name them)."""
    out = []
    for r in records:
        if r.error is None and r.raw_prompt is None:
            where = r.where(path) if path is not None else f"prompt {r.index}"
            if not skip_bad:
                raise SpecctlError(f"{where}: --no-chat needs a 'prompt' line (messages and "
                                   "turns need the chat template)")
            # (its output line's error: the API's run reads it too, so no flag is named)
            r = replace(r, turns=None, error=f"{where}: a run without the chat template needs "
                        "a 'prompt' line (messages and turns need it)")
        out.append(r)
    return out
