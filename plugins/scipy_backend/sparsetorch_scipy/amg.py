"""Algebraic multigrid through PyAMG: method ``"amg"`` (V-cycles as the solver) and the
preconditioner ``"amg"`` (one V-cycle per Krylov iteration).

The hierarchy is the numeric phase: built in ``set_values`` (one per value-batch member), kept
for every solve on those values. ``backend_options``:

- ``"amg"``: ``"smoothed_aggregation"`` (default; real and complex) or ``"ruge_stuben"``
  (classical AMG; real only),
- ``"amg_cycle"``: ``"V"`` (default), ``"W"`` or ``"F"``,
- ``"amg_reuse"``: when a hierarchy is rebuilt for new values (:class:`HierarchyReuse`):
  ``"values"`` (default) rebuilds whenever the values differ from those it was built on (equal
  values in a new tensor keep it); ``"pattern"`` builds once per pattern and keeps it for every
  later value set; a number ``tol >= 0`` keeps it while ``||v - v_built||_2 <= tol ||v_built||_2``
  (``v_built``: the values of the last rebuild, so small changes that add up still trigger one).
  A kept hierarchy gets the *current* matrix as its finest level (residuals and fine-level
  smoothing use it; the coarse levels are the old Galerkin products), so a Krylov method still
  converges to the current system: only the iteration count can grow. For CG the cycle stays
  symmetric positive definite (symmetric smoothing with the current SPD matrix, SPD coarse
  operators). Only the preconditioner offers reuse: plain V-cycles (method ``"amg"``) with stale
  coarse levels over-correct smooth error modes and can diverge (measured: 2-D Poisson 32² with
  the diagonal raised by 7-15 % diverged), so :class:`AMGPlan` rejects any policy but "values".

PyAMG needs CSR with int32 indices: CSR input hands over its values without a copy (int64
indices are narrowed once per pattern), other formats are gathered into CSR once per value set.
Smoothed aggregation uses ``symmetry="hermitian"`` for complex and ``"symmetric"`` for real
Hermitian matrices, ``"nonsymmetric"`` otherwise. For the preconditioner on a non-Hermitian A
(GMRES, BiCGStab, ...), adjoint solves get a second hierarchy, built on ``A^H`` at the first
adjoint solve of a value set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from sparsetorch import InputError, IterationResult, SparseTensor, Status
from sparsetorch.backend import trivial_system

from ._convert import Handoff, numpy_view
from ._results import Outcome, Progress, Stop, combine
from .precond import Operator

__all__ = ["AMGPlan", "AMGPreconditioner", "HierarchyReuse", "build_hierarchy", "reuse_tolerance", "AMG_KINDS",
           "DEFAULT_MAXITER"]

AMG_KINDS = ("smoothed_aggregation", "ruge_stuben")
#: V-cycles allowed when ``maxiter`` is not given (Poisson needs 10-30 at rtol 1e-6..1e-10).
DEFAULT_MAXITER = 200


def amg_kind(options: Mapping[str, Any]) -> str:
    kind = options.get("amg", "smoothed_aggregation")
    aliases = {"sa": "smoothed_aggregation", "rs": "ruge_stuben", "classical": "ruge_stuben"}
    kind = aliases.get(kind, kind)
    if kind not in AMG_KINDS:
        raise InputError(f"backend_options amg={options.get('amg')!r} is not a PyAMG solver; use one of {AMG_KINDS}")
    return kind


def _cycle(options: Mapping[str, Any]) -> str:
    cycle = str(options.get("amg_cycle", "V")).upper()
    if cycle not in ("V", "W", "F"):
        raise InputError(f"backend_options amg_cycle={cycle!r} must be 'V', 'W' or 'F'")
    return cycle


#: Why method "amg" keeps no hierarchy across value changes (also the plugin's decline).
SOLVER_REUSE = ("backend_options amg_reuse other than 'values' is for preconditioner='amg' only: plain V-cycles with a "
                "kept hierarchy's stale coarse levels can diverge; use method='cg' with preconditioner='amg' (CG converges "
                "with any symmetric positive definite cycle)")


def reuse_tolerance(options: Mapping[str, Any]) -> float:
    """``backend_options["amg_reuse"]`` as a relative tolerance: "values" -> 0, "pattern" -> inf."""
    value = options.get("amg_reuse", "values")
    if value == "values":
        return 0.0
    if value == "pattern":
        return math.inf
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and not math.isnan(value):
        return float(value)
    raise InputError(f"backend_options amg_reuse={value!r} is not a reuse policy; use 'values' (rebuild on every value "
                     f"change, the default), 'pattern' (build once per pattern) or a relative tolerance >= 0 such as 0.05")


@dataclass
class _Kept:
    ml: Any
    data: np.ndarray | None  # the values it was built on (None under "pattern": never compared)
    hermitian: bool


class HierarchyReuse:
    """The AMG hierarchies of one plan, by key (value-batch member, direction), and the rule that
    decides whether new values get a new one (``backend_options["amg_reuse"]``, see the module
    docstring). ``builds`` and ``reuses`` count the decisions."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.tol = reuse_tolerance(options)
        self.builds = 0
        self.reuses = 0
        self._kept: dict[Any, _Kept] = {}

    def _close(self, old: np.ndarray | None, new: np.ndarray) -> bool:
        if self.tol == math.inf:
            return True
        if old is None or old.shape != new.shape:
            return False
        if self.tol == 0.0:
            return bool(np.array_equal(old, new))
        return float(np.linalg.norm(new - old)) <= self.tol * float(np.linalg.norm(old))

    def hierarchy(self, key: Any, mat: Any, data: np.ndarray, kind: str, hermitian: bool) -> Any:
        """A hierarchy for the CSR array ``mat`` (values ``data``): the kept one with ``mat`` as its
        finest level when the policy allows, else a new one (kept for later value sets)."""
        kept = self._kept.get(key)
        if kept is not None and kept.hermitian == hermitian and self._close(kept.data, data):
            kept.ml.levels[0].A = mat  # residuals and fine-level smoothing use the current matrix
            self.reuses += 1
            return kept.ml
        ml = build_hierarchy(mat, kind, hermitian)
        self._kept[key] = _Kept(ml, None if self.tol == math.inf else np.array(data, copy=True), hermitian)
        self.builds += 1
        return ml


