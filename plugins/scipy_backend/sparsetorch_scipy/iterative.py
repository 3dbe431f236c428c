"""Krylov methods of ``scipy.sparse.linalg``: cg, bicgstab, gmres, lgmres, gcrotmk, minres, tfqmr.

Phases: ``__init__`` keeps the zero-copy hand-off of A's pattern (and, for the AMG
preconditioner, an int32 CSR one); ``set_values`` wraps the values as SciPy arrays (views, no
copy) and builds the preconditioner (Jacobi diagonal, ILU factors, AMG hierarchy); ``solve``
iterates, one system per (value-batch member, right-hand side). Adjoint solves use ``A^H``: the
same buffers read in the other layout (CSR of A = CSC of A^T; complex values conjugated once
per value set, on first use) and the preconditioner's ``M^-H``.

Tolerances are mapped exactly: a system has converged when ``||b - A x|| <= max(rtol ||b||,
atol)``. SciPy is given that threshold as ``atol`` (``rtol=0``), and the true residual is checked
afterwards: MINRES (whose SciPy stopping test is ``||r|| / (||A|| ||x||)``), TFQMR (a residual
bound of the left-preconditioned system) and rounding drift can stop early; the solve then
continues from ``x`` with a tighter threshold (a few times at most, counted in the iterations
and within ``maxiter``). ``maxiter`` counts what SciPy counts: iterations, restart cycles for
GMRES, outer iterations for LGMRES and GCROT(m, k) (``restart`` is their inner length: LGMRES's
``inner_m``, GCROT's ``m``; GCROT keeps ``k = m`` recycled vectors, SciPy's default). Status: SciPy's ``info > 0`` is MAX_ITERATIONS, ``< 0``
BREAKDOWN; NaN/Inf is NOT_FINITE; CG checks ``p^H A p > 0`` for every search direction and
reports INDEFINITE otherwise: it runs SciPy's CG loop (:func:`_checked_cg`, the same operations)
with the check on the product the loop computes for its step length, at no extra cost (a check
in the operator cost one more dot product per iteration, 3-5 % of CG's time measured on 2-D
Poisson); ``backend_options={"curvature_check": False}`` calls ``scipy.sparse.linalg.cg`` itself. A user ``callback(iteration,
residual)`` is called every ``check_every`` iterations (default 1) of each system in turn, with
the true relative residual (GMRES: SciPy's preconditioned residual estimate, which it has for
free).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np
import torch

from sparsetorch import InputError, IterationResult, SparseTensor, Status
from sparsetorch.backend import (
    Run, from_real, maxiter_reason, realified_matvec, to_real, trivial_system, true_residual_solve,
)

from ._convert import Handoff, numpy_view
from ._results import Outcome, Progress, Stop, combine
from .precond import ILU, Jacobi, Operator, UserPreconditioner

__all__ = ["KrylovPlan", "KRYLOV", "DEFAULT_RESTART"]

KRYLOV = ("cg", "bicgstab", "gmres", "lgmres", "gcrotmk", "minres", "tfqmr")
#: GMRES restart length, LGMRES inner iterations and GCROT's m when ``restart=`` is not given.
DEFAULT_RESTART = 30
#: Continuations from the true residual when SciPy stopped on an estimate that the true
#: residual does not meet (MINRES needs more: its own test is weaker than ||r|| <= tol).
_REFRESHES = {"minres": 8}
_DEFAULT_REFRESHES = 4
#: Methods whose true residual is watched for stagnation (Progress.watch_stagnation): their residual wanders, and
#: a run that stopped improving ran to maxiter before the direct method after it was tried
_STAGNATION = frozenset({"bicgstab", "cgs"})

#: Methods whose ``maxiter`` counts outer iterations (SciPy's default: 1000).
_OUTER = ("lgmres", "gcrotmk")


class _Member:
    """One value-batch member: its matrix (a view), its adjoint (on first use), its preconditioner."""

    def __init__(self, handoff: Handoff, data: np.ndarray, pre: Any) -> None:
        self.handoff, self.data, self.pre = handoff, data, pre
        self.mat = handoff.matrix(data)
        self.finite = bool(np.isfinite(data).all())
        self._adj: Any = None

    def matrix(self, adjoint: bool) -> Any:
        if not adjoint:
            return self.mat
        if self._adj is None:
            data = np.conj(self.data) if np.iscomplexobj(self.data) else self.data
            self._adj = self.handoff.matrix(data, transpose=True)  # A^H: no copy for real values
        return self._adj


class KrylovPlan:
    """One SciPy Krylov method with its preconditioner, on a fixed pattern."""

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str = "scipy") -> None:
        if method not in KRYLOV:
            raise InputError(f"{backend}: unknown Krylov method {method!r}; known: {KRYLOV}")
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/{method} needs a square matrix, got {m}x{n}")
        self.backend, self.method, self.n = backend, method, int(n)
        self._h = Handoff(A, int32="auto")  # 32-bit indices for the products when they fit
        self._options = dict(options)
        self._bo: Mapping[str, Any] = options.get("backend_options") or {}
        pre = options.get("preconditioner")
        self._pre_fn: Callable | None = pre if callable(pre) else None
        name = "user" if callable(pre) else (None if pre in (None, "none", "identity") else str(pre))
        if name not in (None, "jacobi", "ilu", "amg", "user"):
            raise InputError(f"{backend}: preconditioner {pre!r} is not available (jacobi, ilu, amg, None or a callable)")
        self.preconditioner = name
        self._amg_h = Handoff(A, int32=True, kinds=("csr",)) if name == "amg" else None
        if name == "amg":
            from .amg import HierarchyReuse

            #: AMG hierarchies kept across value sets per backend_options amg_reuse
            self.amg_reuse: Any = HierarchyReuse(self._bo)
        self.restart = int(options.get("restart") or DEFAULT_RESTART)
        self._members: list[_Member] | None = None

    # Numeric phase --------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """Wrap the values (no copy) and build the preconditioner, per value-batch member."""
        self._members = None
        data = self._h.values(values)
        amg_data = self._amg_h.values(values) if self._amg_h is not None else None
        members = []
        for i, d in enumerate(data):
            member = _Member(self._h, d, None)
            member.pre = self._build_preconditioner(i, member, None if amg_data is None else amg_data[i])
            members.append(member)
        self._members = members

    def _build_preconditioner(self, i: int, member: _Member, amg_data: np.ndarray | None) -> Any:
        name = self.preconditioner
        if name is None or not member.finite:
            return None  # a NaN matrix is reported by solve (NOT_FINITE), not by a preconditioner
        if name == "jacobi":
            return Jacobi(member.mat, i, self.backend)
        if name == "ilu":
            return ILU(self._h, member.data, self._bo, i, self.backend)
        if name == "amg":
            from .amg import AMGPreconditioner

            return AMGPreconditioner(self._amg_h, amg_data, self._bo, hermitian=self._h.is_hermitian(member.data),
                                     reuse=self.amg_reuse, member=i)
        return UserPreconditioner(self._pre_fn, self.n, member.data.dtype)

    # Solve ------------------------------------------------------------------------------------------
    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``), one SciPy solve per column, with
        this call's ``options`` (rtol, atol, maxiter, check_every, callback)."""
        if self._members is None:
            raise RuntimeError(f"{self.backend}/{self.method}: solve() before set_values()")
        o = {**self._options, **{k: v for k, v in (options or {}).items() if k == "callback" or v is not None}}
        n = self.n
        Bn = numpy_view(B).reshape(-1, n, B.shape[-1])
        members = self._members
        if len(members) not in (1, Bn.shape[0]):
            raise InputError(f"{self.backend}/{self.method}: B has {Bn.shape[0]} batch members for {len(members)} "
                             f"matrices; B must be (*batch, n, k) with A's value batch")
        X = np.empty(Bn.shape, dtype=Bn.dtype)
        outcomes: list[Outcome] = []
        for i in range(Bn.shape[0]):
            mem = members[i if len(members) > 1 else 0]
            raw = mem.matrix(adjoint)
            M = mem.pre.operator(adjoint) if mem.pre is not None else None
            for j in range(Bn.shape[2]):
                with np.errstate(all="ignore"):  # overflow and NaN are reported as statuses
                    x, out = self._solve_system(raw, M, np.ascontiguousarray(Bn[i, :, j]), mem.finite, o)
                X[i, :, j] = x
                outcomes.append(out)
        label = f"scipy {self.method}" + (f" + {self.preconditioner}" if self.preconditioner else "")
        return torch.from_numpy(X).reshape(B.shape), combine(outcomes, label)

    def _solve_system(self, raw: Any, M: Any, b: np.ndarray, finite: bool, o: Mapping[str, Any]) -> tuple[np.ndarray, Outcome]:
        import scipy.sparse.linalg as spla

        method = self.method
        rtol, atol = float(o.get("rtol", 1e-6)), float(o.get("atol", 0.0))
        bnorm, thr, done = trivial_system(b, finite, rtol, atol, xp=np)
        if done is not None:
            return done
        checked_cg = method == "cg" and self._bo.get("curvature_check", True)
        fn = _checked_cg if checked_cg else getattr(spla, method)
        products = [0]
        A = self._operator(raw, products, b.dtype)
        history: list[float] = []
        maxiter = o.get("maxiter")
        budget = maxiter if maxiter is not None else (1000 if method in _OUTER else None)
        finite_every = [8]  # 1 after a NaN breakdown: restart from the last finite iterate

        def residual_of(x: np.ndarray) -> float:
            return float(np.linalg.norm(b - raw @ x)) / bnorm

        # SciPy's MINRES uses unconjugated inner products (real only): a Hermitian system runs as
        # the equivalent real symmetric one of size 2n, [Re A, -Im A; Im A, Re A] [Re x; Im x].
        realify = method == "minres" and np.iscomplexobj(b)
        A_s, M_s, b_s = (_realified(A), None if M is None else _realified(M), to_real(b, np)) if realify else (A, M, b)
        to_s = (lambda v: to_real(v, np)) if realify else (lambda v: v)
        from_s = from_real if realify else (lambda v: v)

        def run(x0: np.ndarray | None, *, tol: float, remaining: int | None, iterations: int, attempt: int,
                residual: float) -> Run:
            # the checked CG loop finds NaN/Inf itself, before they reach x: no finiteness scans or
            # copies of the iterate in the callback (two vector passes every 8 iterations)
            prog = Progress("residual" if method == "gmres" else "x", lambda v: residual_of(from_s(v)), o.get("callback"),
                            o.get("check_every") or 1, iterations, history, 2**62 if checked_cg else finite_every[0])
            if method == "tfqmr":  # SciPy's TFQMR has no breakdown test of its own (rho = 0 gives NaN)
                prog.watch_residual(residual / bnorm if x0 is not None else 1.0)
                prog.good = x0
            elif method in _STAGNATION and o.get("stagnation"):  # no 1 % gain in max(1000, n) iterations: stopped
                window = max(1000, int(b.shape[0]))
                prog.watch_stagnation(window, max(16, window // 32), residual / bnorm if x0 is not None else 1.0)
            stop: Stop | None = None
            try:
                xs, info = fn(A_s, b_s, x0=None if x0 is None else to_s(x0), M=M_s, callback=prog,
                              **self._kwargs(tol, bnorm, remaining))
                x = from_s(np.asarray(xs).reshape(-1))
            except Stop as s:
                stop, info = s, 0
                if s.x is not None:
                    x = from_s(s.x)
                elif s.status in (Status.NOT_FINITE, Status.BREAKDOWN):
                    x = x0 if x0 is not None else np.zeros_like(b)
                else:
                    x = from_s(prog.last) if prog.last is not None else (x0 if x0 is not None else np.zeros_like(b))
            # LGMRES and GCROT call back at the start of each outer iteration, the converged one included
            its = prog.count - 1 if (method in _OUTER and info == 0 and stop is None and prog.count) else prog.count
            used = math.ceil(its / self.restart) if method == "gmres" else its
            if stop is None:
                return Run(x, its, used, info)
            # NaN/Inf from finite A and b is a breakdown of the recurrence (TFQMR divides by a zero
            # rho): restart from the last finite iterate, as for SciPy's own breakdowns.
            restartable = stop.status in (Status.NOT_FINITE, Status.BREAKDOWN)
            if restartable:
                finite_every[0] = 1
            return Run(x, its, used, stop=stop.status, reason=f"{method}: {stop.reason}", restartable=restartable)

        def breakdown_reason(info: int, total: int, rel: float) -> str:
            # A Lanczos-type breakdown (BiCGStab's rho or omega, TFQMR's v^T r*): the loop restarts
            # from x, which renews the shadow residual, and gives up only when restarts stop helping.
            return (f"SciPy's {method} broke down (info={info}) after {total} iterations with relative residual "
                    f"{rel:.2e}, and restarting from x did not help: try gmres (the most robust) or a preconditioner")

        x, total, res, status, reason = true_residual_solve(
            run, lambda x: float(np.linalg.norm(b - raw @ x)), method=method, x=None, bnorm=bnorm, thr=thr,
            budget=budget, refreshes=_REFRESHES.get(method, _DEFAULT_REFRESHES),
            maxiter_reason=lambda rel: self._maxiter_reason(maxiter, rel, rtol, atol),
            # SciPy's own test passed but the true residual does not: continue from x, tighter.
            tighten=lambda tol, res: tol * max(thr / res, 1e-3) * 0.5,
            exhausted_hint="the tolerance may be below what rounding allows; loosen rtol/atol or use a direct method",
            breakdown_reason=breakdown_reason)
        return x, Outcome(total, res / bnorm, status, reason, history, products[0])

    def _operator(self, raw: Any, products: list[int], dtype: Any) -> Any:
        """``raw`` as a LinearOperator that counts products (CG's curvature is checked by
        :func:`_checked_cg` on the product it computes anyway)."""

        def mv(v: np.ndarray) -> np.ndarray:
            products[0] += 1
            return raw @ v

        return Operator(self.n, dtype, mv)

    def _kwargs(self, tol: float, bnorm: float, maxiter: int | None) -> dict[str, Any]:
        method = self.method
        if method == "minres":
            kw: dict[str, Any] = {"rtol": tol / bnorm}
        else:
            kw = {"rtol": 0.0, "atol": tol}
        kw["maxiter"] = maxiter
        if method == "gmres":
            kw.update(restart=self.restart, callback_type="pr_norm")
        elif method == "lgmres":
            kw.update(inner_m=self.restart)
        elif method == "gcrotmk":
            kw.update(m=self.restart)
        return kw

    def _maxiter_reason(self, maxiter: Any, rel: float, rtol: float, atol: float) -> str:
        unit = {"gmres": " restart cycles", "lgmres": " outer iterations", "gcrotmk": " outer iterations"}.get(self.method, "")
        return maxiter_reason(self.method, maxiter, rel, rtol, atol, default="SciPy default", unit=unit)

    def __repr__(self) -> str:
        return f"KrylovPlan({self.method}, preconditioner={self.preconditioner}, n={self.n})"


def _checked_cg(A: Any, b: np.ndarray, x0: np.ndarray | None = None, *, rtol: float = 1e-5, atol: float = 0.0,
                maxiter: int | None = None, M: Any = None, callback: Callable | None = None) -> tuple[np.ndarray, int]:
    """SciPy's ``cg`` (scipy.sparse.linalg, 1.12+: the same NumPy operations in the same order,
    so the same iterates bit for bit) that also stops with INDEFINITE when a search direction has
    ``p^H A p <= 0``. SciPy computes that product for its step length anyway; checking it there
    costs nothing, where a check inside the operator costs one more dot product per iteration
    (measured 3-5 % of CG's time on 2-D Poisson 256²..1000²). ``A``/``M``: square operators of
    ``b``'s dtype (``M`` None: no preconditioner); ``b`` 1-D."""
    n = b.shape[0]
    x = np.zeros(n, dtype=b.dtype) if x0 is None else np.array(x0, dtype=b.dtype).reshape(-1)
    bnrm2 = np.linalg.norm(b)
    atol = max(float(atol), float(rtol) * float(bnrm2))
    if bnrm2 == 0:
        return b, 0
    if maxiter is None:
        maxiter = n * 10
    dotprod = np.vdot if np.iscomplexobj(x) else np.dot
    matvec = A.matvec
    psolve = M.matvec if M is not None else None
    r = b - matvec(x) if x.any() else b.copy()
    rho_prev, p = None, None
    for iteration in range(maxiter):
        if np.linalg.norm(r) < atol:
            return x, 0
        z = psolve(r) if psolve is not None else r
        rho_cur = dotprod(r, z)
        if iteration > 0:
            beta = rho_cur / rho_prev
            p *= beta
            p += z
        else:
            p = np.empty_like(r)
            p[:] = z[:]
        q = matvec(p)
        curv = dotprod(p, q)
        if not curv.real > 0 and p.any():
            raise Stop(Status.INDEFINITE, f"CG met a search direction with p^H A p = {curv.real:.3g} <= 0 (iteration "
                                          f"{iteration + 1}): A is not positive definite")
        alpha = rho_cur / curv
        if not np.isfinite(alpha):
            # a NaN/Inf reaches every later iterate through alpha (p, q, rho feed it): x is still
            # the last finite iterate, so no per-iteration copy of x is needed to report it
            raise Stop(Status.NOT_FINITE, f"a NaN or Inf appeared at iteration {iteration + 1} (step length "
                                          f"{alpha!r})", x)
        x += alpha * p
        r -= alpha * q
        rho_prev = rho_cur
        if callback:
            callback(x)
    return x, maxiter


def _realified(op: Any) -> Any:
    """The real 2n x 2n operator of a complex n x n one (Hermitian stays symmetric)."""
    n = op.shape[0]
    return Operator(2 * n, np.finfo(op.dtype).dtype, realified_matvec(op.matvec, n, np))
