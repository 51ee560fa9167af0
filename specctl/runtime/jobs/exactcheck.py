"""--exact's start-up check, kept per machine, model and dtype in the store.

The probe and the self-check on the model (engine/exact.py, engine/selfcheck.py) take ~1.5-2 s
for the demo model on a 2-core CPU, a third of a short job's time. Their verdict (which linear
holds) depends only on what this key covers, so a later run with the same key takes it
without checking again:
- the machine: the device's model (CPU model name or GPU), the CPU's vector and matrix
  instruction sets (oneDNN dispatches on them: an AMX CPU rounds otherwise than one without),
  the thread count the check ran at (the probe tries 1, half and all of it), torch's
  version and build (its BLAS and oneDNN versions), Triton's on CUDA, and the environment
  switches those libraries read (ONEDNN_MAX_CPU_ISA, TORCH_MKLDNN_MATMUL_MIN_DIM, LD_PRELOAD
  and the like);
- the model (its fingerprint, and a sample of the weights the probe multiplies: whether a
  rounding difference shows depends on their values), the dtype and the attention;
- specctl's version and engine code (a change to any engine module checks again).
A refusal is not kept: it is checked again each run. The facts are in the kept verdict's
manifest (profiles/<id>/manifest.json), for a reader who wants to know what was checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from specctl import __version__
from specctl.engine.exact import named_linear
from specctl.io.schema import SchemaError, fields, string
from specctl.runtime.control.steptables import cpuinfo, device_tag
from specctl.store import atomic_write_json, make_manifest

_ENV = ("ONEDNN_", "DNNL_", "MKL_", "OMP_", "KMP_", "ATEN_", "TORCH_", "OPENBLAS_", "GOTO",
        "BLIS_", "TRITON_", "CUBLAS", "CUDA_", "NVIDIA_TF32", "LD_PRELOAD", "LD_LIBRARY_PATH")
_SAMPLE = 4099   # every this-many-th weight of the probed tensors goes into the key
_ISA = ("avx", "amx", "fma", "f16c", "bf16", "vnni", "sse4", "neon", "sve")
_ENGINE = Path(__file__).resolve().parents[2] / "engine"


def machine_facts(model) -> dict:
    """What decides which kernels, in what order, compute --exact's operations here."""
    facts = {"device": device_tag(model), "dtype": str(model.dtype).removeprefix("torch."),
             "attention": model.attention, "specctl": __version__, "torch": torch.__version__,
             "weights": _weights_sample(model),
             "build": _sha(torch.__config__.show()),
             "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV)},
             "engine": _sha("".join(p.read_text("utf-8")
                                    for p in sorted(_ENGINE.glob("*.py"))))}
    if model.device.type == "cuda":
        try:
            import triton
            version = triton.__version__
        except ImportError:   # (set_exact says --exact on CUDA needs it)
            version = None
        facts["cuda"] = {"capability": list(torch.cuda.get_device_capability(model.device)),
                         "runtime": torch.version.cuda, "triton": version}
    else:
        facts["isa"] = _cpu_isa()
    return facts


def exact_check_id(fingerprint: str, facts: dict) -> str:
    return (f"{fingerprint}-{facts['device']}-{facts['dtype']}-exact-check-"
            f"{_sha(json.dumps(facts, sort_keys=True))[:16]}")


def set_exact_kept(model, store, fingerprint: str, log=lambda msg: None) -> None:
    """model.set_exact(True), taking the verdict kept for this key if there is one, else
    checking and keeping it. A kept verdict that does not read is checked again."""
    facts = machine_facts(model)
    ident = exact_check_id(fingerprint, facts)
    path = store.path("profiles", ident) / "exact.json"
    known = None
    if path.is_file():
        try:
            known = fields(json.loads(path.read_text("utf-8")),
                           required={"linear": string(nonempty=True)})["linear"]
            named_linear(known, model.device.type == "cuda")
        except (ValueError, SchemaError, OSError) as e:   # (json's errors are ValueErrors)
            log(f"{path}: unreadable kept --exact check ({e}); checking again")
            known = None
    if known is not None:
        model.set_exact(True, known=known)
        return
    model.set_exact(True)
    try:
        with store.building("profiles", ident, make_manifest(
                "exact-check", ident, model_fingerprint=fingerprint, facts=facts)) as d:
            atomic_write_json(d / "exact.json", {"linear": model._exact_linear.__name__})
    except OSError as e:   # (a cache: a store that cannot keep it costs a check next time)
        log(f"--exact's check not kept in the store ({e})")


def _weights_sample(model) -> str:
    """A digest of every _SAMPLE-th value of the weights the probe multiplies (cheap: ~1/4000
    of them), so that two checkpoints of one layout but other values are told apart."""
    h = hashlib.sha256()
    for w in model.linear_weights() + [model.lm_head]:
        h.update(w.detach().flatten()[::_SAMPLE].float().cpu().numpy().tobytes())
    return h.hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _cpu_isa() -> list[str]:
    """The CPU's flags that name vector or matrix instruction sets (Linux; [] elsewhere)."""
    flags = cpuinfo(("flags", "Features")) or ""
    return sorted({f for f in flags.split() if f.startswith(_ISA)})
