"""Adjoint rule of the nonlinear solve ``F(u*, theta) = 0`` (implicit function theorem).

Math (DESIGN.md; e.g. Blondel et al., "Efficient and modular implicit differentiation"):

    forward   u* with F(u*, theta) = 0, found by any iteration (Newton, Anderson, Picard),
              run without recording a graph
    backward  J = dF/du at (u*, theta)
              solve J^T lambda = dL/du*           (one adjoint solve: the transpose solve of the
                                                   linear solver's plan, or GMRES on VJPs)
              dL/dtheta = -lambda^T dF/dtheta      (one VJP of F with respect to the parameters)

Differentiating ``F(u*(theta), theta) = 0`` gives ``J du*/dtheta = -dF/dtheta``, so
``dL/dtheta = dL/du* . du*/dtheta = -(J^-T dL/du*)^T dF/dtheta``. Neither the iteration count
nor the iterates enter: the graph is one node that saves ``u*`` and the parameters (O(n) on top
of what the caller already holds), and the backward pass holds one Jacobian (O(nnz)) or, matrix
free, one graph of ``F``. ``u0`` gets no gradient (the root does not depend on it, as long as
the iteration lands on the same root).

The backward pass is not itself differentiable (``once_differentiable``): second derivatives
through a nonlinear solve would need the derivative of the adjoint system, not implemented.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["implicit_solve"]


class _ImplicitSolve(torch.autograd.Function):
    @staticmethod
    def forward(handle, *leaves: torch.Tensor) -> torch.Tensor:
        return handle.run(leaves)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        handle, *leaves = inputs
        ctx.handle = handle
        ctx.save_for_backward(output, *leaves)

    @staticmethod
    @once_differentiable
    def backward(ctx, du: torch.Tensor):
        u, *leaves = ctx.saved_tensors
        need = ctx.needs_input_grad[1:]
        if not any(need):
            return (None,) * (1 + len(leaves))
        h = ctx.handle
        lam = h.adjoint(u, leaves, du)  # J^T lam = dL/du at u*
        grads = h.param_vjp(u, leaves, lam, need)  # -lam^T dF/dtheta
        return (None, *grads)


def implicit_solve(handle, leaves: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``u*`` from ``handle.run(leaves)``, differentiable in ``leaves`` by the adjoint method.

    ``handle`` provides ``run(leaves) -> u*`` (the forward iteration), ``adjoint(u, leaves, g)
    -> lambda`` (solves ``J^T lambda = g`` at ``u``) and ``param_vjp(u, leaves, lambda, need)``
    (``-lambda^T dF/dleaf`` for each leaf whose ``need`` is true, ``None`` for the others).
    """
    return _ImplicitSolve.apply(handle, *leaves)
