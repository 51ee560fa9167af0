"""`ar` tokens/s of two checkouts of specctl, same run, alternating: does a change make the
engine slower? Each measurement runs in its own subprocess with PYTHONPATH set to one checkout.

    git worktree add /tmp/old <commit>
    python bench-results/2026-11-23-cpu-paged/engine_ab.py --old /tmp/old --new . --repeats 2 [--paged]
    python bench-results/2026-11-23-cpu-paged/engine_ab.py --old /tmp/old --new . --methods self-draft,draft-verify \
        --store STORE --prompts recipes/prompts/mtbench16.jsonl --skip-set FILE

With --methods each method runs as `generate` builds it (make_drafter, make_runner: its
default --speculate auto, the store's artifacts and step-cost table), greedy, batch 1 over 2
prompts and batch 8 over 8, EOS honoured; one warm-up run per measurement.

Workload: the demo model (in the store, $SPECCTL_HOME or ~/.cache/specctl, or --model), fp32
on the CPU, NoDraft, greedy, --threads threads, prompts = the first human turns of
recipes/gpu/sharegpt32.jsonl rendered with the chat template, 64 new tokens each (no EOS): batch 1 over 2 prompts, batch 8 over 8.
--paged adds the new checkout at batch 8 with a KV budget of half the batch at full length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
import specctl
assert specctl.__file__.startswith(sys.path[0] or __import__("os").getcwd()), specctl.__file__
from pathlib import Path
from specctl.engine.loader import load_model
from specctl.runtime.jobs.tokenization import Tokenization
from specctl.runtime.step.runner import Runner
from specctl.runtime.step.sequence import Request
from specctl.speculative.drafter import NoDraft
from specctl.speculative.sampling import SamplingParams
model_dir, batch, n, tokens, threads, paged = sys.argv[1:7]
batch, n, tokens, threads, paged = int(batch), int(n), int(tokens), int(threads), paged == "1"
torch.set_num_threads(threads)
model = load_model(Path(model_dir), "cpu", "fp32")
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(model_dir)
lines = [json.loads(l) for l in open(sys.argv[7])][:n]
texts = [d["prompt"] if "prompt" in d else d["messages"][0]["content"] for d in lines]
ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                          add_generation_prompt=True), add_special_tokens=False)
       for t in texts]
kw = {}
if paged:
    from specctl.engine.kv import BLOCK, row_bytes
    c = model.cfg
    rows = -(-(max(map(len, ids)) + tokens + 8) // BLOCK) * BLOCK
    kw["kv_budget"] = (batch // 2 * rows + BLOCK) * row_bytes(c.num_layers, c.num_kv_heads,
                                                                c.head_dim, model.dtype)
def once():
    reqs = [Request(i, [[{}]], tokens) for i in range(n)]
    r = Runner(model, NoDraft(), SamplingParams(), batch_size=batch,
               max_len=max(map(len, ids)) + tokens + 8, eos_ids=set(),
               render=lambda q: ids[q.index], decode=lambda x: "", threads=threads, **kw)
    t = time.perf_counter()
    st = r.run(reqs, lambda q: None)
    return st.generated / (time.perf_counter() - t), st
once()   # warm-up
tps, st = once()
print("RESULT " + json.dumps({"tokens_per_s": round(tps, 2), "preemptions": getattr(st, "preemptions", 0)}))
"""

