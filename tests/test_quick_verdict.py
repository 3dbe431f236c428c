"""The serial (NumPy) verdict on small CPU CSR solves with one right-hand side
(``Route._quick_verdict``): the same answers and verdicts as the torch path it short-cuts, taken only
when the answer passes every test at once."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.autograd import fallback as fb


def _poisson(n: int) -> sp.csr_matrix:
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    return (sp.kron(sp.eye(n), T) + sp.kron(T, sp.eye(n))).tocsr()


def _convection(n: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    A = _poisson(n) + sp.diags([0.4 * np.ones(n * n - 1)], [1]) + sp.random(n * n, n * n, density=0.01,
                                                                            random_state=rng)
    return A.tocsr()


@pytest.fixture
def counted(monkeypatch):
    """Counts the quick verdicts given (``taken``) and declined."""
    orig = fb.Route._quick_verdict
    seen = {"taken": 0, "declined": 0}

    def wrapped(self, *args):
        got = orig(self, *args)
        seen["taken" if got is not None else "declined"] += 1
        return got

    monkeypatch.setattr(fb.Route, "_quick_verdict", wrapped)
    return seen


def _solve_both(monkeypatch, A, b, **kw):
    """(answer, info) with the quick verdict, then with it switched off."""
    At = st.from_package(A)
    x1, info1 = st.solve(At, b, return_info=True, **kw)
    with monkeypatch.context() as m:
        m.setattr(fb.Route, "_quick_verdict", lambda self, *a: None)
        st.clear_caches()
        x2, info2 = st.solve(st.from_package(A), b, return_info=True, **kw)
    return x1, info1, x2, info2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.complex128])
@pytest.mark.parametrize("kind", ["poisson", "convection"])
def test_same_answer_and_verdict(monkeypatch, counted, dtype, kind):
    A = _poisson(12) if kind == "poisson" else _convection(12, 3)
    A = A.astype(np.complex128) * (1 + 0.5j) if dtype.is_complex else A
    A = A.astype(np.float32) if dtype == torch.float32 else A
    b = torch.randn(A.shape[0], dtype=dtype, generator=torch.Generator().manual_seed(1))
    x1, info1, x2, info2 = _solve_both(monkeypatch, A, b)
    # taken unless the method's answer needed refinement (an iterative method chosen for the system)
    assert counted["taken"] >= 1 or "refinement" in info1.reason
    torch.testing.assert_close(x1, x2, rtol=0, atol=0)
    assert info1.converged and info2.converged
    assert info1.residual == pytest.approx(info2.residual, rel=1e-3, abs=float(torch.finfo(x1.real.dtype).eps))
    # against SciPy's direct solve, to the accuracy of a backward-stable solve in that dtype
    ref = np.linalg.solve(A.toarray().astype(np.complex128 if dtype.is_complex else np.float64),
                          b.numpy().astype(np.complex128 if dtype.is_complex else np.float64))
    eps = float(torch.finfo(x1.real.dtype).eps)
    cond = np.linalg.cond(A.toarray().astype(np.complex128))
    assert np.linalg.norm(x1.numpy() - ref) <= 50 * cond * eps * np.linalg.norm(ref)


def test_solver_repeated_uses_the_memo_norm(counted):
    A = _poisson(10)
    S = st.Solver(st.from_package(A))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        b = torch.randn(A.shape[0], dtype=torch.float64, generator=g)
        x = S.solve(b)
        r = b.numpy() - A @ x.numpy()
        assert np.abs(r).max() <= 1e-13 * (np.abs(A).sum(1).max() * np.abs(x.numpy()).max() + np.abs(b.numpy()).max())
    assert counted["taken"] == 3 and counted["declined"] == 0


def test_declines_an_answer_that_needs_refinement(counted):
    """CG stopped at the default tolerance: its backward error is above a direct solve's, so the quick
    verdict declines and the torch path refines the answer (one or more steps named in the info)."""
    A = _poisson(16)
    b = torch.randn(A.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x, info = st.solve(st.from_package(A), b, method="cg", return_info=True)
    assert counted["declined"] >= 1
    xn = x.numpy()
    r = b.numpy() - A @ xn
    eta = np.abs(r).max() / (np.abs(A).sum(1).max() * np.abs(xn).max() + np.abs(b.numpy()).max())
    assert eta <= 16 * 8 * np.finfo(np.float64).eps / 2


def test_declines_nonfinite_and_keeps_the_torch_verdict(counted):
    """A right-hand side whose residual's squared norm overflows in NumPy: declined quietly (no
    RuntimeWarning), judged by the torch path as before."""
    A = _poisson(6)
    b = torch.full((A.shape[0],), 1e200, dtype=torch.float64)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        x = st.solve(st.from_package(A), b)
    ref = np.linalg.solve(A.toarray(), b.numpy() / 1e200) * 1e200
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-12)


def test_large_or_batched_systems_take_the_torch_path(counted):
    A = _poisson(8)
    B = torch.randn(A.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    X = st.solve(st.from_package(A), B)
    np.testing.assert_allclose(X.numpy(), np.linalg.solve(A.toarray(), B.numpy()), rtol=1e-12, atol=1e-12)
    assert counted["taken"] == 0


def test_lazy_negative_or_conjugate_right_hand_sides(counted):
    """A right-hand side with torch's negative (or conjugate) bit set cannot be read by NumPy: declined, the torch
    path answers (the quick verdict raised "Can't call numpy() on Tensor that has negative bit set"; session 26's
    review)."""
    A = _poisson(5)
    At = st.from_package(A)
    z = torch.randn(A.shape[0], dtype=torch.complex128, generator=torch.Generator().manual_seed(5))
    for b in (z.conj().imag, torch._neg_view(z.real.clone()), z.conj()):
        assert b.is_neg() or b.is_conj()
        x = st.solve(At if not b.is_complex() else st.from_package(A.astype(np.complex128)), b)
        ref = np.linalg.solve(A.toarray(), b.resolve_conj().resolve_neg().numpy())
        np.testing.assert_allclose(x.numpy(), ref, rtol=1e-12, atol=1e-12)
