"""Dense fallback for small systems: LU (or Cholesky for SPD) of ``A.to_dense()``.

Cheaper than any iterative method below a few thousand unknowns, exact to rounding, and it
solves adjoint systems from the same factors (``lu_solve(adjoint=True)``).
"""

from __future__ import annotations

import torch

from ...errors import IndefiniteMatrixError, SingularMatrixError
from ...dispatch.results import IterationResult, Status
from ...tensor import SparseTensor

__all__ = ["DenseLUPlan"]


class DenseLUPlan:
    backend = "torch"
    preconditioner = None

    def __init__(self, A: SparseTensor, *, cholesky: bool = False) -> None:
        self.method = "cholesky" if cholesky else "lu"
        self._A = A
        self._cholesky = cholesky
        self._factors = None

    def set_values(self, values: torch.Tensor) -> None:
        dense = self._A.with_values(values.detach()).to_dense()
        if self._cholesky:
            L, info = torch.linalg.cholesky_ex(dense)
            bad = _first_bad(info)
            if bad is not None:
                raise IndefiniteMatrixError(
                    f"Cholesky failed at row {bad}: the matrix is not positive definite; "
                    f"use method='lu' (or 'minres' if it is symmetric indefinite)"
                )
            self._factors = (L,)
        else:
            LU, piv, info = torch.linalg.lu_factor_ex(dense)
            # Singular means an exactly zero (or non-finite) pivot. A pivot that is merely small
            # relative to max |A| is what a badly scaled but nonsingular matrix gives (rows in
            # different units): its answer is judged by the core's residual and backward-error
            # check, which refines it or falls back, not by the pivot's size.
            diag = LU.diagonal(dim1=-2, dim2=-1)
            bad = (diag == 0) | ~torch.isfinite(diag)
            if bool(bad.any()) or _first_bad(info) is not None:
                row = int(torch.nonzero(bad.reshape(-1, bad.shape[-1]).any(0))[0, 0]) if bool(bad.any()) else _first_bad(info)
                raise SingularMatrixError(
                    f"the matrix is singular: LU (partial pivoting) met a zero pivot at column {row}; check the system "
                    f"(boundary conditions, a zero row or column) or use a least-squares method",
                    row=row,
                )
            self._factors = (LU, piv)

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options=None) -> tuple[torch.Tensor, IterationResult]:
        if self._cholesky:
            (L,) = self._factors
            X = torch.cholesky_solve(B, L)  # A is Hermitian: A^H = A
        else:
            LU, piv = self._factors
            X = torch.linalg.lu_solve(LU, piv, B, adjoint=adjoint)
        return X, IterationResult(0, float("nan"), True, Status.DIRECT, "dense factorization")


def _first_bad(info: torch.Tensor) -> int | None:
    if bool((info != 0).any()):
        return int(info[info != 0].reshape(-1)[0]) - 1
    return None