METHOD_CHILD = r"""
import json, sys, time
import specctl
assert specctl.__file__.startswith(sys.path[0] or __import__("os").getcwd()), specctl.__file__
from pathlib import Path
from specctl.engine.loader import load_model
from specctl.io.prompts import read_prompts
from specctl.models.fingerprint import model_fingerprint
from specctl.runtime.jobs.config import GenerateConfig, split_variant
from specctl.runtime.jobs.methods import make_drafter
from specctl.runtime.step.sequence import Request
from specctl.runtime.jobs.sizing import make_runner
from specctl.runtime.jobs.tokenization import Tokenization, kv_rows
from specctl.store import Store
method, model_dir, batch, n, tokens, threads, prompts, store, skip = sys.argv[1:10]
batch, n, tokens, threads = int(batch), int(n), int(tokens), int(threads)
store, model_dir = Store(store), Path(model_dir)
model = load_model(model_dir, "cpu", "fp32")
tk = Tokenization(model_dir, chat=True)
texts = [r.turns[0][-1]["content"] for r in read_prompts(prompts)][:n]
name, opts = split_variant(method)
cfg = GenerateConfig(input="x", method=name, batch_size=batch, max_tokens=tokens,
                     threads=threads, skip_set=skip or None, **opts)
def once():
    reqs = [Request(i, [[{"role": "user", "content": t}]], tokens) for i, t in enumerate(texts)]
    drafter = make_drafter(cfg, model, model_dir, store, lambda *_: None)
    r = make_runner(cfg, model, drafter, tk, [kv_rows(tk, q)[1] for q in reqs], store=store,
                    fingerprint=model_fingerprint(model_dir))
    t = time.perf_counter()
    st = r.run(reqs, lambda q: None)
    return st.generated / (time.perf_counter() - t), st, [q.answer_ids for q in reqs]
once()   # warm-up (and the step-cost table, measured once into the store)
tps, st, ids = once()
print("RESULT " + json.dumps({"tokens_per_s": round(tps, 2), "steps": st.steps,
                              "ids": __import__("hashlib").sha256(repr(ids).encode()).hexdigest()[:12]}))
"""


def measure(code: Path, model: str, batch: int, n: int, tokens: int, threads: int,
            paged: bool, prompts: Path, method: str = "ar", store: str = "",
            skip: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    # (run from the checkout: `python -c` puts the working directory first on the path)
    if method == "ar" and not store:
        args = [CHILD, model, str(batch), str(n), str(tokens), str(threads),
                "1" if paged else "0", str(prompts.resolve())]
    else:
        args = [METHOD_CHILD, method, model, str(batch), str(n), str(tokens), str(threads),
                str(prompts.resolve()), store, skip]
    out = subprocess.run([sys.executable, "-c", *args],
                         env=env, capture_output=True, text=True, cwd=code.resolve())
    if out.returncode:
        raise SystemExit(f"{code}: the measurement failed:\n{out.stderr[-3000:]}")
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=".")
    store = Path(os.environ.get("SPECCTL_HOME") or Path.home() / ".cache/specctl")
    ap.add_argument("--model", default=str(store / "models/smollm2-135m-instruct"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paged", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--methods", default="ar", help="comma-separated (see the docstring)")
    ap.add_argument("--store", default="", help="store with the methods' artifacts")
    ap.add_argument("--prompts", default=None, help="JSONL prompts (default: sharegpt32)")
    ap.add_argument("--skip-set", default="")
    ap.add_argument("--n", type=int, default=None,
                    help="prompts per measurement (default: 2 at batch 1, 8 at batch 8)")
    ap.add_argument("--batches", default="1,8")
    a = ap.parse_args()
    prompts = Path(a.prompts) if a.prompts else \
        Path(__file__).resolve().parents[2] / "recipes" / "gpu" / "sharegpt32.jsonl"
    runs = [(code, b, a.n or (2 if b == 1 else b), False)
            for b in map(int, a.batches.split(",")) for code in ("old", "new")]
    runs += [("new-paged", 8, a.n or 8, True)] if a.paged else []
    rows = []
    for rep in range(a.repeats):
        for m in a.methods.split(","):
            for name, b, n, paged in (runs if rep % 2 == 0 else runs[::-1]):   # (order effects)
                code = Path(a.old if name == "old" else a.new)
                r = measure(code, a.model, b, n, a.tokens, a.threads, paged, prompts, m,
                            a.store, a.skip_set)
                rows.append({"repeat": rep + 1, "method": m, "code": name, "batch": b, **r})
                print(json.dumps(rows[-1]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
