"""Preconditioners for the Krylov plans: ``M^-1`` (and ``M^-H`` for adjoint solves) as SciPy
linear operators, built in a plan's ``set_values`` (numeric phase), one per value-batch member.

- ``jacobi``: ``M = diag(A)``; a zero diagonal entry raises :class:`SingularMatrixError`.
- ``ilu``: SuperLU's incomplete LU (``spilu``; ``backend_options`` ``ilu_drop_tol`` and
  ``ilu_fill_factor``, SciPy's defaults 1e-4 and 10). Not symmetric, so CG and MINRES decline it.
- a callable: the user's ``M^-1`` on ``(n, k)`` torch tensors (used for adjoint solves too, as
  the torch backend does).
- ``amg``: see :mod:`sparsetorch_scipy.amg`.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping

import numpy as np
import torch

from sparsetorch import SingularMatrixError

from ._convert import Handoff

__all__ = ["Operator", "Jacobi", "ILU", "UserPreconditioner"]


def _operator_class():
    from scipy.sparse.linalg import LinearOperator

    class Operator(LinearOperator):
        """A LinearOperator whose ``matvec`` calls ``fn`` on 1-D arrays without SciPy's checks."""

        def __init__(self, n: int, dtype: Any, fn: Callable[[np.ndarray], np.ndarray]) -> None:
            super().__init__(np.dtype(dtype), (n, n))
            self._fn = fn

        def _matvec(self, x: np.ndarray) -> np.ndarray:
            return self._fn(x.reshape(-1))

        def matvec(self, x: np.ndarray) -> np.ndarray:  # the Krylov loops call this once per iteration
            return self._fn(x.reshape(-1))

    return Operator


_OPERATOR: Any = None


def Operator(n: int, dtype: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Any:
    """``fn`` as a square SciPy LinearOperator (the class is created on first use: SciPy is
    imported only when a plan needs it)."""
    global _OPERATOR
    if _OPERATOR is None:
        _OPERATOR = _operator_class()
    return _OPERATOR(n, dtype, fn)


class Jacobi:
    """``M^-1 r = r / diag(A)``."""

    name = "jacobi"

    def __init__(self, mat: Any, member: int, backend: str) -> None:
        d = np.asarray(mat.diagonal())
        zero = np.flatnonzero(d == 0)
        if zero.size:
            where = f" (value-batch member {member})" if member else ""
            raise SingularMatrixError(
                f"{backend}: the jacobi preconditioner needs a nonzero diagonal; A[{zero[0]}, {zero[0]}] is 0{where} "
                f"({zero.size} zero diagonal entries). Use preconditioner=None or 'ilu', or a direct method",
                row=int(zero[0]),
            )
        self._inv = 1.0 / d
        self._inv_h = np.conj(self._inv) if np.iscomplexobj(d) else self._inv
        self.n, self.dtype = d.shape[0], d.dtype

    def operator(self, adjoint: bool) -> Any:
        inv = self._inv_h if adjoint else self._inv
        return Operator(self.n, self.dtype, lambda r: r * inv)


class ILU:
    """SuperLU incomplete LU of ``A`` (of ``A^T`` for CSR buffers, solved transposed)."""

    name = "ilu"

    def __init__(self, handoff: Handoff, data: np.ndarray, options: Mapping[str, Any], member: int, backend: str) -> None:
        from scipy.sparse.linalg import spilu

        mat, self._transposed = handoff.csc(data)
        drop = float(options.get("ilu_drop_tol", 1e-4))
        fill = float(options.get("ilu_fill_factor", 10.0))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._ilu = spilu(mat, drop_tol=drop, fill_factor=fill)
        except RuntimeError as exc:
            where = f" (value-batch member {member})" if member else ""
            raise SingularMatrixError(
                f"{backend}: the ilu preconditioner failed{where}: {exc}; lower backend_options ilu_drop_tol "
                f"(now {drop:g}), use preconditioner='jacobi', or a direct method"
            ) from exc
        self.n, self.dtype = handoff.shape[0], data.dtype

    def operator(self, adjoint: bool) -> Any:
        ilu, complex_ = self._ilu, np.issubdtype(self.dtype, np.complexfloating)
        if not self._transposed:
            trans = ("H" if complex_ else "T") if adjoint else "N"
            return Operator(self.n, self.dtype, lambda r: ilu.solve(r, trans=trans))
        if not adjoint:
            return Operator(self.n, self.dtype, lambda r: ilu.solve(r, trans="T"))
        if complex_:
            return Operator(self.n, self.dtype, lambda r: np.conj(ilu.solve(np.conj(r), trans="N")))
        return Operator(self.n, self.dtype, lambda r: ilu.solve(r, trans="N"))


class UserPreconditioner:
    """The user's callable ``M^-1`` on ``(n, k)`` torch tensors, applied to NumPy vectors."""

    name = "user"

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], n: int, dtype: Any) -> None:
        self._fn, self.n, self.dtype = fn, n, dtype

    def operator(self, adjoint: bool) -> Any:
        fn, n = self._fn, self.n

        def apply(r: np.ndarray) -> np.ndarray:
            out = fn(torch.from_numpy(np.ascontiguousarray(r)).reshape(n, 1))
            return np.asarray(out.detach().reshape(n).cpu().numpy())

        return Operator(n, self.dtype, apply)
