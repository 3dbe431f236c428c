"""Direct plans against dense references and SciPy: factorization reuse, transpose/adjoint solves
in both layouts, int64 indices, zero-copy, slogdet, least squares (rank-deficient, wide), errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.format import CSC, CSR
from sparsetorch.testing.problems import convection_diffusion, hermitian_pd, poisson2d, random_rectangular, symmetric_indefinite

from sparsetorch_eigen.direct import DirectPlan


def _from_scipy(M, fmt=CSR, index_dtype=torch.int64) -> st.SparseTensor:
    coo = sp.coo_array(M)
    return st.SparseTensor.from_coo(torch.from_numpy(coo.data.copy()), torch.from_numpy(coo.row.astype(np.int64)),
                                    torch.from_numpy(coo.col.astype(np.int64)), shape=coo.shape, format=fmt)


def _rhs(n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(n, k, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        B = torch.complex(B, torch.randn(n, k, generator=g, dtype=torch.float64))
    return B.to(dtype)


PROBLEMS = {
    "cholesky": lambda dt: hermitian_pd(5, 4, dtype=dt) if dt.is_complex else poisson2d(5, 4, dtype=dt),
    "ldlt": lambda dt: hermitian_pd(5, 4, dtype=dt) if dt.is_complex else symmetric_indefinite(5, 4, dtype=dt),
    "lu": lambda dt: convection_diffusion(5, 4, dtype=dt),
    "qr": lambda dt: convection_diffusion(5, 4, dtype=dt),
}


@pytest.mark.parametrize("fmt", [CSR, CSC], ids=["csr", "csc"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["f64", "c128"])
@pytest.mark.parametrize("method", ["cholesky", "ldlt", "lu", "qr"])
def test_forward_and_adjoint_solves_match_dense(method, dtype, fmt):
    A = st.SparseTensor.from_dense(PROBLEMS[method](dtype).to_dense(), fmt)
    D = A.to_dense()
    plan = DirectPlan(A, method, {})
    plan.set_values(A.values)
    B = _rhs(A.shape[0], 3, dtype)
    X, info = plan.solve(B)
    assert info.status is st.Status.DIRECT
    torch.testing.assert_close(X, torch.linalg.solve(D, B), rtol=1e-9, atol=1e-10)
    XH, _ = plan.solve(B, adjoint=True)
    torch.testing.assert_close(XH, torch.linalg.solve(D.mH, B), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_new_values_refactor_only_and_match_scipy(index_dtype):
    A = st.SparseTensor.from_dense(poisson2d(6, 5).to_dense(), CSR, index_dtype=index_dtype)
    assert A.index_dtype == index_dtype
    plan = DirectPlan(A, "lu", {})
    b = torch.ones(A.shape[0], 1, dtype=torch.float64)
    for t in range(3):
        vals = A.values * (1 + t) + 0.1 * t
        plan.set_values(vals)
        ref = spla.spsolve(sp.csr_array(A.with_values(vals).to_dense().numpy()).tocsc(), b.numpy()[:, 0])
        np.testing.assert_allclose(plan.solve(b)[0][:, 0].numpy(), ref, rtol=1e-10)
    assert plan.factorizations == 3


def test_zero_copy_of_csr_buffers():
    A = poisson2d(6, 5)  # CSR, int64 indices
    from sparsetorch_eigen._handoff import Handoff

    h = Handoff(A)
    assert h.shares_indices and h.indptr.data_ptr() == A.pos(1).data_ptr() and h.indices.data_ptr() == A.crd(1).data_ptr()
    assert h.values(A.values).data_ptr() == A.values.data_ptr()
    h32 = Handoff(A, int32=True)  # the direct solvers narrow int64 once per pattern
    assert h32.indptr.dtype == torch.int32 and not h32.shares_indices
    assert h32.values(A.values).data_ptr() == A.values.data_ptr()  # values still in place


def test_value_batch_and_multiple_rhs():
    A = convection_diffusion(4, 4)
    Ab = A.with_values(torch.stack([A.values, 2 * A.values, A.values + 0.5]))
    plan = DirectPlan(Ab, "lu", {})
    plan.set_values(Ab.values)
    B = torch.randn(3, A.shape[0], 2, dtype=torch.float64)
    X, _ = plan.solve(B)
    torch.testing.assert_close(X, torch.linalg.solve(Ab.to_dense(), B))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["f64", "c128"])
@pytest.mark.parametrize("fmt", [CSR, CSC], ids=["csr", "csc"])
@pytest.mark.parametrize("method", ["cholesky", "ldlt", "lu"])
def test_slogdet_matches_dense(method, fmt, dtype):
    base = PROBLEMS[method](dtype)
    A = st.SparseTensor.from_dense(base.to_dense() * 1.7, fmt)
    plan = DirectPlan(A, method, {}, op="logdet")
    plan.set_values(A.values)
    sign, logabs = plan.slogdet()
    ref_sign, ref_log = torch.linalg.slogdet(A.to_dense())
    torch.testing.assert_close(logabs, ref_log, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sign, ref_sign, rtol=1e-10, atol=1e-10)


def test_slogdet_of_a_singular_matrix_is_zero_minus_inf_and_solves_raise():
    D = convection_diffusion(4, 3).to_dense()
    D[2, :] = 0
    D[:, 2] = 0
    A = st.SparseTensor.from_dense(D, CSR)
    plan = DirectPlan(A, "lu", {}, op="logdet")
    plan.set_values(A.values)
    sign, logabs = plan.slogdet()
    assert float(sign) == 0.0 and logabs.item() == -math.inf
    with pytest.raises(st.SingularMatrixError, match="singular"):
        plan.solve(torch.ones(A.shape[0], 1, dtype=torch.float64))


def test_slogdet_value_batch_and_overflow_free():
    A = poisson2d(20, 20)  # det far below the smallest double: the log is ordinary
    Ab = A.with_values(torch.stack([A.values, 3 * A.values]))
    plan = DirectPlan(Ab, "cholesky", {}, op="logdet")
    plan.set_values(Ab.values)
    sign, logabs = plan.slogdet()
    ref = torch.linalg.slogdet(Ab.to_dense())
    torch.testing.assert_close(logabs, ref.logabsdet, rtol=1e-11, atol=1e-9)
    assert torch.equal(sign, torch.ones(2, dtype=torch.float64))


@pytest.mark.skipif(not hasattr(st, "slogdet"), reason="sparsetorch.slogdet is not in this core yet")
@pytest.mark.parametrize("method", ["cholesky", "ldlt", "lu"])
def test_slogdet_through_the_core_with_gradient(eigen_backend, method):
    A = poisson2d(4, 3)
    v = A.values.detach().clone().requires_grad_()
    sign, logabs = st.slogdet(A.with_values(v), backend="eigen", method=method, properties="spd")
    ref = torch.linalg.slogdet(A.to_dense())
    torch.testing.assert_close(logabs.detach(), ref.logabsdet)
    (g,) = torch.autograd.grad(logabs, v)
    vd = A.values.detach().clone().requires_grad_()
    (gd,) = torch.autograd.grad(torch.linalg.slogdet(A.with_values(vd).to_dense()).logabsdet, vd)
    torch.testing.assert_close(g, gd, rtol=1e-8, atol=1e-10)


# --- least squares (QR) -------------------------------------------------------------------------------
def _lstsq_ref(D: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.linalg.pinv(D) @ B  # minimum-norm least squares


@pytest.mark.parametrize("shape", [(9, 5), (5, 9), (7, 7)], ids=["tall", "wide", "square"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["f64", "c128"])
@pytest.mark.parametrize("fmt", [CSR, CSC], ids=["csr", "csc"])
def test_qr_lstsq_minimum_norm(shape, dtype, fmt):
    m, n = shape
    A = random_rectangular(m, n, density=0.6, seed=3, dtype=dtype)
    A = st.SparseTensor.from_dense(A.to_dense(), fmt)
    D = A.to_dense()
    plan = DirectPlan(A, "qr", {}, op="lstsq")
    plan.set_values(A.values)
    B = _rhs(m, 2, dtype)
    X, _ = plan.lstsq(B)
    torch.testing.assert_close(X, _lstsq_ref(D, B), rtol=1e-8, atol=1e-9)
    BH = _rhs(n, 2, dtype, seed=1)
    XH, _ = plan.lstsq(BH, adjoint=True)
    torch.testing.assert_close(XH, _lstsq_ref(D.mH, BH), rtol=1e-8, atol=1e-9)


def test_qr_lstsq_rank_deficient_is_minimum_norm():
    g = torch.Generator().manual_seed(0)
    U = torch.randn(10, 3, generator=g, dtype=torch.float64)
    V = torch.randn(3, 6, generator=g, dtype=torch.float64)
    D = U @ V  # rank 3, dense pattern
    A = st.SparseTensor.from_dense(D, CSR)
    plan = DirectPlan(A, "qr", {}, op="lstsq")
    plan.set_values(A.values)
    B = torch.randn(10, 2, generator=g, dtype=torch.float64)
    X, info = plan.lstsq(B)
    assert "rank 3" in info.reason
    torch.testing.assert_close(X, _lstsq_ref(D, B), rtol=1e-7, atol=1e-8)
    XH, _ = plan.lstsq(torch.randn(6, 2, generator=g, dtype=torch.float64), adjoint=True)
    assert XH.shape == (10, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["f64", "c128"])
def test_qr_lstsq_of_a_wide_rank_deficient_matrix_factors_its_adjoint(dtype):
    """A wide A is factored as A^H (tall): SparseQR of the wide matrix and of its R's transpose took 10 s at
    50 x 20000 against 0.3 s now (session 23's sweep). Minimum-norm answers in both directions, rank 3."""
    g = torch.Generator().manual_seed(4)
    U = torch.randn(6, 3, generator=g, dtype=torch.float64).to(dtype)
    V = torch.randn(3, 11, generator=g, dtype=torch.float64).to(dtype)
    D = U @ V * (1 + 1j if dtype.is_complex else 1)
    A = st.SparseTensor.from_dense(D, CSR)
    plan = DirectPlan(A, "qr", {}, op="lstsq")
    assert plan.wide
    plan.set_values(A.values)
    B = _rhs(6, 2, dtype)
    X, info = plan.lstsq(B)
    assert "rank 3" in info.reason
    torch.testing.assert_close(X, _lstsq_ref(D, B), rtol=1e-7, atol=1e-8)
    BH = _rhs(11, 2, dtype, seed=2)
    torch.testing.assert_close(plan.lstsq(BH, adjoint=True)[0], _lstsq_ref(D.mH, BH), rtol=1e-7, atol=1e-8)


def test_lstsq_through_the_core(eigen_backend):
    lstsq = st.lstsq
    A = random_rectangular(12, 6, density=0.5, seed=2)
    B = torch.randn(12, 2, dtype=torch.float64)
    for method in ("qr", "lsqr"):
        X = lstsq(A, B, backend="eigen", method=method, atol=1e-12, btol=1e-12)
        torch.testing.assert_close(X, _lstsq_ref(A.to_dense(), B), rtol=1e-7, atol=1e-8)
    v = A.values.detach().clone().requires_grad_()
    f = lambda vals: lstsq(A.with_values(vals), B, backend="eigen", method="qr")  # noqa: E731
    assert torch.autograd.gradcheck(f, (v,), atol=1e-7)


# --- errors ---------------------------------------------------------------------------------------------
def test_cholesky_on_indefinite_raises_indefinite():
    A = symmetric_indefinite(4, 3)
    plan = DirectPlan(A, "cholesky", {})
    with pytest.raises(st.IndefiniteMatrixError, match="positive definite"):
        plan.set_values(A.values)


@pytest.mark.parametrize("method", ["lu", "ldlt", "qr"])
def test_singular_raises_singular_with_the_fix(method):
    D = poisson2d(4, 3).to_dense()
    D[3, :] = 0
    D[:, 3] = 0
    A = st.SparseTensor.from_dense(D, CSR)
    plan = DirectPlan(A, method, {})
    with pytest.raises(st.SingularMatrixError, match="singular") as info:
        plan.set_values(A.values)
    assert "lstsq" in str(info.value) or "least" in str(info.value)


def test_nearly_singular_lu_is_caught_by_the_pivot_check():
    D = torch.tensor([[1.0, 2.0, 0.0], [2.0, 4.0 + 1e-17, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    A = st.SparseTensor.from_dense(D, CSR)
    with pytest.raises(st.SingularMatrixError, match="working precision|exactly zero"):
        DirectPlan(A, "lu", {}).set_values(A.values)


def test_bad_backend_options_raise_input_error():
    A = convection_diffusion(3, 3)
    with pytest.raises(st.InputError, match="ordering"):
        DirectPlan(A, "lu", {"backend_options": {"ordering": "metis"}})


def test_threads_setting_round_trips():
    import sparsetorch_eigen

    before = sparsetorch_eigen.get_num_threads()
    sparsetorch_eigen.set_num_threads(1)
    assert sparsetorch_eigen.get_num_threads() == 1
    sparsetorch_eigen.set_num_threads(before)
    with pytest.raises(ValueError):
        sparsetorch_eigen.set_num_threads(0)
    assert sparsetorch_eigen.eigen_version().startswith("3.")


def test_extension_argument_errors_become_input_errors():
    from sparsetorch_eigen import _lib

    with pytest.raises(st.InputError, match="unknown direct method"):
        _lib.Direct(torch.float64, "svd", 2, 2, 0, 0, 0, True, 1, "amd", -1.0, False, -1.0)
    A = poisson2d(3, 3)
    plan = DirectPlan(A, "lu", {})
    with pytest.raises(st.InputError, match="before factorize"):
        _lib.call(plan._factor.solve, 0, 0, 0, 1, False)


def test_lu_ordering_follows_the_stored_diagonal():
    """A structurally symmetric pattern gets AMD and the symmetric mode only with its whole
    diagonal stored; with structural zeros there (a graph without self-loops, a saddle point)
    the pivots would leave the diagonal and the fill explode, so it gets COLAMD with partial
    pivoting, and the solve is right either way (dense NumPy reference)."""
    from sparsetorch.testing import families as fam

    plan = DirectPlan(poisson2d(12), "lu", {})
    assert plan.settings["ordering"] == "amd" and plan.settings["symmetric_mode"]
    M = fam.expander(300, degree=6, seed=2).matrix  # zero diagonal, symmetric pattern
    A = st.SparseTensor.from_package(M.copy())
    plan = DirectPlan(A, "lu", {})
    assert plan.settings["ordering"] == "colamd" and not plan.settings["symmetric_mode"]
    plan.set_values(A.values)
    b = torch.from_numpy(np.random.default_rng(0).standard_normal(300))
    x, _ = plan.solve(b.reshape(-1, 1))
    ref = np.linalg.solve(M.toarray(), b.numpy())
    assert np.allclose(x.reshape(-1).numpy(), ref, rtol=1e-8, atol=1e-10 * np.abs(ref).max())
