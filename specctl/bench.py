"""`specctl bench` and `specctl report`: every method on the same prompts, in one process.

    res = run_bench(BenchConfig("mt_bench.jsonl", methods=("ar", "draft-verify", "hf")), store)
    md = markdown(res)                      # the tables, for a README
    write_plots(res, out_dir)               # speedup vs batch size, tokens/s per category

What is measured, per (method, batch size):
- specctl methods (`ar`, `draft-verify`, and every later method `runtime.job.make_drafter` knows)
  run through the one `Runner`, greedy, EOS stopping as in `generate`. A fresh drafter per run,
  so adaptive state (draft-verify's gamma) starts the same every time.
- `hf`: transformers' own `generate` on the same checkpoint, device and dtype: static batches of
  `batch_size` prompts in input order, left padding, do_sample=False, the same EOS ids.
  `hf-prompt-lookup`: the same with `prompt_lookup_num_tokens=10` (batch 1 only in transformers).
  `hf-static` (CUDA only): the same with `cache_implementation="static"`, transformers' fast
  path that compiles the forward; its warm-up runs the timed prompts in full (it compiles per
  shape).
- Warm-up: `warmup` untimed runs over the first `batch_size` prompts (16 new tokens at most);
  on CUDA (and always for hf-static) the first warm-up is the whole timed workload, so captured
  graphs and compiled shapes exist before the clock starts.
- Timing: `repeats` runs over all prompts, round-robin over the methods of a batch size; tokens/s = generated tokens / wall seconds of the whole
  run (prefill included; the KV cache allocation is not), the GPU synchronized before and after.
  Reported: the median, min, max and IQR of the repeats.
- Acceptance numbers (mean accepted tokens, CTAR(1..6), share of steps with zero accepted,
  padding ratio a padded batch would have had) come from the first repeat, with the same
  definitions as `generate`'s metrics.json (`runtime.job.metrics`); they are deterministic, and
  later repeats must reproduce the first one's tokens exactly (`repeats_identical`).
- Outputs are compared token for token with `ar` of the same batch size and with `ar` at batch 1
  (run untimed once if batch 1 is not benchmarked). Every specctl method must match; `hf` rows
  are informational (padding and bf16 may change a greedy choice). Where a row differs (from
  `ar`, or between its repeats), `divergence_gaps` measures how close to a tie the model was at
  each sequence's first differing token: in bf16 a near-tie (a logit gap within
  NEAR_TIE_STEPS rounding steps) is flipped by any change of summation order; a large gap
  would be a bug. The table's `= ar` column says which.
- Peak memory: CUDA: torch.cuda.max_memory_allocated over the timed repeats (reset before each;
  it includes every resident model: the HF peer's weights too once loaded), and run_memory_mb,
  the peak minus what was allocated before the run (KV cache and activations).
  CPU: the process's RSS high-water mark (process-wide and never decreasing, so later rows include
  earlier ones).
- Per category (when prompts carry `category`): the run's wall time is attributed to requests in
  proportion to their time in a slot (exact at batch 1), giving tokens/s and speedup per category.

A bench run is stored as `benches/<id>/` with manifest.json, results.json (schema below, see
`RESULTS_SCHEMA`) and table.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specctl import __version__
from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, read_prompts
from specctl.runtime import job
from specctl.runtime.runner import Runner
from specctl.runtime.sequence import Request
from specctl.store import (Store, atomic_write_bytes, atomic_write_json, atomic_write_text,
                           file_sha256, make_manifest, new_id, read_json)

PEERS = ("hf", "hf-prompt-lookup", "hf-static")
PROMPT_LOOKUP_TOKENS = 10
WARMUP_TOKENS = 16
CTAR_W = range(1, 7)

RESULTS_SCHEMA = """
{
  "schema": 1, "id": str, "created": str,
  "config": {BenchConfig fields}, "input": str, "input_sha256": str, "prompts": int,
  "categories": [str],                 # empty when no prompt has a category
  "model": str, "model_fingerprint": str, "device": str, "dtype": str,
  "env": {"specctl", "torch", "transformers", "python", "machine", "cpus", "threads", "gpu"},
  "peak_memory_kind": "cuda_max_allocated" | "process_rss_high_water",
  "reference": str,                    # where the ar batch-1 outputs came from
  "skipped": [{"method", "batch_size" (null = all), "reason"}],
  "rows": [{
    "method", "engine": "specctl" | "transformers", "batch_size",
    "requests", "new_tokens", "steps" (null for transformers),
    "tokens_per_s": {"median", "min", "max", "iqr", "spread_pct", "runs": [float]},
    "wall_s": {"median", "runs": [float]},
    "speedup_vs_ar": float | null,     # median tokens/s over ar's, same batch size
    "mean_accepted_tokens", "acceptance_rate", "ctar": {"1".."6"}, "zero_accept_share",
    "padding_ratio",                   # the five above: null for transformers rows
    "peak_memory_mb",                  # see peak_memory_kind
    "run_memory_mb": float | null,     # CUDA: peak minus what was allocated before the run
                                       # (KV cache + activations); null on CPU
    "matches_ar": bool | null,         # vs ar at the same batch size
    "matches_ar_b1": bool | null,      # vs ar at batch 1
    "mismatch": {"vs", "prompts", "first": {"index", "turn", "token"}} | null,
    "repeats_identical": bool,
    "divergence": {"vs", "differing", "analyzed", "max_gap", "max_steps",  # where it differs
                   "gaps": [{"index", "token", "gap", "step", "steps"}]}
  }],
  "category_rows": [{"method", "batch_size", "category", "requests", "new_tokens",
                     "tokens_per_s": {...as above}, "speedup_vs_ar",
                     "mean_accepted_tokens", "ctar", "zero_accept_share"}],
  "ok": bool                           # every specctl row matched ar
}
"""


@dataclass(frozen=True)
class BenchConfig:
    input: str | None                    # JSONL prompts; None = ShareGPT first turns
    model: str | None = None
    methods: tuple[str, ...] = ("ar", "draft-verify", "hf", "hf-prompt-lookup")
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    max_tokens: int = 256
    repeats: int = 3
    warmup: int = 3
    limit: int | None = None             # first N prompts (ShareGPT default: 16)
    chat: bool = True
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    prefill_chunk: int = 512
    attention: str = "sdpa"
    cuda_graphs: bool = True
    # GenerateConfig fields of the methods (draft-verify's skip_set, max_draft, ...): a new
    # method's options pass through here without changes to the bench
    method_options: dict = field(default_factory=dict)

    def __post_init__(self):
        known = job.METHODS + PEERS
        bad = [m for m in self.methods if m.partition(":")[0] not in known]
        if bad:
            raise SpecctlError(f"unknown method {bad[0]!r} (available: {', '.join(known)})")
        if not self.methods:
            raise SpecctlError("--methods is empty")
        if len(set(self.methods)) != len(self.methods):
            raise SpecctlError("--methods names a method twice")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise SpecctlError("--batch-sizes must be positive integers")
        if self.max_tokens < 1:
            raise SpecctlError("--max-tokens must be at least 1")
        if self.repeats < 1:
            raise SpecctlError("--repeats must be at least 1")
        if self.warmup < 0:
            raise SpecctlError("--warmup must be at least 0")
        if self.limit is not None and self.limit < 1:
            raise SpecctlError("--limit must be at least 1")
        job.check_attention(self.attention)
        for m in self.methods:   # the checks generate makes (draft-verify's options too)
            if m.partition(":")[0] in job.METHODS:
                self.generate_config(m, self.batch_sizes[0])

    def generate_config(self, method: str, batch_size: int) -> job.GenerateConfig:
        """method may name a variant ('self-draft:no-corpus'): its settings override."""
        base, overrides = job.split_variant(method)
        opts = {**self.method_options, **overrides}
        return job.GenerateConfig(input=self.input or "sharegpt", model=self.model,
                                  method=base, batch_size=batch_size,
                                  max_tokens=self.max_tokens, temperature=0.0, seed=self.seed,
                                  chat=self.chat, device=self.device, dtype=self.dtype,
                                  prefill_chunk=self.prefill_chunk, attention=self.attention,
                                  cuda_graphs=self.cuda_graphs, **opts)


def parse_list(text: str, what: str, conv=str) -> tuple:
    try:
        items = tuple(conv(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecctlError(f"{what}: expected a comma-separated list, got {text!r}") from None
    if not items:
        raise SpecctlError(f"{what} is empty")
    return items


# ---------------------------------------------------------------------------------------------
# prompts


def _load_prompts(cfg: BenchConfig, store: Store, log) -> tuple[list[PromptRecord], str, str]:
    """(records, input description, input sha256)."""
    if cfg.input is None:
        from specctl.io.sharegpt import first_human_turns
        texts = first_human_turns(cfg.limit or 16, store, log=log)
        recs = [PromptRecord(i, i + 1, None, None, None, (({"role": "user", "content": t},),),
                             None, t) for i, t in enumerate(texts)]
        sha = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
        return recs, f"sharegpt:{len(texts)}", sha
    path = Path(cfg.input)
    recs = read_prompts(path)
    if cfg.limit:
        recs = recs[:cfg.limit]
    if not cfg.chat:
        for r in recs:
            if r.raw_prompt is None:
                raise SpecctlError(f"{path}:{r.line_no}: --no-chat needs a 'prompt' line "
                                   "(messages and turns need the chat template)")
    return recs, str(path.resolve()), file_sha256(path)


def _requests(recs: list[PromptRecord], max_tokens: int) -> list[Request]:
    """Fresh Request objects (they are filled in as they run)."""
    out = []
    for r in recs:
        meta = {"index": r.index}
        if r.category is not None:
            meta["category"] = r.category
        out.append(Request(r.index, [list(s) for s in r.turns], r.max_tokens or max_tokens,
                           r.raw_prompt, meta))
    return out


# ---------------------------------------------------------------------------------------------
# one timed run


@dataclass
class RunResult:
    wall: float
    outputs: dict[int, list[list[int]]]          # index -> token ids per turn
    residency: dict[int, float]                  # index -> seconds in a slot / batch
    lines: list[dict] = field(default_factory=list)   # specctl: output lines (accept lengths)
    stats: object | None = None

    @property
    def new_tokens(self) -> int:
        return sum(len(a) for turns in self.outputs.values() for a in turns)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SpecctlMethod:
    engine = "specctl"

    def __init__(self, cfg: BenchConfig, name: str, model, model_dir: Path, tk, store: Store,
                 max_len: int, log):
        self.cfg, self.name, self.model, self.model_dir = cfg, name, model, model_dir
        self.tk, self.store, self.max_len = tk, store, max_len
        seen: set[str] = set()

        def once(msg: str) -> None:   # make_drafter says which artifact it used: say it once
            if msg not in seen:
                seen.add(msg)
                log(msg)
        self.log = once
        # fails here (SpecctlError) when the method's artifact is missing: the method is skipped
        job.make_drafter(cfg.generate_config(name, 1), model, model_dir, store, self.log)

    def run(self, recs: list[PromptRecord], batch_size: int, max_tokens: int) -> RunResult:
        gcfg = self.cfg.generate_config(self.name, batch_size)
        drafter = job.make_drafter(gcfg, self.model, self.model_dir, self.store, self.log)
        runner = Runner(self.model, drafter, gcfg.sampling(), batch_size=batch_size,
                        max_len=self.max_len, eos_ids=self.tk.eos_ids, render=self.tk.render,
                        decode=self.tk.decode, prefill_chunk=self.cfg.prefill_chunk,
                        speculate=gcfg.speculate)
        reqs = _requests(recs, max_tokens)
        done: list[Request] = []
        dev = self.model.device
        _sync(dev)
        t0 = time.perf_counter()
        stats = runner.run(reqs, done.append)
        _sync(dev)
        wall = time.perf_counter() - t0
        done.sort(key=lambda r: r.index)
        return RunResult(wall, {r.index: [list(a) for a in r.answer_ids] for r in done},
                         {r.index: r.wall_time for r in done},
                         [job.output_line(r) for r in done], stats)


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

    def run(self, recs: list[PromptRecord], batch_size: int, max_tokens: int) -> RunResult:
        reqs = _requests(recs, max_tokens)
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


# ---------------------------------------------------------------------------------------------
# numbers


def spread(values: list[float]) -> dict:
    v = sorted(values)
    med = statistics.median(v)
    if len(v) >= 2:
        q = statistics.quantiles(v, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return {"median": round(med, 3), "min": round(v[0], 3), "max": round(v[-1], 3),
            "iqr": round(iqr, 3), "spread_pct": round(100 * (v[-1] - v[0]) / med, 2) if med else 0.0,
            "runs": [round(x, 3) for x in values]}


def accept_numbers(gcfg, lines: list[dict], stats, device) -> dict:
    """The acceptance numbers of `generate`'s metrics (same definitions), plus zero-accept share."""
    m = job.metrics(gcfg, lines, stats, 0.0, device)
    acc = [a for l in lines for a in l["accept_lengths"]]
    return {"steps": m["steps"], "mean_accepted_tokens": m["mean_accepted_tokens"],
            "acceptance_rate": m["acceptance_rate"],
            "ctar": {str(w): m["ctar"][w] for w in CTAR_W},
            "zero_accept_share": round(sum(a == 0 for a in acc) / len(acc), 4) if acc else 0.0,
            "padding_ratio": m["padding_ratio"] if stats is not None else None,
            "speculation": m["speculation"]}


