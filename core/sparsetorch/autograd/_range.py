"""The last resort of the fallback route: when the LU factorizations call A singular and ``b``
lies in A's range, a solution by refinement with the factorization of ``A + delta I``
(docs/dispatch.md, "Checked answers and fallback"). A mixin of :class:`~.fallback.Route`."""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from ..dispatch.accuracy import unit_roundoff
from ..dispatch.plan import PlanState, guarded
from ..dispatch.records import Offer
from ..dispatch.results import Attempt, IterationResult, Status
from ..errors import BackendError, IndefiniteMatrixError, SingularMatrixError
from ._route_checks import _checked

__all__ = ["RangeSearch"]

#: refinement steps with the shifted factorization when b may lie in a singular A's range
_RANGE_STEPS = 30
#: a singular matrix without a stored diagonal gets the refinement with a dense LU up to this size
_DENSE_RANGE_MAX = 512


class RangeSearch:
    """Solutions of a singular A's system when ``b`` is in its range (see the module docstring)."""

    def _in_range(self, final: BaseException, values: torch.Tensor, B: torch.Tensor, adjoint: bool, rtol: float,
                  atol: float) -> tuple[torch.Tensor, IterationResult] | None:
        """After the LU factorizations called A singular: when ``b`` lies in A's range the system
        still has solutions. One is found by refinement with a shifted factorization,
        ``x += (A + delta I)^-1 (b - A x)`` with ``delta = sqrt(u) max|A|``: on A's range the
        iteration contracts by ``delta / |lambda|`` per step, and a component of ``b`` outside the
        range never shrinks (the residual stalls, and the singular verdict stands). One LU of
        the shifted matrix and a few solves: about the cost of the failed factorization. None
        also when the method was pinned, for the adjoint direction (the gradient of a solve with
        a singular matrix is not defined), or when A does not store its whole diagonal."""
        if self.pinned or adjoint or not isinstance(final, SingularMatrixError):
            return None
        state, offer = self._lu_state()
        if state is None:
            return None
        coords, slot = self.A.entries()
        on = coords[0] == coords[1]
        n = self.A.format_shape[0]
        dslots = slot[on]
        t0 = time.perf_counter()
        if dslots.numel() != n or bool((coords[0][on].unique().numel() != n)):
            return self._dense_in_range(values, B, rtol, atol, t0)
        real = values.real if values.is_complex() else values
        delta = math.sqrt(unit_roundoff(values.dtype)) * float(real.abs().amax() if not values.is_complex()
                                                               else values.abs().amax())
        shifted = values.clone()
        shifted[..., dslots] += delta
        with state.lock, torch.no_grad():
            try:
                state._load(shifted)
                got = _refine(lambda R: _checked(state, guarded(lambda: state.plan.solve(R, adjoint=False, options={}),
                                                                state.label, "solve"), B)[0],
                              lambda X: self._apply(values, X, False), B, rtol, atol)
            except (SingularMatrixError, IndefiniteMatrixError, BackendError):
                return None
        if got is None:
            return None
        X, rel, steps = got
        reason = (f"an LU met an exactly zero pivot (A is singular, or nearly) and b lies in A's range: a solution "
                  f"by {steps} refinement steps with the factorization of A + {delta:.2g} I")
        self.attempts.append(Attempt(offer.backend, offer.method, None, steps, Status.CONVERGED, rel, reason, True,
                                     time.perf_counter() - t0))
        self.state, self.offer = state, offer
        return X, IterationResult(steps, rel, True, Status.CONVERGED, reason)

    def _dense_in_range(self, values: torch.Tensor, B: torch.Tensor, rtol: float, atol: float,
                        t0: float) -> tuple[torch.Tensor, IterationResult] | None:
        """A small matrix without a stored diagonal to shift (CPU, n <= 512): the same refinement
        with a dense LU of ``A + delta I`` (LAPACK getrf, a third of an SVD's cost)."""
        n = self.A.format_shape[0]
        if n > _DENSE_RANGE_MAX or values.device.type != "cpu":
            return None
        D = self.A.with_values(values).to_dense()  # a new tensor: shifted in place
        delta = math.sqrt(unit_roundoff(values.dtype)) * float(values.abs().amax())
        D.diagonal(dim1=-2, dim2=-1).add_(delta)
        LU, piv, info = torch.linalg.lu_factor_ex(D)
        if bool((info != 0).any()):
            return None
        got = _refine(lambda R: torch.linalg.lu_solve(LU, piv, R), lambda X: self._apply(values, X, False), B, rtol,
                      atol)
        if got is None:
            return None
        X, rel, steps = got
        reason = (f"an LU met an exactly zero pivot (A is singular, or nearly) and b lies in A's range: a solution "
                  f"by {steps} refinement steps with a dense LU of A + {delta:.2g} I")
        self.attempts.append(Attempt("torch", "dense", None, steps, Status.CONVERGED, rel, reason, True,
                                     time.perf_counter() - t0))
        return X, IterationResult(steps, rel, True, Status.CONVERGED, reason)

    def _lu_state(self) -> tuple[PlanState | None, Offer | None]:
        """An LU plan of this route for the shifted factorization: the cheapest LU offer's (the
        current plan when that is it)."""
        for o in sorted(self._lu_offers, key=lambda o: o.seconds):
            if o is self.offer:
                return self.state, self.offer
            try:
                return self._make(o), o
            except BackendError:
                continue
        return None, None

    # ------------------------------------------------------------------------------------------


def _refine(solve: Callable[[torch.Tensor], torch.Tensor], apply: Callable[[torch.Tensor], torch.Tensor],
            B: torch.Tensor, rtol: float, atol: float) -> tuple[torch.Tensor, float, int] | None:
    """``x += (A + delta I)^-1 (b - A x)`` from ``x = 0`` until every column meets
    ``max(rtol ||b||, atol)``: ``(X, relative residual, steps)``; None when it stalls (the residual
    does not halve in a step after the second: ``b`` has a component outside A's range), turns
    non-finite, or runs out of steps."""
    bn = torch.linalg.vector_norm(B, dim=-2)
    tol = torch.clamp(bn * rtol, min=atol)
    X = torch.zeros_like(B)
    R, rn = B, bn
    for steps in range(1, _RANGE_STEPS + 1):
        X = X + solve(R)
        R = B - apply(X)
        rn_new = torch.linalg.vector_norm(R, dim=-2)
        if not bool(torch.isfinite(rn_new).all()):
            return None
        if bool((rn_new <= tol).all()):
            return X, float((rn_new / torch.where(bn > 0, bn, torch.ones_like(bn))).max()), steps
        if steps >= 2 and not bool((rn_new < 0.5 * rn).all()):
            return None
        rn = rn_new
    return None
