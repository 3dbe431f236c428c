"""Edge inputs found by session 19's outside sweep: matrices with no stored entries through every
product path, non-finite and far-away eigsh shifts, shapes that are not non-negative integers,
scalars that are not numbers (or complex against real operands), non-array values, contradictory
property tags, dense forms too large to index."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.format import COO, CSC, CSR

F64 = torch.float64
SCIPY = importlib.util.find_spec("sparsetorch_scipy") is not None
needs_scipy = pytest.mark.skipif(not SCIPY, reason="the SciPy plugin (plugins/scipy_backend) is not installed")


@pytest.fixture
def empty():
    return st.SparseTensor.from_dense(torch.zeros(3, 3, dtype=F64))


@pytest.mark.parametrize("case", ["T@x", "csc@x", "coo@x", "x@A", pytest.param("scipy", marks=needs_scipy), "weight"])
def test_products_of_a_matrix_with_no_entries_are_zero(empty, case):
    x = torch.arange(1.0, 4.0, dtype=F64)
    assert empty.nse == 0
    y = {
        "T@x": lambda: empty.T @ x,
        "csc@x": lambda: empty.convert(CSC) @ x,
        "coo@x": lambda: empty.convert(COO) @ x,
        "x@A": lambda: x @ empty,
        "scipy": lambda: st.matmul(empty, x, backend="scipy"),
        "weight": lambda: st.nn.SparseWeight(empty).T @ x,
    }[case]()
    assert torch.equal(y, torch.zeros(3, dtype=F64))
    # a rectangular one and several columns
    R = st.SparseTensor.from_dense(torch.zeros(4, 2, dtype=F64))
    assert torch.equal(st.matmul(R, torch.ones(2, 3, dtype=F64), backend="scipy" if SCIPY else None), torch.zeros(4, 3, dtype=F64))


@pytest.mark.parametrize("method", [None, pytest.param("arpack", marks=needs_scipy)])
def test_eigsh_of_the_zero_matrix(empty, method):
    w, V = st.eigsh(empty, 2, method=method)
    assert torch.equal(w, torch.zeros(2, dtype=F64))
    torch.testing.assert_close(V.T @ V, torch.eye(2, dtype=F64))


def _laplacian(n=16):
    D = 2 * torch.eye(n, dtype=F64) - torch.diag(torch.ones(n - 1, dtype=F64), 1) - torch.diag(torch.ones(n - 1, dtype=F64), -1)
    return D, st.SparseTensor.from_dense(D)


@pytest.mark.parametrize("sigma", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("method", [None, "lanczos", pytest.param("arpack", marks=needs_scipy)])
def test_eigsh_refuses_a_non_finite_shift(sigma, method):
    _, A = _laplacian()
    with pytest.raises(st.InputError, match="sigma must be finite"):
        st.eigsh(A, 2, sigma=sigma, method=method)


def test_eigs_refuses_a_non_finite_shift():
    _, A = _laplacian()
    with pytest.raises(st.InputError, match="sigma must be a finite number"):
        st.eigs(A, 2, sigma=complex(float("nan"), 0))


@pytest.mark.parametrize("sigma", [100.0, 1e300, -1e300])
def test_eigsh_far_shift_gives_the_nearest_end_of_the_spectrum(sigma):
    D, A = _laplacian()
    ev = torch.linalg.eigvalsh(D)
    w, _ = st.eigsh(A, 2, sigma=sigma)
    want = ev[-2:] if sigma > 0 else ev[:2]
    torch.testing.assert_close(w, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, -3), (3.5, 3), (3, None), ("3", 3)])
def test_shapes_must_be_non_negative_integers(shape):
    e = torch.zeros(0, dtype=torch.long)
    with pytest.raises(st.ValidationError, match="shape"):
        st.SparseTensor.from_coo(torch.zeros(0, dtype=F64), e, e, shape=shape, format=CSR)


def test_integer_like_shapes_are_accepted():
    i = torch.tensor([0, 2])
    for shape in [(np.int64(3), np.int32(4)), (torch.tensor(3), 4), torch.Size([3, 4])]:
        A = st.SparseTensor.from_coo(torch.ones(2, dtype=F64), i, i, shape=shape, format=CSR)
        assert tuple(A.shape) == (3, 4) and all(type(s) is int for s in A.shape)


def test_from_coo_names_values_that_are_not_numbers():
    with pytest.raises(st.ValidationError, match="values must be a tensor"):
        st.SparseTensor.from_coo(None, torch.tensor([0]), torch.tensor([0]), shape=(3, 3), format=CSR)
    with pytest.raises(st.ValidationError, match="index array 1"):
        st.SparseTensor.from_coo(torch.ones(1, dtype=F64), torch.tensor([0]), None, shape=(3, 3), format=CSR)


@pytest.mark.parametrize("kw", [{"alpha": "2"}, {"alpha": True}, {"alpha": [2.0]}])
def test_matmul_scalars_must_be_numbers(kw):
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=F64))
    with pytest.raises(st.InputError, match="must be a number"):
        st.matmul(A, torch.ones(3, dtype=F64), **kw)


def test_complex_scalars_need_complex_operands():
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=F64))
    with pytest.raises(st.InputError, match="complex"):
        st.matmul(A, torch.ones(3, dtype=F64), alpha=1j)
    # a complex number with no imaginary part is the real number
    torch.testing.assert_close(st.matmul(A, torch.ones(3, dtype=F64), alpha=complex(3, 0)), torch.full((3,), 6.0, dtype=F64))
    Ac = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=torch.complex128))
    torch.testing.assert_close(st.matmul(Ac, torch.ones(3, dtype=torch.complex128), alpha=1j),
                               torch.full((3,), 2j, dtype=torch.complex128))


def test_contradictory_properties_are_refused():
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=F64))
    for props in (["spd", "general"], ["symmetric", "nonsymmetric"]):
        with pytest.raises(st.InputError, match="contradict"):
            st.solve(A, torch.ones(3, dtype=F64), properties=props)


def test_to_dense_beyond_what_a_tensor_can_index():
    H = st.SparseTensor.from_coo(torch.ones(1, dtype=F64), torch.tensor([0]), torch.tensor([0]), shape=(10**12, 10**12),
                                 format=COO)
    with pytest.raises(st.InputError, match="to_dense"):
        H.to_dense()


def test_solve_broadcasts_an_unbatched_rhs_over_a_value_batch():
    D = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=F64)
    dense = torch.stack([D, 2 * D + torch.eye(3, dtype=F64)])
    A = st.SparseTensor.from_dense(dense)
    assert tuple(A.batch_shape) == (2,)
    for b in (torch.tensor([1.0, -2.0, 0.5], dtype=F64), torch.randn(3, 2, dtype=F64)):
        x = st.solve(A, b)
        torch.testing.assert_close(x, torch.linalg.solve(dense, b if b.dim() == 2 else b.expand(2, 3)), rtol=1e-12, atol=1e-12)

    def f(vals, b):
        return st.solve(A.with_values(vals), b)

    vals = A.values.detach().clone().requires_grad_()
    b = torch.tensor([1.0, -2.0, 0.5], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (vals, b))


def test_a_solution_that_overflows_the_dtype_says_so():
    import scipy.sparse as sp

    A = sp.diags([-np.ones(99), 2 * np.ones(100), -np.ones(99)], [-1, 0, 1], format="csr") * 1e-150
    with pytest.raises(st.NotConvergedError, match="does not fit in torch.float64") as exc:
        st.solve(st.from_package(A), torch.full((100,), 1e200, dtype=F64))
    assert "maxiter" not in str(exc.value)  # no advice about iterations: the scale is the problem


# backend_options keys (session 20) ------------------------------------------------------------------
def _small_system():
    A = st.SparseTensor.from_dense(torch.eye(4, dtype=torch.float64) * 3 + torch.diag(torch.ones(3, dtype=torch.float64), 1))
    return A, torch.ones(4, dtype=torch.float64)


def test_a_misspelled_backend_option_is_named_with_a_suggestion():
    A, b = _small_system()
    with pytest.raises(st.InputError, match=r"'cuda_grahp' \(did you mean 'cuda_graph'\?\).*not read by any loaded backend"):
        st.solve(A, b, backend_options={"cuda_grahp": False})
    with pytest.raises(st.InputError, match="would have no effect"):
        st.Solver(A, backend_options={"zzz_unknown": 1})
    with pytest.raises(st.InputError, match="not read by"):
        st.explain("solve", A, b, backend_options={"zzz_unknown": 1})


def test_a_backend_option_of_another_backend_is_refused_when_one_is_pinned():
    from sparsetorch.dispatch.select import get_backends

    names = {i.name for i in get_backends().info()}
    A, b = _small_system()
    x = st.solve(A, b, backend="torch", backend_options={"cuda_graph": False, "dimension": 2})  # torch's own, the core's
    torch.testing.assert_close(A.to_dense() @ x, b)
    if "scipy" in names:
        with pytest.raises(st.InputError, match="not read by backend 'torch'"):
            st.solve(A, b, backend="torch", backend_options={"permc_spec": "COLAMD"})
        x = st.solve(A, b, backend="scipy", method="lu", backend_options={"permc_spec": "COLAMD"})
        torch.testing.assert_close(A.to_dense() @ x, b)


def test_undeclared_backend_options_are_not_checked():
    # a third-party backend that does not declare its keys (BackendInfo.options None) could read any key
    from sparsetorch import BackendInfo, hookimpl
    from sparsetorch.dispatch.select import check_backend_options, get_backends

    class Quiet:
        @hookimpl
        def sparsetorch_backend_info(self):
            return BackendInfo(name="quiet_s20", version="0", description="declares no options", devices=("cpu",),
                               dtypes=(torch.float64,), ops={})

        @hookimpl
        def sparsetorch_offers(self, request):
            return []

    backends = get_backends()
    backends.register(Quiet(), "quiet_s20")
    try:
        check_backend_options(backends, {"anything_at_all": 1}, None)
        with pytest.raises(st.InputError):
            check_backend_options(backends, {"anything_at_all": 1}, "torch")
    finally:
        backends.unregister("quiet_s20")
    with pytest.raises(ValueError, match="options must be a tuple"):
        BackendInfo(name="bad", version="0", description="", devices=("cpu",), dtypes=(torch.float64,), ops={},
                    options="cuda_graph")


# empty products (session 20's outside sweep) ----------------------------------------------------------
@pytest.mark.parametrize("fmt", ["CSR", "CSC", "COO", "BSR", "DIA", "ELL"])
def test_gradients_of_an_empty_product_are_zeros(fmt):
    # an empty mini-batch (X with 0 columns) and a matrix with no rows: the backward crashed in the
    # sampled product ("index 0 is out of bounds"); the gradient of a sum over nothing is zero
    import sparsetorch.format as F

    form = F.BSR(1, 1) if fmt == "BSR" else getattr(F, fmt)
    D = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    A = st.SparseTensor.from_dense(D).convert(form)
    v = A.values.detach().clone().requires_grad_(True)
    X = torch.zeros(3, 0, dtype=torch.float64, requires_grad=True)
    Y = A.with_values(v) @ X
    assert Y.shape == (2, 0)
    Y.sum().backward()
    assert v.grad is not None and float(v.grad.abs().sum()) == 0.0 and X.grad.shape == (3, 0)
    A0 = st.SparseTensor.from_dense(torch.zeros(0, 3, dtype=torch.float64)).convert(form)
    v0 = A0.values.detach().clone().requires_grad_(True)
    X0 = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    (A0.with_values(v0) @ X0).sum().backward()
    assert X0.grad is not None and torch.equal(X0.grad, torch.zeros(3, 2, dtype=torch.float64))


def test_a_sparse_layer_trains_on_an_empty_batch():
    lin = torch.nn.Linear(3, 2).double()
    layer = st.nn.SparseLinear.from_linear(lin)
    out = layer(torch.zeros(0, 3, dtype=torch.float64))
    assert out.shape == (0, 2)
    out.sum().backward()
    assert float(layer.values.grad.abs().sum()) == 0.0


@pytest.mark.skipif(importlib.util.find_spec("sparsetorch_scipy") is None, reason="needs the SciPy plugin")
@pytest.mark.parametrize("case", ["csc_no_columns", "vector", "x_at_empty_csr", "empty_csr_transposed"])
def test_scipy_products_with_an_empty_dimension(case):
    from sparsetorch.format import CSC, CSR

    z = torch.zeros
    if case == "csc_no_columns":
        got, want = st.matmul(st.SparseTensor.from_dense(z(4, 0, dtype=torch.float64), format=CSC),
                              z(0, 3, dtype=torch.float64), backend="scipy"), z(4, 3, dtype=torch.float64)
    elif case == "vector":
        got, want = st.matmul(st.SparseTensor.from_dense(z(4, 0, dtype=torch.float64), format=CSC),
                              z(0, dtype=torch.float64), backend="scipy"), z(4, dtype=torch.float64)
    elif case == "x_at_empty_csr":
        got = z(3, 0, dtype=torch.float64) @ st.SparseTensor.from_dense(z(0, 4, dtype=torch.float64), format=CSR)
        want = z(3, 4, dtype=torch.float64)
    else:
        got = st.matmul(st.SparseTensor.from_dense(z(0, 4, dtype=torch.float64), format=CSR).T, z(0, 2, dtype=torch.float64),
                        backend="scipy")
        want = z(4, 2, dtype=torch.float64)
    assert got.shape == want.shape and torch.equal(got, want)


# lstsq hands over to a direct method (session 20's outside sweep) -------------------------------------
def _column_scaled(seed=1):
    import scipy.sparse as sp

    M = (sp.random(300, 50, density=0.1, random_state=seed) + sp.eye(300, 50)).toarray() * np.logspace(-2, 2, 50)
    return M


@pytest.mark.skipif(importlib.util.find_spec("sparsetorch_eigen") is None, reason="needs the Eigen plugin (its QR)")
def test_lstsq_falls_back_to_qr_when_the_krylov_method_stalls():
    # a full-rank 300 x 50 problem with columns in other units (cond 1.1e4): LSQR / LSMR stop at maxiter;
    # the default call used to raise although a QR was in the ranking (the direct method that answers: Eigen's
    # sparse QR or the torch backend's dense SVD, whichever ranks first)
    import scipy.sparse as sp

    M = _column_scaled()
    b = np.random.default_rng(0).standard_normal(300)
    xr = np.linalg.lstsq(M, b, rcond=None)[0]
    A = st.from_package(sp.csr_array(M))
    x, info = st.lstsq(A, torch.from_numpy(b), return_info=True)
    assert np.linalg.norm(x.numpy() - xr) <= 1e-10 * np.linalg.norm(xr)
    assert info.method in ("qr", "dense") and info.converged and info.attempts
    ls = st.Lstsq(A)
    x2 = ls.solve(torch.from_numpy(b))
    assert np.linalg.norm(x2.numpy() - xr) <= 1e-10 * np.linalg.norm(xr) and ls.method in ("qr", "dense")
    # gradients through the plan that answered (the dense reference: the normal equations' solution)
    Bt = torch.from_numpy(b).requires_grad_(True)
    st.lstsq(A, Bt).sum().backward()
    Md = torch.from_numpy(M)
    Br = torch.from_numpy(b).requires_grad_(True)
    torch.linalg.lstsq(Md, Br.unsqueeze(-1)).solution.sum().backward()
    torch.testing.assert_close(Bt.grad, Br.grad, rtol=1e-8, atol=1e-10)
    # a pinned method keeps its meaning: it raises, naming the residual test it stops on
    with pytest.raises(st.NotConvergedError, match=r"A\^H r"):
        st.lstsq(A, torch.from_numpy(b), method="lsqr")


def test_a_singular_member_of_a_sparse_tensor_list_is_named():
    mats = [torch.eye(5, dtype=torch.float64) * 2, torch.ones(2, 2, dtype=torch.float64), torch.eye(3, dtype=torch.float64)]
    L = st.SparseTensorList([st.SparseTensor.from_dense(m) for m in mats])
    bs = [torch.ones(5, dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64), torch.ones(3, dtype=torch.float64)]
    with pytest.raises(st.SingularMatrixError, match="SparseTensorList member 1 of 3"):
        st.solve(L, bs)


@pytest.mark.parametrize("case", ["ash219", "ash219T", "random_overdetermined"])
def test_default_lstsq_reaches_a_direct_methods_accuracy(case):
    # LSQR / LSMR stopped by the contract's atol / btol left 1e-9 .. 1e-7 of relative error where a QR
    # gives 1e-13 (session 20's sweep); a call with no tolerance refines to a backward-stable level
    import os

    import scipy.io
    import scipy.sparse as sp

    if case.startswith("ash219"):
        M = sp.csr_matrix(scipy.io.mmread(os.path.join(os.path.dirname(__file__), "data", "ash219.mtx"))).astype(np.float64)
        M = M.T.tocsr() if case.endswith("T") else M
    else:
        M = (sp.random(1500, 200, density=0.02, random_state=1) + sp.eye(1500, 200)).tocsr()
    b = np.random.default_rng(0).standard_normal(M.shape[0])
    xr = np.linalg.lstsq(M.toarray(), b, rcond=None)[0]
    A = st.from_package(M)
    x = st.lstsq(A, torch.from_numpy(b)).numpy()
    assert np.linalg.norm(x - xr) <= 1e-11 * np.linalg.norm(xr)
    # an explicit tolerance keeps its meaning (LSQR's own stopping rule; pinned: a second call on the same values
    # may be answered by a QR factorization, which dispatch spreads over such calls)
    x6 = st.lstsq(A, torch.from_numpy(b), atol=1e-6, btol=1e-6, method="lsqr").numpy()
    assert np.linalg.norm(x6 - xr) > 1e-11 * np.linalg.norm(xr)


@pytest.mark.skipif(importlib.util.find_spec("sparsetorch_scipy") is None, reason="needs the SciPy plugin (ARPACK)")
def test_eigs_with_a_complex_shift_on_a_real_matrix_returns_the_nearest_eigenvalues():
    # ARPACK's real mode cannot tell sigma from conj(sigma): an eigenvalue near conj(sigma) came back in
    # place of the third nearest (session 20's sweep); the shift-invert now runs in complex arithmetic
    import scipy.sparse as sp

    n = 300
    rng = np.random.default_rng(3)
    M = (sp.random(n, n, density=5.0 / n, random_state=5) + sp.diags(rng.standard_normal(n))).tocsr()
    sigma = 0.5 + 0.5j
    wall = np.linalg.eigvals(M.toarray())
    ref = np.sort(np.abs(wall - sigma))[:3]
    w, V = st.eigs(st.from_package(M), 3, sigma=sigma, method="arpack")
    got = np.sort(np.abs(w.numpy() - sigma))
    np.testing.assert_allclose(got, ref, rtol=1e-8)
    Vn = V.numpy()
    assert np.linalg.norm(M @ Vn - Vn * w.numpy(), axis=0).max() <= 1e-10


def test_torch_matmul_of_a_sparse_weight_broadcasts_over_a_batched_operand():
    # torch.matmul(W, X) with W 2-D and X (b, n, k) broadcasts W, as st.matmul(A, X) does; it raised
    D = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    A = st.SparseTensor.from_dense(D)
    v = A.values.detach().clone().requires_grad_(True)
    W = st.nn.SparseWeight(A.with_values(v))
    X = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    Y = torch.matmul(W, X)
    torch.testing.assert_close(Y, D @ X.detach())
    Y.square().sum().backward()
    Dr = D.clone().requires_grad_(True)
    Xr = X.detach().clone().requires_grad_(True)
    (Dr @ Xr).square().sum().backward()
    torch.testing.assert_close(X.grad, Xr.grad)
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad, torch.zeros_like(v).index_put_((slot,), Dr.grad[coords[0], coords[1]]))


def test_lstsq_info_counts_the_refinement():
    import os

    import scipy.io
    import scipy.sparse as sp

    M = sp.csr_matrix(scipy.io.mmread(os.path.join(os.path.dirname(__file__), "data", "ash219.mtx"))).astype(np.float64)
    b = torch.from_numpy(np.random.default_rng(0).standard_normal(M.shape[0]))
    _, first = st.lstsq(st.from_package(M), b, return_info=True, atol=1e-10, btol=1e-10)
    _, info = st.lstsq(st.from_package(M), b, return_info=True)
    if info.method in ("lsqr", "lsmr"):
        assert info.iterations > first.iterations and "refinement" in info.reason


def test_rectangular_matrix_errors_point_to_lstsq():
    R = st.SparseTensor.from_dense(torch.tensor([[1., 2, 0, 0, 1], [0, 1, 3, 0, 0], [1, 0, 0, 4, 0]], dtype=torch.float64))
    b = torch.ones(3, dtype=torch.float64)
    with pytest.raises(InputError, match=r"3x5; for least squares use sparsetorch.lstsq\(A, b\)"):
        st.solve(R, b, method="lsqr")
    with pytest.raises(InputError, match=r"Lstsq\(A\)"):
        st.Solver(R)
    with pytest.raises(InputError, match=r"slogdet needs a square matrix, got 3x5$"):
        st.slogdet(R)


@pytest.mark.parametrize("dtype", [torch.complex32, torch.float8_e4m3fn])
def test_storable_but_not_computable_dtypes_are_named(dtype):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: ComplexHalf support is experimental
        S = st.SparseTensor.from_dense((2 * torch.eye(3)).to(dtype))
    for call in (lambda: st.solve(S, torch.ones(3).to(dtype)), lambda: st.slogdet(S)):
        with pytest.raises(InputError, match=f"{dtype}, which no operation supports"):
            call()


def test_solver_checks_non_finite_inputs_like_solve():
    A = st.SparseTensor.from_dense(torch.tensor([[4., -1, 0], [-1, 4, -1], [0, -1, 4]], dtype=torch.float64))
    ones = torch.ones(3, dtype=torch.float64)
    with pytest.raises(InputError, match="right-hand side contains NaN"):
        st.Solver(A).solve(torch.tensor([1., float("nan"), 1.], dtype=torch.float64))
    nan_values = torch.full_like(A.values, float("nan"))
    with pytest.raises(InputError, match="values contain NaN"):
        st.Solver(A).update_values(nan_values).solve(ones)
    s = st.Solver(A)
    x = s.solve(ones)
    torch.testing.assert_close(A.to_dense() @ x, ones)
    with pytest.raises(InputError, match="values contain NaN"):
        s.update_values(nan_values)  # a planned Solver checks before it factorizes
    x = st.Solver(A, check_finite=False).solve(ones)
    torch.testing.assert_close(A.to_dense() @ x, ones)


@pytest.mark.parametrize("method", ["lu", "cg", "cholesky", None])
def test_solver_names_non_finite_values_before_planning(method):
    """A Solver whose first solve plans and factorizes named NaN values only after planning (dispatch and the
    pinned method met them first: "CG needs a symmetric positive definite matrix", a zero pivot; session 26's
    sweep): now plan() and factorize() check the values first."""
    A = st.SparseTensor.from_dense(torch.tensor([[4., -1, 0], [-1, 4, -1], [0, -1, 4]], dtype=torch.float64))
    v = A.values.clone()
    v[0] = float("nan")
    ones = torch.ones(3, dtype=torch.float64)
    with pytest.raises(InputError, match="values contain NaN or Inf"):
        st.Solver(A.with_values(v), method=method).solve(ones)
    with pytest.raises(InputError, match="values contain NaN or Inf"):
        st.Solver(A.with_values(v), method=method).factorize()
    with pytest.raises(InputError, match="values contain NaN or Inf"):
        st.Solver(A, method=method).update_values(v).solve(ones)
    x = st.Solver(A, method=method).solve(ones)
    torch.testing.assert_close(A.to_dense() @ x, ones)


def test_unknown_method_or_backend_is_named_at_solver_construction():
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=torch.float64))
    with pytest.raises(InputError, match=r"method 'cgg' is not a solve method.*did you mean 'cg'"):
        st.Solver(A, method="cgg")
    with pytest.raises(InputError, match=r"'lsqr'.*method of lstsq: use sparsetorch.lstsq"):
        st.Solver(A, method="lsqr")
    with pytest.raises(st.NoBackendError, match="backend='nope' is not loaded"):
        st.Solver(A, backend="nope")
    with pytest.raises(st.NoBackendError, match=r"method 'cgg' is not a solve method.*did you mean 'cg'"):
        st.solve(A, torch.ones(3, dtype=torch.float64), method="cgg")


@pytest.mark.parametrize("case", ["lp_e226", "lp_e226T", "impcol_a", "ash219"])
def test_default_float32_lstsq_is_solved_in_float64(case):
    # LSQR / CGLS in float32 left lp_e226's minimum-norm solution 10 % off and impcol_a raised
    # NotConvergedError (a float32 QR misjudged its rank); a default float32 call now runs in float64 and
    # rounds back (session 22's sweep). Reference: NumPy's dense lstsq in float64 on the same (float32) data.
    import os

    import scipy.io
    import scipy.sparse as sp

    name = case.rstrip("T")
    M = sp.csr_matrix(scipy.io.mmread(os.path.join(os.path.dirname(__file__), "data", f"{name}.mtx"))).astype(np.float32)
    M = M.T.tocsr() if case.endswith("T") else M
    b = np.random.default_rng(0).standard_normal(M.shape[0]).astype(np.float32)
    xr = np.linalg.lstsq(M.toarray().astype(np.float64), b.astype(np.float64), rcond=None)[0]
    A = st.from_package(M)
    x, info = st.lstsq(A, torch.from_numpy(b), return_info=True)
    assert x.dtype == torch.float32
    assert np.linalg.norm(x.numpy().astype(np.float64) - xr) <= 1e-5 * np.linalg.norm(xr)
    assert "solved in float64" in info.reason
    # explain shows the call that runs (the float64 problem)
    assert st.explain("lstsq", A, torch.from_numpy(b)).request.A.dtype == torch.float64
    # a pinned method runs in float32 (its own stopping rule and precision)
    _, pinned = st.lstsq(A, torch.from_numpy(b), method="lsqr", return_info=True, on_nonconvergence="ignore")
    assert "solved in float64" not in pinned.reason


def test_default_float32_lstsq_gradients_follow_the_float64_solve():
    import scipy.sparse as sp

    M = (sp.random(60, 25, density=0.2, random_state=3) + sp.eye(60, 25)).tocsr().astype(np.float32)
    A = st.from_package(M)
    v = A.values.clone().requires_grad_(True)
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(60).astype(np.float32)).requires_grad_(True)
    x = st.lstsq(A.with_values(v), b)
    x.sum().backward()
    v64 = A.values.double().clone().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True)
    x64 = st.lstsq(A.to(torch.float64).with_values(v64), b64)
    x64.sum().backward()
    assert v.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    torch.testing.assert_close(v.grad.double(), v64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-5, atol=1e-6)


def test_a_default_float32_lstsq_object_works_in_float64_too():
    # the Lstsq object ran in float32 (2.7e-5 relative error where lstsq gave 2.7e-8; session 22's sweep)
    import os

    import scipy.io
    import scipy.sparse as sp

    M = sp.csr_matrix(scipy.io.mmread(os.path.join(os.path.dirname(__file__), "data", "lp_e226.mtx"))).astype(np.float32)
    b = np.random.default_rng(0).standard_normal(M.shape[0]).astype(np.float32)
    xr = np.linalg.lstsq(M.toarray().astype(np.float64), b.astype(np.float64), rcond=None)[0]
    A = st.from_package(M)
    ls = st.Lstsq(A)
    x, info = ls.solve(torch.from_numpy(b), return_info=True)
    assert x.dtype == torch.float32 and "solved in float64" in info.reason
    assert np.linalg.norm(x.numpy().astype(np.float64) - xr) <= 1e-5 * np.linalg.norm(xr)
    # new values (float32) through the same object
    ls.update_values(2 * A.values)
    x2 = ls.solve(torch.from_numpy(b))
    assert x2.dtype == torch.float32
    assert np.linalg.norm(x2.numpy().astype(np.float64) - xr / 2) <= 1e-5 * np.linalg.norm(xr / 2)
    # gradients through the casts (the overdetermined transpose: full column rank)
    T = st.from_package(M.T.tocsr())
    v = T.values.clone().requires_grad_(True)
    bt = torch.from_numpy(np.random.default_rng(1).standard_normal(M.shape[1]).astype(np.float32))
    lt = st.Lstsq(T)
    lt.update_values(v)
    lt.solve(bt).sum().backward()
    v64 = T.values.double().clone().requires_grad_(True)
    st.lstsq(T.to(torch.float64).with_values(v64), bt.double()).sum().backward()
    assert v.grad.dtype == torch.float32
    torch.testing.assert_close(v.grad.double(), v64.grad, rtol=1e-4, atol=1e-5)
    # a pinned method keeps float32
    _, pinned = st.Lstsq(A, method="lsqr", on_nonconvergence="ignore").solve(torch.from_numpy(b), return_info=True)
    assert "solved in float64" not in pinned.reason


def test_from_coo_refuses_the_shape_as_a_positional_index_array():
    """torch-sla's SparseTensor(values, row, col, shape) order: from_coo read the shape as a third index array and
    built a 3-D tensor in silence when nnz equalled its length (session 26's sweep)."""
    v = torch.tensor([2.0, 3.0], dtype=torch.float64)
    r = c = torch.tensor([0, 1])
    for shape in ((2, 2), torch.Size([2, 2])):
        with pytest.raises(st.ValidationError, match=r"looks like the shape; pass it as shape=\(2, 2\)"):
            st.SparseTensor.from_coo(v, r, c, shape)
    assert st.SparseTensor.from_coo(v, r, c, shape=(2, 2)).shape == (2, 2)
    assert st.SparseTensor.from_coo(v, r, c, [0, 1], shape=(2, 2, 2)).shape == (2, 2, 2)  # three index arrays


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_spectral_ops_of_an_empty_value_batch(dtype):
    """eigsh / eigs of a value batch of no members raised a backend's internal error (lanczos: "stack expects a
    non-empty TensorList", arpack: IndexError); solve, logdet and norm answer it (session 26's sweep)."""
    i = torch.arange(3)
    v = torch.zeros(0, 3, dtype=dtype, requires_grad=True)
    A = st.SparseTensor.from_coo(v, i, i, shape=(3, 3))
    for method in (None, "dense", "lanczos"):
        w, V = st.eigsh(A, 1, method=method)
        assert w.shape == (0, 1) and V.shape == (0, 3, 1) and not w.is_complex() and V.dtype == dtype
    w, V, info = st.eigs(A, 1, return_info=True)
    assert w.shape == (0, 1) and w.is_complex() and V.shape == (0, 3, 1) and info.converged
    (w.abs().sum() + V.abs().sum()).backward()
    assert v.grad is not None and v.grad.shape == (0, 3)
