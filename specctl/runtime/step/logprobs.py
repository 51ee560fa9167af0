"""Token log-probabilities, as `--logprobs N` records them (vLLM's default: the model's own
distribution, before temperature or top-p)."""

from __future__ import annotations

import torch

from specctl.engine.model import Model


def token_logprobs(model: Model, h: torch.Tensor, tokens: list[int], top: int) -> list[list]:
    """[log-probability of tokens[i], [[id, lp] of the `top` likeliest]] for each row of last
    states h: the model's own distribution (log-softmax of its logits in fp32, before any
    temperature or top-p), as vLLM reports it by default."""
    lp = torch.log_softmax(model.logits(h).float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if not top:
        return [[c, []] for c in chosen]
    v, i = lp.topk(top, dim=-1)
    return [[c, [[a, b] for a, b in zip(ii, vv)]]
            for c, ii, vv in zip(chosen, i.tolist(), v.tolist())]


def step_logprobs(model: Model, plan, out, h: torch.Tensor, had: list[int], top: int) -> None:
    """The log-probabilities of the tokens each sequence of a step (StepPlan, StepOutcome,
    its last states h) emitted after its `had` tokens, each from the row that predicted it
    (the root's, then each accepted node's: the committed rows), onto the sequences."""
    cu, rows, seqs = plan.batch.cu_seqlens, [], plan.seqs
    for b, (s, v) in enumerate(zip(seqs, out.verdicts)):
        n = len(s.out_ids) - had[b]
        rows += [cu[b] + r for r in ([0] + [j + 1 for j in v.accepted])[:n]]
    if not rows:
        return
    toks = [t for s, n0 in zip(seqs, had) for t in s.out_ids[n0:]]
    recs = iter(token_logprobs(model, h[rows], toks, top))
    for s, n0 in zip(seqs, had):
        s.logprobs.extend(next(recs) for _ in range(len(s.out_ids) - n0))
