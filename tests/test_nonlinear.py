"""nonlinear_solve: solutions against SciPy / dense float64 Newton, gradients against central finite
differences and unrolled dense autograd, the coloring Jacobian against jacfwd, the adjoint on a
non-symmetric Jacobian, plan reuse, and the errors.

Problems (float64):
- ``sym``: 1-D  -u'' + c u^3 = f  (symmetric Jacobian), the Laplacian a sparsetorch CSR matrix.
- ``nonsym``: 1-D  -eps u'' + b u' + c u^3 + sin(u) = f  with central differences: the Jacobian
  is far from symmetric (the convection term dominates), and ``K`` is itself a parameter.
- ``bratu``: 2-D  -Lap u - lam exp(u) = s  on an 8 x 8 grid, written with plain torch slicing (so
  forward-mode AD works through it), u of shape (8, 8).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import InputError, NotConvergedError, NotConvergedWarning
from sparsetorch.format import CSR
from sparsetorch.ops.coloring import greedy_coloring
from sparsetorch.ops.info import Status
from sparsetorch.ops.nonlinear import nonlinear_solve

pytestmark = pytest.mark.usefixtures("single_thread")

DT = torch.float64
N = 24


# --------------------------------------------------------------------------------------------------
# Problems


def tridiag(n: int, lo: float, di: float, up: float) -> st.SparseTensor:
    i = torch.arange(n)
    rows = torch.cat([i, i[:-1], i[1:]])
    cols = torch.cat([i, i[1:], i[:-1]])
    vals = torch.cat([torch.full((n,), di, dtype=DT), torch.full((n - 1,), up, dtype=DT), torch.full((n - 1,), lo, dtype=DT)])
    return st.SparseTensor.from_coo(vals, rows, cols, shape=(n, n), format=CSR)


def with_diagonal(A: st.SparseTensor, d: torch.Tensor) -> st.SparseTensor:
    """A + diag(d) on A's pattern (A has a full diagonal); differentiable in A's values and d."""
    coords, slot = A.entries()
    on = coords[0] == coords[1]
    add = torch.zeros(A.values.shape, dtype=d.dtype).index_put((slot[on],), d[coords[0][on]], accumulate=True)
    return A.with_values(A.values + add)


def sym_problem(n: int = N):
    h = 1.0 / (n + 1)
    L = tridiag(n, -1 / h**2, 2 / h**2, -1 / h**2)
    x = torch.linspace(h, 1 - h, n, dtype=DT)
    f = (10 * torch.sin(math.pi * x) + 5 * x).requires_grad_()
    c = torch.tensor(3.0, dtype=DT, requires_grad=True)

    def F(u, f, c):
        return L @ u + c * u**3 - f

    def J(u, f, c):
        return with_diagonal(L, 3 * c * u**2)

    return F, J, L, (f, c)


def nonsym_problem(n: int = N):
    h = 1.0 / (n + 1)
    eps, b = 0.02, 1.0
    K = tridiag(n, -eps / h**2 - b / (2 * h), 2 * eps / h**2, -eps / h**2 + b / (2 * h))
    K = K.with_values(K.values.clone().requires_grad_())
    x = torch.linspace(h, 1 - h, n, dtype=DT)
    f = (2 + torch.cos(3 * x)).requires_grad_()
    c = torch.tensor(0.7, dtype=DT, requires_grad=True)

    def F(u, K, f, c):
        return K @ u + c * u**3 + torch.sin(u) - f

    def J(u, K, f, c):
        return with_diagonal(K, 3 * c * u**2 + torch.cos(u))

    return F, J, K, (K, f, c)


def laplacian_2d(u: torch.Tensor) -> torch.Tensor:
    """5-point -Lap u * h^2 with zero Dirichlet boundary, plain torch (forward and reverse AD)."""
    p = torch.nn.functional.pad(u, (1, 1, 1, 1))
    return 4 * u - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]


def bratu_problem(m: int = 8):
    h = 1.0 / (m + 1)
    lam = torch.tensor(2.0, dtype=DT, requires_grad=True)
    g = torch.linspace(0, 1, m, dtype=DT)
    s = (torch.outer(g, 1 - g) + 0.5).requires_grad_()

    def F(u, lam, s):
        return laplacian_2d(u) / h**2 - lam * torch.exp(u) - s

    k = torch.arange(m * m)
    r, cc = k // m, k % m
    rows, cols = [k], [k]
    for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
        ok = (r + dr >= 0) & (r + dr < m) & (cc + dc >= 0) & (cc + dc < m)
        rows.append(k[ok])
        cols.append(((r + dr) * m + cc + dc)[ok])
    pattern = (torch.cat(rows), torch.cat(cols))
    return F, pattern, (lam, s), m


def dense_newton(F, u0, params, iters=60):
    """Plain dense float64 Newton (torch.func.jacrev + torch.linalg.solve), no sparsetorch solver."""
    u = u0.detach().clone()
    p = tuple(q.detach() if isinstance(q, torch.Tensor) else (q.detach() if isinstance(q, st.SparseTensor) else q) for q in params)
    for _ in range(iters):
        r = F(u, *p)
        if float(r.norm()) < 1e-14:
            break
        Jd = torch.func.jacrev(lambda v: F(v.reshape(u.shape), *p).reshape(-1))(u.reshape(-1))
        u = u - torch.linalg.solve(Jd, r.reshape(-1)).reshape(u.shape)
    return u


def scipy_root(F, u0, params):
    sopt = pytest.importorskip("scipy.optimize")
    import numpy as np

    p = tuple(q.detach() if isinstance(q, (torch.Tensor, st.SparseTensor)) else q for q in params)

    def fun(v):
        return F(torch.from_numpy(v).reshape(u0.shape), *p).reshape(-1).numpy()

    # MINPACK hybrd with its own finite-difference Jacobian: independent of any AD here.
    sol = sopt.root(fun, u0.detach().reshape(-1).numpy().astype(np.float64), method="hybr", tol=1e-14)
    # hybrd may end with "xtol is too small, no further improvement" (status 3) once it sits at
    # the root to rounding (seen with SciPy 1.17 / NumPy 2.4): accept that only if F is tiny there
    scale = max(1.0, float(np.abs(fun(u0.detach().reshape(-1).numpy())).max()))
    assert sol.success or (sol.status == 3 and float(np.abs(fun(sol.x)).max()) <= 1e-10 * scale), sol.message
    return torch.from_numpy(sol.x).reshape(u0.shape)


def loss_of(u: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1, 2, u.numel(), dtype=DT).reshape(u.shape)
    return (w * u).sum() + (u**2).sum()


def grads(F, u0, params, leaves, **kw):
    for t in leaves:
        t.grad = None
    u = nonlinear_solve(F, u0, params, **kw)
    loss_of(u).backward()
    out = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    return u.detach(), out


def leaves_of(params):
    return [p.values if isinstance(p, st.SparseTensor) else p for p in params if isinstance(p, (torch.Tensor, st.SparseTensor))]


# --------------------------------------------------------------------------------------------------
# Solutions


@pytest.mark.parametrize("method", ["newton", "anderson", "picard"])
@pytest.mark.parametrize("which", ["sym", "nonsym"])
def test_methods_agree_with_scipy_root(method, which):
    F, J, A, params = sym_problem() if which == "sym" else nonsym_problem()
    u0 = torch.zeros(N, dtype=DT)
    ref = scipy_root(F, u0, params)
    kw: dict = {"method": method}
    if method == "newton":
        kw["jacobian"] = J
    else:  # the fixed-point map u - M^-1 F(u): lagged Picard with the linear part, or the chord method
        kw["preconditioner"] = A.detach() if which == "sym" else "jacobian"
        kw["jacobian"] = J
    u, info = nonlinear_solve(F, u0, params, return_info=True, **kw)
    assert info.converged and info.status is Status.CONVERGED and info.method == method
    torch.testing.assert_close(u, ref, rtol=1e-8, atol=1e-8 * float(ref.abs().max()))
    assert info.residual <= 1e-10 * info.initial_residual
    assert len(info.residual_history) == info.iterations + 1
    if method == "newton":
        assert info.iterations <= 12  # quadratic convergence, not a fixed-point crawl
        assert all(b < a for a, b in zip(info.residual_history, info.residual_history[1:]))


def test_all_jacobian_sources_give_one_solution_and_gradient():
    F, J, K, params = nonsym_problem()
    u0 = torch.zeros(N, dtype=DT)
    leaves = leaves_of(params)
    pattern = K.detach()

    def F_with_J(u, K, f, c):
        return F(u, K, f, c), J(u, K, f, c)

    runs = {
        "user": grads(F, u0, params, leaves, jacobian=J),
        "returned": grads(F_with_J, u0, params, leaves),
        "dense": grads(F, u0, params, leaves),
        "coloring": grads(F, u0, params, leaves, jac_pattern=pattern),
        "coloring-pair": grads(F, u0, params, leaves, jac_pattern=tuple(pattern.entries()[0])),
        "matrix-free": grads(F, u0, params, leaves, jacobian="matrix-free"),
        "anderson": grads(F, u0, params, leaves, method="anderson", preconditioner="jacobian", jac_pattern=pattern),
    }
    u_ref, g_ref = runs["user"]
    assert torch.allclose(u_ref, dense_newton(F, u0, params), rtol=1e-10, atol=1e-12)
    for name, (u, g) in runs.items():
        torch.testing.assert_close(u, u_ref, rtol=1e-8, atol=1e-10, msg=name)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9, msg=name)


def test_bratu_2d_grid_shape_coloring_and_methods():
    F, pattern, params, m = bratu_problem()
    u0 = torch.zeros(m, m, dtype=DT)
    ref = dense_newton(F, u0, params)
    for kw in (dict(jac_pattern=pattern), dict(jac_pattern=pattern, ad="forward"), dict(jacobian="matrix-free", ad="forward"),
               dict(method="anderson", depth=8, preconditioner="jacobian", jac_pattern=pattern)):
        u, info = nonlinear_solve(F, u0, params, return_info=True, **kw)
        assert u.shape == (m, m) and info.converged, kw
        torch.testing.assert_close(u, ref, rtol=1e-8, atol=1e-10)
    u, info = nonlinear_solve(F, u0, params, jac_pattern=pattern, return_info=True)
    assert info.jacobian == "coloring" and 5 <= info.colors <= 9  # 5-point stencil, whatever the grid size


# --------------------------------------------------------------------------------------------------
# Gradients


def central_fd(fun, leaves, directions, h: float = 1e-5) -> float:
    """Central difference of ``fun()`` along ``directions`` (one per leaf, all moved together)."""
    with torch.no_grad():
        base = [t.detach().clone() for t in leaves]
        vals = []
        for sign in (1, -1):
            for t, b, d in zip(leaves, base, directions):
                t.data.copy_(b + sign * h * d)
            vals.append(float(fun()))
        for t, b in zip(leaves, base):
            t.data.copy_(b)
    return (vals[0] - vals[1]) / (2 * h)


@pytest.mark.parametrize(
    "which, jac",
    [("sym", "user"), ("sym", "coloring"), ("nonsym", "user"), ("nonsym", "coloring"), ("nonsym", "matrix-free")],
)
def test_gradients_match_central_differences(which, jac):
    F, J, A, params = sym_problem() if which == "sym" else nonsym_problem()
    u0 = torch.zeros(N, dtype=DT)
    kw = {"user": dict(jacobian=J), "coloring": dict(jac_pattern=A.detach()), "matrix-free": dict(jacobian="matrix-free")}[jac]
    kw["rtol"] = 1e-14
    if jac == "matrix-free":
        kw["linear_options"] = {"rtol": 1e-13}
    leaves = leaves_of(params)
    _, g = grads(F, u0, params, leaves, **kw)
    gen = torch.Generator().manual_seed(7)
    for k in range(len(leaves)):  # each parameter alone, then all together
        ds = [torch.randn(t.shape, generator=gen, dtype=DT) * (i == k) for i, t in enumerate(leaves)]
        if jac != "user":
            ds = [torch.randn(t.shape, generator=gen, dtype=DT) for t in leaves]
        fd = central_fd(lambda: loss_of(nonlinear_solve(F, u0, params, **kw)), leaves, ds)
        ad = sum(float((gt * d).sum()) for gt, d in zip(g, ds))
        assert abs(ad - fd) <= 1e-5 * abs(fd), (which, jac, k, ad, fd)
        if jac != "user":
            break


def test_gradcheck_full_jacobian_nonsymmetric():
    F, J, K, (Kp, f, c) = nonsym_problem(6)
    u0 = torch.zeros(6, dtype=DT)

    def run(vals, f, c):
        return nonlinear_solve(F, u0, (Kp.detach().with_values(vals), f, c), jacobian=J, rtol=1e-14)

    assert torch.autograd.gradcheck(run, (Kp.values.detach().clone().requires_grad_(), f.detach().clone().requires_grad_(),
                                          c.detach().clone().requires_grad_()), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradient_equals_unrolled_dense_autograd():
    F, J, K, params = nonsym_problem()
    u0 = torch.zeros(N, dtype=DT)
    leaves = leaves_of(params)
    _, g = grads(F, u0, params, leaves, jacobian=J)
    # Unrolled: dense Newton written in plain torch, differentiated through all its iterations.
    Kd_vals = params[0].values
    u = u0.clone()
    for _ in range(12):
        Kp = params[0].detach().with_values(Kd_vals)
        Jd = J(u, Kp, params[1], params[2]).to_dense()
        u = u - torch.linalg.solve(Jd, F(u, Kp, params[1], params[2]))
    loss_of(u).backward()
    for t, gt in zip(leaves, g):
        torch.testing.assert_close(gt, t.grad, rtol=1e-8, atol=1e-10)
        t.grad = None


def test_adjoint_is_a_real_transpose_solve():
    """With an iterative linear solver on a non-symmetric J, the adjoint must solve J^T lambda = g.
    Solving J lambda = g instead (a symmetric assumption) gives a clearly different gradient here."""
    F, J, K, params = nonsym_problem()
    u0 = torch.zeros(N, dtype=DT)
    leaves = leaves_of(params)
    _, g_lu = grads(F, u0, params, leaves, jacobian=J)
    for method in ("gmres", "bicgstab"):
        u, info = nonlinear_solve(F, u0, params, jacobian=J, return_info=True,
                                  linear_options={"backend": "torch", "method": method, "rtol": 1e-12})
        loss_of(u).backward()
        assert info.linear_method == method and info.plans_built == 1
        adj = info.extra["adjoint"]
        assert len(adj) == 1 and adj[0].converged
        for t, gt in zip(leaves, g_lu):
            torch.testing.assert_close(t.grad, gt, rtol=1e-7, atol=1e-9)
            t.grad = None
    # What a symmetric assumption would give, for contrast (the test would catch it).
    with torch.no_grad():
        us = u.detach()
        Jd = J(us, *[p.detach() if isinstance(p, (torch.Tensor, st.SparseTensor)) else p for p in params]).to_dense()
        gu = torch.linspace(-1, 2, N, dtype=DT) + 2 * us
        wrong = torch.linalg.solve(Jd, gu)  # lambda from J, not J^T
        right = torch.linalg.solve(Jd.T, gu)
    assert float((wrong - right).norm()) > 0.1 * float(right.norm())
    torch.testing.assert_close(g_lu[1], right, rtol=1e-8, atol=1e-10)  # dF/df = -I, so dL/df = lambda


def test_sparse_parameter_gradient_lives_on_the_pattern():
    F, J, K, params = nonsym_problem()
    u = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J)
    loss_of(u).backward()
    gK = params[0].values.grad
    assert gK.shape == params[0].values.shape and bool(torch.isfinite(gK).all()) and float(gK.abs().max()) > 0
    # dL/dK_ij = -lambda_i u_j on the pattern (the linear term K u)
    with torch.no_grad():
        us = u.detach()
        Jd = J(us, params[0].detach(), params[1].detach(), params[2].detach()).to_dense()
        lam = torch.linalg.solve(Jd.T, torch.linspace(-1, 2, N, dtype=DT) + 2 * us)
        coords, slot = params[0].entries()
        expect = torch.zeros_like(gK).index_put((slot,), -lam[coords[0]] * us[coords[1]], accumulate=True)
    torch.testing.assert_close(gK, expect, rtol=1e-8, atol=1e-10)


def test_graph_is_one_node_whatever_the_iteration_count():
    F, J, L, params = sym_problem()
    sizes = []
    for rtol, maxiter in ((1e-2, 50), (1e-14, 50)):
        saved = []

        def pack(t):
            saved.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            u, info = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, rtol=rtol, maxiter=maxiter, return_info=True)
        sizes.append((info.iterations, sum(saved)))
    (it_a, bytes_a), (it_b, bytes_b) = sizes
    assert it_a < it_b and bytes_a == bytes_b == N + params[0].numel() + params[1].numel()


def test_u0_gets_no_gradient_and_inputs_are_not_modified():
    F, J, L, (f, c) = sym_problem()
    u0 = torch.linspace(0, 1, N, dtype=DT).requires_grad_()
    u0_before, f_before, c_before = u0.detach().clone(), f.detach().clone(), c.detach().clone()
    u = nonlinear_solve(F, u0, (f, c), jacobian=J)
    loss_of(u).backward()
    assert u0.grad is None and f.grad is not None
    assert torch.equal(u0.detach(), u0_before) and torch.equal(f.detach(), f_before) and torch.equal(c.detach(), c_before)
    # a root as u0: no iteration, and the result is not an alias of u0
    u2, info = nonlinear_solve(F, u.detach(), (f.detach(), c.detach()), jacobian=J, atol=1e-7, return_info=True)
    assert info.iterations == 0 and u2.data_ptr() != u.data_ptr()


# --------------------------------------------------------------------------------------------------
# Coloring


def test_coloring_jacobian_equals_dense_jacfwd_on_the_pattern():
    F, (rows, cols), params, m = bratu_problem()
    from sparsetorch.ops.coloring import colored_jacobian

    p = tuple(q.detach() for q in params)
    fn = lambda x: F(x.reshape(m, m), *p).reshape(-1)  # noqa: E731
    x = torch.linspace(-0.3, 0.4, m * m, dtype=DT)
    dense = torch.func.jacfwd(fn)(x)
    cj = colored_jacobian((rows, cols), m * m, x.device, DT)
    for ad in ("forward", "reverse"):
        Jc = cj.jacobian(fn, x, ad).to_dense()
        mask = torch.zeros_like(dense, dtype=torch.bool)
        mask[rows, cols] = True
        torch.testing.assert_close(Jc, torch.where(mask, dense, torch.zeros_like(dense)), rtol=1e-13, atol=1e-12)
        assert bool((dense[~mask] == 0).all())


def test_greedy_coloring_is_a_distance_2_coloring():
    gen = torch.Generator().manual_seed(3)
    for n, nnz in ((30, 60), (50, 400), (7, 49)):
        rows = torch.randint(0, n, (nnz,), generator=gen)
        cols = torch.randint(0, n, (nnz,), generator=gen)
        colors, k = greedy_coloring(rows, cols, n, n)
        assert colors.shape == (n,) and int(colors.max()) == k - 1
        # any two columns sharing a row have different colors
        for i in range(n):
            cs = cols[rows == i].unique()
            assert colors[cs].unique().numel() == cs.numel()
    # a tridiagonal pattern needs exactly 3 colors
    i = torch.arange(20)
    _, k = greedy_coloring(torch.cat([i, i[:-1], i[1:]]), torch.cat([i, i[1:], i[:-1]]), 20, 20)
    assert k == 3


# --------------------------------------------------------------------------------------------------
# Plans


def test_one_linear_plan_across_newton_steps():
    F, J, K, params = nonsym_problem()
    u, info = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, return_info=True)
    # J is rebuilt by from_coo at every step (new index buffers, same pattern): one plan, reloaded
    assert info.iterations >= 3 and info.plans_built == 1 and info.jacobian_evaluations == info.iterations
    assert len(info.linear_iterations) == info.iterations and info.linear_backend is not None


def test_scipy_backend_lu_with_transpose_solve():
    names = st.registry().names
    if "scipy" not in (names() if callable(names) else names):
        pytest.skip("the scipy plugin is not installed")
    F, J, K, params = nonsym_problem()
    leaves = leaves_of(params)
    _, g_ref = grads(F, torch.zeros(N, dtype=DT), params, leaves, jacobian=J)
    u, info = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, return_info=True,
                              linear_options={"backend": "scipy", "method": "lu"})
    loss_of(u).backward()
    assert info.linear_backend == "scipy" and info.linear_method == "lu" and info.plans_built == 1
    for t, gt in zip(leaves, g_ref):
        torch.testing.assert_close(t.grad, gt, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------------
# Errors


def test_error_jacobian_wrong_shape():
    F, J, L, params = sym_problem()
    bad = lambda u, f, c: tridiag(N + 1, -1, 2, -1)  # noqa: E731
    with pytest.raises(InputError, match=r"shape \(25, 25\).*\(24, 24\)"):
        nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=bad)


def test_error_residual_not_finite_at_start_and_later():
    F, J, L, params = sym_problem()
    with pytest.raises(InputError, match="iteration 0"):
        nonlinear_solve(lambda u, f, c: F(u, f, c) / u.sum(), torch.zeros(N, dtype=DT), params, jacobian=J)

    def G(u, f, c):  # fine at u0 = 1 and at u1 = 51, NaN once the second Picard step makes u negative
        return torch.sqrt(u) - 2 + 0 * f.sum() + 0 * c

    with pytest.raises(NotConvergedError, match="NaN or Inf at iteration 2") as exc:
        nonlinear_solve(G, torch.ones(N, dtype=DT), params, method="picard", omega=50.0)
    assert exc.value.info.status is Status.NOT_FINITE
    with pytest.warns(NotConvergedWarning, match="NaN or Inf"):
        u = nonlinear_solve(G, torch.ones(N, dtype=DT), params, method="picard", omega=50.0, on_nonconvergence="warn")
    torch.testing.assert_close(u, torch.full((N,), 51.0, dtype=DT))  # the last finite iterate


def test_nonconvergence_policies():
    F, J, L, params = sym_problem()
    with pytest.raises(NotConvergedError, match="maxiter \\(2\\)") as exc:
        nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, maxiter=2, method="newton")
    assert exc.value.info.iterations == 2 and not exc.value.info.converged
    assert [a.method for a in exc.value.info.attempts] == ["newton"] and exc.value.info.method_pinned
    # Not pinned: Newton stops at maxiter (per attempt), then Anderson and Picard (G = u - F(u) is no
    # contraction for -u'' + c u^3: they stop early, diverging) are tried and recorded.
    with pytest.raises(NotConvergedError, match="any method the library tried") as exc:
        nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, maxiter=2)
    info = exc.value.info
    assert [a.method for a in info.attempts] == ["newton", "anderson", "picard"]
    assert info.attempts[0].status is Status.MAX_ITERATIONS and info.attempts[0].iterations == 2
    assert not any(a.succeeded for a in info.attempts) and all(a.chosen_by == "library" for a in info.attempts)
    assert info.iterations == sum(a.iterations for a in info.attempts) == len(info.residual_history) - 1
    assert info.residual == min(info.residual_history)  # every method failed: the best iterate is returned
    with pytest.warns(NotConvergedWarning):
        u = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, maxiter=2, on_nonconvergence="warn")
    assert u.shape == (N,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, maxiter=2, on_nonconvergence="ignore")


def test_line_search_failure_with_a_wrong_jacobian():
    F, J, L, params = sym_problem()
    wrong = lambda u, f, c: J(u, f, c).with_values(-J(u, f, c).values)  # noqa: E731 ascent direction
    with pytest.raises(NotConvergedError, match="line search at iteration 1.*dogleg trust-region step found no") as exc:
        nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=wrong, method="newton")
    assert exc.value.info.status is Status.BREAKDOWN and exc.value.info.iterations == 0
    assert "method='anderson'" in str(exc.value)  # a pinned method names what to try


@pytest.mark.parametrize(
    "u0, match",
    [
        (torch.zeros(N, dtype=torch.int64), "floating dtype"),
        (torch.zeros(N, dtype=torch.complex128), "complex"),
        ([0.0] * N, "torch.Tensor"),
        (torch.full((N,), float("nan"), dtype=DT), "NaN"),
    ],
)
def test_error_bad_u0(u0, match):
    F, J, L, params = sym_problem()
    with pytest.raises(InputError, match=match):
        nonlinear_solve(F, u0, params)


def test_error_u0_shape_against_the_pattern():
    F, J, L, params = sym_problem()
    G = lambda u, f, c: u**3 - 1  # noqa: E731 shape-agnostic
    with pytest.raises(InputError, match=r"jac_pattern has shape \(24, 24\); for u with 26 entries"):
        nonlinear_solve(G, torch.zeros(N + 2, dtype=DT), params, jac_pattern=L.detach())


def test_error_f_wrong_shape_dtype_and_options():
    F, J, L, params = sym_problem()
    u0 = torch.zeros(N, dtype=DT)
    with pytest.raises(InputError, match=r"residual of shape \(23,\)"):
        nonlinear_solve(lambda u, f, c: F(u, f, c)[1:], u0, params)
    with pytest.raises(InputError, match="dtype torch.float32"):
        nonlinear_solve(lambda u, f, c: F(u, f, c).float(), u0, params)
    with pytest.raises(InputError, match="method must be one of"):
        nonlinear_solve(F, u0, params, method="broyden")
    with pytest.raises(InputError, match="unknown options"):
        nonlinear_solve(F, u0, params, linear_options={"tolerance": 1e-3})
    with pytest.raises(InputError, match="jacobian='coloring' needs jac_pattern"):
        nonlinear_solve(F, u0, params, jacobian="coloring")
    with pytest.raises(InputError, match="damping"):
        nonlinear_solve(F, u0, params, method="anderson", damping=0.0)
    with pytest.raises(InputError, match="from_dense"):
        nonlinear_solve(F, u0, params, method="picard", preconditioner=torch.eye(N, dtype=DT))
    with pytest.raises(InputError, match="preconditioner= is for method='anderson'/'picard'"):
        nonlinear_solve(F, u0, params, method="newton", preconditioner="jacobian")


def test_error_pattern_missing_entries():
    F, J, L, params = sym_problem()
    i = torch.arange(N)
    with pytest.raises(InputError, match="outside jac_pattern"):
        nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jac_pattern=(i, i))  # diagonal only


def test_forward_ad_through_sparse_matmul():
    """sparsetorch's matmul has a forward-mode rule: ad='forward' (column coloring by JVPs, and
    matrix-free Newton) gives the reverse-mode answer."""
    F, J, L, params = sym_problem()
    u_rev = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jac_pattern=L.detach())
    for kw in (dict(jac_pattern=L.detach(), ad="forward"), dict(jacobian="matrix-free", ad="forward")):
        u_fwd = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, **kw)
        torch.testing.assert_close(u_fwd, u_rev, rtol=1e-8, atol=1e-10)
    assert float(F(u_rev.detach(), *[p.detach() for p in params]).abs().max()) < 1e-6


class _NoForwardRule(torch.autograd.Function):
    @staticmethod
    def forward(u):
        return u * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_error_forward_ad_through_an_op_without_a_rule_says_what_to_do():
    F, J, L, params = sym_problem()

    def G(u, f, c):
        return F(_NoForwardRule.apply(u) / 2, f, c)

    with pytest.raises(InputError, match="ad='reverse'"):
        nonlinear_solve(G, torch.zeros(N, dtype=DT), params, jac_pattern=L.detach(), ad="forward")


def test_jacobian_symmetric_at_u0_only_is_planned_as_general():
    """Burgers-like: J = L + diag(D u) + diag(u) D is SPD at u0 = 0 and non-symmetric afterwards;
    a plan chosen from J(u0)'s detected properties (CG) would be wrong for the later steps."""
    n = N
    h = 1.0 / (n + 1)
    L = tridiag(n, -1 / h**2, 2 / h**2, -1 / h**2)
    D = tridiag(n, -1 / (2 * h), 0.0, 1 / (2 * h))
    f = torch.linspace(1, 30, n, dtype=DT)

    def F(u, f):
        return L @ u + 5 * u * (D @ u) - f

    seen = []
    u, info = nonlinear_solve(F, torch.zeros(n, dtype=DT), (f,), jac_pattern=L.detach(), return_info=True,
                              callback=lambda it, res: seen.append((it, res)))
    assert info.converged and info.linear_method in ("lu", "gmres", "bicgstab") and info.plans_built == 1
    torch.testing.assert_close(u, dense_newton(F, torch.zeros(n, dtype=DT), (f,)), rtol=1e-9, atol=1e-11)
    assert [it for it, _ in seen] == list(range(info.iterations + 1))
    assert [r for _, r in seen] == list(info.residual_history)
    assert info.function_evaluations >= info.iterations + 1


