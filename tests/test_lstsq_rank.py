"""``lstsq`` on rank-deficient A at ``damp == 0``: the forward answer is the minimum-norm one by every
method; the gradient in B is ``pinv(A)^H G``; the gradient in A's values (which does not exist there: the
minimum-norm solution jumps where the rank changes) raises :class:`~sparsetorch.SingularMatrixError`
instead of returning a wrong number (it differed from torch.linalg.pinv's constant-rank derivative by 0.09
with no error, session 27's gradient sweep). Full rank, ``damp > 0``, batches and the Lstsq object keep
their gradients. References: torch.linalg.pinv and its autograd in float64."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import sparsetorch as st
from sparsetorch.ops.lstsq import Lstsq, lstsq

pytest.importorskip("sparsetorch_scipy.plugin", reason="the SciPy plugin (plugins/scipy_backend) is not importable")
from test_lstsq import scipy_loaded  # noqa: E402,F401 - the fixture

pytestmark = pytest.mark.usefixtures("single_thread", "scipy_loaded")

#: (backend, method): the default call, the torch backend's dense SVD, SciPy's LSQR / LSMR, Eigen's sparse QR
METHODS = [(None, None), ("torch", "dense"), ("scipy", "lsqr"), ("scipy", "lsmr")]
if importlib.util.find_spec("sparsetorch_eigen") is not None:
    METHODS += [("eigen", "qr")]
IDS = [f"{b}/{m}" for b, m in METHODS]




def _reproducer(dtype=torch.float64):
    """The sweep's case: 8 x 4 of rank 3 (column 3 = 2 x column 1), b and the loss weights w."""
    m, n = 8, 4
    g = torch.Generator().manual_seed(0)
    D = torch.randn(m, n, dtype=torch.float64, generator=g)
    D[:, 3] = 2.0 * D[:, 1]
    b = torch.randn(m, dtype=torch.float64, generator=g)
    w = torch.randn(n, dtype=torch.float64, generator=g)
    return D.to(dtype), b.to(dtype), w.to(dtype)


def _sparse(D: torch.Tensor, values: torch.Tensor | None = None) -> st.SparseTensor:
    r, c = D.nonzero().T
    return st.SparseTensor.from_coo(D[r, c] if values is None else values, r, c, shape=tuple(D.shape))


def _values(D: torch.Tensor) -> torch.Tensor:
    r, c = D.nonzero().T
    return D[r, c]


