"""The fallback route's handling of singular matrices (a mixin of :class:`~.fallback.Route`):

- structure that proves A singular whatever its values (an empty row or column, an unknown that
  two single-entry equations constrain), found in O(nnz) after the first zero pivot: no second
  factorization is needed for the verdict, and where ``b`` cannot lie in the range (a nonzero
  ``b_i`` on an empty row, two such equations that disagree) the error says exactly that;
- the last resort when the LU factorizations call A singular and ``b`` lies in A's range: a
  solution by refinement with the factorization of ``A + delta I`` (docs/dispatch.md, "Checked
  answers and fallback").
"""

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
        coords, slot = self.A.entries()
        on = coords[0] == coords[1]
        n = self.A.format_shape[0]
        dslots = slot[on]
        t0 = time.perf_counter()
        if dslots.numel() != n or bool((coords[0][on].unique().numel() != n)):
            if n <= _DENSE_RANGE_MAX and values.device.type == "cpu":
                return self._dense_in_range(values, B, rtol, atol, t0)
            lu = self._lu_offer()
            return None if lu is None else self._union_in_range(lu, values, B, rtol, atol, t0)
        state, offer = self._lu_state()
        if state is None or offer is None:
            return None
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
        reason = (f"{self._cause()} and b lies in A's range: a solution "
                  f"by {steps} refinement steps with the factorization of A + {delta:.2g} I")
        self.attempts.append(Attempt(offer.backend, offer.method, None, steps, Status.CONVERGED, rel, reason, True,
                                     time.perf_counter() - t0))
        self.state, self.offer = state, offer
        return X, IterationResult(steps, rel, True, Status.CONVERGED, reason)

    def _union_in_range(self, offer: Offer, values: torch.Tensor, B: torch.Tensor, rtol: float, atol: float,
                        t0: float) -> tuple[torch.Tensor, IterationResult] | None:
        """A matrix that does not store its whole diagonal (an unused unknown: an empty row and
        column): the same refinement with the LU of ``A + delta I`` on A's pattern plus the
        diagonal (a new plan of the same LU offer, not cached)."""
        if values.dim() != 1 or self._make is None:
            return None
        from ..format import CSR  # noqa: PLC0415
        from ..tensor import SparseTensor  # noqa: PLC0415 - the route's matrix type, imported late (layering)

        coords, slot = self.A.entries()
        n = self.A.format_shape[0]
        eye = torch.arange(n, dtype=coords.dtype, device=coords.device)
        delta = math.sqrt(unit_roundoff(values.dtype)) * float(values.abs().amax())
        vals = torch.cat([values.index_select(-1, slot), torch.full((n,), delta, dtype=values.dtype,
                                                                    device=values.device)])
        M = SparseTensor.from_coo(vals, torch.cat([coords[0], eye]), torch.cat([coords[1], eye]), shape=(n, n),
                                  format=CSR, check=False)
        try:
            state = self._make(offer, M)
            with state.lock, torch.no_grad():
                state._load(M.values)
                got = _refine(lambda R: _checked(state, guarded(lambda: state.plan.solve(R, adjoint=False, options={}),
                                                                state.label, "solve"), B)[0],
                              lambda X: self._apply(values, X, False), B, rtol, atol)
        except (SingularMatrixError, IndefiniteMatrixError, BackendError, TypeError):
            return None
        if got is None:
            return None
        X, rel, steps = got
        reason = (f"{self._cause()} and b lies in A's range: a solution "
                  f"by {steps} refinement steps with the factorization of A + {delta:.2g} I (the diagonal added to "
                  f"A's pattern)")
        self.attempts.append(Attempt(offer.backend, offer.method, None, steps, Status.CONVERGED, rel, reason, True,
                                     time.perf_counter() - t0))
        return X, IterationResult(steps, rel, True, Status.CONVERGED, reason)

    def _dense_in_range(self, values: torch.Tensor, B: torch.Tensor, rtol: float, atol: float,
                        t0: float) -> tuple[torch.Tensor, IterationResult] | None:
        """A small matrix without a stored diagonal to shift (CPU, n <= 512): the same refinement
        with a dense LU of ``A + delta I`` (LAPACK getrf, a third of an SVD's cost)."""
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
        reason = (f"{self._cause()} and b lies in A's range: a solution "
                  f"by {steps} refinement steps with a dense LU of A + {delta:.2g} I")
        self.attempts.append(Attempt("torch", "dense", None, steps, Status.CONVERGED, rel, reason, True,
                                     time.perf_counter() - t0))
        return X, IterationResult(steps, rel, True, Status.CONVERGED, reason)

    def _empty_line(self, values: torch.Tensor, B: torch.Tensor, adjoint: bool) -> str | SingularMatrixError | None:
        """After a zero pivot: a row or column of A with no nonzero entry proves A singular. A
        description of it, or (for a row of the system whose right-hand side is not zero: no
        solution exists) the error to raise; None when every row and column holds an entry."""
        if values.dim() != 1:
            return None
        coords, slot = self.A.entries()
        live = values.index_select(-1, slot) != 0
        m, n = self.A.format_shape
        rows = torch.zeros(m, dtype=torch.bool, device=values.device).index_fill_(0, coords[0][live], True)
        cols = torch.zeros(n, dtype=torch.bool, device=values.device).index_fill_(0, coords[1][live], True)
        eq, unk = (cols, rows) if adjoint else (rows, cols)  # equations (rows of the system), unknowns
        empty = (~eq).nonzero().flatten()
        if empty.numel():
            bad = (B.index_select(-2, empty) != 0).flatten(1).any(-1) if B.dim() > 1 else B[empty] != 0
            what = "column" if adjoint else "row"
            i = int(empty[0])
            if bool(bad.any()):
                k = int(empty[bad.nonzero()[0, 0]])
                return SingularMatrixError(
                    f"{what} {k} of A has no nonzero entry (of {int(empty.numel())} empty {what}s), while the right-hand "
                    f"side's entry {k} is not zero: the system has no solution. Check the assembly (a missing boundary "
                    f"condition or equation), or use least squares (lstsq) for a best fit", row=k)
            return f"{what} {i} of A has no nonzero entry"
        if not bool(unk.all()):
            return f"{'row' if adjoint else 'column'} {int((~unk).nonzero()[0, 0])} of A has no nonzero entry"
        # two equations that each hold a single entry, in the same unknown (a condition imposed
        # twice on one degree of freedom): singular whatever the values; no solution unless they agree
        e_idx, u_idx = (coords[1], coords[0]) if adjoint else (coords[0], coords[1])
        e_live, u_live = e_idx[live], u_idx[live]
        counts = torch.bincount(e_live, minlength=eq.numel())
        single = counts[e_live] == 1
        if int(single.sum()) < 2:
            return None
        su, se = u_live[single], e_live[single]
        order = torch.argsort(su, stable=True)
        su, se = su[order], se[order]
        same = su[1:] == su[:-1]
        if not bool(same.any()):
            return None
        k = int(same.nonzero()[0, 0])
        i, j, u = int(se[k]), int(se[k + 1]), int(su[k])
        a = values.index_select(-1, slot[live][single][order][k:k + 2])
        if adjoint:
            a = a.conj()
        bi, bj = (B[i], B[j]) if B.dim() > 1 else (B[i:i + 1], B[j:j + 1])
        # x_u = b_i / a_i = b_j / a_j for every column, to rounding
        lhs, rhs = bi * a[1], bj * a[0]
        tol = 8 * unit_roundoff(B.dtype) * torch.maximum(lhs.abs(), rhs.abs())
        what = "column" if adjoint else "row"
        if bool(((lhs - rhs).abs() > tol).any()):
            return SingularMatrixError(
                f"{what}s {i} and {j} of A each hold a single entry, both in unknown {u}, and the right-hand side "
                f"makes them disagree (x[{u}] = {complex(bi.flatten()[0] / a[0]).real:.6g} from {what} {i}, "
                f"{complex(bj.flatten()[0] / a[1]).real:.6g} from {what} {j}): the system has no solution. Check "
                f"for a condition imposed twice on one unknown, or use least squares (lstsq)", row=j)
        return f"{what}s {i} and {j} of A each hold a single entry, both in unknown {u}"

    def _cause(self) -> str:
        """Why A was found singular, for the in-range answer's reason."""
        line = getattr(self, "_empty_found", None)  # set by the route (fallback.py)
        return f"{line} (A is singular)" if line else "an LU met an exactly zero pivot (A is singular, or nearly)"

    def _lu_offer(self) -> Offer | None:
        """The cheapest LU offer of this route (None when it has none)."""
        return min(self._lu_offers, key=lambda o: o.seconds, default=None)

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