def test_bare_parameter_constants_and_float32():
    F32 = torch.float32
    a = torch.tensor([1.0, 2.0, 3.0], dtype=F32, requires_grad=True)

    def F(u, a, power, label):  # u^power + u - a = 0, componentwise; power and label are constants
        assert label == "constant passed as is"
        return u**power + u - a

    u = nonlinear_solve(F, torch.zeros(3, dtype=F32), (a, 3, "constant passed as is"))
    assert u.dtype == F32
    torch.testing.assert_close(u**3 + u, a.detach(), rtol=1e-4, atol=1e-4)
    u.sum().backward()
    torch.testing.assert_close(a.grad, 1 / (3 * u.detach() ** 2 + 1), rtol=1e-4, atol=1e-5)  # du/da = 1 / F'(u)
    b = torch.tensor([0.5, 1.5], dtype=DT, requires_grad=True)  # one tensor, not in a tuple
    v = nonlinear_solve(lambda u, b: torch.tanh(u) + u - b, torch.zeros(2, dtype=DT), b)
    v.sum().backward()
    torch.testing.assert_close(b.grad, 1 / (1 - torch.tanh(v.detach()) ** 2 + 1), rtol=1e-12, atol=0)


def test_returned_jacobian_is_reused_from_the_accepted_evaluation():
    F, J, L, params = sym_problem()
    calls = []

    def F_with_J(u, f, c):
        calls.append(1)
        return F(u, f, c), J(u, f, c)

    u, info = nonlinear_solve(F_with_J, torch.zeros(N, dtype=DT), params, return_info=True)
    assert info.jacobian == "returned" and info.converged
    # u0 once, then one evaluation per accepted full step: its J serves the next Newton step
    assert info.function_evaluations == len(calls) == info.iterations + 1
    assert info.jacobian_evaluations == info.iterations


