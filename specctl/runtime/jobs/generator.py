"""specctl as a library, in the shape of vLLM's offline `LLM`:

    from specctl import Generator

    g = Generator(model="smollm2-135m-instruct", method="self-draft", batch_size=8)
    for out in g.generate(["What is speculative decoding?", "Name three rivers."],
                          max_tokens=128):
        print(out.index, out.text, out.mean_accepted)

    g.generate_file("prompts.jsonl", out="answers.jsonl", resume=True)   # what the CLI runs

`Generator(**options)` takes GenerateConfig's fields (runtime/jobs/config.py): the model, the method
and its options (skip_set, adapter, corpus_cache, ...), device, dtype, batch_size, and the
sampling defaults. The model loads once, on first use, and every `generate` and
`generate_file` call shares it (runtime/jobs/loaded.py; so one Generator serves one thread at a
time); every call builds a fresh drafter, so its outputs do not depend on earlier calls.
`generate_file` is the `specctl generate` job: a JSONL file in, an ordered output file and a
run record in the store, --resume; `limit` and `skip_bad` are its settings (a file's lines),
which `generate` does not read: it answers every prompt of its list, and a bad one is a
SpecctlError naming it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, prompt_record
from specctl.models.checkpoint import resolve_model
from specctl.models.fingerprint import model_fingerprint
from specctl.reporting import QUIET, Reporter
from specctl.runtime.control import auto
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.job import run_generate
from specctl.runtime.jobs.loaded import Kept, load
from specctl.runtime.jobs.locks import out_path
from specctl.runtime.jobs.records import step_lengths
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.jobs.groups import run_groups
from specctl.runtime.jobs.metrics import peak_mb
from specctl.runtime.step.sequence import Request
from specctl.runtime.step.stats import RunStats
from specctl.runtime.jobs.tokenization import kv_rows, require_raw_prompts, to_request
from specctl.store import Store

_FIELDS = {f.name for f in fields(GenerateConfig)} - {"input"}


@dataclass(frozen=True)
class GenerationOutput:
    """One prompt's result (the fields of an output line of `specctl generate`)."""
    index: int                       # the prompt's position in the list
    text: str                        # the answer (the first one, for multi-turn prompts)
    turns: list[str]                 # every answer, one per turn
    token_ids: list[list[int]]       # every answer's token ids
    finish_reason: str | None        # the last turn's: "stop" (EOS or a stop string), "length", ...
    prompt_tokens: int
    new_tokens: int                  # (n > 1: over every sample, as the output line's)
    steps: int                       # decoding steps (forwards of the target model), so too
    accept_lengths: list[int]        # accepted drafted tokens per step ([]: nothing drafted)
    logprobs: list = field(default_factory=list)   # logprobs: per answer, per token
                                                   # [its lp, [[id, lp] of the top N]]
    samples: list = field(default_factory=list)    # n > 1: every sample's GenerationOutput
    finish_reasons: list = field(default_factory=list)   # every turn's, as turns

    @property
    def mean_accepted(self) -> float:
        """New tokens per step (1.0 for ar)."""
        return self.new_tokens / self.steps if self.steps else 0.0


def _output(req: Request, sample: bool = False) -> GenerationOutput:
    """sample: one of a request's n answers (its samples are not listed again). A request of
    n answers counts tokens and steps over them all, as its output line does (records.py
    output_line; req is the first of req.samples)."""
    every = req.samples if req.samples and not sample else [req]
    return GenerationOutput(
        index=req.index, text=req.answers[0] if req.answers else "", turns=list(req.answers),
        token_ids=[list(a) for a in req.answer_ids],
        finish_reason=req.finish_reasons[-1] if req.finish_reasons else None,
        prompt_tokens=req.prompt_tokens,
        new_tokens=sum(len(a) for q in every for a in q.answer_ids),
        steps=sum(q.steps for q in every), accept_lengths=step_lengths(*every)[0],
        logprobs=list(req.logprobs),
        samples=[_output(q, True) for q in req.samples] if req.samples and not sample else [],
        finish_reasons=list(req.finish_reasons))


_KEYWORDS = _FIELDS | {"out", "resume"}   # (and generate_file's own)


_SWITCHES = {f.name for f in fields(GenerateConfig) if str(f.type).startswith("bool")} | \
    {"resume"}