def compare(got: dict[int, list[list[int]]], ref: dict[int, list[list[int]]], vs: str) -> dict | None:
    """None when identical; else how many prompts differ and where the first difference is."""
    bad, first = [], None
    for i in sorted(ref):
        a, b = got.get(i, []), ref[i]
        if a == b:
            continue
        bad.append(i)
        if first is None:
            for k in range(max(len(a), len(b))):
                x = a[k] if k < len(a) else []
                y = b[k] if k < len(b) else []
                if x != y:
                    j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                    first = {"index": i, "turn": k, "token": j}
                    break
    return None if not bad else {"vs": vs, "prompts": len(bad), "of": len(ref), "first": first}


MAX_DIVERGENCES = 64   # sequences analyzed per row


@torch.inference_mode()
def divergence_gaps(model, render, recs: list[PromptRecord], got: dict[int, list[list[int]]],
                    ref: dict[int, list[list[int]]]) -> list[dict]:
    """Where a sequence's first answer leaves the reference's, how close the model was to a tie.

    For each request (at most MAX_DIVERGENCES) whose first-turn tokens differ from the
    reference's at position j while both have a token there: one eager forward of the model
    over the prompt and the common prefix, and the logit of the reference's token minus that of
    the other at j (fp32 logits, from the model in its own dtype). A gap within a step or two
    of the dtype's rounding (`step`: the spacing of the top logit in that dtype) is a near-tie
    that any change in summation order can flip: a forward over more tokens, another kernel, or
    a non-repeatable one. A large gap would be a real difference.
    """
    from specctl.engine.batch import ForwardBatch, SeqInput

    out = []
    for r in recs:
        a, b = got.get(r.index, [[]]), ref.get(r.index, [[]])
        x, y = (a[0] if a else []), (b[0] if b else [])
        j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), None)
        if j is None:
            continue
        req = Request(r.index, [list(t) for t in r.turns], 1, r.raw_prompt)
        ids = list(render(req)) + y[:j]
        kv = model.new_kv_cache(1, len(ids) + 1)
        h = model.forward(ForwardBatch([SeqInput(0, ids, 0)], model.device), kv)
        logits = model.logits(h[-1:])[0]
        top = float(logits.max())
        top = abs(top) if math.isfinite(top) and top != 0 else 1.0
        step = torch.finfo(model.dtype).eps * 2.0 ** math.floor(math.log2(top))
        gap = float(logits[y[j]] - logits[x[j]])
        out.append({"index": r.index, "token": j, "gap": round(gap, 6), "step": step,
                    "steps": round(abs(gap) / step, 2) if math.isfinite(gap) else None})
        if len(out) >= MAX_DIVERGENCES:
            break
    return out


