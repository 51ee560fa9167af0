"""A `generate` job: prompts file -> requests -> Runner -> output file + a run record in the store.

Crash safety: every finished request is appended to `runs/<id>/records.jsonl` (flushed and
fsynced) the moment it finishes, so Ctrl-C or a crash loses nothing already generated; a resumed
run (same input file contents and settings) skips the requests it already has. The ordered output
file and metrics are written atomically once all requests are done.

Several processes (torchrun, Slurm: RANK / WORLD_SIZE, see runtime/dist.py) share one run
directory: rank r appends to `records.rank<r>.jsonl`, rank 0 merges. What a run has done is the
union of all its record files, so --resume works with any number of processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch

from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord, read_prompts
from specctl.models.checkpoint import load_tokenizer, resolve_model
from specctl.models.loader import load_model
from specctl.runtime.dist import DistEnv, Group, dist_env, rank_device
from specctl.runtime.runner import Runner, RunStats
from specctl.runtime.sequence import Request
from specctl.spec.drafter import NoDraft
from specctl.spec.verify import SamplingParams
from specctl.store import Store, atomic_write_json, atomic_write_text, file_sha256, make_manifest, new_id

METHODS = ("ar", "draft-verify", "kangaroo", "self-draft")
# named ablations a benchmark can run beside the method itself ("self-draft:no-corpus")
VARIANTS = {"self-draft": {"no-corpus": {"corpus_cache": "none"},
                           "no-context": {"context_cache": False},
                           "prompt-grams": {"prompt_grams": True},
                           # few extra tokens per step: for hardware where they are not free
                           "light": {"prompt_grams": True, "branches": 0, "context_cands": 4,
                                     "corpus_cands": 1}}}


SPECULATE = ("auto", "fixed")


def split_variant(spec: str) -> tuple[str, dict]:
    """'self-draft:no-corpus' -> ('self-draft', {'corpus_cache': 'none'}); 'ar' -> ('ar', {}).
    Any method also takes ':auto' / ':fixed' (its --speculate), after its variant if any:
    'self-draft:light:auto'."""
    method, *parts = spec.split(":")
    out: dict = {}
    if parts and parts[-1] in SPECULATE:
        out["speculate"] = parts.pop()
    if not parts:
        return method, out
    known = VARIANTS.get(method, {})
    if len(parts) > 1 or parts[0] not in known:
        have = ", ".join(f"{m}:{v}" for m, vs in VARIANTS.items() for v in vs)
        raise SpecctlError(f"unknown method variant {spec!r} (available: {have}; any method "
                           "may end in :auto or :fixed)")
    return method, {**known[parts[0]], **out}


def check_attention(name: str) -> None:
    from specctl.engine.attention import BACKENDS
    if name not in BACKENDS:
        raise SpecctlError(f"--attention must be one of {', '.join(BACKENDS)}, got {name!r}")


def warn_flex_off_cuda(model, log) -> None:
    if model.attention == "flex" and model.device.type != "cuda":
        log("--attention flex: off CUDA this is PyTorch's unfused reference (slow, and its "
            "memory grows with the whole KV cache); it is meant for CUDA")


# GenerateConfig fields that do not make a run another run (see GenerateConfig.key)
# (--limit too: a run of the first N lines resumes to do them all; --device and --dtype as
# given: the caller keys the device type and dtype the model runs in instead)
UNKEYED = ("input", "skip_bad", "batch_size", "prefill_chunk", "device", "dtype", "limit")


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
    attention: str = "sdpa"           # sdpa | flex (engine/attention.py)
    cuda_graphs: bool = True          # replay captured graphs on CUDA (engine/graphs.py)
    limit: int | None = None          # only the first N prompt lines
    speculate: str = "fixed"          # auto: the goodput controller's budgets; fixed: the drafter's
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
    prompt_grams: bool = False

    def __post_init__(self):
        if self.method not in METHODS:
            raise SpecctlError(f"unknown method {self.method!r} (available: {', '.join(METHODS)})")
        if self.batch_size < 1:
            raise SpecctlError("--batch-size must be at least 1")
        if self.max_tokens < 1:
            raise SpecctlError("--max-tokens must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise SpecctlError("--limit must be at least 1")
        check_attention(self.attention)
        if self.speculate not in SPECULATE:
            raise SpecctlError(f"--speculate must be auto or fixed, got {self.speculate!r}")
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
                                   corpus_cache=self.corpus_cache != "none",
                                   prompt_grams=self.prompt_grams, seed=self.seed)
        except ValueError as e:
            raise SpecctlError(f"self-draft: --{str(e).replace('_', '-', 1)}") from None

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def key(self, extra: str, legacy: bool = False) -> str:
        """What makes two runs the same run (for --resume): the input's contents (not the
        path it was named by) and the settings that decide the answers, not the ones that only
        decide how they are computed: a run resumes with another batch size (after running out
        of memory) or prefill chunk. `extra`: the input's hash, the model, the method's
        artifact, and the device type and dtype the model runs in. legacy: the key of runs
        begun by specctl before 2026-11-22 (every field but skip_bad, `extra` without the
        device and dtype), so that they still resume."""
        d = asdict(self)
        for name in ("skip_bad", "limit") if legacy else UNKEYED:
            d.pop(name)
        for name, default in (("attention", "sdpa"), ("cuda_graphs", True),
                              ("speculate", "fixed")):
            if d[name] == default:   # (options added later: runs begun before keep their key)
                d.pop(name)
        return hashlib.sha256(json.dumps([d, extra], sort_keys=True).encode()).hexdigest()[:16]


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
                if cfg.corpus_cache:   # (the resolver names the one it picks by itself)
                    log(f"self-draft: corpus cache {path}")
        if model.device.type == "cpu" and prm.branches:
            log("self-draft: on a CPU the ~90 extra branch and candidate tokens per sequence and "
                "step cost real compute (0.2-0.6x of ar on a 2-core CPU, see README); it pays "
                "on a GPU. On a CPU at batch 1 try --prompt-grams --branches 0 --context-cands 4 "
                "--corpus-cands 1 (break-even to about 1.1x of ar there, with a corpus cache "
                "close to the prompts)")
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


def _read_done(run_dir: Path, records: list[PromptRecord]) -> dict[int, dict]:
    """The run's finished requests among the lines read (all of them, unless --limit)."""
    read = {r.index for r in records}
    return {i: r for i, r in read_all_records(run_dir).items() if i in read}


