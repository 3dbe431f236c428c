"""Iterative plans: conjugate gradient ("cg"), BiCGSTAB ("bicgstab") for ``solve`` and least-squares
CG ("lsqr", Eigen's LeastSquaresConjugateGradient, i.e. CGLS) for ``lstsq``.

Phases: ``__init__`` keeps the zero-copy hand-off of A's pattern (int32 or int64, CSR or CSC);
``set_values`` maps the new values in place and builds the preconditioner per value-batch member
(Eigen's diagonal, IncompleteCholesky or IncompleteLUT; the ILUT of ``A^H`` for adjoint solves on
first use); ``solve`` iterates in C++ with the GIL released, one system per (member, column).

A system has converged when ``||b - A x|| <= max(rtol ||b||, atol)`` (true residual, checked at
the end; a drifted recursive residual continues from x). ``maxiter`` counts iterations (BiCGSTAB:
two products each); default ``10 n``. Statuses: MAX_ITERATIONS, BREAKDOWN (BiCGSTAB's rho ~ 0
more than 20 times, or NaN from a breakdown), INDEFINITE (CG's ``p^H A p <= 0``), NOT_FINITE.
The least-squares loop stops on LSQR's tests with ``||A||_F`` for ``||A||``: ``||r|| <= btol ||b||
+ atol ||A|| ||x||`` or ``||A^H r - damp^2 x|| <= atol ||A|| ||r||``; ``conlim`` is not estimated
(offers with a non-default ``conlim`` are declined).
"""

from __future__ import annotations

import math

from typing import Any, Mapping, Sequence

import torch

from sparsetorch import IndefiniteMatrixError, InputError, IterationResult, SparseTensor, Status

from . import _lib
from ._handoff import Handoff, plain

__all__ = ["KrylovPlan", "LeastSquaresCGPlan", "PRECONDITIONERS"]

#: sparsetorch preconditioner name -> the C++ one.
PRECONDITIONERS = {None: "none", "none": "none", "identity": "none", "jacobi": "jacobi", "ichol": "ic", "ic": "ic",
                   "ilu": "ilut", "ilut": "ilut"}
#: the options a plan reads per call (passed to solve / lstsq, never taken from the plan's build options) and
#: their defaults where a call gives None: the contract's rtol is the core's (it always passes one), maxiter None
#: is the method's own bound (10 n), check_every None every iteration. Plan-time options (preconditioner,
#: backend_options) are read once in __init__ and key the cache.
CALL_DEFAULTS: dict[str, Any] = {"rtol": 1e-6, "atol": 0.0, "btol": 1e-6, "damp": 0.0, "maxiter": None,
                                 "check_every": None, "callback": None, "stagnation": False}
_LABEL = {"cg": "Eigen CG", "bicgstab": "Eigen BiCGSTAB", "lscg": "Eigen least-squares CG (CGLS)"}


def _statuses() -> dict[int, Status]:
    lib = _lib.lib()
    return {lib.OK: Status.CONVERGED, lib.MAX_ITERATIONS: Status.MAX_ITERATIONS, lib.BREAKDOWN: Status.BREAKDOWN,
            lib.INDEFINITE: Status.INDEFINITE, lib.NOT_FINITE: Status.NOT_FINITE}


_PRIORITY = (Status.NOT_FINITE, Status.INDEFINITE, Status.BREAKDOWN, Status.MAX_ITERATIONS)


def combine(outcomes: Sequence[tuple], label: str) -> IterationResult:
    """One IterationResult for all systems (worst case), from the C++ outcomes
    ``(iterations, residual, code, message, history)``."""
    st = _statuses()
    rows = [(int(it), float(res), st.get(int(code), Status.BREAKDOWN), str(msg), tuple(h)) for it, res, code, msg, h in outcomes]
    worst_it = max((r[0] for r in rows), default=0)
    worst_res = max((r[1] for r in rows), default=0.0)
    failed = [r for r in rows if r[2] is not Status.CONVERGED]
    status, reason = Status.CONVERGED, ""
    for s in _PRIORITY:
        hit = next((r for r in failed if r[2] is s), None)
        if hit is not None:
            status, reason = s, hit[3]
            break
    if not failed:
        reason = f"{label}: converged in {worst_it} iterations" + (f" (max over {len(rows)} systems)" if len(rows) > 1 else "")
    elif len(rows) > 1:
        reason += f" ({len(failed)} of {len(rows)} systems did not converge)"
    lead = max(rows, key=lambda r: r[0]) if rows else None
    return IterationResult(worst_it, worst_res, not failed, status, reason, lead[4] if lead else ())


