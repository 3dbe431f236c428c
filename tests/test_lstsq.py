"""``sparsetorch.ops.lstsq.lstsq`` (op "lstsq") through the SciPy plugin's LSQR/LSMR plans:
values against NumPy/dense references, gradients by gradcheck and against dense float64
formulas, the plan cache, statuses and errors. Skipped when the SciPy plugin is not importable
(a core-only install)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch import get_backends, reset_backends
from sparsetorch.format import COO, CSC, CSR
from sparsetorch.ops.lstsq import lstsq
from sparsetorch.testing.problems import random_rectangular

plugin = pytest.importorskip("sparsetorch_scipy.plugin", reason="the SciPy plugin (plugins/scipy_backend) is not importable")

pytestmark = pytest.mark.usefixtures("single_thread", "scipy_loaded")
TIGHT = dict(atol=1e-14, btol=1e-14, conlim=1e12)
METHODS = ("lsqr", "lsmr")


@pytest.fixture
def scipy_loaded(monkeypatch):
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    backends = get_backends()
    if "scipy" not in backends.names:
        backends.register(plugin, "scipy")
    yield
    reset_backends()


def _dense_lstsq(D: torch.Tensor, B: torch.Tensor, damp: float = 0.0) -> torch.Tensor:
    """min ||D X - B||^2 + damp^2 ||X||^2 (minimum norm) by NumPy on the stacked system."""
    Dn, Bn = D.numpy(), B.numpy()
    if damp:
        Dn = np.vstack([Dn, damp * np.eye(D.shape[1])])
        Bn = np.vstack([Bn, np.zeros((D.shape[1],) + Bn.shape[1:], dtype=Bn.dtype)])
    return torch.from_numpy(np.linalg.lstsq(Dn, Bn, rcond=None)[0])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt", [CSR, CSC, COO], ids=["CSR", "CSC", "COO"])
@pytest.mark.parametrize("shape", [(15, 6), (6, 6), (5, 12)], ids=["over", "square", "under"])
def test_matches_numpy_lstsq(method, fmt, shape) -> None:
    m, n = shape
    A = random_rectangular(m, n, density=0.5, seed=m * n, format=fmt)
    g = torch.Generator().manual_seed(1)
    B = torch.randn(m, 3, generator=g, dtype=torch.float64)
    X, info = lstsq(A, B, method=method, return_info=True, **TIGHT)
    assert X.shape == (n, 3) and info.backend == "scipy" and info.method == method and info.converged
    torch.testing.assert_close(X, _dense_lstsq(A.to_dense(), B), rtol=1e-9, atol=1e-10)
    x = lstsq(A, B[:, 0], method=method, **TIGHT)  # a vector in, a vector out
    torch.testing.assert_close(x, X[:, 0], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_damped_matches_the_stacked_dense_problem(method) -> None:
    A = random_rectangular(10, 7, density=0.4, seed=3)
    B = torch.linspace(-1, 1, 10, dtype=torch.float64)[:, None]
    X = lstsq(A, B, method=method, damp=0.7, **TIGHT)
    torch.testing.assert_close(X, _dense_lstsq(A.to_dense(), B, damp=0.7), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("method", METHODS)
def test_complex_and_value_batch(method) -> None:
    A = random_rectangular(9, 4, density=0.5, seed=5, dtype=torch.complex128)
    B = torch.randn(9, 2, generator=torch.Generator().manual_seed(2), dtype=torch.complex128)
    X = lstsq(A, B, method=method, **TIGHT)
    torch.testing.assert_close(X, _dense_lstsq(A.to_dense(), B), rtol=1e-9, atol=1e-10)
    # a value batch of two real matrices sharing the pattern
    R = random_rectangular(9, 4, density=0.5, seed=6)
    Ab = R.with_values(torch.stack([R.values, 2 * R.values + 0.1]))
    Bb = torch.randn(2, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    Xb = lstsq(Ab, Bb, method=method, **TIGHT)
    for i in range(2):
        torch.testing.assert_close(Xb[i], _dense_lstsq(Ab.to_dense()[i], Bb[i][:, None])[:, 0], rtol=1e-9, atol=1e-10)


# Gradients ------------------------------------------------------------------------------------------
def _grad_inputs(m: int, n: int, dtype=torch.float64, seed: int = 0):
    A = random_rectangular(m, n, density=0.5, seed=seed, dtype=dtype)
    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(m, 2, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype).requires_grad_(True)
    return A, v, b


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("damp", [0.0, 0.8])
def test_gradcheck(method, damp) -> None:
    A, v, b = _grad_inputs(9, 5, seed=7)
    fn = lambda v, b: lstsq(A.with_values(v), b, method=method, damp=damp, cache=False, **TIGHT)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (v, b), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_complex() -> None:
    A, v, b = _grad_inputs(8, 4, dtype=torch.complex128, seed=11)
    fn = lambda v, b: lstsq(A.with_values(v), b, method="lsmr", cache=False, **TIGHT)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (v, b), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("damp", [0.0, 0.5])
def test_gradient_matches_dense_autograd_on_the_pattern(damp) -> None:
    """Against torch's dense autograd through the normal equations (float64): dL/dA is the dense
    gradient read at the stored entries, dL/dB the dense one."""
    A, v, b = _grad_inputs(12, 6, seed=21)
    w = torch.randn(6, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (lstsq(A.with_values(v), b, method="lsqr", damp=damp, **TIGHT) * w).sum().backward()
    D = A.to_dense().detach().clone().requires_grad_(True)
    bd = b.detach().clone().requires_grad_(True)
    K = D.T @ D + damp**2 * torch.eye(6, dtype=torch.float64)
    (torch.linalg.solve(K, D.T @ bd) * w).sum().backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], D.grad[coords[0], coords[1]], rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(b.grad, bd.grad, rtol=1e-7, atol=1e-9)


def test_underdetermined_gradient_without_damp_is_refused() -> None:
    A, v, b = _grad_inputs(4, 9, seed=2)
    x = lstsq(A.with_values(v), b, **TIGHT)
    with pytest.raises(st.InputError, match=r"full column rank.*4x9.*damp"):
        x.sum().backward()


# Plans, statuses, errors --------------------------------------------------------------------------
def test_plan_cache_reused_for_new_values() -> None:
    A = random_rectangular(10, 4, density=0.5, seed=9)
    B = torch.ones(10, 1, dtype=torch.float64)
    cache = st.plan_cache()
    cache.clear()
    lstsq(A, B, method="lsqr", **TIGHT)
    hits = cache.hits
    A2 = A.with_values(A.values * 3.0)
    X2, info = lstsq(A2, B, method="lsqr", return_info=True, **TIGHT)
    assert cache.hits == hits + 1 and info.plan_reused
    torch.testing.assert_close(X2, _dense_lstsq(A2.to_dense(), B), rtol=1e-9, atol=1e-11)


def test_plan_adjoint_is_the_minimum_norm_solution() -> None:
    from sparsetorch_scipy.lstsq import LstsqPlan

    A = random_rectangular(11, 4, density=0.5, seed=13, dtype=torch.complex128)
    plan = LstsqPlan(A.detach(), "lsmr", {})
    plan.set_values(A.values)
    G = torch.randn(4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.complex128)
    W, res = plan.lstsq(G, adjoint=True, options=dict(damp=0.0, **TIGHT, maxiter=None))
    assert res.converged and W.shape == (11, 2)
    torch.testing.assert_close(W, torch.from_numpy(np.linalg.pinv(A.to_dense().numpy().conj().T) @ G.numpy()),
                               rtol=1e-9, atol=1e-10)


def test_maxiter_and_policies() -> None:
    A = random_rectangular(30, 12, density=0.4, seed=4)
    B = torch.ones(30, dtype=torch.float64)
    with pytest.raises(st.NotConvergedError, match="maxiter"):
        lstsq(A, B, method="lsqr", maxiter=2, **{**TIGHT})
    with pytest.warns(st.NotConvergedWarning):
        x, info = lstsq(A, B, method="lsqr", maxiter=2, on_nonconvergence="warn", return_info=True, **TIGHT)
    assert info.status is st.Status.MAX_ITERATIONS and info.iterations == 2 and torch.isfinite(x).all()


def test_ill_conditioned_past_conlim_is_a_breakdown() -> None:
    """Singular values 1 .. 1e-10 (dense, stored as sparse): the condition estimate passes conlim=1e4."""
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((20, 8)))
    V, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    A = st.SparseTensor.from_dense(torch.from_numpy(Q @ np.diag(np.logspace(0, -10, 8)) @ V.T))
    with pytest.raises(st.NotConvergedError, match="conlim") as err:
        lstsq(A, torch.ones(20, dtype=torch.float64), method="lsqr", atol=1e-14, btol=1e-14, conlim=1e4)
    assert err.value.info.status is st.Status.BREAKDOWN


@pytest.mark.parametrize("kw, match", [
    (dict(damp=-1.0), "damp"), (dict(atol=0.0, btol=0.0), "atol and btol"), (dict(conlim=0), "conlim"),
    (dict(maxiter=0), "maxiter"), (dict(on_nonconvergence="never"), "on_nonconvergence"),
])
def test_bad_options(kw, match) -> None:
    A = random_rectangular(5, 3, seed=1)
    with pytest.raises(st.InputError, match=match):
        lstsq(A, torch.ones(5, dtype=torch.float64), **kw)


def test_bad_inputs_name_the_problem() -> None:
    A = random_rectangular(5, 3, seed=1)
    with pytest.raises(st.InputError, match=r"\(3,\).*\(5,\)"):
        lstsq(A, torch.ones(3, dtype=torch.float64))
    bad = A.with_values(A.values.clone())
    bad.values[0] = float("nan")
    with pytest.raises(st.InputError, match="NaN"):
        lstsq(bad, torch.ones(5, dtype=torch.float64))


def test_torch_backend_declines_with_the_reason() -> None:
    # its dense SVD stops at min(m, n) = 4096 (a larger one is named with the size and what to use instead)
    A = st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64))
    big = st.SparseTensor.from_coo(torch.ones(5000, dtype=torch.float64), torch.arange(5000), torch.arange(5000),
                                   shape=(5000, 5000))
    x = lstsq(A, torch.ones(3, dtype=torch.float64), backend="torch")
    torch.testing.assert_close(x, torch.ones(3, dtype=torch.float64))
    with pytest.raises(st.NoBackendError, match=r"dense least squares only up to min\(m, n\) = 4096.*5000x5000"):
        lstsq(big, torch.ones(5000, dtype=torch.float64), backend="torch")


def test_solve_pinned_to_lsqr_points_to_lstsq() -> None:
    A = random_rectangular(6, 6, seed=2)
    with pytest.raises(st.NoBackendError, match=r"lstsq\(A, B, method='lsqr'\)"):
        st.solve(A, torch.ones(6, dtype=torch.float64), backend="scipy", method="lsqr")


def test_lstsq_object_keeps_its_plan_for_new_values() -> None:
    from sparsetorch.ops.lstsq import Lstsq

    A = random_rectangular(14, 5, density=0.5, seed=17)
    B = torch.randn(14, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ls = Lstsq(A, method="lsmr", damp=0.2, **TIGHT)
    ls.plan()
    assert (ls.backend, ls.method) == ("scipy", "lsmr")
    plan = ls._state.plan
    torch.testing.assert_close(ls.solve(B), _dense_lstsq(A.to_dense(), B, damp=0.2), rtol=1e-9, atol=1e-11)
    v = (A.values * 2).requires_grad_(True)
    ls.update_values(v)
    X = ls.solve(B)
    assert ls._state.plan is plan
    torch.testing.assert_close(X.detach(), _dense_lstsq(2 * A.to_dense(), B, damp=0.2), rtol=1e-9, atol=1e-11)
    X.sum().backward()
    D = (2 * A.to_dense()).requires_grad_(True)
    torch.linalg.solve(D.T @ D + 0.04 * torch.eye(5, dtype=torch.float64), D.T @ B).sum().backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], D.grad[coords[0], coords[1]], rtol=1e-7, atol=1e-9)
    with pytest.raises(st.InputError, match="unknown options"):
        Lstsq(A, rtol=1e-3)


@pytest.mark.parametrize("kw", [{}, dict(backend="eigen", method="qr"), dict(backend="scipy", method="lsqr")],
                         ids=["default", "eigen/qr", "scipy/lsqr"])
def test_lstsq_object_plans_again_after_an_index_write(kw) -> None:
    """A tracked write in place to A's index buffers (``A.crd(1)[1] = 3``) moves an entry: the object drops the
    plan made on the old pattern (it kept it: NotConvergedError "backward error 0.012" by qr, 0.0066 by scipy's
    lsqr, or the old matrix's answer, 0.14 off; st.lstsq was right, 4e-16). Reference: torch.linalg.lstsq."""
    from sparsetorch.format import CSR
    from sparsetorch.ops.lstsq import Lstsq

    if kw.get("backend") == "eigen" and importlib.util.find_spec("sparsetorch_eigen") is None:
        pytest.skip("the Eigen plugin is not installed")
    g = torch.Generator().manual_seed(0)
    D = torch.zeros(8, 5, dtype=torch.float64)
    D[:5] += 4 * torch.eye(5, dtype=torch.float64)
    D[5:] = torch.randn(3, 5, generator=g, dtype=torch.float64)
    D[0, 1] = 1.0
    b = torch.arange(1.0, 9.0, dtype=torch.float64)
    ref = lambda M: torch.linalg.lstsq(M, b[:, None]).solution[:, 0]  # noqa: E731
    A = st.SparseTensor.from_dense(D, format=CSR)
    ls = Lstsq(A, **kw)
    torch.testing.assert_close(ls.solve(b), ref(D), rtol=1e-10, atol=1e-12)
    first = ls._state
    A.crd(1)[1] = 3  # row 0's entry moves from column 1 to column 3
    new = A.to_dense()
    assert new[0, 3] == 1.0 and new[0, 1] == 0.0
    x, info = ls.solve(b, return_info=True)
    assert ls._state is not first and info.converged
    torch.testing.assert_close(x, ref(new), rtol=1e-10, atol=1e-12)
    # new values on the moved pattern keep the new plan, and gradients are those of the new matrix
    second = ls._state
    v = (2.0 * A.values).requires_grad_(True)
    ls.update_values(v)
    x2 = ls.solve(b)
    assert ls._state is second
    torch.testing.assert_close(x2.detach(), ref(2.0 * new), rtol=1e-10, atol=1e-12)
    (gv,) = torch.autograd.grad(x2.sum(), v)
    coords, slot = A.entries()
    Dv = (2.0 * new).requires_grad_(True)
    (gd,) = torch.autograd.grad(ref(Dv).sum(), Dv)
    torch.testing.assert_close(gv[slot], gd[coords[0], coords[1]], rtol=1e-8, atol=1e-10)


def test_exported_and_explained():
    import sparsetorch as st

    A = st.SparseTensor.from_dense(torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    b = torch.ones(8, dtype=torch.float64)
    assert st.lstsq is not None and st.Lstsq is not None
    table = st.explain("lstsq", A, b)
    assert table.chosen is not None and "lstsq" in str(table)


def test_a_qr_answer_that_is_not_a_least_squares_answer_is_refused():
    # Eigen's SparseQR in float32 took lp_e226 (rank 223, cond 9e3) for rank 51 (its threshold dropped the
    # small columns) and answered with a relative residual of 0.9 as "direct" (session 21's sweep)
    pytest.importorskip("sparsetorch_eigen")
    import scipy.io

    path = Path(__file__).parent / "data" / "lp_e226.mtx"
    if not path.exists():
        pytest.skip("tests/data/lp_e226.mtx not present")
    A = sp.csr_array(scipy.io.mmread(path)).astype(np.float32)
    b = np.random.default_rng(0).standard_normal(A.shape[0]).astype(np.float32)
    with pytest.raises(st.NotConvergedError, match="not a least-squares answer"):
        st.lstsq(st.from_package(A), torch.from_numpy(b), method="qr", backend="eigen")
    x = st.lstsq(st.from_package(A), torch.from_numpy(b)).double().numpy()  # the default answers
    Ad = A.toarray().astype(np.float64)
    assert np.linalg.norm(b - Ad @ x) <= 0.05 * np.linalg.norm(b)


def test_info_after_a_hand_over_reports_the_answering_method_and_the_attempts():
    # after a failed LSQR, QR's answer reported LSQR's iterations and no attempts (session 21's docs sweep)
    pytest.importorskip("sparsetorch_eigen")
    A = random_rectangular(200, 80, density=0.1, seed=3)
    b = torch.linspace(-1, 1, 200, dtype=torch.float64)
    x, info = st.lstsq(A, b, maxiter=2, on_nonconvergence="ignore", return_info=True)
    if not info.attempts:
        pytest.skip(f"no hand-over on this machine ({info.backend}/{info.method})")
    assert len(info.attempts) >= 2 and not info.attempts[0].succeeded and info.attempts[-1].succeeded
    assert (info.backend, info.method) == (info.attempts[-1].backend, info.attempts[-1].method)
    if info.status.value == "direct":
        assert info.iterations == 0
    ref = np.linalg.lstsq(A.to_dense().numpy(), b.numpy(), rcond=None)[0]
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-8, atol=1e-10)


# torch.func -----------------------------------------------------------------------------------------
def _dense_grad_reference(D: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
    """d/dD and d/db of w . lstsq(D, b) by dense autograd through the normal equations (float64)."""
    Dd = D.detach().clone().requires_grad_(True)
    bd = b.detach().clone().requires_grad_(True)
    (torch.linalg.solve(Dd.T @ Dd, Dd.T @ bd) @ w).backward()
    return Dd.grad, bd.grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_func_grad_in_values_and_rhs(dtype) -> None:
    """torch.func.grad of a default lstsq (float32 widened to float64 and rounded back): the plan used to read
    the transform's wrappers ("Cannot access data pointer of Tensor that doesn't have storage")."""
    from torch.func import grad

    A, v, b = _grad_inputs(11, 5, seed=3)
    b = b[:, 0]
    w = torch.randn(5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    gD, gb = _dense_grad_reference(A.to_dense(), b, w)
    coords, slot = A.entries()
    Ad, vd, bd, wd = A.detach().to(dtype), v.detach().to(dtype), b.detach().to(dtype), w.to(dtype)
    gv, gbb = grad(lambda v_, b_: lstsq(Ad.with_values(v_), b_) @ wd, argnums=(0, 1))(vd, bd)
    tol = dict(rtol=1e-8, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-4, atol=1e-5)
    torch.testing.assert_close(gv[slot].double(), gD[coords[0], coords[1]], **tol)
    torch.testing.assert_close(gbb.double(), gb, **tol)


def test_torch_func_vmap_over_rhs_and_values() -> None:
    from torch.func import vmap

    A, v, _ = _grad_inputs(10, 4, seed=8)
    A, v = A.detach(), v.detach()
    g = torch.Generator().manual_seed(2)
    B = torch.randn(3, 10, generator=g, dtype=torch.float64)
    X = vmap(lambda b_: lstsq(A, b_))(B)
    torch.testing.assert_close(X, _dense_lstsq(A.to_dense(), B.T).T, rtol=1e-9, atol=1e-11)
    V = v + 0.1 * torch.randn(3, v.shape[0], generator=g, dtype=torch.float64)
    X = vmap(lambda v_, b_: lstsq(A.with_values(v_), b_), in_dims=(0, 0))(V, B)
    for i in range(3):
        torch.testing.assert_close(X[i], _dense_lstsq(A.with_values(V[i]).to_dense(), B[i]), rtol=1e-9, atol=1e-11)


def test_torch_func_jacrev_in_rhs_is_the_pseudo_inverse() -> None:
    from torch.func import jacrev

    A, _, b = _grad_inputs(9, 4, seed=13)
    A, b = A.detach(), b.detach()[:, 0]
    J = jacrev(lambda b_: lstsq(A, b_))(b)
    torch.testing.assert_close(J, torch.linalg.pinv(A.to_dense()), rtol=1e-8, atol=1e-10)


def test_torch_func_grad_checks_finiteness_inside_the_transform() -> None:
    from torch.func import grad

    A, _, b = _grad_inputs(9, 4, seed=13)
    bad = b.detach().clone()
    bad[2] = float("nan")
    with pytest.raises(st.InputError, match="NaN|finite"):
        grad(lambda b_: lstsq(A.detach(), b_).sum())(bad)


@pytest.mark.parametrize("m,n", [(200, 10), (2000, 20)])
def test_columns_scaled_over_twelve_decades_give_the_least_squares_solution(m, n) -> None:
    """Columns of norms 1e-6..1e6 (condition 1e12; 2.5 with unit columns): LSQR's answer, refined, was 100 %
    from the solution and accepted silently; a QR dropped the small columns (session 23's sweep). Now an
    unrefinable answer hands over (200 x 10: the QR answers), and where A itself gives none the columns are
    scaled (2000 x 20). Against NumPy on the column-scaled matrix, within the conditioning's bound, and
    Stewart's backward error."""
    A = sp.csr_array(sp.random(m, n, density=0.3, random_state=1) @ sp.diags(10.0 ** np.linspace(-6, 6, n)))
    b = np.random.default_rng(0).standard_normal(m)
    D = A.toarray()
    norms = np.linalg.norm(D, axis=0)
    ref = np.linalg.lstsq(D / norms, b, rcond=None)[0] / norms
    # the default call (a dense SVD of unit-norm columns answers these small ones since session 24), and SciPy's
    # LSQR alone, where the core scales the columns once LSQR on A fails
    for backend in (None, "scipy"):
        x, info = st.lstsq(st.from_package(A), torch.tensor(b), return_info=True, backend=backend)
        x = x.numpy()
        r = b - D @ x
        assert np.linalg.norm(D.T @ r) / (np.linalg.norm(D) * np.linalg.norm(r)) < 1e-14
        assert np.linalg.norm(x - ref) / np.linalg.norm(ref) < 1e-4  # cond(A) 1e12 x u; it was 1.0
        assert ("their norms spread" in info.reason) == (backend == "scipy"), info.reason


def test_gradients_through_the_column_scaled_path_match_dense_autograd(monkeypatch) -> None:
    """Columns 1e-4..1e4, the plain path made to fail (so the scaled one answers): gradients in the values and
    b against torch.linalg.lstsq's dense autograd (float64, condition ~1e8: agreement to ~1e-9)."""
    from sparsetorch.autograd.lstsq import LstsqHandle

    S = sp.csr_array(sp.random(30, 5, density=0.6, random_state=3) @ sp.diags(10.0 ** np.array([-4.0, -1, 0, 2, 4])))
    A = st.from_package(S)
    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(30, generator=torch.Generator().manual_seed(4), dtype=torch.float64).requires_grad_(True)
    w = torch.randn(5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    run = LstsqHandle.run

    def unscaled_fails(self, values, B, adjoint=False):
        norms = torch.zeros(5, dtype=torch.float64).index_add(0, self.A.entries()[0][1], values.detach().abs())
        if float(norms.max() / norms.min()) > 1e6:
            raise st.NotConvergedError("made to fail", None)
        return run(self, values, B, adjoint)

    monkeypatch.setattr(LstsqHandle, "run", unscaled_fails)
    x, info = st.lstsq(A.with_values(v), b, return_info=True)
    assert "columns scaled" in info.reason
    (x @ w).backward()
    D = torch.tensor(S.toarray()).requires_grad_(True)
    bd = b.detach().clone().requires_grad_(True)
    (torch.linalg.lstsq(D, bd.unsqueeze(-1)).solution[:, 0] @ w).backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], D.grad[coords[0], coords[1]], rtol=1e-7, atol=1e-7 * float(D.grad.abs().max()))
    torch.testing.assert_close(b.grad, bd.grad, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("damp", [0.0, 0.7])
def test_forward_mode_jvp_and_jacfwd(damp) -> None:
    """torch.func.jvp / jacfwd (torch's "you must implement the jvp function" before; session 23's sweep):
    against central differences and jacrev."""
    from torch.func import jacfwd, jacrev, jvp

    A, v, b = _grad_inputs(12, 5, seed=1)
    v, b = v.detach(), b.detach()[:, 0]
    g = torch.Generator().manual_seed(9)
    dv, db = torch.randn(v.shape, generator=g, dtype=torch.float64), torch.randn(b.shape, generator=g, dtype=torch.float64)

    def f(v_, b_):
        return lstsq(A.with_values(v_), b_, damp=damp, **TIGHT)

    _, t = jvp(f, (v, b), (dv, db))
    eps = 1e-6
    fd = (f(v + eps * dv, b + eps * db) - f(v - eps * dv, b - eps * db)) / (2 * eps)
    torch.testing.assert_close(t, fd, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(jacfwd(f, argnums=0)(v, b), jacrev(f, argnums=0)(v, b), rtol=1e-9, atol=1e-11)


def test_badly_scaled_wide_rank_deficient_and_batched_calls_keep_the_minimum_norm_answer() -> None:
    """The column scaling first made these answers least-||D^-1 x|| rather than least-||x|| (a regression an
    outside review found the same session): wide A is never scaled, a tall A only when A itself gives no answer,
    and value sets are judged one by one. Against torch.linalg.pinv."""
    g = torch.Generator().manual_seed(0)
    D = torch.randn(3, 6, dtype=torch.float64, generator=g) * torch.tensor([1e-4, 1, 1, 1, 1, 1e4], dtype=torch.float64)
    b = torch.randn(3, dtype=torch.float64, generator=g)
    x = st.lstsq(st.from_package(D.to_sparse_csr()), b)
    torch.testing.assert_close(x, torch.linalg.pinv(D) @ b, rtol=1e-8, atol=1e-10)
    T = torch.randn(8, 4, dtype=torch.float64, generator=g)
    T[:, 1] = 1e-7 * T[:, 0]  # rank 3, columns spread 1e7
    bt = torch.randn(8, dtype=torch.float64, generator=g)
    xt = st.lstsq(st.from_package(T.to_sparse_csr()), bt)
    torch.testing.assert_close(xt, torch.linalg.pinv(T, rtol=1e-12) @ bt, rtol=1e-6, atol=1e-8)
    W = torch.randn(3, 6, dtype=torch.float64, generator=g)
    A = st.SparseTensor.from_dense(W)
    V = torch.stack([A.values * 1e-4, A.values * 1e4])
    X = st.lstsq(A.with_values(V), b)
    for i, s in enumerate((1e-4, 1e4)):
        torch.testing.assert_close(X[i], torch.linalg.pinv(W * s) @ b, rtol=1e-8, atol=1e-10 / s)


def test_info_lists_the_main_solve_before_its_refinement() -> None:
    """The refinement's results were recorded before the main solve's, so info named the refinement's count as
    the main one (404 then 673 where the solve took 673; an outside review the same session)."""
    pytest.importorskip("sparsetorch_eigen")
    n = 400
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n)).tolil()
    T[0, 0] = T[n - 1, n - 1] = 1.0
    rng = np.random.default_rng(0)
    M = sp.vstack([T.tocsr(), 1e-3 * sp.eye(n), sp.random(50, n, density=0.01, random_state=rng)]).tocsr()
    b = torch.as_tensor(rng.standard_normal(M.shape[0]))
    _, info = lstsq(st.from_package(M), b, backend="eigen", method="lsqr", return_info=True)
    main = int(info.reason.split("converged in ")[1].split(" iterations")[0])
    then = int(info.reason.rsplit(" of ", 1)[1].split(" iterations")[0])
    assert main + then == info.iterations and main > then  # the main solve's count first


@pytest.mark.parametrize("noise", [1e-10, 1e-6, 1e-4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nearly_consistent_systems_are_answered(noise, dtype) -> None:
    """A small nonzero residual: Stewart's ||A^H r|| / (||A|| ||r||) read the rounding in the computed r
    (~u ||A|| ||x|| / ||r||) and refused correct answers of every method with NotConvergedError (an outside
    sweep the same session; float32 calls, widened, met it at any b). Against torch.linalg.lstsq."""
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(30, 6, dtype=torch.float64, generator=g)
    b = Q @ torch.randn(6, dtype=torch.float64, generator=g) + noise * torch.randn(30, dtype=torch.float64, generator=g)
    ref = torch.linalg.lstsq(Q, b.unsqueeze(-1)).solution[:, 0]
    x = st.lstsq(st.SparseTensor.from_dense(Q.to(dtype)), b.to(dtype))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert float((x.double() - ref).norm() / ref.norm()) < tol


def test_hessian_says_first_order_only() -> None:
    from torch.func import hessian

    A = st.SparseTensor.from_dense(torch.tensor([[4.0, 1, 0], [1, 3, 1], [0, 1, 2]], dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="lstsq: second derivatives"):
        hessian(lambda v: lstsq(A.with_values(v), torch.ones(3, dtype=torch.float64)).sum())(A.values.clone())


# --- the torch backend's dense SVD least squares (the hand-over a core + SciPy install has) -------------------
@pytest.mark.parametrize("shape", [(15, 6), (6, 6), (5, 12)], ids=["over", "square", "under"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("damp", [0.0, 0.3])
def test_dense_svd_matches_numpy(shape, dtype, damp) -> None:
    m, n = shape
    A = random_rectangular(m, n, density=0.5, seed=m * n + 3).to(dtype)
    if dtype.is_complex:
        A = A.with_values(A.values * torch.exp(1j * torch.arange(A.values.numel(), dtype=torch.float64)))
    B = torch.randn(m, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)
    X, info = lstsq(A, B, backend="torch", damp=damp, return_info=True)
    assert info.backend == "torch" and info.method == "dense"
    torch.testing.assert_close(X, _dense_lstsq(A.to_dense(), B, damp), rtol=1e-10, atol=1e-11)


def test_dense_svd_rank_deficient_is_minimum_norm_and_differentiable() -> None:
    # a repeated column and a zero column: NumPy's minimum-norm answer; gradients in B and the values
    D = torch.randn(9, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    D[:, 3] = D[:, 1]
    D[:, 4] = 0.0
    D[D.abs() < 0.3] = 0.0
    A = st.SparseTensor.from_dense(D)
    b = torch.randn(9, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    x, info = lstsq(A, b, backend="torch", return_info=True)
    assert "numerical rank 3 of" in info.reason
    torch.testing.assert_close(x, _dense_lstsq(D, b.unsqueeze(-1))[:, 0], rtol=1e-10, atol=1e-12)
    full = random_rectangular(12, 5, density=0.6, seed=8)
    v = full.values.clone().requires_grad_(True)
    bb = torch.randn(12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, bb: lstsq(full.with_values(v), bb, backend="torch"), (v, bb),
                                    eps=1e-6, atol=1e-7, rtol=1e-6)
    assert torch.autograd.gradcheck(lambda v, bb: lstsq(full.with_values(v), bb, backend="torch", damp=0.5),
                                    (v, bb), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_dense_svd_value_batch() -> None:
    A = random_rectangular(10, 4, density=0.6, seed=5)
    V = torch.stack([A.values, 2.0 * A.values + 0.1])
    Ab = A.with_values(V)
    B = torch.randn(2, 10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    X = lstsq(Ab, B, backend="torch")
    for i in range(2):
        torch.testing.assert_close(X[i], _dense_lstsq(A.with_values(V[i]).to_dense(), B[i]), rtol=1e-10, atol=1e-11)


def test_a_core_and_scipy_install_hands_over_to_the_dense_svd(monkeypatch) -> None:
    """impcol_a (207 x 207, cond 1.4e8): SciPy's LSQR stops at its iteration limit; with no sparse QR
    installed (the quick start's core + SciPy) the default call raised NotConvergedError in float64 and
    float32 (session 24's GPU-machine run). It hands over to the torch backend's dense SVD. Reference: NumPy's
    dense lstsq in float64."""
    import scipy.io

    from sparsetorch.dispatch.experience import clear_experience
    from sparsetorch.dispatch.select import clear_decisions

    monkeypatch.setenv("SPARSETORCH_DISABLE_PLUGINS", "eigen")
    reset_backends()
    clear_decisions()
    clear_experience()
    try:
        if "scipy" not in get_backends().names:
            get_backends().register(plugin, "scipy")
        M = sp.csr_matrix(scipy.io.mmread(str(Path(__file__).parent / "data" / "impcol_a.mtx")))
        b = np.random.default_rng(0).standard_normal(M.shape[0])
        xr = np.linalg.lstsq(M.toarray(), b, rcond=None)[0]
        for dt, tol in ((np.float64, 1e-9), (np.float32, 1e-5)):
            x, info = st.lstsq(st.from_package(M.astype(dt)), torch.from_numpy(b.astype(dt)), return_info=True)
            assert info.backend == "torch" and info.method == "dense", info.reason
            assert "scipy/lsqr" in info.reason or any(a.backend == "scipy" for a in info.attempts), info
            assert np.linalg.norm(x.numpy().astype(np.float64) - xr) <= tol * np.linalg.norm(xr)
    finally:
        monkeypatch.undo()
        reset_backends()
        clear_decisions()
        clear_experience()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (30, 30)], ids=["over", "under", "square"])
def test_dense_svd_on_cuda_matches_numpy(shape) -> None:
    # torch.linalg.svd on the GPU (cuSOLVER): the same answers and gradients as on the CPU
    m, n = shape
    A = random_rectangular(m, n, density=0.4, seed=m + 7 * n)
    B = torch.randn(m, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    ref = _dense_lstsq(A.to_dense(), B)
    X, info = lstsq(A.to("cuda"), B.cuda(), backend="torch", return_info=True)
    assert X.device.type == "cuda" and info.method == "dense"
    torch.testing.assert_close(X.cpu(), ref, rtol=1e-10, atol=1e-11)
    v = A.values.cuda().requires_grad_(True)
    b = B[:, 0].cuda().requires_grad_(True)
    if m >= n:  # gradients need full column rank (damp == 0)
        lstsq(A.to("cuda").with_values(v), b, backend="torch").square().sum().backward()
        vc = A.values.clone().requires_grad_(True)
        bc = B[:, 0].clone().requires_grad_(True)
        lstsq(A.with_values(vc), bc, backend="torch").square().sum().backward()
        torch.testing.assert_close(v.grad.cpu(), vc.grad, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(b.grad.cpu(), bc.grad, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("shape", [(0, 5), (0, 0), (4, 3)])
@pytest.mark.parametrize("k", [None, 3, 0])
def test_empty_systems_answer_zero_with_every_method(shape, k) -> None:
    """No equations (0 rows), no unknowns, an all-zero A or no right-hand-side columns: the minimum-norm answer is
    zero, by every method offered (the Eigen plugin reshaped B with -1 and failed on 0 rows or 0 columns)."""
    m, n = shape
    A = st.SparseTensor.from_dense(torch.zeros(m, n, dtype=torch.float64))
    b = torch.zeros(m, dtype=torch.float64) if k is None else torch.zeros(m, k, dtype=torch.float64)
    methods = [None, "lsqr", "lsmr", "dense"]
    if importlib.util.find_spec("sparsetorch_eigen") is not None:
        methods.append("qr")
    for method in methods:
        x = st.lstsq(A, b, method=method)
        assert x.shape == ((n,) if k is None else (n, k)), method
        assert not bool(x.abs().gt(0).any()), method


def test_a_value_batch_of_no_members_answers_an_empty_batch() -> None:
    """A value batch of 0 members (or B's batch of 0): an empty answer of the right shape, by default and by every
    method (the default, eigen qr / lsqr and the dense SVD raised; solve and matmul answered it already)."""
    R = st.SparseTensor.from_package(sp.csr_array(np.arange(1.0, 13.0).reshape(4, 3)))
    R0 = R.with_values(R.values.new_zeros(0, R.values.shape[-1]).requires_grad_(True))
    methods = [None, "lsqr", "lsmr", "dense"] + (["qr"] if importlib.util.find_spec("sparsetorch_eigen") else [])
    for method in methods:
        x = st.lstsq(R0, torch.zeros(4, dtype=torch.float64), method=method)
        assert x.shape == (0, 3), method
        x2, info = st.lstsq(R0, torch.zeros(4, 2, dtype=torch.float64), method=method, return_info=True)
        assert x2.shape == (0, 3, 2) and info.converged, method
    x.sum().backward()
    assert R0.values.grad is not None and R0.values.grad.shape == R0.values.shape


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e160, 1e200])
def test_lstsq_right_hand_sides_of_extreme_magnitude(scale):
    """||b||^2 underflowed (b * 1e-200 answered x = 0 with no error) or overflowed (b * 1e200: NotConvergedError
    "backward error nan" on a correct answer) in LSQR / LSMR / the checks; solved for 2^p b now, as solve does
    (session 26's sweep). Every method, and the gradient in b unchanged by the scale."""
    import scipy.sparse as sp

    m = 6
    T1 = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    L = sp.kron(sp.eye(m), T1) + sp.kron(T1, sp.eye(m))
    A = sp.csr_array(sp.vstack([L, sp.eye(m * m)]))
    b = np.random.default_rng(13).standard_normal(2 * m * m)
    ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    At = st.from_package(A)
    methods = [None, "dense"] + [k for k, plugin in (("lsqr", "sparsetorch_scipy"), ("lsmr", "sparsetorch_scipy"),
                                                     ("qr", "sparsetorch_eigen")) if _have(plugin)]
    for method in methods:
        x = st.lstsq(At, torch.from_numpy(b * scale), method=method).numpy()
        np.testing.assert_allclose(x / scale, ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max(), err_msg=str(method))
    bt = torch.from_numpy(b * scale).requires_grad_()
    st.lstsq(At, bt).sum().backward()
    b1 = torch.from_numpy(b).requires_grad_()
    st.lstsq(At, b1).sum().backward()
    torch.testing.assert_close(bt.grad, b1.grad, rtol=1e-9, atol=1e-12)
    x = st.lstsq(st.from_package(A * scale), torch.from_numpy(b)).numpy()  # A's values alike
    np.testing.assert_allclose(x * scale, ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_lstsq_magnitude_scaling_is_per_column_per_member_and_keeps_wide_spans():
    """The magnitude scaling (session 26) at first took one scale for all of B and one for all of A: a column of B
    (or a value-batch member) of normal size next to one of 1e200 came back as x = 0 with converged=True, and A
    with columns 1e120 / 1e-100 / 1 lost its small column (the column scaling's case). Per column, per member, and
    only where the smallest entry stays in range (session 26's review)."""
    import scipy.sparse as sp

    m = 6
    T1 = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    L = sp.kron(sp.eye(m), T1) + sp.kron(T1, sp.eye(m))
    A = sp.csr_array(sp.vstack([L, sp.eye(m * m)]))
    At = st.from_package(A)
    b = np.random.default_rng(13).standard_normal(2 * m * m)
    ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    close = dict(rtol=1e-10, atol=1e-12 * np.abs(ref).max())
    X = st.lstsq(At.with_values(torch.stack([At.values * 1e200, At.values])), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(X[0] * 1e200, ref, **close)
    np.testing.assert_allclose(X[1], ref, **close)
    for pair in ((1e200, 1.0), (1e-200, 1e200)):
        X = st.lstsq(At, torch.from_numpy(np.stack([b * pair[0], b * pair[1]], 1))).numpy()
        np.testing.assert_allclose(X[:, 0] / pair[0], ref, **close)
        np.testing.assert_allclose(X[:, 1] / pair[1], ref, **close)
    rng = np.random.default_rng(0)
    M = rng.standard_normal((8, 3)) * np.array([1e120, 1e-100, 1.0])
    c = rng.standard_normal(8)
    want = np.linalg.lstsq(M / np.abs(M).max(0), c, rcond=None)[0] / np.abs(M).max(0)
    x = st.lstsq(st.from_package(sp.csr_array(M)), torch.from_numpy(c)).numpy()
    np.testing.assert_allclose(x, want, rtol=1e-10)
    D = st.from_package(sp.csr_array(np.diag([1e12, 1e-30]).astype(np.float32)))  # widened to float64 first
    torch.testing.assert_close(st.lstsq(D, torch.ones(2)), torch.tensor([1e-12, 1e30]))
