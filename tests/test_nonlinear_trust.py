"""nonlinear_solve when Newton alone is not enough: the trust-region recovery of a failed line search
or linear solve, the hand-over to Anderson and Picard when the library chose the method, the error
of a pinned method, the attempts in the info, gradients at whatever root was found, and the
accuracy contract (default tolerance, the dtype's precision, never a non-finite u reported
converged).

References are independent of sparsetorch: scipy.optimize.brentq for scalar roots, MINPACK's hybrd
(scipy.optimize.root, its own finite-difference Jacobian) for vector roots, a plain-Python Newton
recurrence, the closed-form 1-D Bratu solution, and central differences of those references for
gradients.

The scalar problem: F(u) = u - tanh(1.5 u + 0.5) has one root, 0.9594710428..., and a local
maximum F = -0.195 at u = (-acosh(sqrt(1.5)) - 0.5) / 1.5 = -0.7723 (a local minimum of |F| that is
not a root). Newton from u0 = 0 heads there: the line search stalls on it, and the full steps fall
into an attracting 2-cycle {-1.006, -0.370} (|F| 0.2407 / 0.3148).
"""

from __future__ import annotations

import math

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import NotConvergedError, SingularMatrixError
from sparsetorch.format import CSR
from sparsetorch.ops.accuracy import default_rtol
from sparsetorch.ops.info import Status
from sparsetorch.ops.nonlinear import NonlinearAttempt, nonlinear_solve

pytestmark = pytest.mark.usefixtures("single_thread")

DT = torch.float64
sopt = pytest.importorskip("scipy.optimize")
np = pytest.importorskip("numpy")

U_STATIONARY = (-math.acosh(math.sqrt(1.5)) - 0.5) / 1.5


def tanh_F(u, a=1.5, c=0.5):
    return u - torch.tanh(a * u + c)


def tanh_root(a: float = 1.5, c: float = 0.5) -> float:
    return sopt.brentq(lambda u: u - math.tanh(a * u + c), 0.0, 2.0, xtol=1e-15, rtol=1e-15)


def check_attempts(info, pinned: bool) -> None:
    """The info's record of attempts is coherent: failures before the last, totals add up."""
    att = info.attempts
    assert att and all(isinstance(a, NonlinearAttempt) for a in att)
    assert all(not a.succeeded and a.reason for a in att[:-1])
    assert att[-1].succeeded == info.converged and info.method == att[-1].method
    assert sum(a.iterations for a in att) == info.iterations == len(info.residual_history) - 1
    assert sum(a.function_evaluations for a in att) <= info.function_evaluations
    assert all(a.chosen_by == ("user" if pinned else "library") for a in att) and info.method_pinned == pinned
    if pinned:
        assert len(att) == 1
    else:
        assert [a.method for a in att] == ["newton", "anderson", "picard"][: len(att)]


# --------------------------------------------------------------------------------------------------
# The scalar fixed point u = tanh(1.5 u + 0.5)


@pytest.mark.parametrize("u0", [0.0, U_STATIONARY, -0.5, -3.0, -40.0, 2.0])
@pytest.mark.parametrize("line_search", [True, False])
def test_tanh_root_from_many_starts(u0, line_search):
    root = tanh_root()
    u, info = nonlinear_solve(tanh_F, torch.tensor(u0, dtype=DT), line_search=line_search, return_info=True)
    assert info.converged and info.status is Status.CONVERGED
    assert abs(float(u) - root) <= 1e-9
    assert info.residual <= default_rtol(DT) * info.initial_residual
    assert abs(info.residual - abs(float(u) - math.tanh(1.5 * float(u) + 0.5))) < 1e-15  # ||F|| at the u returned
    check_attempts(info, pinned=False)
    if u0 in (0.0, U_STATIONARY):
        # Newton alone cannot get there from these starts (the local minimum of |F| is in the way):
        # a fixed-point method, started from the best iterate Newton found, finishes.
        assert info.attempts[0].method == "newton" and not info.attempts[0].succeeded
        assert info.attempts[-1].method in ("anderson", "picard")


