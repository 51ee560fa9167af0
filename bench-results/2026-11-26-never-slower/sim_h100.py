"""Every method under --speculate auto against ar on a simulated H100 clock: each decoding
forward priced by the committed H100 step table (bench-results/2026-11-23-engine-step/
steps-demo.json: demo model, bf16, CUDA graphs), padded as captured graphs pad it, the tiny test
model's tokens real (outputs checked against ar's). tests/sim.py is the clock; the drafters are
the tests' (tests/helpers.py method_drafters) plus oracle chains whose acceptance differs by
sequence (0 to 0.95). Prefill is not timed (the same prompts for every method).

    python bench-results/2026-11-26-never-slower/sim_h100.py > sim-h100.md

Rows: (prompts, batch, new tokens): 128 prompts at batch 8 and 32 (requests wait, then the
batch drains), and 32 prompts at batch 32 (a job that only drains: the issue's 32 x 127).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import run_ids  # noqa: E402
from sim import against_ar, h100_table  # noqa: E402
from test_never_slower import _prompts, _sim_methods  # noqa: E402
from tiny import make_tiny_model  # noqa: E402

from specctl.engine.loader import load_model  # noqa: E402


class Patch:
    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def main() -> None:
    model = load_model(make_tiny_model(Path(tempfile.mkdtemp()), "llama"), "cpu", "fp32")
    table = h100_table()
    rows = [(8, 1, 128), (128, 8, 64), (128, 32, 64), (32, 32, 128)]
    print("| prompts x tokens | batch | method | x ar | steps (ar) | lean steps | guard trips "
          "| held | vs-ar estimate / real |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, b, tokens in rows:
        prompts = _prompts(n, seed=n + b)
        ref, _ = run_ids(model, prompts, batch_size=b, max_tokens=tokens, max_len=320)
        ar_s, ar, runs = against_ar(model, prompts, _sim_methods(model, prompts, ref), table,
                                    Patch(), batch_size=b, max_tokens=tokens, ref=ref)
        for name, (x, st) in runs.items():
            print(f"| {n} x {tokens} | {b} | {name} | {x:.3f} | {st.steps} "
                  f"({ar.steps}) | {st.lean_steps} | {st.guard_trips} | {st.guard_held} | "
                  f"{st.ar_step_ms / 1e3 / ar_s:.3f} |", flush=True)
        del model.run, model.forward   # (the clock's wrappers: the next row brings its own)

if __name__ == "__main__":
    main()
