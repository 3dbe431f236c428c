"""Krylov methods of ``cupyx.scipy.sparse.linalg`` (cg, gmres, minres, cgs) on cuSPARSE products.

Phases: ``__init__`` builds the :class:`~sparsetorch_cupy._cusparse.CusparseMatrix` (descriptors
made once, re-used by every product of every iteration) and, for ILU(0), the int32 CSR pattern
and its triangles; ``set_values`` points the descriptors at the new values and builds the
preconditioner; ``solve`` runs one cupyx solve per (value-batch member, right-hand side) on
torch's current stream, with ``b`` and ``x`` crossing by DLPack.

Tolerances are exact: a system has converged when ``||b - A x|| <= max(rtol ||b||, atol)``,
checked on the true residual after cupyx stops (cupyx tests its recursive residual; MINRES
tests ``||r|| / (||A|| ||x||)``). When the true residual misses, the solve continues on the
correction ``A d = b - A x`` with a tighter threshold (a few times at most, within ``maxiter``).
``maxiter`` counts iterations, restart cycles for GMRES. CG records ``v^H A v <= 0`` for the
vectors it multiplies on the device (no extra synchronization) and reports INDEFINITE.
Adjoint solves use ``A^H`` (the CSR descriptor of the transposed pattern) and ``M^-H``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import numpy as np
import torch

from sparsetorch import InputError, IterationResult, SparseTensor, Status
from sparsetorch.backend import (
    Run, from_real, maxiter_reason, realified_matvec, to_real, trivial_system, true_residual_solve,
)

from ._cuda import cupy, numpy_dtype, on_torch_stream, to_cupy, to_torch
from ._cusparse import CusparseMatrix
from ._results import Outcome, combine
from .precond import ILU0Pattern, Jacobi, UserPreconditioner, diagonal, linear_operator

__all__ = ["KrylovPlan", "KRYLOV", "DEFAULT_RESTART"]

KRYLOV = ("cg", "gmres", "minres", "cgs")
#: GMRES restart length when ``restart=`` is not given (cupyx's own default is 20).
DEFAULT_RESTART = 30
_REFRESHES = 4
#: MINRES stops on ||r|| / (||A|| ||x||), weaker than the true residual test: more continuations.
_REFRESHES_MINRES = 8


class KrylovPlan:
    """One cupyx Krylov method with its preconditioner, on a fixed pattern."""

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str = "cupy") -> None:
        if method not in KRYLOV:
            raise InputError(f"{backend}: unknown Krylov method {method!r}; known: {KRYLOV}")
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/{method} needs a square matrix, got {m}x{n}")
        self.backend, self.method, self.n = backend, method, int(n)
        self.matrix = CusparseMatrix(A)
        self.device = A.device
        self._options = dict(options)
        pre = options.get("preconditioner")
        self._pre_fn: Callable | None = pre if callable(pre) else None
        name = "user" if callable(pre) else (None if pre in (None, "none", "identity") else str(pre))
        if name not in (None, "jacobi", "ilu", "user"):
            raise InputError(f"{backend}: preconditioner {pre!r} is not available (jacobi, ilu, None or a callable)")
        self.preconditioner = name
        self._ilu = ILU0Pattern(A) if name == "ilu" else None
        self.restart = int(options.get("restart") or DEFAULT_RESTART)
        #: per-call options set by the core (rtol, atol, maxiter, check_every, callback)
        self._pres: list[Any] | None = None
        self._finite: list[bool] = []

    # Numeric phase ------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """Point the descriptors at the values and build the preconditioner per member."""
        self._pres = None
        self.matrix.set_values(values)
        vals = self.matrix.values
        self._finite = [bool(f) for f in torch.isfinite(vals).all(dim=-1).tolist()]
        pres: list[Any] = []
        name = self.preconditioner
        if name == "jacobi":
            rows, cols = self.matrix.coordinates()
            diags = diagonal(rows, cols, vals, self.n)
        ilu_data = self._ilu.csr_values(values) if self._ilu is not None else None
        with on_torch_stream(self.device):
            for i in range(vals.shape[0]):
                if name is None or not self._finite[i]:
                    pres.append(None)  # NaN in A is reported by solve (NOT_FINITE)
                elif name == "jacobi":
                    pres.append(Jacobi(diags[i], i, self.backend))
                elif name == "ilu":
                    pres.append(self._ilu.factor(ilu_data[i], i, self.backend))
                else:
                    pres.append(UserPreconditioner(self._pre_fn, self.n))
        self._pres = pres

    # Solve ----------------------------------------------------------------------------------------
    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        if self._pres is None:
            raise RuntimeError(f"{self.backend}/{self.method}: solve() before set_values()")
        o = {**self._options, **{k: v for k, v in (options or {}).items() if k == "callback" or v is not None}}
        n = self.n
        Bc = B.detach()
        if Bc.is_conj():
            Bc = Bc.resolve_conj()
        Bc = Bc.reshape(-1, n, B.shape[-1])
        members = len(self._pres)
        if members not in (1, Bc.shape[0]):
            raise InputError(f"{self.backend}/{self.method}: B has {Bc.shape[0]} batch members for {members} matrices")
        X = torch.empty_like(Bc)
        outcomes: list[Outcome] = []
        with on_torch_stream(self.device) as stream:
            for i in range(Bc.shape[0]):
                mem = i if members > 1 else 0
                for j in range(Bc.shape[2]):
                    b = to_cupy(Bc[i, :, j].contiguous())
                    x, out = self._solve_system(mem, b, adjoint, o, stream)
                    X[i, :, j] = to_torch(x)
                    outcomes.append(out)
        label = f"cupyx {self.method}" + (f" + {self.preconditioner}" if self.preconditioner else "")
        return X.reshape(B.shape), combine(outcomes, label)

    def _solve_system(self, member: int, b: Any, adjoint: bool, o: Mapping[str, Any], stream: int) -> tuple[Any, Outcome]:
        cp = cupy()
        import cupyx.scipy.sparse.linalg as cla  # noqa: PLC0415

        n, method = self.n, self.method
        dtype = numpy_dtype(self.matrix.dtype)
        rtol, atol = float(o.get("rtol", 1e-6)), float(o.get("atol", 0.0))
        bnorm, thr, done = trivial_system(b, self._finite[member], rtol, atol, xp=cp, dtype=dtype)
        if done is not None:
            return done
        mv = self.matrix.cupy_matvec(adjoint=adjoint, member=member, stream=stream)
        products = [0]
        check_curvature = method == "cg"
        # CG's curvatures v^H A v, one cuBLAS dot per product written into a device buffer (no
        # synchronization), checked once per cupyx call. cupyx's first product is A x0 (x0 = 0).
        curv = _Curvatures(dtype) if check_curvature else None

        def counted(v: Any) -> Any:
            products[0] += 1
            y = mv(v)
            if curv is not None:
                curv.add(v.reshape(-1), y)
            return y

        pre = self._pres[member]
        M = pre.operator(adjoint, dtype) if pre is not None else None
        op = linear_operator(n, dtype, counted)
        realify = method == "minres" and dtype.kind == "c"
        if realify:  # cupyx MINRES is real: solve the equivalent real symmetric system of size 2n
            op, M = _realified(op, dtype), (None if M is None else _realified(M, dtype))
        fn = getattr(cla, method)
        tol_key = "rtol" if "rtol" in inspect.signature(fn).parameters else "tol"
        maxiter = o.get("maxiter")
        restart = [min(self.restart, n)]  # halved after a GMRES breakdown
        budget = None if maxiter is None else int(maxiter) * (restart[0] if method == "gmres" else 1)
        user_cb, every = o.get("callback"), max(1, int(o.get("check_every") or 1))
        history: list[float] = []
        shifted_start = [False]  # CGS after a breakdown: restart from a generic x0
        refreshes = _REFRESHES_MINRES if method in ("minres", "cgs") else _REFRESHES
        if method == "gmres":
            refreshes += restart[0].bit_length()  # room for halving the restart after breakdowns

        def run(x: Any, *, tol: float, remaining: int | None, iterations: int, attempt: int, residual: float) -> Run:
            # the correction equation A d = r = b - A x, solved to the threshold tol
            r = b - mv(x) if attempt else b
            count = [0]

            def callback(arg: Any, _offset=iterations) -> None:
                count[0] += 1
                it = _offset + count[0]
                if user_cb is not None and it % every == 0 and method != "gmres":
                    xi = arg[:n] + 1j * arg[n:] if realify else arg
                    rel = float(cp.linalg.norm(b - mv(x + xi))) / bnorm
                    history.append(rel)
                    user_cb(it, rel)

            kw: dict[str, Any] = {tol_key: 0.0 if method != "minres" else tol / max(float(cp.linalg.norm(r)), 1e-300),
                                  "M": M, "callback": callback}
            if method != "minres":
                kw["atol"] = tol
            if method == "gmres":
                kw.update(restart=restart[0], callback_type="x")
            if remaining is not None:
                kw["maxiter"] = remaining
            if shifted_start[0]:
                kw["x0"] = _generic_start(cp, mv, r, n, dtype, member)
            before = products[0]
            if curv is not None:
                curv.skip_next()
            rhs = to_real(r, cp) if realify else r
            try:
                d, info = fn(op, rhs, **kw)
                failed = not bool(cp.isfinite(d).all())
            except np.linalg.LinAlgError:  # cupyx GMRES: NaN in its Hessenberg matrix
                d, info, failed = None, 0, True
            if method == "gmres":
                cycles = max(0, (products[0] - before - 1) // (restart[0] + 1))
                its = cycles * restart[0] if not failed else max(0, products[0] - before - 1)
            else:
                its = count[0]
            total = iterations + its
            if curv is not None and curv.any_nonpositive():
                reason = (f"CG met a direction with v^H A v <= 0 within {total} iterations: A is not positive definite "
                          f"(use minres for symmetric indefinite, gmres otherwise)")
                return Run(x if failed else x + (from_real(d) if realify else d).reshape(-1), its,
                           stop=Status.INDEFINITE, reason=reason)
            if failed and method == "gmres" and restart[0] > 1 and self._finite[member]:
                # cupyx's Arnoldi divides by H[j+1, j] without a test: a Krylov space smaller than the
                # restart length (an "happy" breakdown) gives NaN. A shorter restart avoids it.
                restart[0] = max(1, restart[0] // 2)
                return Run(x, its, retry=True)
            if failed and method == "cgs" and not shifted_start[0] and self._finite[member]:
                # cupyx's CGS takes the shadow residual equal to the first residual: for a sparse
                # right-hand side (a unit vector: B = I, jacrev's cotangents) the recurrence can meet
                # r_shadow^H r_i = 0 and divide by it. Starting from a generic x0 makes the first
                # residual (and so the shadow) generic.
                shifted_start[0] = True
                return Run(x, its, retry=True)
            if failed:
                return Run(x, its, stop=Status.BREAKDOWN if self._finite[member] else Status.NOT_FINITE,
                           reason=f"{method} produced NaN or Inf after {total} iterations (a breakdown of its recurrence)")
            # the budget spent reads as cupyx's own limit (info > 0); cupyx's other codes are not used
            spent = info > 0 or (remaining is not None and its >= remaining)
            return Run(x + (from_real(d) if realify else d).reshape(-1), its, info=1 if spent else 0)

        x, total, res, status, reason = true_residual_solve(
            run, lambda x: float(cp.linalg.norm(b - mv(x))), method=method, x=cp.zeros(n, dtype=dtype), bnorm=bnorm,
            thr=thr, budget=budget, refreshes=refreshes, res=bnorm,
            maxiter_reason=lambda rel: self._maxiter_reason(maxiter, rel, rtol, atol),
            tighten=lambda tol, res: thr * 0.1,  # the correction's threshold: what is still missing, with a margin
            exhausted_hint="loosen rtol/atol or use a direct method",
            # CGS stagnates erratically; without a user maxiter, restart it from the current x
            # (the true residual) while it still makes progress
            stall_restarts=method == "cgs", no_progress=True)
        return x, Outcome(total, res / bnorm, status, reason, history, products[0])

    def _maxiter_reason(self, maxiter: Any, rel: float, rtol: float, atol: float) -> str:
        unit = " restart cycles" if self.method == "gmres" else ""
        return maxiter_reason(self.method, maxiter, rel, rtol, atol, default="cupyx default", unit=unit)

    def __repr__(self) -> str:
        return f"KrylovPlan({self.method}, preconditioner={self.preconditioner}, n={self.n})"


class _Curvatures:
    """``v^H A v`` of every product CG makes, kept on the device until checked."""

    def __init__(self, dtype: Any) -> None:
        cp = cupy()
        self._cp, self._buf, self._k, self._skip = cp, cp.empty(256, dtype=dtype), 0, False
        try:
            from cupy import cublas  # noqa: PLC0415

            self._dotc = cublas.dotc
        except ImportError:  # pragma: no cover - every CuPy >= 9 has it
            self._dotc = None

    def skip_next(self) -> None:
        self._skip = True

    def add(self, v: Any, y: Any) -> None:
        if self._skip:
            self._skip = False
            return
        if self._k == self._buf.size:
            self._buf = self._cp.concatenate([self._buf, self._cp.empty_like(self._buf)])
        slot = self._buf[self._k]
        if self._dotc is not None:
            try:
                self._dotc(v, y, out=slot)
            except (TypeError, ValueError):  # a CuPy whose dotc takes no 0-d view as out: plain vdot
                self._dotc = None
        if self._dotc is None:
            slot[...] = self._cp.vdot(v, y)
        self._k += 1

    def any_nonpositive(self) -> bool:
        """Whether some curvature was <= 0 (one synchronization); clears the record."""
        k, self._k = self._k, 0
        return k > 0 and bool((self._buf[:k].real <= 0).any())


def _realified(op: Any, dtype: Any) -> Any:
    """The real 2n x 2n operator [Re A, -Im A; Im A, Re A] of a complex n x n one."""
    cp = cupy()
    n = op.shape[0]
    real = cp.dtype(dtype).char.lower()
    return linear_operator(2 * n, real, realified_matvec(op.matvec, n, cp, real=real))


def _generic_start(cp: Any, mv: Any, r: Any, n: int, dtype: Any, member: int) -> Any:
    """A deterministic pseudo-random x0 scaled so that ``||A x0|| = ||r||`` (CGS restarts)."""
    rs = cp.random.RandomState(seed=1234 + member)
    v = rs.standard_normal(n).astype(dtype.type(0).real.dtype)
    v = v.astype(dtype)
    av = float(cp.linalg.norm(mv(v)))
    scale = float(cp.linalg.norm(r)) / av if av > 0 else 1.0
    return v * scale
