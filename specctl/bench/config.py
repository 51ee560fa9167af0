"""What a bench run is: its settings (BenchConfig) and the schema of its results.json."""

from __future__ import annotations

from dataclasses import dataclass, field

from specctl.errors import SpecctlError
from specctl.runtime.jobs.config import METHODS, GenerateConfig, check_attention, split_variant

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
  "attention": str,                    # the backend that ran (config's auto resolved)
  "launches": {"step", "layer"} | null,   # CUDA: kernels an ar step at batch 1 launches
  "env": {"specctl", "torch", "transformers", "python", "machine", "cpus", "threads", "gpu"},
  "peak_memory_kind": "cuda_max_allocated" | "process_rss_high_water",
  "reference": str,                    # where the ar batch-1 outputs came from
  "skipped": [{"method", "batch_size" (null = all), "reason"}],
  "rows": [{
    "method", "engine": "specctl" | "transformers", "batch_size",
    "requests", "new_tokens", "steps" (null for transformers),
    "tokens_per_s": {"median", "min", "max", "iqr", "spread_pct", "runs": [float]},
    "wall_s": {"median", "runs": [float]},
    "speedup_vs_ar": float | null,     # median over rounds of tokens/s over ar's of the same
                                       # round (paired), same batch size
    "speedup_runs": [float] | null,    # those per-round ratios
    "mean_accepted_tokens", "acceptance_rate", "ctar": {"1".."6"}, "zero_accept_share",
    "padding_ratio",                   # the five above: null for transformers rows
    "speculation": {...} | null,       # --speculate auto's record (metrics.speculation_metrics)
    "time_split": {"steps_s", "prefill_s", "prefill_forwards", "prefill_replays" (of
                   those, replays of prefill's pieces; absent before 2026-12-01), "search_s",
                   "learn_s", "prefill_chunk", "piece_ms": {"prompts", "eager",
                   "replay"} | null (what a prefill forward of that many prompts of a piece
                   each cost eagerly and replayed, where the run priced its pieces; absent
                   before 2026-12-04)} | null,
                                       # the first repeat's decode steps and prefill
    "accepted_from": {"tokens", "job", "context", "corpus"} | null,
                                       # Self-Draft: the first repeat's accepted drafts and
                                       # the share each cache's candidates made
    "peak_memory_mb",                  # see peak_memory_kind
    "run_memory_mb": float | null,     # CUDA: peak minus what was allocated before the run
                                       # (KV cache + activations); null on CPU
    "exact": bool,                     # run under --exact (batch-invariant numerics)
    "matches_ar": bool | null,         # vs ar at the same batch size (an exact row: vs
                                       # ar:exact where the bench runs it)
    "matches_ar_b1": bool | null,      # vs ar (or ar:exact) at batch 1
    "mismatch": {"vs", "prompts", "first": {"index", "turn", "token"}} | null,
    "repeats_identical": bool,
    "effective_batch": int,            # sequences it really ran at once: min(batch_size, prompts)
    "drain_bound": bool,               # prompts < 4 x batch_size (bench.conditions)
    "captures": int,                   # CUDA graph shapes captured inside its timed repeats
    "captures_runs": [int],            # (0 without graphs) ... per repeat
    "divergence": {"vs", "differing", "analyzed", "max_gap", "max_steps",  # where it differs
                   "near_ties",   # every gap within what another batch shape moves logits
                   "gaps": [{"index", "token", "gap", "step", "steps", "shape", "near_tie"}]}
  }],
  "category_rows": [{"method", "batch_size", "category", "requests", "new_tokens",
                     "tokens_per_s": {...as above}, "speedup_vs_ar",
                     "mean_accepted_tokens", "ctar", "zero_accept_share"}],
  "ok": bool                           # every specctl row matched ar (its ar)
}
"""


@dataclass(frozen=True)
class BenchConfig:
    input: str | None                    # JSONL prompts; None = ShareGPT first turns
    model: str | None = None
    methods: tuple[str, ...] = ("ar", "self-draft", "draft-verify", "hf", "hf-prompt-lookup")
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    max_tokens: int = 256
    repeats: int = 3
    warmup: int = 3
    limit: int | None = None             # first N prompts (ShareGPT default: 16)
    chat: bool = True
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    prefill_chunk: int | None = None     # (None: GenerateConfig's, by the device)
    attention: str = "auto"
    cuda_graphs: bool = True
    cudnn_attention: bool = False        # (a model-load setting, as cuda_graphs: bench loads it)
    # GenerateConfig fields every run takes (each method's options, speculate, threads, KV
    # memory): a new option passes through here without changes to the bench
    method_options: dict = field(default_factory=dict)

    def __post_init__(self):
        known = METHODS + PEERS
        bad = [m for m in self.methods if m.partition(":")[0] not in known]
        if bad:
            raise SpecctlError(f"unknown method {bad[0]!r} (available: {', '.join(known)})")
        if not self.methods:
            raise SpecctlError("--methods is empty")
        if len(set(self.methods)) != len(self.methods):
            raise SpecctlError("--methods names a method twice")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise SpecctlError("--batch-sizes must be positive integers")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):   # (one row a size: the same)
            raise SpecctlError("--batch-sizes names a batch size twice")
        if self.max_tokens < 1:
            raise SpecctlError("--max-tokens must be at least 1")
        if self.repeats < 1:
            raise SpecctlError("--repeats must be at least 1")
        if self.warmup < 0:
            raise SpecctlError("--warmup must be at least 0")
        if self.limit is not None and self.limit < 1:
            raise SpecctlError("--limit must be at least 1")
        check_attention(self.attention)
        for m in self.methods:   # the checks generate makes (draft-verify's options too)
            if m.partition(":")[0] in METHODS:
                self.generate_config(m, self.batch_sizes[0])

    def generate_config(self, method: str, batch_size: int) -> GenerateConfig:
        """method may name a variant ('self-draft:no-corpus'): its settings override."""
        base, overrides = split_variant(method)
        opts = {**self.method_options, **overrides}
        return GenerateConfig(input=self.input or "sharegpt", model=self.model,
                              method=base, batch_size=batch_size,
                              max_tokens=self.max_tokens, temperature=0.0, seed=self.seed,
                              chat=self.chat, device=self.device, dtype=self.dtype,
                              prefill_chunk=self.prefill_chunk, attention=self.attention,
                              cuda_graphs=self.cuda_graphs,
                              cudnn_attention=self.cudnn_attention, **opts)


def parse_list(text: str, what: str, conv=str) -> tuple:
    parts = [x.strip() for x in text.split(",")]
    if not any(parts):
        raise SpecctlError(f"{what} is empty")
    if not all(parts):   # ("1,,4": a value lost in typing, not a list of two)
        raise SpecctlError(f"{what}: an empty item in {text!r}")
    try:
        return tuple(conv(x) for x in parts)
    except ValueError:
        raise SpecctlError(f"{what}: expected a comma-separated list, got {text!r}") from None