def build_hierarchy(mat: Any, kind: str, hermitian: bool) -> Any:
    """A PyAMG multilevel solver for the CSR array ``mat``."""
    import pyamg

    if kind == "ruge_stuben":
        return pyamg.ruge_stuben_solver(mat)
    symmetry = ("hermitian" if np.iscomplexobj(mat.data) else "symmetric") if hermitian else "nonsymmetric"
    return pyamg.smoothed_aggregation_solver(mat, symmetry=symmetry)


class AMGPreconditioner:
    """One V-cycle (``aspreconditioner``) of a hierarchy on ``A``; on ``A^H`` for adjoint solves."""

    name = "amg"

    def __init__(self, handoff: Handoff, data: np.ndarray, options: Mapping[str, Any], *, hermitian: bool,
                 reuse: HierarchyReuse | None = None, member: int = 0) -> None:
        self._h, self._data, self._kind, self._cycle = handoff, data, amg_kind(options), _cycle(options)
        self.hermitian = hermitian
        self.n, self.dtype = handoff.shape[0], data.dtype
        self._reuse = reuse if reuse is not None else HierarchyReuse({})
        self._member = member
        self.ml = self._reuse.hierarchy((member, False), handoff.matrix(data), data, self._kind, hermitian)
        self._ml_adj: Any = None

    def operator(self, adjoint: bool) -> Any:
        ml = self.ml
        if adjoint and not self.hermitian:
            if self._ml_adj is None:
                data = np.conj(self._data) if np.iscomplexobj(self._data) else self._data
                adj = self._h.matrix(data, transpose=True).tocsr()  # A^H as CSR (a copy: PyAMG needs CSR)
                self._ml_adj = self._reuse.hierarchy((self._member, True), adj, self._data, self._kind, False)
            ml = self._ml_adj
        P = ml.aspreconditioner(cycle=self._cycle)
        return Operator(self.n, self.dtype, P.matvec)


