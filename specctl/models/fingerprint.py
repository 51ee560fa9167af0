"""Fingerprints: what stored artifacts are keyed by.

A model's fingerprint (its config and weight files) keys what depends on the weights: skip
sets, adapters, cost profiles. A tokenizer's fingerprint (how text becomes ids) keys what depends
on the tokenizer only: corpus n-gram caches.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.store import file_sha256

# Text whose token ids are part of the fingerprint: words, numbers, code, whitespace runs,
# accents, CJK, Cyrillic, emoji, markup (what a tokenizer's normalizer and pre-tokenizer act on).
_PROBE = ("Hello, world! The quick brown fox jumps over the lazy dog. 12345 67.89 1,000,000\n\t  "
          "def f(x):\n    return x**2  # code\n\n\n   indented   spaces  "
          "Ünïcödé: naïve café façade, 日本語のテキスト, 中文, русский текст, emoji 🚀🎉👍🏽, "
          "<tags> &amp; {\"json\": [1, 2]} https://example.com/a?b=c don't I'll we've")


def weight_files(path: Path) -> list[Path]:
    """The safetensors files that hold a checkpoint folder's weights (its shard index's, or
    every *.safetensors), checked to exist inside the folder."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise SpecctlError(f"{index}: unreadable shard index ({e})") from None
        files = [path / n for n in names]
        for f in files:
            if f.parent != path or not f.exists():
                raise SpecctlError(f"{index}: names a missing or outside shard {f.name!r}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SpecctlError(f"{path}: no *.safetensors weights (only safetensors are loaded)")
    return files


def model_fingerprint(path: Path | str) -> str:
    """A short id of a checkpoint, for keying artifacts (skip sets, adapters) by model:
    config.json's bytes plus each weight file's name, size and first MiB."""
    path = Path(path)
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in weight_files(path):
        h.update(f"{f.name}:{f.stat().st_size}:{file_sha256(f, limit=1 << 20)}".encode())
    return h.hexdigest()[:16]


def tokenizer_fingerprint(model_dir: Path | str) -> str:
    """sha256 (hex) of what decides how text becomes token ids in a model folder.

    tokenizer.json: what it does, not how it is written: the model type, the vocabulary with
    its added tokens (and their settings), the BPE merges (either spelling) or the Unigram
    scores, and the ids of a fixed probe text (BPE dropout off). Transformers versions
    write the same tokenizer differently (a GGUF converted by 5.17 and by 5.23 differ in no-op
    normalizers, decoders and defaults), and truncation/padding settings do not change ids, so
    neither changes the fingerprint. Else vocab.json + merges.txt, else tokenizer.model
    (sentencepiece), by content.
    """
    d = Path(model_dir)
    tj = d / "tokenizer.json"
    h = hashlib.sha256()
    if tj.is_file():
        from tokenizers import Tokenizer
        try:
            data = json.loads(tj.read_text(encoding="utf-8"))
            model = data.get("model") or {}
            tok = Tokenizer.from_file(str(tj))
            tok.no_truncation()
            tok.no_padding()
            if getattr(tok.model, "dropout", None):   # random merges: the probe must not vary
                tok.model.dropout = None
            kind = type(tok.model).__name__
            merges = [m.split(" ", 1) if isinstance(m, str) else list(m)
                      for m in model.get("merges") or []]
            scores = model.get("vocab") if kind == "Unigram" else None   # [[piece, score]]
            added = sorted([[a.get("id"), a.get("content"), bool(a.get("special")),
                             bool(a.get("normalized")), bool(a.get("lstrip")),
                             bool(a.get("rstrip")), bool(a.get("single_word"))]
                            for a in data.get("added_tokens") or []], key=str)
            vocab = sorted(tok.get_vocab(with_added_tokens=True).items(),
                           key=lambda kv: (kv[1], kv[0]))
            probe = tok.encode(_PROBE, add_special_tokens=False).ids
        except Exception as e:   # a broken or hostile file: one clear error
            raise SpecctlError(f"{tj}: not a valid tokenizer.json ({e})") from None
        h.update(b"tokenizer-behaviour\0")
        for part in (kind, vocab, added, merges, scores, probe):
            h.update(json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()
    names = [n for n in ("vocab.json", "merges.txt") if (d / n).is_file()]
    if not names and (d / "tokenizer.model").is_file():
        names = ["tokenizer.model"]
    if not names:
        raise SpecctlError(f"{d}: no tokenizer files (tokenizer.json, vocab.json + merges.txt "
                           "or tokenizer.model)")
    for n in names:
        h.update(n.encode() + b"\0")
        h.update((d / n).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _legacy_fingerprint(model_dir: Path | str) -> str | None:
    """The older form of the tokenizer fingerprint: tokenizer.json's normalizer, pre_tokenizer,
    model and added_tokens as canonical JSON (None without a tokenizer.json). Still accepted, so
    a cache that carries it keeps working with the model folder it was built from."""
    tj = Path(model_dir) / "tokenizer.json"
    if not tj.is_file():
        return None
    try:
        data = json.loads(tj.read_text(encoding="utf-8"))
        part = {k: data.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    except (ValueError, AttributeError):
        return None
    return hashlib.sha256(b"tokenizer.json\0" + json.dumps(
        part, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def tokenizer_name(model_dir: Path | str) -> str:
    """A readable name for the tokenizer: the model folder's name (hub snapshots: org--name)."""
    d = Path(model_dir).resolve()
    if d.parent.name == "snapshots" and d.parent.parent.name.startswith("models--"):
        return d.parent.parent.name[len("models--"):]
    return d.name