def _nearest_run(store: Store, input_sha: str, cfg: GenerateConfig) -> str:
    """For a --resume that found nothing: the newest run of the same input, and what differs."""
    runs = [e for e in store.entries("runs") if e.manifest.get("input_sha256") == input_sha]
    if not runs:
        return ""
    e = max(runs, key=lambda e: e.manifest.get("created", ""))
    old, new = e.manifest.get("config") or {}, asdict(cfg)
    diff = [k for k in new if k not in UNKEYED and k in old
            and json.dumps(old[k]) != json.dumps(new[k])]
    why = (", ".join(f"{k} {old[k]!r} there, {new[k]!r} here" for k in diff) if diff else
           "the model, the kind of device or dtype it runs in, or the method's artifact (skip "
           "set, adapter, corpus cache)")
    return f" (the newest run of this input, {e.path.name}, differs in: {why})"


def _peak_mb(device: torch.device) -> float:
    return (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def metrics(cfg: GenerateConfig, lines: list[dict], stats: RunStats | None, wall: float,
            device: torch.device) -> dict:
    good = [l for l in lines if "error" not in l]
    new = sum(l["new_tokens"] for l in good)
    steps = sum(l["steps"] for l in good)
    acc = [a for l in good for a in l["accept_lengths"]]
    drafted = sum(sum(l.get("draft_lengths", [])) for l in good)
    ctar = {w: round(sum(a > w for a in acc) / len(acc), 4) if acc else 0.0 for w in range(1, 7)}
    peak = _peak_mb(device)
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
        "speculation": speculation_metrics(cfg, stats),
        "per_sample": [{k: l.get(k) for k in ("index", "new_tokens", "steps", "wall_time_s")}
                       for l in good],
    }


def speculation_metrics(cfg: GenerateConfig, stats: RunStats | None) -> dict:
    """--speculate auto's record (runtime/controller.py): the budgets chosen (budget ->
    sequence-steps), the predicted and measured mean step ms, and the goodput (emitted tokens
    per second of step time)."""
    out: dict = {"mode": cfg.speculate}
    n = stats.controlled_steps if stats else 0
    if n:
        out.update({
            "budget_hist": {str(k): v for k, v in sorted(stats.budget_hist.items())},
            "controlled_steps": n,
            "predicted_step_ms": round(stats.predicted_step_ms / n, 3),
            "measured_step_ms": round(stats.measured_step_ms / n, 3),
            "goodput_tokens_per_s": round(stats.generated / (stats.measured_step_ms / 1e3), 3)
            if stats.measured_step_ms else 0.0,
            "profile_s": round(stats.profile_s, 3)})
    return out


