"""A `generate` job: prompts file -> requests -> Runner -> output file + a run record in the store.

Crash safety: every finished request is appended to `runs/<id>/records.jsonl` (flushed and
fsynced) the moment it finishes, so Ctrl-C or a crash loses nothing already generated; a resumed
run (same input file contents and settings) skips the requests it already has. The ordered output
file and metrics are written atomically once all requests are done.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, read_prompts
from specctl.models.checkpoint import load_tokenizer, resolve_model
from specctl.models.loader import load_model
from specctl.runtime.runner import Runner, RunStats
from specctl.runtime.sequence import Request
from specctl.spec.drafter import NoDraft
from specctl.spec.verify import SamplingParams
from specctl.store import Store, atomic_write_json, atomic_write_text, file_sha256, make_manifest, new_id

METHODS = ("ar", "draft-verify", "kangaroo", "self-draft")
# named ablations a benchmark can run beside the method itself ("self-draft:no-corpus")
VARIANTS = {"self-draft": {"no-corpus": {"corpus_cache": "none"},
                           "no-context": {"context_cache": False}}}


def split_variant(spec: str) -> tuple[str, dict]:
    """'self-draft:no-corpus' -> ('self-draft', {'corpus_cache': 'none'}); 'ar' -> ('ar', {})."""
    method, _, variant = spec.partition(":")
    if not variant:
        return method, {}
    known = VARIANTS.get(method, {})
    if variant not in known:
        have = ", ".join(f"{m}:{v}" for m, vs in VARIANTS.items() for v in vs)
        raise SpecctlError(f"unknown method variant {spec!r} (available: {have})")
    return method, dict(known[variant])


@dataclass(frozen=True)
class GenerateConfig:
    input: str
    model: str | None = None
    method: str = "ar"
    batch_size: int = 8
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    chat: bool = True
    stop: tuple[str, ...] = ()
    device: str = "auto"
    dtype: str = "auto"
    skip_bad: bool = False
    prefill_chunk: int = 512
    # draft-verify
    skip_set: str | None = None
    max_draft: int = 12
    gamma0: float = 0.6
    alpha: float = 0.9
    eps: float = 0.01
    beta1: float = 0.5
    beta2: float = 0.9
    # kangaroo
    adapter: str | None = None
    eta: float = 0.6
    kangaroo_gamma: int = 6
    # self-draft
    corpus_cache: str | None = None   # cache id/path; None = the model's newest; "none" = off
    branches: int = 6
    branch_len: int = 6
    gram: int = 4
    context_cands: int = 10
    corpus_cands: int = 3
    context_cache: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise SpecctlError(f"unknown method {self.method!r} (available: {', '.join(METHODS)})")
        if self.batch_size < 1:
            raise SpecctlError("--batch-size must be at least 1")
        if self.max_tokens < 1:
            raise SpecctlError("--max-tokens must be at least 1")
        self.exit_params()
        self.self_draft_params()
        try:
            self.sampling()
        except ValueError as e:   # "top_p must be ..." -> "--top-p must be ..." (the option's name)
            raise SpecctlError("--" + str(e).replace("_", "-", 1)) from None

    def exit_params(self):
        from specctl.spec.draft_verify import ExitParams
        try:
            return ExitParams(self.max_draft, self.gamma0, self.eps, self.beta1, self.beta2,
                              self.alpha)
        except ValueError as e:
            raise SpecctlError(f"draft-verify: {e}") from None

    def self_draft_params(self):
        from specctl.spec.self_draft import SelfDraftParams
        try:
            return SelfDraftParams(self.branches, self.branch_len, self.gram, self.context_cands,
                                   self.corpus_cands, context_cache=self.context_cache,
                                   corpus_cache=self.corpus_cache != "none", seed=self.seed)
        except ValueError as e:
            raise SpecctlError(f"self-draft: --{str(e).replace('_', '-', 1)}") from None

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def key(self, input_sha: str) -> str:
        """What makes two runs the same run (for --resume)."""
        d = asdict(self)
        d.pop("skip_bad")
        return hashlib.sha256(json.dumps([d, input_sha], sort_keys=True).encode()).hexdigest()[:16]


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

    def render(self, req: Request) -> list[int]:
        if not self.chat:
            return self.tok.encode(req.raw_prompt)
        text = self.tok.apply_chat_template(req.history(), add_generation_prompt=True,
                                            tokenize=False)
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def make_drafter(cfg: GenerateConfig, model, model_dir: Path, store: Store, log):
    """The method's drafter, with its artifact found in the store (and said which)."""
    if cfg.method == "ar":
        return NoDraft()
    from specctl.models.loader import model_fingerprint
    if cfg.method == "kangaroo":
        from specctl.prep.train_adapter import resolve_adapter
        from specctl.spec.kangaroo import KangarooDrafter, KangarooParams
        adapter, where = resolve_adapter(cfg.adapter, store, model_fingerprint(model_dir), model)
        log(f"kangaroo: adapter {where} (exit layer {adapter.l})")
        try:
            prm = KangarooParams(cfg.eta, cfg.kangaroo_gamma)
        except ValueError as e:
            raise SpecctlError(f"kangaroo: {e}") from None
        return KangarooDrafter(model, adapter, cfg.sampling(), prm)
    if cfg.method == "self-draft":
        from specctl.spec.self_draft import SelfDraftDrafter
        prm = cfg.self_draft_params()
        corpus, cid = None, None
        if prm.corpus_cache:
            from specctl.spec.corpus_cache import CorpusCache, resolve_corpus_cache
            path = resolve_corpus_cache(store, model_dir, cfg.corpus_cache, log)
            if path is None:
                log("self-draft: no corpus cache for this model's tokenizer in the store "
                    "(build one with `specctl build-cache`); drafting from the context cache only")
            else:
                corpus, cid = CorpusCache.load(path), Path(path).name
                log(f"self-draft: corpus cache {path}")
        return SelfDraftDrafter(prm, corpus, cid)
    if cfg.method != "draft-verify":
        raise SpecctlError(f"unknown method {cfg.method!r}")
    from specctl.prep.skipsets import describe, resolve_skip_set
    from specctl.spec.draft_verify import LayerSkipDrafter

    skip, where = resolve_skip_set(cfg.skip_set, store, model_fingerprint(model_dir),
                                   model.cfg.num_layers)
    log(f"draft-verify: skip set {where}: {describe(skip)}")
    return LayerSkipDrafter(model, skip, cfg.sampling(), cfg.exit_params())


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


