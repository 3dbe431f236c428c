"""The iterations of ``nonlinear_solve`` and the hand-over between methods.

- **Newton**: solve ``J du = -F``, then a backtracking (Armijo) line search on ``||F||``. When the
  line search finds no sufficient decrease along ``du``, or the linear solve fails (a singular
  ``J``, a Krylov method that broke down), a *dogleg trust-region step* takes over for that
  iteration (Powell's hybrid step between the Cauchy point ``-t J^T F`` and ``du``, inside a
  radius that shrinks until the actual decrease of ``||F||^2`` matches the linear model's, and
  grows after good steps). Newton stops when neither finds a decrease (a stationary point of
  ``||F||`` that is not a root, or a wrong Jacobian), when it makes no progress for ``_STALL``
  iterations (full steps cycling, ``line_search=False``), or at ``maxiter``.
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
from dataclasses import dataclass
from typing import Sequence

import torch

from ...errors import NotConvergedError, NotConvergedWarning, SingularMatrixError, InputError
from ..info import IterationResult, Status
from ._records import NonlinearAttempt

__all__ = ["Iterations", "MAXITER", "vector_norm"]

MAXITER = {"newton": 50, "anderson": 200, "picard": 1000}
_ARMIJO = 1e-4
#: an attempt stalls when ``_STALL`` iterations in a row bring ||F|| no lower than ``_PROGRESS``
#: times the smallest ||F|| before them (a cycle, or a crawl that would need ~1e4 iterations a digit)
_STALL = 20
_PROGRESS = 1 - 1e-3
#: Newton's window: in its region of convergence it gains digits every step, so 10 steps without
#: 0.1 % progress (backtracking crawling towards a local minimum of ||F||, or full steps cycling)
#: say it will not get there
_STALL_NEWTON = 10
#: ||F|| above this many times the attempt's starting ||F||: the iteration diverges
_DIVERGED = 1e6
#: trust-region radius reductions tried per Newton iteration before giving up
_TR_TRIES = 30
#: a trust-region step is accepted when (actual decrease) >= _TR_ETA (decrease the model predicts)
_TR_ETA = 1e-4
#: ||F|| <= _NOISE * eps * || |J| |u| || is the rounding level of F (see Iterations._at_noise)
_NOISE = 64.0
#: a step of at most this many units of roundoff of u (infinity norms) leaves u unchanged
_PRECISION_ULPS = 4.0


def vector_norm(v: torch.Tensor) -> float:
    """``||v||_2`` without underflow or overflow of the squares; ``inf`` for NaN or Inf entries."""
    if v.numel() == 0:
        return 0.0
    m = float(v.detach().abs().max())
    if not math.isfinite(m):
        return math.inf
    if m == 0.0:
        return 0.0
    return m * float(torch.linalg.vector_norm(v.detach() / m))


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _at_precision(step: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``x + step`` is ``x`` to the dtype's precision (a few units of roundoff of ``x``)."""
    eps = float(torch.finfo(x.dtype).eps)
    return float(step.abs().max()) <= _PRECISION_ULPS * eps * float(x.abs().max())


@dataclass
class _Attempt:
    """The mutable record of the attempt in progress (frozen into a NonlinearAttempt at its end)."""

    method: str
    chosen_by: str
    start_iteration: int
    start_fevals: int
    start_residual: float
    status: Status = Status.MAX_ITERATIONS
    reason: str = ""
    trust_region_steps: int = 0
    linear_failures: int = 0

    def freeze(self, iterations: int, fevals: int, residual: float) -> NonlinearAttempt:
        ok = self.status is Status.CONVERGED
        return NonlinearAttempt(
            method=self.method, chosen_by=self.chosen_by, iterations=iterations - self.start_iteration,
            status=self.status, reason="" if ok else self.reason, start_residual=self.start_residual,
            residual=residual, function_evaluations=fevals - self.start_fevals, succeeded=ok,
            trust_region_steps=self.trust_region_steps, linear_failures=self.linear_failures,
        )