def _peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _category_tps(run: RunResult, cats: dict[int, str]) -> dict[str, float]:
    total = sum(run.residency.values()) or 1.0
    out = {}
    for c in sorted(set(cats.values())):
        idx = [i for i in run.outputs if cats[i] == c]
        wall = run.wall * sum(run.residency[i] for i in idx) / total
        tokens = sum(len(a) for i in idx for a in run.outputs[i])
        out[c] = tokens / wall if wall > 0 else 0.0
    return out


# ---------------------------------------------------------------------------------------------
# the bench


class _NoProgress:
    def start(self, total: int) -> None: ...
    def describe(self, text: str) -> None: ...
    def advance(self) -> None: ...
    def stop(self) -> None: ...


def _env(device: torch.device) -> dict:
    import transformers
    return {"specctl": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}


def run_bench(cfg: BenchConfig, store: Store, log: Callable[[str], None] = print,
              progress=None) -> dict:
    """Run the bench, store it as benches/<id>; returns the results (see RESULTS_SCHEMA)."""
    from specctl.models.checkpoint import resolve_model
    from specctl.models.loader import load_model, model_fingerprint

    progress = progress or _NoProgress()
    recs, input_desc, input_sha = _load_prompts(cfg, store, log)
    model_dir = resolve_model(cfg.model, store, log=log)
    tk = job.Tokenization(model_dir, cfg.chat)
    model = load_model(model_dir, cfg.device, cfg.dtype, cuda_graphs=cfg.cuda_graphs,
                       attention=cfg.attention)
    job.warn_flex_off_cuda(model, log)
    dev = model.device
    ctx = model.cfg.max_position
    need = 16
    for r in _requests(recs, cfg.max_tokens):
        n, rows = job.kv_rows(tk, r)
        if n >= ctx:
            raise SpecctlError(f"{input_desc}:{recs[r.index].line_no}: prompt is {n} tokens, "
                               f"longer than the model's context ({ctx})")
        need = max(need, rows)
    max_len = min(ctx, need + 32)
    cats = {r.index: r.category or "uncategorized" for r in recs}
    has_cats = any(r.category is not None for r in recs)

    # which (method, batch size) run, which are skipped and why
    methods = list(cfg.methods)
    if "ar" not in methods:
        methods.insert(0, "ar")
        log("ar is added: it is the baseline for speedups and outputs")
    else:
        methods.remove("ar")
        methods.insert(0, "ar")
    skipped: list[dict] = []
    runners: dict[str, object] = {}
    hf_model = None
    lookup_reason = "transformers' prompt lookup decoding supports batch size 1 only"
    for m in methods:
        if m in PEERS:
            if m == "hf-static" and dev.type != "cuda":
                reason = "transformers' static-cache (compiled) generate is measured on CUDA only"
                skipped.append({"method": m, "batch_size": None, "reason": reason})
                log(f"skipping {m}: {reason}")
                continue
            if m == "hf-prompt-lookup" and 1 not in cfg.batch_sizes:
                continue   # skipped below, per batch size
            if hf_model is None:
                try:
                    hf_model = _load_hf(model_dir, model, log)
                except SpecctlError as e:
                    skipped.append({"method": m, "batch_size": None, "reason": str(e)})
                    log(f"skipping {m}: {e}")
                    continue
            runners[m] = HFMethod(m, hf_model, tk, dev)
        else:
            try:
                runners[m] = SpecctlMethod(cfg, m, model, model_dir, tk, store, max_len, log)
            except SpecctlError as e:
                skipped.append({"method": m, "batch_size": None, "reason": str(e)})
                log(f"skipping {m}: {e}")
    plan = []
    for b in sorted(set(cfg.batch_sizes)):
        for m in methods:
            if m == "hf-prompt-lookup" and b != 1:
                skipped.append({"method": m, "batch_size": b, "reason": lookup_reason})
                log(f"skipping {m} at batch size {b}: {lookup_reason}")
                continue
            if m not in runners:   # its artifact is missing (said above)
                continue
            plan.append((m, b))
    need_ref = 1 not in cfg.batch_sizes
    progress.start(len(plan) * (cfg.warmup + cfg.repeats) + int(need_ref))

    reference = "ar at batch size 1 (timed)"
    ref_b1 = None
    if need_ref:
        progress.describe("ar b1 (reference outputs, untimed)")
        ref_b1 = runners["ar"].run(recs, 1, cfg.max_tokens).outputs
        progress.advance()
        reference = "ar at batch size 1 (one untimed reference run)"

    rows, cat_rows = [], []
    ar_rows: dict[int, dict] = {}
    ar_out: dict[int, dict] = {}
    ar_cat: dict[int, dict[str, float]] = {}
    runs_of: dict[tuple[str, int], list[RunResult]] = {}
    peak: dict[tuple[str, int], float] = {}
    extra: dict[tuple[str, int], float] = {}
    for b in sorted(set(cfg.batch_sizes)):
        here = [m for m, bb in plan if bb == b]
        for m in here:   # warm-up, then the repeats round-robin over the methods (drift and
            for w in range(cfg.warmup):   # background load hit every method alike)
                progress.describe(f"{m} b{b}  warm-up {w + 1}/{cfg.warmup}")
                if m == "hf-static" or (dev.type == "cuda" and w == 0):
                    # compiled / graph-captured paths: warm up once on the timed shapes, so the
                    # timed runs replay instead of compiling or capturing
                    runners[m].run(recs, b, cfg.max_tokens)
                else:
                    runners[m].run(recs[:b], b, min(cfg.max_tokens, WARMUP_TOKENS))
                progress.advance()
        for k in range(cfg.repeats):
            for m in here:
                progress.describe(f"{m} b{b}  repeat {k + 1}/{cfg.repeats}")
                base_mb = 0.0
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                    base_mb = torch.cuda.memory_allocated(dev) / 2**20
                runs_of.setdefault((m, b), []).append(runners[m].run(recs, b, cfg.max_tokens))
                p = _peak_mb(dev)
                peak[(m, b)] = max(peak.get((m, b), 0.0), p)
                if dev.type == "cuda":
                    extra[(m, b)] = max(extra.get((m, b), 0.0), round(p - base_mb, 1))
                progress.advance()

    for m, b in plan:
        meth = runners[m]
        label = f"{m} b{b}"
        runs = runs_of[(m, b)]
        first = runs[0]
        tps = [r.new_tokens / r.wall if r.wall > 0 else 0.0 for r in runs]
        row = {"method": m, "engine": meth.engine, "batch_size": b, "requests": len(first.outputs),
               "new_tokens": first.new_tokens, "steps": None,
               "tokens_per_s": spread(tps), "wall_s": {"median": round(statistics.median(
                   r.wall for r in runs), 4), "runs": [round(r.wall, 4) for r in runs]},
               "speedup_vs_ar": None, "mean_accepted_tokens": None, "acceptance_rate": None,
               "ctar": None, "zero_accept_share": None, "padding_ratio": None,
               "speculation": None,
               "peak_memory_mb": peak[(m, b)], "run_memory_mb": extra.get((m, b)),
               "matches_ar": None, "matches_ar_b1": None,
               "mismatch": None,
               "repeats_identical": all(r.outputs == first.outputs for r in runs[1:])}
        if meth.engine == "specctl":
            row.update(accept_numbers(cfg.generate_config(m, b), first.lines, first.stats, dev))
        if m == "ar":
            ar_rows[b], ar_out[b] = row, first.outputs
            if b == 1:
                ref_b1 = first.outputs
        base = ar_rows.get(b)
        if base and base["tokens_per_s"]["median"]:
            row["speedup_vs_ar"] = round(row["tokens_per_s"]["median"] /
                                         base["tokens_per_s"]["median"], 4)
        d_same = compare(first.outputs, ar_out[b], f"ar b{b}")
        d_b1 = compare(first.outputs, ref_b1, "ar b1")
        row["matches_ar"], row["matches_ar_b1"] = d_same is None, d_b1 is None
        row["mismatch"] = d_same or d_b1
        if not row["repeats_identical"]:
            log(f"{label}: the repeats did not produce identical tokens")
        if meth.engine == "specctl" and (row["mismatch"] or not row["repeats_identical"]):
            log(f"{label}: outputs differ from {row['mismatch']['vs'] if row['mismatch'] else 'its first repeat'}")
        rows.append(row)

        if has_cats:
            per_run = [_category_tps(r, cats) for r in runs]
            if m == "ar":
                ar_cat[b] = {c: statistics.median(p[c] for p in per_run) for c in per_run[0]}
            for c in per_run[0]:
                idx = [i for i in first.outputs if cats[i] == c]
                cr = {"method": m, "batch_size": b, "category": c, "requests": len(idx),
                      "new_tokens": sum(len(a) for i in idx for a in first.outputs[i]),
                      "tokens_per_s": spread([p[c] for p in per_run]), "speedup_vs_ar": None,
                      "mean_accepted_tokens": None, "ctar": None, "zero_accept_share": None}
                ar_c = ar_cat.get(b, {}).get(c)
                if ar_c:
                    cr["speedup_vs_ar"] = round(cr["tokens_per_s"]["median"] / ar_c, 4)
                if meth.engine == "specctl":
                    sub = [l for l in first.lines if cats[l["index"]] == c]
                    a = accept_numbers(cfg.generate_config(m, b), sub, None, dev)
                    cr.update({k: a[k] for k in ("mean_accepted_tokens", "ctar",
                                                 "zero_accept_share")})
                cat_rows.append(cr)
        log(f"{label}: {row['tokens_per_s']['median']:.1f} tokens/s"
            + (f", {row['speedup_vs_ar']:.2f}x ar" if row["speedup_vs_ar"] else "")
            + (f", mean accepted tokens {row['mean_accepted_tokens']}"
               if row["mean_accepted_tokens"] is not None else ""))
    for row in rows:   # after every timed run: the analysis runs the model on its own cache
        m, b = row["method"], row["batch_size"]
        runs = runs_of[(m, b)]
        try:
            if row["mismatch"]:
                vs = row["mismatch"]["vs"]
                ref, got = (ar_out[b] if vs == f"ar b{b}" else ref_b1), runs[0].outputs
            elif not row["repeats_identical"]:
                vs = "its first repeat"
                ref = runs[0].outputs
                got = next(r.outputs for r in runs[1:] if r.outputs != ref)
            else:
                continue
            gaps = divergence_gaps(model, tk.render, recs, got, ref)
        except Exception as e:   # noqa: BLE001 - a diagnosis must not cost the timed results
            log(f"{m} b{b}: the divergence analysis failed ({type(e).__name__}: {e})")
            continue
        steps = [g["steps"] for g in gaps]
        if gaps and None not in steps:
            row["divergence"] = {
                "vs": vs, "differing": sum(1 for i in ref if got.get(i) != ref[i]),
                "analyzed": len(gaps), "max_gap": max(abs(g["gap"]) for g in gaps),
                "max_steps": max(steps), "gaps": gaps}
            d = row["divergence"]
            log(f"{m} b{b}: first divergences from {vs} at logit gaps up to {d['max_gap']:.3g} "
                f"({d['max_steps']:g} rounding steps of the top logit in "
                f"{str(model.dtype).replace('torch.', '')}; {d['analyzed']} of {d['differing']} "
                "differing sequences read: first answers only)")
    progress.stop()

    ok = all(r["matches_ar"] and r["matches_ar_b1"] and r["repeats_identical"]
             for r in rows if r["engine"] == "specctl")
    bench_id = new_id("bench-")
    res = {"schema": 1, "id": bench_id, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "config": asdict(cfg), "input": input_desc, "input_sha256": input_sha,
           "prompts": len(recs), "categories": sorted(set(cats.values())) if has_cats else [],
           "model": str(model_dir), "model_fingerprint": model_fingerprint(model_dir),
           "device": str(dev), "dtype": str(model.dtype).replace("torch.", ""), "env": _env(dev),
           "peak_memory_kind": "cuda_max_allocated" if dev.type == "cuda"
           else "process_rss_high_water", "reference": reference,
           "skipped": skipped, "rows": rows, "category_rows": cat_rows, "ok": ok}
    manifest = make_manifest("bench", bench_id, input=input_desc, input_sha256=input_sha,
                             model=str(model_dir), model_fingerprint=res["model_fingerprint"],
                             config=asdict(cfg), device=res["device"], ok=ok)
    with store.building("benches", bench_id, manifest) as d:
        atomic_write_json(d / "results.json", res)
        atomic_write_text(d / "table.md", markdown([res]))
    res["path"] = str(store.path("benches", bench_id))
    return res


