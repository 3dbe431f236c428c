"""Op ``"lstsq"``, method ``"lsmr"``: cupyx's LSMR on cuSPARSE products (A and A^H, descriptors kept).

``lstsq(B, adjoint=False)`` returns the minimum-norm least-squares solution of ``A X = B``
(``A^H X = B`` when ``adjoint``), one LSMR run per (value-batch member, column). Options
(``damp``, ``atol``, ``btol``, ``conlim``, ``maxiter``) come from the request; LSMR's stop codes
map to statuses: 1-3 converged, 4-6 (``conlim`` / machine precision) BREAKDOWN, 7 MAX_ITERATIONS.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from sparsetorch import InputError, IterationResult, SparseTensor, Status

from ._cuda import numpy_dtype, on_torch_stream, to_cupy, to_torch
from ._cusparse import CusparseMatrix
from ._results import Outcome, combine

__all__ = ["LsmrPlan"]

_STOPS = {0: "x = 0 is the exact solution", 1: "A x = b is consistent to atol/btol", 2: "least-squares solution to atol",
          3: "least-squares solution to atol (conditioning)", 4: "A x = b to machine precision",
          5: "least squares to machine precision", 6: "cond(A) exceeds conlim", 7: "maxiter reached"}


class LsmrPlan:
    method = "lsmr"
    preconditioner = None

    def __init__(self, A: SparseTensor, options: Mapping[str, Any], *, backend: str = "cupy") -> None:
        self.backend = backend
        self.matrix = CusparseMatrix(A)
        self.shape = self.matrix.shape
        self.device = A.device
        self._options = dict(options)

    def set_values(self, values: torch.Tensor) -> None:
        self.matrix.set_values(values)

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        from cupyx.scipy.sparse.linalg import LinearOperator, lsmr  # noqa: PLC0415

        o = {**self._options, **{k: v for k, v in (options or {}).items() if v is not None}}
        m, n = self.shape
        rows, cols = (n, m) if adjoint else (m, n)
        Bc = B.detach().resolve_conj().reshape(-1, rows, B.shape[-1])
        members = self.matrix.members
        if members not in (1, Bc.shape[0]):
            raise InputError(f"{self.backend}/lsmr: B has {Bc.shape[0]} batch members for {members} matrices")
        X = torch.empty(Bc.shape[0], cols, Bc.shape[2], dtype=B.dtype, device=B.device)
        dtype = numpy_dtype(self.matrix.dtype)
        kw = {k: float(o[k]) for k in ("damp", "atol", "btol", "conlim") if o.get(k) is not None}
        if o.get("maxiter") is not None:
            kw["maxiter"] = int(o["maxiter"])
        outcomes = []
        with on_torch_stream(self.device) as stream:
            for i in range(Bc.shape[0]):
                mem = i if members > 1 else 0
                fwd = self.matrix.cupy_matvec(adjoint=adjoint, member=mem, stream=stream)
                bwd = self.matrix.cupy_matvec(adjoint=not adjoint, member=mem, stream=stream)
                op = LinearOperator((rows, cols), matvec=fwd, rmatvec=bwd, dtype=dtype)
                for j in range(Bc.shape[2]):
                    b = Bc[i, :, j].contiguous()
                    out = lsmr(op, to_cupy(b), **kw)
                    x, istop, itn, normr = out[0], int(out[1]), int(out[2]), float(out[3])
                    X[i, :, j] = to_torch(x)
                    bnorm = float(torch.linalg.vector_norm(b))
                    rel = normr / bnorm if bnorm > 0 else 0.0
                    if istop in (0, 1, 2, 3):
                        status, reason = Status.CONVERGED, ""
                    elif istop == 7:
                        status, reason = Status.MAX_ITERATIONS, f"lsmr reached maxiter ({kw.get('maxiter', 'default')})"
                    else:
                        status, reason = Status.BREAKDOWN, f"lsmr stopped: {_STOPS.get(istop, istop)}"
                    if not math.isfinite(rel):
                        status, reason = Status.NOT_FINITE, "lsmr produced NaN or Inf"
                    outcomes.append(Outcome(itn, rel, status, reason))
        return X.reshape(*B.shape[:-2], cols, B.shape[-1]), combine(outcomes, "cupyx lsmr")
