"""The local artifact store.

Layout under the root (`$SPECCTL_HOME`, default `~/.cache/specctl`, or `--store`):

    models/<name>/            converted checkpoints (config.json, model.safetensors, tokenizer)
    runs/<run-id>/            one `generate` run: manifest.json, config.json, records.jsonl
                              (records.rank<r>.jsonl per process of a multi-process run),
                              outputs.jsonl, metrics.json
    benches/<bench-id>/       one `bench` run: manifest.json, results.json, table.md (+ plots)
    <kind>/<id>/              other artifacts (skip sets, adapters, n-gram caches), keyed by what
                              they depend on

Every artifact directory has a `manifest.json` (kind, id, created, command line, inputs and their
hashes, versions). Writes are atomic: files go to a temp name and are renamed into place, and
whole directories are built under a temp name and renamed, so an interrupted command never leaves
a half artifact. Nothing here ever unpickles: metadata is JSON, tensors are safetensors.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specctl import __version__
from specctl.errors import SpecctlError
# (the one way specctl writes and reads its files: store/files.py; named here for callers)
from specctl.store.files import (UMASK, atomic_write_bytes, atomic_write_json,  # noqa: F401
                                 atomic_write_text, claim_lock, file_crc32, file_sha256,
                                 jsonl_lines, lock_holder, published, read_json,
                                 writable_file)

KINDS = ("models", "runs", "benches", "skipsets", "profiles", "adapters", "ngram-caches")
# the work folders --resume continues from (search-skip's probes, train-adapter's features and
# checkpoints): never a killed command's litter to remove
RESUMABLE = ("search-", "train-")


def default_root() -> Path:
    env = os.environ.get("SPECCTL_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specctl"


def new_id(prefix: str = "") -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{prefix}{stamp}-{os.urandom(3).hex()}"


def make_manifest(kind: str, ident: str, **fields: Any) -> dict:
    return {
        "kind": kind,
        "id": ident,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "specctl_version": __version__,
        **fields,
    }


@dataclass(frozen=True)
class Entry:
    kind: str
    id: str
    path: Path
    manifest: dict

    @property
    def size_bytes(self) -> int:
        return dir_bytes(self.path)


def dir_bytes(path: Path) -> int:
    """The bytes of the files in a folder, all the way down."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _where(given: bool) -> str:
    if given:
        return "--store"
    return "$SPECCTL_HOME" if os.environ.get("SPECCTL_HOME") else "the default store"


class ArtifactExists(SpecctlError):
    """An artifact Store.building(replace=False) would have replaced: another command made it
    while this one built (the caller says what to do: its own flags)."""