def test_linear_plan_shared_across_calls_on_one_pattern():
    """A Jacobian rebuilt with fresh index buffers in every call still meets the plan of the
    previous call (a training loop plans once)."""
    F, J, K, params = nonsym_problem()
    _, first = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, return_info=True)
    u, second = nonlinear_solve(F, torch.zeros(N, dtype=DT), params, jacobian=J, return_info=True)
    assert second.plan_reused and second.plans_built == 1
    loss_of(u).backward()  # the adjoint solve on the shared plan, with this call's values
    g = [t.grad.clone() for t in leaves_of(params)]
    for t in leaves_of(params):
        t.grad = None
    _, g_fresh = grads(F, torch.zeros(N, dtype=DT), params, leaves_of(params), jacobian=J, linear_options={"cache": False})
    for a, b in zip(g, g_fresh):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _poisson_cubic(m: int = 10):
    import numpy as np
    import scipy.sparse as sp

    h = 1.0 / (m + 1)
    T = sp.diags([2 * np.ones(m), -np.ones(m - 1), -np.ones(m - 1)], [0, 1, -1])
    S = sp.coo_matrix((sp.kron(T, sp.eye(m)) + sp.kron(sp.eye(m), T)) / h**2)
    n = m * m
    K = st.SparseTensor.from_coo(torch.tensor(S.data), torch.tensor(S.row), torch.tensor(S.col), shape=(n, n),
                                 format="CSR")
    return K, n


