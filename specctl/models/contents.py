"""Content digests: what a model folder's files hold, for deciding whether a run may resume.

`model_fingerprint` (models/fingerprint.py) keys artifacts by a model's config and the first
MiB of each weights file: cheap, and right for finding a skip set again, but blind to weights
replaced by others of the same shapes (the header and the first tensors agree, the rest does
not). A run that resumes under such a change would mix two models' answers, so a run records
the *content* of what it depends on (`model_contents`) and --resume compares it.

A weights file's digest is a hash of all its bytes, so a change anywhere in it (the middle of a
14 GB file included) is seen. Hashing gigabytes on every start would cost seconds, so a digest
is kept in the store (`cache/digests.json`) under the file's real path, size, mtime, ctime and
inode, and reused while all of them are unchanged: a start costs a stat per file, a changed
file is hashed again once. The blind spot: a file rewritten in place with the same size within
the filesystem's timestamp granularity, with mtime and ctime both unchanged (ctime cannot be set
back by a user, unlike mtime: `touch -d` or `cp --preserve` changes it). A store model whose
manifest holds its weights' crc32 (the demo model) needs no hashing at all: the loader checks
every file against those checksums at every load (engine/loader.py), so they are its content.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from specctl.models.fingerprint import weight_files
from specctl.store import Store, atomic_write_json

HASH = "sha256"   # (hashlib; 1.6 GB/s on this 2-core CPU with SHA extensions, blake2b 0.8)
CACHE = Path("cache") / "digests.json"
CACHE_ENTRIES = 2000              # the newest kept
# the files of a model folder, besides its weights, that decide how text becomes token ids and
# back (tokenizer, chat template, EOS ids); each is hashed whole when present
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class DigestCache:
    """Digests of files by real path and stat identity, kept in a store (see the module
    docstring). Without a store (None) nothing is kept and every digest is computed."""

    def __init__(self, store: Store | None):
        self.path = store.root / CACHE if store is not None else None
        self.entries: dict | None = None
        self.changed = False

    def _load(self) -> dict:
        if self.entries is None:
            self.entries = {}
            if self.path is not None:
                try:
                    data = json.loads(self.path.read_text(encoding="utf-8"))
                    if isinstance(data, dict):
                        self.entries = {k: v for k, v in data.items() if isinstance(v, dict)}
                except (OSError, ValueError):
                    pass   # (a cache: unreadable is empty)
        return self.entries

    def digest(self, path: Path) -> str:
        """`HASH` of the file's bytes (reused from the cache while the file is unchanged)."""
        real = os.path.realpath(path)
        before = _stat_key(os.stat(real))
        e = self._load().get(real)
        if e is not None and e.get("stat") == before and e.get("hash") == HASH:
            return e["digest"]
        h = hashlib.new(HASH)
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        with open(real, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        digest = f"{HASH}:{h.hexdigest()[:32]}"
        if _stat_key(os.stat(real)) == before:   # (not written to while it was read)
            self.entries.pop(real, None)
            self.entries[real] = {"stat": before, "hash": HASH, "digest": digest}
            self.changed = True
        return digest

    def save(self) -> None:
        """Write the cache back if it learnt anything (best effort: it is only a cache)."""
        if not self.changed or self.path is None:
            return
        keep = dict(list(self.entries.items())[-CACHE_ENTRIES:])
        try:
            atomic_write_json(self.path, keep)
            self.changed = False
        except OSError:
            pass


def _stored_crc32(model_dir: Path) -> dict:
    """A store model's weights checksums (its manifest's weights_crc32), else none."""
    try:
        sums = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
        sums = sums.get("weights_crc32") if isinstance(sums, dict) else None
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in sums.items() if isinstance(v, str)} if isinstance(sums, dict) else {}


def _small_files(model_dir: Path, names) -> str:
    h = hashlib.sha256()
    for n in names:
        f = model_dir / n
        if f.is_file():
            h.update(n.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def model_contents(model_dir: Path | str, cache: DigestCache | None = None) -> dict[str, str]:
    """{what: digest} of everything in a model folder that decides a run's tokens: config.json,
    the tokenizer's files, and each weights file (named 'weights <file>')."""
    model_dir = Path(model_dir)
    cache = cache or DigestCache(None)
    out = {"model config": _small_files(model_dir, ["config.json"]),
           "tokenizer": _small_files(model_dir, TOKENIZER_FILES)}
    crc = _stored_crc32(model_dir)
    for f in weight_files(model_dir):
        out[f"weights {f.name}"] = (f"crc32:{crc[f.name]}" if f.name in crc
                                    else cache.digest(f))
    return out
