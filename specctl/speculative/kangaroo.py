"""Kangaroo (papers/001): draft with the first l layers + a small adapter + the target's LM head;
verify by running only layers [l, L) over the drafted positions' saved layer-l hidden states
(the double early exit).

Adapter (authors' code): RMSNorm -> one attention block with RoPE and the target's head shape
(no MLP) -> residual add (of the adapter's input) -> RMSNorm -> the target's LM head. It keeps
its own KV cache, one row per sequence position like the target's, so a rejected draft's rows
are simply overwritten, exactly as the target's are. Its rows for a prompt come from the
prefill forward's own layer-l states (Drafter.prefill_capture): the prompt's first l layers run
once.

Per step and sequence (all sequences in lockstep, one token each per draft forward):
    input x = pending token, then each new draft
    h_l(x)  = layers [0, l) on x    (writes the target's KV rows of those layers: exact, since it
                                     is the very computation the full model does)
    q       = softmax(lm_head(adapter(h_l(x))))  ->  next draft, kept while top-1 > eta, at most
                                                   gamma drafts
The layer-l states of [pending, d1 .. dk] are saved; the verify forward starts at layer l from
them. A sequence that drafted k tokens because it hit gamma needs h_l(dk) too: one more shallow
forward computes it (and the adapter's KV row for dk) without drafting.

A step that drafts nothing (a lean step, `auto`'s most steps where drafting does not pay) is
one forward of the whole model, as `ar`'s, which keeps its layer-l states (one row a token, in
the head's `hidden`, where the KV cache keeps its rows) and writes no adapter row: the next
drafting step first writes the rows of the stretch in one batched pass (Drafter.catch_up),
so a stretch of lean steps costs `ar`'s forwards and a copy each (issue 52: the adapter's
norm, projections, rope and writes at every lean step were ~10 kernels a step on a GPU).

On CUDA both forwards replay captured graphs (engine/graphs.py): a draft forward is layers
[0, l) with the adapter as the graph's head (AdapterHead), the verify runs layers [l, L) from a
static buffer of the saved states. The head's weights and KV cache are kept by the model's
graphs, one per exit layer and cache shape (speculative/kangaroo_heads.py), and a drafter
copies its adapter's weights into them, so a new run (or a new adapter) replays the same
graphs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specctl.engine.attention import sdpa_meta
from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.engine.kv import KVCache
from specctl.engine.model import apply_rope, linear, rms_norm
from specctl.engine.steptable import weight_shares
from specctl.speculative.chain import draft_chains
from specctl.speculative.drafter import DraftPrice, Drafter, Proposal
from specctl.speculative.kangaroo_heads import AdapterHead, whole_plan
from specctl.speculative.verify import DraftTree
from specctl.speculative.sampling import SamplingParams, draw_drafts

ADAPTER_KEYS = ("norm_in.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                "o_proj.weight", "norm_out.weight")


@dataclass(frozen=True)
class KangarooParams:
    eta: float = 0.6    # stop drafting when the draft's top-1 probability <= eta
    gamma: int = 6      # at most this many drafts per step

    def __post_init__(self):
        if not 0.0 <= self.eta <= 1.0 or self.gamma < 1:
            raise ValueError("eta must be in [0, 1] and gamma >= 1")


class Adapter:
    """The adapter's weights (HF-style names, see ADAPTER_KEYS) and its two forwards."""

    def __init__(self, model, exit_layer: int, weights: dict[str, torch.Tensor]):
        c = model.cfg
        if not 1 <= exit_layer < c.num_layers:
            raise ValueError(f"exit layer must be in [1, {c.num_layers}), got {exit_layer}")
        missing = [k for k in ADAPTER_KEYS if k not in weights]
        if missing:
            raise ValueError(f"adapter lacks {missing}")
        D, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = {"norm_in.weight": (D,), "q_proj.weight": (q, D), "k_proj.weight": (kv, D),
                  "v_proj.weight": (kv, D), "o_proj.weight": (D, q), "norm_out.weight": (D,)}
        for k, want in shapes.items():   # weights from a file must fit this model
            t = weights[k]
            if tuple(t.shape) != want or not t.is_floating_point() or not bool(
                    t.isfinite().all()):
                raise ValueError(f"tensor {k} is {t.dtype} {tuple(t.shape)}, expected finite "
                                 f"floats {want} for this model")
        self.model, self.l = model, exit_layer
        self.w = {k: weights[k] for k in ADAPTER_KEYS}

    @classmethod
    def init_from_model(cls, model, exit_layer: int) -> "Adapter":
        """Start from layer l's own attention and norms (a copy, trainable)."""
        L = model.layers[exit_layer]
        c = model.cfg
        H, KV, hd = c.num_heads, c.num_kv_heads, c.head_dim
        q, k, v = L.wqkv.split([H * hd, KV * hd, KV * hd])
        # (a family with no input norm, OLMo 2: the adapter starts with a plain one)
        norm_in = L.attn_norm if L.attn_norm is not None else torch.ones_like(model.norm)
        w = {"norm_in.weight": norm_in, "q_proj.weight": q, "k_proj.weight": k,
             "v_proj.weight": v, "o_proj.weight": L.wo, "norm_out.weight": model.norm}
        return cls(model, exit_layer, {n: t.detach().clone().float() for n, t in w.items()})

    def parameters(self) -> list[torch.Tensor]:
        return list(self.w.values())

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, query: bool = True):
        """(q, k, v) of the adapter's attention; query False: q is None (writing rows only)."""
        c = self.model.cfg
        T = h.shape[0]
        w = self.w
        x = rms_norm(h, w["norm_in.weight"].to(h.dtype), c.rms_eps)
        k = linear(x, w["k_proj.weight"].to(h.dtype)).view(T, c.num_kv_heads, c.head_dim)
        v = linear(x, w["v_proj.weight"].to(h.dtype)).view(T, c.num_kv_heads, c.head_dim)
        cos, sin = self.model._rope(positions)
        cos, sin = cos.to(h.dtype), sin.to(h.dtype)
        if not query:
            return None, apply_rope(k, cos, sin), v
        q = linear(x, w["q_proj.weight"].to(h.dtype)).view(T, c.num_heads, c.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _out(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        c = self.model.cfg
        x = h + linear(o.reshape(h.shape[0], -1), self.w["o_proj.weight"].to(h.dtype))
        x = rms_norm(x, self.w["norm_out.weight"].to(h.dtype), c.rms_eps)
        head = self.model.lm_head
        if not torch.is_autocast_enabled(h.device.type):   # autocast casts it itself
            head = head.to(h.dtype)
        return linear(x, head).float()

    @torch.inference_mode()
    def step(self, h: torch.Tensor, batch: ForwardBatch, akv: KVCache) -> torch.Tensor:
        """Decoding: h [T, D] layer-l states of the batch's tokens -> [T, V] draft logits,
        writing the adapter's KV rows (same slots and rows as the target's)."""
        return self.decode(h, batch.positions, sdpa_meta(batch, akv), akv)

    def decode(self, h, positions, meta, akv: KVCache) -> torch.Tensor:
        """step() on the packed tensors of a forward (what a captured graph holds)."""
        q, k, v = self._qkv(h, positions)
        akv.write(0, meta.index, k, v)
        return self._out(h, self.model.attend(q, akv.k[0], akv.v[0], meta))

    def write_rows(self, h, positions, index, akv: KVCache) -> None:
        """decode() without its draft: only the adapter's KV rows of these tokens, at storage
        rows `index` (no attention, no LM head: the head alone is a fifth of the demo model's
        weights)."""
        _, k, v = self._qkv(h, positions, query=False)
        akv.write(0, index, k, v)

    def train_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Training: one whole sequence's layer-l states [T, D] -> [T, V] logits with causal
        attention and no cache (the same function as step over the same tokens)."""
        T = h.shape[0]
        q, k, v = self._qkv(h, torch.arange(T, device=h.device))
        c = self.model.cfg
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], is_causal=True,
                                           enable_gqa=c.num_kv_heads != c.num_heads)
        return self._out(h, o[0].transpose(0, 1))


def kangaroo_price(model, adapter: Adapter, max_draft: int = 0) -> DraftPrice:
    """What Kangaroo's steps cost with `adapter` (exit layer l): a draft forward runs layers
    [0, l), the adapter and the LM head; the verify the other layers and the head; a forward
    that drafts nothing only layers [0, l) (the adapter's KV rows without its attention)."""
    attn, mlp, head = weight_shares(model)
    total = sum(attn) + sum(mlp) + head
    shallow = sum(attn[:adapter.l]) + sum(mlp[:adapter.l])
    own = sum(t.numel() for t in adapter.w.values())
    return DraftPrice(max_draft=max_draft, verify_frac=(total - shallow) / total,
                      draft_frac=(shallow + own + head) / total, draft_extra=1,
                      tail_frac=shallow / total, idle_whole=True)


@dataclass
class KangarooProposal(Proposal):
    # layer-l states of [pending, d1 .. dk] (the verify forward starts from them)
    hidden: list[torch.Tensor] = field(default_factory=list)
    whole: bool = False   # no states saved: the verify runs the whole model (an ar step)


WHOLE = KangarooProposal(whole=True)   # a lean step's proposal (shared: never edited)


class KangarooDrafter(Drafter):
    name = "kangaroo"

    def __init__(self, model, adapter: Adapter, sampling: SamplingParams,
                 params: KangarooParams = KangarooParams()):
        if any(t.device != model.device or t.dtype != model.dtype for t in adapter.w.values()):
            # the adapter runs in the model's device and dtype (a copy: the caller's stays)
            adapter = Adapter(model, adapter.l, {k: t.to(model.device, model.dtype)
                                                 for k, t in adapter.w.items()})
        self.model, self.adapter, self.sp, self.prm = model, adapter, sampling, params
        self.l = adapter.l
        self.step_rows = 1 + params.gamma   # drafts, and the tail forward's row after them
        c = model.cfg   # the adapter's own cache (a sibling of the target's), and the head's
        # layer-l states of each row (AdapterHead.hidden), in KV layers' worth of bytes
        self.kv_layers = 1 + c.hidden_size / (2 * c.num_kv_heads * c.head_dim)
        self.head: AdapterHead | None = None
        self.draft_forwards = 0

    def price(self) -> DraftPrice:
        return kangaroo_price(self.model, self.adapter, self.prm.gamma)

    def sampled(self, sp) -> "KangarooDrafter":
        """Drafts drawn by `sp` (speculative sampling must know their q): a new drafter when
        it differs from this one's."""
        return self if sp == self.sp else KangarooDrafter(self.model, self.adapter, sp, self.prm)

    def fresh(self) -> "KangarooDrafter":
        return KangarooDrafter(self.model, self.adapter, self.sp, self.prm)

    def signature(self) -> str:
        h = sum(float(t.float().sum()) for t in self.adapter.w.values())
        return f"{self.name}:l{self.l}:{h:.6e}"

    def _head(self, kv: KVCache) -> AdapterHead:
        """The adapter head for this cache: its KV cache is a one-layer sibling of the target's
        (the same slots, lengths and block tables). With graphs, the model's kept one, loaded
        with this adapter."""
        m = self.model

        def make(adapter):
            head = AdapterHead(adapter, kv.sibling(1))
            head.target = weakref.ref(kv)   # (not keeping an old run's cache alive)
            return head
        if m.graphs is None:
            if self.head is None or self.head.target() is not kv:
                self.head = make(self.adapter)
            return self.head
        head = m.graphs.keep(("kangaroo", self.l), kv, lambda: make(Adapter(
            m, self.l, {k: t.clone() for k, t in self.adapter.w.items()})))
        if head.loaded is not self.adapter:
            for k, t in head.adapter.w.items():
                t.copy_(self.adapter.w[k])
            head.loaded = self.adapter
        self.head = head
        return head

    def graph_forwards(self, kv) -> list[tuple]:
        """Its shallow draft forward (with the adapter head, or writing its rows only) and its
        verify from the exit layer."""
        head = self._head(kv)
        return [(LayerPlan(end=self.l), head, 1), (LayerPlan(end=self.l), head.rows_only, 1),
                (LayerPlan(start=self.l), None, self.step_rows),
                (whole_plan(self.l), head.whole, 1)]

    @property
    def prefill_capture(self) -> int:
        return self.l

    def prefilled(self, batch: ForwardBatch, kv: KVCache, h: torch.Tensor) -> None:
        """The adapter's KV rows for a prefill chunk, from its layer-l states (captured by the
        prefill forward itself: no second pass over layers [0, l))."""
        head = self._head(kv)
        head.rows_only(h, batch.positions, sdpa_meta(batch, kv))
        for s, p, n in zip(batch.seq_slots, batch.prefix_lens, batch.num_new):
            head.done[s] = p + n

    def catch_up(self, seqs, ahead: int = 0, beside: bool = False) -> None:
        """The adapter's rows of what lean steps left (AdapterHead.catch_up): under the
        forward before a drafting step (Runner._prefetch: that lean forward's own row too,
        ahead 1), else before its proposals (the planner's, timed apart)."""
        if self.head is not None:
            self.head.catch_up([s.slot for s in seqs], ahead)

    def observe(self, seqs, proposals, verdicts, probe_out) -> None:
        """After a drafting step's commit: each sequence's committed rows have the adapter's
        rows (its draft forwards wrote them: its pending token's and each draft's, whose
        states the verify read), so the next catch_up has none of them to write again. Not
        after a step that drafted nothing (WHOLE: its rows wait, as a lean step's)."""
        done, lens = self.head.done, self.head.akv.lens
        for s, p in zip(seqs, proposals):
            if not p.whole:
                done[s.slot] = lens[s.slot]

    def propose(self, seqs, kv, limits) -> list[KangarooProposal]:
        head = self._head(kv)
        if all(r <= 0 for r in limits.room):
            return self.idle(seqs, kv)
        hidden: list[list[torch.Tensor]] = [[] for _ in seqs]

        def forward(rows, inputs, depth, drafting):
            batch = ForwardBatch([SeqInput(seqs[i].slot, [t], kv.lens[seqs[i].slot] + depth)
                                  for i, t in zip(rows, inputs)], self.model.device)
            drawn = (None, None, None)
            if drafting:
                h, logits = self.model.run(batch, kv, LayerPlan(end=self.l), head=head)
                # draws for the drafting rows only: a sequence's generator never depends on
                # which other sequences share its forward
                drawn = draw_drafts(logits[drafting], self.sp,
                                    [seqs[rows[j]].rng for j in drafting])
            else:   # nothing to draft: the states and the adapter's KV rows only
                (h,) = self.model.run(batch, kv, LayerPlan(end=self.l), head=head.rows_only)
            h = h.clone()   # [B, D], kept past the next forward (a replay reuses its buffers)
            for j, i in enumerate(rows):
                hidden[i].append(h[j])
            self.draft_forwards += 1
            return drawn
        caps = [min(max(r, 0), self.prm.gamma) for r in limits.room]
        chains = draft_chains(caps, [s.pending for s in seqs], forward,
                              keep=lambda conf: conf > self.prm.eta, stop=limits.stop,
                              tail=True)
        return [KangarooProposal(DraftTree.chain(c.tokens, torch.stack(c.q) if c.q else None),
                                 forwards=c.forwards, conf=c.conf, stopped_at=c.stopped_at,
                                 hidden=hs) for c, hs in zip(chains, hidden)]

    def idle(self, seqs, kv) -> list[KangarooProposal]:
        """Nothing to draft (a lean step): one forward of the whole model verifies, and its
        layer-l states are kept for the adapter's rows (lean_forward), so the step costs what
        ar's does (two forwards cost 8% more on the H100 at batch 1, 237d5df). One shared proposal
        (never edited): a new one per sequence cost ~3 us each, 0.2 ms a step at batch 64."""
        return [WHOLE] * len(seqs)

    custom_verify = True

    def lean_forward(self, kv: KVCache) -> tuple:
        """The whole model, its layer-l states kept for the adapter's rows (idle)."""
        return whole_plan(self.l), self._head(kv).whole

    def verify_hidden(self, batch: ForwardBatch, kv: KVCache, seqs,
                      proposals) -> torch.Tensor:
        """The double early exit: layers [l, L) only, from the saved layer-l states."""
        if all(p.whole for p in proposals):
            plan, head = self.lean_forward(kv)
            (h,) = self.model.run(batch, kv, plan, head=head)
            return h
        rows = []
        for p, n in zip(proposals, batch.num_new):
            hs = p.hidden[:len(p.draft) + 1]
            if len(hs) != len(p.draft) + 1 or len(hs) != n:
                raise RuntimeError("kangaroo: saved states do not match the verify batch")
            rows += hs
        return self.model.run(batch, kv, LayerPlan(start=self.l), hidden=torch.stack(rows))


def adapter_config(model, exit_layer: int) -> dict:
    c = model.cfg
    return {"exit_layer": exit_layer, "hidden_size": c.hidden_size, "num_heads": c.num_heads,
            "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "format": "specctl-kangaroo-1"}
