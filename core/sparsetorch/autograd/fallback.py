"""One solve call's route through the methods dispatch ranked, with every answer checked.

A :class:`Route` starts at the offer dispatch chose and holds the ones ranked after it. Each
attempt runs under the plan's lock (values loaded, solved, checked: another thread cannot swap
the values in between), and its answer is checked by the core whatever the backend said:

1. the result is a ``(X, IterationResult)`` pair, ``X`` of ``B``'s shape, dtype and device
   (else :class:`BackendError`, phase "result");
2. ``X`` is finite;
3. the true residual ``||b - A x||`` meets ``max(rtol ||b||, atol)`` for every column. If it
   does not, up to two steps of iterative refinement on the same plan (``x += A^-1 r``) are
   tried; a direct method's answer that still misses is accepted when its normwise backward
   error ``||r|| / (||A||_F ||x|| + ||b||)`` is at the level of a backward-stable solve (an
   ill-conditioned matrix, answered as well as its dtype allows).

An attempt that fails (no convergence, a breakdown, a zero pivot of a method that does not
pivot, an indefinite matrix under CG or Cholesky, a plugin error, a check above) hands over to
the next offer, unless the user pinned the method: after an iterative failure the cheapest
remaining direct method is next (another iterative method would most likely fail the same
way); after a direct method found the matrix singular only LU factorizations (partial pivoting)
are tried, and when two of them agree (or none is left) the call raises
:class:`SingularMatrixError`. An iterative attempt that dispatch
chose runs with ``maxiter`` bounded so that it costs about what the cheapest direct method
ranked after it would (rent or buy). Every attempt is recorded (``SolveInfo.attempts``) and
what iterative attempts measured is remembered on the pattern (``dispatch/experience.py``).

Right-hand sides and matrices whose magnitudes would under- or overflow the squared norms the
methods compute are scaled first by powers of two (exact), and the answer scaled back.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..dispatch import experience
from ..dispatch.records import Measured, Offer
from ..errors import BackendError, IndefiniteMatrixError, NotSymmetricError, SingularMatrixError
from ..dispatch.accuracy import backward_error_bound, default_rtol, normwise_backward_error, unit_roundoff
from ..dispatch.results import Attempt, IterationResult, Status
from ..tensor import SparseTensor
from ..tensor.pattern import is_plain
from ..tensor._serial import SerialCsr, serial_ok
from ..format import CSR
from ..dispatch.options import DEFAULT_RESTART, CallOptions
from ..dispatch.plan import PlanState, _token, guarded
from ._range import RangeSearch
from .lstsq import apply_entries
from .matmul import MatmulHandle
from ._route_checks import _checked, _equilibrated, _norm2_floor, _one_line, _pow2, _pow2_scale, _safe_norm, _safe_range, _singular_growth
from . import products

__all__ = ["Route"]

#: refinement steps tried on the same plan when an answer misses the tolerance
_REFINE_STEPS = 2
#: refinement steps a direct answer of a call with no tolerance may take toward a backward-stable
#: solve's backward error (each two triangular solves on the same factors)
_REFINE_STEPS_DIRECT = 4
#: direct methods whose answers stand as computed (partial pivoting, orthogonal factors, dense LAPACK)
_PIVOTED = frozenset({"lu", "qr", "dense"})
#: an iterative answer to a call with no tolerance is also judged in the row-equilibrated norm when
#: the rows' largest entries spread over more than this factor, and must reach rtol there too: rows in
#: other units (penalty rows of boundary conditions, a symmetric scaling D A D over 10^12) cannot hide
#: the others' residual. (Below the spread, ||D r|| / ||D b|| <= spread * ||r|| / ||b|| holds anyway.)
_ROW_SCALED_SPREAD = 2.0 ** 10
#: checks' products up to this many entry x column terms are computed from A's entries directly
_DIRECT_PRODUCT = 1 << 20
#: an iterative attempt bounded by the direct method after it still gets this many iterations
_MIN_BUDGET = 20
#: the iterative probe before a direct method (a matrix class with guessed iteration counts):
#: its share of the direct method's estimated cost, and the least such cost worth probing
_PROBE_SHARE = 0.25
_PROBE_MIN_DIRECT = 4e-3
_PROBE_PRECONDITIONERS = (None, "jacobi")
#: a direct answer judged inaccurate is factored again equilibrated only when the row or the
#: column scaling spreads over more than this factor (a matrix in mixed units, say); below it
#: the equilibrated matrix is the same problem (its condition changes by at most the square)
_EQUILIBRATE_SPREAD = 16.0
#: an LU is factored equilibrated from the start when the row or the column scaling spreads over
#: more than this factor (LAPACK's drivers equilibrate when min/max of the row scales is < 0.1;
#: here the bar is higher, since an unscaled LU is usually fine up to there)
_EQUILIBRATE_FIRST = 2.0 ** 10


class Route(RangeSearch):
    """The offers a solve call may use, in dispatch order, and the one answering now."""

    def __init__(self, A: SparseTensor, state: PlanState, offer: Offer | None, rest: Sequence[Offer] = (),
                 make_state: Callable[..., PlanState] | None = None, *, pinned: bool = True,
                 probe: bool = False, restart: int = DEFAULT_RESTART) -> None:
        self.A = A
        #: the restart length of restarted methods (the request's, or the shared default): the route's
        #: iteration budgets are given to them in restart cycles (:func:`_in_units`)
        self.restart = max(1, int(restart))
        self.state = state
        self.offer = offer
        self._rest = list(rest)
        self._make = make_state
        self.pinned = pinned
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._singular_lu = 0
        #: the last direct answer checked had a condition estimate >= 1 / (8 u) (A singular to
        #: working precision, as opposed to an unstable factorization)
        self._growth_singular = False
        #: the call runs at the accuracy contract's tolerance (set per solve by _solve)
        self._default_tol = False
        #: LU offers of the route (for a shifted factorization when A turns out singular)
        self._lu_offers = [o for o in [offer, *rest] if o is not None and o.method == "lu"]
        #: the shifted factorization for b in a singular A's range was tried in this call
        self._range_tried = False
        #: the structural singularity checks (empty lines, an unknown constrained twice) ran
        self._certain_checked = False
        #: the empty row or column found before any factorization (for the answer's reason)
        self._empty_found: str | None = None
        #: an iterative probe may run before the direct method (matrix class with guessed
        #: iteration counts, nothing measured on the pattern): at most once per route
        self._probe = probe and not pinned

    @classmethod
    def single(cls, state: PlanState, A: SparseTensor) -> "Route":
        """A route of one plan (a pinned method, or a caller that does its own fallback)."""
        return cls(A, state, None)

    @property
    def label(self) -> str:
        return self.state.label

    # ------------------------------------------------------------------------------------------
    def solve(self, handle: Any, values: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A(values) X = B`` (``A^H`` for an adjoint handle), checked, with fallback.
        Runs without gradient recording (inside the autograd Function it is off already)."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self.solve(handle, values, B)
        with self._lock:
            return self._solve(handle, values, B)

    def _solve(self, handle: Any, values: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, IterationResult]:
        self._range_tried = False
        self._sharp_eta: tuple[float, float] | None = None
        self._certain_checked = False
        base = handle.call_options or {}  # read only
        dtype = B.dtype
        rtol = base.get("rtol")
        rtol = default_rtol(dtype) if rtol is None else float(rtol)
        # the accuracy contract's tolerance (the op fills it in when the caller gave none)
        self._default_tol = rtol == default_rtol(dtype) and not base.get("atol")
        atol = float(base.get("atol") or 0.0)
        bmax = float(B.abs().amax()) if B.numel() else 0.0
        vmax = float(values.abs().amax()) if values.numel() else 0.0
        # NaN/Inf were checked by the op unless the caller said check_finite=False: then they reach
        # the method (unscaled) and its answer is judged like any other
        if bmax == 0:
            return torch.zeros_like(B), IterationResult(0, 0.0, True, Status.CONVERGED, "zero right-hand side")
        if vmax == 0:
            raise SingularMatrixError(f"A has {values.shape[-1]} stored entries, all zero: the matrix is singular")
        sb, sa = _pow2_scale(bmax, dtype), _pow2_scale(vmax, dtype)
        if sa != 1.0:
            sa = _within_range(values, sa, vmax)
        col = _column_scales(B, sb, dtype)
        if col is not None:
            # right-hand sides of very different magnitudes: one common scale would flush the
            # small ones to zero (1e-200 beside 1e200 came back as zeros, session 21's sweep), so
            # each column (of each batch member) gets its own power of two
            Bs = B * col
            atol_s = atol * float(col.amin())
            sb = col  # type: ignore[assignment]
        else:
            if sb != 1.0:
                sb = _within_range(B, sb, bmax)
            Bs = B * sb if sb != 1.0 else B
            atol_s = atol * sb
        vs = values * sa if sa != 1.0 else values
        failures: list[tuple[str, BaseException | None]] = []
        best: tuple[torch.Tensor, IterationResult] | None = None
        if not self.pinned and values.dim() == 1 and _has_empty_line(self.A):
            found = self._structural_first(vs, Bs, handle.adjoint, rtol, atol_s)
            if found is not None:
                return self._unscaled(found[0], sa / sb), found[1]
        if self._probe:
            self._probe = False
            probed = self._probe_first(vs, Bs, handle, base, rtol, atol_s)
            if probed is not None:
                return self._unscaled(probed[0], sa / sb), probed[1]
            if self.attempts:  # a probe ran and did not answer: its plan read (and may have written) A's pattern
                a = self.attempts[-1]
                self._pattern_intact(f"{a.backend}/{a.method}", f"as a probe: {a.reason}", None)
        while True:
            state, offer = self.state, self.offer
            opts = self._options_for(offer, base, rtol, atol_s)
            # the thread's CPU time is read (a system call, ~2 us) only where _note may use it: a
            # direct offer, and at the end only when the wall time could reach its threshold
            t0, c0 = time.perf_counter(), (time.thread_time() if offer is not None and offer.direct else None)
            try:
                X, res = self._attempt(state, vs, Bs, opts, handle.adjoint, rtol, atol_s, offer)
            except (SingularMatrixError, IndefiniteMatrixError, NotSymmetricError, BackendError) as exc:
                # a zero pivot of a direct method is a verdict on A; one of a preconditioner's
                # factorization (ILU, IC) is only that preconditioner's failure
                kind = "singular" if isinstance(exc, SingularMatrixError) and _direct(offer) else "error"
                self._note(state, offer, IterationResult(0, math.inf, False, Status.BREAKDOWN, _one_line(exc)),
                           time.perf_counter() - t0, rtol, None)
                failures.append((kind, exc))
                self._pattern_intact(state.label, _one_line(exc), exc)
                if kind == "singular" and not self.pinned and self._singular_lu < 2 and not self._certain_checked:
                    self._certain_checked = True
                    certain = self._empty_line(vs, Bs, handle.adjoint)
                    if certain is not None:
                        # an empty row or column: singular whatever the values, no second LU needed
                        # (an empty row whose b entry is not zero leaves no solution at all)
                        self._singular_lu = 2
                        if isinstance(certain, SingularMatrixError):
                            self._range_tried = True
                            failures[-1] = ("singular", certain)
                            return self._give_up(certain, failures, vs, Bs, handle.adjoint, rtol, atol_s, sa / sb)
                if (kind == "singular" and offer is not None and offer.method == "lu" and not self.pinned
                        and not self._range_tried):
                    # the first LU with partial pivoting that meets an exactly zero pivot: if b lies
                    # in A's range a solution exists and is found now (whatever the second LU would
                    # say, the answer is checked by its residual); if not, a second LU decides
                    self._range_tried = True
                    found = self._in_range(exc, vs, Bs, handle.adjoint, rtol, atol_s)
                    if found is not None:
                        return self._unscaled(found[0], sa / sb), found[1]
                if self.pinned or not self._advance(kind, offer):
                    return self._give_up(exc, failures, vs, Bs, handle.adjoint, rtol, atol_s, sa / sb)
                continue
            self._note(state, offer, res, time.perf_counter() - t0, rtol, c0)
            if res.converged:
                out = self._unscaled(X, sa / sb)
                if (isinstance(sb, float) and sa == sb) or bool(torch.isfinite(out).all()):
                    return out, res
                # the answer of the scaled system is fine, but the solution itself overflows the dtype
                res = replace(res, converged=False, status=Status.NOT_FINITE,
                              reason=f"{OVERFLOW_REASON} {X.dtype}: its entries reach "
                                     f"{float((X.abs() * (sa / sb)).amax()):.3g}; rescale the problem (units) or use a "
                                     f"wider dtype")
                self.attempts[-1] = replace(self.attempts[-1], succeeded=False, status=res.status, reason=res.reason)
                return out, res
            if best is None or res.residual < best[1].residual:
                best = (X, res)
            failures.append(("iterative" if res.status is not Status.INACCURATE or not _direct(offer) else "inaccurate",
                             None))
            if not self.pinned:
                self._pattern_intact(state.label, res.reason, None)  # before another method reads A's pattern
            if self.pinned or not self._advance(failures[-1][0], offer):
                if any(k == "singular" for k, _ in failures) or failures[-1][0] == "inaccurate":
                    return self._give_up(None, failures, vs, Bs, handle.adjoint, rtol, atol_s, sa / sb)
                X, res = best
                if len(self.attempts) > 1:
                    res = replace(res, reason=f"{res.reason}; tried: " + "; ".join(str(a) for a in self.attempts))
                return self._unscaled(X, sa / sb), res

    def _pattern_intact(self, label: str, what: str, exc: BaseException | None) -> None:
        """Raise :class:`BackendError` naming the plan ``label`` ("backend/method") where A's index buffers are no longer valid after
        it failed (``what``): the next method (and the route's checks) would read a pattern the caller did not
        pass. A plugin that wrote into them (plans of large matrices share the caller's memory), then failed,
        left the fallback hanging in compiled code (session 27's plugin sweep). O(nnz), failure paths only."""
        broken = _broken_pattern(self.A)
        if broken is not None:
            raise BackendError(
                f"{label} failed ({what}) and A's index buffers are no longer valid after it ({broken}): a plan "
                f"that wrote into its inputs (plans must not modify them: a bug of that backend; report it to its "
                f"authors). Nothing else read them; rebuild A, and pass backend= to avoid that backend",
                label=label, phase="solve") from exc

    def _structural_first(self, values: torch.Tensor, B: torch.Tensor, adjoint: bool, rtol: float,
                          atol: float) -> tuple[torch.Tensor, IterationResult] | None:
        """Before any factorization: a pattern with an empty row or column. With its values that
        is a singular verdict (an unused unknown, an equation without terms) whatever a
        factorization would say, so none is tried: b outside the range raises the error that
        names the line; b possibly inside it gets the refinement with ``A + delta I``; None
        when every line holds a nonzero value after all (explicit zeros only in the pattern's
        count: the route goes on as usual)."""
        certain = self._empty_line(values, B, adjoint)
        if certain is None:
            return None
        self._certain_checked = True
        self._singular_lu = 2
        self._range_tried = True
        if isinstance(certain, SingularMatrixError):
            raise certain
        verdict = SingularMatrixError(f"{certain}: the matrix is singular")
        if adjoint:
            raise SingularMatrixError(f"{certain}: the matrix is singular, so the gradient of a solve with it is not "
                                      f"defined (the adjoint system A^H y = g has no unique solution); use lstsq for "
                                      f"a differentiable least-squares solution")
        self._empty_found = certain
        found = self._in_range(verdict, values, B, adjoint, rtol, atol)
        if found is None:
            raise SingularMatrixError(
                f"{certain}: the matrix is singular, and b does not lie in its range to working precision (refinement "
                f"with A + delta I did not converge); use lstsq for a least-squares solution")
        return found

    def _probe_first(self, values: torch.Tensor, B: torch.Tensor, handle: Any, base: dict, rtol: float,
                     atol: float) -> tuple[torch.Tensor, IterationResult] | None:
        """Rent before buying, a little: for a matrix class whose iteration estimates are guesses
        (non-symmetric or indefinite, nothing measured on the pattern), the cheapest iterative
        offer runs first for a fraction (:data:`_PROBE_SHARE`) of the direct method's estimated
        cost. Converged: that answer (checked like any). Not converged but contracting fast enough
        to finish within the direct method's cost (the rate seen so far, extrapolated): one
        correction solve ``A d = b - A x`` in what is left of that budget. Otherwise None, and the
        direct method runs as ranked: a failed probe costs at most the share, and what it measured
        is remembered on the pattern (the next call does not probe again). Gradients use whichever
        method answered."""
        offer = self.offer
        if (offer is None or not offer.direct or base.get("maxiter") is not None or base.get("callback") is not None
                or handle.adjoint or self._make is None or offer.seconds < _PROBE_MIN_DIRECT):
            return None
        budget = _PROBE_SHARE * offer.seconds
        # only preconditioners whose setup is O(n) (none, Jacobi): an incomplete factorization's
        # setup is what a fill estimate misjudges, and the probe must stay within its share
        cand = [o for o in self._rest if o.iterations is not None and o.preconditioner in _PROBE_PRECONDITIONERS
                and o.setup <= 0.5 * budget]
        if not cand:
            return None
        probe = min(cand, key=lambda o: (o.seconds - o.setup) / o.iterations)
        per_iteration = max((probe.seconds - probe.setup) / probe.iterations, 1e-12)
        try:
            state = self._make(probe)
        except BackendError:
            return None
        direct_state, direct_offer = self.state, self.offer
        t0 = time.perf_counter()
        maxiter = _in_units(probe, max(_MIN_BUDGET, int((budget - probe.setup) / per_iteration)), self.restart)
        opts = CallOptions.trusted(float(rtol), float(atol), maxiter, base.get("check_every"), None)
        self.state, self.offer = state, probe
        answered = False
        try:
            try:
                X, res = self._attempt(state, values, B, opts, False, rtol, atol, probe)
            except (SingularMatrixError, IndefiniteMatrixError, BackendError) as exc:
                self.attempts.append(Attempt(probe.backend, probe.method, probe.preconditioner, 0, Status.BREAKDOWN,
                                             math.inf, f"probe: {_one_line(exc)}", False, time.perf_counter() - t0))
                experience.record(self.A.pattern_fingerprint, self.A.dtype, probe.backend, probe.method,
                                  probe.preconditioner, Measured(0, rtol, False, f"probe: {_one_line(exc)}"[:200]))
                return None
            spent = time.perf_counter() - t0
            if not res.converged and 0 < res.residual < 1 and res.iterations > 0 and bool(torch.isfinite(X).all()):
                X, res = self._continue_probe(state, probe, values, B, X, res, opts, rtol, atol,
                                              direct_offer.seconds - spent, spent / res.iterations)
            self._note(state, probe, replace(res, reason=f"probe: {res.reason}"), time.perf_counter() - t0, rtol, None)
            if res.converged:
                answered = True  # the route stays on the probe's plan (an adjoint solve uses it too)
                return X, res
            return None
        finally:
            if not answered:
                self.state, self.offer = direct_state, direct_offer

    def _continue_probe(self, state: PlanState, probe: Offer, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor,
                        res: IterationResult, opts: CallOptions, rtol: float, atol: float, left: float,
                        per_iteration: float) -> tuple[torch.Tensor, IterationResult]:
        """A probe that stopped short: when the residual's geometric rate so far would reach
        ``rtol`` within ``left`` seconds, one correction solve ``A d = b - A x`` (its tolerance
        relative to that residual) in that time, and ``x + d`` checked; else the probe's result."""
        rate = res.residual ** (1.0 / res.iterations)
        need = math.log(rtol / res.residual) / math.log(rate) if rate < 1 else math.inf
        if not (math.isfinite(need) and need * per_iteration <= left):
            return X, res
        R = B - self._apply(values, X, False)
        bn = float(torch.linalg.vector_norm(B, dim=-2).max())
        rn = float(torch.linalg.vector_norm(R, dim=-2).max())
        if not (rn > 0 and bn > 0):
            return X, res
        sub_rtol = min(0.5, rtol * bn / rn)
        sub = CallOptions.trusted(sub_rtol, float(atol), _in_units(probe, max(_MIN_BUDGET, int(left / per_iteration)),
                                                                   self.restart), opts.check_every, None)
        D, res2 = self._attempt(state, values, R, sub, False, sub_rtol, atol, probe)
        if not (res2.converged or res2.status is Status.INACCURATE) or not bool(torch.isfinite(D).all()):
            return X, replace(res, iterations=res.iterations + res2.iterations, reason=f"{res.reason}; continued: "
                                                                                    f"{res2.reason}")
        with state.lock:
            # the check's refinement steps solve on the plan: under its lock, holding this call's values
            # (another caller of the shared plan may have loaded its own since _attempt released it)
            state._load(values)
            X2, res3 = self._verify(state, values, B, X + D, replace(res2, converged=True), opts, False, rtol, atol)
        return X2, replace(res3, iterations=res.iterations + res2.iterations,
                           reason=f"{res3.reason}; continued from the probe's iterate (relative residual "
                                  f"{res.residual:.2g} after {res.iterations} iterations)")

    @staticmethod
    def _unscaled(X: torch.Tensor, factor: "float | torch.Tensor") -> torch.Tensor:
        if isinstance(factor, float) and factor == 1.0:
            return X
        return X * factor

    def _give_up(self, exc: BaseException | None, failures: list, values: torch.Tensor, B: torch.Tensor, adjoint: bool,
                 rtol: float, atol: float, factor: "float | torch.Tensor") -> tuple[torch.Tensor, IterationResult]:
        """No offer is left: a solution in a singular A's range if there is one, else the error
        that names every attempt."""
        final = self._final_error(exc, failures)
        if not self.pinned and not self._certain_checked and isinstance(final, SingularMatrixError):
            # a structure that proves A singular and b outside its range: that is the error to name
            self._certain_checked = True
            certain = self._empty_line(values, B, adjoint)
            if isinstance(certain, SingularMatrixError):
                raise certain from (exc or final)
        found = None if self._range_tried else self._in_range(final, values, B, adjoint, rtol, atol)
        if found is not None:
            return self._unscaled(found[0], factor), found[1]
        if exc is not None and final is not exc:
            raise final from exc
        raise final

    def _options_for(self, offer: Offer | None, base: dict, rtol: float, atol: float) -> CallOptions:
        """The call's options for this attempt: the resolved ``rtol``, ``atol`` in the scaled
        system's units, and for an iterative offer ranked before a direct one, ``maxiter``
        bounded by what that direct method would cost (rent or buy)."""
        # the values come from a SolveOptions record (validated there) and the route's own numbers
        record = CallOptions.trusted(float(rtol), float(atol), base.get("maxiter"), base.get("check_every"),
                                     base.get("callback"))
        if offer is None or offer.iterations is None or self.pinned or base.get("maxiter") is not None:
            return record
        direct = [o for o in self._rest if o.direct]
        if not direct:
            return record
        per_iteration = max((offer.seconds - offer.setup) / offer.iterations, 1e-12)
        cheapest = min(o.seconds for o in direct)
        # a method whose residual stops improving may give up early for the direct one (a float32 BiCGSTAB wandered
        # 200,005 iterations before an LU that answered in 2 s; session 26's sweep)
        return record.replace(maxiter=_in_units(offer, max(_MIN_BUDGET, offer.iterations,
                                                           int(math.ceil(cheapest / per_iteration))), self.restart),
                              stagnation=True)

    def _attempt(self, state: PlanState, values: torch.Tensor, B: torch.Tensor, opts: CallOptions, adjoint: bool,
                 rtol: float, atol: float, offer: Offer | None) -> tuple[torch.Tensor, IterationResult]:
        with state.lock:
            plan = state.build()
            first = None
            tok = _token(values) if offer is not None and offer.method == "lu" and values.dim() == 1 else None
            if tok is not None and tok != state.well_scaled:
                # An LU of a matrix whose rows or columns lie in other units (spread over many
                # binades) is factored equilibrated first, as LAPACK's and SuperLU's drivers do:
                # one factorization instead of an unscaled one judged inaccurate, then another.
                # (Values found well scaled are remembered by identity and version: a Solver's
                # repeated solves pay the O(nnz) scan once.)
                r, c, ve = _scaled(state, self.A, values)
                if _spread(r) <= _EQUILIBRATE_FIRST and _spread(c) <= _EQUILIBRATE_FIRST:
                    state.well_scaled = tok
                    state.scaled = None
                else:
                    first = self._equilibrated_solve(state, plan, values, B, opts, adjoint, rtol, atol, (r, c, ve))
                    if first is not None and first[1].converged:
                        X2, res2, rel = first
                        if rel <= rtol:
                            return X2, replace(res2, residual=rel,
                                               reason=f"{res2.reason}; rows and columns equilibrated (badly scaled)")
                        rn = _safe_norm(B - self._apply(values, X2, adjoint))
                        eta, _, stable = self._backward_error(values, B, X2, rn, _safe_norm(B),
                                                              self._scaled_inverse(state, plan, B, opts, adjoint, r, c, ve))
                        if stable:
                            # backward stable in the caller's norm too: the residual is what the
                            # conditioning allows (an unscaled LU would not do better)
                            return X2, replace(res2, residual=rel, reason=f"{res2.reason}; rows and columns equilibrated "
                                                                          f"(badly scaled); ill-conditioned: backward "
                                                                          f"error {eta:.2g}")
            state._load(values)
            X, res = _checked(state, guarded(lambda: plan.solve(B, adjoint=adjoint, options=opts), state.label, "solve"), B)
            if not res.converged:
                if res.status is Status.BREAKDOWN and bool(torch.isfinite(X).all()):
                    # a recurrence that broke down near the answer (a tiny rho): judged by its true
                    # residual, with refinement, like any answer
                    X2, res2 = self._verify(state, values, B, X, replace(res, converged=True), opts, adjoint, rtol, atol)
                    if res2.converged:
                        return X2, replace(res2, reason=f"{res.reason}; the iterate before it meets the tolerance")
                return X, res
            direct = res.status is Status.DIRECT
            X, res = self._verify(state, values, B, X, res, opts, adjoint, rtol, atol)
            if not direct and res.converged and self._default_tol:
                X, res = self._row_scaled(state, values, B, X, res, opts, adjoint, rtol)
            if not (direct and res.status is Status.INACCURATE):
                return X, res
            # Equilibrate (rows, then columns, by powers of two) and factor once more before
            # calling the matrix singular: a badly scaled matrix (rows in other units) is singular
            # to working precision only in the unscaled norm
            if first is None:
                r, c, ve = _equilibrated(self.A, values)
                if _spread(r) <= _EQUILIBRATE_SPREAD and _spread(c) <= _EQUILIBRATE_SPREAD:
                    # rows and columns already within a small factor of each other: the equilibrated
                    # matrix is the same problem, and a second factorization would give the same verdict.
                    # Singular to working precision in the normwise sense only? A circuit matrix (conductances
                    # 1e-6..1e6: cond 2.7e17 unscaled, 1.6e9 equilibrated, Skeel's 1.4e5) came back with a
                    # relative residual of 2.2e-10 and a backward error of 1.7e-26, accurate to 1e-12, and was
                    # called singular (session 31's sweep): judged componentwise, with Skeel's condition, it is
                    # the answer
                    if not self._growth_singular:
                        return X, res
                    got = self._componentwise_answer(values, B, X, B - self._apply(values, X, adjoint), adjoint,
                                                     lambda V: _checked(state, guarded(lambda: plan.solve(
                                                         V, adjoint=adjoint, options=opts), state.label, "solve"), B)[0],
                                                     backward_error_bound(B.dtype, self.A.format_shape[0]))
                    if got is None:
                        return X, res
                    X, R, omega, skeel, steps = got
                    self._growth_singular = False
                    bn = _safe_norm(B)
                    rel = float((_safe_norm(R) / torch.where(bn > 0, bn, torch.ones_like(bn))).max())
                    return X, replace(res, residual=rel, converged=True, status=Status.DIRECT,
                                      iterations=res.iterations + steps,
                                      reason=f"{res.reason}; ill-conditioned in the unscaled norm only: componentwise "
                                             f"backward error {omega:.2g}, Skeel's condition >= {skeel:.2g}"
                                             + (f" after {steps} refinement steps" if steps else ""))
                first = self._equilibrated_solve(state, plan, values, B, opts, adjoint, rtol, atol, (r, c, ve))
                if first is None:
                    return X, res
            X2, res2, rel = first
            if not res2.converged or not math.isfinite(rel):
                return X, replace(res, reason=f"{res.reason}; equilibrated: {res2.reason}"
                                              + ("" if math.isfinite(rel) else " (its residual overflows)"))
            # the equilibrated system is solved backward-stably: the matrix is not singular to working
            # precision, only badly scaled. Of the two answers, the one with the smaller residual in
            # the caller's norm is returned (neither may reach rtol there: the rows' scales differ)
            Xb, relb = (X, res.residual) if rel > res.residual else (X2, rel)
            if relb > rtol:
                # neither reaches rtol in the caller's norm: returned only where it is the answer of a
                # backward-stable solve there (ill-conditioned, not wrong); else INACCURATE, and the route
                # moves on (session 28: an equilibrated LU's answer with relative residual 1e3 came back
                # "converged")
                # ... or, for a badly scaled A (whose normwise condition says nothing), of a componentwise
                # backward-stable one (Oettli-Prager: invariant under row and column scaling)
                Rb = B - self._apply(values, Xb, adjoint)
                rn = _safe_norm(Rb)
                inverse = self._scaled_inverse(state, plan, B, opts, adjoint, r, c, ve)
                eta, _, stable = self._backward_error(values, B, Xb, rn, _safe_norm(B), inverse)
                bound = backward_error_bound(B.dtype, self.A.format_shape[0])
                if not stable:
                    # Skeel: refinement steps on the equilibrated factors, each kept while it lowers the
                    # componentwise backward error (the normwise residual, dominated by the large rows' rounding,
                    # cannot judge them: session 31's sweep, rows scaled by 1e-8..1e8, 5.5e-12 componentwise
                    # before), then Skeel's condition (a repeated row scaled alike reached 2.6e-16 with an answer of
                    # 1.6e13: a small componentwise backward error of a singular matrix proves nothing)
                    got = self._componentwise_answer(values, B, Xb, Rb, adjoint, inverse, bound)
                    if got is None:
                        omega = self._componentwise_backward_error(values, B, Xb, Rb, adjoint)
                        return X, replace(res, reason=f"{res.reason}; equilibrated: relative residual {rel:.2g}, backward "
                                                      f"error {eta:.2g} normwise, {omega:.2g} componentwise")
                    Xb, Rb, omega, skeel, steps = got
                    bn = _safe_norm(B)
                    relb = float((_safe_norm(Rb) / torch.where(bn > 0, bn, torch.ones_like(bn))).max())
                    return Xb, replace(res2, residual=relb,
                                       reason=f"{res2.reason}; rows and columns equilibrated (badly scaled); "
                                              f"componentwise backward error {omega:.2g}, Skeel's condition >= "
                                              f"{skeel:.2g}" + (f" after {steps} refinement steps" if steps else ""))
            if rel > res.residual:
                return X, replace(res2, residual=res.residual,
                                  reason=f"badly scaled: the equilibrated system is backward stable ({res2.reason}); "
                                         f"residual {res.residual:.2g} in the unscaled norm")
            return X2, replace(res2, residual=rel, reason=f"{res2.reason}; rows and columns equilibrated")

    def _refine_step(self, state: PlanState, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, R: torch.Tensor,
                     opts: CallOptions, adjoint: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """One step of iterative refinement on the current plan: ``D`` with ``A D = R`` (the residual of
        ``X``), then ``(X + D, its residual, the step's iterations (at least 1))``, or ``(None, None,
        iterations)`` when ``D`` is not finite. The callers decide whether the step is kept."""
        D, r2 = _checked(state, guarded(lambda: state.plan.solve(R, adjoint=adjoint, options=opts), state.label,
                                        "solve"), B)
        its = max(1, r2.iterations)
        if not bool(torch.isfinite(D).all()):
            return None, None, its
        X2 = X + D
        return X2, B - self._apply(values, X2, adjoint), its

    def _sharpen(self, state: PlanState, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, R: torch.Tensor,
                 rn: torch.Tensor, bn: torch.Tensor, opts: CallOptions, adjoint: bool,
                 iterative: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
        """An answer to a call with no tolerance that meets the contract's residual but not the
        normwise backward error of a backward-stable solve (``backward_error_bound``). Up to
        ``_REFINE_STEPS`` steps of iterative refinement on the same plan, each kept only if the
        backward error drops: ``(X, its residual norms, steps or iterations)``. The answer already
        met the tolerance, so it is returned whatever the steps achieve; an answer at the bound
        costs two norms here.

        - A direct answer (``iterative`` False): an unstable factorization (LDL^T without pivoting
          meeting a small pivot: 3.6e-11 on a matrix of condition 1, where a pivoted LU gives
          3.5e-16; session 19); a step is two triangular solves on the same factors.
        - An iterative answer: a Krylov method stopped at ``rtol``'s relative residual has a
          backward error of ~1e-11 in float64 where a direct solve has ~1e-16 (session 20: CG on a
          3-D Poisson matrix 1.1e-11, BiCGStab on convection-diffusion 1.5e-11). A step solves
          ``A d = r`` on the same plan to the relative tolerance the bound needs (a quarter of
          ``bound / eta``, at most 0.5): one step usually, at a fraction of the first solve's
          iterations (its count is returned)."""
        # Judged in the infinity norm, row by row as a residual is computed (the Frobenius norm of A is
        # ~sqrt(nnz) times larger on a mesh matrix and would pass an answer 100x short of a direct one),
        # against the bound of one row: the floor of a computed residual depends on the rows' lengths,
        # not on n. Direct answers alike since session 21 (the Frobenius test with its sqrt(n) bound passed
        # LDL^T answers of a quasi-definite KKT matrix at 1.5e5 u, and Cholesky's of a matrix symmetric
        # to 1e-12 only at 800 u)
        # Each row against its own 1-norm (session 29: one dense border row of a bordered Laplacian made
        # ||A||_inf 20x the other rows' and passed a BiCGSTAB answer 1000x less accurate than LU's):
        # max_i |r_i| / (||a_i||_1 ||x||_inf + ||b||_inf), the infinity-norm test where the rows' sums agree
        bound = backward_error_bound(B.dtype, 1)
        sums = self._row_sums(state, values, adjoint).unsqueeze(-1)
        bi = B.abs().amax(dim=-2, keepdim=True) if B.shape[-2] else torch.zeros_like(bn).unsqueeze(-2)

        def eta(X: torch.Tensor, rn: torch.Tensor, R: torch.Tensor) -> float:
            if not X.shape[-2]:
                return 0.0
            xi = X.abs().amax(dim=-2, keepdim=True)
            den = sums * xi + bi
            # den - den: NaN where sums ||x||_inf overflowed (x spanning the exponent range: blocks of 1e-160 and
            # 1e+160; session 29), where r / inf = 0 would pass the row; then again in units of
            # t = max(||x||_inf, ||b||_inf), as _quick_verdict judges (one subtraction on the common path)
            e = float((R.abs() / torch.where(den > 0, den, torch.ones_like(den)) + (den - den)).max())
            if not math.isnan(e):
                return e
            t = torch.maximum(xi, bi)
            t = torch.where(t > 0, t, torch.ones_like(t))
            den = sums * (xi / t) + bi / t
            return float(((R.abs() / torch.where(den > 0, den, torch.ones_like(den))).amax(dim=-2) / t.squeeze(-2)).max())

        e = eta(X, rn, R)
        steps = 0
        spent = 0
        limit = _REFINE_STEPS if iterative else _REFINE_STEPS_DIRECT
        while e > bound and steps < limit:
            step_opts = opts
            if iterative:
                # the residual must shrink by bound / e (a margin of 4): a looser inner solve than the
                # call's own, never a tighter one than it (rtol is what the plan can reach)
                inner = min(0.5, max(float(opts.rtol or 0.0), 0.25 * bound / e))
                step_opts = opts.trusted_replace(rtol=inner, atol=0.0)
            X2, R2, its = self._refine_step(state, values, B, X, R, step_opts, adjoint)
            steps += 1
            spent += its
            if X2 is None or R2 is None:
                break
            rn2 = torch.linalg.vector_norm(R2, dim=-2)
            if not bool(torch.isfinite(rn2).all()):
                rn2 = _safe_norm(R2)  # squares past the dtype's range (refinement steps only)
            e2 = eta(X2, rn2, R2)
            if not e2 < e:
                break
            X, R, rn, e = X2, R2, rn2, e2
        self._sharp_eta = (e, bound)
        return X, rn, (spent if iterative else steps)

    def _row_scaled(self, state: PlanState, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, res: IterationResult,
                    opts: CallOptions, adjoint: bool, rtol: float) -> tuple[torch.Tensor, IterationResult]:
        """An iterative answer of a call with no tolerance, judged once more with every row divided by
        its largest entry (where those spread over more than ``_ROW_SCALED_SPREAD``): ``||D r|| / ||D b||``
        must reach ``rtol`` too. A system whose rows lie in other units (penalty rows
        of 1e13 for boundary conditions next to rows of O(1)) meets ``||r|| <= rtol ||b||`` through its
        large rows alone while the others' equations are not solved at all (session 19: a
        convection-diffusion system's interior 96 % wrong). Refined on the same plan (each step
        solves for the residual); still missing, the answer is INACCURATE and the route moves on
        (to a direct method)."""
        w = _row_weights(self.A, values, adjoint)
        spread = _spread(w)
        if spread <= _ROW_SCALED_SPREAD:
            return X, res
        w = w.unsqueeze(-1)
        bn = torch.linalg.vector_norm(B * w, dim=-2)
        bn = torch.where(bn > 0, bn, torch.ones_like(bn))
        goal = rtol
        R = B - self._apply(values, X, adjoint)
        rel = float((torch.linalg.vector_norm(R * w, dim=-2) / bn).max())
        extra = 0
        for _ in range(_REFINE_STEPS + 1):
            if rel <= goal:
                if not extra:
                    return X, res
                return X, replace(res, iterations=res.iterations + extra,
                                  reason=f"{res.reason}; {extra} refinement iterations for the row-scaled residual")
            if extra > _REFINE_STEPS:
                break
            X2, R2, its = self._refine_step(state, values, B, X, R, opts, adjoint)
            extra += its
            if X2 is None or R2 is None:
                break
            rel2 = float((torch.linalg.vector_norm(R2 * w, dim=-2) / bn).max())
            if not rel2 < rel:
                break
            X, R, rel = X2, R2, rel2
        return X, replace(res, converged=False, status=Status.INACCURATE,
                          reason=f"{res.reason + '; ' if res.reason else ''}with each row divided by its largest entry "
                                 f"the relative residual is {rel:.3g} (needs {goal:.1e}): the rows' scales spread "
                                 f"over {spread:.3g}, and the large rows hid the others' residual")

    def _componentwise_answer(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, R: torch.Tensor,
                              adjoint: bool, inverse: Callable[[torch.Tensor], torch.Tensor], bound: float
                              ) -> tuple[torch.Tensor, torch.Tensor, float, float, int] | None:
        """``(X, R, omega, skeel, steps)`` where the answer, after up to ``_REFINE_STEPS`` refinement steps with
        ``inverse`` each kept while it lowers Oettli and Prager's componentwise backward error ``omega``, has
        ``omega <= bound`` and a lower bound of Skeel's condition below ``1 / (8 u)`` (:meth:`_skeel_floor`): the
        answer of a componentwise backward-stable solve of a problem that is not singular in that sense, whatever
        the unscaled norms say (both are invariant under row and column scaling). None otherwise."""
        omega = self._componentwise_backward_error(values, B, X, R, adjoint)
        steps = 0
        while not omega <= bound and steps < _REFINE_STEPS:
            try:
                D = inverse(R)
            except (SingularMatrixError, BackendError):
                break
            if not bool(torch.isfinite(D).all()):
                break
            X2 = X + D
            R2 = B - self._apply(values, X2, adjoint)
            omega2 = self._componentwise_backward_error(values, B, X2, R2, adjoint)
            if not omega2 < omega:
                break
            X, R, omega, steps = X2, R2, omega2, steps + 1
        if not omega <= bound:
            return None
        # an answer that leaves a residual above sqrt(u) of b, with every row divided by its largest entry (so that
        # rows in other units count alike, as this verdict is for them), is no solution of a nearby consistent
        # system: its componentwise backward error is small only because x is huge (an exactly singular A with b
        # outside its range: ||x|| 4.7e16, relative residual 2.2, and a Skeel floor of 3e12-3e14 that the random
        # weights left below the threshold; session 32's sweep). The solvable systems judged here leave small ones.
        w = _row_weights(self.A, values, adjoint).unsqueeze(-1)
        bn = _safe_norm(B * w)
        if float((_safe_norm(R * w) / torch.where(bn > 0, bn, torch.ones_like(bn))).max()) > unit_roundoff(B.dtype) ** 0.5:
            return None
        skeel = self._skeel_floor(values, X, adjoint, inverse)
        # judged with sqrt(n) to spare: a random weight vector's component along one direction (a singular A's left
        # null vector) is ~1 / sqrt(n) of it, so the floor of a singular matrix can come out that far below 1 / u (a
        # float64 Neumann Laplacian of 900 unknowns: 6.5e14 against the threshold's 1.1e15; CI, session 31); the
        # badly scaled matrices this verdict is for stay far below (circuit n = 3000: 1.4e5 sqrt(n) = 7.7e6)
        if _singular_growth(skeel * math.sqrt(max(self.A.format_shape[0], 1)), B.dtype):
            return None
        return X, R, omega, skeel, steps

    def _skeel_floor(self, values: torch.Tensor, X: torch.Tensor, adjoint: bool,
                     inverse: Callable[[torch.Tensor], torch.Tensor]) -> float:
        """A lower bound of Skeel's condition number ``|| |A^-1| |A| |x| ||_inf / ||x||_inf`` (invariant under row
        scaling, the componentwise backward error's partner): ``||A^-1 (s o |A| |x|)||_inf / (||s||_inf ||x||_inf)``
        for a fixed pseudo-random Gaussian ``s`` (worst right-hand side), by one solve with the factors at hand.
        (Random signs missed a duplicated row: where ``s_i = s_j`` the vector has no component along the left null
        vector ``e_i - e_j``, and the floor of a singular matrix came out 9.7.)"""
        g = self._apply(values.abs().to(values.dtype), X.abs().to(X.dtype), adjoint).abs()
        weights = torch.randn(g.shape, generator=torch.Generator().manual_seed(31), dtype=torch.float64)
        weights = (weights / weights.abs().amax(dim=-2, keepdim=True).clamp_min(1e-300)).to(g.device, g.dtype)
        try:
            Z = inverse((g * weights).to(X.dtype))
        except (SingularMatrixError, BackendError):
            return math.inf
        if not bool(torch.isfinite(Z).all()):
            return math.inf
        xn = X.abs().amax(dim=-2) if X.shape[-2] else torch.zeros(X.shape[:-2] + X.shape[-1:])
        zn = Z.abs().amax(dim=-2) if Z.shape[-2] else torch.zeros_like(xn)
        return float((zn / torch.where(xn > 0, xn, torch.ones_like(xn))).max()) if zn.numel() else 0.0

    def _componentwise_backward_error(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, R: torch.Tensor,
                                      adjoint: bool) -> float:
        """Oettli and Prager's componentwise backward error ``max_i |r_i| / (|A| |x| + |b|)_i`` (worst right-hand
        side; a nonzero residual over a zero denominator is infinite): unchanged by row and column scalings of
        A, so it judges an answer of a badly scaled system where the normwise one cannot."""
        den = self._apply(values.abs().to(values.dtype), X.abs().to(X.dtype), adjoint).abs() + B.abs()
        num = R.abs()
        ratio = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)),
                            torch.where(num > 0, torch.full_like(num, math.inf), torch.zeros_like(num)))
        return float(ratio.max()) if ratio.numel() else 0.0

    def _backward_error(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, rn: torch.Tensor,
                        bn: torch.Tensor,
                        solve: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float, bool]:
        """``(eta, kappa, stable)``: the normwise backward error ``||r|| / (||A||_F ||x|| + ||b||)``
        (worst column; ``rn``, ``bn``: the residual's and ``B``'s column norms), a lower bound of
        A's condition number, and whether the answer is that of a backward-stable solve: ``eta``
        within the dtype's bound and ``kappa`` below ``1 / (8 u)`` (past it A is singular to working
        precision, and a small backward error means nothing: :func:`_singular_growth`).

        ``kappa`` is ``||A||_2 ||x|| / ||b||`` with :func:`_norm2_floor`'s lower bound of
        ``||A||_2`` (not the Frobenius norm, which grows like sqrt(n) on a mesh matrix), and, given
        ``solve`` (``V -> A^-1 V`` on the factors at hand) and an answer that would pass, the larger
        ``||A||_2 ||A^-1 x|| / ||x||`` (one step of inverse iteration, one more solve on the same
        factors): where b is mostly in the range of a singular A, ``||x|| / ||b||`` understates
        ``||A^-1||`` by ``||b||`` over b's component outside the range, while x, dominated by the
        near-null direction, gives ``||A^-1||`` at once (a float32 Neumann Laplacian of 40,000
        unknowns: 2e-3 / u from x, 0.4 / u after the step)."""
        # norms in float64, without overflow of their squares, and products of norms as ratios (session 29:
        # ||A|| ||x|| of a matrix with blocks of 1e-19 and 1e19 overflowed float32: backward error 0, condition inf)
        rn, bn = rn.to(torch.float64), bn.to(torch.float64)
        etas, _ = normwise_backward_error(values, X, rn, bn)
        eta = float(etas.max())
        anorm = _norm2_floor(self.A, values)
        while anorm.dim() < rn.dim():
            anorm = anorm.unsqueeze(-1)
        xn = _safe_norm(X)
        kappa = float((anorm * (xn / torch.where(bn > 0, bn, torch.ones_like(bn)))).max())
        stable = eta <= backward_error_bound(B.dtype, self.A.format_shape[0]) and not _singular_growth(kappa, B.dtype)
        if stable and solve is not None and X.shape[-2]:
            V = (X.to(xn.dtype if not X.is_complex() else torch.complex128)
                 / torch.where(xn > 0, xn, torch.ones_like(xn)).unsqueeze(-2)).to(X.dtype)
            try:
                Y = solve(V)
            except (SingularMatrixError, BackendError):
                Y = None
            if Y is None or not bool(torch.isfinite(Y).all()):
                kappa = math.inf
            else:
                kappa = max(kappa, float((anorm * _safe_norm(Y)).max()))
            stable = not _singular_growth(kappa, B.dtype)
        return eta, kappa, stable

    def _scaled_inverse(self, state: PlanState, plan: Any, B: torch.Tensor, opts: CallOptions, adjoint: bool,
                        r: torch.Tensor, c: torch.Tensor, ve: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``V -> A^-1 V`` (``A^-H V`` when ``adjoint``) through the factors of ``diag(r) A diag(c)``
        (values ``ve``, loaded on the plan if they are not): :meth:`_backward_error`'s inverse step
        for an equilibrated answer. Under the plan's lock (the caller holds it)."""
        dl, dr = (c, r) if adjoint else (r, c)

        def inverse(V: torch.Tensor) -> torch.Tensor:
            state._load(ve)
            Y, _res = _checked(state, guarded(lambda: plan.solve(V * dl.unsqueeze(-1), adjoint=adjoint, options=opts),
                                              state.label, "solve"), B)
            return Y * dr.unsqueeze(-1)
        return inverse

    def _equilibrated_solve(self, state: PlanState, plan: Any, values: torch.Tensor, B: torch.Tensor, opts: CallOptions,
                            adjoint: bool, rtol: float, atol: float,
                            eq: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, IterationResult, float] | None:
        """``X`` from the factorization of ``diag(r) A diag(c)`` (``eq``: r, c and those values),
        refined in the caller's norm: ``(X, the equilibrated system's result, the relative
        residual of A X = B)``; None when that factorization fails (singular, indefinite). Runs
        under the plan's lock (the caller holds it)."""
        r, c, ve = eq
        dl, dr = (c, r) if adjoint else (r, c)  # A^H x = b  <=>  (Dr A Dc)^H (Dr^-1 x) = Dc b
        Be = B * dl.unsqueeze(-1)
        try:
            state._load(ve)
            Y, res2 = _checked(state, guarded(lambda: plan.solve(Be, adjoint=adjoint, options=opts), state.label,
                                              "solve"), B)
        except (SingularMatrixError, IndefiniteMatrixError):
            return None
        Y, res2 = self._verify(state, ve, Be, Y, res2, opts, adjoint, rtol, atol * float(dl.abs().max()))
        X2 = Y * dr.unsqueeze(-1)
        # (badly scaled systems only: norms without overflow of the squares)
        bn = _safe_norm(B)
        bn = torch.where(bn > 0, bn, torch.ones_like(bn))
        R = B - self._apply(values, X2, adjoint)
        rel = float((_safe_norm(R) / bn).max())
        if not res2.converged:
            return X2, res2, rel
        # refine in the caller's norm with the equilibrated factors: d = Dc E^-1 Dr r
        for _ in range(_REFINE_STEPS):
            if rel <= rtol:
                break
            D, _r = _checked(state, guarded(lambda: plan.solve(R * dl.unsqueeze(-1), adjoint=adjoint, options=opts),
                                            state.label, "solve"), B)
            X3 = X2 + D * dr.unsqueeze(-1)
            R3 = B - self._apply(values, X3, adjoint)
            rel3 = float((_safe_norm(R3) / bn).max())
            if not rel3 < rel:
                break
            X2, R, rel = X3, R3, rel3
        return X2, res2, rel

    def _verify(self, state: PlanState, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, res: IterationResult,
                opts: CallOptions, adjoint: bool, rtol: float, atol: float) -> tuple[torch.Tensor, IterationResult]:
        quick = self._quick_verdict(state, values, B, X, res, adjoint, rtol, atol)
        if quick is not None:
            return quick
        if not bool(torch.isfinite(X).all()):
            return X, replace(res, converged=False, status=Status.NOT_FINITE,
                              reason=f"{res.reason + '; ' if res.reason else ''}the answer has NaN or Inf")
        bn = torch.linalg.vector_norm(B, dim=-2)
        safe = False
        R = B - self._apply(values, X, adjoint)
        rn = torch.linalg.vector_norm(R, dim=-2)
        if bn.numel() == 1:
            # one right-hand side (the common call): the first check in Python floats, the same test as the
            # tensor one below (a NaN norm fails it alike); each small tensor op costs microseconds
            bnf, rnf = float(bn), float(rn)
            if not (math.isfinite(bnf) and math.isfinite(rnf)):
                # squares past the dtype's range (entries beyond ~1e154, ~1e19 in float32): the norms once more,
                # without overflow (session 29: x spanning 1e-160..1e160 was judged "overflows")
                bn, rn = _safe_norm(B), _safe_norm(R)
                bnf, rnf = float(bn), float(rn)
                safe = True
                if not (math.isfinite(bnf) and math.isfinite(rnf)):
                    return X, self._overflowed(res)
            if rnf <= max(bnf * rtol, atol):
                extra = 0
                if self._default_tol:
                    iterative = res.status is not Status.DIRECT
                    X, rn, extra = self._sharpen(state, values, B, X, R, rn, bn, opts, adjoint, iterative)
                    rnf = float(rn)
                rel = rnf / (bnf if bnf > 0 else 1.0)
                if self._default_tol and res.status is Status.DIRECT:
                    unstable = self._unstable_direct(extra)
                    if unstable is not None:
                        return X, replace(res, residual=rel, converged=False, status=Status.INACCURATE, reason=unstable)
                if extra:
                    what = "iterations" if res.status is not Status.DIRECT else "steps"
                    return X, replace(res, residual=rel, iterations=res.iterations + (extra if what == "iterations" else 0),
                                      reason=f"{res.reason}; {extra} refinement {what} to a direct "
                                             f"method's backward error")
                if type(res) is IterationResult:
                    return X, IterationResult(res.iterations, rel, res.converged, res.status, res.reason, res.history)
                return X, replace(res, residual=rel)
        if not (bool(torch.isfinite(bn).all()) and bool(torch.isfinite(rn).all())):
            bn, rn = _safe_norm(B), _safe_norm(R)  # as above
            safe = True
            if not (bool(torch.isfinite(bn).all()) and bool(torch.isfinite(rn).all())):
                return X, self._overflowed(res)
        tol = torch.clamp(bn * rtol, min=atol)
        extra = 0
        for step in range(_REFINE_STEPS + 1):
            if bool((rn <= tol).all()):
                if self._default_tol:
                    X, rn, sharpened = self._sharpen(state, values, B, X, R, rn, bn, opts, adjoint,
                                                     res.status is not Status.DIRECT)
                    extra += sharpened
                rel = float((rn / torch.where(bn > 0, bn, torch.ones_like(bn))).max())
                if self._default_tol and res.status is Status.DIRECT:
                    unstable = self._unstable_direct(extra)
                    if unstable is not None:
                        return X, replace(res, residual=rel, converged=False, status=Status.INACCURATE, reason=unstable)
                reason = res.reason + (f"; {extra} refinement steps" if extra else "")
                if type(res) is IterationResult:  # made directly: dataclasses.replace costs ~2x, on every answer
                    return X, IterationResult(res.iterations + extra, rel, res.converged, res.status, reason, res.history)
                return X, replace(res, residual=rel, iterations=res.iterations + extra, reason=reason)
            if step == _REFINE_STEPS:
                break
            X2, R2, its = self._refine_step(state, values, B, X, R, opts, adjoint)
            extra += its
            if X2 is None or R2 is None:
                break
            rn2 = _safe_norm(R2) if safe else torch.linalg.vector_norm(R2, dim=-2)
            if not float(rn2.max()) < float(rn.max()):
                break
            X, R, rn = X2, R2, rn2
        rel = float((rn / torch.where(bn > 0, bn, torch.ones_like(bn))).max())
        if res.status is Status.DIRECT:
            eta, growth, stable = self._backward_error(values, B, X, rn, bn, lambda V: _checked(
                state, guarded(lambda: state.plan.solve(V, adjoint=adjoint, options=opts), state.label, "solve"), B)[0])
            n = self.A.format_shape[0]
            self._growth_singular = _singular_growth(growth, B.dtype)
            if stable:
                return X, replace(res, residual=rel, iterations=res.iterations + extra,
                                  reason=f"{res.reason}; ill-conditioned: backward error {eta:.2g}")
            bound = backward_error_bound(B.dtype, n)
            return X, replace(res, residual=rel, converged=False, status=Status.INACCURATE,
                              reason=f"relative residual {rel:.2g}, backward error {eta:.2g} (bound {bound:.1g}), "
                                     f"condition >= {growth:.2g} (singular to working precision from "
                                     f"{1 / (8 * unit_roundoff(B.dtype)):.2g}) after {extra} refinement steps (an "
                                     f"unstable factorization or a matrix singular to working precision)")
        return X, replace(res, residual=rel, converged=False, status=Status.INACCURATE,
                          reason=f"{res.reason + '; ' if res.reason else ''}the true relative residual {rel:.3g} misses "
                                 f"the tolerance (rtol {rtol:.1e}) after {extra} refinement iterations")

    def _quick_verdict(self, state: PlanState, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor,
                       res: IterationResult, adjoint: bool, rtol: float,
                       atol: float) -> tuple[torch.Tensor, IterationResult] | None:
        """The verdict of :meth:`_verify` on a small CPU CSR system with one right-hand side, computed
        serially in NumPy (``tensor/_serial.py``), when the answer passes every test at once: finite,
        the residual within the tolerance and, for a call with no tolerance, the infinity-norm backward
        error within a backward-stable solve's bound (:meth:`_sharpen`'s test, which then takes no
        step). None otherwise, and :meth:`_verify` judges (and refines) the answer as before. The same
        tests as the torch path; only cheaper: a few tiny torch operations cost more than the whole
        check of a 256-row system (session 26: ``Solver.solve`` on a 16x16 Poisson matrix spent ~45 %
        of its time here)."""
        A = self.A
        if (adjoint or A.format != CSR or A.format.num_batch_levels or B.dim() != 2 or B.shape[-1] != 1
                or X.shape != B.shape or B.dtype != values.dtype or B.device.type != "cpu" or not is_plain(B)
                or not is_plain(X) or not serial_ok(values, X, threads=False) or B.is_conj() or B.is_neg()):
            return None
        cache = A._cache
        serial = cache.get("serial_csr")
        if serial is None:
            serial = cache["serial_csr"] = SerialCsr(A.pos(1), A.crd(1), tuple(A.format_shape))
        x = X.detach().reshape(-1).numpy()
        b = B.detach().reshape(-1).numpy()
        if not np.isfinite(x).all():
            return None
        with np.errstate(all="ignore"):  # an overflow reads as inf: the torch path then judges the answer
            r = b - serial(values, X.detach().reshape(-1)).numpy()
            bnf, rnf = float(np.linalg.norm(b)), float(np.linalg.norm(r))
        if not (math.isfinite(bnf) and math.isfinite(rnf) and rnf <= max(bnf * rtol, atol)):
            return None
        if self._default_tol:
            if not x.shape[0]:
                e = 0.0
            else:
                # each row against its own 1-norm, as _sharpen judges (summed in NumPy: no torch op here)
                sums = state.memo.get("row_sums_f") if state.holds(values) else None
                if sums is None:
                    sums = _serial_row_sums(serial, values)
                    if state.holds(values):
                        state.memo["row_sums_f"] = sums
                # in units of t = max(||x||_inf, ||b||_inf): sums * ||x||_inf overflowed where x spans the
                # exponent range (blocks of 1e-160 and 1e+160, x to 1e160; session 29), and inf passed every row
                xm, bm = float(np.abs(x).max()), float(np.abs(b).max())
                t = max(xm, bm)
                den = sums * (xm / t) + bm / t
                with np.errstate(all="ignore"):
                    e = float(np.max(np.abs(r) / np.where(den > 0, den, 1.0))) / t
            bound = backward_error_bound(B.dtype, 1)
            if not e <= bound:
                return None
            self._sharp_eta = None  # within the bound: no factorization judged unstable (_unstable_direct)
        rel = rnf / (bnf if bnf > 0 else 1.0)
        if type(res) is IterationResult:
            return X, IterationResult(res.iterations, rel, res.converged, res.status, res.reason, res.history)
        return X, replace(res, residual=rel)

    def _row_sums(self, state: PlanState, values: torch.Tensor, adjoint: bool) -> torch.Tensor:
        """``sum_j |a_ij|`` per row of A (of A^H when ``adjoint``), ``(*batch, n)`` in A's real dtype; kept
        on the plan while it holds ``values`` (repeated calls scan once)."""
        if state.holds(values):
            got = state.memo.get(("row_sums", adjoint))
            if got is None:
                got = state.memo[("row_sums", adjoint)] = _row_sums(self.A, values.detach(), adjoint)
            return got
        return _row_sums(self.A, values.detach(), adjoint)

    @staticmethod
    def _overflowed(res: IterationResult) -> IterationResult:
        """An answer whose residual or right-hand side norms overflow is not judged accepted: a system
        whose entries span more binades than the dtype holds (a relative residual of NaN was accepted
        as DIRECT on D A0 D with D from 1e-150 to 1e150; session 21's sweep)."""
        return replace(res, converged=False, status=Status.INACCURATE,
                       reason=f"{res.reason + '; ' if res.reason else ''}the residual's norm overflows: the system's "
                              f"entries and solution span more than the dtype's exponent range (rescale the problem: "
                              f"units, or a symmetric diagonal scaling)")

    def _unstable_direct(self, steps: int) -> str | None:
        """Why a direct answer of a call with no tolerance, refined by :meth:`_sharpen`, is handed to an
        LU, or None: a factorization that does not pivot (LDL^T, Cholesky) whose answer stays above a
        backward-stable solve's backward error after refinement, while an LU with partial pivoting
        remains in the route (without one, its answer stands: it met the tolerance). Pivoted LU, QR
        and dense answers are what a direct method gives."""
        got = getattr(self, "_sharp_eta", None)
        if got is None:
            return None
        e, bound = got
        self._sharp_eta = None
        offer = self.offer
        if e <= bound or offer is None or offer.method in _PIVOTED or self.pinned:
            return None
        if not any(o.method == "lu" for o in self._rest):
            return None
        return (f"{self.state.label}: backward error {e:.2g} > {bound:.1g} (a backward-stable solve's) after {steps} "
                f"refinement steps: factors without pivoting that are not stable on this matrix; an LU decides")

    def _apply(self, values: torch.Tensor, X: torch.Tensor, adjoint: bool) -> torch.Tensor:
        """``A X`` (``A^H X``): small products straight from A's entries (no dispatch, no plan to
        build for a one-shot call), larger ones through a product plan of the plan cache."""
        if (self.A.nse or 0) * X.shape[-1] * max(1, X[..., 0, 0].numel()) <= _DIRECT_PRODUCT:
            return apply_entries(self.A, values, X, adjoint=adjoint)
        return MatmulHandle(products.product_state(self.A, X), self.A, adjoint).run(values, X)

    # ------------------------------------------------------------------------------------------
    def _note(self, state: PlanState, offer: Offer | None, res: IterationResult, seconds: float, rtol: float,
              cpu0: float | None = None) -> None:
        """Record an attempt (wall ``seconds``); what a direct method measured is remembered by
        its CPU time in this thread (since ``cpu0``, ``time.thread_time()`` at the attempt's
        start): a busy machine preempting the call must not teach dispatch that the method is
        slow."""
        backend, _, method = state.label.partition("/")
        pre = offer.preconditioner if offer is not None else None
        self.attempts.append(Attempt(backend, method, pre, res.iterations, res.status, res.residual, res.reason,
                                     res.converged, seconds))
        if offer is None:
            return
        if offer.iterations is not None and res.status is not Status.DIRECT:
            experience.record(self.A.pattern_fingerprint, self.A.dtype, offer.backend, offer.method, offer.preconditioner,
                              Measured(res.iterations, rtol, res.converged, res.reason[:200]))
        elif offer.direct and res.converged and seconds > experience.DIRECT_SLOWER * offer.seconds and \
                seconds > offer.seconds + experience.DIRECT_MARGIN:
            # the thread's CPU time is at most the wall time: read only when the wall time is over
            spent = seconds if cpu0 is None else time.thread_time() - cpu0
            if spent > experience.DIRECT_SLOWER * offer.seconds and spent > offer.seconds + experience.DIRECT_MARGIN:
                experience.record(self.A.pattern_fingerprint, self.A.dtype, offer.backend, offer.method,
                                  offer.preconditioner, Measured(0, rtol, True, "", seconds=spent))

    def _advance(self, kind: str, offer: Offer | None) -> bool:
        """Move to the next offer after a failure of ``kind``; False when none is left."""
        rest = self._rest
        if kind in ("singular", "inaccurate"):
            # a zero pivot of a method that does not pivot (LDL^T, Cholesky) says little: an LU
            # with partial pivoting decides; two LUs (of different backends) that agree are final
            # (an inaccurate verdict survived refinement and equilibration: the core's own judgement
            # of the answer, not a pivot rule, and final by itself)
            self._singular_lu += 2 if (kind == "inaccurate" and self._growth_singular) else int(
                offer is None or offer.method == "lu")
            if self._singular_lu >= 2:
                rest = []
            rest = [o for o in rest if o.method == "lu"]
        elif kind == "iterative" and any(o.direct for o in rest):
            k = next(i for i, o in enumerate(rest) if o.direct)
            rest = rest[k:] + rest[:k]
        while rest:
            nxt, rest = rest[0], rest[1:]
            self._rest = rest
            try:
                state = self._make(nxt) if self._make is not None else None
            except BackendError as exc:
                self.attempts.append(Attempt(nxt.backend, nxt.method, nxt.preconditioner, 0, Status.BREAKDOWN, math.inf,
                                             _one_line(exc)))
                continue
            if state is None:
                return False
            self.state, self.offer = state, nxt
            return True
        self._rest = []
        return False

    def _final_error(self, exc: BaseException | None, failures: list) -> BaseException:
        tried = "; ".join(str(a) for a in self.attempts)
        if any(k == "singular" for k, _ in failures) or failures[-1][0] == "inaccurate":
            first = next((e for k, e in failures if k == "singular"), None)
            row = getattr(first, "row", None)
            last = self.attempts[-1]
            text = str(first) if first is not None else (
                f"the matrix is singular to working precision: {last.backend}/{last.method} answered with {last.reason}")
            if len(self.attempts) > 1:
                text += f" (every direct method tried agrees; tried: {tried})"
            dtype = self.A.dtype
            if unit_roundoff(dtype) > 1e-10 and first is None:
                wide = torch.complex128 if dtype.is_complex else torch.float64
                text += (f"; that is in {str(dtype).replace('torch.', '')}: a matrix this ill-conditioned may still be "
                         f"solvable in {str(wide).replace('torch.', '')} (A.to({wide}), b.to({wide}))")
            return SingularMatrixError(text, row=row)
        if exc is None:
            return SingularMatrixError(tried)
        if len(self.attempts) <= 1:
            return exc
        cls = type(exc)
        try:
            out = cls(f"{exc} (tried: {tried})")
        except Exception:  # noqa: BLE001 - an error type with another signature: keep the original
            return exc
        for name in ("label", "phase", "row"):
            if hasattr(exc, name):
                setattr(out, name, getattr(exc, name))
        return out


def _within_range(values: torch.Tensor, sa: float, vmax: float) -> float:
    """``sa`` moved toward 1 so that scaling flushes no entry of ``values`` (A's stored values, or a
    right-hand side) to zero (nor overflows one): a
    matrix whose entries span more than the exponent range allows after the scale (a symmetrically
    scaled D A0 D with entries from 1e-200 to 1e200, scaled by 2^-665, lost its small entries and
    factored singular; session 21's sweep) keeps them, and equilibration handles the rest."""
    mag = values.abs()
    vmin = float(mag[mag > 0].amin())
    real = mag.dtype
    fi = torch.finfo(real)
    low, high, _top = _safe_range(real)
    # Entries that would leave the range of safe squares after the scale: the scale centres the entries'
    # binades instead (the geometric mean of the smallest and largest near 1), never past 1. Scaling the
    # largest to 1 and keeping the smallest just above the underflow threshold (until session 29) left a
    # block-diagonal matrix with blocks of 1e-160 and 1e+160 with a block at 3e-308, whose solution
    # overflowed (x ~ b / a) and whose LU answered NaN
    centre = math.ldexp(1.0, -round((math.log2(vmin) + math.log2(vmax)) / 2))
    if sa < 1.0 and vmin * sa < low:
        sa = min(1.0, max(sa, centre, math.ldexp(1.0, math.ceil(math.log2(fi.tiny / vmin)))))
    elif sa > 1.0 and vmax * sa > high:
        sa = max(1.0, min(sa, centre, math.ldexp(1.0, math.floor(math.log2(fi.max / 4 / vmax)))))
    return sa


def _column_scales(B: torch.Tensor, sb: float, dtype: torch.dtype) -> torch.Tensor | None:
    """Per column of ``B`` (``(*batch, n, k)``; per batch member too), the power of two that brings its
    largest entry near 1, shaped ``(*batch, 1, k)``, when the common scale ``sb`` would leave some
    nonzero column outside the range where squared norms are safe; else None (one scale serves)."""
    if B.shape[-1] * max(1, B[..., 0, 0].numel()) <= 1 or B.shape[-2] == 0:
        return None
    cm = B.abs().amax(dim=-2, keepdim=True)
    if cm.dtype.is_complex:
        cm = cm.real
    real = cm.dtype
    emax = math.log2(torch.finfo(real).max) / 4
    nz = cm[cm > 0]
    if nz.numel() <= 1:
        return None
    lo, hi = float(nz.amin()) * sb, float(nz.amax()) * sb
    if lo >= 2.0 ** -emax and hi <= 2.0 ** emax:
        return None
    return torch.where(cm > 0, _pow2(cm), torch.ones_like(cm)).to(B.dtype)


def _broken_pattern(A: SparseTensor) -> str | None:
    """What is wrong with A's index buffers as they are now (a full O(nnz) structural check, with no
    version counter moved), or None: asked after a method failed, before another one reads them."""
    from ..errors import ValidationError  # noqa: PLC0415 - failure path only
    from ..tensor.validate import _check_levels, check_index_buffers  # noqa: PLC0415

    try:
        fmt, fs = A.format, A.format_shape
        check_index_buffers(fmt, fs, list(A._pos), list(A._crd), A.values.device)
        _check_levels(fmt, fs, list(A._pos), list(A._crd), A.values, check=True)
    except ValidationError as exc:
        return str(exc)
    except RuntimeError:  # buffers that cannot be read here (a torch.func transform): nothing to say
        return None
    return None


def _has_empty_line(A: SparseTensor) -> bool:
    """Whether A's pattern leaves a row or a column without a stored entry (O(nnz) once per
    pattern, kept on the tensor)."""
    cache = A._cache
    got = cache.get("empty_line")
    if got is None:
        coords, _ = A.entries()
        m, n = A.format_shape[-2], A.format_shape[-1]
        rows = torch.bincount(coords[0], minlength=m)
        cols = torch.bincount(coords[1], minlength=n)
        got = bool((rows == 0).any()) or bool((cols == 0).any())
        cache["empty_line"] = got
    return bool(got)


#: how the reason of an answer that overflows the dtype begins (the op raises InputError for it: the
#: problem's scale, not the method, is what must change)
OVERFLOW_REASON = "the solution does not fit in"

#: methods whose ``maxiter`` counts restart cycles or outer iterations (SciPy's meaning, which every
#: backend follows), not the Krylov iterations that offers estimate
_RESTARTED = frozenset({"gmres", "lgmres", "gcrotmk"})


def _in_units(offer: Offer, iterations: int, restart: int) -> int:
    """An iteration budget as ``offer``'s method counts ``maxiter``: restart cycles of ``restart``
    iterations for the restarted methods (session 19: a probe's budget of 2130 iterations given to
    SciPy's GMRES as 2130 cycles ran 71 cycles, 2.1 s against its 26 ms share), else iterations."""
    if offer.method in _RESTARTED:
        return max(1, -(-int(iterations) // restart))
    return int(iterations)


def _row_weights(A: SparseTensor, values: torch.Tensor, adjoint: bool) -> torch.Tensor:
    """``1 / max_j |a_ij|`` per row of A (of A^H when ``adjoint``: A's columns), as powers of two,
    ``(*batch, n)``, 1 for an empty row."""
    coords, slot = A.entries()
    lines = coords[1] if adjoint else coords[0]
    n = A.format_shape[1] if adjoint else A.format_shape[0]
    mag = values.abs().index_select(-1, slot)
    batch = values.shape[:-1]
    top = torch.zeros(*batch, n, dtype=mag.dtype, device=values.device).scatter_reduce(
        -1, lines.expand(*batch, -1), mag, "amax")
    return _pow2(top).to(values.dtype)


def _scaled(state: PlanState, A: SparseTensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_equilibrated` of ``values``, kept on the plan while the call's values equal a copy of those it
    scaled (a badly scaled matrix solved again: Ruiz's passes were ~60 % of a 479-unknown call, and the new
    scaled values each call made the plan compare them with its snapshot). Under the plan's lock."""
    got = state.scaled
    v = values.detach()
    if got is not None and got[0].shape == v.shape and got[0].dtype == v.dtype and torch.equal(got[0], v):
        return got[1], got[2], got[3]
    r, c, ve = _equilibrated(A, values)
    if is_plain(v):
        state.scaled = (v.clone(), r, c, ve)
    return r, c, ve


def _serial_row_sums(serial: SerialCsr, values: torch.Tensor) -> np.ndarray:
    """``sum_j |a_ij|`` per row of a CPU CSR matrix (``serial``'s pattern, ``values`` 1-D), in NumPy: what
    :meth:`SerialCsr.inf_norm` maximizes."""
    v = np.abs((values.detach() if values.requires_grad else values).numpy())
    sums = np.zeros(serial.m, dtype=v.dtype)
    if serial.lead:
        sums[: serial.lead] = np.add.reduceat(v, serial.starts)
        if serial.empty is not None:
            sums[serial.empty] = 0
    return sums


def _row_sums(A: SparseTensor, values: torch.Tensor, adjoint: bool) -> torch.Tensor:
    """``sum_j |a_ij|`` per row of A (of A^H when ``adjoint``: A's columns), ``(*batch, n)``, in A's real
    dtype (0 for an empty row)."""
    coords, slot = A.entries()
    lines = coords[1] if adjoint else coords[0]
    n = A.format_shape[1] if adjoint else A.format_shape[0]
    mag = values.abs().index_select(-1, slot)
    return torch.zeros(*values.shape[:-1], n, dtype=mag.dtype, device=values.device).index_add_(-1, lines, mag)


def _spread(scale: torch.Tensor) -> float:
    """``max / min`` of a positive scaling (powers of two), over every batch member."""
    a = scale.abs()
    return float((a.amax(dim=-1) / a.amin(dim=-1)).max())


def _direct(offer: Offer | None) -> bool:
    return offer is None or offer.direct
