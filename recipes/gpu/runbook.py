"""The GPU runbook: everything a lent GPU owes (../shared/GPU.md, "What the GPU owes") in two
device calls of under 10 minutes each, and the same steps rehearsed on the CPU
(tests/test_gpu_runbook.py: stage, check and collect in the default tier, the rehearsal in the
slow one). From the repo root, with python3 (the device's bare one will do: the runbook needs
only the standard library; what it runs gets PY, PYTHON or python3):

  python3 recipes/gpu/runbook.py stage           CPU machine: packs .gpu1/ and .gpu2/, prints
                                                 the two device calls
  python3 recipes/gpu/runbook.py run OUT PART    on the device (what the calls run), PART 1 or 2
  python3 recipes/gpu/runbook.py collect P1.tgz P2.tgz
                                                 CPU: the calls' files into
                                                 bench-results/<date>-gpu-<commit>/
  python3 recipes/gpu/runbook.py rehearse OUT    CPU: stage + both parts with a tiny model
  python3 recipes/gpu/runbook.py check [DIR...]  each carry plus the working tree under 64 MiB
  python3 recipes/gpu/runbook.py plan            the steps: part, budget s, estimate min, file

The steps, their budgets and estimates are runbooklib/plan.py's PLAN (`plan` prints them with
each call's sum and fails when one is over its cap). The device lends a session 15 minutes in
all, the machine's start (1.5-2 min) and its warm waits (~30 s after a call) included, on a
bare machine each start, so the calls are capped at 2 and 9 minutes:
  call 1, carry .gpu1 (model part 1): stage1 | step-table-7b (the Llama-2-7B shape, random
    bf16 weights made on the device: a step's cost does not depend on the weights' values) |
    gpu-tests (`pytest -m gpu`, its flex tests left out) | prefill-cost (an eager prefill
    forward's ms by its tokens: the fixed cost admission groups save)
  call 2, carry .gpu2 (model part 2, wheels, art.tgz): stage2 | bench-batch (>= 256 prompts) |
    bench-b1 | fused-probe (the fused layer against the unfused) | exact (sized to fit) |
    repeat | host-profile
Not in the calls (they do not fit; `plan` says so): train-adapter on the GPU, kv_scale.py at
7B. Kangaroo's rows use the adapter `stage` carries.

How each part works: runbooklib/stage.py (why two parts, stage's inputs: CORPUS, ADAPTER,
ADAPTER_TRAIN, ADAPTER_TRAIN_S, ADAPTER_STORE, PROMPTS, TRAIN_RECORDS, PREDICT, MODEL_FILE,
WHEELS_DIR, SHAREGPT, SKIP_SET, SPLIT_AT, STAGE_DEVICE), runbooklib/run.py (the budgets, MIN_STEP_S,
CALL_S, PACK, RUN_STORE), runbooklib/collect.py (COLLECT_DEST, ADAPTER_DEST),
runbooklib/rehearse.py (CALL_S_REHEARSE, REHEARSE_OUT, REHEARSE_STEP_S). Everywhere:
CARRY_DIR (where .gpu1/.gpu2 are: the repo root, elsewhere only for tests), STAGE_TMP
(/tmp/specctl-gpu: the run's model part 1, wheels, art, store), CARRY_LIMIT_MIB, MARGIN_MIB,
METHODS, METHODS_B1, PYTHON/PY, COLUMNS, TMPDIR.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runbooklib import inputs  # noqa: E402
from runbooklib.carry import check_carries  # noqa: E402
from runbooklib.collect import collect  # noqa: E402
from runbooklib.plan import plan_text  # noqa: E402
from runbooklib.rehearse import rehearse  # noqa: E402
from runbooklib.run import run_part  # noqa: E402
from runbooklib.settings import Settings, die  # noqa: E402
from runbooklib.stage import stage  # noqa: E402
from runbooklib.steps import run_step  # noqa: E402


def main(argv: list) -> int:
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd in inputs.HELPERS:   # (under $PY, from the runbook itself)
        return inputs.main(cmd, args)
    s = Settings.from_env()
    if cmd == "stage":
        stage(s)
        return 0
    if cmd == "run":
        if len(args) < 2:
            die("usage: runbook.py run OUT PART")
        return run_part(s, args[0], args[1])
    if cmd == "_step":   # one step, in the process `run` watches
        return run_step(args[0])
    if cmd == "collect":
        collect(args)
        return 0
    if cmd in ("rehearse", "--rehearse"):
        return rehearse(s, args[0] if args else
                        os.environ.get("REHEARSE_OUT") or "/tmp/gpu-rehearsal")
    if cmd == "check":
        return 0 if check_carries(s, args or [s.carry_dir / ".gpu1", s.carry_dir / ".gpu2"]) else 1
    if cmd == "plan":
        text, ok = plan_text(s.carry_dir / ".gpu2" / "stage.json")
        print(text)
        return 0 if ok else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    # (line by line: a device call killed at its limit still returns what was printed)
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
