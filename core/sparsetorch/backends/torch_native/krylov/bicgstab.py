"""Right-preconditioned BiCGStab (van der Vorst) for general square systems.

Per column (every ``(batch, column)`` pair of ``(*batch, n, k)`` is its own system), with the
shadow residual ``rh = r0``::

    rho = rh^H r;  beta = (rho / rho_old) (alpha / omega);  p = r + beta (p - omega v)
    ph = M^-1 p;  v = A ph;  alpha = rho / rh^H v;  s = r - alpha v
    sh = M^-1 s;  t = A sh;  omega = t^H s / t^H t
    x += alpha ph + omega sh;  r = s - omega t

A column whose half-step residual ``s`` already meets the tolerance takes ``omega = 0``.
Breakdowns stop the column with ``Status.BREAKDOWN``: ``rh^H r ~ 0`` or ``rh^H A p ~ 0``
(relative to the norms, at eps^2) and ``omega ~ 0`` (``|t^H s| <= eps ||t|| ||s||``; the
update with that omega is still applied, as in SciPy).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....ops.info import IterationResult, Status
from ._common import (
    FIRST_SOLVER_CODE, Callback, Event, Operator, Problem, col, dot, norm, prepare, run, safe,
)

__all__ = ["bicgstab"]

_BREAKDOWN_RHO = FIRST_SOLVER_CODE
_BREAKDOWN_RV = FIRST_SOLVER_CODE + 1
_BREAKDOWN_OMEGA = FIRST_SOLVER_CODE + 2

_EVENTS = {
    _BREAKDOWN_RHO: Event(
        Status.BREAKDOWN,
        "BiCGStab broke down at iteration {it}{where}: |rho| = |r0^H r| = {value:.1e} is zero "
        "relative to the norms (the residual became orthogonal to the shadow residual r0); "
        "use gmres, or restart from this x",
    ),
    _BREAKDOWN_RV: Event(
        Status.BREAKDOWN,
        "BiCGStab broke down at iteration {it}{where}: |r0^H A M^-1 p| = {value:.1e} is zero "
        "relative to the norms, so alpha is undefined; use gmres, or restart from this x",
    ),
    _BREAKDOWN_OMEGA: Event(
        Status.BREAKDOWN,
        "BiCGStab broke down at iteration {it}{where}: omega = t^H s / t^H t = {value:.1e} (the "
        "stabilising step made no progress, typical of a matrix with a strongly imaginary "
        "spectrum); use gmres",
    ),
}


class _BiCGStab:
    """BiCGStab state; ``step`` does one iteration (two matvecs) on every running column."""

    def __init__(self, problem: Problem, x: Tensor, r: Tensor, it: int) -> None:
        self.problem = problem
        self.x = x
        self.r = r
        self.rh = r
        self.rh_norm = norm(r)
        one = torch.ones_like(self.rh_norm, dtype=r.dtype)
        self.rho_old, self.alpha, self.omega = one, one, one
        self.p = torch.zeros_like(r)
        self.v = torch.zeros_like(r)
        eps = torch.finfo(r.dtype).eps
        self.tiny = eps * eps
        self.eps = eps

    def step(self, it: int) -> None:
        problem, book = self.problem, self.problem.book
        rho = dot(self.rh, self.r)
        book.check_finite(rho, it)
        book.fail(rho.abs() <= self.tiny * self.rh_norm * book.est, _BREAKDOWN_RHO, it, rho)
        act = book.active()
        beta = (rho / safe(self.rho_old, act)) * (self.alpha / safe(self.omega, act))
        beta = torch.where(act, beta, torch.zeros_like(beta))
        self.p = torch.addcmul(self.r, col(beta), torch.addcmul(self.p, col(-self.omega), self.v))
        ph = problem.precond(self.p)
        self.v = problem.matvec(ph)
        rv = dot(self.rh, self.v)
        book.check_finite(rv, it)
        book.fail(rv.abs() <= self.tiny * self.rh_norm * norm(self.v), _BREAKDOWN_RV, it, rv)
        act = book.active()
        alpha = torch.where(act, rho / safe(rv, act), torch.zeros_like(rv))
        s = torch.addcmul(self.r, col(-alpha), self.v)
        s_norm = norm(s)
        sh = problem.precond(s)
        t = problem.matvec(sh)
        tt = dot(t, t).real
        ts = dot(t, s)
        book.check_finite(tt, it)
        book.check_finite(ts, it)
        act = book.active()
        half = act & (s_norm <= book.target)
        full = act & ~half & (tt > 0)
        omega = torch.where(full, ts / safe(tt, full).to(ts.dtype), torch.zeros_like(ts))
        step = torch.addcmul(torch.mul(ph, col(alpha)), col(omega), sh)
        self.x = torch.where(col(act), self.x + step, self.x)
        self.r = torch.addcmul(s, col(-omega), t)
        book.record(it, norm(self.r))
        stalled = ts.abs() <= self.eps * tt.clamp(min=0).sqrt() * s_norm
        book.fail(~half & stalled, _BREAKDOWN_OMEGA, it, omega)
        self.rho_old = torch.where(act, rho, self.rho_old)
        self.alpha = torch.where(act, alpha, self.alpha)
        self.omega = torch.where(act, omega, self.omega)

    def flush(self) -> None:
        pass


def bicgstab(
    matvec: Operator,
    b: Tensor,
    *,
    x0: Tensor | None = None,
    rtol: float = 1e-6,
    atol: float = 0.0,
    maxiter: int | None = None,
    M: Operator | None = None,
    check_every: int = 8,
    callback: Callback | None = None,
) -> tuple[Tensor, IterationResult]:
    """Solve ``A x = b`` for a general square A by right-preconditioned BiCGStab.

    Args:
        matvec: ``X -> A @ X`` on ``(*batch, n, k)`` tensors; each (batch, column) pair is an
            independent system.
        b: right-hand sides, ``(*batch, n, k)``, float32/float64/complex64/complex128.
        x0: initial guess of b's shape (default zero). Columns with ``b == 0`` return 0.
        rtol, atol: a column converges when ``||b - A x|| <= max(rtol * ||b||, atol)``.
        maxiter: iteration limit (default ``10 * n``); each iteration costs two matvecs.
        M: ``X -> M^-1 X``, any nonsingular preconditioner (see ``precond``).
        check_every: look at the device (one sync) every this many iterations.
        callback: ``callback(iteration, worst_relative_residual)`` at each check.

    Returns:
        ``(x, IterationResult)``. Never raises on non-convergence: the status says what
        happened (CONVERGED, MAX_ITERATIONS, BREAKDOWN, NOT_FINITE) and the residual is the
        worst true relative residual over the columns.
    """
    problem = prepare(
        "BiCGStab", matvec, b, x0=x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
        check_every=check_every, callback=callback,
    )
    return run(problem, _BiCGStab, _EVENTS)
