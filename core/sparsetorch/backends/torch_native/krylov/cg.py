"""Preconditioned conjugate gradients for Hermitian positive definite systems.

Per column (every ``(batch, column)`` pair of ``(*batch, n, k)`` is its own system)::

    r = b - A x,  z = M^-1 r,  p = z,  rho = r^H z
    repeat:  q = A p;  alpha = rho / p^H q;  x += alpha p;  r -= alpha q
             z = M^-1 r;  rho' = r^H z;  p = z + (rho' / rho) p;  rho = rho'

A direction with ``p^H A p <= 0`` proves A is not positive definite: the column stops with
``Status.INDEFINITE`` (use MINRES for Hermitian indefinite matrices, GMRES otherwise). With a
preconditioner, ``r^H M^-1 r <= 0`` proves M is not positive definite (also INDEFINITE).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....dispatch.results import IterationResult, Status
from ._common import (
    FIRST_SOLVER_CODE, Callback, Event, Operator, Problem, col, dot, finite, norm, prepare,
)
from ._run import run
from ._graph import BlockGraph, usable

__all__ = ["cg"]

_INDEFINITE = FIRST_SOLVER_CODE
_INDEFINITE_M = FIRST_SOLVER_CODE + 1

_EVENTS = {
    _INDEFINITE: Event(
        Status.INDEFINITE,
        "CG found {pap} = {value:.1e} <= 0 by iteration {it}{where}: the matrix is not positive "
        "definite; use minres for a symmetric (Hermitian) indefinite matrix, or gmres/bicgstab",
    ),
    _INDEFINITE_M: Event(
        Status.INDEFINITE,
        "CG found r^H M^-1 r = {value:.1e} <= 0 by iteration {it}{where}: the preconditioner is not "
        "positive definite; CG needs a Hermitian positive definite M (jacobi needs a positive "
        "diagonal)",
    ),
}


class _CG:
    """CG state; ``step`` does one iteration on every running column at once.

    Bookkeeping is deferred to ``sync`` (called at each convergence check): per iteration only
    the running minimum of ``p^H A p`` (and of ``r^H M^-1 r``) is kept on the device, so an
    iteration costs about 16 kernel launches instead of 45. A column that meets ``p^H A p <= 0``
    is reported INDEFINITE at the next check.
    """

    def __init__(self, problem: Problem, x: Tensor, r: Tensor, it: int) -> None:
        self.problem = problem
        self.x = x
        self.r = r
        z = problem.precond(r)
        self.rho = dot(r, z).real
        if problem.M is not None:
            problem.book.fail(it, self.rho, (self.rho <= 0, _INDEFINITE_M))
        self.p = z
        self.min_pap: Tensor | None = None
        self.min_rho: Tensor | None = None
        #: one real system (no batch, one column): the lean step below, about half the operator
        #: dispatches of the masked one (which freezes finished columns among several); on a GPU
        #: an iteration is bound by those dispatches
        self.lean = r.dim() == 2 and r.shape[-1] == 1 and not r.is_complex()
        if self.lean:  # its scalars are (1, 1): they scale (n, 1) vectors without a reshape per use
            self.rho = self.rho.reshape(1, 1)
        #: blocks of check_every steps replayed as one CUDA graph (see _graph.py): the iterates
        #: become this state's own buffers, updated in place at fixed addresses
        self.graph: BlockGraph | None = None
        #: x at the last two block starts (graph mode; see advance/settle)
        self._kept: list[Tensor | None] = [None, None]
        self._cur = 1
        graph = problem.cuda_graph and usable(r)
        #: the iterates are this state's own buffers, updated in place (the masked step always;
        #: the lean step in graph mode, where the graph reads them at fixed addresses)
        self.own = graph or not self.lean
        if self.own:
            # own copies: x and r may be the caller's x0 / b, p may be r itself (no preconditioner)
            self.x, self.r, self.p = x.clone(), r.clone(), self.p.clone()
            self.rho = self.rho.clone()
            self.min_pap = torch.full_like(self.rho, float("inf"))
            self.min_rho = torch.full_like(self.rho, float("inf")) if problem.M is not None else None
        if graph:
            # (the masked step also reads the book's running mask, which the book updates in place)
            self.graph = BlockGraph(self._block, r.device, f"{problem.check_every} CG iterations")

    def step(self, it: int) -> None:
        if self.own:
            self._steps(1)
        else:
            self._step_lean()

    @property
    def speculate(self) -> bool:
        """Graph blocks may be queued ahead of the check before them (see ``run``)."""
        return self.graph is not None

    def advance(self, it: int, k: int) -> None:
        """Iterations ``it + 1 .. it + k``; a full block of ``check_every`` replays the graph.

        In graph mode ``x`` is first saved (alternating between two buffers), so that when the
        loop stops, :meth:`settle` can go back to the iterate of the last check, or of the one
        before it if that one is not finite."""
        if self.graph is None:
            for j in range(k):
                self.step(it + j + 1)
            return
        self._cur = 1 - self._cur
        if self._kept[self._cur] is None:
            self._kept[self._cur] = torch.empty_like(self.x)
        self._kept[self._cur].copy_(self.x)
        if k == self.problem.check_every:
            self.graph()
        else:
            self._steps(k)

    def settle(self, ahead: bool) -> None:
        """The loop stops: make ``x`` the iterate of the last check (``ahead``: a block queued
        after that check ran on, and is discarded), or, if that iterate is not finite (a NaN
        in the last block), the iterate of the check before. One host sync."""
        if self.graph is None:
            return
        last = self._kept[self._cur] if ahead else self.x
        prev = self._kept[1 - self._cur] if ahead else self._kept[self._cur]
        if prev is None or bool(torch.isfinite(last).all()):
            if last is not self.x:
                self.x.copy_(last)
        else:
            self.x.copy_(prev)

    def _block(self) -> None:
        self._steps(self.problem.check_every)

    def _steps(self, k: int) -> None:
        """``k`` steps on the static buffers; ``rho`` is rebound per step (no copy per step) and
        written back to its buffer once at the end, where the next block reads it."""
        rho = self.rho
        step = self._step_in_place if self.lean else self._step_masked_in_place
        for _ in range(k):
            step()
        rho.copy_(self.rho)
        self.rho = rho

    def _step_masked_in_place(self) -> None:
        """The iteration for several columns, batches or complex systems, on this state's own
        buffers: finished columns stand still (masks), and so do stalled ones: ``rho``
        underflows to 0 once an unreachable tolerance drives the residual below the smallest
        double (then p and p^H A p vanish too); such a column has stalled at the exact solution,
        not met a NaN or an indefinite matrix, and its residual estimate reads 0. Columns hit by
        a NaN/Inf since the last check keep x (``torch.where`` selects, never multiplies), so x
        holds the last good iterate when NOT_FINITE is reported."""
        problem = self.problem
        x, r, p, rho = self.x, self.r, self.p, self.rho
        q = problem.matvec(p)
        pAp = dot(p, q).real
        alive = rho > 0
        torch.minimum(self.min_pap, torch.where(alive, pAp, float("inf")), out=self.min_pap)
        act = problem.book.act & alive
        alpha = torch.where(act, rho / torch.where(alive, pAp, 1.0), 0.0)
        keep = col(act & finite(alpha))
        torch.where(keep, torch.addcmul(x, col(alpha), p), x, out=x)
        r.addcmul_(col(alpha), q, value=-1)
        if problem.M is None:
            z = r
            new = dot(z, z).real
        else:
            z = problem.M(r)
            new = dot(r, z).real
            torch.minimum(self.min_rho, new, out=self.min_rho)
        beta = torch.where(act, new / torch.where(alive, rho, 1.0), 0.0)
        torch.addcmul(z, col(beta), p, out=p)
        self.rho = new

    def _step_in_place(self) -> None:
        """The lean step on this state's own buffers (the graph's static tensors), in as few
        kernels as possible (each costs about a microsecond of scheduling inside a graph): 16
        per iteration without a preconditioner, against 26 for the lean step.

        No guards inside the block: ``0/0`` and ``c/0`` step lengths become 0 (``nan_to_num``),
        so a stalled column (``rho`` underflowed to 0) stands still; a zero or negative
        ``p^T A p`` lands in the running minimum (INDEFINITE at the check); a NaN from the
        operator lands there too (NOT_FINITE at the check), and :meth:`settle` hands back the
        last finite checked iterate, since ``x`` may have been spoiled inside the block."""
        problem = self.problem
        x, r, p, rho = self.x, self.r, self.p, self.rho
        q = problem.matvec(p)
        pAp = p.mT @ q
        torch.minimum(self.min_pap, pAp, out=self.min_pap)
        alpha = torch.div(rho, pAp).nan_to_num_(0.0, 0.0, 0.0)
        x.addcmul_(alpha, p)
        r.addcmul_(alpha, q, value=-1)
        if problem.M is None:
            z = r
            new = r.mT @ r
        else:
            z = problem.M(r)
            new = r.mT @ z
            torch.minimum(self.min_rho, new, out=self.min_rho)
        beta = torch.div(new, rho).nan_to_num_(0.0, 0.0, 0.0)
        torch.addcmul(z, beta, p, out=p)
        self.rho = new

    def _step_lean(self) -> None:
        """The step for one real system, on (1, 1) scalars. The column runs until the next check,
        so no masks: a zero ``p^T A p`` (a stalled column: ``rho`` underflowed to 0, ``p``
        vanished) divides by 1 instead (alpha = 0 / 1), a non-finite alpha leaves ``x`` as it
        was, and a stalled column (``rho == 0`` at the check) is not reported indefinite."""
        problem = self.problem
        q = problem.matvec(self.p)
        pAp = self.p.mT @ q
        self.min_pap = pAp if self.min_pap is None else torch.minimum(self.min_pap, pAp)
        alpha = self.rho / torch.where(pAp == 0, 1.0, pAp)
        self.x = torch.where(finite(alpha), torch.addcmul(self.x, alpha, self.p), self.x)
        self.r = torch.addcmul(self.r, alpha, q, value=-1)
        if problem.M is None:
            z = self.r
            rho = z.mT @ z
        else:
            z = problem.M(self.r)
            rho = self.r.mT @ z
            self.min_rho = rho if self.min_rho is None else torch.minimum(self.min_rho, rho)
        beta = rho / torch.where(self.rho == 0, 1.0, self.rho)
        self.p = torch.addcmul(z, beta, self.p)
        self.rho = rho

    def sync(self, it: int) -> None:
        """Apply the deferred checks (indefiniteness, NaN) and the residual estimate."""
        book = self.problem.book
        rho = self.rho.reshape(1) if self.lean else self.rho  # the book's per-column shape
        if self.min_pap is not None:
            min_pap = self.min_pap.reshape(rho.shape)
            indefinite = (min_pap <= 0) & (rho > 0) if self.lean else min_pap <= 0
            book.fail(it, min_pap, (indefinite, _INDEFINITE))
        if self.problem.M is None:
            book.record(it, rho.clamp(min=0).sqrt())
        else:
            book.record(it, norm(self.r))
            if self.min_rho is not None:
                min_rho = self.min_rho.reshape(rho.shape)
                book.fail(it, min_rho, (min_rho <= 0, _INDEFINITE_M))
        if self.own:  # static buffers: reset in place
            self.min_pap.fill_(float("inf"))
            if self.min_rho is not None:
                self.min_rho.fill_(float("inf"))
        else:
            self.min_pap = self.min_rho = None

    def flush(self) -> None:
        pass


def cg(
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
    cuda_graph: bool = False,
) -> tuple[Tensor, IterationResult]:
    """Solve ``A x = b`` for Hermitian positive definite A by (preconditioned) CG.

    Args:
        matvec: ``X -> A @ X`` on ``(*batch, n, k)`` tensors; each (batch, column) pair is an
            independent system.
        b: right-hand sides, ``(*batch, n, k)``, float32/float64/complex64/complex128.
        x0: initial guess of b's shape (default zero). Columns with ``b == 0`` return 0.
        rtol, atol: a column converges when ``||b - A x|| <= max(rtol * ||b||, atol)``.
        maxiter: iteration limit (default ``10 * n``).
        M: ``X -> M^-1 X``, a Hermitian positive definite preconditioner (see ``precond``).
        check_every: look at the device (one sync) every this many iterations.
        callback: ``callback(iteration, worst_relative_residual)`` at each check.
        cuda_graph: on a CUDA device, capture ``check_every`` iterations as a CUDA graph and
            replay it (one launch per block instead of 25-41 per iteration). Only
            for ``matvec`` and ``M`` that never synchronise with the host and read fixed
            operands: they are called while capturing, then not called again (the torch
            backend's own products and Jacobi qualify). Off by default for that reason.

    Returns:
        ``(x, IterationResult)``. Never raises on non-convergence: the status says what
        happened (CONVERGED, MAX_ITERATIONS, INDEFINITE, NOT_FINITE) and the residual is the
        worst true relative residual ``||b - A x|| / ||b||`` over the columns.
    """
    problem = prepare(
        "CG", matvec, b, x0=x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
        check_every=check_every, callback=callback, cuda_graph=cuda_graph,
    )
    pap = "p^H A p" if b.is_complex() else "p^T A p"
    events = {
        code: Event(e.status, e.template.replace("{pap}", pap)) for code, e in _EVENTS.items()
    }
    return run(problem, _CG, events)

