"""What every command shares: the typer apps, the consoles, option definitions, the
error wrapper (`friendly`) and the Reporter that draws progress with rich."""

from __future__ import annotations

import functools
import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from specctl.errors import SpecctlError
from specctl.reporting import Reporter, Task

def _plain_switches() -> None:
    """typer (0.2x) shows every flag as `--quiet <bool>` in help, as if it took a value; a
    switch takes none, so its type column stays empty (display only)."""
    from typer.core import TyperOption
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)
    TyperOption.display_type_rich = display_type_rich


_plain_switches()

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Self-speculative decoding for Llama-family LLMs: batched, lossless.",
                  epilog="Examples:\n\n"
                  "  specctl generate prompts.jsonl --out answers.jsonl   (demo model, ar)\n\n"
                  "  specctl build-cache demo && specctl generate prompts.jsonl --method "
                  "self-draft\n\n"
                  "  specctl bench prompts.jsonl --methods ar,self-draft --batch-sizes 1,8\n\n"
                  "  specctl store ls")
models_app = typer.Typer(no_args_is_help=True, help="Get the demo model into the store.",
                         epilog="Examples:\n\n  specctl models pull\n\n"
                         "  specctl models pull --from ./SmolLM2-135M-Instruct.Q4_1.gguf")
store_app = typer.Typer(no_args_is_help=True, help="List, show and remove stored artifacts.",
                        epilog="Examples:\n\n  specctl store ls --kind runs\n\n"
                        "  specctl store show ar-20261122\n\n  specctl store rm OLD-ID --yes")
app.add_typer(models_app, name="models")
app.add_typer(store_app, name="store")


def _version(show: bool) -> None:
    if show:
        from specctl import __version__
        typer.echo(f"specctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Self-speculative decoding for Llama-family LLMs: batched, lossless."""

console = Console(stderr=True)


def _stdout() -> Console:
    """Tables and JSON on stdout: as wide as the terminal, or unbounded when piped (a table
    cut to 80 columns folds every cell in a log)."""
    return Console() if sys.stdout.isatty() else Console(width=1000)


def _log(msg: str) -> None:
    """Progress messages from below the CLI: plain text (paths may contain [brackets])."""
    console.print(msg, highlight=False, markup=False)


def _warn(msg: str) -> None:
    console.print(f"[yellow]warning[/]: {escape(msg)}", highlight=False, soft_wrap=True)


StoreOpt = typer.Option(None, "--store", help="Store root (default $SPECCTL_HOME or ~/.cache/specctl).")


def friendly(fn):
    """Turn SpecctlError (and Ctrl-C) into a one-line message and an exit code."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except SpecctlError as e:   # escape: paths and messages may contain [brackets]
            console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code)
        except OSError as e:   # the environment: a path that is a file, no space, no permission
            where = e.filename2 or e.filename
            msg = f"{where}: {e.strerror}" if where and e.strerror else str(e)
            console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        except KeyboardInterrupt as e:
            how = "terminated" if isinstance(e, Terminated) else "interrupted"
            console.print(f"[yellow]{how}[/]: generate, search-skip and train-adapter "
                          "keep what they finished (run the same command with --resume; "
                          "generate writes --out only once its run ends, so a file there "
                          "now is an earlier run's); other commands start over")
            raise typer.Exit(143 if isinstance(e, Terminated) else 130)
    return wrapper


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (cli.main), to stop as Ctrl-C does."""


class _Counts(ProgressColumn):
    """'done/total' for tasks that count items (not bytes)."""

    def render(self, task) -> Text:
        if not task.fields.get("counts", True):
            return Text("")
        total = "?" if task.total is None else f"{task.total:g}"
        return Text(f"{task.completed:g}/{total}")


class _RichTask(Task):
    def __init__(self, owner: "RichReporter", task_id):
        self.owner, self.id, self.closed = owner, task_id, False

    def update(self, *, advance: int = 0, completed: int | None = None,
               total: int | None = None, info: str | None = None) -> None:
        kw: dict = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if info is not None:
            kw["info"] = escape(info)
        if advance:
            kw["advance"] = advance
        self.owner.p.update(self.id, **kw)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner._closed()


class RichReporter(Reporter):
    """The CLI's Reporter: messages on stderr, tasks as rich progress bars (none when
    `bars` is False). A display lives while any of its tasks is open."""

    def __init__(self, bars: bool = True, talk: bool = True):
        super().__init__(_log if talk else None)
        self.bars, self.p, self.open = bars, None, 0

    def section(self, title: str) -> None:
        console.rule(f"[bold]{escape(title)}")

    def task(self, label: str, total: int | None = None, completed: int = 0, info: str = "",
             counts: bool = True) -> Task:
        if not self.bars:
            return Task()
        if self.p is None:
            self.p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), _Counts(),
                              TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                              TimeRemainingColumn(), console=console)
            self.p.start()
        self.open += 1
        return _RichTask(self, self.p.add_task(escape(label), total=total, completed=completed,
                                               info=escape(info), counts=counts))

    def _closed(self) -> None:
        self.open -= 1
        if self.open == 0:
            self.stop()

    def stop(self) -> None:
        if self.p is not None:
            self.p.stop()
            self.p = None
            self.open = 0


def _with_bars(fn, *args, bars: bool = True, **kw):
    """fn(*args, report, **kw) with the CLI's reporter, its bars stopped however fn ends."""
    rep = RichReporter(bars=bars)
    try:
        return fn(*args, rep, **kw)
    finally:
        rep.stop()
