"""How a long-running call tells its caller what it is doing: one protocol for generate, bench
and every prep command, passed down from the CLI (which draws it with rich) or from a program.

    report.log("loading ...")                       a message line
    report.section("[1/3] build-cache")             a heading between the steps of a larger job
    t = report.task("tokenize", total=n)            a unit of work with a bar
    t.update(advance=k, info="1,234 tok/s")         ... progress (or completed=, total=)
    t.close()                                       ... done

`Reporter()` is silent; `Reporter(print)` prints its messages. Nothing below the CLI prints.
"""

from __future__ import annotations

import time

from typing import Callable


def quiet(msg: str) -> None:
    """A message callback that drops the message."""


class Task:
    """One unit of work of a Reporter; this base draws nothing."""

    def update(self, *, advance: int = 0, completed: int | None = None,
               total: int | None = None, info: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class Reporter:
    """Messages and tasks; the base class only passes messages to `log` (default: none)."""

    def __init__(self, log: Callable[[str], None] | None = None):
        self._log = log or quiet

    def log(self, msg: str) -> None:
        self._log(msg)

    def section(self, title: str) -> None:
        self.log(title)

    def task(self, label: str, total: int | None = None, completed: int = 0, info: str = "",
             counts: bool = True) -> Task:
        """A new task; counts: show 'completed/total' (not for bytes, say)."""
        return Task()


QUIET = Reporter()


def reporter(report: Reporter | None = None, log: Callable[[str], None] | None = None) -> Reporter:
    """`report`, else a Reporter passing messages to `log`, else a silent one."""
    if report is not None:
        return report
    return Reporter(log) if log is not None else QUIET


class TokenProgress:
    """Prompts done and tokens/s on a Reporter task (a job's progress bar)."""

    def __init__(self, task: Task):
        self.task, self.tokens_done, self.t0 = task, 0, time.perf_counter()

    def advance(self, n: int) -> None:
        self.task.update(advance=n)

    def tokens(self, n: int) -> None:
        self.tokens_done += n
        elapsed = time.perf_counter() - self.t0
        if elapsed > 0:
            self.task.update(info=f"{self.tokens_done / elapsed:.1f} tok/s")