def _load_hf(model_dir: Path, model, log):
    from transformers import AutoModelForCausalLM

    log("loading the transformers peer (AutoModelForCausalLM) ...")
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=model.dtype)
    except Exception as e:   # noqa: BLE001 - any loading failure is a one-line user error
        raise SpecctlError(f"{model_dir}: transformers could not load the model "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return hf.to(model.device).eval()


def mismatch_error(res: dict) -> SpecctlError | None:
    bad = []
    for r in res["rows"]:
        if r["engine"] != "specctl":
            continue
        if r["mismatch"]:
            mm = r["mismatch"]
            f = mm["first"]
            bad.append(f"{r['method']} b{r['batch_size']} vs {mm['vs']}: {mm['prompts']} of "
                       f"{mm['of']} prompts (first: prompt {f['index']}, turn {f['turn']}, "
                       f"token {f['token']})")
        elif not r["repeats_identical"]:
            bad.append(f"{r['method']} b{r['batch_size']}: repeats gave different tokens")
    if not bad:
        return None
    if res.get("dtype") not in ("float32", "torch.float32", "fp32"):
        # bf16/fp16: a forward over a different number of tokens (or another batch shape)
        # rounds differently, so near-ties can flip and the text diverges from there on. That
        # is reported (match rate per row), not an error: fp32 is the exact lossless check.
        return None
    return SpecctlError("outputs differ from ar greedy: " + "; ".join(bad) +
                        f" (results stored in {res.get('path', 'the store')})", exit_code=1)


# ---------------------------------------------------------------------------------------------
# stored runs, tables, plots


def load_benches(store: Store, idents: list[str], all_runs: bool = False) -> list[dict]:
    if idents:
        entries = []
        for i in idents:
            e = store.find(i)
            if e.kind != "benches":
                raise SpecctlError(f"{i!r} is a {e.kind} artifact, not a bench run")
            entries.append(e)
    else:
        entries = sorted(store.entries("benches"), key=lambda e: e.manifest.get("created", ""))
        if not entries:
            raise SpecctlError(f"no bench runs in the store at {store.root}: run `specctl bench` first")
        if not all_runs:
            entries = entries[-1:]
    out = []
    for e in entries:
        res = read_json(e.path / "results.json")
        if not isinstance(res, dict) or "rows" not in res:
            raise SpecctlError(f"{e.path / 'results.json'}: not a bench result")
        res["path"] = str(e.path)
        out.append(res)
    return out


def _f(x, nd=2, pct=False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:.{nd}f}"


def _match(r: dict) -> str:
    if r["matches_ar"] is None:
        return "-"
    if r["matches_ar"] and r["matches_ar_b1"] and r["repeats_identical"]:
        return "yes"
    d = r.get("divergence")
    gap = ""
    if d:   # how close to a tie the first divergences were (divergence_gaps)
        gap = (f"near-ties, gap ≤ {d['max_gap']:.3g}" if d["max_steps"] <= NEAR_TIE_STEPS
               else f"gap up to {d['max_gap']:.3g}")
        if d["analyzed"] < d.get("differing", d["analyzed"]):
            gap += f" ({d['analyzed']} of {d['differing']} read)"
        gap = "; " + gap
    if not r["repeats_identical"]:
        if d and d["vs"] != "its first repeat":
            gap = f"; vs {d['vs']}:{gap[1:]}"
        return f"NO (repeats differ{gap})"
    mm = r["mismatch"]
    return f"NO ({mm['prompts']}/{mm['of']} vs {mm['vs']}{gap})"


NEAR_TIE_STEPS = 2   # a gap within this many rounding steps of the top logit is a near-tie


TABLE_COLUMNS = ("method", "batch", "tokens/s", "min–max", "speedup", "mean acc.",
                 "CTAR 1..6", "zero acc.", "padding", "peak MB", "= ar")


def table_rows(res: dict) -> list[list[str]]:
    out = []
    for r in res["rows"]:
        t = r["tokens_per_s"]
        ctar = "/".join(f"{r['ctar'][str(w)]:.2f}" for w in CTAR_W) if r["ctar"] else "-"
        out.append([r["method"], str(r["batch_size"]), f"{t['median']:.1f}",
                    f"{t['min']:.1f}–{t['max']:.1f}", _f(r["speedup_vs_ar"]) + ("x" if
                    r["speedup_vs_ar"] is not None else ""), _f(r["mean_accepted_tokens"]), ctar,
                    _f(r["zero_accept_share"], pct=True), _f(r["padding_ratio"], pct=True),
                    f"{r['peak_memory_mb']:.0f}", _match(r)])
    return out


CATEGORY_COLUMNS = ("category", "method", "batch", "tokens/s", "min–max", "speedup",
                    "mean acc.", "zero acc.")


def category_rows(res: dict) -> list[list[str]]:
    out = []
    for r in sorted(res.get("category_rows", []),
                    key=lambda r: (r["category"], r["batch_size"])):
        t = r["tokens_per_s"]
        out.append([r["category"], r["method"], str(r["batch_size"]), f"{t['median']:.1f}",
                    f"{t['min']:.1f}–{t['max']:.1f}",
                    _f(r["speedup_vs_ar"]) + ("x" if r["speedup_vs_ar"] is not None else ""),
                    _f(r["mean_accepted_tokens"]), _f(r["zero_accept_share"], pct=True)])
    return out


def title(res: dict) -> str:
    c = res["config"]
    model = Path(res["model"]).name
    engine = ""
    if res["device"].startswith("cuda"):
        engine = (" " + c.get("attention", "sdpa") + " attention"
                  + (", CUDA graphs" if c.get("cuda_graphs", True) else ", no CUDA graphs"))
    return (f"{res['id']}: {model}, {res['device']} {res['dtype']}{engine}, "
            f"{res['prompts']} prompts, "
            f"max {c['max_tokens']} new tokens, greedy, "
            + (f"median of {c['repeats']} repeats" if c["repeats"] > 1 else "1 repeat"))


def notes(res: dict) -> list[str]:
    out = []
    for s in res["skipped"]:
        where = f" at batch size {s['batch_size']}" if s["batch_size"] is not None else ""
        out.append(f"skipped {s['method']}{where}: {s['reason']}")
    mem = ("peak MB: torch.cuda.max_memory_allocated per config (all resident models)"
           if res["peak_memory_kind"] == "cuda_max_allocated"
           else "peak MB: process RSS high-water mark (process-wide, includes earlier rows)")
    out.append(mem + "; tokens/s: median of the repeats, min–max their spread; "
               "CTAR w = share of steps accepting more than w drafts")
    return out


def _md_table(cols, rows) -> str:
    esc = lambda s: str(s).replace("|", "\\|")   # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(esc(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(results: list[dict]) -> str:
    parts = []
    for res in results:
        parts.append(f"### {title(res)}\n")
        parts.append(_md_table(TABLE_COLUMNS, table_rows(res)) + "\n")
        if res.get("category_rows"):
            parts.append("Per category:\n")
            parts.append(_md_table(CATEGORY_COLUMNS, category_rows(res)) + "\n")
        parts.append("\n".join(f"- {n}" for n in notes(res)) + "\n")
    return "\n".join(parts)


def write_plots(res: dict, out_dir: Path, prefix: str = "") -> list[Path]:
    """speedup vs batch size per method; tokens/s per category (if any). Needs matplotlib."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        p = out_dir / f"{prefix}{name}"
        atomic_write_bytes(p, buf.getvalue())
        written.append(p)

    rows = res["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for m in methods:
        pts = sorted((r["batch_size"], r["speedup_vs_ar"]) for r in rows
                     if r["method"] == m and r["speedup_vs_ar"] is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m,
                    linestyle="--" if m == "ar" else "-")
    ax.set_xscale("log", base=2)
    bs = sorted({r["batch_size"] for r in rows})
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over ar (median tokens/s)")
    ax.set_title(f"{Path(res['model']).name}, {res['device']} {res['dtype']}")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "speedup.png")

    crows = res.get("category_rows") or []
    if crows:
        cats = sorted({r["category"] for r in crows})
        sizes = sorted({r["batch_size"] for r in crows})
        fig = Figure(figsize=(max(6, 1.2 * len(cats)) , 3.5 * len(sizes)))
        for k, b in enumerate(sizes):
            ax = fig.add_subplot(len(sizes), 1, k + 1)
            ms = list(dict.fromkeys(r["method"] for r in crows if r["batch_size"] == b))
            width = 0.8 / max(len(ms), 1)
            for j, m in enumerate(ms):
                by = {r["category"]: r["tokens_per_s"]["median"] for r in crows
                      if r["batch_size"] == b and r["method"] == m}
                ax.bar([i + j * width for i in range(len(cats))], [by.get(c, 0) for c in cats],
                       width, label=m)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))], cats, rotation=30,
                          ha="right")
            ax.set_ylabel("tokens/s")
            ax.set_title(f"batch size {b}")
            ax.legend(fontsize="small")
        fig.tight_layout()
        save(fig, "category_tokens_per_s.png")
    return written
