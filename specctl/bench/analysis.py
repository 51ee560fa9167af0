"""A bench's numbers: spreads over repeats, acceptance, output comparison with ar, and how close
to a tie the model was where outputs diverge."""

from __future__ import annotations

import math
import statistics

import torch

from specctl.bench.config import CTAR_W
from specctl.bench.peers import RunResult
from specctl.errors import SpecctlError
from specctl.io.prompts import PromptRecord
from specctl.runtime.jobs.metrics import metrics
from specctl.runtime.step.sequence import Request

NEAR_TIE_STEPS = 2   # a gap within this many rounding steps of the top logit is a near-tie


def spread(values: list[float]) -> dict:
    v = sorted(values)
    med = statistics.median(v)
    if len(v) >= 2:
        q = statistics.quantiles(v, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return {"median": round(med, 3), "min": round(v[0], 3), "max": round(v[-1], 3),
            "iqr": round(iqr, 3), "spread_pct": round(100 * (v[-1] - v[0]) / med, 2) if med else 0.0,
            "runs": [round(x, 3) for x in values]}


def accept_numbers(gcfg, lines: list[dict], stats, device) -> dict:
    """The acceptance numbers of `generate`'s metrics (same definitions), plus zero-accept share."""
    m = metrics(gcfg, lines, stats, 0.0, device)
    return {"steps": m["steps"], "mean_accepted_tokens": m["mean_accepted_tokens"],
            "acceptance_rate": m["acceptance_rate"],
            "ctar": {str(w): m["ctar"][w] for w in CTAR_W},
            "zero_accept_share": m["zero_accept_share"],
            "padding_ratio": m["padding_ratio"] if stats is not None else None,
            "speculation": m["speculation"], "time_split": m["time_split"],
            "accepted_from": m["accepted_from"]}


def compare(got: dict[int, list[list[int]]], ref: dict[int, list[list[int]]], vs: str) -> dict | None:
    """None when identical; else how many prompts differ and where the first difference is."""
    bad, first = [], None
    for i in sorted(ref):
        a, b = got.get(i, []), ref[i]
        if a == b:
            continue
        bad.append(i)
        if first is None:
            for k in range(max(len(a), len(b))):
                x = a[k] if k < len(a) else []
                y = b[k] if k < len(b) else []
                if x != y:
                    j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                    first = {"index": i, "turn": k, "token": j}
                    break
    return None if not bad else {"vs": vs, "prompts": len(bad), "of": len(ref), "first": first}


MAX_DIVERGENCES = 64   # sequences analyzed per row


@torch.inference_mode()
def divergence_gaps(model, render, recs: list[PromptRecord], got: dict[int, list[list[int]]],
                    ref: dict[int, list[list[int]]]) -> list[dict]:
    """Where a sequence's first answer leaves the reference's, how close the model was to a tie.

    For each request (at most MAX_DIVERGENCES) whose first-turn tokens differ from the
    reference's at position j while both have a token there: the logit of the reference's
    token minus that of the other at j (`gap`, fp32 logits of the model in its own dtype), from
    one eager forward over the prompt and the common prefix; and `shape`, how far that
    position's logits move when the same rows are computed packed behind others (a second
    forward: another batch shape, as a step of a batch computes them). A gap within that
    movement (twice it), or within NEAR_TIE_STEPS of the dtype's rounding of the top logit
    (`step`), is a near-tie any change of summation order flips (`near_tie`): on a CPU even
    fp32 GEMMs round a row by the matrix's row count. A larger gap is a real difference.
    """
    out = []
    for r in recs:
        a, b = got.get(r.index, [[]]), ref.get(r.index, [[]])
        x, y = (a[0] if a else []), (b[0] if b else [])
        j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), None)
        if j is None:
            continue
        req = Request(r.index, [list(t) for t in r.turns], 1, r.raw_prompt)
        out.append({"index": r.index, "token": j,
                    **tie_gap(model, list(render(req)) + y[:j], y[j], x[j])})
        if len(out) >= MAX_DIVERGENCES:
            break
    return out


def tie_gap(model, ids: list[int], want: int, other: int) -> dict:
    """The logit gap of token `want` over `other` after ids, the rounding step of the top logit,
    the logits' movement under another batch shape, and whether the gap is a near-tie
    (divergence_gaps)."""
    from specctl.engine.batch import ForwardBatch, SeqInput

    def last_logits(seqs):
        kv = model.new_kv_cache(len(seqs), max(map(len, seqs)) + 1)
        h = model.forward(ForwardBatch([SeqInput(i, s, 0) for i, s in enumerate(seqs)],
                                       model.device), kv)
        return model.logits(h[-1:])[0].float()
    logits = last_logits([ids])
    packed = last_logits([ids[::-1] + ids[:1] * 64, ids])   # (more rows, then the same row)
    top = float(logits.max())
    top = abs(top) if math.isfinite(top) and top != 0 else 1.0
    step = torch.finfo(model.dtype).eps * 2.0 ** math.floor(math.log2(top))
    gap = float(logits[want] - logits[other])
    shape = float((logits - packed).abs().max())
    finite = math.isfinite(gap)
    return {"gap": round(gap, 6), "step": step,
            "steps": round(abs(gap) / step, 2) if finite else None, "shape": shape,
            "near_tie": finite and abs(gap) <= max(NEAR_TIE_STEPS * step, 2 * shape)}


def _category_tps(run: RunResult, cats: dict[int, str]) -> dict[str, float]:
    total = sum(run.residency.values()) or 1.0
    out = {}
    for c in sorted(set(cats.values())):
        idx = [i for i in run.outputs if cats[i] == c]
        wall = run.wall * sum(run.residency[i] for i in idx) / total
        tokens = sum(len(a) for i in idx for a in run.outputs[i])
        out[c] = tokens / wall if wall > 0 else 0.0
    return out


def mismatch_error(res: dict) -> SpecctlError | None:
    """An error naming the specctl rows whose tokens differ from their ar's where they must
    not: in fp32, and in any dtype under --exact."""
    fp32 = res.get("dtype") in ("float32", "torch.float32", "fp32")
    bad = []
    for r in res["rows"]:
        # bf16/fp16 without --exact: another batch shape rounds differently, near-ties flip and
        # the text diverges from there: reported (match rate per row), not an error
        if r["engine"] != "specctl" or not (fp32 or r.get("exact")):
            continue
        if r["mismatch"]:
            mm = r["mismatch"]
            f = mm["first"]
            bad.append(f"{r['method']} b{r['batch_size']} vs {mm['vs']}: {mm['prompts']} of "
                       f"{mm['of']} prompts (first: prompt {f['index']}, turn {f['turn']}, "
                       f"token {f['token']})")
        elif not r["repeats_identical"]:
            bad.append(f"{r['method']} b{r['batch_size']}: repeats gave different tokens")
    if not bad:
        return None
    return SpecctlError("outputs differ from ar greedy: " + "; ".join(bad) +
                        f" (results stored in {res.get('path', 'the store')})", exit_code=1)