def test_pure_newton_cycles_as_the_textbook_recurrence_does():
    """line_search=False on the tanh problem is plain Newton, iterate for iterate: it falls into
    the 2-cycle {-1.006, -0.370} (so the ||F|| = 0.24 seen after 100 steps is the cycle, not a
    bug); a pinned Newton stops on the lack of progress and names what to try."""
    u, ref = 0.0, []
    for _ in range(14):
        ref.append(abs(u - math.tanh(1.5 * u + 0.5)))
        u -= (u - math.tanh(1.5 * u + 0.5)) / (1 - 1.5 / math.cosh(1.5 * u + 0.5) ** 2)
    seen = []
    with pytest.raises(NotConvergedError, match=r"no progress in 10 Newton iterations.*method='anderson'") as exc:
        nonlinear_solve(tanh_F, torch.tensor(0.0, dtype=DT), method="newton", line_search=False,
                        callback=lambda it, res: seen.append((it, res)))
    info = exc.value.info
    check_attempts(info, pinned=True)
    assert info.status is Status.BREAKDOWN and "cycling" in info.reason
    hist = info.residual_history
    assert len(hist) == info.iterations + 1 <= len(ref)
    np.testing.assert_allclose(hist, ref[: len(hist)], rtol=1e-10)
    assert [it for it, _ in seen] == list(range(len(hist)))
    assert abs(hist[-1] - 0.2407) < 1e-3 or abs(hist[-1] - 0.3148) < 1e-3  # on the cycle


def test_line_search_failure_at_a_local_minimum_of_the_residual():
    """From the stationary point of |F| no descent step exists: the pinned Newton says so (line
    search and trust-region step both fail) instead of pretending; unpinned, Anderson or Picard
    takes over from there."""
    u0 = torch.tensor(U_STATIONARY, dtype=DT)
    with pytest.raises(NotConvergedError, match=r"(line search|linear solve).*dogleg trust-region step found no") as exc:
        nonlinear_solve(tanh_F, u0, method="newton")
    assert exc.value.info.attempts[0].status is Status.BREAKDOWN
    u, info = nonlinear_solve(tanh_F, u0, return_info=True)
    assert abs(float(u) - tanh_root()) < 1e-9 and len(info.attempts) >= 2


def test_pinned_fixed_point_method_that_fails_names_the_alternatives():
    # Picard on u - g(u) with g' = 1.5 sech^2 > 1 near u0 = -0.33: with omega = 3, G'(u*) = 1 - 3 * 0.88 < -1
    with pytest.raises(NotConvergedError, match=r"picard, pinned.*try method='newton'.*method=None") as exc:
        nonlinear_solve(tanh_F, torch.tensor(0.0, dtype=DT), method="picard", omega=3.0)
    info = exc.value.info
    check_attempts(info, pinned=True)
    assert info.attempts[0].status in (Status.BREAKDOWN, Status.MAX_ITERATIONS, Status.NOT_FINITE)


def test_gradient_uses_the_root_the_fallback_found():
    """u*(a, c) with u = tanh(a u + c): du/dc = s / (1 - a s), du/da = u s / (1 - a s), s = sech^2;
    checked against central differences of brentq roots, with u* found by Anderson after Newton
    failed (line_search=False)."""
    a = torch.tensor(1.5, dtype=DT, requires_grad=True)
    c = torch.tensor(0.5, dtype=DT, requires_grad=True)
    u, info = nonlinear_solve(lambda u, a, c: tanh_F(u, a, c), torch.tensor(0.0, dtype=DT), (a, c),
                              line_search=False, return_info=True)
    assert info.method != "newton" and info.converged
    u.backward()
    d = 1e-6
    fd_c = (tanh_root(1.5, 0.5 + d) - tanh_root(1.5, 0.5 - d)) / (2 * d)
    fd_a = (tanh_root(1.5 + d, 0.5) - tanh_root(1.5 - d, 0.5)) / (2 * d)
    assert abs(float(c.grad) - fd_c) < 1e-7 * abs(fd_c) + 1e-9
    assert abs(float(a.grad) - fd_a) < 1e-7 * abs(fd_a) + 1e-9
    s = 1 / math.cosh(1.5 * float(u.detach()) + 0.5) ** 2
    assert abs(float(c.grad) - s / (1 - 1.5 * s)) < 1e-9


