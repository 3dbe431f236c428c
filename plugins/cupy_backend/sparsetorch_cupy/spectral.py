"""Op ``"eigsh"``, method ``"lanczos"``: cupyx's thick-restart Lanczos on cuSPARSE products.

The plan protocol of docs/backend-authors.md: ``__init__`` builds the descriptors,
``set_values`` points them at the values, ``eigsh(k, which=...)`` returns ``w`` ascending
``(*batch, k)`` and orthonormal ``V`` ``(*batch, n, k)``. cupyx supports ``which`` in LA, SA, LM
and neither shift-invert (``sigma``) nor a mass matrix ``M``: the backend declines those. The
result carries the largest residual ``||A v - w v|| / max|w|`` and the number of products.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from sparsetorch import InputError, IterationResult, SparseTensor, Status

from ._cuda import cupy, numpy_dtype, on_torch_stream, to_cupy, to_torch
from ._cusparse import CusparseMatrix
from .precond import linear_operator

__all__ = ["LanczosPlan", "WHICH"]

WHICH = ("LA", "SA", "LM")


class LanczosPlan:
    method = "lanczos"
    preconditioner = None

    def __init__(self, A: SparseTensor, *, backend: str = "cupy") -> None:
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/lanczos needs a square matrix, got {m}x{n}")
        self.backend, self.n, self.device = backend, int(n), A.device
        self.matrix = CusparseMatrix(A)

    def set_values(self, values: torch.Tensor) -> None:
        self.matrix.set_values(values)

    def eigsh(self, k: int, *, which: str = "LA", sigma: float | None = None, M: Any = None, tol: float = 0.0,
              maxiter: int | None = None, v0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, IterationResult]:
        import cupyx.scipy.sparse.linalg as cla  # noqa: PLC0415

        if sigma is not None or M is not None:
            raise InputError(f"{self.backend}/lanczos: cupyx's eigsh has no shift-invert (sigma) and no mass matrix (M); "
                             f"use the scipy backend (ARPACK) for those")
        if which not in WHICH:
            raise InputError(f"{self.backend}/lanczos: which={which!r} is not supported by cupyx; use one of {WHICH}")
        n = self.n
        if not 0 < k < n:
            raise InputError(f"{self.backend}/lanczos: k must satisfy 0 < k < n = {n}, got k={k}")
        cp = cupy()
        dtype = numpy_dtype(self.matrix.dtype)
        real = torch.empty((), dtype=self.matrix.dtype).real.dtype
        members = self.matrix.members
        W = torch.empty(members, k, dtype=real, device=self.device)
        V = torch.empty(members, n, k, dtype=self.matrix.dtype, device=self.device)
        worst, products = 0.0, 0
        params = inspect.signature(cla.eigsh).parameters
        with on_torch_stream(self.device) as stream:
            for i in range(members):
                mv = self.matrix.cupy_matvec(member=i, stream=stream)
                count = [0]

                def counted(x: Any, mv=mv, count=count) -> Any:
                    count[0] += 1
                    return mv(x)

                op = linear_operator(n, dtype, counted)
                kw: dict[str, Any] = {"k": k, "which": which, "tol": tol}
                if maxiter is not None:
                    kw["maxiter"] = maxiter
                if v0 is not None and "v0" in params:
                    kw["v0"] = to_cupy(v0.reshape(-1, n)[i if v0.dim() > 1 else 0].contiguous())
                w, vecs = cla.eigsh(op, **kw)
                order = cp.argsort(w)
                w, vecs = w[order], vecs[:, order]
                wt, vt = to_torch(cp.ascontiguousarray(w)), to_torch(cp.ascontiguousarray(vecs))
                res = to_torch(cp.ascontiguousarray(cp.stack([mv(vecs[:, j]) for j in range(k)], axis=1))) - vt * wt
                scale = max(float(wt.abs().max()), 1e-300)
                worst = max(worst, float(torch.linalg.vector_norm(res, dim=0).max()) / scale)
                W[i], V[i] = wt.to(real), vt
                products += count[0]
        shape = tuple(self.matrix._source.batch_shape)
        eps = torch.finfo(real).eps
        ok = math.isfinite(worst) and worst <= max(tol, math.sqrt(eps))
        status = Status.CONVERGED if ok else Status.MAX_ITERATIONS
        reason = (f"cupyx Lanczos: {products} products with A, largest relative eigen-residual {worst:.1e}" if ok else
                  f"cupyx Lanczos stopped with relative eigen-residual {worst:.1e} (above {max(tol, math.sqrt(eps)):.1e}): "
                  f"raise maxiter or ncv")
        info = IterationResult(products, worst, ok, status, reason)
        return W.reshape(*shape, k), V.reshape(*shape, n, k), info