def test_a_far_start_is_not_called_converged_far_from_the_root():
    """From u0 = 1e6 the relative test ||F(u)|| <= 1e-10 ||F(u0)|| was met with ||F|| = 1.8e9, u 451 from the root
    ("converged"); Bratu from u0 = 50 stopped 6.4 from the root with ||F|| = 2.8e3 (session 24's sweep). A default
    call now also asks Newton's last full step to be small; the far cubic start reaches the root (against the
    solution from u0 = 0, checked by its residual), the Bratu start raises NotConvergedError."""
    K, n = _poisson_cubic()
    f = torch.linspace(-10, 10, n, dtype=torch.float64)

    def F(u):
        return K @ u + 2 * u**3 - f

    root = st.nonlinear_solve(F, torch.zeros(n, dtype=torch.float64))
    assert float(torch.linalg.vector_norm(F(root))) < 1e-8 * float(torch.linalg.vector_norm(f))
    for start in (1e3, 1e6):
        u, info = st.nonlinear_solve(F, torch.full((n,), start, dtype=torch.float64), return_info=True)
        assert info.converged and float((u - root).abs().max()) < 1e-10, (start, info.residual)

    def bratu(u):
        return K @ u - 3 * torch.exp(u)

    with pytest.raises(st.NotConvergedError, match="not yet at a root"):
        st.nonlinear_solve(bratu, torch.full((n,), 50.0, dtype=torch.float64))
    # an explicit rtol keeps its meaning (the relative test alone)
    u, info = st.nonlinear_solve(bratu, torch.full((n,), 50.0, dtype=torch.float64), rtol=1e-10, return_info=True,
                                 on_nonconvergence="ignore")
    assert info.residual <= 1e-10 * info.initial_residual


