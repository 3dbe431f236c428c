"""Method ``"qr"``: cuSolverSp's sparse QR (``cupyx.scipy.sparse.linalg.spsolve``), only on request.

cuSolverSp has no factorization object to keep: every right-hand side re-factors. The plan keeps
the int32 CSR pattern (and, for adjoint solves, the transposed pattern), gathers the values once
per value set, and solves column by column. It is slower than a CPU LU (measured on the H200:
2.9 s for a 90k-unknown 2-D Poisson system where SciPy's SuperLU takes 0.8 s), which is why the
backend offers it only for ``method="qr"``.

A singular matrix is found from the answer: a non-finite ``x`` or a relative residual above
``1e-6`` (float64) / ``1e-2`` (float32) raises :class:`SingularMatrixError`.
"""

from __future__ import annotations

import math

import torch

from sparsetorch import InputError, IterationResult, SingularMatrixError, SparseTensor, Status
from sparsetorch.format import CSR
from sparsetorch.backend import conversion

from ._cuda import mark_canonical, on_torch_stream, to_cupy, to_torch

__all__ = ["QRPlan"]

_RESIDUAL_LIMIT = {torch.float64: 1e-6, torch.complex128: 1e-6, torch.float32: 1e-2, torch.complex64: 1e-2}


class QRPlan:
    method = "qr"
    preconditioner = None

    def __init__(self, A: SparseTensor, *, backend: str = "cupy") -> None:
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/qr needs a square matrix, got {m}x{n}")
        if A.nse >= 2**31 - 1:
            raise InputError(f"{backend}/qr: cuSolverSp needs int32 indices; A has {A.nse} entries")
        self.backend, self.n, self.device, self.dtype = backend, int(n), A.device, A.dtype
        self._source = A
        self._conv = conversion(A, CSR, torch.int32)
        self._indptr = self._conv.pos[1].to(torch.int32).contiguous()
        self._indices = self._conv.crd[1].to(torch.int32).contiguous()
        self._values: torch.Tensor | None = None
        self._t_perm: torch.Tensor | None = None  # slots of A^T's CSR in A's CSR order
        self._t_indptr: torch.Tensor | None = None
        self._t_indices: torch.Tensor | None = None

    def set_values(self, values: torch.Tensor) -> None:
        vals = self._conv.apply(self._source.with_values(values.detach())).values
        self._values = vals.reshape(-1, self._indices.numel()).contiguous()

    def _transpose(self) -> None:
        n = self.n
        counts = (self._indptr[1:] - self._indptr[:-1]).to(torch.int64)
        rows = torch.repeat_interleave(torch.arange(n, device=self.device), counts)
        cols = self._indices.to(torch.int64)
        order = torch.argsort(cols * n + rows)  # A^T's CSR: sorted by (col, row)
        self._t_perm = order
        self._t_indices = rows[order].to(torch.int32).contiguous()
        tc = torch.bincount(cols, minlength=n)
        ptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        ptr[1:] = torch.cumsum(tc, 0).to(torch.int32)
        self._t_indptr = ptr

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options=None) -> tuple[torch.Tensor, IterationResult]:
        import cupyx.scipy.sparse as csp  # noqa: PLC0415
        from cupyx.scipy.sparse.linalg import spsolve  # noqa: PLC0415

        if self._values is None:
            raise RuntimeError(f"{self.backend}/qr: solve() before set_values()")
        n = self.n
        if adjoint:
            if self._t_perm is None:
                self._transpose()
            vals = self._values[:, self._t_perm]
            vals = vals.conj().resolve_conj() if vals.is_complex() else vals
            indptr, indices = self._t_indptr, self._t_indices
        else:
            vals, indptr, indices = self._values, self._indptr, self._indices
        Bc = B.detach().resolve_conj().reshape(-1, n, B.shape[-1])
        if vals.shape[0] not in (1, Bc.shape[0]):
            raise InputError(f"{self.backend}/qr: B has {Bc.shape[0]} batch members for {vals.shape[0]} matrices")
        X = torch.empty_like(Bc)
        limit = _RESIDUAL_LIMIT[self.dtype]
        with on_torch_stream(self.device):
            for i in range(Bc.shape[0]):
                v = vals[i if vals.shape[0] > 1 else 0].contiguous()
                mat = csp.csr_matrix((to_cupy(v), to_cupy(indices), to_cupy(indptr)), shape=(n, n))
                mark_canonical(mat)
                for j in range(Bc.shape[2]):
                    b = Bc[i, :, j].contiguous()
                    x = to_torch(spsolve(mat, to_cupy(b)))
                    bnorm = float(torch.linalg.vector_norm(b))
                    ok = bool(torch.isfinite(x).all())
                    res = float(torch.linalg.vector_norm(to_torch(mat @ to_cupy(x)) - b)) / bnorm if ok and bnorm > 0 else 0.0
                    if not ok or res > limit:
                        raise SingularMatrixError(
                            f"{self.backend}/qr: A{' (value-batch member %d)' % i if i else ''} is singular to working "
                            f"precision: cuSolverSp QR returned {'NaN/Inf' if not ok else f'a relative residual {res:.1e}'}; "
                            f"check A for zero rows/columns, or use a least-squares method")
                    X[i, :, j] = x
        return X.reshape(B.shape), IterationResult(0, math.nan, True, Status.DIRECT, "cuSolverSp sparse QR (csrlsvqr)")

    def __repr__(self) -> str:
        return f"QRPlan(n={self.n})"