def _keywords(message: str) -> str:
    """A check's message with each flag of a keyword the API takes ("--max-tokens", "--out")
    named as that keyword ("max_tokens", "out"), a switch as its setting ("--resume":
    "resume=True", "--no-chat": "chat=False"); other flags as they are. Only a flag that stands
    as a word (after a space or a bracket, or first): one inside a path ("in--out/p.jsonl") or
    quoted text is not one."""
    def name(m):
        k = m.group(2).replace("-", "_")
        if k in _KEYWORDS:
            k += "=True" if k in _SWITCHES else ""
        elif k.startswith("no_") and k[3:] in _SWITCHES:
            k = f"{k[3:]}=False"
        else:
            return m.group(0)
        return m.group(1) + k
    return re.sub(r"(^|[\s(])--([a-z][a-z0-9-]*)(?![\w/.-])", name, message)


class Generator:
    """A model and a decoding method, ready to generate (see the module docstring)."""

    def __init__(self, model: str | None = None, method: str = "ar", *,
                 store: Store | str | Path | None = None, report: Reporter | None = None,
                 flags: bool = False, **options):
        """flags: messages name the settings as the command line's flags (the CLI's), not
        as this call's keywords."""
        unknown = sorted(set(options) - _FIELDS)
        if unknown:
            raise SpecctlError(f"Generator: unknown option {unknown[0]!r} "
                               f"(options: {', '.join(sorted(_FIELDS))})")
        self.settings = {**options, "model": model, "method": method}
        self.flags = flags
        self.config()   # checks the settings now
        if not isinstance(store, (Store, str, os.PathLike, type(None))):
            raise SpecctlError(f"Generator: store must be a folder's path or a Store, got "
                               f"{type(store).__name__}")
        if report is not None and not all(callable(getattr(report, f, None))
                                          for f in ("log", "task")):
            raise SpecctlError(f"Generator: report must be a specctl.reporting.Reporter, got "
                               f"{type(report).__name__}")
        self.store = store if isinstance(store, Store) else \
            Store(None if store is None else os.fspath(store))
        self.report = report or QUIET
        self._model_dir = None   # (resolved once: a store's model may be downloaded)
        self._fingerprint = (0, "")   # (the kept load's: Kept.loads when made, the id)
        self._kept = Kept()      # the last model and tokenizer, generate_file's too
        self._auto: dict = {}   # --method auto's choice per sampling setting

    def config(self, input: str = "<prompts>", **overrides) -> GenerateConfig:
        """The GenerateConfig of these settings (with `overrides`). Its checks name the
        command line's flags ("--batch-size must be at least 1"); here they name the
        keyword the caller gave ("batch_size must be at least 1")."""
        try:
            return GenerateConfig(input=str(input), **{**self.settings, **overrides})
        except SpecctlError as e:
            raise self._said(e) from None

    def _said(self, e: SpecctlError) -> SpecctlError:
        """e as this caller names things: the CLI's flags (flags=True), else the keywords (the
        same exception, its class and fields kept: RankStopped is still RankStopped)."""
        if not self.flags and e.args and isinstance(e.args[0], str):
            e.args = (_keywords(e.args[0]),) + e.args[1:]
        return e

    def _load(self, cfg: GenerateConfig):
        """(model folder, tokenizer, model, its fingerprint): the model a generate_file job
        loaded last (loaded.py), else loaded now and kept for the next call."""
        if self._model_dir is None:
            self._model_dir = resolve_model(cfg.model, self.store, log=self.report.log)
        model_dir, kept = self._model_dir, self._kept
        tk, model = load(cfg, model_dir, cfg.device, self.report.log, kept)
        if self._fingerprint[0] != kept.loads:   # (a folder written over loads again)
            self._fingerprint = kept.loads, model_fingerprint(model_dir)
        return model_dir, tk, model, self._fingerprint[1]

    def generate(self, prompts, max_tokens: int | None = None, *,
                 temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, seed: int | None = None,
                 stop: str | list[str] | tuple[str, ...] | None = None,
                 logprobs: int | None = None) -> list[GenerationOutput]:
        """Answers for `prompts`, in order. A prompt is a string (a user message), a list of
        {"role", "content"} messages, or a dict in any prompt-file line format (e.g.
        {"turns": [...]} for several turns, {"prompt": ..., "max_tokens": ..., "sampling":
        {"temperature": 0.7, "seed": 1, "logprobs": 2}}: that prompt's own settings).
        Arguments given here override the Generator's settings for this call."""
        if isinstance(prompts, (str, dict)) or not hasattr(prompts, "__iter__"):
            raise SpecctlError("generate() takes a list of prompts (each a string, a list of "
                               f"messages or a prompt-line dict), got {type(prompts).__name__}")
        over = {k: v for k, v in dict(max_tokens=max_tokens, temperature=temperature,
                                      top_p=top_p, top_k=top_k, seed=seed,
                                      logprobs=logprobs).items()
                if v is not None}
        if stop is not None:   # (a string or a list: GenerateConfig makes it a tuple)
            over["stop"] = stop
        records = [prompt_record(p, i) for i, p in enumerate(prompts)]
        try:
            done = self.run_records(records, **over)[0]
        except SpecctlError as e:
            raise self._said(e) from None
        return [_output(r) for r in sorted(done, key=lambda r: r.index)]

    def run_records(self, records: list[PromptRecord], **overrides):
        """The finished Requests of prompt records (any order), the RunStats, the device and
        its peak memory in MB: generate()'s work, and a Ray actor's (runtime/jobs/ray_pool.py),
        whose records keep their line's index."""
        cfg = self.config(**overrides)
        if not cfg.chat:
            require_raw_prompts(records, None)
        if not records:
            return [], RunStats(), "-", 0.0
        model_dir, tk, model, fingerprint = self._load(cfg)
        ctx = model.cfg.max_position
        reqs, rows = [], []
        for rec in records:
            req = to_request(rec, cfg.max_tokens)
            n, need = kv_rows(tk, req)
            if n >= ctx:
                raise SpecctlError(f"prompt {rec.index}: {n} tokens: the model's context "
                                   f"({ctx}) leaves no room for an answer")
            reqs.append(req)
            rows.append(need)
        profiles = {"store": self.store, "fingerprint": fingerprint, "log": self.report.log}
        if cfg.method == "auto":   # piloted once per sampling setting (the first call's
            # prompts that were worth a pilot: a small call's `ar` is not kept, or a warm-up
            # call of two prompts held every later one of thousands to `ar`)
            drafters, said, skipped = auto.candidates(cfg, model, model_dir, self.store)
            key = (cfg.temperature, cfg.top_p, cfg.top_k)
            chosen = self._auto.get(key)
            if chosen is None:
                chosen, report = auto.race(cfg, model, tk, drafters, skipped, records,
                                           **profiles)
                if report is not None and report.get("pilots"):
                    self._auto[key] = chosen
                for line in said[chosen]:
                    self.report.log(line)
            drafter = drafters[chosen]
        else:
            drafter = make_drafter(cfg, model, model_dir, self.store, self.report.log)
        done: list[Request] = []
        stats = run_groups(cfg, model, drafter, tk, list(zip(reqs, rows)), done.append,
                           **profiles)
        return done, stats, str(model.device), peak_mb(model.device)

    def generate_file(self, input: str | Path, out: str | Path | None = None, *,
                      resume: bool = False, limit: int | None = None,
                      skip_bad: bool | None = None) -> dict:
        """The `specctl generate` job on a JSONL prompt file: writes `out` (if given) and a run
        in the store; returns {'run_dir', 'out', 'metrics', 'rank', 'world_size'}. limit: only
        the first N lines; skip_bad: record bad lines instead of stopping (both default to the
        Generator's settings)."""
        if not isinstance(resume, (bool, np.bool_)):   # ("no" would read as True)
            raise SpecctlError(f"resume must be True or False, got {resume!r}")
        input = _path_arg("input", input)
        out = None if out is None else _path_arg("out", out)
        over = {k: v for k, v in dict(limit=limit, skip_bad=skip_bad).items() if v is not None}
        cfg = self.config(input, **over)
        try:
            return run_generate(cfg, self.store, out_path(out) if out is not None else None,
                                resume=bool(resume), report=self.report, kept=self._kept)
        except SpecctlError as e:
            raise self._said(e) from None


def _path_arg(name: str, v) -> str:
    """generate_file's input or out as a str path; anything else (a number, bytes, a list,
    None) a SpecctlError naming it (it was a TypeError from deep inside, or 'None: prompt
    file not found')."""
    p = os.fspath(v) if isinstance(v, (str, os.PathLike)) else None
    if not isinstance(p, str):
        raise SpecctlError(f"{name} must be a file path (a str or os.PathLike), got {v!r}")
    return p