# ---------------------------------------------------------------------------------------------
# several processes (runtime/dist.py): shards, per-rank record files, the merge


def record_file(run_dir: Path, env: DistEnv) -> Path:
    """Where this process appends its finished requests: `records.jsonl` for a single process,
    `records.rank<r>.jsonl` for rank r of several (each rank appends to its own file only)."""
    return run_dir / (f"records.rank{env.rank}.jsonl" if env.active else "records.jsonl")


def read_all_records(run_dir: Path) -> dict[int, dict]:
    """The union of a run's record files, whatever world size(s) wrote them: `records.jsonl`
    and every `records.rank<r>.jsonl`. That union is what a resumed run has done."""
    done: dict[int, dict] = {}
    for f in sorted(run_dir.glob("records*.jsonl")):
        if f.name == "records.jsonl" or re.fullmatch(r"records\.rank\d+\.jsonl", f.name):
            done.update(_read_records(f))
    return done


def shard(items: list, rank: int, world: int) -> list:
    """Rank r's share of the requests still to do: the k-th goes to rank k % world (round-robin
    over the requests still missing, in input order). Interleaving balances better than
    contiguous blocks: inputs are often grouped (MT-bench by category, files by length), and a
    block of long prompts would hold the whole job back on one rank; the shares differ by at
    most one request. Computed over what is missing, so a resumed run (any world size) spreads
    the remaining work evenly."""
    return items[rank::world]


def _ranges(ix: list[int]) -> list[list[int]]:
    """Sorted ints as [first, last] runs (compact to send between ranks)."""
    out: list[list[int]] = []
    for i in ix:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _unranges(rs: list[list[int]]) -> set[int]:
    return {i for a, b in rs for i in range(a, b + 1)}


def _sum_stats(parts: list[dict]) -> RunStats:
    """Per-rank RunStats (as dicts) added up: counters summed, histograms merged, so ratios
    such as the padding ratio come out pooled over every step of every rank."""
    total = RunStats()
    for p in parts:
        for f in fields(RunStats):
            v = p.get(f.name)
            cur = getattr(total, f.name)
            if isinstance(v, dict) and isinstance(cur, dict):
                for k, c in v.items():
                    try:
                        k = int(k)   # JSON made the histogram's int keys strings
                    except ValueError:
                        pass
                    cur[k] = cur.get(k, 0) + c
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and \
                    isinstance(cur, (int, float)):
                setattr(total, f.name, cur + v)
    return total


def merged_metrics(cfg: GenerateConfig, lines: list[dict], ranks: list[dict], wall: float,
                   device: torch.device) -> dict:
    """One metrics record for a job run by several processes. Per-output numbers (requests,
    new tokens, steps, mean accepted tokens, acceptance rate, CTAR) come from the merged lines,
    so they are pooled over every step of every rank, exactly as for one process; tokens/s is
    the tokens all ranks generated in this invocation over the job's wall time (first rank
    starting to the last one finishing); step counters are summed; peak memory is the largest
    rank's. `per_rank` lists each rank's own share."""
    parts = [r["stats"] for r in ranks if r.get("stats")]
    m = metrics(cfg, lines, _sum_stats(parts) if parts else None, wall, device)
    m["peak_memory_mb"] = round(max(r["peak_memory_mb"] for r in ranks), 1)
    m["world_size"] = len(ranks)
    m["per_rank"] = []
    for r in ranks:
        st = r.get("stats") or {}
        gen, w = st.get("generated", 0), r["wall_time_s"]
        padded = st.get("padded_tokens", 0)
        m["per_rank"].append({
            "rank": r["rank"], "device": r["device"], "requests": r["requests"],
            "errors": r["errors"], "generated_tokens": gen, "wall_time_s": round(w, 3),
            "tokens_per_s": round(gen / w, 3) if w and gen else 0.0,
            "step_tokens": st.get("step_tokens", 0), "prefill_tokens": st.get("prefill_tokens", 0),
            "padding_ratio": round(1.0 - st.get("step_tokens", 0) / padded, 4) if padded else 0.0,
            "peak_memory_mb": round(r["peak_memory_mb"], 1)})
    return m


