"""Preconditioned MINRES (Paige and Saunders) for Hermitian, possibly indefinite, systems.

Follows SciPy's ``minres`` (itself a port of Paige and Saunders' code): a Lanczos process on
``M^-1 A`` and a QR factorisation of its tridiagonal matrix by Givens rotations, all scalars
real (A Hermitian), one per column of ``(*batch, n, k)``. Besides SciPy's recurrences we carry
``A w`` for the search directions ``w``, so the 2-norm residual ``r = b - A x`` is updated by
recurrence (``r -= phi A w``): that is the estimate checked against ``max(rtol ||b||, atol)``,
as for the other solvers (MINRES's own ``phibar`` is the ``M^-1``-norm when preconditioned).

M must be Hermitian positive definite; ``r^H M^-1 r < 0`` stops the column with
``Status.INDEFINITE``. A zero pivot ``gamma`` or an exhausted Lanczos process (``beta``) before the column converged
(both "zero" meaning ``<= SINGULAR_FACTOR * eps * ||A||``) means A is singular with b outside
its range: ``Status.BREAKDOWN``, with x left at the minimal-residual solution so far.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....dispatch.results import IterationResult, Status
from ._common import (
    FIRST_SOLVER_CODE, SINGULAR_FACTOR, Callback, Event, Operator, Problem, col, dot, norm, prepare, safe,
)
from ._run import run

__all__ = ["minres"]

_INDEFINITE_M = FIRST_SOLVER_CODE
_SINGULAR = FIRST_SOLVER_CODE + 1
_EXHAUSTED = FIRST_SOLVER_CODE + 2

_EVENTS = {
    _INDEFINITE_M: Event(
        Status.INDEFINITE,
        "MINRES found r^H M^-1 r = {value:.1e} < 0 at iteration {it}{where}: the preconditioner "
        "is not positive definite; MINRES needs a Hermitian positive definite M (jacobi of an "
        "indefinite matrix is not: use jacobi of |diag(A)| or M=None)",
    ),
    _SINGULAR: Event(
        Status.BREAKDOWN,
        "MINRES broke down at iteration {it}{where}: the rotated tridiagonal pivot gamma = "
        "{value:.1e} is zero relative to ||A||, so A is singular (to working precision) and b is "
        "not in its range; x is the minimal-residual solution of the steps before",
    ),
    _EXHAUSTED: Event(
        Status.BREAKDOWN,
        "MINRES broke down at iteration {it}{where}: the Lanczos process is exhausted (beta = "
        "{value:.1e}, zero relative to ||A||) without meeting the tolerance, so A is singular and "
        "b is not in its range (x is the minimal-residual solution), or the tolerance is below "
        "what this dtype allows",
    ),
}


class _Minres:
    """MINRES state; ``step`` does one Lanczos step and one solution update per column."""

    def __init__(self, problem: Problem, x: Tensor, r: Tensor, it: int) -> None:
        self.problem = problem
        book = problem.book
        self.x = x
        self.res = r
        self.r1 = r
        self.r2 = r
        self.y = problem.precond(r)
        beta1 = dot(r, self.y).real
        if problem.M is not None:
            book.fail(it, beta1, (beta1 < 0, _INDEFINITE_M))
        beta1 = beta1.clamp(min=0).sqrt()
        zero = torch.zeros_like(beta1)
        self.beta, self.oldb, self.dbar, self.epsln = beta1, zero, zero, zero
        self.phibar = beta1
        self.cs, self.sn = -torch.ones_like(beta1), zero
        self.anorm = zero  # running max of the rows of T_k: an estimate of ||A||
        self.tiny = SINGULAR_FACTOR * torch.finfo(beta1.dtype).eps
        self.w = torch.zeros_like(r)
        self.w2 = self.w
        self.aw = self.w
        self.aw2 = self.w
        self.local = 0  # Lanczos steps since this start

    def step(self, it: int) -> None:
        problem, book = self.problem, self.problem.book
        self.local += 1
        v = self.y * col(1 / safe(self.beta, self.beta > 0))
        av = problem.matvec(v)
        y = av
        if self.local >= 2:
            y = torch.addcmul(y, col(-self.beta / safe(self.oldb, self.oldb > 0)), self.r1)
        alfa = dot(v, y).real
        y = torch.addcmul(y, col(-alfa / safe(self.beta, self.beta > 0)), self.r2)
        self.r1, self.r2 = self.r2, y
        self.y = problem.precond(y)
        self.oldb = self.beta
        beta2 = dot(self.r2, self.y).real
        book.fail(it, alfa)
        book.fail(it, beta2, (beta2 < 0, _INDEFINITE_M))
        self.beta = beta2.clamp(min=0).sqrt()
        row = (alfa * alfa + self.oldb * self.oldb + self.beta * self.beta).sqrt()
        self.anorm = torch.maximum(self.anorm, row)
        exhausted = self.beta <= self.tiny * self.anorm
        # Previous rotation applied to the new tridiagonal column, then the next rotation.
        oldeps = self.epsln
        delta = self.cs * self.dbar + self.sn * alfa
        gbar = self.sn * self.dbar - self.cs * alfa
        self.epsln = self.sn * self.beta
        self.dbar = -self.cs * self.beta
        gamma = torch.hypot(gbar, self.beta)
        book.fail(it, gamma, (gamma <= self.tiny * self.anorm, _SINGULAR))
        act = book.active()
        gamma = safe(gamma, gamma > 0)
        self.cs = gbar / gamma
        self.sn = self.beta / gamma
        phi = torch.where(act, self.cs * self.phibar, torch.zeros_like(gamma))
        self.phibar = self.sn * self.phibar
        denom = col(1 / gamma)
        w1, self.w2 = self.w2, self.w
        aw1, self.aw2 = self.aw2, self.aw
        self.w = torch.addcmul(torch.addcmul(v, col(-oldeps), w1), col(-delta), self.w2) * denom
        self.aw = torch.addcmul(torch.addcmul(av, col(-oldeps), aw1), col(-delta), self.aw2) * denom
        self.x = torch.where(col(act), torch.addcmul(self.x, col(phi), self.w), self.x)
        self.res = torch.addcmul(self.res, col(-phi), self.aw)
        book.record(it, norm(self.res))
        # An exhausted Lanczos process has given its best x; if that did not converge, stop.
        book.fail(it, self.beta, (exhausted, _EXHAUSTED))

    def flush(self) -> None:
        pass


def minres(
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
    """Solve ``A x = b`` for Hermitian (possibly indefinite) A by preconditioned MINRES.

    Args:
        matvec: ``X -> A @ X`` on ``(*batch, n, k)`` tensors; each (batch, column) pair is an
            independent system. A must be Hermitian (not checked).
        b: right-hand sides, ``(*batch, n, k)``, float32/float64/complex64/complex128.
        x0: initial guess of b's shape (default zero). Columns with ``b == 0`` return 0.
        rtol, atol: a column converges when ``||b - A x|| <= max(rtol * ||b||, atol)``.
        maxiter: iteration limit (default ``10 * n``).
        M: ``X -> M^-1 X``, a Hermitian positive definite preconditioner (see ``precond``).
        check_every: look at the device (one sync) every this many iterations.
        callback: ``callback(iteration, worst_relative_residual)`` at each check.

    Returns:
        ``(x, IterationResult)``. Never raises on non-convergence: the status says what
        happened (CONVERGED, MAX_ITERATIONS, INDEFINITE for an indefinite M, BREAKDOWN,
        NOT_FINITE) and the residual is the worst true relative residual over the columns.
    """
    problem = prepare(
        "MINRES", matvec, b, x0=x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
        check_every=check_every, callback=callback,
    )
    return run(problem, _Minres, _EVENTS)
