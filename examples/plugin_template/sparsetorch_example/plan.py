"""The example backend's solve plan: dense LU of ``A`` through SciPy (LAPACK ``getrf``/``getrs``).

A *solve plan* is the object an offer's factory builds. The core uses it like this::

    plan = offer.build(A, request)   # pattern phase: once per sparsity pattern (cached by the core)
    plan.set_values(values)          # numeric phase: once per set of values on that pattern
    X, result = plan.solve(B)                # A X = B
    X, result = plan.solve(B, adjoint=True)  # A^H X = B (the backward pass of a solve)

``values`` is ``A.values`` (shape ``(*batch, slots)``), ``B`` has shape ``(*batch, n, k)`` where
``batch`` is A's value batch (empty for one matrix), and ``X`` has the shape of ``B``. Both
arrive detached (autograd lives in the core). ``result`` is a :class:`sparsetorch.IterationResult`.

What goes where:

- ``__init__`` does everything that depends only on the *pattern*: here, where each stored value
  lands in the dense matrix. A real sparse direct solver does its ordering and symbolic
  factorization here.
- ``set_values`` does the numeric work: scatter the values into a dense Fortran-ordered buffer
  and factor it in place. It is called again (with no new ``__init__``) whenever the values
  change, so it must not assume it runs once.
- ``solve`` only uses the factors; it never refactors.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy.linalg import LinAlgWarning, lu_factor, lu_solve

import sparsetorch

__all__ = ["DenseLUPlan"]


class DenseLUPlan:
    """Dense LU of a (value-batched) sparse matrix, factored in place; CPU, float64."""

    # The core reads these three attributes (messages, SolveInfo).
    backend = "example"
    method = "lu"
    preconditioner = None

    def __init__(self, A: sparsetorch.SparseTensor, *, backend: str = "example") -> None:
        self.backend = backend
        m, n = A.format_shape
        if m != n:
            raise sparsetorch.InputError(f"{backend}/lu needs a square matrix, got {m}x{n}")
        self.n = int(n)
        self.batch_shape = tuple(A.batch_shape)
        coords, slot = A.entries()  # pattern only (cached on the tensor): coordinates and value slots
        rows, cols = coords[0].cpu().numpy(), coords[1].cpu().numpy()
        # Column-major positions, so the scattered buffer is Fortran-ordered and LAPACK can
        # factor it in place (no second n x n copy).
        self._dense_index = (cols.astype(np.int64) * self.n + rows).astype(np.intp)
        self._slot = slot.cpu().numpy().astype(np.intp)
        self._factors: list[tuple[np.ndarray, np.ndarray]] | None = None

    def set_values(self, values: torch.Tensor) -> None:
        """Factor ``A`` with these values (``A.values`` of a tensor on this plan's pattern)."""
        n = self.n
        flat = values.detach().cpu().numpy().reshape(-1, values.shape[-1])
        factors = []
        for member, v in enumerate(flat):
            dense = np.bincount(self._dense_index, weights=v[self._slot], minlength=n * n).reshape(n, n).T
            scale = float(np.abs(dense).max()) if n else 0.0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LinAlgWarning)  # we report singularity ourselves
                lu, piv = lu_factor(dense, overwrite_a=True, check_finite=False)
            pivots = np.abs(np.diagonal(lu))
            tiny = np.flatnonzero(pivots <= np.finfo(np.float64).eps * n * scale)
            if n and (scale == 0.0 or tiny.size):
                row = int(tiny[0]) if tiny.size else 0
                where = f" (batch member {member})" if flat.shape[0] > 1 else ""
                raise sparsetorch.SingularMatrixError(
                    f"{self.backend}/lu: the matrix is singular to working precision{where}: LU pivot {row} is "
                    f"{pivots[row]:.3g} (max |A| = {scale:.3g}); check the system (a zero row, missing boundary "
                    f"conditions) or use a least-squares method",
                    row=row,
                )
            factors.append((lu, piv))
        self._factors = factors

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options=None) -> tuple[torch.Tensor, sparsetorch.IterationResult]:
        """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``); ``B`` is ``(*batch, n, k)``."""
        if self._factors is None:
            raise RuntimeError(f"{self.backend}/lu: solve() before set_values()")
        n = self.n
        Bn = B.detach().cpu().numpy().reshape(-1, n, B.shape[-1])
        if len(self._factors) not in (1, Bn.shape[0]):
            raise sparsetorch.InputError(
                f"{self.backend}/lu: B has {Bn.shape[0]} batch members for {len(self._factors)} matrices "
                f"(A's batch {self.batch_shape}); B must be (*batch, n, k)"
            )
        # Real matrices: the adjoint is the transpose (LAPACK trans=1); trans=2 would conjugate too.
        trans = 1 if adjoint else 0
        X = np.empty_like(Bn)
        for i in range(Bn.shape[0]):
            lu_piv = self._factors[i if len(self._factors) > 1 else 0]
            X[i] = lu_solve(lu_piv, Bn[i], trans=trans, check_finite=False)
        out = torch.from_numpy(X).reshape(B.shape).to(B.device)
        result = sparsetorch.IterationResult(0, float("nan"), True, sparsetorch.Status.DIRECT, "dense LU (SciPy getrf/getrs)")
        return out, result

    @staticmethod
    def peak_bytes(n: int, batch: int) -> int:
        """Memory the plan holds: one n x n float64 LU per matrix plus int32 pivots."""
        return batch * (n * n * 8 + n * 4)

    def __repr__(self) -> str:
        batch = f", batch={self.batch_shape}" if self.batch_shape else ""
        state = "factored" if self._factors is not None else "no values yet"
        return f"DenseLUPlan(n={self.n}{batch}, {state})"
