"""The OANC's layout: where its text lives in a tree or zip, and which files are its annotations.

The OANC ships as `OANC_GrAF.zip`, or unpacked as
`OANC-GrAF/data/{spoken,written_1,written_2}/<genre>/<source>/*.txt` with `.xml` / `.anc`
annotation files beside the text. When a tree or zip has an `OANC-GrAF/data/` folder, only the
files under it are the corpus. These helpers answer from names alone: they know nothing of
opening, decoding or counting (prep/cache/corpus.py and prep/cache/zips.py do that).
"""

from __future__ import annotations

import re
from pathlib import Path

ANNOTATION_SUFFIXES = (".xml", ".anc")


def is_annotation(name: str) -> bool:
    return name.lower().endswith(ANNOTATION_SUFFIXES)


def oanc_data_prefix(names: list[str]) -> str | None:
    """'.../OANC-GrAF/data/' when the names have such a folder (the OANC layout), else None."""
    for n in names:
        m = re.match(r"^(.*?OANC-GrAF/data/)", n.replace("\\", "/"))
        if m:
            return m.group(1)
    return None


def folder_data_prefix(root: Path, rel: list[str]) -> str | None:
    """The data folder's prefix among the files of folder `root` (`rel`: their posix paths
    relative to it): as in a zip, or `root` is OANC-GrAF itself ('data/' when it has one) or
    its data folder (''); None: not the OANC layout."""
    prefix = oanc_data_prefix(rel)
    if prefix is None and root.name == "OANC-GrAF":
        prefix = "data/" if any(r.startswith("data/") for r in rel) else None
    if prefix is None and root.name == "data" and root.parent.name == "OANC-GrAF":
        prefix = ""
    return prefix
