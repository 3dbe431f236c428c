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
"""

from __future__ import annotations

import torch

from ._fast_apply import FastFunction
from . import products
from .handles import SolveHandle, vmap_columns
from .sddmm import sddmm

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
    from .handles import MatmulHandle  # noqa: PLC0415
    from .matmul import matmul_function  # noqa: PLC0415

    return matmul_function(dvalues, X, MatmulHandle(products.product_state(h.A, X), h.A, h.adjoint))


def solve_function(values: torch.Tensor, B: torch.Tensor, handle: SolveHandle) -> torch.Tensor:
    """``X`` with ``A(values) X = B`` through the plan in ``handle``, differentiable."""
    return _Solve.apply(values, B, handle)
