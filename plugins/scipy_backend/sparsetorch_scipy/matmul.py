"""Method ``"spmm"``: ``Y = A @ X`` and ``Y = A^H @ X`` with SciPy's compressed-sparse kernels.

``X`` reaches SciPy as a NumPy view of the torch tensor and ``Y`` comes back as a torch view of
SciPy's result: no copies besides the product itself. ``A`` is a view of the user's buffers
(CSR/CSC) or a CSR gathered once per value set (other formats). ``A^H`` reads the same buffers
in the other layout (``A^T``), with the values conjugated once per value set for complex A. One
vector (``k = 1``) goes through SciPy's matvec kernel, several through its multi-vector kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sparsetorch import InputError, SparseTensor

from ._convert import Handoff, numpy_view

__all__ = ["SpmmPlan"]


class SpmmPlan:
    """Sparse @ dense on a fixed pattern; values set by :meth:`set_values`."""

    method = "spmm"
    preconditioner = None

    def __init__(self, A: SparseTensor, *, backend: str = "scipy") -> None:
        self.backend = backend
        self._h = Handoff(A, int32="auto")  # 32-bit indices for the products when they fit
        self.shape = self._h.shape
        self._mats: list[Any] | None = None
        self._adjs: list[Any] | None = None
        self._data: np.ndarray | None = None

    def set_values(self, values: torch.Tensor) -> None:
        """Wrap the new values (views for CSR/CSC input; the adjoint is built on first use)."""
        self._data = self._h.values(values)
        self._mats = [self._h.matrix(d) for d in self._data]
        self._adjs = None

    def _adjoints(self) -> list[Any]:
        if self._adjs is None:
            assert self._data is not None
            complex_ = np.iscomplexobj(self._data)
            self._adjs = [self._h.matrix(np.conj(d) if complex_ else d, transpose=True) for d in self._data]
        return self._adjs

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        """``A @ X`` (``A^H @ X`` when ``adjoint``) for ``X`` of shape ``(*batch, n, k)``."""
        if self._mats is None:
            raise RuntimeError(f"{self.backend}/spmm: apply() before set_values()")
        mats = self._adjoints() if adjoint else self._mats
        m, n = self.shape
        rows, cols = (n, m) if adjoint else (m, n)
        k = X.shape[-1]
        if X.numel() == 0 or rows == 0:
            # an empty operand (no columns in X, A with no rows or columns): the product is zeros,
            # and NumPy cannot infer a batch of size-0 members (reshape(-1, 0, k))
            dtype = torch.from_numpy(np.empty(0, dtype=np.result_type(self._data, numpy_view(X)))).dtype
            return torch.zeros(*X.shape[:-2], rows, k, dtype=dtype)
        Xn = numpy_view(X).reshape(-1, cols, k)
        if len(mats) not in (1, Xn.shape[0]):
            raise InputError(f"{self.backend}/spmm: X has {Xn.shape[0]} batch members for {len(mats)} matrices")
        if Xn.shape[0] == 1:
            Y = mats[0] @ Xn[0, :, 0] if k == 1 else mats[0] @ Xn[0]
            out = torch.from_numpy(np.ascontiguousarray(Y))
        else:
            Yb = np.empty((Xn.shape[0], rows, k), dtype=np.result_type(self._data, Xn))  # type: ignore[arg-type]
            for i in range(Xn.shape[0]):
                mat = mats[i if len(mats) > 1 else 0]
                Yb[i] = (mat @ Xn[i, :, 0])[:, None] if k == 1 else mat @ Xn[i]
            out = torch.from_numpy(Yb)
        return out.reshape(*X.shape[:-2], rows, k)
