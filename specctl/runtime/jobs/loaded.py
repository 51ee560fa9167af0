"""A job's tokenizer and model, kept for the next job of the same Generator.

    kept = Kept()
    tk, model = load(cfg, model_dir, device, say, kept)   # loads
    tk, model = load(cfg, model_dir, device, say, kept)   # the same objects, nothing loaded

A Generator's generate() and generate_file() calls each ran a job, and each job loaded its
model and tokenizer anew: a loop over a folder of prompt files paid a model's load a file
(the README's example twice, ~2 s of its ~23 on the demo model; a 7B checkpoint ~10-60 s a
load). A model holds nothing of a run (its KV caches and their graphs are each run's), so a
job may take the last one's where everything that decides the load is the same; a
launcher's process group loads its own (each rank on its device).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specctl.engine.loader import load_model
from specctl.runtime.jobs.methods import warn_flex_off_cuda
from specctl.runtime.jobs.config import GenerateConfig
from specctl.runtime.jobs.tokenization import Tokenization


@dataclass
class Kept:
    """The last load's key (load_key) and what it loaded; loads: how many there were."""
    key: tuple | None = None
    tk: Tokenization | None = None
    model: object = None
    loads: int = 0


def load_key(cfg: GenerateConfig, model_dir: Path, device: str) -> tuple:
    """Everything a model's and its tokenizer's load reads of a job."""
    return (str(Path(model_dir).resolve()), device, cfg.model_dtype(), cfg.cuda_graphs,
            cfg.attention, cfg.cudnn_attention, cfg.chat)


def load(cfg: GenerateConfig, model_dir: Path, device: str, say: Callable[[str], None],
         kept: Kept | None = None) -> tuple[Tokenization, object]:
    """(tokenizer, model) of a job on `device`: kept's where its key is this job's, else
    loaded (and kept, in place of the last)."""
    key = load_key(cfg, model_dir, device)
    if kept is not None and kept.key == key:
        return kept.tk, kept.model
    if kept is not None:   # (the last one's memory first: a GPU may not hold two)
        kept.key = kept.tk = kept.model = None
    tk = Tokenization(model_dir, cfg.chat)
    model = load_model(model_dir, device, cfg.model_dtype(), cuda_graphs=cfg.cuda_graphs,
                       attention=cfg.attention, cudnn_attention=cfg.cudnn_attention)
    warn_flex_off_cuda(model, say)
    if kept is not None:
        kept.key, kept.tk, kept.model = key, tk, model
        kept.loads += 1
    return tk, model
