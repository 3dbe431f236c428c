"""Method ``"spmm"``: ``Y = A @ X`` and ``Y = A^H @ X`` with cuSPARSE, descriptors made once.

The plan holds a :class:`~sparsetorch_cupy._cusparse.CusparseMatrix`; ``set_values`` points it
at the new values (a view for CSR/CSC input, one gather otherwise), ``apply`` swaps the ``x``/``y`` pointers into
the kept descriptors and calls ``cusparseSpMV`` (one column) or ``cusparseSpMM`` (several).
"""

from __future__ import annotations

import torch

from sparsetorch import SparseTensor

from ._cusparse import CusparseMatrix

__all__ = ["SpmmPlan"]


class SpmmPlan:
    """Sparse @ dense on a fixed pattern; values set by :meth:`set_values`."""

    method = "spmm"
    preconditioner = None

    def __init__(self, A: SparseTensor, *, backend: str = "cupy") -> None:
        self.backend = backend
        self.matrix = CusparseMatrix(A)
        self.shape = self.matrix.shape
        self._ready = False

    def set_values(self, values: torch.Tensor) -> None:
        self.matrix.set_values(values)
        self._ready = True

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        """``A @ X`` (``A^H @ X`` when ``adjoint``) for ``X`` of shape ``(*batch, n, k)``."""
        if not self._ready:
            raise RuntimeError(f"{self.backend}/spmm: apply() before set_values()")
        return self.matrix.apply(X, adjoint=adjoint)

    def __repr__(self) -> str:
        return f"SpmmPlan({self.matrix.kind}, shape={self.shape}, nnz={self.matrix.nnz})"
