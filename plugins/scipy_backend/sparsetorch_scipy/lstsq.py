"""Op ``"lstsq"``: SciPy's LSQR and LSMR on a fixed pattern.

Phases: ``__init__`` keeps the zero-copy hand-off of A's pattern (any m x n); ``set_values``
wraps each value-batch member as SciPy arrays for ``A`` and ``A^H`` (views; complex values are
conjugated once per value set); ``lstsq(B, adjoint)`` runs one LSQR/LSMR per (member, column)
on a linear operator whose ``matvec``/``rmatvec`` are those two arrays (SciPy's own wrapper
would conjugate a complex matrix on every ``rmatvec``).

Per-call options (set by the core): ``damp``, ``atol``, ``btol``, ``conlim``, ``maxiter``
(LSQR's ``iter_lim``, LSMR's ``maxiter``; default ``4 n + 20`` for both: SciPy's LSMR default
``min(m, n)`` is what exact arithmetic needs and stopped short of 1e-14 in tests). SciPy's ``istop`` becomes a status: 0, 1, 2, 4, 5
converged (x = 0 exact, a compatible system solved, a least-squares solution, the same to machine
precision); 3 and 6 (condition-number estimate above ``conlim`` or 1/eps) BREAKDOWN, with the
fix in the reason; 7 MAX_ITERATIONS; NaN/Inf NOT_FINITE. The residual reported is the true
``||b - A x|| / ||b||``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch

from sparsetorch import InputError, IterationResult, SparseTensor, Status

from ._convert import Handoff, numpy_view
from ._results import Outcome, combine

__all__ = ["LstsqPlan", "LSTSQ_METHODS", "default_maxiter"]

LSTSQ_METHODS = ("lsqr", "lsmr")
_CONVERGED = (0, 1, 2, 4, 5)
_WHY = {
    3: "the condition-number estimate of A exceeded conlim ({conlim:g}): A is (nearly) rank deficient; raise conlim, "
       "add damp > 0, or accept x with on_nonconvergence='warn'",
    6: "the condition-number estimate of A exceeded 1/eps: A is numerically rank deficient; add damp > 0",
}


def default_maxiter(n: int) -> int:
    """Iterations allowed when ``maxiter`` is not given (n: A's columns)."""
    return 4 * n + 20


class LstsqPlan:
    """LSQR or LSMR (``scipy.sparse.linalg``) for ``A X ~ B`` and ``A^H X ~ B``."""

    preconditioner = None

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str = "scipy") -> None:
        if method not in LSTSQ_METHODS:
            raise InputError(f"{backend}: unknown least-squares method {method!r}; known: {LSTSQ_METHODS}")
        self.backend, self.method = backend, method
        self._h = Handoff(A, int32="auto")  # 32-bit indices for the products when they fit
        self.m, self.n = self._h.shape
        self._members: list[tuple[Any, Any]] | None = None
        self._finite: list[bool] = []

    def set_values(self, values: torch.Tensor) -> None:
        """Wrap each value-batch member's values (no copy for real values) as A and A^H."""
        self._members = None
        data = self._h.values(values)
        members, finite = [], []
        for d in data:
            adj = np.conj(d) if np.iscomplexobj(d) else d
            members.append((self._h.matrix(d), self._h.matrix(adj, transpose=True)))
            finite.append(bool(np.isfinite(d).all()))
        self._members, self._finite = members, finite

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """Minimum-norm least-squares ``X`` of ``A X = B`` (``A^H X = B`` when ``adjoint``)."""
        if self._members is None:
            raise RuntimeError(f"{self.backend}/{self.method}: lstsq() before set_values()")
        rows, cols = (self.n, self.m) if adjoint else (self.m, self.n)
        Bn = numpy_view(B).reshape(math.prod(B.shape[:-2]), rows, B.shape[-1])
        members = self._members
        if len(members) not in (1, Bn.shape[0]):
            raise InputError(f"{self.backend}/{self.method}: B has {Bn.shape[0]} batch members for {len(members)} "
                             f"matrices; B must be (*batch, {rows}, k) with A's value batch")
        o = dict(options or {})
        X = np.empty((Bn.shape[0], cols, Bn.shape[2]), dtype=Bn.dtype)
        outcomes = []
        for i in range(Bn.shape[0]):
            j = i if len(members) > 1 else 0
            fwd, adj = members[j]
            op = _operator(adj, fwd) if adjoint else _operator(fwd, adj)
            for c in range(Bn.shape[2]):
                with np.errstate(all="ignore"):
                    X[i, :, c], out = self._one(op, adj if adjoint else fwd, np.ascontiguousarray(Bn[i, :, c]),
                                                self._finite[j], o)
                outcomes.append(out)
        shape = (*B.shape[:-2], cols, B.shape[-1])
        return torch.from_numpy(X).reshape(shape), combine(outcomes, f"scipy {self.method}")

    def _one(self, op: Any, mat: Any, b: np.ndarray, finite: bool, o: Mapping[str, Any]) -> tuple[np.ndarray, Outcome]:
        import scipy.sparse.linalg as spla

        cols = op.shape[1]
        bnorm = float(np.linalg.norm(b))
        if not finite or not math.isfinite(bnorm):
            where = "A's values" if not finite else "the right-hand side"
            return np.full(cols, np.nan, dtype=b.dtype), Outcome(0, math.nan, Status.NOT_FINITE, f"{where} hold NaN or Inf")
        if bnorm == 0.0:
            return np.zeros(cols, dtype=b.dtype), Outcome(0, 0.0, Status.CONVERGED)
        damp = float(o.get("damp") or 0.0)
        atol, btol = float(o.get("atol", 1e-6)), float(o.get("btol", 1e-6))
        conlim = float(o.get("conlim") or 1e8)
        maxiter = o.get("maxiter")
        limit = int(maxiter) if maxiter is not None else default_maxiter(self.n)
        if self.method == "lsqr":
            out = spla.lsqr(op, b, damp=damp, atol=atol, btol=btol, conlim=conlim, iter_lim=limit)
        else:
            out = spla.lsmr(op, b, damp=damp, atol=atol, btol=btol, conlim=conlim, maxiter=limit)
        x, istop, itn = np.asarray(out[0], dtype=b.dtype), int(out[1]), int(out[2])
        res = float(np.linalg.norm(b - mat @ x)) / bnorm
        if not np.isfinite(x).all():
            return x, Outcome(itn, res, Status.NOT_FINITE, f"{self.method}: NaN or Inf appeared after {itn} iterations")
        if istop in _CONVERGED:
            return x, Outcome(itn, res, Status.CONVERGED)
        if istop == 7:
            said = f"{limit}" if maxiter is not None else f"{limit}, the default 4n + 20"
            return x, Outcome(itn, res, Status.MAX_ITERATIONS,
                              f"{self.method} reached maxiter ({said}) before atol={atol:g}/btol={btol:g} were met")
        why = _WHY.get(istop, "SciPy stopped with istop={istop}").format(conlim=conlim, istop=istop)
        return x, Outcome(itn, res, Status.BREAKDOWN, f"{self.method}: {why}")

    def __repr__(self) -> str:
        return f"LstsqPlan({self.method}, {self.m}x{self.n})"


def _operator(fwd: Any, adj: Any) -> Any:
    """A LinearOperator with ``fwd @ x`` and ``adj @ x`` (both SciPy arrays, no copies per call)."""
    from scipy.sparse.linalg import LinearOperator

    return LinearOperator(fwd.shape, matvec=lambda x: fwd @ x, rmatvec=lambda x: adj @ x, dtype=fwd.dtype)
