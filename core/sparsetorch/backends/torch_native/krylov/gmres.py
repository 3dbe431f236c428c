"""Restarted, right-preconditioned GMRES(m) with modified Gram-Schmidt and Givens rotations.

All columns of ``(*batch, n, k)`` run their own Arnoldi process side by side: the basis is one
tensor ``V`` of shape ``(m + 1, *batch, n, k)``, the rotated Hessenberg matrix ``R`` has shape
``(*batch, k, m, m)``, the rotated right-hand side ``g`` has shape ``(m + 1, *batch, k)``.
Right preconditioning (``A M^-1 u = b``, ``x = M^-1 u``) keeps the 2-norm of ``g[j + 1]`` equal
to the true residual norm in exact arithmetic: that is the estimate checked every
``check_every`` inner iterations. At the end of each cycle (and when the loop stops) ``x`` is
updated from the triangular solve and the true residual ``b - A x`` starts the next cycle.

A column that stops in the middle of a cycle has its remaining steps of that cycle masked to
identity rows (``R[j, j] = 1``, ``g[j] = 0``), so its update uses only the steps it took.
A rotated diagonal entry ``<= SINGULAR_FACTOR * eps * ||A M^-1||`` (a singular A or M, b
outside the range) stops
the column with ``Status.BREAKDOWN`` before the triangular solve could divide by it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....dispatch.results import IterationResult, Status
from ._common import (
    FIRST_SOLVER_CODE, NOT_FINITE, SINGULAR_FACTOR, Callback, Event, Operator, Problem, col, dot, norm, prepare, real_dtype, safe,
)
from ._run import run

__all__ = ["gmres"]

_SINGULAR = FIRST_SOLVER_CODE

_EVENTS = {
    _SINGULAR: Event(
        Status.BREAKDOWN,
        "GMRES broke down at iteration {it}{where}: the new diagonal entry of the rotated "
        "Hessenberg matrix is {value:.1e}, zero relative to ||A M^-1||, so A (or the "
        "preconditioner) is singular and b is not in the range of A",
    ),
}


class _Gmres:
    """GMRES(m) state; ``step`` does one Arnoldi step, and ends the cycle after ``m`` of them."""

    def __init__(self, problem: Problem, x: Tensor, r: Tensor, it: int) -> None:
        self.problem = problem
        self.x = x
        m = problem.restart
        cols = problem.book.code.shape  # (*batch, k)
        self.V = r.new_zeros((m + 1, *r.shape))
        self.R = r.new_zeros((*cols, m, m))
        self.g = r.new_zeros((m + 1, *cols))
        self.cs = torch.zeros((m, *cols), dtype=real_dtype(r.dtype), device=r.device)
        self.sn = r.new_zeros((m, *cols))
        self.j = 0
        self.scale = torch.zeros_like(self.cs[0])
        self.tiny = SINGULAR_FACTOR * torch.finfo(self.cs.dtype).eps
        self._begin(r)

    def _begin(self, r: Tensor) -> None:
        beta = norm(r)
        self.V[0] = r / col(safe(beta, beta > 0))
        self.g.zero_()
        self.g[0] = beta
        self.j = 0

    def step(self, it: int) -> None:
        problem, book = self.problem, self.problem.book
        j, V = self.j, self.V
        w = problem.matvec(problem.precond(V[j]))
        self.scale = torch.maximum(self.scale, norm(w))  # running estimate of ||A M^-1||
        h: list[Tensor] = []
        for i in range(j + 1):  # modified Gram-Schmidt
            hi = dot(V[i], w)
            w = torch.addcmul(w, col(-hi), V[i])
            h.append(hi)
        hn = norm(w)
        V[j + 1] = w / col(safe(hn, hn > 0))
        h.append(hn.to(w.dtype))
        for i in range(j):  # earlier rotations
            a, c = h[i], h[i + 1]
            h[i] = self.cs[i] * a + self.sn[i] * c
            h[i + 1] = -self.sn[i].conj() * a + self.cs[i] * c
        a = h[j]
        absa = a.abs()
        t = torch.hypot(absa, hn)
        book.fail(it, t, (t <= self.tiny * self.scale, _SINGULAR))
        live = book.active()
        phase = torch.where(absa > 0, a / safe(absa, absa > 0), torch.ones_like(a))
        t_safe = safe(t, t > 0)
        c = torch.where(live, absa / t_safe, torch.zeros_like(t))
        s = torch.where(live, phase * (hn / t_safe), torch.ones_like(a))
        if j:
            upper = torch.stack(h[:j], dim=-1)
            self.R[..., :j, j] = torch.where(live.unsqueeze(-1), upper, torch.zeros_like(upper))
        self.R[..., j, j] = torch.where(live, phase * t, torch.ones_like(a))
        self.cs[j], self.sn[j] = c, s
        gj = self.g[j]
        self.g[j + 1] = -s.conj() * gj
        self.g[j] = c * gj
        book.record(it, self.g[j + 1].abs())
        self.j = j + 1
        if self.j == problem.restart:
            self.flush()
            r = problem.b - problem.matvec(self.x)
            book.record(it, norm(r))
            self._begin(r)

    def flush(self) -> None:
        """Add ``M^-1 V y`` with ``R y = g`` over the steps of the current cycle; empty the cycle."""
        J = self.j
        if J == 0:
            return
        rhs = self.g[:J].movedim(0, -1).unsqueeze(-1)  # (*batch, k, J, 1)
        y = torch.linalg.solve_triangular(self.R[..., :J, :J], rhs, upper=True).squeeze(-1)
        dx = self.problem.precond(torch.einsum("j...nk,...kj->...nk", self.V[:J], y))
        keep = self.problem.book.code != NOT_FINITE
        self.x = torch.where(col(keep), self.x + dx, self.x)
        self.j = 0


def gmres(
    matvec: Operator,
    b: Tensor,
    *,
    x0: Tensor | None = None,
    rtol: float = 1e-6,
    atol: float = 0.0,
    restart: int = 30,
    maxiter: int | None = None,
    M: Operator | None = None,
    check_every: int = 8,
    callback: Callback | None = None,
) -> tuple[Tensor, IterationResult]:
    """Solve ``A x = b`` for a general square A by restarted, right-preconditioned GMRES.

    Args:
        matvec: ``X -> A @ X`` on ``(*batch, n, k)`` tensors; each (batch, column) pair is an
            independent system.
        b: right-hand sides, ``(*batch, n, k)``, float32/float64/complex64/complex128.
        x0: initial guess of b's shape (default zero). Columns with ``b == 0`` return 0.
        rtol, atol: a column converges when ``||b - A x|| <= max(rtol * ||b||, atol)``.
        restart: inner iterations per cycle, ``m`` (capped at n); memory is ``(m + 1)`` vectors
            per system.
        maxiter: number of restart cycles (SciPy's meaning); default ``10 * n // m``, so at most
            ``10 * n`` inner iterations in all.
        M: ``X -> M^-1 X``, any nonsingular preconditioner, applied on the right.
        check_every: look at the device (one sync) every this many inner iterations.
        callback: ``callback(iteration, worst_relative_residual)`` at each check, ``iteration``
            counting inner iterations.

    Returns:
        ``(x, IterationResult)``; ``iterations`` counts inner (Arnoldi) iterations. Never raises
        on non-convergence: the status says what happened (CONVERGED, MAX_ITERATIONS,
        BREAKDOWN, NOT_FINITE) and the residual is the worst true relative residual.
    """
    problem = prepare(
        "GMRES", matvec, b, x0=x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
        check_every=check_every, callback=callback, restart=restart,
    )
    return run(problem, _Gmres, _EVENTS)
