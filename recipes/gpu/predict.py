"""What the host-charged clock predicts for the runbook's bench-batch rows (issue 52: the next
GPU run is measured against a prediction made before it).

    python recipes/gpu/predict.py [--prompts 256] [--max-tokens 64] [--batch-sizes 8,32,64]
                                  [--host 3.0] > prediction.md

The tests' simulation (tests/sim.py) on this CPU: every forward priced by the committed H200
step table of the demo shape with the fused layer, every prefill forward by its prefill table,
and all the rest the run does (controller, drafting, verification, bookkeeping) by this
process's own CPU time times --host (the GPU machine's host against this one's, from the
committed runs). The tiny model computes the tokens; acceptance is what the tiny model's own
drafters get (draft-verify and Kangaroo next to nothing, as the GPU's batch rows measured on
the demo model) and, for "trace", real text's: the chains of Self-Draft traces recorded on the
demo model (tests/data/selfdraft-traces.json). Answers end where the traces' did, at most
--max-tokens. Each cell is `ar`'s time over the method's, requests waiting (--prompts of them):
the least of --rounds rounds over the least (as the tests take it), then in brackets the range
of each round's ratio to the `ar` run just before it. This host's load moves them: the stage at
8890873 predicted draft-verify 1.11x at batch 32, two runs after it 0.98x and 0.99x. Prompts
are as long as the bench's (tests/data/sharegpt-prompt-lengths.json), prefilled as CUDA's runs
prefill them: 4096 tokens a forward, or in pieces where the tables price them cheaper
(runtime/step/prefill.py). Run by `runbook.py stage`; call 2 puts it beside bench-batch.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

import sim  # noqa: E402
import test_host_clock as T  # noqa: E402
from conftest import make_tiny_model  # noqa: E402
from specctl.engine.loader import load_model  # noqa: E402


class Patch:   # (pytest's monkeypatch without undo: one process, one model)
    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", default="8,32,64")
    ap.add_argument("--host", type=float, default=sim.HOST)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sim.HOST = T.HOST = a.host
    T.MAX_TOKENS = a.max_tokens
    m = load_model(make_tiny_model(Path(tempfile.mkdtemp()), "llama"), "cpu", "fp32")
    names = ("trace", "draft-verify", "kangaroo", "self-draft")
    print(f"Predicted x ar (host-charged clock, host x{a.host:g}, H200 fused table; "
          f"{a.prompts} prompts as long as ShareGPT's, answers up to {a.max_tokens} tokens, "
          "requests waiting; prefill 4096 tokens a forward or in pieces):\n")
    print("| batch | " + " | ".join(names) + " | ar steps | guard trips (job's) |")
    print("|---|" + "---|" * (len(names) + 2))
    for b in (int(x) for x in a.batch_sizes.split(",")):
        paired: dict = {}
        r, st, ar = T.host_charged_ratios(m, b, a.prompts, Patch(), rounds=a.rounds,
                                          real_lengths=True, pieces=True, prefill_chunk=4096,
                                          paired=paired)
        print(f"| {b} | " + " | ".join(f"{r[k]:.2f}x ({min(paired[k]):.2f}-{max(paired[k]):.2f})"
                                      for k in names if k in r)
              + f" | {ar.steps} | "
              + ", ".join(f"{k} {s.guard_trips} ({s.guard_job_trips})" for k, s in st.items())
              + " |", flush=True)


if __name__ == "__main__":
    main()
