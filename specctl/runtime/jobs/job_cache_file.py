"""--job-cache-file PATH: Self-Draft's job cache (speculative/job_cache.py) saved when a job ends
and loaded when the next starts, so that a nightly job over new inputs drafts from the answers
of the nights before.

The file is safetensors (int64 arrays only, never pickle; read through the validating reader
of corpus_cache.py), written atomically by the store's writer (store/files.py). Its metadata
names the model's and the tokenizer's fingerprints, the cache's settings and Python's hash of
a token tuple (keys are hashes: another interpreter's would not find them): a file made for
anything else is refused, never half-used.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from specctl.errors import SpecctlError
from specctl.models.fingerprint import model_fingerprint, tokenizer_fingerprint
from specctl.speculative.corpus_cache import read_safetensors_mmap
from specctl.speculative.job_cache import JobCache
from specctl.speculative.job_table import JobTable
from specctl.store import atomic_write_bytes

KIND = "specctl-job-cache"
FORMAT = "1"


def _identity(cache: JobCache, model_dir: Path) -> dict[str, str]:
    return {"kind": KIND, "format": FORMAT, "model": model_fingerprint(model_dir),
            "tokenizer": tokenizer_fingerprint(model_dir),
            "params": json.dumps(asdict(cache.prm), sort_keys=True),
            "hash": str(hash((1, 2, 3))) + f":{sys.hash_info.algorithm}"}


def load_job_cache(path: str, drafter, model_dir: Path, log) -> None:
    """The drafter's job cache from `path` where the file exists (else it starts empty)."""
    cache = getattr(drafter, "job", None)
    if cache is None:
        raise SpecctlError("--job-cache-file needs --method self-draft with --job-cache")
    p = Path(path).expanduser()
    if not p.exists():
        log(f"self-draft: {p} does not exist yet: the job cache starts empty and is saved there")
        return
    try:
        arrays, meta = read_safetensors_mmap(p)
    except SpecctlError as e:   # (some other file there: say what it was taken for)
        raise SpecctlError(f"--job-cache-file {e}: not a job cache; give another path, or "
                           "remove it to start one there") from None
    want = _identity(cache, model_dir)
    bad = [k for k in want if meta.get(k) != want[k]]
    if bad:
        raise SpecctlError(f"{p}: not a job cache for this model and settings (differs in: "
                           f"{', '.join(bad)}); give another --job-cache-file or remove it")
    try:
        got = JobCache.from_arrays(cache.prm, {k: arrays[k] for k in
                                               ("keys", "offsets", "entries", "buf")})
    except (KeyError, ValueError) as e:
        raise SpecctlError(f"{p}: a malformed job cache ({e})") from None
    vocab = getattr(drafter, "vocab", None)   # (a token past it would be drafted: the
    if vocab is not None and got.buf and max(got.buf) >= vocab:   # embedding's index error)
        raise SpecctlError(f"{p}: a malformed job cache (a token id past the model's "
                           f"vocabulary of {vocab})")
    # (a grid drafter's is the arrays' form, JobTable: the same texts indexed again)
    drafter.job = JobTable.from_job_cache(got) if isinstance(cache, JobTable) else got
    log(f"self-draft: job cache {p} ({len(drafter.job)} keys)")


def save_job_cache(path: str, drafter, model_dir: Path) -> None:
    """The drafter's job cache into `path`, atomically (the store's one writer: a symlink's
    target, never a device or a folder; the option was checked as the job started)."""
    from safetensors.numpy import save
    drafter.flush_job()   # (texts still waiting for a drafting step)
    job = drafter.job
    job = job.to_job_cache() if isinstance(job, JobTable) else job   # (one format on disk)
    data = save(job.arrays(), metadata=_identity(job, model_dir))
    atomic_write_bytes(Path(path).expanduser(), data)
