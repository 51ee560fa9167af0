"""`collect P1.tgz [P2.tgz]`, on the CPU machine: the calls' tarballs into one results folder,
bench-results/<date>-gpu-<commit>/ (COLLECT_DEST: elsewhere), its README.md written."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Mapping

from .carry import extract, ignore_in_git
from .readme import write_readme
from .settings import ROOT, die


def collect(tarballs: list, env: Mapping[str, str] = os.environ) -> Path:
    if not tarballs:
        die("usage: runbook.py collect PART1.tgz [PART2.tgz]")
    with tempfile.TemporaryDirectory(prefix="runbook-collect.",
                                     dir=env.get("TMPDIR") or "/tmp") as tmp:
        work = Path(tmp)
        for i, f in enumerate(tarballs, 1):
            try:
                with tarfile.open(f) as t:
                    extract(t, work / str(i))
            except (OSError, tarfile.TarError, EOFError):
                die(f"{f}: not a tarball of a run")
            # (later parts' files win; steps.tsv and commands.sh are merged below)
            shutil.copytree(work / str(i), work / "all", symlinks=True, dirs_exist_ok=True)
        try:
            merge_parts(work, len(tarballs))
        except (OSError, ValueError, IndexError) as e:
            die(f"could not merge steps.tsv and commands.sh: {e}")
        return _place(work / "all", env)


def _place(merged: Path, env: Mapping[str, str]) -> Path:
    """The merged folder to its destination, a GPU-trained adapter apart from it."""
    name = f"{_field(merged / 'env.json', 'date')}-gpu-{_field(merged / 'stage.json', 'commit')}"
    dest = Path(env.get("COLLECT_DEST") or ROOT / "bench-results" / name)
    dest.mkdir(parents=True, exist_ok=True)
    # no step leaves an adapter now, but a GPU train-adapter run by hand into OUT may: weights
    # stay out of git (the tree travels with every call)
    if (merged / "adapter").is_dir():
        keep = Path(env.get("ADAPTER_DEST") or ROOT / ".gpu-adapter" / name)
        if not env.get("ADAPTER_DEST"):
            ignore_in_git(".gpu-adapter")
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(keep, ignore_errors=True)
        shutil.move(str(merged / "adapter"), str(keep))
        print(f"the GPU-trained adapter: {keep} (specctl ... --adapter {keep})")
    shutil.copytree(merged, dest, symlinks=True, dirs_exist_ok=True)
    write_readme(dest)
    print(f"results: {dest}")
    print(f"commit them: git add {dest} && git commit -m 'GPU runbook results {name}' -- {dest}")
    return dest


def _field(path: Path, key: str) -> str:
    """A top-level field of a JSON file ('' when absent)."""
    try:
        v = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        v = None
    return "" if v is None else str(v)


def merge_parts(work: Path, n: int) -> None:
    """WORK/1 .. WORK/n unpacked calls into WORK/all's steps.tsv and commands.sh. A second call
    on a fresh machine has only its own part, so each part's rows and commands come from the
    last tarball that has them (commands.sh's sections open "# part N, ...")."""
    head, rows, cmds = None, {}, {}
    for i in range(1, n + 1):
        p = work / str(i) / "steps.tsv"
        if p.is_file():
            with open(p, newline="") as f:
                lines = list(csv.reader(f, delimiter="\t"))
            head = lines[0]
            for part in {r[0] for r in lines[1:]}:
                rows[part] = [r for r in lines[1:] if r[0] == part]
        p = work / str(i) / "commands.sh"
        if p.is_file():
            for sec in re.split(r"(?m)^(?=# part )", p.read_text()):
                m = re.match(r"# part (\S+),", sec)
                if m:
                    cmds[m.group(1)] = sec
    with open(work / "all" / "steps.tsv", "w", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(head or ["part", "step", "rc", "wall_s", "budget_s", "note"])
        for part in sorted(rows):
            out.writerows(rows[part])
    (work / "all" / "commands.sh").write_text("".join(cmds[k] for k in sorted(cmds)))
