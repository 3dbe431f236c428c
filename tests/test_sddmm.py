"""The sampled product behind every value gradient: sddmm(A, P, Q)[k] = P[row_k] . conj(Q[col_k])."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.autograd.sddmm import sddmm
from sparsetorch.format import COO, CSC, CSR

FORMATS = {"csr": CSR, "coo": COO, "csc": CSC}


def _random(fmt: str, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(30, 30, generator=g, dtype=torch.float64)
    D[torch.rand(30, 30, generator=g) < 0.8] = 0
    D[3] = 0  # an empty row
    D = D.to(dtype)
    return st.SparseTensor.from_dense(D, format=FORMATS[fmt]), D


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("k", [1, 3])
def test_sddmm_against_dense_sampling(fmt, dtype, k) -> None:
    A, D = _random(fmt, dtype)
    g = torch.Generator().manual_seed(1)
    P = torch.randn(30, k, generator=g, dtype=torch.float64).to(dtype)
    Q = torch.randn(30, k, generator=g, dtype=torch.float64).to(dtype)
    full = P @ Q.conj().T  # every (i, j) of the product
    coords, slot = A.entries()
    expect = torch.zeros(A.values.shape[-1], dtype=dtype)
    expect[slot] = full[coords[0], coords[1]]
    torch.testing.assert_close(sddmm(A, P, Q), expect, rtol=1e-13, atol=1e-13)


def test_sddmm_csr_path_is_differentiable_twice() -> None:
    A, _ = _random("csr")
    P = torch.randn(30, 1, dtype=torch.float64, requires_grad=True)
    Q = torch.randn(30, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p, q: sddmm(A, p, q), (P, Q))
    assert torch.autograd.gradgradcheck(lambda p, q: sddmm(A, p, q), (P, Q))


@pytest.mark.parametrize("density", [0.005, 0.4], ids=["gathers", "dense-product"])
@pytest.mark.parametrize("k", [8, 40])
def test_many_columns_both_paths(density, k, monkeypatch) -> None:
    """Many columns: the dense sampled product (not too sparse) and chunked gathers (very sparse,
    chunks forced small) give the sampled product."""
    from sparsetorch.autograd import sddmm as handles

    monkeypatch.setattr(handles, "_SDDMM_CHUNK_BYTES", 8 * k * 7)  # 7 entries per chunk
    g = torch.Generator().manual_seed(2)
    D = torch.randn(120, 90, generator=g, dtype=torch.float64)
    D[torch.rand(120, 90, generator=g) > density] = 0
    A = st.SparseTensor.from_dense(D, format=CSR)
    P = torch.randn(120, k, generator=g, dtype=torch.float64, requires_grad=True)
    Q = torch.randn(90, k, generator=g, dtype=torch.float64, requires_grad=True)
    assert handles._dense_sampling(A, P, A.nse) == (density > 0.2)
    coords, slot = A.entries()
    expect = torch.zeros(A.values.shape[-1], dtype=torch.float64)
    expect[slot] = (P @ Q.T)[coords[0], coords[1]].detach()
    got = sddmm(A, P, Q)
    torch.testing.assert_close(got, expect, rtol=1e-12, atol=1e-12)
    gp, gq = torch.autograd.grad(got.sum(), (P, Q))
    M = A.with_values(torch.ones_like(A.values)).to_dense()
    torch.testing.assert_close(gp, M @ Q.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gq, M.T @ P.detach(), rtol=1e-12, atol=1e-12)