class _Records:
    """This process's record file: one JSON line appended, flushed and fsynced per finished
    request (a torn last line left by a crash is ended first, so nothing is glued onto it)."""

    def __init__(self, path: Path, done: dict[int, dict] | None):
        self.path, self.done = path, done
        torn = _torn_tail(path)
        self.fh = open(path, "a", encoding="utf-8")
        if torn:
            self.fh.write("\n")

    def persist(self, line: dict, token_ids=None) -> None:
        if self.done is not None:
            self.done[line["index"]] = line
        self.fh.write(json.dumps({**line, **({"token_ids": token_ids} if token_ids else {})},
                                 ensure_ascii=False) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def size(self) -> int:
        self.fh.flush()
        return os.fstat(self.fh.fileno()).st_size

    def close(self) -> None:
        self.fh.close()


class _PeerProgress:
    """Rank 0's progress bar over the whole job: a thread tails the other ranks' record files
    (one complete line = one finished request) from where they stood when generation began."""

    def __init__(self, files: dict[Path, int], progress, lock: threading.Lock,
                 interval: float = 0.5):
        self.offsets, self.progress, self.lock, self.interval = dict(files), progress, lock, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="specctl-peer-progress",
                                       daemon=True)

    def start(self) -> "_PeerProgress":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        for f, off in self.offsets.items():
            try:
                with open(f, "rb") as fh:
                    fh.seek(off)
                    chunk = fh.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1   # complete lines only; a partial one waits
            if not end:
                continue
            self.offsets[f] = off + end
            for raw in chunk[:end].splitlines():
                try:
                    n = int(json.loads(raw).get("new_tokens") or 0)
                except (ValueError, AttributeError, TypeError):
                    continue
                with self.lock:
                    self.progress.advance(1)
                    if n:
                        self.progress.tokens(n)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.poll()


def _read_input(cfg: GenerateConfig, in_path: Path) -> list[PromptRecord]:
    records = read_prompts(in_path, skip_bad=cfg.skip_bad, limit=cfg.limit)
    if not cfg.chat:
        for r in records:
            if r.error is None and r.raw_prompt is None:
                raise SpecctlError(f"{in_path}:{r.line_no}: --no-chat needs a 'prompt' line "
                                   "(messages and turns need the chat template)")
    return records


def run_generate(cfg: GenerateConfig, store: Store, out: Path | None, resume: bool = False,
                 log: Callable[[str], None] = print, progress=None) -> dict:
    """Run a whole job; returns {'run_dir', 'out', 'metrics', 'rank', 'world_size'}.

    progress: optional object with start(total, done) / advance(n_done) / tokens(n) calls.

    Under a launcher that sets RANK / WORLD_SIZE (torchrun, Slurm; see runtime/dist.py) every
    process calls this with the same arguments and the processes make one job: rank 0 opens the
    run (new, or the one --resume finds) and tells the others its id and which requests are
    done; each rank generates its `shard` of the rest on its own device and appends to its own
    `records.rank<r>.jsonl` in the same run directory; after a barrier rank 0 merges the union of
    all record files into the ordered output and one metrics record. Only rank 0 logs, shows
    progress and writes `out`; the other ranks return metrics None.
    """
    grp = Group(dist_env()).start()
    try:
        return _run_generate(cfg, store, out, resume, log, progress, grp)
    finally:
        grp.close()


