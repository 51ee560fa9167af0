"""The runbook's knobs, read once from the environment, and the environment every command it
starts gets: the steps' commands see PY, OUT, SPECCTL_HOME, PYTHONPATH and the rest under the
names the bash runbook exported, and a step's own process reads its Settings back from them."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

ROOT = Path(__file__).resolve().parents[3]
RUNBOOK = ROOT / "recipes" / "gpu" / "runbook.py"
DEVICE_OUT = "/tmp/gpu-out"   # OUT in the printed calls
MIB = 1024 * 1024
KILL_AFTER_S = 10   # a step past its budget gets SIGTERM, then SIGKILL this much later
# the bench's methods: ar and every method `auto` (what the GPU owes); at batch, Self-Draft's
# per-sequence steps beside its default's, on the grid from 32 (runtime/jobs/config.py
# GRID_FROM)
METHODS = ("ar,self-draft:no-grid:auto,self-draft:auto,self-draft:light:auto,draft-verify:auto,"
           "kangaroo:auto")


def b1_methods(methods: str) -> str:
    """Batch 1's: the strongest HF peer too (it runs at batch 1 only), and not the
    per-sequence row, which there is the default's own."""
    rest = [m for m in methods.split(",") if m not in ("ar", "self-draft:no-grid:auto")]
    return ",".join(["ar", "hf-static"] + rest)


METHODS_B1 = b1_methods(METHODS)


def die(msg: str):
    raise SystemExit(f"runbook: {msg}")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def device_command(part: int) -> str:
    """What device call PART runs, from the repo root, with the device's own python3 (the
    orchestration needs nothing else)."""
    return (f"PACK=$OUT/gpu-part{part}.tgz python3 recipes/gpu/runbook.py run {DEVICE_OUT} "
            f"{part}")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name) or ""
    try:
        return int(raw) if raw else default
    except ValueError:
        die(f"{name}={raw!r}: a whole number, please")


def _path(env: Mapping[str, str], name: str) -> Optional[Path]:
    raw = env.get(name) or ""
    return Path(os.path.abspath(raw)) if raw else None


@dataclass(frozen=True)
class Settings:
    py: str = "python3"                          # what runs the steps' Python (PYTHON, PY)
    stage_tmp: Path = Path("/tmp/specctl-gpu")   # model part 1, wheels, art, the run's store
    carry_dir: Path = ROOT                       # where .gpu1/.gpu2 are (tests: elsewhere)
    rehearse: bool = False                       # tiny settings for every step (CPU)
    rehearse_step_s: int = 240
    min_step_s: int = 20                         # no step starts with less left of the call
    call_s: Optional[int] = None                 # caps both calls instead of plan.CAPS_S
    carry_limit_mib: int = 64
    margin_mib: int = 2
    methods: str = METHODS
    methods_b1: str = METHODS_B1
    pythonpath0: str = ""                        # the caller's PYTHONPATH, kept for the steps
    columns: str = "160"
    out: Optional[Path] = None                   # a run's OUT
    store: Optional[Path] = None                 # SPECCTL_HOME: a run's own, never the caller's
    run_store: Optional[Path] = None             # RUN_STORE: the store a run uses instead
    pack: Optional[Path] = None                  # PACK: OUT as a tarball after every step
    kill_after_s: int = KILL_AFTER_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Settings":
        methods = env.get("METHODS") or METHODS
        b1 = env.get("METHODS_B1") or b1_methods(methods)
        # (a step's process inherits PYTHONPATH as the run set it: the original rides along)
        pp0 = env["RUNBOOK_PYTHONPATH0"] if "RUNBOOK_PYTHONPATH0" in env else \
            env.get("PYTHONPATH", "")
        call_s = env.get("CALL_S") or ""
        return cls(py=env.get("PYTHON") or env.get("PY") or "python3",
                   stage_tmp=_path(env, "STAGE_TMP") or Path("/tmp/specctl-gpu"),
                   carry_dir=_path(env, "CARRY_DIR") or ROOT,
                   rehearse=_int(env, "REHEARSE", 0) != 0,
                   rehearse_step_s=_int(env, "REHEARSE_STEP_S", 240),
                   min_step_s=_int(env, "MIN_STEP_S", 20),
                   call_s=_int(env, "CALL_S", 0) if call_s else None,
                   carry_limit_mib=_int(env, "CARRY_LIMIT_MIB", 64),
                   margin_mib=_int(env, "MARGIN_MIB", 2),
                   methods=methods, methods_b1=b1, pythonpath0=pp0,
                   columns=env.get("COLUMNS") or "160",
                   out=_path(env, "OUT"), store=_path(env, "SPECCTL_HOME"),
                   run_store=_path(env, "RUN_STORE"), pack=_path(env, "PACK"))

    @property
    def art(self) -> Path:   # what call 2 unpacks from art.tgz
        return self.stage_tmp / "art"

    @property
    def pythonpath(self) -> str:   # the wheels installed on the device, then the checkout
        return f"{self.stage_tmp}/site:{ROOT}" + (f":{self.pythonpath0}" if self.pythonpath0
                                                  else "")

    def env(self) -> dict:
        """os.environ with the runbook's settings: what every command it starts gets."""
        e = dict(os.environ)
        e.update(PY=self.py, STAGE_TMP=str(self.stage_tmp), CARRY_DIR=str(self.carry_dir),
                 ART=str(self.art), REHEARSE="1" if self.rehearse else "0",
                 REHEARSE_STEP_S=str(self.rehearse_step_s), MIN_STEP_S=str(self.min_step_s),
                 CARRY_LIMIT_MIB=str(self.carry_limit_mib), MARGIN_MIB=str(self.margin_mib),
                 METHODS=self.methods, METHODS_B1=self.methods_b1,
                 RUNBOOK_PYTHONPATH0=self.pythonpath0, PYTHONPATH=self.pythonpath,
                 PYTHONUNBUFFERED="1", COLUMNS=self.columns)
        for name, value in (("CALL_S", self.call_s), ("OUT", self.out),
                            ("SPECCTL_HOME", self.store)):
            if value is not None:
                e[name] = str(value)
        return e
