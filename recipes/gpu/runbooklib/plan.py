"""The GPU runbook's plan: each call's steps in order of value, their budgets and estimates,
the calls' caps, and what no call runs.

Why the caps: a session is lent 15 minutes of device time in all (../shared/GPU.md), the
machine's start (1.5-2 min) and its idle time (it stays warm ~30 s after a call) included, on a
bare machine each start. Two calls of at most 2 and 9 minutes, 11 in all, leave the start and
two idle spells room inside the 15.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CAPS_S = {1: 120, 2: 540}   # call 1 <= 2 min, call 2 <= 9 min
TOTAL_CAP_S = 660           # the two calls together <= 11 min
START_S, IDLE_S = 120, 30   # a machine's start, its warm wait after each call (for the total)


@dataclass(frozen=True)
class Step:
    part: int
    name: str
    budget_s: int     # its timeout (or what is left of the call's cap, if less)
    estimate_s: int   # what it should take on one H100
    file: str         # what it leaves in OUT
    basis: str        # where the estimate comes from (walls measured on 2026-11-26, H100)


# In order of value within each call (../shared/GPU.md, "What the GPU owes"); a call starts no
# step once less than MIN_STEP_S of its cap is left, so what runs out of time is the least owed.
PLAN = (
    Step(1, "stage1", 30, 10, "env.json", "9 s"),
    Step(1, "step-table-7b", 30, 15, "step-table-7b.json", "10 s at 65c1f6b"),
    Step(1, "gpu-tests", 85, 60, "gpu-tests.log",
         "83 s at 8890873 (76 s of tests), less the unfused layer's --exact test (21 s)"),
    Step(1, "prefill-cost", 30, 20, "prefill-cost.json",
         "not timed yet: the demo shape's random weights, 15 eager forwards x 12 runs, then "
         "3 x (an eager forward and a piece's replay) x 12 after 15 captures"),
    Step(2, "stage2", 60, 35, "model.json", "30 s at 8890873"),
    # (a bench killed at its budget stores nothing: the most owed step has the most slack)
    Step(2, "bench-batch", 300, 145, "bench-batch.md",
         "137 s at 8890873 (256 prompts, 6 methods at batch 8/32/64, 1 repeat)"),
    Step(2, "prefill-chunk", 60, 50, "prefill-chunk.md", "47 s at 8890873"),
    Step(2, "bench-b1", 130, 110, "bench-b1.md",
         "killed at its 100 s budget at 8890873 (1 repeat), 120 s at 7f4cca3 with 2"),
    Step(2, "fused-probe", 60, 15, "fused-probe.md", "15 s at 8890873"),
    Step(2, "exact", 90, 38, "exact.md", "37 s at 8890873"),
    Step(2, "repeat", 45, 38, "repeat.md", "37 s at 8890873"),
    Step(2, "grid-kernel", 40, 13, "grid-kernel.log", "13 s at 8890873"),
    Step(2, "host-profile", 130, 95, "host-profile.md", "91 s at 8890873"),
)

# What the GPU owes that no call runs, and why (printed by `plan`)
LEFT_OUT = (
    "train-adapter on the GPU: ~4-7 min at --limit 1000 --max-len 1024 (2026-11-26), more than "
    "call 2 can spare; Kangaroo's rows use the adapter `stage` carries (ADAPTER=DIR, else one it "
    "trains on the CPU in 1-3 min; ADAPTER=none: no Kangaroo rows)",
    "kv_scale.py --shape 7b: ~4.5 min, over call 1's 2",
    "the flex tests of `pytest -m gpu` (-k flex, ~35 s): flex is not the default attention",
    "test_gpu.py's --exact on the unfused layer (-k 'exact_in_bf16 and sdpa', ~21 s): call 1's "
    "2 minutes go to prefill-cost; call 2's exact step runs --exact on the fused layer",
    "self-draft:fixed rows: the runs owed are `auto`'s",
    "fused_probe.py --inductor (torch.compile's layer loop, the library alternative to the fused "
    "kernels): inductor compiles the 30-layer loop once per shape, minutes for four",
)


def plan_text(staged: Optional[Path] = None) -> tuple[str, bool]:
    """The plan as a tab-separated table, then each call's sum against its cap (ok False when a
    sum is over its cap), and what the staged carry (its stage.json) gives Kangaroo."""
    rows = ["part\tstep\tbudget_s\testimate_s\testimate_min\tfile\tbasis"]
    rows += [f"{s.part}\t{s.name}\t{s.budget_s}\t{s.estimate_s}\t{s.estimate_s / 60:.1f}\t"
             f"{s.file}\t{s.basis}" for s in PLAN]
    ok, total, lines = True, 0, [""]
    for part, cap in CAPS_S.items():
        est = sum(s.estimate_s for s in PLAN if s.part == part)
        total += est
        over = est > cap
        ok &= not over
        lines.append(f"call {part}: {est} s = {est / 60:.1f} min of its {cap / 60:.0f} min cap"
                     + (" OVER" if over else ""))
    over = total > TOTAL_CAP_S
    ok &= not over
    lines.append(f"calls: {total} s = {total / 60:.1f} min of the {TOTAL_CAP_S / 60:.0f} min cap"
                 + (" OVER" if over else ""))
    session = START_S + total + IDLE_S * len(CAPS_S)
    lines.append(f"session: ~{session / 60:.1f} min of the 15 lent (the machine's start "
                 f"~{START_S / 60:.0f} min, {IDLE_S} s warm after each call)")
    lines += ["", "not in the calls:"] + [f"- {x}" for x in LEFT_OUT]
    if staged is not None and staged.is_file():
        ad = json.loads(staged.read_text()).get("adapter")
        lines += ["", f"staged ({staged}): " + (
            f"Kangaroo's adapter {ad.get('dir')} ({ad.get('how')})" if isinstance(ad, dict)
            else f"Kangaroo's adapter {ad}" if ad else
            "no adapter, so no Kangaroo rows: stage again with ADAPTER=DIR")]
    return "\n".join(rows + lines), ok


def part_steps(part: int) -> list:
    """(name, budget_s) of each step of call PART, in the order they run."""
    return [(s.name, s.budget_s) for s in PLAN if s.part == part]