def test_matrix_free_newton_recovers_and_hands_over_with_ad_products():
    """Matrix-free (GMRES on JVPs): the trust-region steps use VJPs/JVPs of F for J^T v and J v;
    the hand-over and the adjoint (GMRES on VJPs) work the same, in both AD modes."""
    root = tanh_root()
    for ad in ("reverse", "forward"):
        a = torch.tensor(1.5, dtype=DT, requires_grad=True)
        u, info = nonlinear_solve(lambda u, a: tanh_F(u, a), torch.zeros(3, dtype=DT), (a,), jacobian="matrix-free",
                                  ad=ad, return_info=True)
        check_attempts(info, pinned=False)
        assert info.converged and info.attempts[0].trust_region_steps >= 1 and info.linear_method == "gmres (matrix-free)"
        assert float((u.detach() - root).abs().max()) < 1e-9
        u.sum().backward()
        s = 1 / math.cosh(1.5 * root + 0.5) ** 2
        assert abs(float(a.grad) - 3 * root * s / (1 - 1.5 * s)) < 1e-8


# --------------------------------------------------------------------------------------------------
# Trust-region recovery


def test_dogleg_recovers_a_line_search_that_fails_on_a_near_singular_jacobian():
    """x^2 + y^2 = 4, x = y from (1, -1 + 1e-9): J is singular on x = -y, the Newton step is ~1e9
    long, and no halving down to 2^-20 reduces ||F||; the dogleg step does, and Newton converges."""
    F = lambda u: torch.stack([u[0] ** 2 + u[1] ** 2 - 4, u[0] - u[1]])  # noqa: E731
    u, info = nonlinear_solve(F, torch.tensor([1.0, -1.0 + 1e-9], dtype=DT), method="newton", return_info=True)
    assert info.converged and info.attempts[0].trust_region_steps >= 1
    torch.testing.assert_close(u.abs(), torch.full((2,), math.sqrt(2), dtype=DT), rtol=1e-12, atol=0)
    assert float(u[0] * u[1]) > 0


def test_trust_region_steps_past_a_singular_jacobian():
    """F = (x^3 - 3x + y - 1, y - 1 + x/2): J = [[3x^2 - 3, 1], [1/2, 1]] is singular at x^2 = 7/6.
    Started there, Newton's linear solve fails (or its step is useless); the steepest-descent part
    of the dogleg moves off the singular line, then Newton converges to a root; plain Newton
    (line_search=False, pinned) raises the linear solver's error instead."""

    def F(u):
        x, y = u[0], u[1]
        return torch.stack([x**3 - 3 * x + y - 1, y - 1 + 0.5 * x])

    u0 = torch.tensor([math.sqrt(7 / 6), 0.0], dtype=DT)
    u, info = nonlinear_solve(F, u0, method="newton", return_info=True)
    assert info.converged and info.attempts[0].trust_region_steps >= 1
    x = float(u[0])
    assert min(abs(x - r) for r in (0.0, math.sqrt(3.5), -math.sqrt(3.5))) < 1e-10
    assert abs(float(u[1]) - (1 - 0.5 * x)) < 1e-10
    Jd = torch.tensor([[3 * (7 / 6) - 3, 1.0], [0.5, 1.0]], dtype=DT)
    if abs(float(torch.linalg.det(Jd))) < 1e-12:  # exactly singular in floating point: LU says so
        with pytest.raises((SingularMatrixError, NotConvergedError)):
            nonlinear_solve(F, u0, method="newton", line_search=False)


# --------------------------------------------------------------------------------------------------
# Vector problems