class Iterations:
    """The forward iteration of :class:`~._problem.Problem` (mixed in; uses its residual,
    Jacobian, linear solvers and preconditioner)."""

    # Driver ---------------------------------------------------------------------------------------
    def run(self, leaves: Sequence[torch.Tensor]) -> torch.Tensor:
        params = self.bind(self._detached_leaves(leaves))
        with torch.no_grad():
            x = self._solve(params)
        return x.reshape(self.shape).clone()  # never an alias of u0

    def _solve(self, params: tuple) -> torch.Tensor:
        rec = self.record
        x, r = self._x0, self._r0
        norm = vector_norm(r)
        self._note(x, r, norm)
        for k, method in enumerate(self.order):
            if k:  # the next method starts from the best iterate found so far
                x, r, norm = rec.best
            att = _Attempt(method, "user" if self.pinned else "library", rec.iterations, rec.fevals, norm)
            maxiter = self.user_maxiter or MAXITER[method]
            try:
                if method == "newton":
                    x, r, norm = self._newton(att, x, r, norm, params, maxiter)
                else:
                    x, r, norm = self._fixed_point(att, x, r, norm, params, maxiter)
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
        return max(self.rtol * self.record.history[0], self.atol)

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

    def _at_noise(self, x, J, norm: float) -> bool:
        """Under the default tolerance, whether Newton, unable to decrease ``||F||`` any further, sits
        at the rounding level of ``F``: ``||F|| <= _NOISE eps || |J| |u| ||`` (the size of the
        rounding errors of F's terms linear in u, e.g. ``A u`` for a stiff ``A``, where a relative
        residual of ``default_rtol`` may lie below what the dtype can resolve: an ill-conditioned
        ``J`` or a warm start). Then ``u`` is converged to the dtype's precision. Sparse
        Jacobians only (matrix-free Newton has no ``|J|``)."""
        if not self.default_tolerance or J is None:
            return False
        Ja = J.with_values(J.values.detach().abs())
        scale = vector_norm((Ja @ x.abs().reshape(-1, 1)).reshape(-1))
        if norm <= _NOISE * float(torch.finfo(x.dtype).eps) * scale:
            self.record.at_precision = True
            return True
        return False

    def _precision_note(self, norm: float, target: float) -> str:
        return (
            f" (the Newton step was below the rounding of u with ||F|| = {norm:.3e} above the target {target:.3e}: "
            f"rtol={self.rtol:g}, atol={self.atol:g} ask for more than {self.dtype} allows for this F; use a larger "
            f"rtol or atol, or leave rtol unset for the dtype's precision)"
        )

    # Newton -----------------------------------------------------------------------------------------
    def _newton(self, att: _Attempt, x, r, norm: float, params: tuple, maxiter: int):
        target = self._target()
        best, best_it = norm, 0
        delta = None  # trust-region radius, kept across the iterations that need it
        tr_since = None  # the iteration whose failed line search switched to trust-region steps
        for it in range(1, maxiter + 1):
            if norm <= target and _finite(x):
                att.status = Status.CONVERGED
                return x, r, norm
            dx, J, failure = self._newton_direction(x, r, params, it, norm, recover=self.line_search)
            if failure is not None:
                att.linear_failures += 1
            if dx is not None and _at_precision(dx, x):
                if self.default_tolerance:
                    # u + du is u to the dtype's precision: ||F|| is as small as the dtype allows
                    # (the accuracy contract's fallback when default_rtol is out of reach)
                    self.record.at_precision = True
                    att.status = Status.CONVERGED
                    return x, r, norm
                note = self._precision_note(norm, target)  # explicit tolerance: keep trying
            else:
                note = ""
            if not self.line_search:
                if dx is None:
                    att.status, att.reason = Status.NOT_FINITE, f"{failure}; the last finite iterate is returned"
                    return x, r, norm
                xt = x + dx
                rt = self.f(xt, params)
                if not (_finite(rt) and _finite(xt)):
                    self._not_finite(att, it, rt, "at the full Newton step (line_search=False)")
                    return x, r, norm
                accepted = (xt, rt, vector_norm(rt))
            else:
                # Line search until it first fails; from then on trust-region steps (the Newton
                # step itself whenever it fits the radius), which cost one evaluation of F each
                # instead of a backtracking sequence at every iteration.
                if tr_since is not None:
                    accepted = None
                    why = (f"at iteration {it} (trust-region steps since the line search failed at iteration "
                           f"{tr_since})")
                    if failure is not None:
                        why += f", the linear solve failed ({failure})"
                elif dx is None:
                    accepted, why = None, f"the linear solve at iteration {it} failed ({failure})"
                else:
                    accepted, why = self._line_search(x, r, norm, dx, params, it)
                if accepted is None:
                    accepted, delta, tr_why = self._dogleg(x, r, norm, dx, J, params, delta)
                    if accepted is None:
                        if self._at_noise(x, J, norm):
                            att.status = Status.CONVERGED
                            return x, r, norm
                        att.status = Status.BREAKDOWN
                        if note:  # at the rounding level: no speculation about wrong Jacobians
                            att.reason = f"{why}{note}"
                        else:
                            att.reason = f"{why}, and the dogleg trust-region step found no decrease either ({tr_why})"
                        return x, r, norm
                    att.trust_region_steps += 1
                    if tr_since is None:
                        tr_since = it
            x, r, norm = accepted
            self._note(x, r, norm)
            if norm < _PROGRESS * best:
                best, best_it = norm, it
            elif it - best_it >= _STALL_NEWTON:
                if self._at_noise(x, J, norm):
                    att.status = Status.CONVERGED
                    return x, r, norm
                att.status = Status.BREAKDOWN
                att.reason = (
                    f"no progress in {_STALL_NEWTON} Newton iterations: ||F|| has stayed above {_PROGRESS:g} x {best:.3e} (iteration "
                    f"{best_it}){' (full steps cycling: line_search=True would globalize them)' if not self.line_search else ''}"
                )
                return x, r, norm
        _finish(att, x, norm, target, maxiter)
        return x, r, norm

    def _line_search(self, x, r, norm: float, dx, params: tuple, it: int):
        """Backtracking (halving) until ``||F(x + a dx)|| <= (1 - 1e-4 a) ||F(x)||``."""
        alpha, best = 1.0, math.inf
        for _ in range(self.max_backtracks + 1):
            xt = x + alpha * dx
            rt = self.f(xt, params)
            nt = vector_norm(rt) if _finite(xt) else math.inf
            best = min(best, nt)
            if nt <= (1 - _ARMIJO * alpha) * norm:
                return (xt, rt, nt), ""
            alpha *= 0.5
        return None, (
            f"line search at iteration {it}: no step in [2^-{self.max_backtracks}, 1] along the Newton direction "
            f"reduced ||F|| = {norm:.3e} (best {best:.3e})"
        )

    def _newton_direction(self, x, r, params: tuple, it: int, norm: float, *, recover: bool):
        """``(du, J, failure)``: the Newton direction (None when the linear solve failed and
        ``recover``), the sparse Jacobian (None matrix-free) and what failed (or None)."""
        J = None
        try:
            if self.jac_kind == "matrix-free":
                dx = self._newton_step_matrix_free(x, r, params, it, norm)
            else:
                J = self.jacobian_at(x, params, it)
                try:
                    self.linear.load(J)
                    dx = self.linear.solve(-r)
                except SingularMatrixError as exc:
                    raise SingularMatrixError(
                        f"nonlinear_solve: the Jacobian at Newton iteration {it} is singular: {exc}", exc.row
                    ) from exc
        except (SingularMatrixError, NotConvergedError) as exc:
            if not recover:
                raise
            return None, J, str(exc)
        if not _finite(dx):
            return None, J, f"the Newton step at iteration {it} is not finite (J nearly singular, or it overflows)"
        return dx, J, None

    def _newton_step_matrix_free(self, x, r, params: tuple, it: int, norm: float):
        from ...backends.torch_native.krylov import gmres

        o = self.linear_options
        if o.get("backend") not in (None, "torch") or o.get("method") not in (None, "gmres"):
            raise InputError(
                "nonlinear_solve: matrix-free Newton-Krylov runs GMRES on Jacobian-vector products; linear_options "
                f"backend={o.get('backend')!r}, method={o.get('method')!r} need a sparse Jacobian (give jac_pattern= "
                f"or jacobian=)"
            )
        pre = o.get("preconditioner")
        if pre is not None and not callable(pre):
            raise InputError(
                f"nonlinear_solve: matrix-free Newton takes a callable preconditioner (X -> M^-1 X on (n, k) blocks), "
                f"got {pre!r}"
            )
        if self._user_linear_rtol is not None:
            eta = float(self._user_linear_rtol)
        else:  # inexact Newton forcing term; no tighter than the outer target needs
            eta = min(0.1, max(norm / self.record.history[0], 0.5 * self._target() / max(norm, 1e-300)))
        mv = self.linearize(x, params)
        dx, res = gmres(mv, -r.reshape(-1, 1), rtol=eta, atol=float(o.get("atol") or 0.0),
                        maxiter=o.get("maxiter"), restart=int(o.get("restart") or 30), M=pre,
                        check_every=int(o.get("check_every") or 8))
        self.record.gmres.append(res)
        if not res.converged and res.status is not Status.MAX_ITERATIONS:
            self._linear_failed(res, f"Newton iteration {it}")
        return dx.reshape(-1)

    def _linear_failed(self, res: IterationResult, where: str) -> None:
        msg = (
            f"nonlinear_solve: matrix-free GMRES ({where}) stopped after {res.iterations} iterations with relative "
            f"residual {res.residual:.3g} ({res.status.value}: {res.reason}); give jac_pattern= for a sparse Jacobian "
            f"and a direct solver, a preconditioner in linear_options, or a larger maxiter"
        )
        if self.linear_policy == "raise":
            raise NotConvergedError(msg, res)
        if self.linear_policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=5)

    # The trust-region recovery ----------------------------------------------------------------------
    def _jacobian_products(self, x, params: tuple, J):
        """``(v -> J v, v -> J^T v)`` at ``x``: on the sparse Jacobian, or by AD matrix-free."""
        if J is not None:
            JT = J.T
            return (lambda v: (J @ v.reshape(-1, 1)).reshape(-1)), (lambda v: (JT @ v.reshape(-1, 1)).reshape(-1))
        fn = self.flat(params)
        with torch.enable_grad():
            xg = x.detach().clone().requires_grad_()
            rg = fn(xg)
        jvp = self.linearize(x, params)

        def rmv(v: torch.Tensor) -> torch.Tensor:
            (g,) = torch.autograd.grad(rg, xg, v, retain_graph=True, allow_unused=True)
            return torch.zeros_like(x) if g is None else g

        return (lambda v: jvp(v.reshape(-1, 1)).reshape(-1)), rmv

    def _dogleg(self, x, r, norm: float, dx, J, params: tuple, delta: float | None):
        """One dogleg trust-region step on the model ``||F + J p||``: ``((x, r, ||r||) or None,
        radius, why it failed)``. ``dx`` is the Newton step (None when the linear solve failed:
        then the step runs along the steepest-descent direction only)."""
        mv, rmv = self._jacobian_products(x, params, J)
        g = rmv(r)  # gradient of ||F||^2 / 2
        gn = vector_norm(g)
        if gn == 0.0 or not math.isfinite(gn):
            return None, delta, (
                f"J^T F = 0 there: a stationary point of ||F|| (||F|| = {norm:.3e}) that is not a root, where no step "
                f"decreases ||F|| to first order"
            )
        Jg = mv(g)
        jgn = vector_norm(Jg)
        if jgn == 0.0 or not math.isfinite(jgn):
            return None, delta, f"J J^T F is {'0' if jgn == 0 else 'not finite'}: the Jacobian is unusable there"
        t = (gn / jgn) ** 2
        pc = -t * g  # Cauchy point: the model's minimum along -g
        pcn = t * gn
        pnn = vector_norm(dx) if dx is not None else math.inf
        if delta is None:
            delta = pcn if pcn < pnn else 0.5 * pnn
        floor = _PRECISION_ULPS * float(torch.finfo(x.dtype).eps) * max(vector_norm(x), float(torch.finfo(x.dtype).tiny))
        for _ in range(_TR_TRIES):
            if dx is not None and pnn <= delta:
                p = dx
            elif dx is None or pcn >= delta:
                p = (delta / pcn) * pc
            else:  # on the segment from the Cauchy point to the Newton point, at distance delta
                d = dx - pc
                a, b, c = float(d @ d), 2 * float(pc @ d), pcn * pcn - delta * delta
                tau = (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a) if a > 0 else 1.0
                p = pc + min(max(tau, 0.0), 1.0) * d
            pn = vector_norm(p)
            model = vector_norm(r + mv(p))
            pred = (norm - model) * (norm + model)
            xt = x + p
            rt = self.f(xt, params)
            nt = vector_norm(rt) if _finite(xt) else math.inf
            actual = (norm - nt) * (norm + nt)
            if pred > 0 and math.isfinite(nt) and actual >= _TR_ETA * pred:
                rho = actual / pred
                if rho > 0.75 and pn >= 0.99 * delta:
                    delta = 2 * delta
                elif rho < 0.25:
                    delta = 0.25 * pn
                return (xt, rt, nt), delta, ""
            delta = 0.25 * pn
            if delta <= floor:
                break
        return None, delta, (
            f"radius down to {delta:.1e}, ||J^T F|| / ||F|| = {gn / norm:.1e}: the Jacobian may be wrong there, or u "
            f"sits near a local minimum of ||F|| that is not a root; no root near u0, or one a fixed-point method "
            f"reaches"
        )

    # Anderson / Picard ------------------------------------------------------------------------------
    def _fixed_point(self, att: _Attempt, x, r, norm: float, params: tuple, maxiter: int):
        """Anderson (type II, Walker & Ni) on ``G(x) = x - omega M^-1 F(x)``; Picard is depth 0."""
        self.prepare_preconditioner(params)
        method = att.method
        target = self._target()
        beta, m = self.damping, (self.depth if method == "anderson" else 0)
        dX: list[torch.Tensor] = []
        dG: list[torch.Tensor] = []
        x_prev = g_prev = None
        start = best = norm
        best_it = 0
        for it in range(1, maxiter + 1):
            if norm <= target and _finite(x):
                att.status = Status.CONVERGED
                return x, r, norm
            g = -self.omega * self.precondition(r)  # G(x) - x
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


def _finish(att, x: torch.Tensor, norm: float, target: float, maxiter: int, hint: str = "") -> None:
    """The status of an attempt that ran to ``maxiter``: converged if the last iterate meets the
    target (and is finite), else MAX_ITERATIONS with the reason (and ``hint``)."""
    if norm <= target and _finite(x):
        att.status = Status.CONVERGED
    else:
        att.status = Status.MAX_ITERATIONS
        att.reason = f"maxiter ({maxiter}) reached with ||F|| = {norm:.3e} above the target {target:.3e}{hint}"


def _lstsq(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimum-norm least squares ``min ||A x - b||`` for a tall ``(n, m)`` A, small m (SVD, any device)."""
    U, s, Vh = torch.linalg.svd(A, full_matrices=False)
    keep = s > s[0] * max(A.shape) * torch.finfo(A.dtype).eps * 1e3 if s.numel() else s > 0
    inv = torch.where(keep, 1 / torch.where(keep, s, torch.ones_like(s)), torch.zeros_like(s))
    return Vh.transpose(0, 1) @ (inv * (U.transpose(0, 1) @ b))
