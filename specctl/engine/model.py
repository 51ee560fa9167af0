"""The decoder forward over a packed batch (see batch.py) and a per-slot KV cache: one decoder
for every family engine/config.py reads, honouring its declared options (engine/layer.py).

    hidden = model.forward(batch, kv, plan)      # [T, D] residual stream after plan's last layer
    logits = model.logits(hidden)                # [T, V] fp32: final RMSNorm + LM head
    tokens = model.argmax(hidden)                # [T] greedy tokens, no fp32 [T, V] made

The model knows nothing of tokenizers or decoding methods. Weights are plain tensors in HF layout
(`[out, in]`), with q/k/v and gate/up fused at load time so each block does two matmuls
for attention and two for the MLP.
"""

from __future__ import annotations

import importlib.util
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from specctl.engine.attention import (ATTENTION, BACKENDS, FLEX_BLOCK, load_fused,
                                      sdpa_attention, sdpa_meta)
from specctl.engine.inference import inference
from specctl.engine.batch import FULL, ForwardBatch, LayerPlan
from specctl.engine import exact
from specctl.engine.config import ModelConfig
from specctl.engine.kv import BLOCK, KVCache, row_bytes
from specctl.engine.layer import ACTS, Layer, family_layers, norm, norm_weight, plain, softcap
from specctl.engine.rope import Rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's rms_norm: on CUDA one fused kernel accumulating in fp32, where the spelled-out
    reference (float, pow, mean, rsqrt, mul, cast, mul) launches eight; a small model's step
    is bound by launches (issue 7). fp32 results equal the reference's up to rounding."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, hd]; cos, sin: [T, 1, hd] from Model._rope (the rotate-half layout of HF
    Llama, with rotate_half's sign folded into sin's first half): x * cos + rotate_half(x) * sin
    in three launches (mul, cat, addcmul) instead of five."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((x[..., half:], x[..., :half]), dim=-1), sin)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ b) for x [M, in], w [out, in] (F.linear).

    On the CPU, for up to GEMM_ROWS rows, it runs as (w @ x.T).T with the rows padded with
    zeros to a count MKL has a fast kernel for (gemm_rows). MKL computes x @ w.T over a few
    rows as matrix-vector products that each read all of w, and w @ x.T as one GEMM that reads
    w once; a decoding step is bound by reading the weights: on the 2-core EPYC the demo
    model's 1-token step took 58 ms and its 2-token step 107 ms this way against 36 and 36 ms
    (bench-results/2026-11-23-cpu-gemm/cpu_matmul.py). Past a few hundred rows (a prefill) F.linear is a few percent
    faster again."""
    m = x.shape[0] if x.dim() == 2 else 0
    if x.device.type != "cpu" or CUDA_PATH[0] or not m or m > GEMM_ROWS:
        return F.linear(x, w, b)
    p = gemm_rows(m)
    xp = x if p == m else F.pad(x, (0, 0, 0, p - m))
    y = torch.mm(w, xp.t())[:, :m].t().contiguous()
    return y + b if b is not None else y


def gemm_rows(m: int) -> int:
    """The row count a CPU matmul of m rows runs at: MKL's GEMM kernels take the rows of
    w @ x.T in tiles of 8, and a remainder of 2-7 rows costs about as much as a whole tile or
    more; one row alone would run as a matrix-vector product, three slower than four. Measured
    on the 2-core EPYC with the demo model's weights (`python bench-results/2026-11-23-cpu-gemm/cpu_matmul.py --rows
    1-24,32`, fastest of 30): 1 row 10.8 ms, padded to 2 3.9; 3 rows 8.1, as 4 5.3; 11 rows
    24.0, as 16 19.5; 15 rows 33.1, as 16 19.8; 23 rows 29.6, as 24 21.0 (9 and 17 rows cost
    what 16 and 24 do, so they are left). Padding costs little where it does not help: a step
    of few rows is bound by reading the weights."""
    if m == 1:
        return 2
    if m == 3:
        return 4
    if m > 8 and m % 8 > 1:
        return -(-m // 8) * 8
    return m


def tile_rows(m: np.ndarray) -> np.ndarray:
    """The row count whose cost a CPU step of m packed rows pays: 3 as 4, 5-7 as 8, and past
    8 up to the next multiple of 8 (gemm_rows pads most of these; 9 and 17 rows, left
    unpadded, cost what 16 and 24 do, and 5-7 what 8 does). One row stays one: gemm_rows pads
    it to two, but the table measures it as it runs. The step-cost table prices CPU
    steps by it (StepTable.ms): at batch 8 one sequence's draft token makes 9 rows, and it
    costs what a draft token for each of the 8 does. (Of every entry of an
    integer array.)"""
    return np.where(m <= 2, m, np.where(m <= 4, 4, -(-m // 8) * 8))


GEMM_ROWS = 256
# the CPU takes the branches CUDA takes in linear and _residual (engine/launches.py counts the
# CUDA path's kernels on the CPU this way)
CUDA_PATH = [False]


def _residual(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              lin=linear):
    """x + a @ w.T (+ b): on CUDA the residual add done by the matmul's epilogue (one launch,
    not two; a small model's step is bound by launches)."""
    if b is not None or (x.device.type == "cpu" and not CUDA_PATH[0]) or lin is not linear:
        return x + lin(a, w, b)
    return torch.addmm(x, a, w.t())


class Model:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor]):
        """weights: HF-named tensors already on the target device and dtype. A layer's are
        taken out of the dict as the layer is built, so the ones it concatenates are freed
        one layer at a time (a second copy of the weights never builds up)."""
        self.cfg = cfg
        self.embed = weights["model.embed_tokens.weight"]
        self.lm_head = weights["model.embed_tokens.weight"] if cfg.tie_embeddings \
            else weights["lm_head.weight"]
        self.norm = norm_weight(weights["model.norm.weight"], cfg)
        self.layers = []
        for i in range(cfg.num_layers):
            pre = f"model.layers.{i}."
            mine = [k for k in weights if k.startswith(pre)]
            self.layers.append(Layer({k[len(pre):]: weights.pop(k) for k in mine}, cfg))
        self.device = self.embed.device
        self.dtype = self.embed.dtype
        # Gemma's scale is rounded to the model's dtype first (transformers' normalizer);
        # Granite's multiplier is applied as it is
        self._embed_scale = torch.tensor(cfg.embed_scale, dtype=self.dtype).item() \
            if cfg.model_type in ("gemma2", "gemma3_text") else cfg.embed_scale
        self._plain = plain(cfg)   # Llama's layers: the lean loop's (the fused layer runs every family)
        self._ropes = [Rope(cfg.rope, cfg.head_dim, self.device)]
        if cfg.local_rope is not None:   # the windowed layers' own (Gemma 3)
            self._ropes.append(Rope(cfg.local_rope, cfg.head_dim, self.device))
        self.name = "model"       # where it came from, for messages (the loader sets it)
        self.tokens_computed = 0  # packed tokens through the layers, for the no-padding check
        self.graphs = None        # engine.graphs.CudaGraphs when enabled (CUDA only)
        self._graphs = None       # the graphs set aside while --exact runs eagerly
        self.attention = "sdpa"   # attention backend: one of ATTENTION but auto
        self._fused = None        # engine.fused, where the fused layer runs
        self.attend = BACKENDS["sdpa"]
        self.exact = False        # batch-invariant numerics (set_exact)
        self.linear, self.act, self.apply_rope = linear, ACTS[cfg.act][0], apply_rope
        self._exact_linear = self._rope_tables = None
        self.exact_check = ""      # what --exact chose on this machine and its check's cost

    def set_attention(self, backend: str) -> None:
        """sdpa, flex (engine/attention.py), fused (the fused layer, engine/fused.py: CUDA,
        or the CPU under Triton's interpreter for tests) or auto: fused on CUDA where Triton
        is installed, else sdpa."""
        if self.exact:
            raise ValueError("choose the attention before --exact (set_exact(False) first)")
        if backend == "auto":
            backend = "fused" if self.device.type == "cuda" and \
                importlib.util.find_spec("triton") is not None else "sdpa"
        if backend == "fused":
            self._fused = load_fused(self.device)
            why = self._fused.unsupported(self.cfg)
            if why:   # (then it is sdpa throughout: forwards, --exact, graphs)
                warnings.warn(f"the fused layer cannot run this {self.cfg.model_type} model's "
                              f"{why}: it runs the unfused layer (sdpa)", stacklevel=2)
                backend, self._fused = "sdpa", None
        elif backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r} (one of "
                             f"{', '.join(ATTENTION)})")
        self.attention, self.attend = backend, BACKENDS.get(backend, sdpa_attention)
        if self.graphs is not None:   # captured with the other backend
            self.graphs.cache.clear()

    def set_exact(self, on: bool, known: str | None = None) -> None:
        """--exact: every op on the decoding path gives a row the same bits whatever else is in
        the forward (engine/exact.py), checked on this model at the first call (the probe's
        linears in order, each self-checked: engine/selfcheck.py; exact_check says what was
        chosen and what it cost). Raises ValueError where none holds, naming what varied.
        known: the linear that check chose for this model on this machine before (kept by the
        caller, runtime/jobs/exactcheck.py), taken without checking again.
        On CUDA with the fused layer every forward runs it and the graphs stay; with the
        unfused one forwards run eagerly."""
        if on and self._exact_linear is None:
            if self.device.type not in ("cpu", "cuda"):
                raise ValueError(f"--exact runs on the CPU and CUDA, not {self.device.type}")
            if known is None:
                self._choose_exact()
            else:
                self._exact_rope()
                self._exact_linear = exact.named_linear(known, self.device.type == "cuda")
                self.exact_check = f"{known}, probed and self-checked for this model on this " \
                                   "machine before"
        if on != self.exact and self.device.type == "cuda" and self.attention != "fused":
            # eager under --exact: its attention groups are built on the host per forward
            self._graphs, self.graphs = self.graphs, self._graphs
        elif on != self.exact and self.graphs is not None:
            self.graphs.cache.clear()   # (captured with the other numerics' kernels)
        self._use_exact(on)

    def _use_exact(self, on: bool) -> None:
        self.exact = on
        self.attend = exact.exact_attention if on else BACKENDS.get(self.attention,
                                                                     sdpa_attention)
        self.linear = self._exact_linear if on else linear
        self.act = ACTS[self.cfg.act][1 if on else 0]
        self.apply_rope = exact.apply_rope if on else apply_rope

    def linear_weights(self) -> list[torch.Tensor]:
        """Every layer's matmul weights in order (QKV, O, gate/up, down): what --exact probes."""
        return [w for L in self.layers for w in (L.wqkv, L.wo, L.w_gate_up, L.w_down)]

    def _exact_rope(self) -> None:
        self._rope_tables = [exact.RopeTable(r, self.dtype) for r in self._ropes]
        for t in self._rope_tables:
            t.ensure(self.cfg.max_position)   # (no forward then looks at positions)

    def _choose_exact(self) -> None:
        from specctl.engine.selfcheck import self_check
        t0 = time.perf_counter()
        dt = {torch.float32: "fp32", torch.bfloat16: "bf16",
              torch.float16: "fp16"}.get(self.dtype, str(self.dtype))
        self._exact_rope()
        varied = None
        for f in exact.probe(self.linear_weights(), self.lm_head, self.cfg.head_dim):
            self._exact_linear = f
            self._use_exact(True)
            graphs, self.graphs = self.graphs, None   # (its caches must not evict theirs)
            try:
                varied = self_check(self)
            except BaseException:   # (no unchecked linear left for a later set_exact)
                self._exact_linear = None
                raise
            finally:
                self._use_exact(False)
                self.graphs = graphs
            if varied is None:
                self.exact_check = f"{f.__name__}, probed and self-checked on this model " \
                                   f"in {time.perf_counter() - t0:.1f} s"
                return
        self._exact_linear = None
        if varied is None:
            raise ValueError(f"--exact: this machine's {dt} matmuls give a row different "
                             "bits at different row counts (try --dtype bf16)")
        raise ValueError(f"--exact: on this machine in {dt}, {varied} gave different bits; "
                         "--exact cannot hold here")

    def new_kv_cache(self, num_slots: int, max_len: int, budget: int | None = None) -> KVCache:
        """A KV cache for num_slots sequences of up to max_len rows: contiguous, or paged when
        `budget` (bytes) cannot hold every slot at max_len (engine/kv.py). With CUDA graphs the
        model keeps the last one and hands it out again (all slots emptied) for the same shape: the
        captured graphs point into it, so a new run (a bench repeat, the next generate batch)
        replays them instead of capturing again, which costs time and, in bf16, can pick other
        kernels and so round differently. Only one runner may use a model's cache at a time."""
        c = self.cfg
        if self.attention == "flex":   # flex reads whole 128-row blocks of the cache
            max_len = -(-max_len // FLEX_BLOCK) * FLEX_BLOCK
        blocks = None
        if budget is not None:
            blocks = budget // (BLOCK * row_bytes(c.num_layers, c.num_kv_heads, c.head_dim,
                                                  self.dtype))
            spare = int(self.graphs is not None)   # a contiguous cache's graph scratch slot
            if (blocks - 1) * BLOCK < max_len:   # (a paged pool's null block is one)
                raise ValueError(f"a KV cache budget of {_mib(budget)} holds "
                                 f"{max(blocks - 1, 0) * BLOCK} rows, less than one sequence "
                                 f"({max_len})")
            if blocks >= (num_slots + spare) * -(-max_len // BLOCK):
                blocks = None   # every slot fits at full length: the contiguous layout
            elif self.attention == "flex":
                raise ValueError(f"a KV cache budget of {_mib(budget)} holds fewer "
                                 f"than {num_slots} sequences of {max_len} rows, and flex "
                                 "attention reads only a contiguous cache (use --attention "
                                 "sdpa for a paged one)")
            else:
                blocks -= 1   # (the pool's null block comes on top)
        key = (num_slots, max_len, blocks)
        if self.graphs is not None:
            kept = getattr(self, "_kv", None)
            if kept is not None and kept[0] == key:
                for slot in range(num_slots):
                    kept[1].reset(slot)
                return kept[1]
            # another shape: let the old cache (and the graphs pointing into it) go first, so
            # the two are never held together (a 7B model's cache is most of the GPU)
            self._kv = None
            self.graphs.cache.clear()
            self.graphs.kept.clear()
        kv = KVCache(c.num_layers, num_slots, max_len, c.num_kv_heads, c.head_dim,
                     self.dtype, self.device, spare=self.graphs is not None, num_blocks=blocks)
        if self.graphs is not None:
            self._kv = (key, kv)
        return kv

    def _rope(self, positions: torch.Tensor, local: bool = False):
        """cos, sin [T, 1, hd] for apply_rope (sin's first half negated: rotate_half's sign);
        local: the sliding-window layers' rope where it differs (engine/rope.py)."""
        k = int(local and len(self._ropes) > 1)
        if self.exact:
            return self._rope_tables[k](positions)
        return self._ropes[k](positions, self.dtype)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """[T] tokens -> [T, D] layer-0 inputs (times the family's embedding scale)."""
        x = F.embedding(tokens, self.embed)
        return x if self._embed_scale == 1.0 else x * self._embed_scale

    @inference
    def forward(self, batch: ForwardBatch, kv: KVCache, plan: LayerPlan = FULL,
                hidden: torch.Tensor | None = None):
        """Run layers [plan.start, plan.end) over the packed batch, writing its KV rows.

        hidden: [T, D] input hidden states of layer plan.start (required iff start > 0).
        Returns the [T, D] residual stream after the last layer run, or (that, captured) when
        plan.capture is set, captured being the [T, D] input of layer plan.capture.
        """
        c = self.cfg
        end = c.num_layers if plan.end is None else plan.end
        if not 0 <= plan.start <= end <= c.num_layers:
            raise ValueError(f"bad layer range [{plan.start}, {end})")
        if plan.start == 0:
            x = self.embed_tokens(batch.tokens)
        else:
            if hidden is None or hidden.shape != (batch.num_tokens, c.hidden_size):
                raise ValueError("a plan starting past layer 0 needs hidden [T, D]")
            x = hidden.to(self.dtype)
        self.tokens_computed += batch.num_tokens
        return self._layers(x, batch.positions, sdpa_meta(batch, kv), kv, plan, end)

    def _layers(self, x, positions, meta, kv: KVCache, plan: LayerPlan, end: int):
        """The layer loop over packed tokens (shared by the eager and the CUDA-graph path)."""
        if self.attention == "fused" and (
                self.exact or meta.n_max <= self._fused.FUSED_N):
            # (under --exact every forward: which kernels a row meets must not follow the batch)
            return self._fused.layers(self, x, positions, meta, kv, plan, end)
        if not self._plain:
            return family_layers(self, x, positions, meta, kv, plan, end)
        c = self.cfg
        cos, sin = self._rope(positions)
        T, H, KV, hd = x.shape[0], c.num_heads, c.num_kv_heads, c.head_dim

        def attn(i, x):
            L = self.layers[i]
            qkv = self.linear(rms_norm(x, L.attn_norm, c.rms_eps), L.wqkv, L.bqkv)
            qk = self.apply_rope(qkv[:, :(H + KV) * hd].view(T, H + KV, hd), cos, sin)
            q, k = qk[:, :H], qk[:, H:]       # queries and keys rotated in one pass
            kv.write(i, meta.index, k, qkv[:, (H + KV) * hd:].view(T, KV, hd))
            o = self.attend(q, kv.k[i], kv.v[i], meta).reshape(T, H * hd)
            return _residual(x, o, L.wo, L.bo, self.linear)

        def mlp(i, x):
            L = self.layers[i]
            g, u = self.linear(rms_norm(x, L.mlp_norm, c.rms_eps), L.w_gate_up,
                               L.b_gate_up).chunk(2, dim=-1)
            return _residual(x, self.act(g) * u, L.w_down, L.b_down, self.linear)
        return plan.run(x, end, attn, mlp)

    @inference
    def run(self, batch: ForwardBatch, kv: KVCache, plan: LayerPlan = FULL,
            hidden: torch.Tensor | None = None, head=None, pad_n: int = 1):
        """The one entry point of decoding forwards, replayed from a captured CUDA graph when
        one fits the batch (engine/graphs.py), else run eagerly. Runs `plan` (from hidden
        [T, D] when it starts past layer 0) and returns the [T, D] states after its last layer
        (for logits / argmax / top1, on just the rows the caller needs), or, given a `head`,
        what head(h, positions, attention meta) returns from them (a tuple of
        [T, ...] tensors; Kangaroo's adapter is one). A head has a hashable `key` naming its
        computation and must keep the tensors it reads in place across calls (a graph replays
        them by address). With plan.capture, what the head gets (or run returns) is
        (states, captured states), as from forward. Outputs of a replay are static buffers the
        next replay overwrites: a caller that keeps them past its next forward clones them.
        pad_n: the least tokens a sequence a replay pads to (CudaGraphs.run). A grid batch's
        states (ForwardBatch.grid: m rows each of its B sequences) come as [B, m, D], a view
        of a replay's padded rows where it has some: argmax reads them in place."""
        if self.graphs is not None:
            out = self.graphs.run(batch, kv, plan, hidden, head, pad_n)
            if out is not None:
                self.tokens_computed += batch.num_tokens
                return out
        h = self.forward(batch, kv, plan, hidden)
        if head is None:
            return h if batch.template is None or plan.capture is not None else \
                h.view(len(batch.num_new), batch.num_new[0], -1)
        return head(h, batch.positions, sdpa_meta(batch, kv))

    @inference
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, D] residual stream after the last layer -> [T, V] fp32 logits."""
        return self._head(hidden).float()

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model's dtype, with the family's multiplier and soft-cap (argmax
        takes them too: rounding may tie two logits, and the reference picks the first)."""
        c = self.cfg
        x = norm(hidden, self.norm, c.rms_eps)   # (a grid's [B, m, D] view, read in place
        if x.dim() > 2:                          # into new rows, Model.run: its [B m] rows)
            x = x.view(-1, x.shape[-1])
        out = self.linear(x, self.lm_head)
        if c.logit_scale != 1.0:
            out = out * c.logit_scale
        return softcap(out, c.final_softcap)

    @inference
    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, D] -> [T] greedy tokens, from logits in the model's dtype: the argmax of the fp32
        logits (an upcast is exact), without writing and reading a [T, V] fp32 tensor."""
        return self._head(hidden).argmax(-1)


def _mib(n: int) -> str:
    """A byte count as messages say it (a budget under 1 MiB is not "0 MiB")."""
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB" if n >= 2**10 \
        else f"{n} bytes"
