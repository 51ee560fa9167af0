"""The decoding methods' drafters: `make_drafter` builds the one a config names, with its
artifact (skip set, adapter, corpus cache) found in the store."""

from __future__ import annotations

from pathlib import Path

from specctl.errors import SpecctlError
from specctl.models.fingerprint import model_fingerprint
from specctl.runtime.jobs.artifacts import (describe_skip_set, resolve_adapter,
                                            resolve_corpus_cache, resolve_skip_set)
from specctl.runtime.jobs.config import GRID_FROM, GenerateConfig
from specctl.speculative.corpus_cache import KIND as CORPUS_KIND
from specctl.speculative.drafter import NoDraft
from specctl.store import Store


def warn_flex_off_cuda(model, log) -> None:
    if model.attention == "flex" and model.device.type != "cuda":
        log("--attention flex: off CUDA this is PyTorch's unfused reference (slow, and its "
            "memory grows with the whole KV cache); it is meant for CUDA")


def locate_artifacts(cfg: GenerateConfig, store: Store) -> None:
    """The artifacts the config names for its method(s) exist in the store (a clear error
    before any model loads)."""
    corpus = None if cfg.corpus_cache == "none" else cfg.corpus_cache   # ("none": no corpus)
    for method, spec, kind in (("draft-verify", cfg.skip_set, "skipsets"),
                               ("kangaroo", cfg.adapter, "adapters"),
                               ("self-draft", corpus, CORPUS_KIND)):
        if cfg.method in (method, "auto") and spec:
            store.locate(spec, kind)


def make_drafter(cfg: GenerateConfig, model, model_dir: Path, store: Store, log):
    """The method's drafter, with its artifact found in the store (and said which)."""
    if cfg.method == "ar":
        return NoDraft()
    if cfg.method == "kangaroo":
        from specctl.speculative.kangaroo import KangarooDrafter, KangarooParams
        adapter, where = resolve_adapter(cfg.adapter, store, model_fingerprint(model_dir), model)
        log(f"kangaroo: adapter {where} (exit layer {adapter.l})")
        try:
            prm = KangarooParams(cfg.eta, cfg.kangaroo_gamma)
        except ValueError as e:
            raise SpecctlError(f"kangaroo: {e}") from None
        return KangarooDrafter(model, adapter, cfg.sampling(), prm)
    if cfg.method == "self-draft":
        from specctl.speculative.self_draft import SelfDraftDrafter
        prm = cfg.self_draft_params()
        corpus, cid = None, None
        if prm.corpus_cache:
            from specctl.speculative.corpus_cache import CorpusCache
            path = resolve_corpus_cache(store, model_dir, cfg.corpus_cache, log)
            if path is None:
                log("self-draft: no corpus cache for this model's tokenizer in the store "
                    "(build one with `specctl build-cache`); drafting from the context cache only")
            else:
                corpus, cid = CorpusCache.load(path), Path(path).name
                if corpus.max_token() >= model.cfg.vocab_size:   # (drafts index the embedding)
                    raise SpecctlError(
                        f"{path}: the n-gram cache holds token id {corpus.max_token()}, past this "
                        f"model's vocabulary ({model.cfg.vocab_size}): it is not for this model")
                if cfg.corpus_cache:   # (the resolver names the one it picks by itself)
                    log(f"self-draft: corpus cache {path}")
        if model.device.type == "cpu" and prm.branches and cfg.speculate == "fixed":
            log("self-draft --speculate fixed: on a CPU the ~90 extra branch and candidate "
                "tokens per sequence and step cost real compute (0.2-0.6x of ar on a 2-core CPU, "
                "see docs/benchmarks.md); --speculate auto (the default) drafts only where it "
                "is expected to pay")
        drafter = SelfDraftDrafter(prm, corpus, cid, model.cfg.vocab_size)
        # (said, as the corpus and branches then sit out)
        if cfg.grid is None and drafter.context_table is not None:
            job = " and the job cache's" if drafter.job_table is not None else ""
            log(f"self-draft: drafting on the grid at batch {cfg.batch_size} (the default "
                f"from {GRID_FROM}): the context cache's candidates{job} only, no corpus nor "
                "branches (--no-grid: the per-sequence steps)")
        return drafter
    if cfg.method != "draft-verify":
        raise SpecctlError(f"unknown method {cfg.method!r}")
    from specctl.speculative.draft_verify import LayerSkipDrafter

    skip, where = resolve_skip_set(cfg.skip_set, store, model_fingerprint(model_dir),
                                   model.cfg.num_layers, log, model.device, model.dtype)
    log(f"draft-verify: skip set {where}: {describe_skip_set(skip)}")
    return LayerSkipDrafter(model, skip, cfg.sampling(), cfg.exit_params())
