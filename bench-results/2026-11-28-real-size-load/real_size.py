"""A real-size load on this machine: a random bf16 checkpoint shaped like Llama-3.2-1B (hidden
2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab 128256, tied embeddings, llama3
rope) in 3 shards with an index; specctl loads it (load time, peak RSS), generates 16 tokens for
4 prompts (peak RSS against 1.3x the bf16 weights + the KV cache the run reports) and benches
ar and self-draft on it. Every measurement runs in a process of its own.

    python real_size.py WORK_DIR [--tokenizer DIR] [--small] [--no-bench]

WORK_DIR gets the checkpoint (ckpt/, kept: ~2.5 GB at full size), the store, the outputs and
results.json. --tokenizer: a model folder whose tokenizer files are copied (default: the demo
model in the store); --small: a tiny shape for tests (tests/test_weights.py).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

LLAMA_3_2_1B = dict(hidden=2048, layers=16, heads=32, kv_heads=8, inter=8192, vocab=128256)
SMALL = dict(hidden=256, layers=6, heads=8, kv_heads=2, inter=1024, vocab=512)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain speculative decoding in one sentence.", "List three prime numbers."]


def layer_shapes(s: dict, i: int) -> dict[str, tuple[int, ...]]:
    D, I, hd = s["hidden"], s["inter"], s["hidden"] // s["heads"]
    q, kv, p = s["heads"] * hd, s["kv_heads"] * hd, f"model.layers.{i}."
    return {p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (q, D), p + "self_attn.k_proj.weight": (kv, D),
            p + "self_attn.v_proj.weight": (kv, D), p + "self_attn.o_proj.weight": (D, q),
            p + "mlp.gate_proj.weight": (I, D), p + "mlp.up_proj.weight": (I, D),
            p + "mlp.down_proj.weight": (D, I)}


def _random(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """A norm's ones, else N(0, 1/sqrt(fan_in)) drawn in bf16 (never the model in fp32)."""
    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)
    w = torch.empty(shape, dtype=torch.bfloat16)
    return w.normal_(0.0, shape[1] ** -0.5, generator=g)


def build(out: Path, s: dict, shards: int = 3, seed: int = 0) -> int:
    """Write the checkpoint (config.json, shards, index) into out; return its weights' bytes.
    One shard's tensors are in memory at a time."""
    out.mkdir(parents=True, exist_ok=True)
    groups = [list(g) for g in torch.arange(s["layers"]).tensor_split(shards)]
    g = torch.Generator().manual_seed(seed)
    wmap, total = {}, 0
    for k, layers in enumerate(groups):
        names: dict[str, tuple[int, ...]] = {}
        if k == 0:
            names["model.embed_tokens.weight"] = (s["vocab"], s["hidden"])
        for i in layers:
            names.update(layer_shapes(s, int(i)))
        if k == shards - 1:
            names["model.norm.weight"] = (s["hidden"],)
        tensors = {n: _random(shape, g) for n, shape in names.items()}
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        wmap.update({n: fname for n in tensors})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": wmap}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (out / "config.json").write_text(json.dumps(config(s), indent=1))
    return total


def config(s: dict) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": s["hidden"], "intermediate_size": s["inter"],
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
            "num_key_value_heads": s["kv_heads"], "head_dim": s["hidden"] // s["heads"],
            "vocab_size": s["vocab"], "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu",
            "rope_theta": 500000.0, "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "bos_token_id": 1, "eos_token_id": 2}


def copy_tokenizer(src: Path, out: Path, vocab: int) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    size = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    if size > vocab:
        raise SystemExit(f"the tokenizer of {src} has {size} tokens, more than vocab {vocab}")


def measure_load(ckpt: Path) -> dict:
    """load_model in a process of its own: seconds, RSS after the imports, peak RSS once every
    weight has been read (a strided sum touches each page, as a forward would)."""
    # (VmHWM, not ru_maxrss: a process started by vfork, as subprocess starts it, inherits its
    # parent's ru_maxrss)
    code = ("import json, time\n"
            "from specctl.engine.loader import load_model\n"
            "def kb(key): return next(int(l.split()[1]) for l in open('/proc/self/status') "
            "if l.startswith(key))\n"
            "base = kb('VmRSS'); t = time.perf_counter()\n"
            f"m = load_model({str(ckpt)!r}, 'cpu', 'bf16')\n"
            "s = time.perf_counter() - t\n"
            "ts = [m.embed, m.norm] + [v for L in m.layers for v in vars(L).values() "
            "if v is not None]\n"
            "sum(float(v.reshape(-1)[::1024].float().sum()) for v in ts)\n"
            "print(json.dumps({'load_s': round(s, 2), 'base_kb': base, "
            "'peak_kb': kb('VmHWM')}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def timed(cmd: list[str], log: Path) -> dict:
    """Run cmd under /usr/bin/time -v (its output in log): wall seconds and peak RSS."""
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    log.write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    return {"wall_s": round(time.perf_counter() - t, 1), "peak_kb": int(peak.group(1)),
            "output": r.stdout + r.stderr}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--tokenizer", type=Path,
                    default=Path.home() / ".cache/specctl/models/smollm2-135m-instruct")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    a = ap.parse_args()
    shape = SMALL if a.small else LLAMA_3_2_1B
    work, ckpt = a.work, a.work / "ckpt"
    res: dict = {"shape": shape}
    if not (ckpt / "model.safetensors.index.json").is_file():
        t = time.perf_counter()
        build(ckpt, shape)
        copy_tokenizer(a.tokenizer, ckpt, shape["vocab"])
        res["build_s"] = round(time.perf_counter() - t, 1)
    weights = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    res["weights_bytes_on_disk"] = weights
    load = res["load"] = measure_load(ckpt)
    load["growth_x_weights"] = round((load["peak_kb"] - load["base_kb"]) * 1024 / weights, 3)
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    common = ["--model", str(ckpt), "--store", str(work / "store"), "--device", "cpu",
              "--dtype", "bf16", "--max-tokens", "16"]
    gen = timed([sys.executable, "-m", "specctl", "generate", str(prompts), "--out",
                 str(work / "out.jsonl"), "--batch-size", "4", "-q", *common],
                work / "generate.log")
    gen.pop("output")
    run_dir = max((work / "store" / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    kv = metrics["kv_cache"]["mib"] * 2**20
    answers = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
    gen.update(kv_cache_mib=metrics["kv_cache"]["mib"], new_tokens=metrics["new_tokens"],
               answers=len(answers), bound_kb=math.floor((1.3 * weights + kv) / 1024))
    gen["within_bound"] = gen["peak_kb"] <= gen["bound_kb"]
    res["generate"] = gen
    if not a.no_bench:
        b = timed([sys.executable, "-m", "specctl", "bench", str(prompts), "--methods",
                   "ar,self-draft", "--batch-sizes", "4", "--repeats", "1", "--warmup", "1",
                   "--speculate", "fixed", "--corpus-cache", "none", "--branches", "2",
                   "--branch-len", "4", "--context-cands", "4", "--threads", "2",
                   *common], work / "bench.log")
        b.pop("output")   # (the table: bench.log)
        res["bench"] = b
    (work / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
