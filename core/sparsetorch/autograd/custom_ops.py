"""``torch.library`` custom ops: sparse products that ``torch.compile`` can trace.

``sparsetorch::csr_matmul(crow, col, values, X, n_rows, n_cols)`` is ``A @ X`` for a CSR matrix
given by its buffers and a dense ``X`` of shape ``(n_cols, k)``. It has a fake (meta)
implementation, so ``torch.compile`` traces through it without a graph break, and an autograd
formula (the same adjoint rule as :mod:`sparsetorch.autograd.matmul`):

    dX = A^H dY      dvalues[k] = sum_c dY[row_k, c] conj(X[col_k, c])

``SparseTensor`` objects themselves are not traceable values; inside compiled code pass the
buffers (``A.pos(1)``, ``A.crd(1)``, ``A.values`` of a CSR tensor).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tensor.interop.torch_io import compressed_tensor

__all__ = ["csr_matmul"]


def _rows(crow: Tensor, nnz: int) -> Tensor:
    counts = (crow[1:] - crow[:-1]).long()
    return torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), counts, output_size=nnz)


@torch.library.custom_op("sparsetorch::csr_matmul", mutates_args=())
def csr_matmul(crow: Tensor, col: Tensor, values: Tensor, X: Tensor, n_rows: int, n_cols: int) -> Tensor:
    """``A @ X`` for ``A = csr(crow, col, values)`` of shape ``(n_rows, n_cols)``, ``X`` ``(n_cols, k)``."""
    return compressed_tensor("csr", crow, col, values, (n_rows, n_cols)) @ X


@csr_matmul.register_fake
def _(crow, col, values, X, n_rows, n_cols):
    return X.new_empty((n_rows, X.shape[1]))


def _setup_context(ctx, inputs, output) -> None:
    crow, col, values, X, n_rows, n_cols = inputs
    ctx.save_for_backward(crow, col, values, X)
    ctx.n_cols = n_cols


def _backward(ctx, dY: Tensor):
    crow, col, values, X = ctx.saved_tensors
    rows = _rows(crow, col.numel())
    cols = col.long()
    dvalues = dX = None
    if ctx.needs_input_grad[2]:
        Xc = X.conj() if X.is_complex() else X
        dvalues = (dY[rows] * Xc[cols]).sum(-1)
    if ctx.needs_input_grad[3]:
        vc = values.conj() if values.is_complex() else values
        dX = dY.new_zeros((ctx.n_cols, dY.shape[1])).index_add(0, cols, vc[:, None] * dY[rows])
    return None, None, dvalues, dX, None, None


csr_matmul.register_autograd(_backward, setup_context=_setup_context)