def neumann_laplacian(u: torch.Tensor, h: float) -> torch.Tensor:
    p = torch.cat([u[:1], u, u[-1:]])
    return (2 * u - p[:-2] - p[2:]) / h**2


def reaction_diffusion(n: int = 12, eps: float = 0.02):
    """-eps u'' + u = tanh(1.5 u + c) + s on (0, 1), Neumann ends (cell centres): the vector form of
    the scalar problem (u = const solves it when s = 0). Fixed-point form: u = A^-1 (tanh(1.5u + c)
    + s) with A = -eps d^2 + I, a contraction near the root (||A^-1|| <= 1, g' = 0.12 there)."""
    h = 1.0 / n
    x = (torch.arange(n, dtype=DT) + 0.5) * h
    s = (0.05 * torch.cos(math.pi * x)).requires_grad_()
    c = torch.tensor(0.5, dtype=DT, requires_grad=True)
    i = torch.arange(n)
    d = torch.full((n,), 2.0, dtype=DT)
    d[0] = d[-1] = 1.0
    A = st.SparseTensor.from_coo(
        torch.cat([eps * d / h**2 + 1, torch.full((2 * (n - 1),), -eps / h**2, dtype=DT)]),
        torch.cat([i, i[:-1], i[1:]]), torch.cat([i, i[1:], i[:-1]]), shape=(n, n), format=CSR,
    )

    def F(u, c, s):
        return eps * neumann_laplacian(u, h) + u - torch.tanh(1.5 * u + c) - s

    return F, A, (c, s)


def hybrd(F, u_start, params, ftol: float = 1e-11):
    """MINPACK's root (its own finite-difference Jacobian), checked: max |F| <= ftol there (hybrd may
    end with "xtol too small" once it sits at the root to rounding)."""
    p = tuple(q.detach() for q in params)
    fun = lambda v: F(torch.from_numpy(v), *p).numpy()  # noqa: E731
    sol = sopt.root(fun, u_start, method="hybr", tol=1e-14)
    assert float(np.abs(fun(sol.x)).max()) < ftol, sol.message
    return sol.x


def test_reaction_diffusion_hands_over_to_the_fixed_point_form():
    F, A, params = reaction_diffusion()
    n = A.shape[0]
    u, info = nonlinear_solve(F, torch.zeros(n, dtype=DT), params, preconditioner=A.detach(), return_info=True)
    check_attempts(info, pinned=False)
    assert info.converged and info.attempts[0].method == "newton" and not info.attempts[0].succeeded
    ref = hybrd(F, np.ones(n), params)  # the upper branch, from u = 1
    np.testing.assert_allclose(u.detach().numpy(), ref, rtol=0, atol=1e-9)
    assert float(u.detach().min()) > 0.9
    # the gradient at the root Picard/Anderson found: against central differences of hybrd roots
    c, s = params
    w = torch.linspace(1, 2, n, dtype=DT)
    (w * u).sum().backward()
    d = 1e-6
    up = hybrd(F, ref, (c.detach() + d, s))
    dn = hybrd(F, ref, (c.detach() - d, s))
    fd = float((w.numpy() * (up - dn)).sum() / (2 * d))
    assert abs(float(c.grad) - fd) < 1e-6 * abs(fd)
    k = 3
    e = torch.zeros(n, dtype=DT)
    e[k] = d
    fd_s = float((w.numpy() * (hybrd(F, ref, (c, s.detach() + e)) - hybrd(F, ref, (c, s.detach() - e)))).sum() / (2 * d))
    assert abs(float(s.grad[k]) - fd_s) < 1e-6 * abs(fd_s)


def dirichlet_laplacian(u: torch.Tensor, h: float) -> torch.Tensor:
    p = torch.nn.functional.pad(u, (1, 1))
    return (2 * u - p[:-2] - p[2:]) / h**2


