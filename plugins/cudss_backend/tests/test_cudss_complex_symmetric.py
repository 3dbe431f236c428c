"""cuDSS's LDL^T on complex matrices, on a GPU: a complex *symmetric* A (A == A^T, not Hermitian) is
factored with cuDSS's SYMMETRIC type and a Hermitian one with HERMITIAN; both must give the dense
answer, in the forward solve and in the adjoint (the backward solves with A^H: for a complex
symmetric A that is conj(A), done by conjugating the right-hand side). Session 27 let the plugin
offer ``ldlt`` for any symmetry tag on complex values; these tests check that on the device.
Skips without CUDA and libcudss."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from _cudss_helpers import gpu
from test_cudss_gpu import registered  # noqa: F401 - the autouse fixture registering the plugin

pytestmark = gpu


def _pattern_matrix(n: int, hermitian: bool, dtype: torch.dtype, seed: int = 3):
    """A sparse, well-conditioned, indefinite complex matrix, symmetric (A == A^T) or Hermitian."""
    g = torch.Generator().manual_seed(seed)
    R = torch.randn(n, n, dtype=torch.complex128, generator=g)
    mask = torch.rand(n, n, generator=g) < 0.15
    mask = mask | mask.T
    S = torch.where(mask, R + (R.mH if hermitian else R.T), 0)
    shift = torch.linspace(-8.0, 8.0, n, dtype=torch.float64)  # indefinite diagonal, away from zero
    shift = torch.where(shift.abs() < 2, torch.sign(shift + 1e-3) * 2, shift)
    D = S + torch.diag(shift.to(torch.complex128) * (S.abs().sum(-1).max() / 4 + 1))
    D = D.to(dtype)
    A = st.SparseTensor.from_dense(D.cuda(), "CSR")
    return D.to(torch.complex128), A


def _tol(dtype):
    return 1e-10 if dtype == torch.complex128 else 2e-4


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("hermitian", [False, True], ids=["symmetric", "hermitian"])
def test_pinned_ldlt_matches_dense(hermitian, dtype):
    D, A = _pattern_matrix(60, hermitian, dtype)
    b = torch.randn(60, 3, dtype=dtype, generator=torch.Generator().manual_seed(1)).cuda()
    x = st.solve(A, b, backend="cudss", method="ldlt", properties="hermitian" if hermitian else "symmetric")
    ref = torch.linalg.solve(D, b.cpu().to(torch.complex128))
    err = (x.cpu().to(torch.complex128) - ref).norm() / ref.norm()
    assert err < _tol(dtype), f"relative error {err:.3g}"


@pytest.mark.parametrize("hermitian", [False, True], ids=["symmetric", "hermitian"])
def test_default_solve_on_the_gpu_matches_dense(hermitian):
    D, A = _pattern_matrix(80, hermitian, torch.complex128, seed=5)
    b = torch.randn(80, dtype=torch.complex128, generator=torch.Generator().manual_seed(2)).cuda()
    x = st.solve(A, b)
    ref = torch.linalg.solve(D, b.cpu())
    assert (x.cpu() - ref).norm() / ref.norm() < 1e-10


@pytest.mark.parametrize("hermitian", [False, True], ids=["symmetric", "hermitian"])
def test_ldlt_gradients_match_dense_autograd(hermitian):
    D, A = _pattern_matrix(30, hermitian, torch.complex128, seed=7)
    b0 = torch.randn(30, dtype=torch.complex128, generator=torch.Generator().manual_seed(4))
    w = torch.randn(30, dtype=torch.complex128, generator=torch.Generator().manual_seed(6))
    values = A.values.detach().clone().requires_grad_(True)
    b = b0.clone().cuda().requires_grad_(True)
    x = st.solve(A.with_values(values), b, backend="cudss", method="ldlt",
                 properties="hermitian" if hermitian else "symmetric")
    (x * w.cuda()).sum().real.backward()

    Dd = D.clone().requires_grad_(True)
    bd = b0.clone().requires_grad_(True)
    (torch.linalg.solve(Dd, bd) * w).sum().real.backward()
    rows, cols = A.coordinates()[0]
    ref_values_grad = Dd.grad[rows.cpu(), cols.cpu()]
    torch.testing.assert_close(b.grad.cpu(), bd.grad, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(values.grad.cpu(), ref_values_grad, rtol=1e-9, atol=1e-11)

