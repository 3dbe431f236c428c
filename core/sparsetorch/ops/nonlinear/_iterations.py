"""The iterations of ``nonlinear_solve`` and the hand-over between methods (Newton's steps:
``_newton.py``).

- **Newton** (``_newton.py``): the step ``J du = -F``, a backtracking line search on ``||F||``, and
  a dogleg trust-region step where that or the linear solve fails.
- **Anderson / Picard** on ``G(u) = u - omega M^-1 F(u)``, stopped early when ``||F||`` diverges
  or stalls.
- **Hand-over** (``method=None``): Newton, then Anderson, then Picard, each from the best iterate
  found so far, until one converges; every attempt is recorded. A pinned method (``method=``
  given) runs alone and raises naming what to try.

Norms are scaled (``max|v| * ||v / max|v|||``) so that neither underflow nor overflow of the sum of
squares fakes a tiny or infinite residual.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import torch

from ...errors import NotConvergedError, NotConvergedWarning, SingularMatrixError
from ..info import Status
from ._common import _DIVERGED, _PROGRESS, _STALL, MAXITER, _Attempt, _at_precision, _finish, _finite, vector_norm
from ._methods import Anderson, Picard
from ._newton import NewtonSteps

__all__ = ["Iterations", "MAXITER", "vector_norm"]


class Iterations(NewtonSteps):
    """The forward iteration of :class:`~._problem.Problem` (mixed in; uses its residual,
    Jacobian, linear solvers and preconditioner): the driver, the hand-over, the failure report
    and the fixed-point methods; Newton's steps are in ``_newton.py``."""

    # Driver ---------------------------------------------------------------------------------------
    def run(self, leaves: Sequence[torch.Tensor]) -> torch.Tensor:
        params = self.bind(self.detached_leaves(leaves))
        with torch.no_grad():
            x = self._solve(params)
        return x.reshape(self.shape).clone()  # never an alias of u0

    def _solve(self, params: tuple) -> torch.Tensor:
        rec = self.record
        x, r = self._x0, self._r0
        norm = vector_norm(r)
        self._note(x, r, norm)
        for k, spec in enumerate(self.order):
            if k:  # the next method starts from the best iterate found so far
                x, r, norm = rec.best
            method = spec.name
            att = _Attempt(method, "user" if self.pinned else "library", rec.iterations, rec.fevals, norm)
            maxiter = spec.maxiter or MAXITER[method]
            try:
                if method == "newton":
                    x, r, norm = self._newton(att, x, r, norm, params, maxiter, spec)
                else:
                    x, r, norm = self._fixed_point(att, x, r, norm, params, maxiter, spec)
            except (SingularMatrixError, NotConvergedError) as exc:
                # a linear solve that Newton could not recover from (line_search=False), or the
                # fixed-point preconditioner's solve: the next method takes over unless pinned
                if self.pinned:
                    raise
                att.status = Status.BREAKDOWN
                att.reason = f"a linear solve failed: {exc}"
            rec.attempts.append(att.freeze(rec.iterations, rec.fevals, norm))
            if att.status is Status.CONVERGED:
                break
        last = rec.attempts[-1]
        rec.method = last.method
        if last.succeeded:
            rec.status, rec.reason = Status.CONVERGED, ""
            rec.result_norm = norm
            return x
        if not self.pinned:  # every method failed: return the best iterate any of them found
            x, r, norm = rec.best
        rec.result_norm = norm
        rec.status = last.status
        rec.reason = last.reason if len(rec.attempts) == 1 else "; ".join(f"{a.method}: {a.reason}" for a in rec.attempts)
        self._report_failure()
        return x

    def _report_failure(self) -> None:
        rec = self.record
        summary = (
            f"||F(u0)|| = {rec.history[0]:.3e}, ||F(u)|| = {rec.result_norm:.3e}, target "
            f"{self._target():.3e}"
        )
        if self.pinned:
            a = rec.attempts[0]
            if a.method == "newton":
                hint = (
                    "try method='anderson' or 'picard' (they need F in a fixed-point form, F(u) = u - g(u) with g "
                    "contractive, or a preconditioner M close to J), a starting point nearer a root, or method=None to "
                    "let the library hand over to them when Newton fails"
                )
            else:
                hint = (
                    f"try method='newton', a preconditioner for {a.method} (preconditioner=P, 'jacobian' or a "
                    f"callable), a smaller omega or damping, or method=None to let the library try Newton, Anderson and "
                    f"Picard in turn"
                )
            msg = (
                f"nonlinear_solve ({a.method}, pinned by method=) did not converge: {a.reason}. Iterations "
                f"{a.iterations}, {summary}; {hint}; pass on_nonconvergence='warn' to get u anyway"
            )
        else:
            tried = "; ".join(
                f"{a.method} ({a.iterations} iterations, ||F|| {a.start_residual:.3e} -> {a.residual:.3e}): {a.reason}"
                for a in rec.attempts
            )
            msg = (
                f"nonlinear_solve did not converge with any method the library tried: {tried}. {summary} (the best "
                f"iterate found, returned with on_nonconvergence='warn'); start nearer a root, give the fixed-point "
                f"methods a preconditioner (preconditioner=P or 'jacobian'), or check F and its Jacobian"
            )
        if self.policy == "raise":
            raise NotConvergedError(msg, self.info())
        if self.policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=7)

    def _target(self) -> float:
        t = max(self.rtol * self.record.history[0], self.atol)
        # after Newton met rtol ||F(u0)|| still far from a root (a far start), the methods it hands over to are
        # judged from where it stopped (Anderson "converged after 0 iterations" there; session 24's sweep)
        strict = getattr(self, "_strict_target", None)
        return t if strict is None else min(t, strict)

    def _note(self, x: torch.Tensor, r: torch.Tensor, norm: float) -> None:
        rec = self.record
        if rec.history:
            rec.iterations += 1
        rec.history.append(norm)
        if math.isfinite(norm) and (rec.best is None or norm < rec.best[2]) and _finite(x):
            rec.best = (x, r, norm)
        if self.callback is not None:
            self.callback(rec.iterations, norm)

    def _not_finite(self, att: _Attempt, it: int, r: torch.Tensor, what: str) -> None:
        bad = torch.nonzero(~torch.isfinite(r))
        where = f" (first at flat index {int(bad[0, 0])})" if bad.numel() else ""
        att.status = Status.NOT_FINITE
        att.reason = f"F returned NaN or Inf at iteration {it}{where} {what}; the last finite iterate is returned"

    # Anderson / Picard ------------------------------------------------------------------------------
    def _fixed_point(self, att: _Attempt, x, r, norm: float, params: tuple, maxiter: int, spec: Anderson | Picard):
        """Anderson (type II, Walker & Ni) on ``G(x) = x - omega M^-1 F(x)``; Picard is depth 0."""
        self.prepare_preconditioner(params)
        method = att.method
        target = self._target()
        beta, m = spec.damping, (spec.depth if method == "anderson" else 0)
        dX: list[torch.Tensor] = []
        dG: list[torch.Tensor] = []
        x_prev = g_prev = None
        start = best = norm
        best_it = 0
        for it in range(1, maxiter + 1):
            if norm <= target and _finite(x):
                att.status = Status.CONVERGED
                return x, r, norm
            g = -spec.omega * self.precondition(r)  # G(x) - x
            if not _finite(g):
                att.status = Status.NOT_FINITE
                att.reason = f"the preconditioner returned NaN or Inf at iteration {it}; the last finite iterate is returned"
                return x, r, norm
            if m and x_prev is not None:
                dX.append(x - x_prev)
                dG.append(g - g_prev)
                if len(dX) > m:
                    dX.pop(0)
                    dG.pop(0)
            x_prev, g_prev = x, g
            if dX:
                DG = torch.stack(dG, 1)
                gamma = _lstsq(DG, g)
                x_new = x + beta * g - (torch.stack(dX, 1) + beta * DG) @ gamma
            else:
                x_new = x + beta * g
            r_new = self.f(x_new, params)
            if not (_finite(r_new) and _finite(x_new)):
                self._not_finite(att, it, r_new, f"({method})")
                return x, r, norm
            step = x_new - x
            x, r = x_new, r_new
            norm = vector_norm(r)
            self._note(x, r, norm)
            if norm <= target:
                continue  # converged: the loop head returns
            if _at_precision(step, x):
                # a fixed-point step is no error estimate (the error is ~ step / (1 - contraction)):
                # stalled at the rounding of u, never "converged" on that ground alone
                att.status = Status.BREAKDOWN
                att.reason = (
                    f"the {method} update at iteration {it} fell below the rounding of u with ||F|| = {norm:.3e} above "
                    f"the target {target:.3e}"
                )
                return x, r, norm
            if norm < _PROGRESS * best:
                best, best_it = norm, it
            elif norm > _DIVERGED * start:
                att.status = Status.BREAKDOWN
                att.reason = (
                    f"diverged: ||F|| grew from {start:.3e} to {norm:.3e} by iteration {it} (G(u) = u - omega M^-1 F(u) "
                    f"is not a contraction here: a preconditioner M close to J, or a smaller omega)"
                )
                return x, r, norm
            elif it - best_it >= _STALL:
                att.status = Status.BREAKDOWN
                att.reason = (
                    f"no progress in {_STALL} iterations: ||F|| has stayed above {_PROGRESS:g} x {best:.3e} (iteration "
                    f"{best_it})"
                )
                return x, r, norm
        _finish(att, x, norm, target, maxiter,
                f"; {method} converges linearly at best: try method='newton', a preconditioner, or a smaller omega")
        return x, r, norm


def _lstsq(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimum-norm least squares ``min ||A x - b||`` for a tall ``(n, m)`` A, small m (SVD, any device)."""
    U, s, Vh = torch.linalg.svd(A, full_matrices=False)
    keep = s > s[0] * max(A.shape) * torch.finfo(A.dtype).eps * 1e3 if s.numel() else s > 0
    inv = torch.where(keep, 1 / torch.where(keep, s, torch.ones_like(s)), torch.zeros_like(s))
    return Vh.transpose(0, 1) @ (inv * (U.transpose(0, 1) @ b))
