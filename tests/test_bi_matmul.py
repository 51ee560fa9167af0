"""The CUDA --exact matmul (engine/bi_matmul.py) under Triton's interpreter on the CPU (on a GPU
the compiled kernel): right, and a row's bits independent of the call's row count, the row's
place and keys past it weighted 0."""

from __future__ import annotations

import pytest
import torch

from helpers import triton_module

bi = triton_module("specctl.engine.bi_matmul")   # (under Triton's interpreter on a CPU)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_it_is_a_matmul(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 70, 96, generator=g).to(DEV, dtype)
    w = torch.randn(2, 100, 96, generator=g).to(DEV, dtype)
    ref = torch.bmm(a.double(), w.double().transpose(1, 2))
    got = bi.bmm_nt(a, w).double()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got, ref, rtol=tol, atol=tol * 10)
    assert torch.equal(bi.bmm(a, w.transpose(1, 2)), bi.bmm_nt(a, w))   # strides, not copies
    x, W, b = a[0, :5], w[0], torch.randn(100, generator=g).to(DEV, dtype)
    assert torch.equal(bi.linear(x, W, b), bi.bmm_nt(x[None], W[None])[0] + b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_rows_bits_do_not_depend_on_the_batch(dtype):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1, 80, 200, generator=g).to(DEV, dtype)
    row = torch.randn(200, generator=g).to(DEV, dtype)
    ref = bi.bmm_nt(row[None, None], w)[0, 0]
    for m in (2, 5, 64, 65, 130):
        for at in (0, m // 2, m - 1):
            a = torch.randn(1, m, 200, generator=g).to(DEV, dtype)
            a[0, at] = row
            assert torch.equal(bi.bmm_nt(a, w)[0, at], ref), (m, at)
            both = torch.cat([a, a.flip(1)])               # and in a batch of two
            assert torch.equal(bi.bmm_nt(both, w.expand(2, -1, -1))[0, at], ref)


def test_keys_weighted_zero_add_nothing():
    """Attention's weighted sum: a row whose weights are 0 past its own keys gives the same
    bits over any number of (finite) keys, as a decode over exactly its own keys does."""
    g = torch.Generator().manual_seed(2)
    v = torch.randn(1, 65, 300, generator=g).to(DEV, torch.bfloat16)   # [N = hd + 1, K = keys]
    p = torch.rand(1, 1, 300, generator=g).to(DEV, torch.bfloat16)
    p[..., 70:] = 0
    ref = bi.bmm_nt(p[..., :70], v[..., :70])
    for n in (71, 128, 129, 300):
        assert torch.equal(bi.bmm_nt(p[..., :n], v[..., :n]), ref), n


def test_the_cuda_exact_path_keeps_a_rows_bits_in_any_batch(tiny_llama, monkeypatch):
    """--exact's CUDA path (this kernel for every matmul, attention's included) run on the CPU:
    the same check of a row's logits alone and in batches of 2..64 rows as the CPU path's."""
    import test_exact
    from specctl.engine import exact
    from specctl.engine.loader import load_model
    m = load_model(tiny_llama, "cpu", "bf16")
    m.set_exact(True)
    m.linear = bi.linear
    monkeypatch.setattr(exact, "bmm", bi.bmm)
    test_exact.check_rows(m, True, (3, 33))


def test_exacts_blocked_weighted_sum_on_this_kernel(monkeypatch):
    """--exact's attention sum over keys (engine/exact.py weighted_sum) on this kernel: a row's
    bits do not depend on how far its keys are padded, nor on the batch beside it (on CUDA one
    call, the kernel summing k in fixed blocks from 0 up; here its blocks of 64 keys)."""
    from specctl.engine import exact
    monkeypatch.setattr(exact, "bmm", bi.bmm)
    g = torch.Generator().manual_seed(2)
    n = 70
    p = torch.exp2(-20 * torch.rand(4, 3, n, generator=g)).to(DEV, torch.bfloat16)
    v = torch.randn(4, n, 17, generator=g).to(DEV, torch.bfloat16)
    ws = exact._padded_sum
    ref = ws(p, v, 128)
    assert torch.allclose(ref.cpu(), torch.bmm(p.float(), v.float()).cpu(), rtol=3e-2, atol=3e-2)
    assert torch.equal(ws(p, v, 192), ref) and torch.equal(ws(p[:1], v[:1], 256), ref[:1])


def test_its_launches_are_counted():
    """--exact's matmuls on CUDA are Triton launches the launch counter sees (engine/launches.py):
    one a call, its interpreter's own tensor ops none."""
    from specctl.engine import launches
    a, w = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with launches.counting() as c:
        bi.bmm_nt(a, w)
    assert c.count == 1 and c.names == ["triton"], c.names
