"""Op ``"logdet"``, method ``"lu"``: ``slogdet`` from SuperLU's factors, and solves from the same
factors (the logdet gradient needs them).

SuperLU factors ``Pr F Pc = L U`` with L unit lower triangular, where F is A (CSC input) or A^T
(CSR buffers read as CSC: det(A^T) = det(A), transpose without conjugation). So

    det(A) = sign(Pr) sign(Pc) prod_i U_ii,    log|det A| = sum_i log|U_ii|,
    sign   = sign(Pr) sign(Pc) prod_i U_ii / |U_ii|   (+-1 for real, a unit complex number otherwise),

all in log space (no overflow or underflow however large n is), accumulated in float64. A
permutation's sign is ``(-1)^(n - cycles)``, cycles counted as connected components of the graph
``i -> perm[i]`` (O(n), in C). An exactly zero pivot (SuperLU: "Factor is exactly singular")
gives ``sign = 0, logabsdet = -inf`` for that member (no raise); solving with it raises
:class:`SingularMatrixError`.

The ordering follows :func:`sparsetorch_scipy.lu.ordering_options` (SuperLU's symmetric mode on
structurally symmetric patterns, COLAMD otherwise). Reading U's diagonal copies U once per value
set (SciPy exposes the factors only as matrices).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import numpy as np
import torch

from sparsetorch import BackendError, InputError, IterationResult, SingularMatrixError, SparseTensor, Status

from ._convert import Handoff, numpy_view
from .lu import ordering_options

__all__ = ["LogdetPlan", "permutation_sign"]


def permutation_sign(perm: np.ndarray) -> int:
    """+1 or -1: the sign of the permutation ``i -> perm[i]`` (``(-1)^(n - cycles)``)."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    n = perm.shape[0]
    if n == 0:
        return 1
    graph = sp.csr_array((np.ones(n, dtype=np.int8), (np.arange(n), np.asarray(perm, dtype=np.int64))), shape=(n, n))
    cycles, _ = connected_components(graph, directed=True, connection="weak")
    return -1 if (n - cycles) % 2 else 1


class LogdetPlan:
    """SuperLU factors per value-batch member: ``slogdet`` and ``solve`` (``adjoint`` too)."""

    method = "lu"
    preconditioner = None

    def __init__(self, A: SparseTensor, options: Mapping[str, Any], *, backend: str = "scipy") -> None:
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/lu (logdet) needs a square matrix, got {m}x{n}")
        self.backend, self.n = backend, int(n)
        self._h = Handoff(A, int32=True)
        self.splu_options = ordering_options(self._h.structurally_symmetric(), options.get("backend_options") or {})
        self._transposed = self._h.kind == "csr"  # the factors hold A^T
        self._lus: list[Any] | None = None
        self._slogdet: list[tuple[complex | float, float]] = []
        self._complex = False
        #: factorizations run so far (one per value-batch member per set_values)
        self.factorizations = 0

    def set_values(self, values: torch.Tensor) -> None:
        """Factor every member; a singular one keeps ``None`` (slogdet 0, -inf)."""
        from scipy.sparse.linalg import splu

        self._lus = None
        data = self._h.values(values)
        self._complex = np.iscomplexobj(data)
        self._batch = tuple(values.shape[:-1])
        self._dtype = values.dtype
        lus, dets = [], []
        for member, d in enumerate(data):
            mat, _ = self._h.csc(d)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    lu = splu(mat, **self.splu_options)
            except RuntimeError as exc:
                if "singular" not in str(exc).lower():
                    raise BackendError(f"{self.backend}/lu (logdet): splu failed{_where(member, len(data))}: {exc}") from exc
                lus.append(None)
                dets.append((0.0, -math.inf))
                continue
            self.factorizations += 1
            lus.append(lu)
            dets.append(self._from_factors(lu))
        self._lus, self._slogdet = lus, dets

    def _from_factors(self, lu: Any) -> tuple[complex | float, float]:
        diag = np.asarray(lu.U.diagonal())
        mag = np.abs(diag)
        if not (mag > 0).all():  # SuperLU stores an exact zero pivot only when it did not stop: be safe
            return 0.0, -math.inf
        logabs = float(np.sum(np.log(mag.astype(np.float64))))
        perm = permutation_sign(lu.perm_r) * permutation_sign(lu.perm_c)
        if np.iscomplexobj(diag):
            phase = float(np.sum(np.angle(diag.astype(np.complex128))))
            return perm * complex(math.cos(phase), math.sin(phase)), logabs
        negatives = int(np.count_nonzero(diag < 0))
        return float(perm * (-1 if negatives % 2 else 1)), logabs

    def slogdet(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sign, logabsdet)``, each of shape ``(*batch,)``."""
        if self._lus is None:
            raise RuntimeError(f"{self.backend}/lu: slogdet() before set_values()")
        dtype = self._dtype
        real = torch.empty((), dtype=dtype).real.dtype
        sign = torch.tensor([s for s, _ in self._slogdet], dtype=dtype).reshape(self._batch)
        logabs = torch.tensor([la for _, la in self._slogdet], dtype=real).reshape(self._batch)
        return sign, logabs

    def solve(self, B: torch.Tensor, *, adjoint: bool = False) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``) from the kept factors."""
        if self._lus is None:
            raise RuntimeError(f"{self.backend}/lu: solve() before set_values()")
        n = self.n
        Bn = numpy_view(B).reshape(-1, n, B.shape[-1])
        lus = self._lus
        if len(lus) not in (1, Bn.shape[0]):
            raise InputError(f"{self.backend}/lu: B has {Bn.shape[0]} batch members for {len(lus)} matrices")
        X = np.empty(Bn.shape, dtype=Bn.dtype)
        for i in range(Bn.shape[0]):
            j = i if len(lus) > 1 else 0
            lu = lus[j]
            if lu is None:
                raise SingularMatrixError(f"{self.backend}/lu: the matrix{_where(j, len(lus))} is singular (SuperLU found "
                                          f"an exactly zero pivot; its determinant is 0): no solve, and no logdet gradient")
            X[i] = self._solve_one(lu, Bn[i], adjoint)
        return torch.from_numpy(X).reshape(B.shape), IterationResult(0, math.nan, True, Status.DIRECT, "SuperLU solve")

    def _solve_one(self, lu: Any, b: np.ndarray, adjoint: bool) -> np.ndarray:
        complex_ = np.iscomplexobj(b)
        if not self._transposed:  # factors of A
            return lu.solve(b, trans=("H" if complex_ else "T") if adjoint else "N")
        # factors of F = A^T:  A x = b <=> F^T x = b;  A^H x = b <=> F conj(x) = conj(b)
        if not adjoint:
            return lu.solve(b, trans="T")
        if complex_:
            return np.conj(lu.solve(np.conj(b), trans="N"))
        return lu.solve(b, trans="N")

    def __repr__(self) -> str:
        return f"LogdetPlan(n={self.n}, {self.splu_options['permc_spec']})"


def _where(member: int, members: int) -> str:
    return f" (value-batch member {member})" if members > 1 else ""
