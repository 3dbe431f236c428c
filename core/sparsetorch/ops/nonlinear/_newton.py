"""Newton's method of ``nonlinear_solve``: the step ``J du = -F`` (a sparse Jacobian on the linear
plan, or GMRES on Jacobian-vector products), the backtracking (Armijo) line search on ``||F||``,
and the dogleg trust-region step that takes over where the line search or the linear solve fails
(Powell's hybrid step between the Cauchy point ``-t J^T F`` and ``du``, inside a radius that
shrinks until the actual decrease of ``||F||^2`` matches the linear model's, and grows after good
steps). Newton stops when neither finds a decrease (a stationary point of ``||F||`` that is not a
root, or a wrong Jacobian), when it makes no progress for ``_STALL_NEWTON`` iterations (full steps
cycling, ``line_search=False``), or at ``maxiter``. Mixed into :class:`~._problem.Problem`."""

from __future__ import annotations

import math
import warnings

import torch

from ...errors import InputError, NotConvergedError, SingularMatrixError, SparseTorchWarning
from ..info import Status
from ._common import (_ARMIJO, _NOISE, _PRECISION_ULPS, _PROGRESS, _STALL_NEWTON, _TR_ETA, _TR_TRIES, _Attempt,
                      _at_precision, _finish, _finite, vector_norm)
from ._methods import Newton

#: matrix-free Newton's inner GMRES per step when linear_options gives no maxiter (an inexact step: see
#: _newton_step_matrix_free); restarts of 30, so ~33 cycles
NEWTON_GMRES_MAXITER = 1000

__all__ = ["NewtonSteps"]


class NewtonSteps:
    """Newton's iteration of :class:`~._problem.Problem` (mixed in; uses its residual, Jacobian,
    linear solver and the driver's bookkeeping in ``_iterations.py``)."""

    # Newton -----------------------------------------------------------------------------------------
    def _newton(self, att: _Attempt, x, r, norm: float, params: tuple, maxiter: int, spec: Newton):
        target = self._target()
        best, best_it = norm, 0
        delta = None  # trust-region radius, kept across the iterations that need it
        # the scale a step is measured against: the larger of ||u|| and ||u0|| (a root at or near 0 makes every
        # step O(||u||); session 24's review)
        u0_norm = float(vector_norm(x))
        tr_since = None  # the iteration whose failed line search switched to trust-region steps
        step = None  # ||du|| / ||u|| of the last step taken
        for it in range(1, maxiter + 1):
            if norm <= target and _finite(x) and not self._far_step(step):
                att.status = Status.CONVERGED
                return x, r, norm
            dx, J, failure = self._newton_direction(x, r, params, it, norm, recover=spec.line_search)
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
            if not spec.line_search:
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
                    accepted, why = self._line_search(x, r, norm, dx, params, it, spec.max_backtracks)
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
            # the full Newton step's size (a damped step is small also where Newton stalls at a minimum of ||F||
            # that is no root: Bratu from u0 = 50 stopped 6.4 from the root with ||F|| = 2.8e3, "converged")
            full = dx if dx is not None else accepted[0] - x
            unorm = float(vector_norm(accepted[0]))
            # against ||u||; where u has gone to 0 at the scale of the start (a root at 0: every step is O(||u||);
            # session 24's review) the relative test of ||F|| alone decides
            at_zero = unorm <= math.sqrt(torch.finfo(accepted[0].dtype).eps) * u0_norm
            step = 0.0 if at_zero else float(vector_norm(full)) / max(unorm, 1e-300)
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
                    f"{best_it}){' (full steps cycling: line_search=True would globalize them)' if not spec.line_search else ''}"
                )
                return x, r, norm
        if self._far_step(step) and norm <= target:
            self._strict_target = max(self.rtol * norm, self.atol)
            att.status = Status.MAX_ITERATIONS
            att.reason = (f"maxiter ({maxiter}) reached with ||F|| = {norm:.3e} below rtol ||F(u0)|| = {target:.3e}, but "
                          f"Newton's last step was {step:.2g} of ||u|| (not yet at a root: a start far from it makes "
                          f"||F(u0)|| large); raise maxiter, start nearer, or give rtol / atol")
            return x, r, norm
        _finish(att, x, norm, target, maxiter)
        return x, r, norm

    def _far_step(self, step: float | None) -> bool:
        """Whether the default tolerance's relative test, met after a step of relative size ``step``, is not yet
        an answer: ``||F(u)|| <= rtol ||F(u0)||`` is met far from the root when ``||F(u0)||`` is huge (a start
        1e6 away: ||F|| 1.8e9, u 451 from the root, "converged"; session 24's sweep), while Newton, converging
        quadratically, is still taking steps of the order of u. A default call also asks the last Newton step
        (undamped) to be below ``sqrt(rtol)`` of ``||u||`` (the next one, about its square, then below ``rtol``),
        unless ``||u||`` fell below ``sqrt(eps) ||u0||`` (a root at 0); an explicit rtol / atol keeps its
        meaning."""
        return self.default_tolerance and not self.atol and step is not None and step > math.sqrt(self.rtol)

    def _line_search(self, x, r, norm: float, dx, params: tuple, it: int, max_backtracks: int):
        """Backtracking (halving) until ``||F(x + a dx)|| <= (1 - 1e-4 a) ||F(x)||``."""
        alpha, best = 1.0, math.inf
        for _ in range(max_backtracks + 1):
            xt = x + alpha * dx
            rt = self.f(xt, params)
            nt = vector_norm(rt) if _finite(xt) else math.inf
            best = min(best, nt)
            if nt <= (1 - _ARMIJO * alpha) * norm:
                return (xt, rt, nt), ""
            alpha *= 0.5
        return None, (
            f"line search at iteration {it}: no step in [2^-{max_backtracks}, 1] along the Newton direction "
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
        # an inexact Newton step needs no converged inner solve: GMRES from 0 lowers the linear model's residual
        # monotonically, so a partial step is still a descent direction. Without the user's maxiter its default
        # (10 n) made each step of an unpreconditioned 1-D Bratu problem (n = 3000) 30,000 products, 29 s, and a
        # default call ran past 14 minutes (session 26's sweep): capped at NEWTON_GMRES_MAXITER per step
        restart = int(o.get("restart") or 30)
        cap = None if o.get("maxiter") is not None else max(1, min(NEWTON_GMRES_MAXITER, 10 * r.numel()) // restart)
        dx, res = self.operator_solve(mv, -r.reshape(-1, 1), rtol=eta, atol=float(o.get("atol") or 0.0), M=pre,
                                      maxiter=cap)  # GMRES's maxiter counts restart cycles
        self.record.gmres.append(res)
        if (cap is not None and not res.converged and res.iterations >= cap * restart
                and not getattr(self, "_gmres_warned", False)):
            self._gmres_warned = True
            warnings.warn(
                f"nonlinear_solve: matrix-free Newton's GMRES stopped at its {cap * restart} iterations at Newton "
                f"iteration {it} "
                f"(relative residual {res.residual:.2g}{'' if pre is not None else ', no preconditioner'}); Newton "
                f"goes on with the partial step. The Jacobian's sparsity (jac_pattern=: a sparse J and a direct "
                f"solver) or a preconditioner in linear_options is usually much faster", SparseTorchWarning,
                stacklevel=4)
        if not res.converged and res.status is not Status.MAX_ITERATIONS:
            self.linear_failed(res, f"Newton iteration {it}")
        return dx.reshape(-1)

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
