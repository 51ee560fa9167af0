"""The `specctl` command line (typer + rich). Commands parse options, build a config, call one
function below the CLI, and print; user mistakes (SpecctlError) become one red line and a
non-zero exit code, never a traceback."""

from __future__ import annotations

# the commands register themselves on `app`, in this order in --help
from specctl.cli import generate_cmd  # noqa: F401,I001
from specctl.cli import bench_cmd  # noqa: F401
from specctl.cli import prep_cmd  # noqa: F401
from specctl.cli import store_cmd  # noqa: F401
from specctl.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()
