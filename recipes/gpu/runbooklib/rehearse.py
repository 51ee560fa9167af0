"""`rehearse OUT`, on the CPU: a change to the runbook checked without a GPU. stage from local
files (a tiny random model in the demo model's place, a ShareGPT file made of the committed
prompts, no wheels; the tiny model's adapter trained on the CPU as the demo model's would be),
both parts with tiny settings, then collect; fails if any step failed."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from .collect import collect
from .run import run_part
from .settings import ROOT, Settings, die
from .stage import py_tool, stage

TINY_ADAPTER_TRAIN = "--limit 8 --max-len 160 --epochs 1 --lr 2e-3 --exit-layer 1"


def rehearse(s: Settings, out) -> int:
    out = Path(os.path.abspath(out))
    out.mkdir(parents=True, exist_ok=True)
    s = dataclasses.replace(s, rehearse=True, carry_dir=out / "carry", stage_tmp=out / "tmp",
                            call_s=int(os.environ.get("CALL_S_REHEARSE") or 100000))
    (out / "src").mkdir(exist_ok=True)
    s.carry_dir.mkdir(exist_ok=True)
    t0 = time.monotonic()
    if py_tool(s, "rehearsal-inputs", ROOT, out / "src"):
        die("could not make the tiny model")
    src = out / "src"
    env = {k: v for k, v in os.environ.items() if k != "ADAPTER"}   # (trained, as the demo's)
    env.update(MODEL_FILE=str(src / "tiny-model.tar"), WHEELS_DIR="none",
               SHAREGPT=str(src / "sharegpt.json"), SKIP_SET=str(src / "skip.json"),
               SPLIT_AT="half", PROMPTS="16", ADAPTER_STORE=str(out / "adapter-store"),
               ADAPTER_TRAIN=TINY_ADAPTER_TRAIN)
    stage(s, env)
    rc = 0
    for part in ("1", "2"):
        ps = dataclasses.replace(s, pack=out / f"gpu-part{part}.tgz")
        rc |= run_part(ps, out / "results", part)
    collect([out / "gpu-part1.tgz", out / "gpu-part2.tgz"],
            {**os.environ, "COLLECT_DEST": str(out / "collected")})
    print(f"rehearsal: {int(time.monotonic() - t0)} s, "
          f"{'every step passed' if rc == 0 else 'FAILED'}", flush=True)
    return rc
