"""The torch backend's methods that assume ``A^H == A`` (Cholesky, CG, MINRES) on matrices that are not
Hermitian: a complex symmetric A (``A == A^T``) tagged ``"symmetric"`` is declined by CG / MINRES with the
reason, and a dense Cholesky whose ``"spd"`` tag the values contradict raises NotSymmetricError naming
``method='lu'`` (it factored one triangle and the residual check called the matrix "singular").
References: dense torch.linalg.solve in float64 / complex128."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import NoBackendError, NotSymmetricError
from sparsetorch.format import CSR


def _complex_symmetric(n: int = 20, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    R = torch.randn(n, n, dtype=torch.complex128, generator=g) * (torch.rand(n, n, generator=g) < 0.3)
    D = R + R.T + torch.diag(torch.full((n,), 6.0 + 1.0j, dtype=torch.complex128))
    assert torch.equal(D, D.T) and not torch.equal(D, D.mH)
    return D


@pytest.mark.parametrize("method", ["cg", "minres"])
def test_hermitian_krylov_methods_decline_a_complex_symmetric_tag(method):
    D = _complex_symmetric()
    A = st.SparseTensor.from_dense(D, format=CSR)
    b = torch.ones(D.shape[0], dtype=torch.complex128)
    with pytest.raises(NoBackendError, match="complex symmetric A"):
        st.solve(A, b, properties="symmetric", backend="torch", method=method)
    # what the decline points to answers it
    x = st.solve(A, b, properties="symmetric", backend="torch", method="gmres")
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-8, atol=1e-10)


def test_dense_cholesky_refuses_a_complex_symmetric_matrix_tagged_spd():
    D = _complex_symmetric()
    A = st.SparseTensor.from_dense(D, format=CSR)
    b = torch.ones(D.shape[0], dtype=torch.complex128)
    with pytest.raises(NotSymmetricError, match=r"complex symmetric.*method='lu'"):
        st.solve(A, b, properties="spd", backend="torch", method="cholesky")


def test_dense_cholesky_refuses_a_real_nonsymmetric_matrix_tagged_spd():
    g = torch.Generator().manual_seed(1)
    n = 12
    D = torch.randn(n, n, dtype=torch.float64, generator=g) + 10 * torch.eye(n, dtype=torch.float64)
    A = st.SparseTensor.from_dense(D, format=CSR)
    with pytest.raises(NotSymmetricError, match="not symmetric"):
        st.solve(A, torch.ones(n, dtype=torch.float64), properties="spd", backend="torch", method="cholesky")


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_dense_cholesky_of_a_hermitian_matrix_with_assembly_rounding_is_taken(dtype):
    g = torch.Generator().manual_seed(2)
    n = 16
    R = torch.randn(n, n, dtype=dtype, generator=g)
    H = R @ R.mH + n * torch.eye(n, dtype=dtype)
    H = H + 1e-15 * torch.triu(torch.randn(n, n, dtype=dtype, generator=g), 1)  # rounding-level asymmetry
    b = torch.randn(n, dtype=dtype, generator=g)
    x = st.solve(st.SparseTensor.from_dense(H, format=CSR), b, properties="spd", backend="torch", method="cholesky")
    torch.testing.assert_close(x, torch.linalg.solve(H, b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kw", [{}, dict(method="cholesky"), dict(backend="torch", method="cholesky")],
                         ids=["default", "cholesky", "torch-cholesky"])
def test_single_precision_assembly_asymmetry_is_not_refused(kw):
    # an SPD matrix whose mirrored entries differ by float32 rounding (~1e-7 relative), tagged spd and solved in
    # float64: the Cholesky of one triangle plus refinement answers it (a sqrt(eps) bound raised NotSymmetricError)
    g = torch.Generator().manual_seed(0)
    n = 40
    R = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.2)
    S = R @ R.T + n * torch.eye(n, dtype=torch.float64)
    P = S + (S * 3e-8 * torch.randn(n, n, generator=g, dtype=torch.float64)) * (S != 0)
    assert ((P - P.T).abs() / P.abs().clamp_min(1e-300)).max() > 1e-8
    b = torch.ones(n, dtype=torch.float64)
    x = st.solve(st.SparseTensor.from_dense(P, format=CSR), b, properties="spd", **kw)
    torch.testing.assert_close(x, torch.linalg.solve(P, b), rtol=1e-12, atol=1e-14)


def test_pinned_torch_cholesky_takes_an_spd_matrix_detection_misses():
    """Session 28's sweep: M M^T (+ a small shift; not diagonally dominant, so SPD is not detected) was
    refused by a pinned torch/cholesky that eigen's and torch CG's pins accept; an indefinite symmetric A
    gets IndefiniteMatrixError, a non-symmetric one a decline that says to pass properties='spd'."""
    g = torch.Generator().manual_seed(0)
    M = torch.randn(30, 30, dtype=torch.float64, generator=g)
    D = M @ M.T + 1e-3 * torch.eye(30, dtype=torch.float64)
    b = torch.randn(30, dtype=torch.float64, generator=g)
    x = st.solve(st.SparseTensor.from_dense(D), b, backend="torch", method="cholesky")
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-10, atol=0)
    S = torch.randn(30, 30, dtype=torch.float64, generator=g)
    with pytest.raises(st.IndefiniteMatrixError):
        st.solve(st.SparseTensor.from_dense(S + S.T), b, backend="torch", method="cholesky")
    with pytest.raises(st.NoBackendError, match="properties='spd'"):
        st.solve(st.SparseTensor.from_dense(S), b, backend="torch", method="cholesky")
