"""Draft & Verify (papers/002): draft with the same model minus a skip set of sublayers, stop
drafting adaptively, verify with one forward of the full model.

- Skip set: 2L bits; bit i < L skips layer i's attention block, bit L + j layer j's MLP block (a
  skipped block returns its residual input). No extra weights.
- Drafting is a chain: up to K tokens, one draft forward per token for all sequences at once;
  a sequence stops when its draft's top-1 probability < gamma (or at K, or at its room).
  Sequences in one batch draft different numbers of tokens: each simply leaves the draft batch.
- gamma adapts after every verification step (paper eq. 2-4, defaults of its Table 6):
      AR      <- beta1 * AR + (1 - beta1) * AR_e          (AR_e = accepted / drafted this step;
                                                           AR = AR_e on the first step)
      gamma~  =  gamma + eps  if AR <= alpha  else  gamma - eps
      gamma   <- beta2 * gamma + (1 - beta2) * gamma~
  (code) gamma is kept when AR >= alpha and the full K was drafted; it carries over between the
  prompts of a run. With a batch, one step's AR_e pools the batch's accepted / drafted counts.
- Back-off (specctl, not in the paper): a draft forward that yields nothing (the first draft
  already under gamma, or every draft rejected) still costs a forward. A sequence whose drafting
  was fruitless rests for 1, 2, 4 ... (at most max_backoff) steps, running plain `ar` steps, and
  drafts again after; one accepted draft resets it. Where the drafter cannot win (a skip set too
  weak for the model, a CPU where verifying 2 tokens costs much more than 1) draft-verify so
  converges to ar's cost instead of paying a wasted forward every step. Greedy output is
  unaffected (drafts never change what is emitted).
- The KV rows drafting writes (for the layers it runs) lie past the committed length; the
  verification forward overwrites them for every layer, so they never survive.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.engine.steptable import weight_shares
from specctl.io.schema import (SchemaError, anything, fields, integer, json_object, list_of,
                               number, optional)
from specctl.speculative.chain import draft_chains
from specctl.speculative.drafter import NO_DRAFT, DraftPrice, Drafter, Proposal
from specctl.speculative.verify import DraftTree
from specctl.speculative.sampling import SamplingParams, draw_drafts


# what search-skip's skipset.json holds beside the set (informational; `profile` is read)
SKIPSET_RESULT = {k: anything for k in (
    "objective", "seconds_per_token", "relative_time_per_token", "acceptance_rate",
    "mean_accepted_tokens", "iterations", "best_iteration", "search_time_s", "total_time_s",
    "config", "interrupted", "simulated_relative_time_per_token", "confirmed", "pays")}
SKIPSET_RESULT.update(speedup_estimate=number(0), profile=optional(json_object))


@dataclass(frozen=True)
class SkipSet:
    """Which sublayers the drafter skips."""
    num_layers: int
    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    def __post_init__(self):
        bad = [i for i in (*self.attn, *self.mlp) if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"skip set names layers outside [0, {self.num_layers}): {bad}")

    @classmethod
    def from_bits(cls, bits: list[int] | list[bool]) -> "SkipSet":
        if len(bits) % 2:
            raise ValueError("a skip set has 2L bits")
        L = len(bits) // 2
        return cls(L, frozenset(i for i in range(L) if bits[i]),
                   frozenset(j for j in range(L) if bits[L + j]))

    def bits(self) -> list[int]:
        return [int(i in self.attn) for i in range(self.num_layers)] + \
               [int(j in self.mlp) for j in range(self.num_layers)]

    def plan(self) -> LayerPlan:
        return LayerPlan(skip_attn=self.attn, skip_mlp=self.mlp)

    @property
    def size(self) -> int:
        return len(self.attn) + len(self.mlp)

    def to_json(self) -> dict:
        return {"num_layers": self.num_layers, "attn": sorted(self.attn), "mlp": sorted(self.mlp)}

    @classmethod
    def from_json(cls, d) -> "SkipSet":
        """A skip set as `to_json` writes it (search-skip's skipset.json adds its result's
        fields): every value checked, never coerced; SchemaError (a ValueError) names the
        field."""
        f = fields(d, {"num_layers": integer(1, 100_000), "attn": list_of(integer(), unique=True),
                       "mlp": list_of(integer(), unique=True)}, SKIPSET_RESULT, what="skip set")
        L = f["num_layers"]
        for part in ("attn", "mlp"):
            bad = [i for i in f[part] if not 0 <= i < L]
            if bad:
                raise SchemaError(f"{part}: layer {bad[0]} is out of range [0, {L - 1}] "
                                  f"(num_layers is {L})")
        return cls(L, frozenset(f["attn"]), frozenset(f["mlp"]))


def skip_draft_frac(model, skip: SkipSet) -> float:
    """What one layer-skip draft forward costs, as a share of a full step: the weights of the
    blocks it keeps and the LM head over all of them."""
    attn, mlp, head = weight_shares(model)
    kept = sum(a for i, a in enumerate(attn) if i not in skip.attn) + \
        sum(m for j, m in enumerate(mlp) if j not in skip.mlp)
    return (kept + head) / (sum(attn) + sum(mlp) + head)


@dataclass(frozen=True)
class ExitParams:
    K: int = 12
    gamma0: float = 0.6
    eps: float = 0.01
    beta1: float = 0.5
    beta2: float = 0.9
    alpha: float = 0.9
    max_backoff: int = 16   # specctl: steps a sequence rests from drafting after a fruitless one

    def __post_init__(self):
        if self.max_backoff < 0:
            raise ValueError("max_backoff must be >= 0")
        if self.K < 1:
            raise ValueError("K (max drafts) must be >= 1")
        for name in ("gamma0", "beta1", "beta2", "alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")


@dataclass(frozen=True)
class ExitState:
    gamma: float
    ar: float | None = None   # smoothed acceptance rate; None before the first step


def update_threshold(st: ExitState, accepted: int, drafted: int, full_k: bool,
                     prm: ExitParams) -> ExitState:
    """One application of the paper's rule (see the module docstring)."""
    if drafted == 0:
        return st
    ar_e = accepted / drafted
    ar = ar_e if st.ar is None else prm.beta1 * st.ar + (1 - prm.beta1) * ar_e
    if ar >= prm.alpha and full_k:   # (code) drafting K tokens with high acceptance: keep gamma
        return replace(st, ar=ar)
    tilde = st.gamma + prm.eps if ar <= prm.alpha else st.gamma - prm.eps
    return ExitState(prm.beta2 * st.gamma + (1 - prm.beta2) * tilde, ar)


