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