class _Base:
    method: str
    _cpp_method: str

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str, square: bool) -> None:
        self.backend, self.method = backend, method
        m, n = A.format_shape
        if square and m != n:
            raise InputError(f"{backend}/{method} needs a square matrix, got {m}x{n}")
        self.m, self.n = int(m), int(n)
        self.dtype = A.dtype
        self._h = Handoff(A, backend=backend)
        # the build options are read here only (preconditioner, backend_options): nothing per call is kept (_opts)
        bo = dict(options.get("backend_options") or {})
        pre = options.get("preconditioner")
        if callable(pre):
            raise InputError(f"{backend}/{method}: callable preconditioners are not supported (the loop runs in C++)")
        if pre not in PRECONDITIONERS:
            raise InputError(f"{backend}: preconditioner {pre!r} is not available (jacobi, ichol, ilu or None)")
        cpp_pre = PRECONDITIONERS[pre]
        self.preconditioner = None if cpp_pre == "none" else {"ic": "ichol", "ilut": "ilu"}.get(cpp_pre, cpp_pre)
        h = self._h
        self._it = _lib.Iterative(
            self.dtype, self._cpp_method, cpp_pre, self.m, self.n, h.indptr.data_ptr(), h.indices.data_ptr(), h.nnz,
            h.index64, h.csr, h.members, float(bo.get("ilu_drop_tol", 1e-4)), int(bo.get("ilu_fill_factor", 10)),
            float(bo.get("ichol_shift", 1e-3)))
        #: the mapped values of set_values (per-call options are not kept: they come with each solve / lstsq)
        self._values: torch.Tensor | None = None

    def set_values(self, values: torch.Tensor) -> None:
        """Map the values (no copy for CSR/CSC) and build the preconditioners."""
        self._values = None
        data = self._h.values(values)
        statuses = _lib.call(self._it.set_values, data.data_ptr())
        self._values = data  # the maps read this tensor: keep it alive
        lib = _lib.lib()
        for code, msg in statuses:
            if code == lib.INDEFINITE:
                raise IndefiniteMatrixError(f"{self.backend}/{self.method}: preconditioner ichol: {msg}; the matrix is not "
                                            f"symmetric positive definite, or needs a larger backend_options ichol_shift")
            if code != lib.OK:
                from sparsetorch import SingularMatrixError

                raise SingularMatrixError(f"{self.backend}/{self.method}: preconditioner {self.preconditioner}: {msg}; try "
                                          f"backend_options ilu_drop_tol smaller or preconditioner='jacobi'")

    def _opts(self, options: Mapping[str, Any] | None) -> dict:
        """This call's options, and nothing of another call's: the plan is cached and shared across calls and
        threads, so a per-call option left None (or absent) means the default (:data:`CALL_DEFAULTS`), never
        the value the plan was built with. (The plan's stored options were merged under them: after one
        ``maxiter=2`` call, a default call on the cached plan stopped with "maxiter=2 reached".)"""
        given = options or {}
        return {k: (given.get(k) if given.get(k) is not None else d) for k, d in CALL_DEFAULTS.items()}

    def _iterate(self, B: torch.Tensor, rows_in: int, rows_out: int, adjoint: bool, o: dict, label: str):
        if self._values is None:
            raise RuntimeError(f"{self.backend}/{self.method}: solve() before set_values()")
        k = B.shape[-1]
        Bt = plain(B.to(self.dtype).reshape(math.prod(B.shape[:-2]), rows_in, k).transpose(-1, -2))
        members = self._h.members
        if Bt.shape[0] not in (1, members) and members != 1:
            raise InputError(f"{self.backend}/{self.method}: B has {Bt.shape[0]} batch members for {members} matrices")
        X = torch.empty((Bt.shape[0], k, rows_out), dtype=self.dtype)
        maxiter = o["maxiter"]
        outs: list = []
        for i in range(Bt.shape[0]):
            j = i if members > 1 else 0
            outs += _lib.call(self._it.solve, j, Bt[i].data_ptr(), X[i].data_ptr(), k, adjoint, float(o["rtol"]),
                                   float(o["atol"]), float(o["btol"]), float(o["damp"]), -1 if maxiter is None else int(maxiter),
                                   int(o["check_every"] or 1), o["callback"], bool(o["stagnation"]))
        X = X.transpose(-1, -2).reshape(*B.shape[:-2], rows_out, k)
        return X, combine(outs, label)


class KrylovPlan(_Base):
    """Eigen's CG or BiCGSTAB with a preconditioner, on a fixed pattern (square A)."""

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str = "eigen") -> None:
        if method not in ("cg", "bicgstab"):
            raise InputError(f"{backend}: unknown Krylov method {method!r} (cg, bicgstab)")
        self._cpp_method = method
        super().__init__(A, method, options, backend=backend, square=True)

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``) with this call's ``options``."""
        label = _LABEL[self.method] + (f" + {self.preconditioner}" if self.preconditioner else "")
        return self._iterate(B, self.n, self.n, adjoint, self._opts(options), label)


class LeastSquaresCGPlan(_Base):
    """Least-squares CG (CGLS, Eigen's LeastSquaresConjugateGradient loop) for ``lstsq``: any m x n."""

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str = "eigen") -> None:
        self._cpp_method = "lscg"
        super().__init__(A, method, options, backend=backend, square=False)

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``argmin ||A X - B||^2 + damp^2 ||X||^2`` (``A^H`` when ``adjoint``)."""
        o = self._opts(options)
        rows_in, rows_out = (self.n, self.m) if adjoint else (self.m, self.n)
        label = _LABEL["lscg"] + (f" + {self.preconditioner}" if self.preconditioner else "")
        return self._iterate(B, rows_in, rows_out, adjoint, o, label)