class AMGPlan:
    """PyAMG as the solver: cycles until ``||b - A x|| <= max(rtol ||b||, atol)``.

    Offered for Hermitian positive definite matrices (the adjoint solve is then the same solve)."""

    method = "amg"
    preconditioner = None

    def __init__(self, A: SparseTensor, options: Mapping[str, Any], *, backend: str = "scipy") -> None:
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/amg needs a square matrix, got {m}x{n}")
        self.backend, self.n = backend, int(n)
        bo = options.get("backend_options") or {}
        self.kind, self.cycle = amg_kind(bo), _cycle(bo)
        if reuse_tolerance(bo) != 0.0:
            raise InputError(SOLVER_REUSE)
        self._h = Handoff(A, int32=True, kinds=("csr",))
        #: the hierarchies and the rule for rebuilding them (backend_options amg_reuse)
        self.amg_reuse = HierarchyReuse(bo)
        self._members: list[tuple[Any, Any, bool]] | None = None

    @property
    def setups(self) -> int:
        """Hierarchies built so far (at most one per value-batch member per set_values)."""
        return self.amg_reuse.builds

    def set_values(self, values: torch.Tensor) -> None:
        """One hierarchy per value-batch member (new, or kept per ``amg_reuse``)."""
        self._members = None
        members = []
        for i, d in enumerate(self._h.values(values)):
            mat = self._h.matrix(d)
            finite = bool(np.isfinite(d).all())
            ml = self.amg_reuse.hierarchy((i, False), mat, d, self.kind, True) if finite else None
            members.append((mat, ml, finite))
        self._members = members

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """Cycles for every column; ``adjoint`` solves the same system (A is Hermitian)."""
        if self._members is None:
            raise RuntimeError(f"{self.backend}/amg: solve() before set_values()")
        o = {k: v for k, v in (options or {}).items() if k == "callback" or v is not None}
        n = self.n
        Bn = numpy_view(B).reshape(-1, n, B.shape[-1])
        if len(self._members) not in (1, Bn.shape[0]):
            raise InputError(f"{self.backend}/amg: B has {Bn.shape[0]} batch members for {len(self._members)} matrices")
        X = np.empty(Bn.shape, dtype=Bn.dtype)
        outcomes = []
        for i in range(Bn.shape[0]):
            mat, ml, finite = self._members[i if len(self._members) > 1 else 0]
            for j in range(Bn.shape[2]):
                with np.errstate(all="ignore"):  # overflow and NaN are reported as statuses
                    X[i, :, j], out = self._solve_system(mat, ml, finite, np.ascontiguousarray(Bn[i, :, j]), o)
                outcomes.append(out)
        return torch.from_numpy(X).reshape(B.shape), combine(outcomes, f"pyamg {self.kind} ({self.cycle}-cycles)")

    def _solve_system(self, mat: Any, ml: Any, finite: bool, b: np.ndarray, o: Mapping[str, Any]) -> tuple[np.ndarray, Outcome]:
        rtol, atol = float(o.get("rtol", 1e-6)), float(o.get("atol", 0.0))
        bnorm, thr, done = trivial_system(b, finite, rtol, atol, xp=np)
        if done is not None:
            return done
        maxiter = o.get("maxiter")
        limit = int(maxiter) if maxiter is not None else DEFAULT_MAXITER
        residuals: list[float] = []
        history: list[float] = []

        def residual_of(x: np.ndarray) -> float:
            return float(np.linalg.norm(b - mat @ x)) / bnorm

        prog = _CycleWatch(mat, residual_of, o.get("callback"), o.get("check_every") or 1, history)
        try:
            with np.errstate(all="ignore"):
                x, info = ml.solve(b, tol=thr / bnorm, maxiter=limit, cycle=self.cycle, residuals=residuals,
                                   callback=prog, return_info=True)
        except Stop as s:
            x = s.x if s.x is not None else np.zeros_like(b)
            return x, Outcome(prog.count, residual_of(x), s.status, f"amg: {s.reason}", history)
        x = np.asarray(x, dtype=b.dtype).reshape(-1)
        its = max(len(residuals) - 1, 0)
        res = float(np.linalg.norm(b - mat @ x))
        rel = res / bnorm
        history = history or [r / bnorm for r in residuals[1:]]
        if not math.isfinite(res):
            return x, Outcome(its, rel, Status.NOT_FINITE, "amg: the residual became NaN or Inf", history)
        if res <= thr:
            return x, Outcome(its, rel, Status.CONVERGED, "", history)
        reason = (f"amg reached maxiter ({limit} {self.cycle}-cycles{'' if maxiter is not None else ', the default'}) with "
                  f"relative residual {rel:.2e} above the tolerance (rtol={rtol:g}, atol={atol:g})")
        return x, Outcome(its, rel, Status.MAX_ITERATIONS, reason, history)

    def __repr__(self) -> str:
        return f"AMGPlan({self.kind}, n={self.n})"


class _CycleWatch(Progress):
    """The per-cycle callback of :class:`AMGPlan`: also checks that each correction ``e`` has
    ``e^H A e > 0`` (one product per cycle). For a positive definite A that always holds, so a
    failure proves A indefinite (reported as INDEFINITE, like CG's check)."""

    def __init__(self, mat: Any, residual_of: Any, user: Any, every: int, history: list[float]) -> None:
        super().__init__("x", residual_of, user, every, 0, history, finite_every=1)
        self._mat = mat
        self._prev: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> None:
        super().__call__(x)
        e = x if self._prev is None else x - self._prev
        curv = np.vdot(e, self._mat @ e).real
        if not curv > 0 and e.any():
            raise Stop(Status.INDEFINITE, f"cycle {self.count} made a correction e with e^H A e = {curv:.3g} <= 0: "
                                          f"A is not positive definite", np.array(x, copy=True))
        self._prev = np.array(x, copy=True)
