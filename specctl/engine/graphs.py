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
- the captured graph ends with the LM head: a replay yields [B_b * n, V] logits. Or with a
  caller's head (Model.forward_logits): Kangaroo's draft forward is layers [0, l) plus its
  adapter, yielding the layer-l states and the draft logits. A plan starting past layer 0 takes
  its input hidden states from a static buffer too (Kangaroo's verify from the exit layer).
No host synchronization happens inside a replay; the caller reads back only what it decides on.

Off CUDA (`capture=False`, the CPU tests) everything above runs the same (buckets, static
buffers, scratch slot, device-side masks, padded rows), except that a "replay" runs the captured
function eagerly and copies its results into the static outputs, so what the graph path does to
decoding is tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specctl.engine.attention import SdpaMeta
from specctl.engine.batch import ForwardBatch, LayerPlan


@dataclass
class _Captured:
    kv: object                # the cache the graph's pointers refer to (kept alive with it)
    head: object              # the head it was captured with (None: the LM head)
    graph: object             # torch.cuda.CUDAGraph (or _EagerReplay off CUDA)
    ints: torch.Tensor        # [2 * Bb * n + 2 * Bb]: the four below, filled by one copy
    tokens: torch.Tensor      # [Bb * n]
    positions: torch.Tensor   # [Bb * n]
    slots: torch.Tensor       # [Bb]
    prefix: torch.Tensor      # [Bb]
    local: torch.Tensor       # [Bb, n, n] bool: the mask among each sequence's new tokens
    chains: bool              # local holds the causal mask of every row (as captured)
    hidden: torch.Tensor | None   # [Bb * n, D] input states when the plan starts past layer 0
    outputs: tuple            # [Bb * n, ...] each: (logits,) or the head's outputs


class _EagerReplay:
    """Stands in for a CUDA graph off CUDA: a replay reruns the function into the outputs."""

    def __init__(self, fn, outputs):
        self.fn, self.outputs = fn, outputs

    def replay(self) -> None:
        for o, new in zip(self.outputs, self.fn()):
            o.copy_(new)


class CudaGraphs:
    def __init__(self, model, max_n: int = 128, capture: bool | None = None):
        self.model = model
        self.max_n = max_n
        self.capture = model.device.type == "cuda" if capture is None else capture
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.cache: dict[tuple, _Captured] = {}
        self.kept: dict[tuple, object] = {}
        self.replays = 0

    def keep(self, key: tuple, kv, make):
        """An object made once and handed out again for the same key while the model's KV
        cache is kv: the state a head reads (weights, its own KV cache) must stay at one
        address for its graphs to stay valid. A new cache (whose graphs are captured anew)
        replaces it, so one object per key is ever held."""
        got = self.kept.get(key)
        if got is None or got[0] is not kv:
            got = self.kept[key] = (kv, make())
        return got[1]

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
    def run(self, batch: ForwardBatch, kv, plan: LayerPlan, hidden: torch.Tensor | None = None,
            head=None):
        """The forward's outputs from a replay (see Model.forward_logits), or None where no
        graph fits (the caller runs it eagerly)."""
        if plan.capture is not None or (plan.start > 0) != (hidden is not None) \
                or not self.eligible(batch, kv):
            return None
        B, n = len(batch.seqs), batch.num_new[0]
        if any(c.kv is not kv for c in self.cache.values()):
            # graphs hold raw pointers into one KV cache: a new cache means new graphs (and the
            # old ones must go, or a reused id() could replay into freed memory)
            self.cache.clear()
            if self.capture:
                self.pool = torch.cuda.graph_pool_handle()   # the old pool dies with its graphs
        key = (self.bucket(B), n, plan, None if head is None else head.key)
        cap = self.cache.get(key)
        if cap is None or cap.head is not head:   # (a new head object: its tensors moved)
            cap = self.cache[key] = self._capture(kv, self.bucket(B), n, plan, head)
        Bb = cap.slots.shape[0]
        pad = [0] * ((Bb - B) * n)   # padded rows: token 0 at position 0 on the scratch slot
        ints = torch.tensor(batch.token_list + pad + batch.position_list + pad + batch.seq_slots
                            + [kv.scratch] * (Bb - B) + batch.prefix_lens + [0] * (Bb - B),
                            dtype=torch.long)
        cap.ints.copy_(ints, non_blocking=True)   # one host-to-device transfer
        masked = any(s.mask is not None for s in batch.seqs)
        if n > 1 and (masked or not cap.chains):
            local = self._tril(n).expand(Bb, n, n).clone()
            for b, s in enumerate(batch.seqs):
                if s.mask is not None:
                    local[b] = s.mask
            cap.local.copy_(local, non_blocking=True)
            cap.chains = not masked
        if hidden is not None:
            cap.hidden[:B * n].copy_(hidden)
        cap.graph.replay()
        self.replays += 1
        outs = tuple(o[:B * n] for o in cap.outputs)
        return outs[0] if head is None else outs

    _trils: dict[int, torch.Tensor] = {}

    @classmethod
    def _tril(cls, n: int) -> torch.Tensor:
        t = cls._trils.get(n)
        if t is None:
            t = cls._trils[n] = torch.ones(n, n, dtype=torch.bool).tril()
        return t

    def _forward(self, kv, Bb: int, n: int, plan: LayerPlan, tokens, positions, slots, prefix,
                 local, hidden=None, head=None) -> tuple:
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
        meta = SdpaMeta(slots, kv.max_len, n, True, None, None, mask[:, None], static=True)
        x = torch.nn.functional.embedding(tokens, m.embed) if hidden is None else hidden
        end = m.cfg.num_layers if plan.end is None else plan.end
        h = m._layers(x, positions, slot_tok, rows, meta, kv, plan, end)
        return (m.logits(h),) if head is None else tuple(head(h, positions, slot_tok, rows, meta))

    @torch.inference_mode()
    def _capture(self, kv, Bb: int, n: int, plan: LayerPlan, head=None) -> _Captured:
        dev = self.model.device
        ints = torch.zeros(2 * Bb * n + 2 * Bb, dtype=torch.long, device=dev)
        tokens, positions, slots, prefix = ints.split([Bb * n, Bb * n, Bb, Bb])
        slots.fill_(kv.scratch)
        local = self._tril(n).to(dev).expand(Bb, n, n).clone()
        hidden = None if plan.start == 0 else torch.zeros(
            Bb * n, self.model.cfg.hidden_size, dtype=self.model.dtype, device=dev)
        args = (kv, Bb, n, plan, tokens, positions, slots, prefix, local, hidden, head)
        if self.capture:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):   # warm-up outside the graph (allocator, autotuning)
                for _ in range(2):
                    self._forward(*args)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self._forward(*args)
        else:
            outputs = self._forward(*args)
            graph = _EagerReplay(lambda: self._forward(*args), outputs)
        return _Captured(kv, head, graph, ints, tokens, positions, slots, prefix, local, True,
                         hidden, outputs)
