"""The timed methods of a bench: specctl's (one Runner per run, a fresh drafter each time) and
transformers' own `generate` on the same checkpoint (`hf`, `hf-prompt-lookup`, `hf-static`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specctl.bench.conditions import graph_captures
from specctl.bench.config import PROMPT_LOOKUP_TOKENS, BenchConfig
from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord
from specctl.models.fingerprint import model_fingerprint
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.jobs.records import output_line
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.sizing import make_runner, set_exact
from specctl.runtime.jobs.tokenization import kv_rows, to_request
from specctl.store import Store


@dataclass
class RunResult:
    wall: float
    outputs: dict[int, list[list[int]]]          # index -> token ids per turn
    residency: dict[int, float]                  # index -> seconds in a slot / batch
    lines: list[dict] = field(default_factory=list)   # specctl: output lines (accept lengths)
    stats: object | None = None
    captures: int = 0     # CUDA graph shapes captured inside the timed span (bench.conditions)

    @property
    def new_tokens(self) -> int:
        return sum(len(a) for turns in self.outputs.values() for a in turns)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SpecctlMethod:
    engine = "specctl"

    def __init__(self, cfg: BenchConfig, name: str, model, model_dir: Path, tk, store: Store,
                 log):
        self.cfg, self.name, self.model, self.model_dir = cfg, name, model, model_dir
        self.tk, self.store = tk, store
        seen: set[str] = set()

        def once(msg: str) -> None:   # make_drafter says which artifact it used: say it once
            if msg not in seen:
                seen.add(msg)
                log(msg)
        self.log = once
        # fails here (SpecctlError) when the method's artifact is missing, or its --exact on
        # this machine and dtype: the method is skipped
        gcfg = cfg.generate_config(name, 1)
        make_drafter(gcfg, model, model_dir, store, self.log)
        if gcfg.exact:
            set_exact(model, gcfg)
            model.set_exact(False)

    def run(self, recs: list[PromptRecord], batch_size: int, max_tokens: int,
            size_like: tuple[list[PromptRecord], int] | None = None) -> RunResult:
        """One run, through the runner `generate` builds for the same options (make_runner:
        slots, KV rows and budget, controller, threads). The drafter and controller are new
        each time, warm-up and repeats alike: a row times what one `generate` run does, from
        the priors (bench.report.CARRIED says so with every table). size_like: (records, max
        tokens) to size the runner for instead (a warm-up sized as the timed runs are keeps
        the model's KV cache, and so the graphs captured on it, for them)."""
        gcfg = replace(self.cfg.generate_config(self.name, batch_size), max_tokens=max_tokens)
        drafter = make_drafter(gcfg, self.model, self.model_dir, self.store, self.log)
        reqs = [to_request(r, max_tokens) for r in recs]
        sizing = reqs if size_like is None else [to_request(r, size_like[1])
                                                 for r in size_like[0]]
        runner = make_runner(gcfg, self.model, drafter, self.tk,
                             [kv_rows(self.tk, r)[1] for r in sizing], store=self.store,
                             fingerprint=model_fingerprint(self.model_dir), log=self.log)
        done: list[Request] = []
        dev = self.model.device
        _sync(dev)
        # counted over the timed span only: a runner that captures its shapes as it is built
        # (above) keeps them out of the clock; one that captures while it runs does not
        shapes = graph_captures(self.model)
        t0 = time.perf_counter()
        stats = runner.run(reqs, done.append)
        _sync(dev)
        wall = time.perf_counter() - t0
        # (a fallback count by the cache's size shrinks when the cache is let go: never below 0)
        shapes = max(0, graph_captures(self.model) - shapes)
        done.sort(key=lambda r: r.index)
        return RunResult(wall, {r.index: [list(a) for a in r.answer_ids] for r in done},
                         {r.index: r.wall_time for r in done},
                         [output_line(r) for r in done], stats, shapes)


class HFMethod:
    """transformers' generate on the same checkpoint: static batches, left padding."""
    engine = "transformers"

    def __init__(self, name: str, hf_model, tk, device: torch.device):
        self.name, self.hf, self.tk, self.device = name, hf_model, tk, device
        tok = tk.tok
        eos = sorted(tk.eos_ids)
        self.eos = set(eos)
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
        self.eos_list = eos

    def _generate(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        from transformers import GenerationConfig

        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):   # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        gc = GenerationConfig(do_sample=False, max_new_tokens=max_new,
                              eos_token_id=self.eos_list or None, pad_token_id=self.pad,
                              prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS
                              if self.name == "hf-prompt-lookup" else None,
                              # hf-static: transformers' fast path (static cache, compiled forward)
                              cache_implementation="static" if self.name == "hf-static" else None)
        with torch.inference_mode():
            out = self.hf.generate(input_ids=ids.to(self.device),
                                   attention_mask=mask.to(self.device), generation_config=gc)
        return out[:, width:].tolist()

    def run(self, recs: list[PromptRecord], batch_size: int, max_tokens: int,
            size_like=None) -> RunResult:   # (size_like: specctl's runners only)
        reqs = [to_request(r, max_tokens) for r in recs]
        resid = {r.index: 0.0 for r in reqs}
        _sync(self.device)
        t0 = time.perf_counter()
        stage = 0
        while True:   # turn k of every request that has one, then turn k + 1 (multi-turn)
            todo = [r for r in reqs if len(r.stages) > stage]
            if not todo:
                break
            for i in range(0, len(todo), batch_size):
                chunk = todo[i:i + batch_size]
                c0 = time.perf_counter()
                outs = self._generate([self.tk.render(r) for r in chunk],
                                      max(r.max_tokens for r in chunk))
                for r, o in zip(chunk, outs):
                    o = o[:r.max_tokens]
                    cut = next((j for j, t in enumerate(o) if t in self.eos), None)
                    o = o if cut is None else o[:cut + 1]   # EOS kept, as the Runner keeps it
                    r.answer_ids.append(o)
                    r.answers.append(self.tk.decode([t for t in o if t not in self.eos]))
                    resid[r.index] += time.perf_counter() - c0
            stage += 1
        _sync(self.device)
        wall = time.perf_counter() - t0
        return RunResult(wall, {r.index: r.answer_ids for r in reqs}, resid)


def _load_hf(model_dir: Path, model, log):
    from transformers import AutoModelForCausalLM

    log("loading the transformers peer (AutoModelForCausalLM) ...")
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=model.dtype)
    except Exception as e:   # noqa: BLE001 - any loading failure is a one-line user error
        raise SpecctlError(f"{model_dir}: transformers could not load the model "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return hf.to(model.device).eval()
