"""Adjoint rule of a matrix-free solve ``A x = b``, ``A`` a function ``x -> A x`` (docs/solve.md,
"Matrix-free operators").

Math (the same as the sparse solve's, ``autograd/solve.py``, with ``A`` known only by its action):

    forward   x = A^{-1} b                       (a Krylov solve on the operator)
    backward  lambda = A^{-H} g                  (one adjoint Krylov solve)
              db = lambda
              dp = vjp of p -> A_p(x) at x with cotangent -lambda, for every tensor p the
                   operator depends on (``x`` held fixed): ``-(dA/dp x)^H lambda``

The graph holds one node whatever the iteration count: the iterations run under ``no_grad``, and
the backward pass applies the operator once more, to the saved ``x`` with grad mode on, and asks
autograd for the gradient of that one product. The Function's inputs are ``b`` and the tensors
``params`` (given by the caller or found by the ops layer), so that autograd routes their gradients
like any other op's. Second derivatives are not implemented (the adjoint solve runs outside
autograd): differentiating the gradient again raises (``first_order_only``).

What the Krylov solves need (the solver functions, the operator and its adjoint, the options) is
held by an :class:`OperatorHandle` that the ops layer builds (``ops/operator.py``): this layer
never imports the backend that owns the Krylov code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from ..dispatch.results import IterationResult
from ._first_order import first_order_only
from .solve import _check

__all__ = ["OperatorHandle", "operator_solve_function"]


@dataclass
class OperatorHandle:
    """One matrix-free solve: the operator on ``(n, k)`` blocks, its adjoint, the Krylov solver and
    its options, and the results of every solve run through it (the forward one first).

    ``solver(matvec, B, **options)`` returns ``(X, IterationResult)`` and never raises on
    non-convergence (the torch backend's Krylov interface); ``adjoint()`` returns ``X -> A^H X``
    (built on first use: deriving it by autograd records a product once), ``preconditioner`` /
    ``adjoint_preconditioner`` are ``X -> M^{-1} X`` (or None); ``apply(X)`` is ``A X`` recorded by
    autograd when grad mode is on (the backward's product with the solution)."""

    name: str
    apply: Callable[[torch.Tensor], torch.Tensor]
    adjoint: Callable[[], Callable[[torch.Tensor], torch.Tensor]]
    solver: Callable[..., tuple[torch.Tensor, IterationResult]]
    options: dict[str, Any]
    params: Sequence[torch.Tensor]
    preconditioner: Callable | None = None
    adjoint_preconditioner: Callable | None = None
    policy: str = "raise"
    results: list = field(default_factory=list)

    def run(self, B: torch.Tensor, adjoint: bool) -> torch.Tensor:
        """``A^{-1} B`` (``A^{-H} B`` when ``adjoint``), ``B`` of shape ``(n, k)``, no graph recorded;
        non-convergence handled by the call's policy (raise, warn or ignore)."""
        op = self.adjoint() if adjoint else self.apply
        M = self.adjoint_preconditioner if adjoint else self.preconditioner
        with torch.no_grad():
            X, res = self.solver(op, B.detach(), M=M, **self.options)
            if not res.converged:
                res = _not_linear(op, B, res)
        self.results.append(res)
        _check(res, self.name, self.policy, "adjoint " if adjoint else "")
        return X


def _not_linear(op: Callable[[torch.Tensor], torch.Tensor], B: torch.Tensor, res: IterationResult) -> IterationResult:
    """``res`` with a note where the operator is not linear (``A(0) != 0``: an affine map, a layer with a bias), which
    a Krylov method cannot solve and whose failure read as a tolerance below the dtype's reach (session 32's sweep).
    One application of the operator, on a failure only."""
    try:
        z = op(torch.zeros_like(B))
    except Exception:  # noqa: BLE001 - the operator's own failure on zeros says nothing about linearity
        return res
    if not isinstance(z, torch.Tensor) or not z.numel() or not bool(z.abs().amax() > 0):
        return res
    return replace(res, reason=f"{res.reason}; note that the operator is not linear: A(0) has norm "
                               f"{float(torch.linalg.vector_norm(z)):.3g}, not 0 (an affine map, e.g. a layer with a "
                               f"bias: solve for A(x) - A(0) = b - A(0) instead)")


class _OperatorSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, B: torch.Tensor, handle: OperatorHandle, *params: torch.Tensor) -> torch.Tensor:
        X = handle.run(B, adjoint=False)
        ctx.handle = handle
        ctx.save_for_backward(X)
        return X

    @staticmethod
    def backward(ctx, dX: torch.Tensor):
        (X,) = ctx.saved_tensors
        h: OperatorHandle = ctx.handle
        need_b = ctx.needs_input_grad[0]
        need_p = ctx.needs_input_grad[2:]
        grads: list[torch.Tensor | None] = [None] * len(need_p)
        if not (need_b or any(need_p)):
            return (None, None, *grads)
        lam = h.run(dX.detach(), adjoint=True)
        wanted = [i for i, need in enumerate(need_p) if need]
        if wanted:
            with torch.enable_grad():
                # the one product the parameters' gradient needs: A_p(x) with x fixed, recorded
                V = h.apply(X.detach())
                if V.requires_grad:
                    # retain_graph: the operator may close over tensors computed before the solve,
                    # whose history the outer backward pass walks too
                    got = torch.autograd.grad(V, [h.params[i] for i in wanted], grad_outputs=-lam,
                                              allow_unused=True, retain_graph=True)
                    for i, gi in zip(wanted, got):
                        grads[i] = gi
        what = f"solve with a matrix-free operator ({h.name})"
        anchors = (dX, *h.params)
        dB = first_order_only(lam, what, *anchors) if need_b else None
        grads = [first_order_only(gi, what, *anchors) for gi in grads]
        return (dB, None, *grads)


def operator_solve_function(B: torch.Tensor, handle: OperatorHandle) -> torch.Tensor:
    """``X`` with ``A X = B`` (``B`` of shape ``(n, k)``) through ``handle``, differentiable in ``B`` and
    in ``handle.params``; the graph is one node."""
    return _OperatorSolve.apply(B, handle, *handle.params)
