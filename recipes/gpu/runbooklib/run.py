"""`run OUT PART`: one device call's steps, in the plan's order (of value). A call starts no step
once less than MIN_STEP_S is left of its cap, and each step runs under its budget or what is
left, whichever is less, so one hung step cannot eat the call; a failing or killed step never
stops the next. Each step's exit status and wall time go to OUT/steps.tsv (124: killed at its
budget, 137: it outlived the SIGTERM too; skip: not started), its output to OUT/<step>.log, and
OUT/README.md is rewritten after every step. With PACK=FILE the run packs OUT into FILE after
every step: a call returns at most 8 files, so OUT travels back as one tarball, and a call
killed at its limit still returns the steps done before."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable, Optional

from .plan import CAPS_S, part_steps
from .proc import KILLED, KILLED_HARD, run_limited
from .readme import write_readme
from .settings import ROOT, RUNBOOK, Settings, die, say

HEADER = "part\tstep\trc\twall_s\tbudget_s\tnote\n"
SKIPPED = 200   # a step's "not run, and why" (its log's last line)


def step_argv(name: str) -> list:
    """The process `run` watches for step NAME (steps.py, in this interpreter)."""
    return [sys.executable, str(RUNBOOK), "_step", name]


def run_part(s: Settings, out, part: str, plan: Optional[list] = None,
             argv: Callable[[str], list] = step_argv) -> int:
    """Call PART's steps (plan: (name, budget_s) pairs instead of the PLAN's; argv: the command
    of a step, for tests). 1 when a step failed or was killed, else 0."""
    if part not in ("1", "2"):
        die(f"PART is 1 or 2, not {part}")
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        s.stage_tmp.mkdir(parents=True, exist_ok=True)
    except OSError:
        die(f"cannot make {out}")
    s = dataclasses.replace(s, out=Path(os.path.abspath(out)),
                            store=s.run_store or s.stage_tmp / "store")
    if not (s.out / "steps.tsv").is_file():
        (s.out / "steps.tsv").write_text(HEADER)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _append(s.out / "commands.sh",
            f"# part {part}, {now}: SPECCTL_HOME={s.store} PYTHONPATH={s.pythonpath}\n")
    cap = s.call_s if s.call_s is not None else CAPS_S[int(part)]
    failed, t0 = False, time.monotonic()
    for name, budget in plan if plan is not None else part_steps(int(part)):
        if s.rehearse:
            budget = s.rehearse_step_s
        left = cap - int(time.monotonic() - t0)
        t = min(budget, left)
        if t < s.min_step_s:
            _row(s, part, name, "skip", 0, budget, f"not started: {left} s left of this call")
            print(f"== {name}: not started, {left} s left of the call's {cap}", flush=True)
            continue
        print(f"== {name} (budget {t} s)", flush=True)
        _append(s.out / "commands.sh", f"# step {name}\n")
        start = time.monotonic()
        rc, note = run_one(s, name, t, argv(name))
        wall = int(time.monotonic() - start)
        failed |= rc not in ("0", "skip")
        _row(s, part, name, rc, wall, t, note)
        print(f"   rc {rc}, {wall} s" + (f": {note}" if note else ""), flush=True)
        _after_step(s)
    _after_step(s)
    print("\n" + table(s.out / "steps.tsv"), flush=True)
    return 1 if failed else 0


def run_one(s: Settings, name: str, t: int, argv: list) -> tuple:
    """Step NAME under t seconds, its output into OUT/NAME.log: (rc for steps.tsv, note)."""
    log = s.out / f"{name}.log"
    with open(log, "wb") as f:
        rc = run_limited(argv, t, kill_after_s=s.kill_after_s, cwd=ROOT, env=s.env(),
                         stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    lines = log.read_text(errors="replace").splitlines()
    if rc == 0:
        return "0", ""
    if rc in (KILLED, KILLED_HARD):
        return str(rc), f"killed at its budget of {t} s"
    if rc == SKIPPED:
        return "skip", (lines[-1] if lines else "").replace("\t", " ")
    last = [x for x in lines if x.strip()][-1:] or [""]
    return str(rc), last[0].replace("\t", " ")[:160]


def _row(s: Settings, *cells) -> None:
    _append(s.out / "steps.tsv", "\t".join(map(str, cells)) + "\n")


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _after_step(s: Settings) -> None:
    """README.md and the pack, brought up to date; neither failing stops the run."""
    try:
        write_readme(s.out)
    except Exception as e:   # (a results folder half written: the next step may mend it)
        say(f"runbook: README.md not written: {e!r}")
    if s.pack is None:
        return
    # (packed aside, then copied: a call killed while packing most likely leaves the last
    # pack whole)
    tmp = s.stage_tmp / "pack.tgz"
    try:
        with tarfile.open(tmp, "w:gz") as t:
            t.add(s.out, arcname=".")
        aside = s.pack.with_name(s.pack.name + ".tmp")   # (then renamed: never a torn pack)
        shutil.copyfile(tmp, aside)
        os.replace(aside, s.pack)
    except (OSError, tarfile.TarError) as e:
        say(f"runbook: could not pack {s.out} into {s.pack}: {e}")


def table(path: Path) -> str:
    """A TSV file as aligned columns."""
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    widths = [max(len(r[i]) if i < len(r) else 0 for r in rows)
              for i in range(max(map(len, rows), default=0))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