def test_torch_func_transforms_over_nonlinear_solve_are_named():
    """Documented as unsupported; they surfaced as torch's internal errors ("Cannot access data pointer",
    "data-dependent control flow", ".item()"; session 26's sweep)."""
    import sparsetorch as st

    F = lambda u, p: u ** 3 + u - p  # noqa: E731
    fn = lambda p: st.nonlinear_solve(F, torch.zeros(1, dtype=DT), (p,)).sum()  # noqa: E731
    for transform in (torch.func.grad, torch.func.vmap, torch.func.jacrev):
        with pytest.raises(st.InputError, match="does not run under torch.func"):
            transform(fn)(torch.ones(1, dtype=DT))
    p = torch.ones(1, dtype=DT, requires_grad=True)
    st.nonlinear_solve(F, torch.zeros(1, dtype=DT), (p,)).sum().backward()
    u = torch.tensor([0.6823278038280193], dtype=DT)  # the root of u^3 + u = 1
    torch.testing.assert_close(p.grad, 1 / (3 * u ** 2 + 1), rtol=1e-9, atol=0)  # du/dp by the implicit function


def test_matrix_free_newton_caps_its_inner_gmres_and_says_why():
    """Without jac_pattern above 512 unknowns Newton goes matrix-free; unpreconditioned GMRES on a 1-D Bratu problem
    ran to its 10 n default at every step (30,000 products, ~29 s a step; a default call past 14 minutes; session
    26's sweep). Each step is capped (NEWTON_GMRES_MAXITER: an inexact step is still a descent direction), once
    with a warning that names jac_pattern=; with the pattern the same problem converges."""
    import sparsetorch as st
    from sparsetorch.ops.nonlinear._newton import NEWTON_GMRES_MAXITER

    n = 1200
    h = 1 / (n + 1)
    i = torch.arange(n)
    L = st.SparseTensor.from_coo(torch.cat([2 * torch.ones(n), -torch.ones(2 * n - 2)]).to(DT) / h ** 2,
                                 torch.cat([i, i[1:], i[:-1]]), torch.cat([i, i[:-1], i[1:]]), shape=(n, n))
    F = lambda u, lam: L @ u - lam * torch.exp(u)  # noqa: E731
    with pytest.warns(st.SparseTorchWarning, match="jac_pattern="):
        u, info = st.nonlinear_solve(F, torch.zeros(n, dtype=DT), (3.0,), method="newton", maxiter=2,
                                     on_nonconvergence="ignore", return_info=True)
    assert info.jacobian == "matrix-free" and max(info.linear_iterations) <= NEWTON_GMRES_MAXITER
    u, info = st.nonlinear_solve(F, torch.zeros(n, dtype=DT), (3.0,), jac_pattern=L, return_info=True)
    assert info.converged and float((F(u, 3.0)).norm()) <= 1e-6 * float(F(torch.zeros(n, dtype=DT), 3.0).norm())
