"""What a device call carries, and the file handling around it. A call carries its carry
folders plus the working tree (tracked files, untracked files git does not ignore, and shared/
where the checkout has one), 64 MiB in all: more, and the device tool refuses the call."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Optional

from .settings import MIB, ROOT, Settings, die, say


def tree_bytes(root: Path = ROOT) -> Optional[int]:
    """The working tree that travels with every call, in bytes (None: git could not list it)."""
    try:
        p = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=root, capture_output=True)
    except OSError:
        return None
    if p.returncode:
        return None
    paths = [root / os.fsdecode(x) for x in p.stdout.split(b"\0") if x]
    shared = root / "shared"
    if shared.is_dir() and subprocess.run(["git", "check-ignore", "-q", "shared"],
                                          cwd=root).returncode == 0:
        paths += [Path(d) / f for d, _, files in os.walk(shared) for f in files]
    return _sizes(paths, expand_dirs=True)


def du_bytes(path) -> int:
    """Bytes as `du -sb` counts them: apparent sizes, the folders' own included, a hard-linked
    file once, symbolic links not followed."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return _sizes([path])
    paths = [path]
    for d, dirs, files in os.walk(path):
        paths += [Path(d) / n for n in dirs + files]
    return _sizes(paths)


def _sizes(paths, expand_dirs: bool = False) -> int:
    total, seen = 0, set()
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:   # (a tracked file deleted in the tree: nothing travels)
            continue
        if expand_dirs and stat.S_ISDIR(st.st_mode):   # (a submodule: its files travel)
            total += du_bytes(p)
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def check_carries(s: Settings, dirs) -> bool:
    """Each carry folder plus the tree within the limit; says by how much when not."""
    tree = tree_bytes()
    if tree is None:
        die("could not size the working tree (git ls-files)")
    limit, ok = s.carry_limit_mib * MIB, True
    for d in dirs:
        if not Path(d).is_dir():
            say(f"runbook: {d}: no such carry folder")
            ok = False
            continue
        n = du_bytes(d) + tree
        if n > limit:
            say(f"runbook: OVER THE LIMIT: {d} with the working tree is {n} bytes, {n - limit} "
                f"over the {s.carry_limit_mib} MiB a call carries (tree {tree} bytes)")
            ok = False
        else:
            print(f"{d}: {n} bytes with the working tree ({tree}), {(limit - n) // 1024} KiB "
                  "to spare", flush=True)
    return ok


def ignore_in_git(*names: str, root: Path = ROOT) -> None:
    """Top-level folders of the checkout into git's exclude list (a worktree's too): what is
    ignored does not travel with every call as an untracked file."""
    try:
        p = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=root,
                           capture_output=True, text=True)
        if p.returncode:
            return
        exclude = root / p.stdout.strip()
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = exclude.read_text() if exclude.is_file() else ""
        with open(exclude, "a") as f:
            if text and not text.endswith("\n"):
                f.write("\n")
            for d in names:
                if f"/{d}/" not in text.splitlines():
                    f.write(f"/{d}/\n")
                    text += f"/{d}/\n"
    except OSError:
        pass


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def copy_any(src, dst) -> None:
    """`cp -r SRC DST`, DST not there yet."""
    if Path(src).is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst)


def split_file(src, cut: int, first, rest) -> None:
    """SRC's first `cut` bytes into FIRST, the others into REST."""
    with open(src, "rb") as f, open(first, "wb") as a, open(rest, "wb") as b:
        left = cut
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            a.write(chunk)
            left -= len(chunk)
        shutil.copyfileobj(f, b, 1 << 20)


def join_files(parts, dst) -> None:
    with open(dst, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)


def extract(t: tarfile.TarFile, dest) -> None:
    """t into dest, refusing members that would land outside it where Python can (3.12, and
    the security releases before it)."""
    if hasattr(tarfile, "data_filter"):
        t.extractall(dest, filter="data")
        return
    for m in t.getmembers():   # (an older Python: the same refusals, by hand)
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or m.issym() or m.islnk() or m.isdev():
            raise tarfile.TarError(f"{m.name}: a member outside the folder, or a link")
    t.extractall(dest)
