"""Handles: a plan plus what the adjoint rules need (the pattern's entries, the direction).

A handle makes sure the plan holds the values it is asked to use: plans are shared through
the cache, so between a forward solve and its backward another solve on the same pattern may
have loaded other values; the handle notices (by the values' identity and version) and reloads.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import BackendError, IndefiniteMatrixError, NotConvergedError, NotConvergedWarning
from ..dispatch.results import IterationResult, Status
from ..tensor import SparseTensor
from ..tensor.validate import check_finite
from ..dispatch.plan import PlanState, guarded
from .sddmm import sddmm

__all__ = ["PlanState", "SolveHandle", "MatmulHandle", "sddmm", "vmap_columns", "guarded"]


def vmap_columns(apply, info, in_dims, values: torch.Tensor, X: torch.Tensor, handle):
    """The ``vmap`` rule shared by the sparse Functions ``apply(values, X, handle)`` whose ``X`` is
    ``(*batch, n, k)``: a mapped ``X`` alone is folded into the columns (one call for all), a
    mapped ``values`` runs one call per member (each needs its own factorization)."""
    vd, xd, _ = in_dims
    if vd is None and xd is not None:
        Xm = X.movedim(xd, -1)  # (..., n, k, V)
        shape = Xm.shape
        Y = apply(values, Xm.reshape(*shape[:-2], shape[-2] * shape[-1]), handle)
        return Y.reshape(*Y.shape[:-1], shape[-2], shape[-1]), len(shape) - 1
    size = info.batch_size
    vs = [values.select(vd, i) if vd is not None else values for i in range(size)]
    xs = [X.select(xd, i) if xd is not None else X for i in range(size)]
    return torch.stack([apply(v, x, handle) for v, x in zip(vs, xs)]), 0


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
            from .fallback import Route  # noqa: PLC0415 - fallback imports this module

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


@dataclass
class MatmulHandle:
    """``Y = A X`` (or ``A^H X`` when ``adjoint``) with a shared product plan."""

    state: PlanState
    A: SparseTensor
    adjoint: bool = False

    def flipped(self) -> "MatmulHandle":
        return MatmulHandle(self.state, self.A, not self.adjoint)

    def run(self, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        state = self.state
        with state.lock, torch.no_grad():
            state._load(values)
            Y = guarded(lambda: state.plan.apply(X.detach(), adjoint=self.adjoint), state.label, "apply")
        m, n = self.A.format_shape
        rows = n if self.adjoint else m
        want = (*X.shape[:-2], rows, X.shape[-1])
        if not isinstance(Y, torch.Tensor) or tuple(Y.shape) != want or Y.dtype != X.dtype or Y.device != X.device:
            got = (tuple(Y.shape), Y.dtype, Y.device) if isinstance(Y, torch.Tensor) else type(Y).__name__
            raise BackendError(f"{state.label} returned {got} from apply, expected shape {want}, {X.dtype} on "
                               f"{X.device} (plugin bug)", label=state.label, phase="apply")
        return Y


def _check(res: IterationResult, name: str, policy: str, what: str) -> None:
    if res.converged:
        return
    if res.status is Status.INDEFINITE:
        raise IndefiniteMatrixError(
            f"{name} ({what}solve): {res.reason}. The matrix is not positive definite: use method='minres' "
            f"(symmetric indefinite), 'gmres'/'bicgstab' (general) or a direct method"
        )
    msg = (
        f"{name} ({what}solve) stopped after {res.iterations} iterations with relative residual "
        f"{res.residual:.3g} ({res.status.value}: {res.reason or 'no reason given'}). Raise maxiter, "
        f"loosen rtol/atol, add a preconditioner, or pass on_nonconvergence='warn' to get x anyway"
    )
    if policy == "warn":
        warnings.warn(msg, NotConvergedWarning, stacklevel=4)
    elif policy != "ignore":
        raise NotConvergedError(msg, res)
