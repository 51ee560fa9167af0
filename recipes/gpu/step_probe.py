"""What a captured decoding step costs, and why: kernel names, counts and times per shape.

    python recipes/gpu/step_probe.py [--shape demo] [--parts all] [--out DIR]

Random weights of the named shape (shapes.py), so it needs no checkpoint. Parts:
- bw: device-to-device copy bandwidth (bytes read + written), the floor of a weight-bound step.
- steps: for each attention backend and (batch, tokens per sequence), the median replay time of
  the captured step (engine/graphs.py, prefix `--context` rows, cache `--cache` rows; the
  step ends at the last layer's states, the LM head is timed in `head`), and the top kernels of one eager forward of the same shape under torch.profiler (name, count, time).
- head: the LM head as the step ends today ([T, V] fp32 logits) against argmax + confidence only.
- det: bitwise repeatability: one captured graph replayed 100 times on frozen inputs, and each
  matmul / norm / attention call of the forward repeated 100 times on fixed random inputs (the
  number of distinct results; 1 = deterministic).
Prints markdown tables; with --out also writes them to DIR/step_probe.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_model, weight_bytes  # noqa: E402

from specctl.engine.batch import FULL  # noqa: E402
from specctl.engine.graphs import CudaGraphs  # noqa: E402

LINES: list[str] = []


def say(s: str = "") -> None:
    print(s, flush=True)
    LINES.append(s)


def cuda_ms(fn, reps: int = 50, warm: int = 5) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def bandwidth() -> float:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")   # 2 GiB
    y = torch.empty_like(x)
    ms = cuda_ms(lambda: y.copy_(x), reps=20)
    gbs = 2 * x.numel() / ms / 1e6
    say(f"copy bandwidth: {gbs:.0f} GB/s (2 GiB device-to-device, read + write)")
    del x, y
    torch.cuda.empty_cache()
    return gbs


def fill(cap, B: int, n: int, context: int, vocab: int, slots: int) -> None:
    g = torch.Generator().manual_seed(0)
    cap.tokens.copy_(torch.randint(0, vocab, cap.tokens.shape, generator=g))
    Bb = cap.slots.shape[0]
    pre = torch.full((Bb,), context)
    cap.prefix.copy_(pre)
    if cap.parents is not None:   # (each sequence a chain: its row before it; the graph lays
        cap.parents.copy_((torch.arange(n) - 1).clamp(min=0).repeat(Bb))   # out positions)
    cap.slots.copy_(torch.arange(Bb) % slots)


def top_kernels(fn, k: int = 12) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total_n = sum(r[0] for r in rows.values())
    total_t = sum(r[1] for r in rows.values())
    out = [f"  kernels: {total_n} launches, {total_t / 1e3:.3f} ms GPU time"]
    for name, (cnt, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:k]:
        out.append(f"  {t / 1e3:8.3f} ms {cnt:5d}x  {name[:110]}")
    return out


def steps(model, shapes, context: int, cache: int, backends, profile: bool) -> None:
    slots = max(B for B, _ in shapes)
    say(f"\n## captured step, prefix {context} rows, cache {cache} rows per slot")
    say("| backend | batch x n | replay ms | ms per token |")
    say("|---|---|---|---|")
    details = []
    for backend in backends:
        model.set_attention(backend)
        model.graphs = CudaGraphs(model)
        kv = model.new_kv_cache(slots, cache)
        for B, n in shapes:
            C = model.graphs.kv_columns(context + n, kv.max_len)
            try:
                cap = model.graphs._capture(kv, B, n, C, FULL)
                fill(cap, B, n, context, model.cfg.vocab_size, slots)
                ms = cuda_ms(cap.graph.replay)
            except Exception as e:   # noqa: BLE001 - report and go on
                say(f"| {backend} | {B} x {n} | error: {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:100]} | |")
                continue
            say(f"| {backend} | {B} x {n} | {ms:.3f} | {ms / (B * n):.4f} |")
            if profile:
                args = (kv, B, n, C, FULL, cap.tokens, cap.slots, cap.prefix, cap.parents,
                        cap.table)
                details.append(f"\n{backend} {B} x {n} (eager forward of the same shape):")
                details.extend(top_kernels(lambda: model.graphs._forward(*args)))
        model.graphs = None
        del kv
        torch.cuda.empty_cache()
    for d in details:
        say(d)


def head(model, Ts) -> None:
    say("\n## LM head: fp32 [T, V] logits + argmax vs Model.argmax (model dtype)")
    say("| T | logits fp32 + argmax ms | Model.argmax ms |")
    say("|---|---|---|")
    for T in Ts:
        h = torch.randn(T, model.cfg.hidden_size, device="cuda", dtype=model.dtype)
        say(f"| {T} | {cuda_ms(lambda: model.logits(h).argmax(-1)):.3f} "
            f"| {cuda_ms(lambda: model.argmax(h)):.3f} |")


def distinct(fn, reps: int = 100) -> int:
    ref = fn().clone()
    seen = [ref]
    for _ in range(reps - 1):
        o = fn()
        if not any(torch.equal(o, s) for s in seen):
            seen.append(o.clone())
    return len(seen)


def det(model) -> None:
    say("\n## bitwise repeatability (distinct results in 100 runs; 1 = deterministic)")
    c = model.cfg
    model.set_attention("sdpa")
    model.graphs = CudaGraphs(model)
    kv = model.new_kv_cache(8, 1024)
    for (B, n) in ((8, 1), (8, 16)):   # the eager forward (prefill's path) on frozen KV
        from specctl.engine.batch import ForwardBatch, SeqInput
        batch = ForwardBatch([SeqInput(s, list(range(1, 1 + n)), 300 + 17 * s)
                              for s in range(B)], "cuda")
        say(f"- eager forward, batch {B} x {n}: "
            f"{distinct(lambda: model.forward(batch, kv), 30)} distinct states")
    for B in (1, 8):
        cap = model.graphs._capture(kv, B, 1, model.graphs.kv_columns(301, kv.max_len), FULL)
        fill(cap, B, 1, 300, c.vocab_size, 8)

        def rep():
            cap.graph.replay()
            return cap.outputs[0]
        say(f"- captured ar step, batch {B}: {distinct(rep)} distinct logits")
    model.graphs = None
    L = model.layers[0]
    for M in (1, 2, 8, 16, 32):
        x = torch.randn(M, c.hidden_size, device="cuda", dtype=model.dtype)
        xi = torch.randn(M, c.intermediate_size, device="cuda", dtype=model.dtype)
        xo = torch.randn(M, c.num_heads * c.head_dim, device="cuda", dtype=model.dtype)
        res = {
            "qkv": distinct(lambda: F.linear(x, L.wqkv)),
            "o": distinct(lambda: F.linear(xo, L.wo)),
            "gate_up": distinct(lambda: F.linear(x, L.w_gate_up)),
            "down": distinct(lambda: F.linear(xi, L.w_down)),
            "lm_head": distinct(lambda: F.linear(x, model.lm_head)),
            "rms_norm": distinct(lambda: F.rms_norm(x, (c.hidden_size,), L.attn_norm, 1e-5)),
        }
        say(f"- M = {M}: " + ", ".join(f"{k} {v}" for k, v in res.items()))
    for M in (300, 1200, 4096):   # prefill shapes (packed prompts)
        x = torch.randn(M, c.hidden_size, device="cuda", dtype=model.dtype)
        xi = torch.randn(M, c.intermediate_size, device="cuda", dtype=model.dtype)
        say(f"- M = {M}: qkv {distinct(lambda: F.linear(x, L.wqkv))}, "
            f"gate_up {distinct(lambda: F.linear(x, L.w_gate_up))}, "
            f"down {distinct(lambda: F.linear(xi, L.w_down))}, "
            f"lm_head {distinct(lambda: F.linear(x, model.lm_head), 20)}")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    for B, T, S in ((1, 1, 300), (1, 16, 300), (8, 16, 600), (1, 300, 300), (8, 300, 300),
                    (4, 1024, 1024)):
        q = torch.randn(B, c.num_heads, T, c.head_dim, device="cuda", dtype=model.dtype)
        k = torch.randn(B, c.num_kv_heads, S, c.head_dim, device="cuda", dtype=model.dtype)
        v = torch.randn_like(k)
        keep = torch.ones(T, S, dtype=torch.bool, device="cuda").tril(S - T)
        bias = torch.zeros(B, 1, T, S, device="cuda", dtype=model.dtype).masked_fill_(
            ~keep, float("-inf"))
        res = []
        for name, be in backends.items():
            def f():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
            try:
                if be is None:
                    res.append(f"{name} {distinct(f, 50)}")
                else:
                    with sdpa_kernel([be]):
                        res.append(f"{name} {distinct(f, 50)}")
            except Exception as e:   # noqa: BLE001 - a backend that cannot run this shape
                res.append(f"{name} n/a ({type(e).__name__})")
        say(f"- sdpa B={B} T={T} S={S} float mask + gqa: " + ", ".join(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="demo")
    ap.add_argument("--parts", default="bw,steps,head,det")
    ap.add_argument("--shapes", default="1x1,8x1,32x1,32x4,32x16,32x96,1x16")
    ap.add_argument("--backends", default="sdpa,flex")
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--cache", type=int, default=896)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    parts = a.parts.split(",")
    say(f"# step probe: {a.shape} shape, random weights, bf16, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    model = random_model(a.shape, "cuda", torch.bfloat16)
    wb = weight_bytes(model)
    say(f"weights read per step: {wb / 1e9:.3f} GB")
    if "bw" in parts:
        gbs = bandwidth()
        say(f"weight-bandwidth floor: {wb / gbs / 1e6:.3f} ms per step")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    if "steps" in parts:
        steps(model, shapes, a.context, a.cache, a.backends.split(","), not a.no_profile)
    if "head" in parts:
        head(model, [1, 32, 512, 3072])
    if "det" in parts:
        det(model)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"step_probe_{a.shape}.md").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