@dataclass
class LayerSkipState:
    """A sequence's own: after a step whose drafts were all rejected it rests (plain ar steps)
    for `backoff` steps, up to the drafter's step `rest_until`, doubling up to max_backoff
    while drafting keeps failing."""
    rest_until: int = 0
    backoff: int = 0
    draft_forwards: int = 0   # draft forwards it ran (search-skip's cost model)


class LayerSkipDrafter(Drafter):
    name = "draft-verify"

    def __init__(self, model, skip: SkipSet, sampling: SamplingParams,
                 params: ExitParams = ExitParams()):
        if skip.num_layers != model.cfg.num_layers:
            raise ValueError(f"skip set is for {skip.num_layers} layers, the model has "
                             f"{model.cfg.num_layers}")
        self.model, self.skip, self.sp, self.prm = model, skip, sampling, params
        self.plan = skip.plan()
        self.step_rows = 1 + params.K
        self.state = ExitState(params.gamma0)
        self.draft_forwards = 0
        self.t = 0   # steps so far (every running sequence is in each: a rest is a stretch)

    def admit(self, seq) -> None:
        seq.state = LayerSkipState()

    def propose(self, seqs, kv, limits) -> list[Proposal]:
        self.t = t = self.t + 1
        caps = [0 if s.state.rest_until >= t else min(max(r, 0), self.prm.K)
                for s, r in zip(seqs, limits.room)]   # (resting: a plain ar step)
        if not any(caps):   # an ar step for every sequence (the controller's budget 0)
            return [NO_DRAFT] * len(seqs)

        def forward(rows, inputs, depth, drafting):
            batch = ForwardBatch([SeqInput(seqs[i].slot, [t], kv.lens[seqs[i].slot] + depth)
                                  for i, t in zip(rows, inputs)], self.model.device)
            h = self.model.run(batch, kv, self.plan)                   # [B, D]
            self.draft_forwards += 1
            return draw_drafts(self.model.logits(h), self.sp, [seqs[i].rng for i in rows])
        gamma = self.state.gamma
        chains = draft_chains(caps, [s.pending for s in seqs], forward,
                              keep=lambda conf: conf >= gamma, stop=limits.stop)
        out = []
        for s, c in zip(seqs, chains):
            s.state.draft_forwards += c.forwards
            out.append(Proposal(DraftTree.chain(c.tokens, torch.stack(c.q) if c.q else None),
                                forwards=c.forwards, conf=c.conf, stopped_at=c.stopped_at))
        return out

    def idle(self, seqs, kv) -> list[Proposal]:
        self.t += 1   # (an ar step counts toward a sequence's rest, as in propose)
        return [NO_DRAFT] * len(seqs)

    def graph_forwards(self, kv) -> list[tuple]:
        """The verify of chains up to K drafts, and the skip plan's one-token draft forward."""
        return super().graph_forwards(kv) + [(self.plan, None, 1)]

    def price(self) -> DraftPrice:
        return DraftPrice(max_draft=self.prm.K, draft_frac=skip_draft_frac(self.model, self.skip))

    def sampled(self, sp) -> "LayerSkipDrafter":
        """Drafts drawn by `sp` (speculative sampling must know their q): a new drafter when
        it differs from this one's."""
        return self if sp == self.sp else LayerSkipDrafter(self.model, self.skip, sp, self.prm)

    def fresh(self) -> "LayerSkipDrafter":
        return LayerSkipDrafter(self.model, self.skip, self.sp, self.prm)

    def signature(self) -> str:
        return f"{self.name}:{''.join(map(str, self.skip.bits()))}"

    def observe(self, seqs, proposals, verdicts, probe_out) -> None:
        if not any(p.forwards for p in proposals):   # an ar step: nothing to learn (lean)
            return
        for s, p, v in zip(seqs, proposals, verdicts):
            if not p.forwards:   # rested (or had no room) this step
                continue
            st = s.state
            if v.accepted:
                st.backoff = 0
            elif self.prm.max_backoff:
                st.backoff = min(2 * st.backoff or 1, self.prm.max_backoff)
                st.rest_until = self.t + st.backoff
        drafted = sum(len(p.draft) for p in proposals)
        accepted = sum(len(v.accepted) for v in verdicts)
        full_k = any(len(p.draft) >= self.prm.K for p in proposals)
        self.state = update_threshold(self.state, accepted, drafted, full_k, self.prm)
