"""The `specctl` command line (typer + rich). Commands parse options, build a config, call one
function below the CLI, and print; user mistakes (SpecctlError) become one red line and a
non-zero exit code, never a traceback."""

from __future__ import annotations

# the commands register themselves on `app`, in this order in --help
from specctl.cli import generate_cmd  # noqa: F401,I001
from specctl.cli import bench_cmd  # noqa: F401
from specctl.cli import prep_cmd  # noqa: F401
from specctl.cli import store_cmd  # noqa: F401
import os
import signal

from specctl.cli.common import Terminated, app

__all__ = ["app", "main"]


def main() -> None:
    # SIGTERM (`timeout`, `docker stop`, Slurm, a scheduler) as Ctrl-C: the same cleanup (a
    # run with no answer removed, its locks released) and the same word; exit status 143.
    # Not in a process of several (torchrun's RANK): the launcher stops its workers, and one
    # waiting in a collective would run a Python handler only once the wait returns
    if "WORLD_SIZE" not in os.environ:
        signal.signal(signal.SIGTERM, _terminated)
    app()


def _terminated(signum, frame):
    raise Terminated()
