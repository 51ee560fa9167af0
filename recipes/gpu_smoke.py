"""GPU smoke benchmark (eager engine): correctness on CUDA and first speed numbers.

Run on a CUDA machine after staging the demo model (../shared/GPU.md):

    python recipes/gpu_smoke.py --gguf /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf \
        --prompts prompts.jsonl --out $OUT/gpu_smoke.json

1. fp32 logits of the specctl engine on CUDA vs transformers on CUDA (max abs difference).
2. specctl `ar` in bf16 at batch 1, 8, 32: tokens/s (whole run incl. prefill, after warm-up,
   median of repeats), and its outputs vs `ar` fp32 (bf16 rounding can flip near-ties).
3. transformers `generate` (eager, bf16) at batch 1 and 8, same prompts, tokens/s.
4. draft-verify (bf16) with the search's first seed skip set at batch 1 and 8: tokens/s,
   mean accepted tokens, and whether its outputs equal `ar` bf16 greedy of the same batch size.
All ratios come from this one process on the same prompts and settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specctl.io.prompts import read_prompts
from specctl.models.checkpoint import pull_demo
from specctl.models.loader import load_model
from specctl.prep.search_skip import seed_sets
from specctl.runtime.job import Tokenization
from specctl.runtime.runner import Runner
from specctl.runtime.sequence import Request
from specctl.spec.draft_verify import ExitParams, LayerSkipDrafter
from specctl.spec.drafter import NoDraft
from specctl.spec.verify import SamplingParams
from specctl.store import Store


def run(model, drafter, ids, batch, max_tokens, eos):
    reqs = [Request(i, [[]], max_tokens) for i in range(len(ids))]
    r = Runner(model, drafter, SamplingParams(), batch_size=batch,
               max_len=max(map(len, ids)) + max_tokens + 16, eos_ids=eos,
               render=lambda q: ids[q.index], decode=lambda x: "")
    out = {}
    torch.cuda.synchronize()
    t = time.perf_counter()
    r.run(reqs, lambda q: out.__setitem__(q.index, (q.answer_ids[0], q.steps)))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    toks = [out[i][0] for i in range(len(ids))]
    steps = sum(out[i][1] for i in range(len(ids)))
    return toks, wall, sum(map(len, toks)), steps


T0 = time.perf_counter()


def say(msg):
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def timed(fn, repeats):
    res = [fn() for _ in range(repeats)]
    walls = [r[1] for r in res]
    return res[0], statistics.median(walls), (min(walls), max(walls))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="gpu_smoke.json")
    a = ap.parse_args()
    store = Store("/tmp/specctl-store")
    model_dir = pull_demo(store, source=Path(a.gguf))
    say("model ready")
    tk = Tokenization(model_dir, chat=True)
    recs = read_prompts(a.prompts)
    ids = [tk.render(Request(r.index, [list(r.turns[0])], a.max_tokens)) for r in recs][:32]
    eos = set()   # every sequence generates max_tokens: the same work for every config
    res = {"device": torch.cuda.get_device_name(), "prompts": len(ids), "max_tokens": a.max_tokens}

    from transformers import AutoModelForCausalLM
    m32 = load_model(model_dir, "cuda", "fp32")
    hf32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    from specctl.engine.batch import ForwardBatch, SeqInput
    diffs = []
    for p in ids[:3]:
        kv = m32.new_kv_cache(1, len(p) + 1)
        got = m32.logits(m32.forward(ForwardBatch([SeqInput(0, p, 0)], "cuda"), kv))
        with torch.no_grad():
            ref = hf32(torch.tensor([p], device="cuda")).logits[0].float()
        diffs.append((got - ref).abs().max().item())
    res["fp32_logits_max_abs_diff_vs_hf"] = max(diffs)
    say(f"logits checked: {max(diffs):.2e}")
    ref32, *_ = run(m32, NoDraft(), ids[:8], 8, a.max_tokens, eos)
    say("fp32 reference generated")
    del m32, hf32

    m = load_model(model_dir, "cuda", "bf16")
    run(m, NoDraft(), ids[:2], 2, 8, eos)   # warm-up
    ar = {}
    for b in (1, 8, 32):
        n = 8 if b == 1 else 32
        (toks, _, ntok, steps), wall, spread = timed(
            lambda: run(m, NoDraft(), ids[:n], b, a.max_tokens, eos), a.repeats)
        ar[b] = toks
        say(f"ar b{b}: {ntok / wall:.1f} tok/s")
        res[f"ar_b{b}"] = {"prompts": n, "tokens_per_s": round(ntok / wall, 1),
                           "wall_s": round(wall, 3), "spread_s": spread}
    res["ar_bf16_vs_fp32_identical"] = sum(x == y for x, y in zip(ar[8][:8], ref32))
    res["ar_b8_vs_b1_identical"] = sum(x == y for x, y in zip(ar[8][:8], ar[1]))

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    tok = tk.tok
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    for b in (1, 8):
        sel = ids[:4] if b == 1 else ids[:8]

        def hf_run():
            torch.cuda.synchronize()
            t = time.perf_counter()
            n = 0
            for i in range(0, len(sel), b):
                enc = tok.pad({"input_ids": sel[i:i + b]}, padding=True, return_tensors="pt").to("cuda")
                with torch.inference_mode():
                    g = hf.generate(**enc, do_sample=False, max_new_tokens=a.max_tokens,
                                    min_new_tokens=a.max_tokens, eos_token_id=None,
                                    pad_token_id=tok.pad_token_id)
                n += g[:, enc["input_ids"].shape[1]:].numel()
            torch.cuda.synchronize()
            return None, time.perf_counter() - t, n
        hf_run()
        (_, _, n), wall, spread = timed(hf_run, 2)
        say(f"hf b{b}: {n / wall:.1f} tok/s")
        res[f"hf_eager_b{b}"] = {"prompts": len(sel), "tokens_per_s": round(n / wall, 1)}
    del hf

    skip = seed_sets(m.cfg.num_layers)[1]
    for b in (1, 8):
        n = 8 if b == 1 else 32
        dr = LayerSkipDrafter(m, skip, SamplingParams(), ExitParams())
        (toks, _, ntok, steps), wall, spread = timed(
            lambda: run(m, dr, ids[:n], b, a.max_tokens, eos), a.repeats)
        say(f"dv b{b}: {ntok / wall:.1f} tok/s, {ntok / steps:.2f} tokens/step")
        res[f"draft_verify_b{b}"] = {
            "skip": skip.to_json(), "tokens_per_s": round(ntok / wall, 1),
            "speedup_vs_ar": round(ntok / wall / res[f"ar_b{b}"]["tokens_per_s"]
                                   if b == 1 else (ntok / wall) / res["ar_b8"]["tokens_per_s"], 3),
            "mean_accepted_tokens": round(ntok / steps, 3),
            "identical_to_ar": sum(x == y for x, y in zip(toks, ar[1] if b == 1 else ar[8])),
            "of": n if b == 1 else min(n, len(ar[8]))}
    Path(a.out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
