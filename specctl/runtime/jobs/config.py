"""What a `generate` run is: its settings (GenerateConfig), the decoding methods and their
named variants, and the key that makes two runs the same run (for --resume)."""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specctl.errors import SpecctlError
from specctl.io.prompts import MAX_STOPS, unencodable

if TYPE_CHECKING:
    from specctl.speculative.sampling import SamplingParams

METHODS = ("ar", "draft-verify", "kangaroo", "self-draft")
# named ablations a benchmark can run beside the method itself ("self-draft:no-corpus")
VARIANTS = {"self-draft": {"no-corpus": {"corpus_cache": "none"},
                           "no-context": {"context_cache": False},
                           "prompt-grams": {"prompt_grams": True},
                           "job": {"job_cache": True},
                           "no-job": {"job_cache": False},
                           # few extra tokens per step: for hardware where they are not free
                           # (its per-sequence steps at any batch size)
                           "light": {"prompt_grams": True, "branches": 0, "context_cands": 4,
                                     "corpus_cands": 1, "grid": False},
                           # the per-sequence steps where the default drafts on the grid
                           "no-grid": {"grid": False},
                           # light's candidates drafted over the batch at once (experimental)
                           "grid": {"prompt_grams": True, "branches": 0, "context_cands": 4,
                                    "grid": True},
                           # and the job cache's chains in its steps (speculative/job_table.py)
                           "grid-job": {"prompt_grams": True, "branches": 0, "context_cands": 4,
                                        "grid": True, "job_cache": True}}}


SPECULATE = ("auto", "fixed")
GRID_FROM = 32   # the batch size from which Self-Draft drafts on the grid by default
# (runtime/step/grid.py): there a per-sequence drafting step's host work (~30 us a sequence on
# the developers' CPU, ~3x on a GPU machine's) outweighs what its wider drafts add, and its
# early finishers split the batch's admission groups; on the host-charged clock at batch 32
# with requests waiting, the grid keeps up with ar (0.99x) where the per-sequence path does
# not (0.93x), and below 32 the per-sequence path gains (batch 16: 1.03x against 0.95x); on
# the demo model the two are level at 8-64: bench-results/2026-11-30-grid-default


def split_variant(spec: str) -> tuple[str, dict]:
    """'self-draft:no-corpus' -> ('self-draft', {'corpus_cache': 'none'}); 'ar' -> ('ar', {}).
    Any method also takes ':auto' / ':fixed' (its --speculate) and ':exact' (--exact), after
    its variant if any: 'self-draft:light:auto:exact'."""
    method, *parts = spec.split(":")
    out: dict = {}
    while parts and (parts[-1] in SPECULATE and "speculate" not in out
                     or parts[-1] == "exact" and "exact" not in out):
        last = parts.pop()
        out.update({"exact": True} if last == "exact" else {"speculate": last})
    if not parts:
        return method, out
    known = VARIANTS.get(method, {})
    if len(parts) > 1 or parts[0] not in known:
        have = ", ".join(f"{m}:{v}" for m, vs in VARIANTS.items() for v in vs)
        raise SpecctlError(f"unknown method variant {spec!r} (available: {have}; any method "
                           "may end in :auto or :fixed, and :exact)")
    return method, {**known[parts[0]], **out}


def check_attention(name: str) -> None:
    from specctl.engine.attention import ATTENTION
    if name not in ATTENTION:
        raise SpecctlError(f"--attention must be one of {', '.join(ATTENTION)}, got {name!r}")


# GenerateConfig fields that do not make a run another run (see GenerateConfig.key)
# (--limit too: a run of the first N lines resumes to do them all; --device and --dtype as
# given: the caller keys the device type and dtype the model runs in instead; --grid: how
# drafts are made, never an answer, and its default follows the batch size)
UNKEYED = ("input", "skip_bad", "batch_size", "prefill_chunk", "device", "dtype", "limit",
           "threads", "kv_memory", "gpu_memory", "ray", "actors", "job_cache_file", "grid")


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
          "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40,
          "tib": 2**40}