def _pinv_grads(D: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
    """torch's constant-rank derivative: autograd through torch.linalg.pinv, on the stored entries."""
    r, c = D.nonzero().T
    v = D[r, c].clone().requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    Ad = torch.zeros(D.shape, dtype=D.dtype).index_put((r, c), v)
    gv, gb = torch.autograd.grad((torch.linalg.pinv(Ad) @ bb * w).sum(), (v, bb))
    return gv, gb


@pytest.mark.parametrize("backend,method", METHODS, ids=IDS)
def test_rank_deficient_forward_is_the_minimum_norm_solution(backend, method) -> None:
    D, b, _ = _reproducer()
    x = lstsq(_sparse(D), b, backend=backend, method=method)
    torch.testing.assert_close(x, torch.linalg.pinv(D) @ b, rtol=1e-10, atol=1e-12)
    # a zero column and a repeated one (rank 3 of 5), several right-hand sides
    E = torch.randn(9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    E[:, 4] = 0.0
    E[:, 2] = E[:, 0]
    B = torch.randn(9, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    X = lstsq(_sparse(E), B, backend=backend, method=method)
    torch.testing.assert_close(X, torch.linalg.pinv(E) @ B, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend,method", METHODS, ids=IDS)
def test_rank_deficient_values_gradient_raises_a_named_error(backend, method) -> None:
    D, b, w = _reproducer()
    v = _values(D).requires_grad_(True)
    x = lstsq(_sparse(D, v), b, backend=backend, method=method)
    with pytest.raises(st.SingularMatrixError, match=r"8x4\) is rank deficient.*damp > 0"):
        torch.autograd.grad((x * w).sum(), v)
    # values and B together: the same error
    bb = b.clone().requires_grad_(True)
    x = lstsq(_sparse(D, v), bb, backend=backend, method=method)
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        (x * w).sum().backward()


@pytest.mark.parametrize("backend,method", METHODS, ids=IDS)
def test_rank_deficient_rhs_gradient_is_the_pseudo_inverse_one(backend, method) -> None:
    D, b, w = _reproducer()
    _, gref = _pinv_grads(D, b, w)
    bb = b.clone().requires_grad_(True)
    x = lstsq(_sparse(D), bb, backend=backend, method=method)
    (gb,) = torch.autograd.grad((x * w).sum(), bb)
    torch.testing.assert_close(gb, gref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend,method", METHODS, ids=IDS)
def test_rank_deficient_with_damp_has_the_regularised_gradient(backend, method) -> None:
    """damp > 0: K = A^T A + damp^2 I is invertible for any rank; against dense autograd of the normal equations."""
    D, b, w = _reproducer()
    damp = 0.5
    v = _values(D).requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    tight = {} if method in (None, "dense", "qr") else dict(atol=1e-14, btol=1e-14, conlim=1e12)
    if method == "qr":
        pytest.skip("Eigen's sparse QR takes no damp")
    x = lstsq(_sparse(D, v), bb, backend=backend, method=method, damp=damp, **tight)
    gv, gb = torch.autograd.grad((x * w).sum(), (v, bb))
    r, c = D.nonzero().T
    vd = _values(D).requires_grad_(True)
    bd = b.clone().requires_grad_(True)
    Ad = torch.zeros(D.shape, dtype=D.dtype).index_put((r, c), vd)
    K = Ad.T @ Ad + damp**2 * torch.eye(4, dtype=torch.float64)
    gvr, gbr = torch.autograd.grad((torch.linalg.solve(K, Ad.T @ bd) * w).sum(), (vd, bd))
    torch.testing.assert_close(gv, gvr, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(gb, gbr, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("backend,method", METHODS, ids=IDS)
def test_full_rank_gradients_still_pass_gradcheck(backend, method) -> None:
    D, b, _ = _reproducer()
    D[:, 3] = 2.0 * D[:, 1] + torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)  # full rank again
    v = _values(D).requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    tight = {} if method in (None, "dense", "qr") else dict(atol=1e-14, btol=1e-14, conlim=1e12)
    fn = lambda v_, b_: lstsq(_sparse(D, v_), b_, backend=backend, method=method, cache=False, **tight)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (v, bb), eps=1e-6, atol=1e-6, rtol=1e-5)
    # and against torch's pinv autograd (full rank: the ordinary derivative)
    w = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    gv, gb = torch.autograd.grad((fn(v, bb) * w).sum(), (v, bb))
    gvr, gbr = _pinv_grads(D, b, w)
    torch.testing.assert_close(gv, gvr, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(gb, gbr, rtol=1e-8, atol=1e-10)


def test_ill_conditioned_full_rank_is_not_refused() -> None:
    """Condition 1e6, full rank: the rank test's threshold (sqrt(eps) on the adjoint solve's consistency) is far
    above a backward-stable solve's noise; the gradient is torch's."""
    g = torch.Generator().manual_seed(11)
    U, _ = torch.linalg.qr(torch.randn(10, 4, dtype=torch.float64, generator=g))
    V, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=g))
    D = U @ torch.diag(torch.tensor([1.0, 1e-2, 1e-4, 1e-6], dtype=torch.float64)) @ V.T
    b = torch.randn(10, dtype=torch.float64, generator=g)
    w = torch.randn(4, dtype=torch.float64, generator=g)
    gvr, _ = _pinv_grads(D, b, w)
    for backend, method in ((None, None), ("torch", "dense")):
        v = _values(D).requires_grad_(True)
        (gv,) = torch.autograd.grad((lstsq(_sparse(D, v), b, backend=backend, method=method) * w).sum(), v)
        torch.testing.assert_close(gv, gvr, rtol=1e-5, atol=1e-5 * float(gvr.abs().max()))


def test_loss_in_the_row_space_gets_the_constant_rank_derivative() -> None:
    """G in A's row space (here w = A^T h): the rule's missing null-space term vanishes and the gradient
    returned is torch.linalg.pinv's constant-rank derivative, not an error (documented in autograd/lstsq.py)."""
    D, b, _ = _reproducer()
    w = D.T @ torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    gvr, _ = _pinv_grads(D, b, w)
    v = _values(D).requires_grad_(True)
    (gv,) = torch.autograd.grad((lstsq(_sparse(D, v), b, backend="torch", method="dense") * w).sum(), v)
    torch.testing.assert_close(gv, gvr, rtol=1e-8, atol=1e-10)


def test_value_batch_and_lstsq_object() -> None:
    D, b, w = _reproducer()
    F = D.clone()
    F[:, 3] = 2.0 * F[:, 1] + torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)  # full rank, same pattern
    r, c = D.nonzero().T
    V = torch.stack([F[r, c], D[r, c]]).requires_grad_(True)  # member 1 rank deficient
    x = lstsq(st.SparseTensor.from_coo(V, r, c, shape=(8, 4)), b)
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        torch.autograd.grad((x * w).sum(), V)
    V2 = torch.stack([F[r, c], 2.0 * F[r, c]]).requires_grad_(True)  # both full rank: a gradient
    (g2,) = torch.autograd.grad((lstsq(st.SparseTensor.from_coo(V2, r, c, shape=(8, 4)), b) * w).sum(), V2)
    assert bool(torch.isfinite(g2).all())
    # the Lstsq object: forward minimum-norm, values-gradient raises, B-gradient pinv's
    v = _values(D).requires_grad_(True)
    ls = Lstsq(_sparse(D, v))
    x = ls.solve(b)
    torch.testing.assert_close(x.detach(), torch.linalg.pinv(D) @ b, rtol=1e-10, atol=1e-12)
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        torch.autograd.grad((x * w).sum(), v)
    bb = b.clone().requires_grad_(True)
    (gb,) = torch.autograd.grad((Lstsq(_sparse(D)).solve(bb) * w).sum(), bb)
    torch.testing.assert_close(gb, _pinv_grads(D, b, w)[1], rtol=1e-10, atol=1e-12)


def test_complex_rank_deficient_values_gradient_raises() -> None:
    D, b, w = _reproducer()
    Dc = torch.complex(D, torch.roll(D, 1, 0))
    Dc[:, 3] = (2.0 - 1.0j) * Dc[:, 1]
    v = _values(Dc).requires_grad_(True)
    x = lstsq(_sparse(Dc, v), b.to(torch.complex128), backend="scipy", method="lsmr")
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        torch.autograd.grad((x * w).sum().real, v)


def test_torch_func_and_forward_mode() -> None:
    from torch.func import jacfwd, jacrev, jvp

    D, b, _ = _reproducer()
    v = _values(D)
    f = lambda v_, b_: lstsq(_sparse(D, v_), b_)  # noqa: E731
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        jacrev(f, argnums=0)(v, b)
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        jvp(lambda v_: f(v_, b), (v,), (torch.ones_like(v),))
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        jacfwd(f, argnums=0)(v, b)
    # in B alone: the pseudo-inverse, either mode
    P = torch.linalg.pinv(D)
    torch.testing.assert_close(jacrev(f, argnums=1)(v, b), P, rtol=1e-10, atol=1e-12)
    db = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(jvp(lambda b_: f(v, b_), (b,), (db,))[1], P @ db, rtol=1e-10, atol=1e-12)
    # full rank: forward mode's probe column does not refuse, and matches reverse mode
    F = D.clone()
    F[:, 3] = 2.0 * F[:, 1] + torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)
    g = lambda v_: lstsq(_sparse(F, v_), b)  # noqa: E731
    torch.testing.assert_close(jacfwd(g)(_values(F)), jacrev(g)(_values(F)), rtol=1e-8, atol=1e-10)


def test_wide_system_rhs_gradient_alone_is_allowed() -> None:
    """m < n at damp == 0: the gradient in B of the minimum-norm solution is pinv(A)^H G (it raised with the
    values-gradient's InputError even when A's values needed none); the values-gradient still refuses."""
    D, b, w = _reproducer()
    Dt = D.T.contiguous()  # 4 x 8, rank 3
    bt = w.clone()
    wt = b.clone()
    bb = bt.clone().requires_grad_(True)
    (gb,) = torch.autograd.grad((lstsq(_sparse(Dt), bb) * wt).sum(), bb)
    torch.testing.assert_close(gb, torch.linalg.pinv(Dt).T @ wt, rtol=1e-10, atol=1e-12)
    v = _values(Dt).requires_grad_(True)
    with pytest.raises(st.InputError, match="full column rank"):
        torch.autograd.grad((lstsq(_sparse(Dt, v), bt) * wt).sum(), v)


@pytest.mark.parametrize("backend", ["scipy", "eigen"])
def test_unconverged_adjoint_solve_follows_the_policy_not_the_rank_test(backend) -> None:
    """A well-conditioned tall A (30 x 10, cond 2.9) with maxiter=8 and on_nonconvergence='warn': the adjoint
    solve stops early, so its defect is its own error, not G's part in A's null space; the rank test runs only
    on a converged adjoint solve (it raised SingularMatrixError "rank deficient ... relative size 0.01"). The
    gradient is the warned, approximate one: against torch.linalg.pinv's autograd to 8 iterations' accuracy."""
    if importlib.util.find_spec("sparsetorch_eigen") is None and backend == "eigen":
        pytest.skip("the Eigen plugin is not installed")
    g = torch.Generator().manual_seed(0)
    D = torch.randn(30, 10, generator=g, dtype=torch.float64)
    b = torch.randn(30, generator=g, dtype=torch.float64)
    w = torch.randn(10, generator=g, dtype=torch.float64)
    gvr, _ = _pinv_grads(D, b, w)
    kw = dict(backend=backend, method="lsqr", maxiter=8, cache=False)
    v = _values(D).requires_grad_(True)
    with pytest.warns(st.NotConvergedWarning):
        x = lstsq(_sparse(D, v), b, on_nonconvergence="warn", **kw)
        (gv,) = torch.autograd.grad((x * w).sum(), v)
    assert float((gv - gvr).norm() / gvr.norm()) < 2e-2
    # forward mode: the probe column's test is skipped alike; the tangent against pinv's jvp
    t = torch.randn(v.shape, generator=g, dtype=torch.float64)
    r, c = D.nonzero().T
    Dt = torch.zeros_like(D).index_put((r, c), t)
    ref = torch.func.jvp(lambda M: torch.linalg.pinv(M) @ b, (D,), (Dt,))[1]
    dx = torch.func.jvp(lambda v_: lstsq(_sparse(D, v_), b, on_nonconvergence="ignore", **kw), (_values(D),), (t,))[1]
    assert float((dx - ref).norm() / ref.norm()) < 2e-2
    # 'raise' still raises (the forward solve already), and a rank-deficient A whose adjoint solve converges
    # still meets the rank test under 'warn'
    with pytest.raises(st.NotConvergedError):
        lstsq(_sparse(D, v), b, **kw)
    E, bE, wE = _reproducer()
    vE = _values(E).requires_grad_(True)
    x = lstsq(_sparse(E, vE), bE, backend=backend, method="lsqr", on_nonconvergence="warn", cache=False)
    with pytest.raises(st.SingularMatrixError, match="rank deficient"):
        torch.autograd.grad((x * wE).sum(), vE)


def test_wide_system_forward_mode_in_rhs_alone_is_the_pseudo_inverse() -> None:
    """m < n at damp == 0, forward mode with a tangent on B alone: torch.func.jvp / jacfwd / forward_ad hand over
    a zero tangent for A's values, which raised the values-derivative's InputError ("need full column rank");
    an all-zero tangent is no derivative in A. Reference: torch.linalg.pinv in float64. A nonzero tangent in
    A's values still refuses."""
    import torch.autograd.forward_ad as fwAD
    from torch.func import jacfwd, jvp

    g = torch.Generator().manual_seed(1)
    D = torch.randn(6, 10, generator=g, dtype=torch.float64)
    b = torch.randn(6, generator=g, dtype=torch.float64)
    tb = torch.randn(6, generator=g, dtype=torch.float64)
    P = torch.linalg.pinv(D)
    A = _sparse(D)
    for backend, method in METHODS:
        f = lambda b_: lstsq(A, b_, backend=backend, method=method)  # noqa: E731,B023
        torch.testing.assert_close(jvp(f, (b,), (tb,))[1], P @ tb, rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(jacfwd(f)(b), P, rtol=1e-9, atol=1e-11)
        with fwAD.dual_level():
            dx = fwAD.unpack_dual(f(fwAD.make_dual(b, tb))).tangent
        torch.testing.assert_close(dx, P @ tb, rtol=1e-9, atol=1e-11)
    v = _values(D)
    with pytest.raises(st.InputError, match="full column rank"):
        jvp(lambda v_: lstsq(_sparse(D, v_), b), (v,), (torch.ones_like(v),))
    with pytest.raises(st.InputError, match="full column rank"):
        jacfwd(lambda v_: lstsq(_sparse(D, v_), b))(v)
