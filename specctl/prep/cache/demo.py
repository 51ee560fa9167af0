"""`specctl build-cache demo`: real English text to stand in for the OANC where it cannot be had.

The gensim 4.4.0 wheel (28 MB on PyPI) ships test data that is plain English: 300 news articles
(`lee_background.cor`, `lee.cor`, latin-1) and a shortened Wikipedia dump (~6 MB of wikitext).
The wheel is fetched once with pip, only those members are read (never extracted wholesale), the
wikitext is reduced to its prose (templates, references, tables, link targets and tags dropped),
and the result lies in `<store>/data/demo-corpus/` as .txt files that build-cache reads like any
folder. About 0.47M words (3% of the OANC): enough to show the corpus cache working, not
to match the paper's cache.
"""

from __future__ import annotations

import bz2
import html
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.io.pypi import pip_wheel
from specctl.reporting import quiet
from specctl.store import Store, atomic_write_text, published

PACKAGE = "gensim==4.4.0"
DATA = "gensim/test/test_data/"
MEMBERS = {   # member -> (file name, encoding)
    "lee_background.cor": ("lee_background.txt", "utf-8"),
    "lee.cor": ("lee.txt", "latin-1"),
    "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2": ("enwiki.txt", "wiki"),
}
MAX_MEMBER = 64 << 20   # decompressed bytes per member


def wiki_prose(xml: str) -> str:
    """MediaWiki XML dump -> article prose, one paragraph per line (crude but enough for
    n-gram statistics)."""
    out = []
    for m in re.finditer(r"<text[^>]*>(.*?)</text>", xml, flags=re.S):
        t = html.unescape(m.group(1))
        t = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", " ", t, flags=re.S)
        t = re.sub(r"<!--.*?-->", " ", t, flags=re.S)
        for _ in range(3):   # nested templates and tables
            t = re.sub(r"\{\{[^{}]*\}\}|\{\|.*?\|\}", " ", t, flags=re.S)
        t = re.sub(r"\[\[(?:File|Image|Category):[^\]]*\]\]", " ", t)
        t = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", t)       # [[target|label]] -> label
        t = re.sub(r"\[https?://\S+\s*([^\]]*)\]", r"\1", t)           # [url label] -> label
        t = re.sub(r"<[^>]+>", " ", t)
        t = re.sub(r"'{2,}", "", t)
        for line in t.splitlines():
            line = re.sub(r"\s+", " ", line).strip()
            if len(line) > 40 and not line.startswith(("=", "*", "|", "!", "#", ":")):
                out.append(line)
    return "\n".join(out) + "\n"


def fetch_demo_corpus(store: Store, log=quiet, wheel: Path | None = None) -> Path:
    """The folder of demo .txt files (fetched and converted once)."""
    dest = store.root / "data" / "demo-corpus"
    if dest.is_dir() and all((dest / f).is_file() for f, _ in MEMBERS.values()):
        return dest
    with tempfile.TemporaryDirectory(prefix="specctl-corpus-") as tmp:
        if wheel is None:   # (for its English test texts)
            wheel = pip_wheel(PACKAGE, Path(tmp), log, size="28 MB", offline="offline? pass "
                              "your own text files or the OANC to build-cache")
        dest.parent.mkdir(parents=True, exist_ok=True)
        stage = published(Path(tempfile.mkdtemp(prefix=".demo-corpus-", dir=dest.parent)), 0o777)
        try:
            with zipfile.ZipFile(wheel) as z:
                for member, (name, enc) in MEMBERS.items():
                    info = z.getinfo(DATA + member)
                    if info.file_size > MAX_MEMBER:
                        raise SpecctlError(f"{wheel.name}: {member} is implausibly large")
                    raw = z.read(info)
                    if enc == "wiki":
                        data = bz2.BZ2Decompressor().decompress(raw, MAX_MEMBER)
                        text = wiki_prose(data.decode("utf-8", errors="replace"))
                    else:
                        text = raw.decode(enc)
                    atomic_write_text(stage / name, text)
        except (KeyError, zipfile.BadZipFile, OSError, EOFError) as e:
            shutil.rmtree(stage, ignore_errors=True)
            raise SpecctlError(f"{wheel}: not the expected gensim wheel ({e})") from None
        if dest.exists():   # an incomplete earlier attempt
            shutil.rmtree(dest)
        stage.replace(dest)   # same filesystem: the folder appears whole or not at all
    words = sum(len((dest / f).read_text(encoding="utf-8").split()) for f, _ in MEMBERS.values())
    log(f"demo corpus ready at {dest} ({words:,} words)")
    return dest
