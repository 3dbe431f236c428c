"""``lstsq``: sparse least squares through dispatch (op ``"lstsq"``), with adjoint gradients.

``X = argmin ||A X - B||^2 + damp^2 ||X||^2`` for a sparse ``A`` of any shape ``m x n`` (the
minimum-norm solution when that is not unique). Backends offer it with methods such as
``"lsqr"`` and ``"lsmr"`` (the SciPy plugin); plans follow the protocol of
docs/backend-authors.md ("Eigenvalue, determinant and least-squares plans"). The plan is chosen
and cached as for ``solve`` (``dispatch/plan.py``): new values on the same pattern reuse it, and
the backward pass runs on the same plan (``autograd/lstsq.py`` has the math).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math

import threading


from typing import Any, Mapping

import torch

from ..autograd._route_checks import safe_value_scales
from ..autograd.lstsq import LstsqHandle, lstsq_function
from ..errors import BackendError, InputError, NoBackendError, NotConvergedError
from ..dispatch.results import Attempt, Status
from ..tensor import SparseTensor
from ..dispatch.options import LstsqOptions, defaults
from ..dispatch.plan import make_request, obtain_plan, plan_for
from ._inputs import (as_rhs, check_finite as check_finite_values, check_matrix, describe_dense, describe_sparse,
                      index_buffers_now, index_buffers_unchanged, restore_rhs)
from .accuracy import default_rtol
from .info import SolveInfo
from .properties import detect_cached
from ..tensor.sparse_tensor import is_plain, vmapped

__all__ = ["lstsq", "Lstsq", "lstsq_request", "LSTSQ_DEFAULTS"]

_POLICIES = ("raise", "warn", "ignore")

#: The keyword options of lstsq with their defaults: those of the record
#: (:class:`~sparsetorch.dispatch.options.LstsqOptions`, where the tolerances are explained).
#: ``atol=None``/``btol=None`` follow the accuracy contract: the dtype's default_rtol (1e-10 in
#: float64, 1e-5 in float32), so an unspecified call is as accurate as a QR factorization would be.
LSTSQ_DEFAULTS: dict[str, Any] = {k: v for k, v in defaults(LstsqOptions).items() if k != "repeat"}
#: Options a plan reads per call (the rest choose or key the plan).
CALL = ("damp", "atol", "btol", "conlim", "maxiter")
#: a default call in these dtypes is solved in the wider one and rounded back (:func:`lstsq`)
_WIDER = {torch.float32: torch.float64, torch.complex64: torch.complex128}


def widened(A: SparseTensor, B: torch.Tensor | None, options: Mapping[str, Any]) -> torch.dtype | None:
    """The dtype a default single-precision :func:`lstsq` call runs in (float64 / complex128), or None: A
    float32 / complex64 (and B alike), no method, tolerance or damp given. ``explain`` shows that call."""
    wide = _WIDER.get(A.dtype)
    if wide is None or (B is not None and B.dtype != A.dtype):
        return None
    if options.get("method") is not None or options.get("atol") is not None or options.get("btol") is not None:
        return None
    return None if options.get("damp") else wide


def _options(dtype: torch.dtype | None = None, **kw: Any) -> LstsqOptions:
    """The validated record, ``atol``/``btol`` resolved for ``dtype`` (the checks are the record's).
    Names the record does not have (``explain("lstsq", ...)`` given the call's other keywords,
    such as ``check_finite``) choose nothing and are left out."""
    known = {k: v for k, v in kw.items() if k in LSTSQ_DEFAULTS}
    return LstsqOptions(**known).resolved(default_rtol(dtype if dtype is not None else torch.float64))


def lstsq_request(A: SparseTensor, B: torch.Tensor | None, options: Mapping[str, Any]):
    """The dispatch request of op "lstsq" (a square A's properties detected as solve does)."""
    operands = (describe_sparse(A),) + ((describe_dense(B),) if B is not None else ())
    m, n = A.format_shape
    props = detect_cached(A) if m == n else frozenset()
    return make_request("lstsq", operands, props, options)


def lstsq(
    A: SparseTensor,
    B: torch.Tensor,
    *,
    backend: str | None = None,
    method: str | None = None,
    damp: float = 0.0,
    atol: float | None = None,
    btol: float | None = None,
    conlim: float = 1e8,
    maxiter: int | None = None,
    max_bytes: int | None = None,
    backend_options: dict[str, Any] | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    on_nonconvergence: str = "raise",
    cache: bool = True,
):
    """Least squares ``X = argmin ||A X - B||_2^2 + damp^2 ||X||_2^2`` for sparse ``A`` (m x n).

    ``B`` is ``(m,)``, ``(m, k)`` or either with A's value batch in front; ``X`` has ``n`` rows.
    Overdetermined full-rank systems give the least-squares solution, underdetermined or
    rank-deficient ones the minimum-norm one (``damp == 0``), by every method (LSQR / LSMR start from
    zero, the Eigen QR takes a second QR, the dense SVD drops the null singular values); the one exception
    is the column-scaled retry of badly scaled columns (docs/dispatch.md), which info names. Methods: ``"lsqr"``, ``"lsmr"`` (the SciPy
    plugin), ``"qr"`` (the Eigen plugin's sparse QR), ``"dense"`` (the built-in torch backend's SVD of the dense
    matrix, any rank and ``damp``, up to min(m, n) = 4096); ``atol``/``btol``/``conlim``/``maxiter`` are their stopping rules (see
    :data:`LSTSQ_DEFAULTS`). With none of ``atol``/``btol``/``damp`` given, an iterative answer is
    refined on the same plan to a backward-stable method's backward error (docs/dispatch.md). A method
    dispatch chose that fails (its plugin raised or returned something that is not an answer, or its
    answer was refused) hands over to the next offer of the ranking, and a Krylov method that does not
    converge to a direct one (QR, the dense SVD); a pinned method's failure raises (a plugin's as
    :class:`~sparsetorch.BackendError` naming it and the phase). Not converging raises :class:`~sparsetorch.NotConvergedError`
    (``on_nonconvergence="warn"``/``"ignore"``).

    Differentiable in A's values (on the pattern) and in ``B`` by the adjoint method
    (``autograd/lstsq.py``): two least-squares solves on the same plan per backward pass (one
    when ``damp > 0``). With ``damp == 0`` the gradient in ``B`` is ``pinv(A)^H G`` for any shape and
    rank, while one in A's values needs A of full column rank: a wide A raises ``InputError``, a
    rank-deficient tall or square one :class:`~sparsetorch.SingularMatrixError` (the minimum-norm
    solution is not differentiable in A there; found by the backward pass's adjoint solve at the cost
    of one product). ``damp > 0`` gives a well-defined gradient for any rank.
    ``return_info=True`` returns ``(X, info)`` with ``info.residual = ||B - A X|| / ||B||``.

    In float32 / complex64, a call with no ``method``, tolerance or ``damp`` is solved in float64 /
    complex128 and rounded back (single-precision Krylov least squares loses about ``cond^2 u``; a
    pinned method or a given tolerance runs in A's dtype).
    """
    if on_nonconvergence not in _POLICIES:
        raise InputError(f"on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
    A = check_matrix(A, "lstsq", square=False)
    m, n = A.format_shape
    Bn, vector = as_rhs(A, B, "lstsq", rows=m)
    members = torch.broadcast_shapes(tuple(A.values.shape[:-1]), tuple(Bn.shape[:-2]))
    if math.prod(members) == 0:
        # a value batch (or B's batch) of no members: nothing to solve (the plans' kernels failed on it: eigen "bad
        # sizes", the dense SVD's min() of an empty tensor; solve and matmul answered it already)
        X = Bn.new_zeros(*members, n, Bn.shape[-1])
        if torch.is_grad_enabled() and (A.values.requires_grad or Bn.requires_grad):
            X = X + 0 * (A.values.sum() + Bn.sum())  # (empty) gradients flow back to both
        out = restore_rhs(X, vector)
        if not return_info:
            return out
        return out, SolveInfo(backend="none", method="none", iterations=0, residual=0.0, converged=True,
                              status=Status.DIRECT, reason="a batch of no members: nothing to solve")
    # under torch.func transforms (no storage to read here) the finiteness check is left to the handle,
    # which runs inside the autograd Function on the plain tensors the transform hands over (as solve)
    checked_here = check_finite and is_plain(A.values) and is_plain(Bn)
    if checked_here:
        check_finite_values(A, Bn, "lstsq")
    wide = widened(A, Bn, {"method": method, "atol": atol, "btol": btol, "damp": damp})
    if wide is not None:
        # A default single-precision call is solved in double and rounded back: least squares in float32 by
        # LSQR / CGLS loses ~cond^2 u (lp_e226, 223 x 472: 10 % from the minimum-norm solution; ash219 50x
        # a backward-stable method's error) and a float32 sparse QR misjudges the rank (impcol_a raised
        # NotConvergedError); in float64 the same calls reach the contract. Differentiable through the casts.
        # No backend for the wider dtype (one pinned that takes float32 only): the call runs in A's dtype.
        try:
            got = lstsq(A.to(wide), restore_rhs(Bn.to(wide), vector), backend=backend, method=None, damp=0.0,
                        conlim=conlim, maxiter=maxiter, max_bytes=max_bytes, backend_options=backend_options,
                        return_info=return_info, check_finite=check_finite and not checked_here,
                        on_nonconvergence=on_nonconvergence, cache=cache)
        except NoBackendError:
            got = None
    if wide is not None and got is not None:
        if not return_info:
            return got.to(A.dtype)
        X, info = got
        return X.to(A.dtype), dataclasses.replace(
            info, reason=f"{info.reason}; solved in {str(wide).replace('torch.', '')} and rounded to "
                         f"{str(A.dtype).replace('torch.', '')} (a default single-precision least-squares call)")
    if is_plain(A.values) and not _MAGNITUDE.get(False):
        # a value set whose entries lie outside the range where squared norms are safe (||A||_F and the checks'
        # norms overflowed or underflowed): solved for 2^q A, x = 2^q y, exact; per value-batch member, and only
        # where the smallest entry stays in range once scaled (a matrix spanning more is the column scaling's
        # case below). B's magnitudes are the handle's (LstsqHandle.run: per column, forward and adjoint alike).
        # After the widening above: a default float32 call is judged in float64's range (session 26's sweep)
        sa = safe_value_scales(A.values)
        if sa is not None and (not damp or bool((sa == sa.reshape(-1)[0]).all())):
            token = _MAGNITUDE.set(True)
            try:
                got = lstsq(A.with_values(A.values * sa.unsqueeze(-1)), restore_rhs(Bn, vector), backend=backend,
                            method=method, damp=damp * float(sa.reshape(-1)[0]), atol=atol, btol=btol, conlim=conlim,
                            maxiter=maxiter, max_bytes=max_bytes, backend_options=backend_options,
                            return_info=return_info, check_finite=False, on_nonconvergence=on_nonconvergence,
                            cache=cache)
            finally:
                _MAGNITUDE.reset(token)
            Y, info = got if return_info else (got, None)
            X = Y * (sa.unsqueeze(-1) if vector else sa.unsqueeze(-1).unsqueeze(-1))  # x of A x ~ b from (sa A) y ~ b
            if info is None:
                return X
            return X, dataclasses.replace(info, reason=f"{info.reason}; solved for A scaled by powers of two (entries "
                                                       f"outside the range of safe squared norms)")
    def again(As: SparseTensor, Bs: torch.Tensor, on_nc: str):
        """The call once more on (As, Bs), the scaling retries switched off inside it."""
        token = _SCALING.set(True)
        try:
            return lstsq(As, restore_rhs(Bs, vector), backend=backend, method=method, conlim=conlim, maxiter=maxiter,
                         max_bytes=max_bytes, backend_options=backend_options, return_info=return_info,
                         check_finite=False, on_nonconvergence=on_nc, cache=cache)
        finally:
            _SCALING.reset(token)

    if atol is None and btol is None and not damp and is_plain(A.values) and not _SCALING.get(False):
        wide = m < n
        scaled = _column_scaled(A, rows=True) if wide else _column_scaled(A)
        if scaled is not None:
            # columns (rows, for a wide A) spread over more than COLUMN_SPREAD: A itself first (a rank-deficient
            # A's answer is then the minimum-norm one); where that fails, a scaled A by powers of two.
            # Tall: LSQR on A stopped 100 % from the solution (columns 1e-6..1e6, condition 2.5 once scaled) and a
            # QR's rank decision dropped the small columns (session 23's sweep): A D (unit columns), x = D y.
            # Wide: LSQR answered rows 1e-5..1e5 (12 x 30, full row rank) with residual 0.39, 97 % from the
            # minimum-norm solution (session 28's sweep; now refused). Column scaling would change the minimum-norm
            # solution; row scaling of A and b together does not change the solutions of a consistent A x = b:
            # D A x = D b (unit rows; for a rank-deficient, inconsistent A the least-squares solution in D's weights)
            try:
                return again(A, Bn, "raise")
            except NotConvergedError as exc:
                first = str(exc)
            As, d, spread = scaled
            if not wide:
                got = again(As, Bn, on_nonconvergence)
                Y = got[0] if return_info else got
                X = Y * (d if vector else d.unsqueeze(-1))
                if not return_info:
                    return X
                return X, dataclasses.replace(got[1], reason=f"{got[1].reason}; A's columns scaled to unit norm (their "
                                                             f"norms spread over {spread:.2g}; unscaled: {first[:200]})")
            got = again(As, Bn * (d.real if d.is_complex() else d).unsqueeze(-1).to(Bn.dtype), on_nonconvergence)
            if not return_info:
                return got
            return got[0], dataclasses.replace(got[1], reason=f"{got[1].reason}; A's rows and b's scaled by the same "
                                                              f"powers of two, to unit rows (their norms spread over "
                                                              f"{spread:.2g}; unscaled: {first[:200]})")
    options = _options(A.dtype, backend=backend, method=method, damp=damp, atol=atol, btol=btol, conlim=conlim, maxiter=maxiter,
                       max_bytes=max_bytes, backend_options=backend_options)
    Ap = A
    if vmapped(A.values):
        # torch.func.vmap over A's values: planning sees the pattern (a plan cannot hold a batched tensor),
        # and the Function's vmap rule solves member by member with plain values (as solve)
        Ap = A.detach().with_values(torch.zeros(A.values.shape, dtype=A.dtype, device=A.device))
    request = lstsq_request(Ap, Bn, options)
    state, offer, table = obtain_plan("lstsq", Ap, request, cache=cache)
    call = {k: options[k] for k in CALL}
    pinned = method is not None  # as solve's: a backend alone still lets dispatch choose among its offers
    handle = LstsqHandle(state, Ap.detach(), call, on_nonconvergence, fallbacks=[] if pinned else _fallbacks(table, offer),
                         rebuild=lambda o: plan_for("lstsq", Ap, request, o, cache=cache), offer=offer,
                         sharpen=atol is None and btol is None and not damp,
                         finite=check_finite_values if check_finite and not checked_here else None)
    X = lstsq_function(A.values, Bn, handle)
    out = restore_rhs(X, vector)
    if not return_info:
        return out
    return out, _info(A, Bn, X, handle.state, handle.offer, handle)


#: set while a call made by the magnitude scaling runs (it does not scale again)
_MAGNITUDE: contextvars.ContextVar[bool] = contextvars.ContextVar("sparsetorch_lstsq_magnitude")

#: a default lstsq call on columns whose 2-norms spread over more than this (in one value set) that fails on A
#: itself is solved with the columns scaled
COLUMN_SPREAD = 1e6
#: set while a call made by the scaling path runs (it does not scale again)
_SCALING: "contextvars.ContextVar[bool]" = contextvars.ContextVar("sparsetorch_lstsq_scaling", default=False)


def _column_scaled(A: SparseTensor, rows: bool = False):
    """``(A D, d, spread)`` with ``D = diag(d)`` powers of two bringing A's column 2-norms near 1 (per value
    set), when the norms of the nonzero columns spread over more than :data:`COLUMN_SPREAD`; else None.
    ``rows``: the same for A's rows, ``(D A, d, spread)`` (a wide A's retry: ``D A x = D b`` has the solutions of
    ``A x = b``).

    For A of full column rank the least-squares solution is ``D`` times that of ``A D``; for a rank-deficient
    A it is the least-squares solution of least ``||D^-1 x||`` (a basic solution, as MATLAB's backslash gives)
    rather than of least ``||x||``: :func:`lstsq` takes it only where A itself gave no answer."""
    coords, slot = A.entries()
    if coords.shape[-1] == 0:
        return None
    mag = A.values.detach().index_select(-1, slot).abs()
    axis = 0 if rows else 1
    n = A.format_shape[axis]
    norms = mag.new_zeros(*mag.shape[:-1], n).index_add(-1, coords[axis], mag * mag).sqrt()
    live = norms > 0
    if not bool(live.any()):
        return None
    # per value set: members each well scaled but of different magnitudes are no reason to scale
    small = torch.where(live, norms, torch.full_like(norms, float("inf"))).amin(-1)
    ratio = norms.amax(-1) / small
    spread = float(torch.where(torch.isfinite(ratio), ratio, torch.zeros_like(ratio)).max())
    if not spread > COLUMN_SPREAD:
        return None
    safe = torch.where(live, norms, torch.ones_like(norms))
    d = torch.exp2(-torch.round(torch.log2(safe))).to(A.dtype)  # 1 for empty columns (log2(1) = 0)
    per_slot = torch.ones(*d.shape[:-1], A.values.shape[-1], dtype=A.dtype, device=A.device)
    per_slot = per_slot.index_copy(-1, slot, d.index_select(-1, coords[axis]))
    return A.with_values(A.values * per_slot), d, spread


def _fallbacks(table, chosen) -> list:
    """The offers a least-squares call hands over to when the method dispatch chose fails (its plugin raised or
    returned something that is not an answer, it did not converge, or its answer was refused): those ranked after
    it, then those before it (a Lstsq object that fell back starts further down), as solve's route. The handle
    skips the iterative ones once an iterative method stalled (another Krylov method would stall alike)."""
    offers = [r.offer for r in table.rows if r.offer is not None]
    if chosen is None:
        return offers
    k = offers.index(chosen) if chosen in offers else -1
    return offers[k + 1:] + offers[:max(k, 0)]


class Lstsq:
    """Least squares bound to one pattern: plan once, new values keep the plan, solve many.

    ::

        ls = Lstsq(A, method="lsmr", damp=0.1)
        ls.plan()                 # choose the backend and method (pattern work)
        x = ls.solve(b)           # differentiable in b and in A's values
        ls.update_values(v2)      # same pattern, new values
        x2 = ls.solve(b)

    Keyword options are those of :func:`lstsq` (``cache`` defaults to False: the object holds
    its plan itself). As :func:`lstsq`, a float32 / complex64 object with no method, tolerance or damp
    works in float64 / complex128 and rounds its answers back.
    """

    def __init__(self, A: SparseTensor, *, on_nonconvergence: str = "raise", cache: bool = False, **options: Any) -> None:
        self.A = check_matrix(A, "Lstsq", square=False)
        if on_nonconvergence not in _POLICIES:
            raise InputError(f"on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
        unknown = set(options) - set(LSTSQ_DEFAULTS)
        if unknown:
            raise InputError(f"Lstsq got unknown options {sorted(unknown)}; known: {sorted(LSTSQ_DEFAULTS)}")
        #: a default single-precision object works in double, as :func:`lstsq` does (None: in A's dtype)
        self._wide = widened(self.A, None, options)
        self._options = _options(self._wide or self.A.dtype, **options)
        # no tolerance and no damp given: answers are refined to a direct method's backward error
        self._sharpen = options.get("atol") is None and options.get("btol") is None and not options.get("damp")
        self._policy, self._cache = on_nonconvergence, cache
        self._state = None
        self._offer = None
        self._fallbacks: list = []
        self._request = None
        #: A's pattern (shares its index buffers with every value set given) and what the plan recorded of its
        #: buffers (index_buffers_now): a write in place to them since drops the plan (:meth:`_pattern_moved`)
        self._pattern = self.A.detach()
        self._planned_bufs: tuple | None = None
        self.results: list = []
        # the plan's fields change together (first use, a fallback's answer): threads calling solve()
        # on one object see all of them or none (the first solve of several threads crashed between
        # them, session 21's sweep)
        self._lock = threading.RLock()

    def plan(self):
        """Choose the backend and method; returns the explain table."""
        with self._lock:
            A = self._work(self.A)
            request = lstsq_request(A, None, self._options)
            try:
                state, offer, table = obtain_plan("lstsq", A, request, cache=self._cache)
            except NoBackendError:
                if self._wide is None:
                    raise
                # no backend for the wider dtype (one pinned that takes float32 only): work in A's dtype
                self._wide = None
                self._options = _options(self.A.dtype, **{k: v for k, v in self._options.items() if k in ("backend",
                                         "damp", "conlim", "maxiter", "max_bytes", "backend_options")})
                return self.plan()
            pinned = self._options.get("method") is not None
            fallbacks = [] if pinned else _fallbacks(table, offer)
            while True:
                try:
                    state.build()
                    break
                except BackendError:
                    # the factory of a method dispatch chose raised (a plugin bug): the next offer, as a call's
                    # failure hands over (LstsqHandle); a pinned method's error is raised, naming the plugin
                    if not fallbacks:
                        raise
                    offer = fallbacks.pop(0)
                    state = plan_for("lstsq", A, request, offer, cache=self._cache)
            self._fallbacks = fallbacks
            self._request = request
            self._state, self._offer = state, offer
            self._planned_bufs = index_buffers_now(self._pattern)
            return table

    def _pattern_moved(self) -> bool:
        """Whether A's index buffers were written in place (or swapped) since the plan was made: then the plan
        made on the old pattern, its offer and its fallbacks are dropped (True; the caller plans again). A tracked
        write (``A.crd(1)[1] = 3``) left the object on the old pattern's plan: NotConvergedError "backward error
        0.012" (qr), 0.0066 (scipy lsqr), where st.lstsq answered the new matrix to 4e-16 (as Solver; session 27)."""
        if self._planned_bufs is None or index_buffers_unchanged(self._planned_bufs, self._pattern):
            return False
        self._state, self._offer, self._fallbacks, self._request, self._planned_bufs = None, None, [], None, None
        return True

    def update_values(self, values: torch.Tensor) -> "Lstsq":
        """New values on the same pattern (shape ``A.values.shape``); the plan is kept."""
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != tuple(self.A.values.shape):
            raise InputError(f"update_values needs a tensor of shape {tuple(self.A.values.shape)}, got "
                             f"{tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__}")
        self.A = self.A.with_values(values)
        return self

    def _work(self, A: SparseTensor) -> SparseTensor:
        return A if self._wide is None else A.to(self._wide)

    def solve(self, B: torch.Tensor, *, return_info: bool = False):
        self._pattern.ensure_valid()  # index buffers written in place since construction are re-checked
        with self._lock:
            if self._state is None or self._pattern_moved():
                self.plan()
            A, state, offer, fallbacks, request = (self._work(self.A), self._state, self._offer, list(self._fallbacks),
                                                   self._request)
        out_dtype = self.A.dtype
        if self._wide is not None and isinstance(B, torch.Tensor) and B.dtype == out_dtype:
            B = B.to(self._wide)
        Bn, vector = as_rhs(A, B, "Lstsq.solve", rows=A.format_shape[0])
        call = {k: self._options[k] for k in CALL}
        handle = LstsqHandle(state, A.detach(), call, self._policy, self.results, fallbacks=fallbacks,
                             rebuild=lambda o: plan_for("lstsq", A, request, o, cache=self._cache),
                             offer=offer, sharpen=self._sharpen)
        X = lstsq_function(A.values, Bn, handle)
        if handle.state is not state:
            # a fallback answered: this object keeps that plan for the next solves
            with self._lock:
                self._state, self._offer = handle.state, handle.offer
                self._fallbacks = list(handle.fallbacks)
        out = restore_rhs(X, vector).to(out_dtype)
        if not return_info:
            return out
        info = _info(A, Bn, X, handle.state, handle.offer, handle)
        if self._wide is not None:
            info = dataclasses.replace(info, reason=f"{info.reason}; solved in {str(self._wide).replace('torch.', '')} "
                                                    f"and rounded to {str(out_dtype).replace('torch.', '')}")
        return out, info

    @property
    def backend(self) -> str | None:
        return self._offer.backend if self._offer else None

    @property
    def method(self) -> str | None:
        return self._offer.method if self._offer else None


def _info(A: SparseTensor, Bn: torch.Tensor, Xn: torch.Tensor, state, offer, handle: LstsqHandle) -> SolveInfo:
    from ..autograd.lstsq import apply_entries

    # the answering plan's results only (a method that handed over is an attempt, not part of the answer:
    # after a failed LSQR, a QR's answer reported LSQR's iterations; session 21's docs sweep)
    mine = handle.results[getattr(handle, "answer_start", handle.start):]
    # the answer's own result (its status as checked), not the last refinement solve's: an accepted answer whose
    # last correction solve stopped at maxiter read converged=False, max_iterations, while returned under
    # on_nonconvergence="raise" (session 28's sweep)
    res = mine[0] if mine else handle.results[-1]
    iterations = sum(r.iterations for r in mine) if mine else res.iterations
    with torch.no_grad():
        r = Bn - apply_entries(A, A.values.detach(), Xn.detach())
        bn = torch.linalg.vector_norm(Bn, dim=-2)
        rel = torch.linalg.vector_norm(r, dim=-2) / torch.where(bn > 0, bn, torch.ones_like(bn))
        true_res = float(rel.max()) if rel.numel() else 0.0
    return SolveInfo(
        backend=offer.backend, method=offer.method, iterations=iterations, residual=true_res,
        converged=res.converged, status=res.status,
        reason=res.reason if len(mine) <= 1 else f"{mine[0].reason}; then {len(mine) - 1} more least-squares solves "
                                                 f"(refinement or the method handed over to) of {sum(r.iterations for r in mine[1:])} "
                                                 f"iterations",
        residual_history=tuple(mine[0].history if mine else res.history),
        preconditioner=None, plan_reused=state.reused,
        extra={"estimated_seconds": offer.seconds, "estimated_bytes": offer.bytes},
        attempts=tuple(handle.failed) + (Attempt(offer.backend, offer.method, None, iterations, res.status, true_res,
                                                 res.reason, res.converged),) if handle.failed else (),
    )