def _meta(rec: PromptRecord) -> dict:
    m: dict = {"index": rec.index}
    if rec.id_field:
        m[rec.id_field] = rec.id
    if rec.category is not None:
        m["category"] = rec.category
    return m


def output_line(req: Request) -> dict:
    out = dict(req.meta)
    out["text"] = req.answers[-1] if len(req.answers) == 1 else req.answers[0]
    if len(req.answers) > 1:
        out["turns"] = list(req.answers)
    new = sum(len(a) for a in req.answer_ids)
    out.update(new_tokens=new, steps=req.steps, prompt_tokens=req.prompt_tokens,
               mean_accepted=round(new / req.steps, 4) if req.steps else 0.0,
               accept_lengths=req.accept_lengths, draft_lengths=req.draft_lengths,
               finish_reason=req.finish_reasons[-1] if req.finish_reasons else None,
               wall_time_s=round(req.wall_time, 4))
    return out


def _read_records(path: Path) -> dict[int, dict]:
    done: dict[int, dict] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
                done[int(r["index"])] = r
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue   # a line torn by a crash: that request is simply redone
    return done


def _torn_tail(path: Path) -> bool:
    """True when `path` is non-empty and its last line has no newline (a write cut short)."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:   # missing or empty
        return False


def find_resumable(store: Store, key: str) -> Path | None:
    best = None
    for e in store.entries("runs"):
        if e.manifest.get("key") == key and (best is None or e.manifest.get("created", "") >
                                             best.manifest.get("created", "")):
            best = e
    return best.path if best else None


def metrics(cfg: GenerateConfig, lines: list[dict], stats: RunStats | None, wall: float,
            device: torch.device) -> dict:
    good = [l for l in lines if "error" not in l]
    new = sum(l["new_tokens"] for l in good)
    steps = sum(l["steps"] for l in good)
    acc = [a for l in good for a in l["accept_lengths"]]
    drafted = sum(sum(l.get("draft_lengths", [])) for l in good)
    ctar = {w: round(sum(a > w for a in acc) / len(acc), 4) if acc else 0.0 for w in range(1, 7)}
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
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
        "per_sample": [{k: l.get(k) for k in ("index", "new_tokens", "steps", "wall_time_s")}
                       for l in good],
    }


def run_generate(cfg: GenerateConfig, store: Store, out: Path | None, resume: bool = False,
                 log: Callable[[str], None] = print, progress=None) -> dict:
    """Run a whole job; returns {'run_dir', 'out', 'metrics'}.

    progress: optional object with start(total, done) / advance(n_done) / tokens(n) calls.
    """
    in_path = Path(cfg.input)
    records = read_prompts(in_path, skip_bad=cfg.skip_bad)
    if not cfg.chat:
        for r in records:
            if r.error is None and r.raw_prompt is None:
                raise SpecctlError(f"{in_path}:{r.line_no}: --no-chat needs a 'prompt' line "
                                   "(messages and turns need the chat template)")
    input_sha = file_sha256(in_path)
    model_dir = resolve_model(cfg.model, store, log=log)
    tk = Tokenization(model_dir, cfg.chat)
    model = load_model(model_dir, cfg.device, cfg.dtype)
    drafter = make_drafter(cfg, model, model_dir, store, log)
    # the same run = same input, settings, model and method artifact (e.g. the skip set used)
    key = cfg.key(input_sha + str(model_dir) + drafter.signature())
    run_dir = find_resumable(store, key) if resume else None
    if resume and run_dir is None:
        log("no earlier run with this input and these settings; starting a new one")
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ctx = model.cfg.max_position

    done = _read_records(run_dir / "records.jsonl") if run_dir else {}
    if run_dir is None:
        run_id = new_id(f"{cfg.method}-")
        run_dir = store.path("runs", run_id)
        run_dir.mkdir(parents=True)
        atomic_write_json(run_dir / "manifest.json", make_manifest(
            "run", run_id, key=key, input=str(in_path.resolve()), input_sha256=input_sha,
            model=str(model_dir), config=asdict(cfg)))
    if done:
        log(f"resuming {run_dir.name}: {len(done)} of {len(records)} requests already done")

    requests, errors = [], []
    for rec in records:
        if rec.index in done:
            continue
        if rec.error is not None:
            errors.append({**_meta(rec), "error": rec.error})
            continue
        req = Request(rec.index, [list(s) for s in rec.turns], rec.max_tokens or cfg.max_tokens,
                      rec.raw_prompt, _meta(rec))
        n, rows = kv_rows(tk, req)
        if n >= ctx:
            msg = (f"{in_path}:{rec.line_no}: prompt is {n} tokens, longer than the model's "
                   f"context ({ctx})")
            if not cfg.skip_bad:
                raise SpecctlError(msg + " (use --skip-bad to record it and go on)")
            errors.append({**_meta(rec), "error": msg})
            continue
        requests.append((req, rows))
    max_len = min(ctx, max((rows for _, rows in requests), default=16) + 32)

    rec_file = run_dir / "records.jsonl"
    torn = _torn_tail(rec_file)
    fh = open(rec_file, "a", encoding="utf-8")
    if torn:   # end a line torn by a crash, so the next record is not glued onto it
        fh.write("\n")

    def persist(line: dict, token_ids=None) -> None:
        done[line["index"]] = line
        fh.write(json.dumps({**line, **({"token_ids": token_ids} if token_ids else {})},
                            ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())

    for e in errors:
        persist(e)
    stats = None
    t0 = time.perf_counter()
    try:
        if progress:
            progress.start(len(records), len(done))
        if requests:
            runner = Runner(model, drafter, cfg.sampling(), batch_size=cfg.batch_size,
                            max_len=max_len, eos_ids=tk.eos_ids, render=tk.render,
                            decode=tk.decode, stop=cfg.stop, prefill_chunk=cfg.prefill_chunk)

            def on_done(req: Request) -> None:
                persist(output_line(req), req.answer_ids)
                if progress:
                    progress.advance(1)

            stats = runner.run([r for r, _ in requests], on_done,
                               on_tokens=progress.tokens if progress else None)
    finally:
        fh.close()
    wall = time.perf_counter() - t0
    lines = [{k: v for k, v in done[i].items() if k != "token_ids"} for i in sorted(done)]
    text = "".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines)
    atomic_write_text(run_dir / "outputs.jsonl", text)
    m = metrics(cfg, [done[i] for i in sorted(done) if done[i].get("index") is not None],
                stats, wall, model.device)
    m["model"] = str(model_dir)
    atomic_write_json(run_dir / "metrics.json", m)
    if out is not None:
        atomic_write_text(out, text)
    return {"run_dir": run_dir, "out": out, "metrics": m}
