"""Reading a checkpoint's safetensors lazily, tensor by tensor, into the run's dtype.

A checkpoint's weights are as big as the memory a user has for them, so loading must not hold
a second copy: each tensor is read straight into its own buffer of the run's dtype and device
(bf16, fp16 or fp32 in, any of them out, cast on the copy) and nothing else of it stays
resident. safetensors maps a whole file and the pages a read touches count as the process's
resident memory until the file is closed; so every read opens the file anew and takes at most
CHUNK bytes of it, and a big tensor (an embedding) is copied in row chunks. Peak memory while
loading is the weights in the run's dtype plus one chunk.

Which file holds which tensor comes from the files' own headers (every shard the index lists,
or every *.safetensors), each name in exactly one file: a shard index that points elsewhere, or
a tensor stored twice, is an error, not a silent choice. Headers are read (and shapes can be
checked) before any weight is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specctl.errors import SpecctlError
from specctl.models.fingerprint import weight_files
from specctl.store import file_crc32

CHUNK = 16 << 20   # bytes of a stored tensor read per opening of its file
# the stored dtypes read (the rest -- integers, fp8, quantized blocks -- are not weights the
# engine can cast), with their sizes
SOURCE_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class Stored:
    """Where one tensor lies: its file, name there, shape and stored dtype."""
    file: Path
    name: str
    shape: tuple[int, ...]
    dtype: str


def _stored_checksums(path: Path) -> dict[str, str]:
    """A store model's weights checksums (its manifest's weights_crc32), else none."""
    try:
        sums = json.loads((path / "manifest.json").read_text()).get("weights_crc32")
    except (OSError, ValueError, AttributeError):
        return {}
    return sums if isinstance(sums, dict) else {}


def _index_map(path: Path) -> dict[str, str] | None:
    """The shard index's tensor -> file map (weight_files has checked it parses), or None."""
    index = path / "model.safetensors.index.json"
    if not index.exists():
        return None
    wmap = json.loads(index.read_text())["weight_map"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
        raise SpecctlError(f"{index}: weight_map must map tensor names to file names")
    return wmap


def tensor_index(path: Path) -> dict[str, Stored]:
    """Every tensor of a checkpoint folder, from its files' headers (no weight is read).
    A store model's files are checked against their manifest's checksums first."""
    sums = _stored_checksums(path)
    found: dict[str, Stored] = {}
    for f in weight_files(path):
        if f.name in sums and file_crc32(f) != sums[f.name]:
            raise SpecctlError(f"{f}: the file changed since the store made it (checksum "
                               "mismatch): it is damaged; pull the model again "
                               "(`specctl models pull --force`)")
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    sl = st.get_slice(name)
                    if name in found:
                        raise SpecctlError(f"{path}: tensor {name} is stored twice "
                                           f"({found[name].file.name} and {f.name})")
                    found[name] = Stored(f, name, tuple(sl.get_shape()), sl.get_dtype())
        except (SafetensorError, OSError, ValueError) as e:
            raise SpecctlError(f"{f}: corrupt safetensors file ({e})") from None
    wmap = _index_map(path)
    for name, file in (wmap or {}).items():
        if name in found and found[name].file.name != file:
            raise SpecctlError(f"{path / 'model.safetensors.index.json'}: puts {name} in "
                               f"{file}, but it is in {found[name].file.name}")
    return found


def read_tensor(s: Stored, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One stored tensor, read into a new tensor of `dtype` on `device` (a copy of its own:
    nothing of the file stays mapped), CHUNK bytes of the file at a time."""
    size = SOURCE_DTYPES.get(s.dtype)
    if size is None:
        raise SpecctlError(f"{s.file}: tensor {s.name} is stored as {s.dtype}; only "
                           f"{', '.join(SOURCE_DTYPES)} weights are read (no quantized ones)")
    out = torch.empty(s.shape, dtype=dtype, device=device)
    try:
        if len(s.shape) == 0 or out.numel() == 0:
            with safe_open(str(s.file), framework="pt") as st:
                out.copy_(st.get_tensor(s.name))
            return out
        step = max(1, CHUNK // (size * math.prod(s.shape[1:]) or 1))
        for a in range(0, s.shape[0], step):
            with safe_open(str(s.file), framework="pt") as st:   # (closed: its pages let go)
                out[a:a + step].copy_(st.get_slice(s.name)[a:a + step])
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise SpecctlError(f"{s.file}: could not read tensor {s.name} ({e})") from None
    return out
