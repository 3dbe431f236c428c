"""Right-preconditioned BiCGStab (van der Vorst) for general square systems.

Per column (every ``(batch, column)`` pair of ``(*batch, n, k)`` is its own system), with the
shadow residual ``rh = r0``::

    rho = rh^H r;  beta = (rho / rho_old) (alpha / omega);  p = r + beta (p - omega v)
    ph = M^-1 p;  v = A ph;  alpha = rho / rh^H v;  s = r - alpha v
    sh = M^-1 s;  t = A sh;  omega = t^H s / t^H t
    x += alpha ph + omega sh;  r = s - omega t

A column whose half-step residual ``s`` already meets the tolerance takes ``omega = 0``.

Breakdowns. ``rh^H r ~ 0`` or ``rh^H A M^-1 p ~ 0`` (zero relative to the norms, at eps^2)
restart the column's recurrence with the current residual as its new shadow residual (the
standard remedy; sparse right-hand sides such as unit vectors meet exact zeros there); after
``MAX_RESTARTS`` such restarts the column stops with ``Status.BREAKDOWN``. ``omega ~ 0``
(``|t^H s| <= eps ||t|| ||s||``, a stabilising step that cannot make progress, as for a real
skew-symmetric A) stops it at once with ``Status.BREAKDOWN``; the update with that omega is
still applied, as in SciPy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....dispatch.results import IterationResult, Status
from ._common import (
    FIRST_SOLVER_CODE, Callback, Event, Operator, Problem, col, dot, norm, prepare,
)
from ._run import run

__all__ = ["bicgstab"]

_BREAKDOWN_RHO = FIRST_SOLVER_CODE
_BREAKDOWN_RV = FIRST_SOLVER_CODE + 1
_BREAKDOWN_OMEGA = FIRST_SOLVER_CODE + 2

#: Shadow-residual restarts a column may take before a rho / alpha breakdown stops it.
MAX_RESTARTS = 4

_EVENTS = {
    _BREAKDOWN_RHO: Event(
        Status.BREAKDOWN,
        "BiCGStab broke down at iteration {it}{where}: |rho| = |rh^H r| = {value:.1e} is zero "
        "relative to the norms (the residual became orthogonal to the shadow residual rh) "
        "even after restarting the recurrence with a new rh; use gmres",
    ),
    _BREAKDOWN_RV: Event(
        Status.BREAKDOWN,
        "BiCGStab broke down at iteration {it}{where}: |rh^H A M^-1 p| = {value:.1e} is zero "
        "relative to the norms, so alpha is undefined, even after restarting the recurrence "
        "with a new shadow residual rh; use gmres",
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
        self.restarts = torch.zeros(self.rh_norm.shape, dtype=torch.int32, device=r.device)
        self.pending = torch.zeros(self.rh_norm.shape, dtype=torch.bool, device=r.device)
        self.rv = torch.zeros_like(self.rh_norm)  # |rh^H v| of the last iteration

    def step(self, it: int) -> None:
        problem, book = self.problem, self.problem.book
        rho = dot(self.rh, self.r)
        lost = rho.abs() <= self.tiny * self.rh_norm * book.est
        spent = self.restarts >= MAX_RESTARTS
        book.fail(it, rho)
        value = torch.where(self.pending, self.rv, rho.abs())  # what each message quotes
        book.fail(it, value, (self.pending & spent, _BREAKDOWN_RV), (lost & spent, _BREAKDOWN_RHO))
        act = book.active()
        # Restart the lost columns: rh = r, so rho = ||r||^2 and p = r (beta = 0).
        redo = act & (lost | self.pending)
        self.restarts = self.restarts + redo
        self.rh = torch.where(col(redo), self.r, self.rh)
        self.rh_norm = torch.where(redo, book.est, self.rh_norm)
        rho = torch.where(redo, book.est * book.est, rho)
        beta = torch.where(act & ~redo, (rho / self.rho_old) * (self.alpha / self.omega), 0.0)
        self.p = torch.addcmul(self.r, col(beta), torch.addcmul(self.p, col(-self.omega), self.v))
        ph = problem.precond(self.p)
        self.v = problem.matvec(ph)
        rv = dot(self.rh, self.v)
        book.fail(it, rv)
        self.rv = rv.abs()
        self.pending = book.active() & (self.rv <= self.tiny * self.rh_norm * norm(self.v))
        act = book.active() & ~self.pending  # the columns that take this iteration's step
        alpha = torch.where(act, rho / rv, 0.0)
        s = torch.addcmul(self.r, col(-alpha), self.v)
        s_norm = norm(s)
        sh = problem.precond(s)
        t = problem.matvec(sh)
        tt = dot(t, t).real
        ts = dot(t, s)
        book.fail(it, tt + ts.abs())
        act = act & book.active()
        half = act & (s_norm <= book.target)
        full = act & ~half & (tt > 0)
        omega = torch.where(full, ts / tt, 0.0)
        # Stopped columns keep x (even where ph or sh hold NaN: torch.where selects).
        step = torch.addcmul(ph * col(alpha), col(omega), sh)
        self.x = torch.where(col(act), self.x + step, self.x)
        self.r = torch.addcmul(s, col(-omega), t)
        book.record(it, norm(self.r))
        stalled = act & ~half & (ts.abs() <= self.eps * tt.clamp(min=0).sqrt() * s_norm)
        book.fail(it, omega, (stalled, _BREAKDOWN_OMEGA))
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