def parse_size(text: str) -> int:
    """'8GB', '512MiB', '1.5g', '1000000' -> bytes (K/M/G/T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m and _UNITS.get(m.group(2).lower())
    if not unit:
        raise SpecctlError(f"--kv-memory: {text!r} is not a size (say 8GB or 512MB)")
    return int(float(m.group(1)) * unit)


# a plain setting's type: (is one, as it is kept) -- numpy's numbers become Python's, which
# the run's manifest (JSON) can hold; bool is an int to Python and no count here
_PLAIN = {"int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), int),
          "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
                    lambda v: v if type(v) in (int, float) else float(v)),
          "str": (lambda v: isinstance(v, (str, os.PathLike)), os.fspath),   # (a Path: a FILE)
          "bool": (lambda v: isinstance(v, (bool, np.bool_)), bool)}


def option(default, help: str = "", *, flag: str | None = None, method: str | None = None,
           bench: bool = False):
    """A GenerateConfig field the command line sets: the CLI derives its option from this
    (cli/options.py): flag (default --field-name; "--x/--no-x" for a switch pair, "--x,-y" for a
    short form too), help, the method it belongs to (its help panel, and a warning when it is
    given with another method), bench: `specctl bench` takes it too (every method's option
    does). Declared here once; nothing below the CLI reads the metadata."""
    return field(default=default, metadata={"option": True, "help": help, "flag": flag,
                                            "method": method, "bench": bench or bool(method)})


_DV, _KG, _SD = "draft-verify", "kangaroo", "self-draft"


@dataclass(frozen=True)
class GenerateConfig:
    input: str
    model: str | None = option(None, "Local HF folder, hub id, or 'smollm2-135m-instruct' (the "
                               "default demo model).", flag="--model,-m", bench=True)
    method: str = option("ar", "Decoding method: ar, draft-verify, kangaroo, self-draft, or auto "
                         "(the fastest of those whose artifacts are in the store, timed on a "
                         "short pilot of the first prompts).")
    batch_size: int = option(8, "Sequences in flight at once.", flag="--batch-size,-b")
    max_tokens: int = option(256, "New tokens per answer (per turn); a line's own max_tokens "
                             "(OpenAI batch body) wins.", bench=True)
    temperature: float = option(0.0, "0 = greedy.", flag="--temperature,-t")
    top_p: float = option(1.0, "Nucleus sampling: the smallest set of tokens whose probability "
                          "reaches p (1.0 = off).")
    top_k: int = option(0, "0 = off.")
    seed: int = option(0, "Sampling seed (per request: the same output at any batch size, "
                       "draft-verify aside, and a draw rounding decides aside without "
                       "--exact).", bench=True)
    chat: bool = option(True, "Apply the model's chat template.", flag="--chat/--no-chat",
                        bench=True)
    stop: tuple[str, ...] = option((), "Stop string (repeatable), taken as given: in bash "
                                   "$'\\n\\n' is two newlines, \"\\n\\n\" a backslash and an n twice.")
    logprobs: int | None = option(None, "Add each token's log-probability (the model's own, "
                                  "before temperature) and its N most likely alternatives to "
                                  "the output (0: the token's only; a line's own wins).")
    device: str = option("auto", "auto, cpu, cuda, cuda:1 ...", bench=True)
    dtype: str = option("auto", "auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16.", bench=True)
    skip_bad: bool = option(False, "Record bad lines in the output instead of stopping.")
    prefill_chunk: int | None = option(None, "Prompt tokens a prefill forward takes, at least "
                                       "1 (default: 512 on a CPU and under --exact, which "
                                       "allows no more; on CUDA 4096, or less where the "
                                       "device's memory is small).", bench=True)
    attention: str = option("auto", "Attention backend: auto (default: fused on CUDA where "
                            "Triton is installed, else sdpa), sdpa, fused (each decoder layer "
                            "of a decoding step in 9 kernel launches, Triton; CUDA only) or "
                            "flex (FlexAttention with block masks read in place from the KV "
                            "cache, compiled on CUDA; on a CPU only the slow reference).",
                            bench=True)
    exact: bool = option(False, "Batch-invariant numerics: every method's output is ar's at "
                         "batch 1 token for token, at any batch size, in bf16 too (plain bf16 "
                         "flips near-ties with the batch's shape). With --dtype auto it runs "
                         "bf16; a dtype this machine cannot make invariant is refused.",
                         flag="--exact/--no-exact", bench=True)
    cuda_graphs: bool = option(True, "On CUDA, replay decoding steps from captured CUDA graphs "
                               "(off: every forward runs eagerly).",
                               flag="--cuda-graphs/--no-cuda-graphs", bench=True)
    cudnn_attention: bool = option(False, "On CUDA, let attention use cuDNN's SDPA kernel "
                                   "(torch's default). Off by default: in bf16 that kernel "
                                   "makes two identical runs differ now and then; its speed "
                                   "cost is not measured yet.",
                                   flag="--cudnn-attention/--no-cudnn-attention", bench=True)
    limit: int | None = option(None, "Only the first N prompt lines (--resume without it then "
                               "does the rest).")
    speculate: str = option("auto", "auto (default): a goodput controller gives each sequence a "
                            "draft budget per step (0 = an ar step) from a measured step-cost "
                            "profile, so a method that does not pay costs what ar costs; "
                            "fixed: each method drafts its own amount (the papers' settings). "
                            "Bench: a method may end in :auto or :fixed.", bench=True)
    threads: int | None = option(None, "CPU threads per step (default: measured as the run goes, "
                                 "so a busy machine does not stall the step).", bench=True)
    ray: str | None = option(None, "Run the job on Ray Data: local (a cluster on this machine), "
                             "auto (the running one) or a cluster ADDRESS; each actor loads the "
                             "model once; the same outputs, run and resume (pip install "
                             "'specctl[ray]').")
    actors: int = option(2, "With --ray: the actor pool's size (one GPU each where the cluster "
                         "has GPUs, else an equal share of its CPUs).")
    kv_memory: str | None = option(None, "Memory for the KV cache, e.g. 8GB. Less than "
                                   "--batch-size full-length sequences need: a paged cache, "
                                   "filled by actual lengths (default: CPU all it needs, CUDA "
                                   "set by --gpu-memory).", bench=True)
    gpu_memory: float = option(0.9, "CUDA: the share of the GPU's memory that weights, KV cache "
                               "and work may use together (vLLM's gpu_memory_utilization).",
                               bench=True)
    skip_set: str | None = option(None, "Skip set FILE or store ID (default: the model's best "
                                  "stored one).", method=_DV)
    max_draft: int = option(12, "K, most drafts per step.", method=_DV)
    gamma0: float = option(0.6, "Initial draft-exit threshold.", method=_DV)
    alpha: float = option(0.9, "Target acceptance rate of the adaptive threshold.", method=_DV)
    eps: float = option(0.01, "Threshold step.", method=_DV)
    beta1: float = option(0.5, "Acceptance-rate smoothing.", method=_DV)
    beta2: float = option(0.9, "Threshold smoothing.", method=_DV)
    adapter: str | None = option(None, "Adapter DIR or store ID (default: the model's best "
                                 "stored one).", method=_KG)
    eta: float = option(0.6, "Stop drafting when the draft's top-1 probability <= eta.",
                        method=_KG)
    kangaroo_gamma: int = option(6, "Most drafts per step.", method=_KG)
    corpus_cache: str | None = option(None, "Corpus n-gram cache DIR or store ID (default: the "
                                      "newest for the model's tokenizer; 'none' = off, as "
                                      "--no-corpus-cache).", method=_SD)
    branches: int = option(6, "N, draft branches per sequence.", method=_SD)
    branch_len: int = option(6, "L, most tokens per branch.", method=_SD)
    gram: int = option(4, "G, tokens per context-cache candidate.", method=_SD)
    context_cands: int = option(10, "Most candidates from the context cache per step.",
                                method=_SD)
    corpus_cands: int = option(3, "Most candidates from the corpus cache per step.", method=_SD)
    context_cache: bool = option(True, "Ablation (--no-context-cache): no context-cache "
                                 "candidates (branches still run).",
                                 flag="--context-cache/--no-context-cache", method=_SD)
    prompt_grams: bool | None = option(None, "Also seed the context cache with the prompt's "
                                       "grams (a specctl addition, not in the paper; default: "
                                       "on under --speculate auto, off under fixed).",
                                       flag="--prompt-grams/--no-prompt-grams", method=_SD)
    job_cache: bool = option(False, "Also draft from the job cache: n-grams of the job's own "
                             "prompts and finished answers (longest match of the last 2-8 "
                             "tokens, up to 16-token continuations), for jobs whose answers "
                             "repeat each other. Per process; --resume rebuilds it.",
                             flag="--job-cache/--no-job-cache", method=_SD)
    grid: bool | None = option(None, "Draft the context cache's candidates as array "
                               "operations over the whole batch, C chains of G tokens a "
                               "sequence in one layout (greedy, no --logprobs; elsewhere the "
                               "usual per-sequence drafting). Branches and the corpus do not "
                               "draft in its steps (the job cache does, as its first chain). "
                               f"Default: on at --batch-size {GRID_FROM} and above under "
                               "--speculate auto, greedy, without --logprobs or a "
                               "--corpus-cache named; off elsewhere.",
                               flag="--grid/--no-grid", method=_SD)
    job_cache_file: str | None = option(None, "With --job-cache: load the job cache from this "
                                        "file when the job starts (where it exists) and save "
                                        "it there when the job ends, so a later job over new "
                                        "inputs starts warm (refused for another model).",
                                        method=_SD)

    def __post_init__(self):
        self._check_types()
        if self.method not in METHODS + ("auto",):
            raise SpecctlError(f"unknown method {self.method!r} (available: "
                               f"{', '.join(METHODS)}, auto)")
        if self.batch_size < 1:
            raise SpecctlError("--batch-size must be at least 1")
        if self.max_tokens < 1:
            raise SpecctlError("--max-tokens must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise SpecctlError("--limit must be at least 1")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise SpecctlError("--prefill-chunk must be at least 1")
        from specctl.engine.exact import PREFILL_ROWS
        if self.exact and (self.prefill_chunk or 0) > PREFILL_ROWS:
            raise SpecctlError(f"--exact checks prefill forwards of up to {PREFILL_ROWS} tokens "
                               f"at start-up, so it cannot run --prefill-chunk "
                               f"{self.prefill_chunk}: give {PREFILL_ROWS} or less, or leave it "
                               "out")
        # (the API's stop="Paris" is one stop string, as vLLM's and a prompt line's are, not
        # five letters; a list is a tuple, hashable: runs are grouped by their settings)
        stop = (self.stop,) if isinstance(self.stop, str) else () if self.stop is None \
            else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise SpecctlError(f"stop: a string or a list of strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(stop))
        if len(self.stop) > MAX_STOPS:   # (a line's limit: one for both)
            raise SpecctlError(f"--stop: at most {MAX_STOPS} stop strings, got {len(self.stop)}")
        if any(s == "" for s in self.stop):
            raise SpecctlError("--stop: an empty string stops nothing; give the text to stop at")
        for s in self.stop:
            if unencodable(s):
                raise SpecctlError(f"--stop {ascii(s)}: {unencodable(s)}")
        if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", self.device):
            raise SpecctlError(f"--device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        from specctl.engine.loader import DTYPES   # (torch: not imported by the CLI's --help)
        if self.dtype != "auto" and self.dtype not in DTYPES:   # (now, not at the model's load)
            raise SpecctlError(f"--dtype must be auto, fp32, bf16 or fp16, got {self.dtype!r}")
        if not 0 <= self.seed < 2**63:
            raise SpecctlError(f"--seed must be in [0, 2^63), got {self.seed}")
        check_attention(self.attention)
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise SpecctlError(f"--logprobs must be in [0, 20], got {self.logprobs}")
        if self.threads is not None and self.threads < 1:
            raise SpecctlError("--threads must be at least 1")
        if self.actors < 1:
            raise SpecctlError("--actors must be at least 1")
        if self.ray is not None and not self.ray.strip():
            raise SpecctlError("--ray takes local, auto or a cluster address")
        if self.kv_memory is not None and parse_size(self.kv_memory) <= 0:
            raise SpecctlError("--kv-memory must be more than 0")
        if not 0.0 < self.gpu_memory <= 1.0:
            raise SpecctlError(f"--gpu-memory must be in (0, 1], got {self.gpu_memory}")
        if self.speculate not in SPECULATE:
            raise SpecctlError(f"--speculate must be auto or fixed, got {self.speculate!r}")
        if self.job_cache_file is not None and not self.job_cache:
            raise SpecctlError("--job-cache-file needs --job-cache")
        if self.job_cache_file is not None:   # (a device, FIFO or folder there: said now,
            from specctl.store import writable_file   # before the model loads)
            writable_file(Path(self.job_cache_file).expanduser(), "--job-cache-file")
        # (named by their options here: the parameters' own checks name the papers' symbols)
        if self.max_draft < 1:
            raise SpecctlError(f"--max-draft must be at least 1, got {self.max_draft}")
        if self.method in ("kangaroo", "auto") and not 0.0 <= self.eta <= 1.0:
            raise SpecctlError(f"--eta must be in [0, 1], got {self.eta}")
        if self.method in ("kangaroo", "auto") and self.kangaroo_gamma < 1:
            raise SpecctlError(f"--kangaroo-gamma must be at least 1, got {self.kangaroo_gamma}")
        self.exit_params()
        self.self_draft_params()
        try:
            self.sampling()
        except ValueError as e:   # "top_p must be ..." -> "--top-p must be ..." (the option's name)
            raise SpecctlError("--" + str(e).replace("_", "-", 1)) from None

    def exit_params(self):
        from specctl.speculative.draft_verify import ExitParams
        try:
            return ExitParams(self.max_draft, self.gamma0, self.eps, self.beta1, self.beta2,
                              self.alpha)
        except ValueError as e:
            raise SpecctlError(f"draft-verify: {e}") from None

    def self_draft_params(self):
        from specctl.speculative.self_draft import SelfDraftParams
        # under auto a step drafts a few tokens at most where tokens are not free, and the
        # first ones come from the context cache: the prompt's grams make them land more often
        # (demo model, held-out questions: 0.13 tokens accepted per 1-token draft against 0.09)
        grams = self.speculate == "auto" if self.prompt_grams is None else self.prompt_grams
        grid = self.grid_default() if self.grid is None else self.grid
        try:
            return SelfDraftParams(self.branches, self.branch_len, self.gram, self.context_cands,
                                   self.corpus_cands, context_cache=self.context_cache,
                                   corpus_cache=self.corpus_cache != "none",
                                   prompt_grams=grams, seed=self.seed,
                                   job_cache=self.job_cache, grid=grid)
        except ValueError as e:
            raise SpecctlError(f"self-draft: --{str(e).replace('_', '-', 1)}") from None

    def grid_default(self) -> bool:
        """Whether Self-Draft drafts on the grid where --grid is not given (GRID_FROM)."""
        return self.speculate == "auto" and self.batch_size >= GRID_FROM and \
            self.sampling().greedy and self.logprobs is None and \
            self.corpus_cache in (None, "none")   # (a corpus named is one to draft from)

    def model_dtype(self) -> str:
        """The dtype to load the model in: --dtype, but under --exact "auto" is bf16 on the CPU
        too (this CPU's fp32 matmuls cannot be made batch-invariant; its bf16 ones can)."""
        return "bf16" if self.exact and self.dtype == "auto" else self.dtype

    def sampling(self) -> SamplingParams:
        from specctl.speculative.sampling import SamplingParams
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def inert(self) -> dict:
        """The options that cannot change this run's answers, each with its default: another
        method's options, and --speculate for ar (which drafts nothing). Runs that differ only
        in these are the same run (key, depends.options_digest)."""
        return {f.name: f.default for f in fields(self)
                if (f.metadata.get("method") and self.method not in (f.metadata["method"], "auto"))
                or (f.name == "speculate" and self.method == "ar")}

    def _check_types(self) -> None:
        """Each setting of a plain type has it (the API's keywords come unchecked: "5" and
        3.5 for max_tokens failed deep in the run with a TypeError): int not bool, float an
        int too, str, bool; None where the field allows it. stop has its own check."""
        for f in fields(self):
            kinds = [k.strip() for k in str(f.type).split("|")]
            v = getattr(self, f.name)
            if v is None and "None" in kinds or not set(kinds) - {"None"} <= _PLAIN.keys():
                continue
            kind = next((k for k in kinds if k != "None" and _PLAIN[k][0](v)), None)
            if kind is None:
                what = " or ".join({"int": "an integer", "float": "a number",
                                    "str": "a string", "bool": "True or False"}[k]
                                   for k in kinds if k != "None")
                # (by its name, not its flag: the command line parses its values, so only
                # the API and a recipe's keys can give one of another type)
                raise SpecctlError(f"{f.name} must be {what}, got {v!r}")
            object.__setattr__(self, f.name, _PLAIN[kind][1](v))

    def key(self, extra: str, legacy: bool = False) -> str:
        """What makes two runs the same run (for --resume): the input's contents (not the
        path it was named by) and the settings that decide the answers, not the ones that only
        decide how they are computed: a run resumes with another batch size (after running out
        of memory) or prefill chunk. `extra`: the input's hash, the model, the method's
        artifact, and the device type and dtype the model runs in. legacy: the older form of
        the key (every field but skip_bad and limit, `extra` without the device and dtype),
        still accepted so that runs recorded under it resume. The inert options count at their
        defaults (a run recorded before they did, with one of them set, does not resume: its
        recorded options digest holds it too)."""
        d = asdict(self)
        if not legacy:
            d.update(self.inert())
        for name in ("skip_bad", "limit", "threads") if legacy else UNKEYED:
            d.pop(name)
        for name, default in (("attention", "auto"), ("cuda_graphs", True), ("exact", False),
                              ("cudnn_attention", False), ("ray", None), ("actors", 2),
                              ("speculate", "fixed"), ("logprobs", None), ("job_cache", False),
                              ("job_cache_file", None)):
            if name in d and d[name] == default:   # at their defaults left out: keys
                # without them still match (ray and actors: unkeyed but in legacy keys)
                d.pop(name)
        if legacy and d["prefill_chunk"] is None:   # (legacy keys held it: 512 before it
            d["prefill_chunk"] = 512                # followed the device)
        if d["prompt_grams"] is None:   # (its default follows --speculate; self-draft's
            d["prompt_grams"] = False   # signature says what it did) keyed as it used to be
        d["grid"] = False   # (unkeyed, but held at False by the keys made while it was keyed)
        return hashlib.sha256(json.dumps([d, extra], sort_keys=True).encode()).hexdigest()[:16]
