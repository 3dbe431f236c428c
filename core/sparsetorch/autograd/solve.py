"""Adjoint rule of the sparse solve ``A X = B``.

Math (Giles, "Collected matrix derivative results"; DESIGN.md):

    forward   X = A^{-1} B
    backward  Lambda = A^{-H} dX              (one adjoint solve on the same plan)
              dB = Lambda
              dA = -Lambda X^H, kept on A's pattern: dA_vals[k] = -sum_c Lambda[row_k, c] conj(X[col_k, c])

For the adjoint direction (X = A^{-H} B): dB = A^{-1} dX = M, dA = -X M^H.

Forward mode (jvp): dX = A^{-1} (dB - dA X), one product with the tangent values and one solve.

The graph holds one node whatever the iteration count, and saves only ``values`` and ``X``
(O(n + nnz) memory). The backward pass calls this same Function on the flipped handle, so it
is itself differentiable: ``create_graph=True`` gives second derivatives. ``vmap`` over the
right-hand side folds the mapped dimension into the columns (one multi-RHS solve).

A :class:`SolveHandle` is what the Function carries: the plan (shared through the plan cache),
the direction, the call's per-call options and the fallback :class:`~.fallback.Route`
(:func:`route_for`) that runs and checks every attempt. Plans are shared, so between a forward
solve and its backward another solve on the same pattern may have loaded other values; the
plan's state notices (by the values' identity and version) and reloads.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
import itertools
import weakref
from typing import Any

import torch

from ..dispatch import experience
from ..dispatch.options import DEFAULT_RESTART
from ..dispatch.plan import PlanState, call_options, plan_for
from ..dispatch.records import Offer, Request
from ..dispatch.results import IterationResult, Status
from ..dispatch.records import ExplainTable
from ..errors import IndefiniteMatrixError, InputError, NotConvergedError, NotConvergedWarning
from ..tensor import SparseTensor
from ..tensor.validate import check_finite
from ._fast_apply import FastFunction, vmap_columns
from . import products
from .fallback import OVERFLOW_REASON, Route
from .matmul import MatmulHandle, matmul_function
from .sddmm import sddmm

__all__ = ["SolveHandle", "route_for", "solve_call", "solve_function", "register_solver_object", "solver_object"]

#: Solver objects by handle, for the compiled op ``sparsetorch::solver_solve`` (a graph carries
#: the integer; the Solver itself stays a Python object outside it). Weak: a dropped Solver goes.
_SOLVER_OBJECTS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_SOLVER_HANDLES = itertools.count(1)


def register_solver_object(obj: Any) -> int:
    """A handle for ``obj`` (a :class:`~sparsetorch.Solver`: anything with ``_run(values, B,
    adjoint)`` and ``_pattern``) that compiled graphs may carry."""
    h = next(_SOLVER_HANDLES)
    _SOLVER_OBJECTS[h] = obj
    return h


def solver_object(handle: int) -> Any:
    """The Solver of ``handle``, or an error naming what happened to it."""
    obj = _SOLVER_OBJECTS.get(handle)
    if obj is None:
        raise InputError(f"the Solver (handle {handle}) this compiled graph was traced with no longer exists; keep "
                         f"it alive while the compiled function runs, or compile again")
    return obj


def route_for(op: str, A: SparseTensor, request: Request, table: ExplainTable, offer: Offer, state: PlanState, *,
              cache: bool = True) -> Route:
    """The fallback route of a call: ``offer`` first, then the offers ranked after it (none when
    the user pinned the method). ``A``: the matrix detached (the route reads its pattern; the
    values of each call arrive with the call)."""
    pinned = request.option("method") is not None
    rest: list[Offer] = []
    if not pinned:
        # the offers ranked after ``offer`` (a Solver that fell back starts further down the
        # table), then those before it
        offers = [r.offer for r in table.offers if r.offer is not None]
        k = offers.index(offer) if offer in offers else -1
        rest = offers[k + 1:] + offers[:max(k, 0)]
    # a matrix class whose iteration estimates are guesses (not SPD, not diagonally dominant):
    # the route may try a short, bounded iterative probe before a direct method (fallback.py)
    uncertain = op == "solve" and experience.class_factor(request)[0] > 1.0 and not request.measured
    def make(o: Offer, M: SparseTensor | None = None) -> PlanState:
        # M: another matrix of the same shape and class (the route's shifted A + delta I on a
        # pattern with the whole diagonal), planned uncached
        return plan_for(op, A, request, o, cache=cache) if M is None else plan_for(op, M, request, o, cache=False)

    return Route(A, state, offer, rest, make, pinned=pinned, probe=uncertain,
                 restart=int(request.option("restart") or DEFAULT_RESTART))


@dataclass
class SolveHandle:
    """Solves ``A X = B`` (or ``A^H X = B`` when ``adjoint``) with a shared plan.

    ``call_options`` are the per-call options of the call that made the handle (rtol, atol,
    maxiter, check_every, callback): the backward pass solves with them whatever other calls
    have done with the shared plan since. ``route`` (:class:`~sparsetorch.autograd.fallback.Route`)
    holds the methods dispatch may fall back to and checks every answer (shape, dtype, device,
    finiteness, the true residual); without one the plan's answer is checked the same way and
    a failure raises (a pinned method).
    """

    state: PlanState
    A: SparseTensor
    adjoint: bool = False
    on_nonconvergence: str = "raise"
    results: list = field(default_factory=list)
    check_finite: bool = False
    call_options: dict | None = None
    route: Any = None

    def __post_init__(self) -> None:
        if self.call_options is None:
            self.call_options = {}
        if self.route is None:
            self.route = Route.single(self.state, self.A)

    def flipped(self) -> "SolveHandle":
        return SolveHandle(self.route.state, self.A, not self.adjoint, self.on_nonconvergence, self.results,
                           call_options=self.call_options, route=self.route)

    def run(self, values: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        # Runs inside the autograd Function, where torch.func transforms hand over plain tensors.
        if self.check_finite:
            check_finite(self.A.with_values(values), B, "solve")
        X, res = self.route.solve(self, values.detach(), B.detach())
        self.state = self.route.state
        self.results.append(res)
        _check(res, self.route.label, self.on_nonconvergence, "adjoint " if self.adjoint else "")
        return X


class _Solve(FastFunction):
    @staticmethod
    def forward(values: torch.Tensor, B: torch.Tensor, handle: SolveHandle) -> torch.Tensor:
        return handle.run(values, B)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        values, B, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, output)
        ctx.save_for_forward(values, output)

    @staticmethod
    def jvp(ctx, dvalues, dB, _):
        """Forward mode: ``dX = A^{-1} (dB - A(dvalues) X)`` (``A^{-H}`` and ``A(dvalues)^H`` in
        the adjoint direction): one product with the tangent values, one solve on the plan."""
        values, X = ctx.saved_tensors
        h: SolveHandle = ctx.handle
        R = dB if dB is not None else torch.zeros_like(X)
        if dvalues is not None:
            R = R - _tangent_product(h, dvalues, X)
        return _Solve.apply(values, R, h)

    @staticmethod
    def backward(ctx, dX: torch.Tensor):
        values, X = ctx.saved_tensors
        h: SolveHandle = ctx.handle
        need_v, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_v or need_b):
            return None, None, None
        M = _Solve.apply(values, dX, h.flipped())
        dB = M if need_b else None
        dV = None
        if need_v:
            dV = -(sddmm(h.A, X, M) if h.adjoint else sddmm(h.A, M, X))
        return dV, dB, None

    @staticmethod
    def vmap(info, in_dims, values, B, handle):
        return vmap_columns(_Solve.apply, info, in_dims, values, B, handle)


def _tangent_product(h: SolveHandle, dvalues: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """``A(dvalues) @ X`` (``A(dvalues)^H @ X`` for an adjoint handle) on A's pattern, through a
    product plan from the plan cache."""
    return matmul_function(dvalues, X, MatmulHandle(products.product_state(h.A, X), h.A, h.adjoint))


def solve_function(values: torch.Tensor, B: torch.Tensor, handle: SolveHandle) -> torch.Tensor:
    """``X`` with ``A(values) X = B`` through the plan in ``handle``, differentiable."""
    return _Solve.apply(values, B, handle)


def _check(res: IterationResult, name: str, policy: str, what: str) -> None:
    if res.converged:
        return
    if res.status is Status.INDEFINITE:
        raise IndefiniteMatrixError(
            f"{name} ({what}solve): {res.reason}. The matrix is not positive definite: use method='minres' "
            f"(symmetric indefinite), 'gmres'/'bicgstab' (general) or a direct method"
        )
    if res.status is Status.NOT_FINITE and (res.reason or "").startswith(OVERFLOW_REASON):
        # the problem's scale, not the method, is what must change: no advice about iterations (still
        # a NotConvergedError with status NOT_FINITE, which callers such as Newton's loop stop on)
        msg = f"{name} ({what}solve): {res.reason}"
    else:
        msg = (
            f"{name} ({what}solve) stopped after {res.iterations} iterations with relative residual "
            f"{res.residual:.3g} ({res.status.value}: {res.reason or 'no reason given'}). Raise maxiter, "
            f"loosen rtol/atol, add a preconditioner, or pass on_nonconvergence='warn' to get x anyway"
        )
    if policy == "warn":
        warnings.warn(msg, NotConvergedWarning, stacklevel=4)
    elif policy != "ignore":
        raise NotConvergedError(msg, res)


def solve_call(op: str, A: SparseTensor, request: Request, table: ExplainTable, offer: Offer, state: PlanState,
               values: torch.Tensor, B: torch.Tensor, *, cache: bool, policy: str, check_finite: bool = False,
               call: dict[str, Any] | None = None) -> tuple[torch.Tensor, SolveHandle]:
    """``X`` with ``A(values) X = B`` through the chosen plan, its fallback route and the autograd
    Function (what ``solve`` and ``Solver.solve`` run once dispatch has chosen), and the handle
    (its route's attempts and results, for the call's info). ``A``: the matrix detached;
    ``call``: the per-call options when the caller has them already (else from ``request``)."""
    route = route_for(op, A, request, table, offer, state, cache=cache)
    handle = SolveHandle(state, A, False, policy, [], check_finite=check_finite,
                         call_options=call_options(request) if call is None else call, route=route)
    return solve_function(values, B, handle), handle