class Store:
    """A directory of artifacts; see the module docstring for the layout."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root).expanduser() if root else default_root()
        self.origin = _where(bool(root))   # what named the root (for messages)

    def check_writable(self) -> "Store":
        """The root exists (or is created) as a folder this process can write: checked before
        any work (a model download, a run) that would end in writing to it. SpecctlError
        naming the root and what set it ($SPECCTL_HOME or --store) otherwise."""
        def bad(why: str):
            raise SpecctlError(f"the store {self.root} ({self.origin}) {why}: point "
                               "$SPECCTL_HOME or --store at a folder you can write") from None
        if self.root.exists() and not self.root.is_dir():
            bad("is a file, not a folder (Not a directory)")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            bad(f"cannot be created ({e.strerror or e})")
        try:
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            bad(f"is not writable ({e.strerror or e})")
        return self

    def dir(self, kind: str) -> Path:
        if kind not in KINDS:
            raise ValueError(f"unknown artifact kind {kind!r}")
        return self.root / kind

    def path(self, kind: str, ident: str) -> Path:
        if not ident or "/" in ident or "\\" in ident or ident.startswith("."):
            raise SpecctlError(f"invalid artifact id {ident!r}")
        return self.dir(kind) / ident

    @contextmanager
    def building(self, kind: str, ident: str, manifest: dict,
                 replace: bool = True) -> Iterator[Path]:
        """Build a directory artifact under a temp name; rename it into place on success.

        An existing artifact with the same id is replaced only once the new one is complete;
        replace=False: never (one another command made while this one built is kept, and this
        build refused: a check before building cannot see it).
        """
        import fcntl
        final = self.path(kind, ident)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = published(Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{ident}.",
                                              suffix=".tmp")), 0o777)
        lock = None
        try:
            # (held while it builds: one a killed command left, its lock free, stale_builds
            # finds; where the filesystem has no locks the build goes on without)
            lock = open(writable_file(tmp.with_name(tmp.name + ".lock")), "a")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass
            yield tmp
            atomic_write_json(tmp / "manifest.json", manifest)
            if not replace:
                try:   # (rename(2) onto a directory that is not empty fails: atomic)
                    os.rename(tmp, final)
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    raise ArtifactExists(f"{kind}/{ident} was made by another command while "
                                         "this one ran") from None
            elif final.exists():
                old = final.with_name(f".{ident}.old-{os.urandom(3).hex()}")
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            if lock is not None:
                Path(lock.name).unlink(missing_ok=True)
                lock.close()

    def stale_builds(self, min_age_s: float = 60.0) -> list[Path]:
        """Artifacts half-built by a killed command (`.<id>.*.tmp` beside a kind's artifacts,
        their lock free, or none: one from before locks), never listed nor used, only taking
        space. One touched in the last `min_age_s` is left alone (a build that has not taken
        its lock yet)."""
        import fcntl
        out, now = [], time.time()
        for k in KINDS:
            for d in sorted((self.root / k).glob(".*.tmp")) if (self.root / k).is_dir() else []:
                if not d.is_dir() or now - d.stat().st_mtime < min_age_s:
                    continue
                try:   # (opened for writing, not created: an exclusive lock on NFS needs it)
                    fd = os.open(d.with_name(d.name + ".lock"), os.O_WRONLY | os.O_APPEND)
                except FileNotFoundError:   # (left before builds were locked)
                    out.append(d)
                    continue
                except OSError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:   # (held: a command builds it now)
                    continue
                finally:
                    os.close(fd)
                out.append(d)
        return out

    def kept_work(self) -> list[Path]:
        """search-skip's and train-adapter's work folders: kept for --resume (their probes,
        cached features and checkpoints), never removed by gc; `store ls` shows them."""
        d = self.root / "work"
        return sorted(p for p in d.glob("*-*") if p.is_dir()
                      and p.name.startswith(RESUMABLE)) if d.is_dir() else []

    def entries(self, kind: str | None = None) -> list[Entry]:
        out = []
        for k in ([kind] if kind else KINDS):
            d = self.root / k
            if not d.is_dir():
                continue
            for p in sorted(d.iterdir()):
                if p.name.startswith(".") or not p.is_dir():
                    continue
                mf = p / "manifest.json"
                try:
                    manifest = json.loads(mf.read_text(encoding="utf-8")) if mf.exists() else {}
                except (json.JSONDecodeError, UnicodeDecodeError):
                    manifest = {"error": "unreadable manifest"}
                if not isinstance(manifest, dict):   # (valid JSON, but not a manifest)
                    manifest = {"error": "unreadable manifest"}
                out.append(Entry(k, p.name, p, manifest))
        return out

    @staticmethod
    def _match(ident: str, entries: list[Entry]) -> Entry | None:
        """The entry with id `ident`, else the one whose id starts with it; None if none."""
        matches = [e for e in entries if e.id == ident] or \
            [e for e in entries if e.id.startswith(ident)]
        if len(matches) > 1:
            names = ", ".join(f"{e.kind}/{e.id}" for e in matches[:5])
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""   # (it dropped
            raise SpecctlError(f"{ident!r} is ambiguous: {names}{more}")      # them unsaid)
        return matches[0] if matches else None

    def find(self, ident: str) -> Entry:
        """Find an artifact by id (or unique id prefix) across kinds."""
        if not ident.strip():   # (every id starts with "": an unset $ID would name them all)
            raise SpecctlError("an empty id names no artifact")
        e = self._match(ident, self.entries())
        if e is None:
            raise SpecctlError(f"no artifact {ident!r} in the store at {self.root}")
        return e

    def locate(self, spec: str, kind: str) -> Path:
        """An option naming an artifact (--skip-set, --adapter): a file or folder, else the id
        (or unique id prefix) of a `kind` artifact in the store."""
        p = Path(spec).expanduser()
        if p.exists():
            return p
        e = self._match(spec, self.entries(kind))
        if e is not None:
            return e.path
        other = [e for e in self.entries() if e.id.startswith(spec)]
        if other:
            raise SpecctlError(f"{spec!r} is an artifact of {other[0].kind}, not of {kind}")
        raise SpecctlError(f"{spec}: no such file or folder, and no artifact with that id "
                           f"among the {kind} in the store at {self.root}")

    def best_for_model(self, kind: str, fingerprint: str, score: str,
                       keep=lambda manifest: True) -> Entry | None:
        """The artifact of `kind` made for the model `fingerprint` with the highest manifest
        `score` (e.g. a skip set's estimated speedup, an adapter's held-out agreement), among
        those whose manifest `keep` accepts."""
        cands = [e for e in self.entries(kind)
                 if e.manifest.get("model_fingerprint") == fingerprint and keep(e.manifest)]

        def value(e: Entry) -> float:   # (a score that is not a number counts as none)
            v = e.manifest.get(score)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0
        return max(cands, key=value) if cands else None

    @contextmanager
    def work_dir(self, prefix: str) -> Iterator[Path]:
        """A scratch folder under `work/` for one command, locked while it runs and removed
        after it. One left behind by a killed command (its lock is free) is removed by the next
        command that uses the same prefix, before it starts (see stale_work)."""
        import fcntl
        root = self.root / "work"
        root.mkdir(parents=True, exist_ok=True)
        for old in self.stale_work(prefix):
            if old.is_symlink():
                old.unlink(missing_ok=True)
            else:
                shutil.rmtree(old, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=root))
        lock = open(writable_file(work / ".lock"), "a")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield work
        finally:
            lock.close()
            shutil.rmtree(work, ignore_errors=True)

    def stale_work(self, prefix: str = "") -> list[Path]:
        """Scratch folders under `work/` (of commands with this prefix) that no running
        command holds: left by a killed one."""
        import fcntl
        out = []
        for d in sorted((self.root / "work").glob(f"{prefix}*-*")):
            # (RESUMABLE: a killed one's checkpoint is what --resume continues)
            if d.name.startswith(RESUMABLE):
                continue
            if d.is_symlink():   # (no command works through a link: nothing of the store's,
                out.append(d)    # and its lock would be made wherever it points; dangling or
                continue         # not, the link alone goes)
            if not d.is_dir():
                continue
            try:
                with open(writable_file(d / ".lock"), "a") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free: nobody runs there
            except (OSError, SpecctlError):   # (held; or no lock file can be there)
                continue
            out.append(d)
        return out

    def remove_abandoned_runs(self, dry_run: bool = False,
                              min_age_s: float = 60.0) -> list[Path]:
        """Remove (or with dry_run only list) the run folders with nothing in them to keep: no
        record written (every records file empty or missing), no outputs, and no process
        holding the run's lock; left by a run that stopped before its first answer. A folder
        touched in the last `min_age_s` is left alone (a run being opened right now has not
        taken its lock yet); one is removed while its lock is held, so no --resume can open
        it meanwhile."""
        import fcntl
        out, now = [], time.time()
        d = self.root / "runs"
        for run in sorted(d.iterdir()) if d.is_dir() else []:
            if run.name.startswith(".") or not run.is_dir():
                continue
            try:
                files = list(run.iterdir())
                if any(f.name == "outputs.jsonl" or (f.name.startswith("records")
                                                      and f.stat().st_size > 0) for f in files):
                    continue
                if max([run.stat().st_mtime] + [f.stat().st_mtime for f in files]) > now - min_age_s:
                    continue
                if dry_run and not (run / ".lock").exists():   # (creating one would touch it)
                    out.append(run)
                    continue
                with open(writable_file(run / ".lock"), "a") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free: nobody runs it
                    if not dry_run:
                        shutil.rmtree(run)
            except (OSError, SpecctlError):   # held (or unreadable, or no lock file): leave it
                continue
            out.append(run)
        return out

    def hold_work(self, path: Path, what: str):
        """An open, locked `path/.lock` (the folder made if need be), held for as long as the
        caller keeps it: search-skip's and train-adapter's folders, which `--resume` continues
        and `store rm work/NAME` removes only while no command runs there. A second command
        there is refused, naming the pid. A filesystem without locks: held in name only."""
        import fcntl
        path.mkdir(parents=True, exist_ok=True)
        f = open(writable_file(path / ".lock"), "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = lock_holder(f)
            f.close()
            raise SpecctlError(f"{what} is running in {path} already"
                               f"{f' (pid {pid})' if pid else ''}: let it finish, or "
                               "stop it") from None
        except OSError:
            pass
        claim_lock(f)
        return f

    def remove(self, ident: str) -> Entry:
        """Remove an artifact (remove_dir: refused while a job holds a run's lock)."""
        e = self.find(ident)
        remove_dir(e.path, f"{e.kind}/{e.id}")
        return e


def remove_dir(path: Path, what: str) -> None:
    """Remove folder `path`, unless a running command holds its `.lock` (refused, naming the
    pid it wrote). The lock is held while the folder goes, and the folder is first moved to a
    hidden `.<name>.rm.tmp` (what `store gc` clears if this is killed), so a `--resume` that
    found it meanwhile has no folder to reopen. A lock that cannot be opened (another user's
    file, read-only) or taken (a filesystem without locks) is no refusal: removed without. A
    folder linked into the store: the link is removed, never what it names."""
    import fcntl
    lock, f = path / ".lock", None
    try:
        f = open(lock, "r") if lock.is_file() else None   # (a read-only descriptor locks too)
    except OSError:
        pass
    try:
        if f is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = lock_holder(f)
                raise SpecctlError(f"{what} is in use by a running specctl process"
                                   f"{f' (pid {pid})' if pid else ''}: let it finish "
                                   "(or stop it) first") from None
            except OSError:
                pass
        if path.is_symlink():   # (a folder linked into the store: the link goes, never what
            path.unlink()       # it names; rmtree refused it after the rename, half done)
            return
        gone = path.with_name(f".{path.name}.rm.tmp")
        os.replace(path, gone)
        shutil.rmtree(gone)
    finally:
        if f is not None:
            f.close()

