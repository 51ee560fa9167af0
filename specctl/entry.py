"""The `specctl` command (and `python -m specctl`): the command line's imports under Ctrl-C's
handling too. They take a second or more (torch), and an interrupt in them printed Python's
traceback where an interrupt in a command prints one line (cli/common.py, friendly)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from specctl.cli import main as cli
    except KeyboardInterrupt:   # (nothing ran yet: nothing to keep or resume)
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    cli()
