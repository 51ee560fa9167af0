"""CUDA-graph replay of decoding forwards (the GPU fast path).

On a GPU a small model's eager forward is bound by kernel launches, not by the GPU: hundreds of
launches per forward cost more CPU time than the GPU needs for the math. So the forwards of a
decoding step are captured once per shape and replayed:

- a captured shape is (batch bucket B_b, new tokens per sequence n, layer plan): every sequence
  brings the same n tokens (an `ar` step: n = 1; a draft forward: n = 1 with a skip plan; a
  verify of chains, trees or Self-Draft's candidates + branches, which the runner pads to a
  common n: see `padded_n`). Prefill and anything past `max_n` tokens run eagerly.
- inputs are copied into static buffers: tokens and positions [B_b * n], slot and prefix length
  per sequence [B_b], and each sequence's mask among its new tokens [B_b, n, n] (causal for a
  chain). Rows past the real batch point to a scratch slot (the KV cache has one spare slot on
  CUDA), so padding never touches a real sequence; the padded rows' outputs are dropped. Batch
  buckets are powers of two up to the slot count.
- attention reads the full cache length of each slot with a mask computed on the device from
  the prefix lengths and the local masks, so the captured kernels do not depend on lengths.
- the captured graph ends with the LM head: a replay yields [B_b * n, V] logits.
No host synchronization happens inside a replay; the caller reads back only what it decides on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specctl.engine.attention import SdpaMeta
from specctl.engine.batch import ForwardBatch, LayerPlan


@dataclass
class _Captured:
    kv: object                # the cache the graph's pointers refer to (kept alive with it)
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor      # [Bb * n]
    positions: torch.Tensor   # [Bb * n]
    slots: torch.Tensor       # [Bb]
    prefix: torch.Tensor      # [Bb]
    local: torch.Tensor       # [Bb, n, n] bool: the mask among each sequence's new tokens
    logits: torch.Tensor      # [Bb * n, V]


class CudaGraphs:
    def __init__(self, model, max_n: int = 128):
        self.model = model
        self.max_n = max_n
        self.pool = torch.cuda.graph_pool_handle()
        self.cache: dict[tuple, _Captured] = {}
        self.replays = 0

    @staticmethod
    def bucket(b: int) -> int:
        return 1 << (b - 1).bit_length()

    def padded_n(self, n: int) -> int | None:
        """Tokens per sequence a step of at most n is padded to: exact up to 16 (chain
        verifies), then multiples of 16 (trees, Self-Draft), so few shapes get captured.
        None past max_n (that step runs eagerly)."""
        m = n if n <= 16 else -(-n // 16) * 16
        return m if m <= self.max_n else None

    def eligible(self, batch: ForwardBatch, kv) -> bool:
        n = batch.num_new[0]
        return (kv.scratch is not None and n <= self.max_n
                and all(m == n for m in batch.num_new))

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, kv, plan: LayerPlan) -> torch.Tensor | None:
        if plan.start != 0 or plan.capture is not None or not self.eligible(batch, kv):
            return None
        B, n = len(batch.seqs), batch.num_new[0]
        if any(c.kv is not kv for c in self.cache.values()):
            # graphs hold raw pointers into one KV cache: a new cache means new graphs (and the
            # old ones must go, or a reused id() could replay into freed memory)
            self.cache.clear()
            self.pool = torch.cuda.graph_pool_handle()   # the old pool dies with its graphs
        key = (self.bucket(B), n, plan)
        cap = self.cache.get(key)
        if cap is None:
            cap = self.cache[key] = self._capture(kv, self.bucket(B), n, plan)
        Bb = cap.slots.shape[0]
        cap.tokens[:B * n].copy_(batch.tokens, non_blocking=True)
        cap.positions[:B * n].copy_(batch.positions, non_blocking=True)
        slots = torch.tensor(batch.seq_slots + [kv.scratch] * (Bb - B), dtype=torch.long)
        prefix = torch.tensor(batch.prefix_lens + [0] * (Bb - B), dtype=torch.long)
        cap.slots.copy_(slots, non_blocking=True)
        cap.prefix.copy_(prefix, non_blocking=True)
        if n > 1:
            local = self._tril(n).expand(Bb, n, n).clone()
            for b, s in enumerate(batch.seqs):
                if s.mask is not None:
                    local[b] = s.mask
            cap.local.copy_(local, non_blocking=True)
        cap.graph.replay()
        self.replays += 1
        return cap.logits[:B * n]

    _trils: dict[int, torch.Tensor] = {}

    @classmethod
    def _tril(cls, n: int) -> torch.Tensor:
        t = cls._trils.get(n)
        if t is None:
            t = cls._trils[n] = torch.ones(n, n, dtype=torch.bool).tril()
        return t

    def _forward(self, kv, Bb: int, n: int, plan: LayerPlan, tokens, positions, slots, prefix,
                 local):
        m = self.model
        dev = m.device
        idx = torch.arange(n, device=dev)
        rows = (prefix[:, None] + idx[None, :]).reshape(-1)               # [Bb * n]
        slot_tok = slots.repeat_interleave(n)                             # [Bb * n]
        # column c of sequence b: committed (c < prefix) or new token c - prefix when the
        # local mask lets the query see it
        rel = torch.arange(kv.max_len, device=dev)[None, None, :] - prefix[:, None, None]
        new = local.gather(2, rel.clamp(0, n - 1).expand(Bb, n, kv.max_len))
        mask = (rel < 0) | ((rel < n) & new)                             # [Bb, n, max_len]
        meta = SdpaMeta(slots, kv.max_len, n, True, None, None, mask[:, None])
        x = torch.nn.functional.embedding(tokens, m.embed)
        end = m.cfg.num_layers if plan.end is None else plan.end
        h = m._layers(x, positions, slot_tok, rows, meta, kv, plan, end)
        return m.logits(h)

    @torch.inference_mode()
    def _capture(self, kv, Bb: int, n: int, plan: LayerPlan) -> _Captured:
        dev = self.model.device
        tokens = torch.zeros(Bb * n, dtype=torch.long, device=dev)
        positions = torch.zeros(Bb * n, dtype=torch.long, device=dev)
        slots = torch.full((Bb,), kv.scratch, dtype=torch.long, device=dev)
        prefix = torch.zeros(Bb, dtype=torch.long, device=dev)
        local = self._tril(n).to(dev).expand(Bb, n, n).clone()
        args = (kv, Bb, n, plan, tokens, positions, slots, prefix, local)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):   # warm-up outside the graph (allocator, autotuning)
            for _ in range(2):
                self._forward(*args)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self._forward(*args)
        return _Captured(kv, g, tokens, positions, slots, prefix, local, logits)