def _run_generate(cfg: GenerateConfig, store: Store, out: Path | None, resume: bool,
                  log: Callable[[str], None], progress, grp: Group) -> dict:
    env = grp.env
    lead = env.rank == 0
    say = log if lead else (lambda msg: None)
    if not lead:
        progress = None
    in_path = Path(cfg.input)
    # Every phase runs under try and ends in grp.check: if any rank failed, all ranks stop there
    # (one process: the error is simply raised). Rank 0 goes first, so that a model download or
    # a bad input line happens and is reported once.
    err = records = model_dir = None
    if lead:
        try:
            records = _read_input(cfg, in_path)
            for method, spec, kind in (("draft-verify", cfg.skip_set, "skipsets"),
                                       ("kangaroo", cfg.adapter, "adapters")):
                if cfg.method == method and spec:   # a typo fails before the model loads
                    store.locate(spec, kind)
            model_dir = resolve_model(cfg.model, store, log=say)
        except Exception as e:
            err = e
    grp.check(err)

    err = None
    try:
        if not lead:
            records = _read_input(cfg, in_path)
            model_dir = resolve_model(cfg.model, store, log=say)
        input_sha = file_sha256(in_path)
        tk = Tokenization(model_dir, cfg.chat)
        device = rank_device(cfg.device, env)
        if env.active and device.startswith("cuda:"):
            torch.cuda.set_device(torch.device(device))
        model = load_model(model_dir, device, cfg.dtype, cuda_graphs=cfg.cuda_graphs,
                           attention=cfg.attention)
        warn_flex_off_cuda(model, say)
        drafter = make_drafter(cfg, model, model_dir, store, say)
        # the same run = same input, settings, model and method artifact (e.g. the skip set
        # used), on the same kind of device in the same dtype
        made = input_sha + str(model_dir) + drafter.signature()
        key = cfg.key(made + f"{model.device.type}:{model.dtype}")
        legacy = cfg.key(made, legacy=True)
    except Exception as e:
        err = e
    grp.check(err)
    if env.active:   # the model path may differ between nodes; everything else must not
        same = cfg.key(input_sha + drafter.signature() + f"{model.dtype}:{cfg.limit}")
        grp.check(SpecctlError("the ranks disagree on the input file contents, the options or the "
                               "method's artifact: every rank must get the same command line and "
                               "see the same files") if len(set(grp.gather(same))) > 1 else None)

    done: dict[int, dict] = {}
    opened, err = None, None
    if lead:
        try:
            run_dir = (find_resumable(store, key) or find_resumable(store, legacy)
                       if resume else None)
            if resume and run_dir is None:
                say("no earlier run with this input and these settings; starting a new one"
                    + _nearest_run(store, input_sha, cfg))
            done = _read_done(run_dir, records) if run_dir else {}
            if run_dir is None:
                run_id = new_id(f"{cfg.method}-")
                run_dir = store.path("runs", run_id)
                run_dir.mkdir(parents=True)
                atomic_write_json(run_dir / "manifest.json", make_manifest(
                    "run", run_id, key=key, input=str(in_path.resolve()), input_sha256=input_sha,
                    model=str(model_dir), config=asdict(cfg)))
            if done:
                say(f"resuming {run_dir.name}: {len(done)} of {len(records)} requests already "
                    "done")
            opened = {"id": run_dir.name, "done": _ranges(sorted(done))}
        except Exception as e:
            err = e
    grp.check(err)
    opened = grp.broadcast(opened)
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ctx = model.cfg.max_position

    err, writer, requests, errors = None, None, [], []
    try:
        run_dir = store.path("runs", opened["id"])
        if not lead and not (run_dir / "manifest.json").is_file():
            raise SpecctlError(f"rank {env.rank} cannot see {run_dir}, which rank 0 created: with "
                               "several nodes the store (--store or $SPECCTL_HOME) must be on a "
                               "filesystem all nodes share")
        done_ix = set(done) if lead else _unranges(opened["done"])
        todo = [r for r in records if r.index not in done_ix]
        # bad lines cost nothing: rank 0 records them all; real requests are sharded
        good = shard([r for r in todo if r.error is None], env.rank, env.world)
        mine = sorted(good + ([r for r in todo if r.error is not None] if lead else []),
                      key=lambda r: r.index)
        for rec in mine:
            if rec.error is not None:
                errors.append({**_meta(rec), "error": rec.error})
                continue
            req = Request(rec.index, [list(s) for s in rec.turns],
                          rec.max_tokens or cfg.max_tokens, rec.raw_prompt, _meta(rec))
            n, rows = kv_rows(tk, req)
            if n >= ctx:
                msg = (f"{in_path}:{rec.line_no}: prompt is {n} tokens, longer than the model's "
                       f"context ({ctx})")
                if not cfg.skip_bad:
                    raise SpecctlError(msg + " (use --skip-bad to record it and go on)")
                errors.append({**_meta(rec), "error": msg})
                continue
            requests.append((req, rows))
        writer = _Records(record_file(run_dir, env), done if lead else None)
        for e in errors:
            writer.persist(e)
        plan = {"requests": len(requests), "errors": len(errors), "offset": writer.size()}
    except Exception as e:
        err = e
        if writer is not None:
            writer.close()
    grp.check(err)
    plans = grp.gather(plan)
    max_len = min(ctx, max((rows for _, rows in requests), default=16) + 32)
    if any(rows + 32 > ctx for _, rows in requests):
        say(f"note: some answers can reach the model's context ({ctx} tokens) before their "
            "token limit; they stop there")
    if env.active:
        n = [p["requests"] for p in plans]
        say(f"{env.world} processes: {sum(n)} requests to generate, {min(n)} to {max(n)} per rank")

    lock = threading.Lock()
    peers = None
    if progress and env.active:
        peers = _PeerProgress({record_file(run_dir, DistEnv(r, env.world, r)): p["offset"]
                               for r, p in enumerate(plans) if r != env.rank}, progress, lock)
    stats, err = None, None
    t0 = time.perf_counter()
    try:
        if progress:
            progress.start(len(records), len(done_ix) + sum(p["errors"] for p in plans))
        if peers:
            peers.start()
        if requests:
            # no more slots than requests: the KV cache is allocated for every slot
            slots = min(cfg.batch_size, len(requests))
            try:
                runner = Runner(model, drafter, cfg.sampling(), batch_size=slots,
                                max_len=max_len, eos_ids=tk.eos_ids, render=tk.render,
                                decode=tk.decode, stop=cfg.stop, prefill_chunk=cfg.prefill_chunk,
                                speculate=cfg.speculate)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not isinstance(e, torch.OutOfMemoryError) and "can't allocate" not in str(e):
                    raise
                c = model.cfg
                gb = (2 * c.num_layers * slots * max_len * c.num_kv_heads * c.head_dim
                      * model.embed.element_size() / 2**30)
                raise SpecctlError(
                    f"not enough {model.device.type.upper()} memory for the KV cache of {slots} "
                    f"sequences x {max_len} rows (about {gb:.1f} GiB): lower --batch-size, or "
                    "--max-tokens") from None

            def on_done(req: Request) -> None:
                writer.persist(output_line(req), req.answer_ids)
                if progress:
                    with lock:
                        progress.advance(1)

            on_tokens = None
            if progress:
                def on_tokens(n: int) -> None:
                    with lock:
                        progress.tokens(n)

            stats = runner.run([r for r, _ in requests], on_done, on_tokens=on_tokens)
    except Exception as e:
        err = e
    finally:
        writer.close()
        if peers:
            peers.stop()
    mine_wall = time.perf_counter() - t0
    grp.check(err)   # the barrier: every rank has finished its shard (or the job stops here)
    wall = time.perf_counter() - t0
    ranks = grp.gather({"rank": env.rank, "device": str(model.device), "requests": len(requests),
                        "errors": len(errors), "stats": asdict(stats) if stats else None,
                        "wall_time_s": mine_wall, "peak_memory_mb": _peak_mb(model.device)})
    if not lead:
        return {"run_dir": run_dir, "out": None, "metrics": None, "rank": env.rank,
                "world_size": env.world}

    if env.active:
        # the ranks started together (right after the last gather); the job lasted until the
        # slowest one finished: rank 0's own view of that, or a rank's own clock if longer
        wall = max([wall] + [r["wall_time_s"] for r in ranks])
        done = _read_done(run_dir, records)
    lines = [{k: v for k, v in done[i].items() if k != "token_ids"} for i in sorted(done)]
    text = "".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines)
    atomic_write_text(run_dir / "outputs.jsonl", text)
    merged = [done[i] for i in sorted(done) if done[i].get("index") is not None]
    mpath = run_dir / "metrics.json"
    m = None
    if not any(p["requests"] or p["errors"] for p in plans) and mpath.is_file():
        # a resumed run with nothing left: its metrics (throughput included) stay as they
        # were, if they are those of these requests (not of an earlier --limit, say)
        m = json.loads(mpath.read_text())
        if m.get("requests") == len(merged):
            say(f"{run_dir.name} is already complete: nothing to generate")
        else:
            m = None
    if m is None:
        m = (merged_metrics(cfg, merged, ranks, wall, model.device) if env.active
             else metrics(cfg, merged, stats, wall, model.device))
        m["model"] = str(model_dir)
        atomic_write_json(mpath, m)
    if out is not None:
        atomic_write_text(out, text)
    return {"run_dir": run_dir, "out": out, "metrics": m, "rank": env.rank,
            "world_size": env.world}
