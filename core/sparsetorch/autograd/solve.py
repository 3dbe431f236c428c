"""Adjoint rule of the sparse solve ``A X = B``.

Math (Giles, "Collected matrix derivative results"; DESIGN.md):

    forward   X = A^{-1} B
    backward  Lambda = A^{-H} dX              (one adjoint solve on the same plan)
              dB = Lambda
              dA = -Lambda X^H, kept on A's pattern: dA_vals[k] = -sum_c Lambda[row_k, c] conj(X[col_k, c])

For the adjoint direction (X = A^{-H} B): dB = A^{-1} dX = M, dA = -X M^H.

The graph holds one node whatever the iteration count, and saves only ``values`` and ``X``
(O(n + nnz) memory). The backward pass calls this same Function on the flipped handle, so it
is itself differentiable: ``create_graph=True`` gives second derivatives. ``vmap`` over the
right-hand side folds the mapped dimension into the columns (one multi-RHS solve).
"""

from __future__ import annotations

import torch

from ._fast_apply import FastFunction
from .handles import SolveHandle, sddmm, vmap_columns

__all__ = ["solve_function"]


class _Solve(FastFunction):
    @staticmethod
    def forward(values: torch.Tensor, B: torch.Tensor, handle: SolveHandle) -> torch.Tensor:
        return handle.run(values, B)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        values, B, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, output)

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


def solve_function(values: torch.Tensor, B: torch.Tensor, handle: SolveHandle) -> torch.Tensor:
    """``X`` with ``A(values) X = B`` through the plan in ``handle``, differentiable."""
    return _Solve.apply(values, B, handle)