def bratu_exact(lam: float, x: torch.Tensor) -> torch.Tensor:
    """-u'' = lam e^u, u(0) = u(1) = 0, lower branch: u = -2 log(cosh((x - 1/2) t / 2) / cosh(t / 4))
    with t the smaller root of t = sqrt(2 lam) cosh(t / 4)."""
    t = sopt.brentq(lambda t: t - math.sqrt(2 * lam) * math.cosh(t / 4), 1e-12, 4.7987)  # 4.7987: the fold's t
    return -2 * torch.log(torch.cosh((x - 0.5) * t / 2) / math.cosh(t / 4))


@pytest.mark.parametrize("lam", [1.0, 3.0, 3.5])
def test_bratu_below_the_fold(lam):
    n = 31
    h = 1.0 / (n + 1)
    x = torch.arange(1, n + 1, dtype=DT) * h
    lam_t = torch.tensor(lam, dtype=DT, requires_grad=True)

    def F(u, lam):
        return dirichlet_laplacian(u, h) - lam * torch.exp(u)

    u, info = nonlinear_solve(F, torch.zeros(n, dtype=DT), (lam_t,), return_info=True)
    assert info.converged and info.method == "newton" and len(info.attempts) == 1
    ref = hybrd(F, np.zeros(n), (lam_t,))
    np.testing.assert_allclose(u.detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    # the discrete solutions converge to the exact lower branch at second order (h -> h/2: error / 4)
    err = float((u.detach() - bratu_exact(lam, x)).abs().max())
    n2 = 2 * n + 1
    h2 = 1.0 / (n2 + 1)
    u2 = nonlinear_solve(lambda u, lam: dirichlet_laplacian(u, h2) - lam * torch.exp(u), torch.zeros(n2, dtype=DT), (lam,))
    err2 = float((u2 - bratu_exact(lam, torch.arange(1, n2 + 1, dtype=DT) * h2)).abs().max())
    assert err < 10 * h**2 * float(ref.max()) and 3.5 < err / err2 < 4.5
    u.sum().backward()
    d = 1e-6
    fd = (hybrd(F, ref, (torch.tensor(lam + d, dtype=DT),)).sum() - hybrd(F, ref, (torch.tensor(lam - d, dtype=DT),)).sum()) / (2 * d)
    assert abs(float(lam_t.grad) - fd) < 1e-6 * abs(fd)


def test_bratu_above_the_fold_has_no_root_and_every_method_says_so():
    n = 31
    h = 1.0 / (n + 1)
    F = lambda u, lam: dirichlet_laplacian(u, h) - lam * torch.exp(u)  # noqa: E731
    with pytest.raises(NotConvergedError, match="any method the library tried: newton") as exc:
        nonlinear_solve(F, torch.zeros(n, dtype=DT), (4.0,))
    info = exc.value.info
    check_attempts(info, pinned=False)
    assert [a.method for a in info.attempts] == ["newton", "anderson", "picard"] and not info.converged
    assert all(a.status is not Status.CONVERGED for a in info.attempts)
    assert info.residual == min(info.residual_history) > 1.0  # the best iterate, far from a root


# --------------------------------------------------------------------------------------------------
# The accuracy contract


def test_default_tolerance_follows_the_dtype():
    for dtype in (torch.float64, torch.float32):
        u, info = nonlinear_solve(tanh_F, torch.zeros(3, dtype=dtype), line_search=False, return_info=True)
        assert u.dtype == dtype and info.converged
        assert info.residual <= default_rtol(dtype) * info.initial_residual
        assert float((u.double() - tanh_root()).abs().max()) <= 20 * default_rtol(dtype)


def test_warm_start_stops_at_the_dtypes_precision_and_explicit_rtol_keeps_its_meaning():
    """-u'' + u^3 = f (n = 200, ||A|| ~ 1.6e5) started 1e-9 from the root: the default relative target
    1e-10 ||F(u0)|| lies below the rounding of F, so the default call stops at the dtype's precision
    (converged, u right to 1e-11); rtol=1e-10 given explicitly cannot be met, and says so."""
    n = 200
    h = 1.0 / (n + 1)
    i = torch.arange(n)
    x = torch.linspace(h, 1 - h, n, dtype=DT)
    f = 50 * torch.sin(math.pi * x) + 20

    def F(u, f):
        return dirichlet_laplacian(u, h) + u**3 - f

    def J(u, f):
        vals = torch.cat([2 / h**2 + 3 * u**2, torch.full((2 * (n - 1),), -1 / h**2, dtype=DT)])
        return st.SparseTensor.from_coo(vals, torch.cat([i, i[:-1], i[1:]]), torch.cat([i, i[1:], i[:-1]]),
                                        shape=(n, n), format=CSR)

    ref = torch.from_numpy(hybrd(F, np.zeros(n), (f,), ftol=1e-8))  # F's rounding: ~1e-16 * ||A|| * n
    u0 = ref + 1e-9 * torch.sin(7 * x)
    u, info = nonlinear_solve(F, u0, (f,), jacobian=J, return_info=True)
    assert info.converged and info.extra["at_precision"]
    assert float((u - ref).abs().max()) < 1e-11
    with pytest.raises(NotConvergedError, match=r"rtol=1e-10, atol=0 ask for more than torch.float64 allows"):
        nonlinear_solve(F, u0, (f,), jacobian=J, rtol=1e-10, method="newton")


def test_ill_conditioned_warm_start_stops_at_the_rounding_level_of_F():
    """A u + 1e-3 u^3 = b with cond(A) ~ 4e9, ||A|| ~ 2e6, started 1e-10 from the root: the Newton
    step (~A^-1 times F's rounding) stays far above the rounding of u, but no step decreases
    ||F|| once it is at F's rounding level, eps || |A| |u| || ~ 7e-7: the default call stops there,
    converged, with u as accurate as cond(A) eps allows; an explicit rtol=1e-10 does not."""
    A = 1e6 * torch.tensor([[1.0, 1.0], [1.0, 1.0 + 1e-9]], dtype=DT)
    b = torch.tensor([3e6, 1.0], dtype=DT)
    F = lambda u: A @ u + 1e-3 * u**3 - b  # noqa: E731
    ref = torch.from_numpy(hybrd(F, np.array([1145.0, -1144.0]), (), ftol=1e-6))
    u0 = ref + torch.tensor([1e-10, -1e-10], dtype=DT)
    u, info = nonlinear_solve(F, u0, return_info=True)
    assert info.converged and info.extra["at_precision"] and info.iterations <= 3
    noise = float(torch.finfo(DT).eps) * float(((A.abs() @ u.abs()) + 3e-3 * u.abs() ** 3).norm())
    assert info.residual <= 64 * noise
    assert float((u - ref).abs().max()) <= 1e-5 * float(ref.abs().max())  # ~ cond(A) eps
    with pytest.raises(NotConvergedError):
        nonlinear_solve(F, u0, rtol=1e-10, method="newton")


def test_never_converged_with_a_non_finite_u():
    """F(u) = 1e300 / log(u) tends to 0 only as u -> inf; Newton's iterates grow super-exponentially
    and overflow. atol = 1e297 is met only at u = inf (F(1e308) = 1.4e297): no call may report that.
    (The scale 1e300 keeps J = -F / (u log u) normal, ~1e-12, up to u ~ 1e308.)"""
    G = lambda u: 1e300 / torch.log(u)  # noqa: E731
    u0 = torch.tensor([1e250], dtype=DT)
    with pytest.raises(NotConvergedError) as exc:
        nonlinear_solve(G, u0, method="newton", line_search=False, rtol=0.0, atol=1e297)
    assert exc.value.info.status is Status.NOT_FINITE
    for kw in ({"method": "newton"}, {}):
        u, info = nonlinear_solve(G, u0, rtol=0.0, atol=1e297, on_nonconvergence="ignore", return_info=True, **kw)
        assert not info.converged and bool(torch.isfinite(u).all())
        assert info.residual == pytest.approx(float(G(u)), rel=1e-12)
