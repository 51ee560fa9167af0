"""The Triton kernels a GPU's steps launch compile for a GPU (sm_90: the H100's and H200's) on a
machine without one. Triton's interpreter, which the CPU tests run them under, does not type-check
what a compile does: layout_kernel at fe4f29c re-typed a loop-carried value (int32 to int64),
which passed every interpreted test and would have failed its first compile on a GPU (where
CudaGraphs would then warn and fall back). In a subprocess: once a test module has set
TRITON_INTERPRET, `triton.jit` in this process makes interpreted functions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specctl.engine import layout_kernel
from specctl.runtime.step import grid_kernel

ints = {k: "i32" for k in ("sb", "sk", "C", "G", "T0", "block", "sR", "E")}
kernels = [
    (layout_kernel._layout_kernel,
     {"par": "*i64", "prefix": "*i64", "anc": "*i1", "pos": "*i64", "n": "i32"},
     {"BN": 128}),
    (grid_kernel._verify_kernel,
     {"up": "*i64", "target": "*i64", "res": "*i64", "kc": "*bf16", "vc": "*bf16", **ints,
      "sL": "i64"},
     {"BC": 16, "BG": 4, "BO": 8, "BE": 64}),
]
for fn, sig, const in kernels:
    sig.update({k: "constexpr" for k in const})
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                   target=GPUTarget("cuda", 90, 32))
    print("compiled", fn.__name__)
"""


def test_every_step_kernel_compiles_for_a_gpu():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    got = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.split() == ["compiled", "_layout_kernel", "compiled", "_verify_kernel"]
