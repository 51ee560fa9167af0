"""Teacher-forced probes of a skip set: one packed forward per probe, drafting simulated.

The dev prompts' greedy continuations by the full model (y_0 .. y_{M-1}, M = max_new; y_0 comes
from prefill) are decoded once, as `ar` decodes them, and the full model's KV rows and per-layer
hidden states over prompt + y_0 .. y_{M-2} are kept. A probe of a skip set then runs ONE packed
forward of the skipped model over the M - 1 "nodes" of every prompt: node j is token y_j at its
position, and sees the full model's KV rows of everything before it plus itself. Its top-1
token and top-1 probability (the draft's confidence, `top1` in speculative/sampling.py) are the arrays

    agree[j] = (skipped model's top-1 at node j == y_{j+1}),   conf[j] = its probability.

Layers before the first skipped block compute exactly the full model's states there, so the
forward starts at that layer from the kept hidden states (LayerPlan(start=...)).

Why this predicts drafting (greedy decoding). Greedy draft-verify emits exactly the full model's
greedy tokens, so every step starts with committed context = prompt + y_0 .. y_{c-1} and pending
token y_c, and every draft that will be accepted equals the target's own next token: drafting
that agrees with the target walks along y. So the skipped model's predictions that decide how
many drafts a step accepts are its predictions at nodes c, c + 1, ... given y as context, which
is what the arrays hold. Exactly:
- the first draft of every step (node c: committed rows are the full model's KV, as here) is the
  drafter's real forward, bit for bit up to the float rounding of a different batch shape;
- deeper drafts (node c + d, d >= 1) see the KV rows drafting itself wrote for y_c .. y_{c+d-1}
  (the skipped model's), where the probe shows them the full model's rows. Close when the
  skipped model is close to the full one (the only sets worth drafting with), not identical;
- after the first rejected draft the drafter continues on its own tokens, which the arrays do
  not see: those drafts are all rejected whatever they are, but how many are drafted (the draft
  exit, hence the cost and gamma's update) is taken from conf at the following nodes.
The simulation (`simulate`) replays the runner's drafting exactly on top of these arrays: the
exit rule (stop when conf < gamma or after K drafts or at the room left), the adaptive gamma
(speculative/draft_verify.update_threshold, pooled over the batch per step, carried over), the back-off
of fruitless steps, the bonus token, lock-step batching of the dev prompts as DevSet decodes them.
Its counts are priced like DevSet's (skip/evaluate.run_cost). A test compares the
simulated counts with real draft-verify runs; the search re-decodes its best few sets for real
(DevSet) before choosing, so the stored estimate comes from real decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specctl.engine.attention import sdpa_meta
from specctl.engine.batch import ForwardBatch, LayerPlan, SeqInput
from specctl.engine.steptable import StepTable
from specctl.prep.skip.evaluate import DevEval, ar_per_token, run_cost
from specctl.speculative.draft_verify import (ExitParams, ExitState, SkipSet, skip_draft_frac,
                                              update_threshold)
from specctl.speculative.sampling import top1_tensors


def greedy_continuations(model, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """The full model's greedy answers (max_new tokens each), decoded as `ar` decodes them."""
    from specctl.runtime.step.runner import Runner
    from specctl.runtime.step.sequence import Request
    from specctl.speculative.drafter import NoDraft
    from specctl.speculative.sampling import SamplingParams

    runner = Runner(model, NoDraft(), SamplingParams(), batch_size=len(prompts),
                    max_len=max(map(len, prompts)) + max_new + 2, eos_ids=set(),
                    render=lambda r: prompts[r.index], decode=lambda ids: "")
    done: dict[int, list[int]] = {}
    runner.run([Request(i, [[]], max_new) for i in range(len(prompts))],
               lambda r: done.__setitem__(r.index, list(r.answer_ids[0])))
    return [done[i] for i in range(len(prompts))]


@dataclass
class SimResult:
    draft_lengths: list[list[int]]    # per prompt, per step
    accept_lengths: list[list[int]]
    draft_forwards: list[int]         # per prompt
    state: ExitState                  # gamma after the run (carried over by callers)


def simulate(agree: list[np.ndarray], conf: list[np.ndarray], max_new: int, prm: ExitParams,
             state: ExitState | None = None) -> SimResult:
    """Replay draft-verify's greedy decoding of the prompts (lock-step, one batch) from the
    teacher-forced arrays (module docstring). agree[b][j], conf[b][j]: node j of prompt b."""
    n = len(agree)
    st = state or ExitState(prm.gamma0)
    out = [1] * n                     # y_0 came from prefill
    rest, backoff = [0] * n, [0] * n
    dl: list[list[int]] = [[] for _ in range(n)]
    al: list[list[int]] = [[] for _ in range(n)]
    fw = [0] * n
    while True:
        live = [b for b in range(n) if out[b] < max_new]
        if not live:
            break
        gamma = st.gamma
        drafted_all = accepted_all = 0
        full_k = False
        for b in live:
            room = max_new - out[b] - 1
            tried, drafted, accepted = False, 0, 0
            if rest[b] > 0:
                rest[b] -= 1
            elif room > 0:
                cap, j0, ok = min(room, prm.K), out[b] - 1, True
                a, c = agree[b], conf[b]
                while True:
                    j = j0 + drafted
                    fw[b] += 1
                    tried = True
                    if c[j] < gamma:
                        break
                    ok = ok and bool(a[j])
                    accepted += ok
                    drafted += 1
                    if drafted >= cap:
                        break
            dl[b].append(drafted)
            al[b].append(accepted)
            out[b] += accepted + 1
            if tried:
                if accepted:
                    backoff[b] = 0
                elif prm.max_backoff:
                    backoff[b] = min(2 * backoff[b] or 1, prm.max_backoff)
                    rest[b] = backoff[b]
            drafted_all += drafted
            accepted_all += accepted
            full_k = full_k or drafted >= prm.K
        st = update_threshold(st, accepted_all, drafted_all, full_k, prm)
    return SimResult(dl, al, fw, st)


