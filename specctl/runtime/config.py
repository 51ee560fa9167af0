"""What a `generate` run is: its settings (GenerateConfig), the decoding methods and their
named variants, and the key that makes two runs the same run (for --resume)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

from specctl.errors import SpecctlError
from specctl.speculative.sampling import SamplingParams

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


# GenerateConfig fields that do not make a run another run (see GenerateConfig.key)
# (--limit too: a run of the first N lines resumes to do them all; --device and --dtype as
# given: the caller keys the device type and dtype the model runs in instead)
UNKEYED = ("input", "skip_bad", "batch_size", "prefill_chunk", "device", "dtype", "limit",
           "threads", "kv_memory", "gpu_memory")


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
    speculate: str = "auto"          # auto: the goodput controller's budgets; fixed: the drafter's
    threads: int | None = None        # CPU threads per step; None: measured (runtime/threads.py)
    kv_memory: str | None = None      # KV cache budget ('8GB'); None: CUDA by gpu_memory, CPU all
    gpu_memory: float = 0.9           # CUDA: the share of the GPU weights + cache + work may use
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
        if self.method not in METHODS + ("auto",):
            raise SpecctlError(f"unknown method {self.method!r} (available: "
                               f"{', '.join(METHODS)}, auto)")
        if self.batch_size < 1:
            raise SpecctlError("--batch-size must be at least 1")
        if self.max_tokens < 1:
            raise SpecctlError("--max-tokens must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise SpecctlError("--limit must be at least 1")
        if any(s == "" for s in self.stop):
            raise SpecctlError("--stop: an empty string stops nothing; give the text to stop at")
        check_attention(self.attention)
        if self.threads is not None and self.threads < 1:
            raise SpecctlError("--threads must be at least 1")
        if self.kv_memory is not None and parse_size(self.kv_memory) <= 0:
            raise SpecctlError("--kv-memory must be more than 0")
        if not 0.0 < self.gpu_memory <= 1.0:
            raise SpecctlError(f"--gpu-memory must be in (0, 1], got {self.gpu_memory}")
        if self.speculate not in SPECULATE:
            raise SpecctlError(f"--speculate must be auto or fixed, got {self.speculate!r}")
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
        artifact, and the device type and dtype the model runs in. legacy: the older form of
        the key (every field but skip_bad and limit, `extra` without the device and dtype),
        still accepted so that runs recorded under it resume."""
        d = asdict(self)
        for name in ("skip_bad", "limit", "threads") if legacy else UNKEYED:
            d.pop(name)
        for name, default in (("attention", "sdpa"), ("cuda_graphs", True),
                              ("speculate", "fixed")):
            if d[name] == default:   # at their defaults left out: keys without them still match
                d.pop(name)
        return hashlib.sha256(json.dumps([d, extra], sort_keys=True).encode()).hexdigest()[:16]
