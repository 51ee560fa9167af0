"""Benchmark: specctl `ar` decoding against Hugging Face transformers `generate`.

What it measures, on the demo model (SmolLM2-135M-Instruct, fp32, CPU by default) and the same N
real prompts (first human turns of ShareGPT, rendered with the chat template), greedy, exactly
--max-tokens new tokens per prompt (EOS does not stop a sequence, so every config does the
same work):

  ar:B   specctl Runner + NoDraft with B KV slots (continuous batching over all N prompts)
  hf:B   LlamaForCausalLM.generate(do_sample=False) on batches of B prompts (left padding)

tokens/s = generated tokens / wall seconds of the whole run (prefill included), after a short
warm-up run. Each config runs in its own subprocess (`--only CONFIG`), so its peak RSS (model
load + run) is clean. The outputs are checked token by token against HF at batch 1.

    python recipes/bench_ar.py [--prompts 16] [--max-tokens 128] [--batch-sizes 1,4,16]
                               [--hf-batch-sizes 1,16] [--repeats 1] [--out results.json]
                               [--threads N] [--store DIR]

Timings on a shared machine suffer when other processes compete for the CPUs (with 2 torch
threads on 2 busy cores, tiny ops wait on descheduled threads); the load average is recorded,
and --threads 1 gives steadier numbers there.

Targets: specctl ar b1 >= 1.5x HF b1; specctl ar b16 >= 4x specctl ar b1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from specctl.io.sharegpt import first_human_turns
from specctl.models.checkpoint import resolve_model
from specctl.runtime.jobs.tokenization import Tokenization
from specctl.runtime.step.sequence import Request
from specctl.store import Store, atomic_write_json

MARK = "BENCH_RESULT "


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:   # ru_maxrss is in KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ar_generate(model_dir: Path, tk: Tokenization, batch: int):
    from specctl.engine.loader import load_model
    from specctl.runtime.step.runner import Runner
    from specctl.speculative.drafter import NoDraft
    from specctl.speculative.sampling import SamplingParams

    model = load_model(model_dir, "cpu", "fp32")

    def generate(ids: list[list[int]], max_tokens: int) -> list[list[int]]:
        reqs = [Request(i, [[{"role": "user", "content": ""}]], max_tokens)
                for i in range(len(ids))]
        runner = Runner(model, NoDraft(), SamplingParams(), batch_size=batch,
                        max_len=max(map(len, ids)) + max_tokens + 8, eos_ids=set(),
                        render=lambda r: ids[r.index], decode=tk.decode)
        out: dict[int, list[int]] = {}
        runner.run(reqs, lambda r: out.__setitem__(r.index, r.answer_ids[0]))
        return [out[i] for i in range(len(ids))]
    return generate


def hf_generate(model_dir: Path, tk: Tokenization, batch: int):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = tk.tok
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    def generate(ids: list[list[int]], max_tokens: int) -> list[list[int]]:
        outs = []
        for i in range(0, len(ids), batch):
            enc = tok.pad({"input_ids": ids[i:i + batch]}, padding=True, return_tensors="pt")
            with torch.inference_mode():
                g = model.generate(**enc, do_sample=False, max_new_tokens=max_tokens,
                                   min_new_tokens=max_tokens, eos_token_id=None,
                                   pad_token_id=tok.pad_token_id)
            outs += g[:, enc["input_ids"].shape[1]:].tolist()
        return outs
    return generate


def measure(config: str, args) -> dict:
    """Run one config in this process; return its numbers and outputs."""
    kind, batch = config.split(":")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    store = Store(args.store)
    model_dir = resolve_model(None, store, log=log)
    tk = Tokenization(model_dir, chat=True)
    prompts = first_human_turns(args.prompts, store, log=log)
    ids = [tk.render(Request(i, [[{"role": "user", "content": p}]], args.max_tokens))
           for i, p in enumerate(prompts)]
    rss_start = rss_mb()
    generate = {"ar": ar_generate, "hf": hf_generate}[kind](model_dir, tk, int(batch))
    rss_loaded = rss_mb()
    generate(ids[:min(int(batch), 2)], 8)                        # warm-up
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outs = generate(ids, args.max_tokens)
        walls.append(time.perf_counter() - t0)
    tokens = sum(map(len, outs))
    return {"config": config, "kind": kind, "batch": int(batch), "tokens": tokens,
            "wall_s": round(min(walls), 3), "walls_s": [round(w, 3) for w in walls],
            "tokens_per_s": round(tokens / min(walls), 3),
            "rss_start_mb": round(rss_start, 1), "rss_loaded_mb": round(rss_loaded, 1),
            "rss_end_mb": round(rss_mb(), 1), "peak_rss_mb": round(peak_rss_mb(), 1),
            "threads": torch.get_num_threads(), "prompt_tokens": [len(x) for x in ids],
            "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)], "outputs": outs}


def run_child(config: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", config,
           "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
           "--repeats", str(args.repeats), "--threads", str(args.threads)] + \
        (["--store", args.store] if args.store else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)   # stderr passes through
    lines = [l for l in proc.stdout.splitlines() if l.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{config} failed (exit status {proc.returncode})")
    return json.loads(lines[-1][len(MARK):])


def same_count(a: list[list[int]], b: list[list[int]]) -> tuple[int, list[int | None]]:
    """How many outputs are identical, and per prompt the index of the first differing token."""
    first = [next((j for j, (x, y) in enumerate(zip(p, q)) if x != y),
                  None if len(p) == len(q) else min(len(p), len(q))) for p, q in zip(a, b)]
    return sum(f is None for f in first), first


def report(results: list[dict], args, total_s: float) -> dict:
    from rich.console import Console
    from rich.table import Table

    by = {r["config"]: r for r in results}
    hf1 = by.get("hf:1")
    n = len(results[0]["outputs"])
    table = Table(title=f"{n} ShareGPT prompts x {args.max_tokens} new tokens, greedy, fp32 CPU "
                        f"({results[0]['threads']} threads)")
    for col in ("config", "tokens/s", "wall s", "vs HF b1", "peak RSS MB", "= HF b1"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in results:
        name = ("specctl ar" if r["kind"] == "ar" else "HF generate") + f" b{r['batch']}"
        if hf1:
            r["identical_to_hf_b1"], r["first_diff_vs_hf_b1"] = same_count(r["outputs"],
                                                                           hf1["outputs"])
        ratio = f"{r['tokens_per_s'] / hf1['tokens_per_s']:.2f}x" if hf1 else "-"
        same = f"{r['identical_to_hf_b1']}/{n}" if hf1 else "-"
        table.add_row(name, f"{r['tokens_per_s']:.1f}", f"{r['wall_s']:.1f}", ratio,
                      f"{r['peak_rss_mb']:.0f}", same)
    targets = []
    for label, num, den, aim in (("specctl ar b1 / HF b1", "ar:1", "hf:1", 1.5),
                                 ("specctl ar b16 / specctl ar b1", "ar:16", "ar:1", 4.0)):
        if num in by and den in by:
            x = by[num]["tokens_per_s"] / by[den]["tokens_per_s"]
            targets.append({"target": label, "ratio": round(x, 3), "aim": aim, "met": x >= aim})
    console = Console()
    console.print(table)
    t2 = Table(title="project targets")
    for col in ("ratio", "value", "aim", "met"):
        t2.add_column(col)
    for t in targets:
        t2.add_row(t["target"], f"{t['ratio']:.2f}x", f">= {t['aim']}x",
                   "yes" if t["met"] else "no")
    console.print(t2)
    console.print(f"prompt tokens: {results[0]['prompt_tokens']}; total time {total_s:.0f} s")
    loads = [x for r in results for x in r["load_avg"]]
    console.print(f"1-min load average during the runs: {min(loads):.1f} .. {max(loads):.1f} "
                  f"on {os.cpu_count()} CPUs" + (" (other processes competed for the CPUs: "
                  "timings are pessimistic)" if max(loads) > os.cpu_count() + 0.5 else ""))
    return {"prompts": n, "max_tokens": args.max_tokens, "repeats": args.repeats,
            "total_s": round(total_s, 1), "cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.processor() or
            platform.machine(), "targets": targets, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", default="1,4,16", help="specctl ar batch sizes")
    ap.add_argument("--hf-batch-sizes", default="1,16", help="HF generate batch sizes")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per config (best kept)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default: torch's own choice)")
    ap.add_argument("--store", help="specctl store (default $SPECCTL_HOME or ~/.cache/specctl)")
    ap.add_argument("--only", help=argparse.SUPPRESS)   # internal: one config, JSON on stdout
    args = ap.parse_args()
    if args.only:
        print(MARK + json.dumps(measure(args.only, args)), flush=True)
        return
    t0 = time.perf_counter()
    store = Store(args.store)
    resolve_model(None, store, log=log)                  # fetch once, before the children
    first_human_turns(args.prompts, store, log=log)
    configs = [f"ar:{b}" for b in args.batch_sizes.split(",") if b] + \
              [f"hf:{b}" for b in args.hf_batch_sizes.split(",") if b]
    results = []
    for c in configs:
        log(f"[{time.perf_counter() - t0:6.0f} s] running {c} ...")
        results.append(run_child(c, args))
        log(f"    {results[-1]['tokens_per_s']:.1f} tokens/s")
    summary = report(results, args, time.perf_counter() - t0)
    if args.out:
        atomic_write_json(Path(args.out), summary)


if __name__ == "__main__":
    main()