class TeacherForcedDev:
    """The dev prompts' continuations, full-model KV rows and hidden states, kept once; probes
    score a skip set with one packed forward and simulate drafting (module docstring)."""

    def __init__(self, model, prompts: list[list[int]], max_new: int = 32, K: int = 12,
                 params: ExitParams | None = None):
        if max_new < 2:
            raise ValueError("max_new must be >= 2")
        self.model, self.prompts, self.max_new = model, prompts, max_new
        self.params = params or ExitParams(K=K)
        self.conts = greedy_continuations(model, prompts, max_new)
        L, m = model.cfg.num_layers, max_new - 1          # m nodes per prompt: y_0 .. y_{M-2}
        n = len(prompts)
        ends = [len(p) + m for p in prompts]               # full-model rows [0, end)
        self.kv = model.new_kv_cache(n, max(ends) + m + 1)
        full = ForwardBatch([SeqInput(b, prompts[b] + self.conts[b][:m], 0) for b in range(n)],
                            model.device)
        node_rows = torch.tensor([full.cu_seqlens[b] + len(prompts[b]) + j
                                  for b in range(n) for j in range(m)], device=model.device)
        # the full model layer by layer: KV rows of every layer, node states entering each layer
        self.hidden: list[torch.Tensor | None] = [None]
        h = model.forward(full, self.kv, LayerPlan(start=0, end=1))
        for layer in range(1, L):
            self.hidden.append(h[node_rows].clone())
            h = model.forward(full, self.kv, LayerPlan(start=layer, end=layer + 1), hidden=h)
        # the probe batch: node j of prompt b at position len(p) + j, written past the full rows,
        # seeing full rows [0, len(p) + j) and itself (meta mask edited once, reused by probes)
        self.batch = ForwardBatch(
            [SeqInput(b, self.conts[b][:m], ends[b],
                      list(range(len(prompts[b]), ends[b])), torch.eye(m, dtype=torch.bool))
             for b in range(n)], model.device)
        meta = sdpa_meta(self.batch, self.kv)
        cols = torch.arange(meta.mask.shape[-1], device=model.device)
        start = torch.tensor([len(p) for p in prompts], device=model.device)[:, None] + \
            torch.arange(m, device=model.device)[None, :]                        # [B, m]
        end = torch.tensor(ends, device=model.device)[:, None, None]
        hide = (cols[None, None, :] >= start[:, :, None]) & (cols[None, None, :] < end)
        meta.mask[:, 0, :m] &= ~hide
        if sdpa_meta(self.batch, self.kv) is not meta:
            raise RuntimeError("engine: a batch no longer keeps its attention meta; the "
                               "teacher-forced probe's mask would be lost")
        self.targets = torch.tensor([c[1:max_new] for c in self.conts], device=model.device)

    def arrays(self, skip: SkipSet) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """agree, conf per prompt (module docstring): one packed forward."""
        blocks = skip.attn | skip.mlp
        start = min(blocks) if blocks else self.model.cfg.num_layers
        n, m = len(self.prompts), self.max_new - 1
        if start >= self.model.cfg.num_layers:   # nothing skipped: the full model itself
            start = self.model.cfg.num_layers - 1
        plan = LayerPlan(start=start, skip_attn=skip.attn, skip_mlp=skip.mlp)
        h = self.model.forward(self.batch, self.kv, plan, hidden=self.hidden[start])
        lf = self.model.logits(h)
        tok, conf = top1_tensors(lf)   # (as the drafter reads its drafts)
        agree = (tok.view(n, m) == self.targets).cpu().numpy()
        conf = conf.view(n, m).double().cpu().numpy()
        return list(agree), list(conf)

    def ar_per_token(self, table: StepTable) -> float:
        return ar_per_token(table)

    def simulate(self, skip: SkipSet) -> SimResult:
        agree, conf = self.arrays(skip)
        return simulate(agree, conf, self.max_new, self.params)

    def evaluate(self, skip: SkipSet, table: StepTable) -> DevEval:
        """A DevEval of the simulated decoding, priced like DevSet.evaluate's."""
        r = self.simulate(skip)
        frac = skip_draft_frac(self.model, skip)
        per_seq = [{"tokens": self.max_new - 1, "draft_lengths": d, "accept_lengths": a,
                    "draft_forwards": f}
                   for d, a, f in zip(r.draft_lengths, r.accept_lengths, r.draft_forwards)]
        cost = sum(run_cost(table, p["draft_lengths"], p["draft_forwards"], frac)
                   for p in per_seq)
        return DevEval(sum(p["tokens"] for p in per_seq),
                       sum(sum(p["draft_lengths"]) for p in per_seq),
                       sum(sum(p["accept_lengths"]) for p in per_seq),
                       sum(len(p["draft_lengths"]) for p in per_seq), cost, False, per_seq)
