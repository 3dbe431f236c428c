"""Preconditioners on the GPU, built in a Krylov plan's ``set_values`` (one per value-batch member).

- ``jacobi``: ``M = diag(A)``; ``M^-1 r = r / diag(A)`` (a zero diagonal entry raises
  :class:`SingularMatrixError` naming it).
- ``ilu``: ILU(0) by cuSPARSE (``csrilu02`` through ``cupyx.cusparse``, int32 indices), split
  once per pattern into a strictly lower ``L`` (unit diagonal implied) and an upper ``U``;
  ``M^-1 r = U^-1 L^-1 r`` and ``M^-H r = L^-H U^-H r`` by cuSPARSE triangular solves (SpSM).
  Not symmetric, so CG and MINRES decline it.
- a callable: the user's ``M^-1`` on ``(n, 1)`` torch tensors (DLPack both ways, no copy).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from sparsetorch import SingularMatrixError, SparseTensor
from sparsetorch.format import CSR
from sparsetorch.backend import conversion

from ._cuda import mark_canonical, cupy, to_cupy, to_torch

__all__ = ["Jacobi", "ILU0Pattern", "UserPreconditioner", "linear_operator"]


def linear_operator(n: int, dtype: Any, fn: Callable[[Any], Any]) -> Any:
    from cupyx.scipy.sparse.linalg import LinearOperator  # noqa: PLC0415

    return LinearOperator((n, n), matvec=fn, dtype=dtype)


def diagonal(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """``(members, n)`` diagonals from entry coordinates and ``(members, nnz)`` values (duplicates sum)."""
    mask = rows == cols
    d = torch.zeros(values.shape[0], n, dtype=values.dtype, device=values.device)
    return d.index_add_(1, rows[mask].to(torch.int64), values[:, mask])


class Jacobi:
    name = "jacobi"

    def __init__(self, diag: torch.Tensor, member: int, backend: str) -> None:
        zero = torch.nonzero(diag == 0).flatten()
        if zero.numel():
            i = int(zero[0])
            where = f" (value-batch member {member})" if member else ""
            raise SingularMatrixError(
                f"{backend}: the jacobi preconditioner needs a nonzero diagonal; A[{i}, {i}] is 0{where} "
                f"({zero.numel()} zero diagonal entries). Use preconditioner=None or 'ilu', or method='qr'", row=i)
        inv = (1.0 / diag).contiguous()
        self._inv = to_cupy(inv)
        self._inv_h = to_cupy(inv.conj().resolve_conj()) if inv.is_complex() else self._inv
        self.n = diag.shape[0]

    def operator(self, adjoint: bool, dtype: Any) -> Any:
        inv = self._inv_h if adjoint else self._inv
        return linear_operator(self.n, dtype, lambda r: r.reshape(-1) * inv)


class ILU0Pattern:
    """The pattern work of ILU(0): int32 CSR of A and the slots of its two triangles."""

    def __init__(self, A: SparseTensor) -> None:
        n = A.format_shape[0]
        if A.nse >= 2**31 - 1 or n >= 2**31 - 1:
            raise SingularMatrixError(f"ILU(0) through cuSPARSE needs int32 indices; A has {A.nse} entries")
        self._source = A
        self._conv = conversion(A, CSR, torch.int32)
        pos, crd = self._conv.pos[1].to(torch.int32), self._conv.crd[1].to(torch.int32)
        self.indptr, self.indices, self.n = pos.contiguous(), crd.contiguous(), int(n)
        counts = (pos[1:] - pos[:-1]).to(torch.int64)
        rows = torch.repeat_interleave(torch.arange(n, device=pos.device, dtype=torch.int64), counts)
        cols = crd.to(torch.int64)
        lower, upper = cols < rows, cols >= rows
        self.lower_slots = torch.nonzero(lower).flatten()
        self.upper_slots = torch.nonzero(upper).flatten()
        self.L_indptr = _indptr(rows[lower], n)
        self.U_indptr = _indptr(rows[upper], n)
        self.L_indices = crd[lower].contiguous()
        self.U_indices = crd[upper].contiguous()
        self.has_diagonal = torch.zeros(n, dtype=torch.bool, device=pos.device)
        self.has_diagonal[rows[rows == cols]] = True

    def csr_values(self, values: torch.Tensor) -> torch.Tensor:
        return self._conv.apply(self._source.with_values(values.detach())).values.reshape(-1, self.indices.numel())

    def factor(self, data: torch.Tensor, member: int, backend: str) -> "ILU0":
        return ILU0(self, data, member, backend)


def _indptr(rows: torch.Tensor, n: int) -> torch.Tensor:
    counts = torch.bincount(rows, minlength=n)
    out = torch.zeros(n + 1, dtype=torch.int32, device=rows.device)
    out[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return out


class ILU0:
    name = "ilu"

    def __init__(self, pat: ILU0Pattern, data: torch.Tensor, member: int, backend: str) -> None:
        import cupyx  # noqa: PLC0415
        import cupyx.cusparse  # noqa: PLC0415, F401
        import cupyx.scipy.sparse as csp  # noqa: PLC0415

        where = f" (value-batch member {member})" if member else ""
        missing = torch.nonzero(~pat.has_diagonal).flatten()
        if missing.numel():
            i = int(missing[0])
            raise SingularMatrixError(f"{backend}: ILU(0) needs every diagonal entry stored; A[{i}, {i}] is not{where}. "
                                      f"Use preconditioner='jacobi' or None", row=i)
        n = pat.n
        a = csp.csr_matrix((to_cupy(data.clone()), to_cupy(pat.indices), to_cupy(pat.indptr)), shape=(n, n))
        try:
            cupyx.cusparse.csrilu02(a)
        except (ValueError, RuntimeError) as exc:
            raise SingularMatrixError(f"{backend}: ILU(0) failed{where}: {exc}; use preconditioner='jacobi' or None, or "
                                      f"method='qr'") from exc
        lu = to_torch(a.data)
        if not bool(torch.isfinite(lu).all()):
            raise SingularMatrixError(f"{backend}: ILU(0) produced NaN/Inf{where} (a zero pivot); use preconditioner='jacobi'")
        self.L = csp.csr_matrix((to_cupy(lu[pat.lower_slots].contiguous()), to_cupy(pat.L_indices), to_cupy(pat.L_indptr)),
                                shape=(n, n))
        self.U = csp.csr_matrix((to_cupy(lu[pat.upper_slots].contiguous()), to_cupy(pat.U_indices), to_cupy(pat.U_indptr)),
                                shape=(n, n))
        mark_canonical(self.L)
        mark_canonical(self.U)
        self.n = n

    def operator(self, adjoint: bool, dtype: Any) -> Any:
        from cupyx.cusparse import spsm  # noqa: PLC0415

        L, U = self.L, self.U
        if not adjoint:
            def apply(r: Any) -> Any:
                y = spsm(L, r.reshape(-1), lower=True, unit_diag=True)
                return spsm(U, y, lower=False)
        else:
            def apply(r: Any) -> Any:
                y = spsm(U, r.reshape(-1), lower=False, transa="H")
                return spsm(L, y, lower=True, unit_diag=True, transa="H")
        return linear_operator(self.n, dtype, apply)


class UserPreconditioner:
    name = "user"

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], n: int) -> None:
        self._fn, self.n = fn, n

    def operator(self, adjoint: bool, dtype: Any) -> Any:
        fn, n = self._fn, self.n
        cp = cupy()

        def apply(r: Any) -> Any:
            out = fn(to_torch(cp.ascontiguousarray(r.reshape(-1))).reshape(n, 1))
            return to_cupy(out.detach().reshape(n).contiguous())

        return linear_operator(n, dtype, apply)
