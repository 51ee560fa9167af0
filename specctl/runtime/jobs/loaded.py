"""A job's tokenizer and model, kept for the next job of the same Generator.

    kept = Kept()
    tk, model = load(cfg, model_dir, device, say, kept)   # loads
    tk, model = load(cfg, model_dir, device, say, kept)   # the same objects, nothing loaded

A Generator's generate() and generate_file() calls each ran a job, and each job loaded its
model and tokenizer anew: a loop over a folder of prompt files paid a model's load a file
(the README's example twice, ~2 s of its ~23 on the demo model; a 7B checkpoint ~10-60 s a
load). A model holds nothing of a run (its KV caches and their graphs are each run's), so a
job may take the last one's where everything that decides the load is the same: the
settings, and the folder's files as they are now (names, sizes, modification times: a
checkpoint written over between two calls, an eval loop's, loads again, or a run would record
the new weights' digests beside the old weights' answers). A launcher's process group loads
its own (each rank on its device).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specctl.engine.attention import cudnn_attention
from specctl.engine.loader import load_model
from specctl.runtime.jobs.methods import warn_flex_off_cuda
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.tokenization import Tokenization
from specctl.runtime.step.threads import say_threads


@dataclass
class Kept:
    """The last load's key (load_key) and what it loaded; loads: how many there were."""
    key: tuple | None = None
    tk: Tokenization | None = None
    model: object = None
    loads: int = 0


def load_key(cfg: GenerateConfig, model_dir: Path, device: str) -> tuple:
    """Everything a model's and its tokenizer's load reads of a job: its settings and the
    folder's files (a stat of each, not their bytes: a call's key costs a folder listing)."""
    d = Path(model_dir).resolve()
    stats = [(f.name, f.stat()) for f in d.iterdir() if f.is_file()]
    files = tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))
    return (str(d), files, device, cfg.model_dtype(), cfg.cuda_graphs, cfg.attention,
            cfg.cudnn_attention, cfg.chat)


def load(cfg: GenerateConfig, model_dir: Path, device: str, say: Callable[[str], None],
         kept: Kept | None = None) -> tuple[Tokenization, object]:
    """(tokenizer, model) of a job on `device`: kept's where its key is this job's, else
    loaded (and kept, in place of the last)."""
    key = load_key(cfg, model_dir, device)
    if kept is not None and kept.key == key:
        cudnn_attention(cfg.cudnn_attention)   # (the process's: another load may have set it)
        say_threads(cfg.threads, kept.model, say)
        return kept.tk, kept.model
    if kept is not None and kept.model is not None:   # (the last one's memory first: a GPU
        kept.key = kept.tk = kept.model = None          # may not hold two; a model and its
        gc.collect()                                    # graphs refer to each other)
    tk = Tokenization(model_dir, cfg.chat)
    model = load_model(model_dir, device, cfg.model_dtype(), cuda_graphs=cfg.cuda_graphs,
                       attention=cfg.attention, cudnn_attention=cfg.cudnn_attention)
    warn_flex_off_cuda(model, say)
    say_threads(cfg.threads, model, say)
    if kept is not None:
        kept.key, kept.tk, kept.model = key, tk, model
        kept.loads += 1
    return tk, model
