"""Method ``"lu"``: SuperLU (``scipy.sparse.linalg.splu``), one factorization per value set.

Phases (docs/backend-authors.md, "Plans"):

- ``__init__`` (pattern): the SciPy hand-off of A's buffers (int32 indices, narrowed once when
  A's are int64), and the ordering choice. A structurally symmetric pattern gets SuperLU's
  symmetric mode: minimum degree on ``A^T + A`` and a diagonal pivot threshold of 0.1 (about
  half the fill of COLAMD on 2-D Poisson and 3-4x faster in 3-D, measured; still threshold
  pivoting, so non-SPD matrices on such a pattern stay stable), confirmed by the plan's first
  values: a diagonal that fails the threshold against its rows or columns in more than 5 % of
  them (convection-dominated transport) would send the pivots off it and the fill up (28.8 s
  against 0.58 s with COLAMD on a 3-D convection-diffusion of 8000 unknowns), so the plan switches
  to COLAMD. Other patterns get COLAMD with partial pivoting. ``backend_options`` override: ``permc_spec``, ``diag_pivot_thresh``,
  ``symmetric_mode``, and SuperLU's ``panel_size`` / ``relax`` (SuperLU's defaults unless
  given; a small panel, 2-4, factors 2-D grids 15-25 % faster but 3-D ones up to 40 % slower,
  measured).
- Ordering reuse (symmetric mode): SciPy does not expose SuperLU's symbolic phase on its own,
  so the ordering is taken from the first factorization (SuperLU's column permutation,
  elimination-tree postorder included, depends on the pattern only) and every later
  factorization factors the symmetrically permuted matrix ``P A P^T`` with the natural
  ordering: the same pivots and fill, without recomputing the minimum degree ordering on
  ``A^T + A`` (2-D Poisson 62²: 4.5 -> 3.9 ms per factorization, 256²: 189 -> 146 ms; 3-D 24³:
  292 -> 252 ms; measured). The permuted data is one gather per value set.
  ``backend_options={"reuse_ordering": False}`` turns this off.
- ``set_values`` (numeric): one ``splu`` per value-batch member. A CSR matrix is factored as the
  CSC matrix ``A^T`` its buffers already are (no conversion, no copy); solves then use
  SuperLU's transposed solve.
- ``solve``: all right-hand sides of a member in one SuperLU call, and the adjoint
  ``A^H X = B`` from the same factors (``trans="H"``/``"T"``, or the conjugate trick for a
  factored ``A^T``).

A zero pivot (SuperLU's "Factor is exactly singular") raises
:class:`sparsetorch.SingularMatrixError` from ``set_values``; a pivot below ``n * eps * max|A|``
raises it from the first solve that it spoils (a solution larger than ``||b|| / (n eps max|A|)``
or non-finite: U's diagonal is then read and checked), or from ``set_values`` with
``backend_options={"check_pivots": True}``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import numpy as np
import torch

from sparsetorch import BackendError, InputError, IterationResult, SingularMatrixError, SparseTensor, Status
from sparsetorch.backend import SYMMETRIC_MODE_WEAK_MAX, weak_diagonal_fraction

from ._convert import Handoff, numpy_view

__all__ = ["SuperLUPlan", "ordering_options"]

_PERMC = ("NATURAL", "MMD_ATA", "MMD_AT_PLUS_A", "COLAMD")


def ordering_options(symmetric_pattern: bool, backend_options: Mapping[str, Any]) -> dict[str, Any]:
    """``splu`` keyword arguments: symmetric mode for symmetric patterns, COLAMD otherwise."""
    permc = backend_options.get("permc_spec") or ("MMD_AT_PLUS_A" if symmetric_pattern else "COLAMD")
    if permc not in _PERMC:
        raise InputError(f"backend_options permc_spec={permc!r} is not a SuperLU ordering; use one of {_PERMC}")
    thresh = backend_options.get("diag_pivot_thresh")
    thresh = (0.1 if symmetric_pattern else 1.0) if thresh is None else float(thresh)
    if not 0.0 <= thresh <= 1.0:
        raise InputError(f"backend_options diag_pivot_thresh={thresh} must be in [0, 1]")
    sym = backend_options.get("symmetric_mode")
    sym = symmetric_pattern if sym is None else bool(sym)
    out = {"permc_spec": permc, "diag_pivot_thresh": thresh, "options": {"SymmetricMode": sym}}
    for key in ("panel_size", "relax"):  # SuperLU's tuning knobs, passed through when given
        value = backend_options.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"backend_options {key}={value!r} must be a positive int (SuperLU's {key})")
            out[key] = value
    return out


class SuperLUPlan:
    """Sparse LU (SuperLU) of a value-batched matrix on a fixed pattern; CPU."""

    method = "lu"
    preconditioner = None

    def __init__(self, A: SparseTensor, options: Mapping[str, Any], *, backend: str = "scipy") -> None:
        self.backend = backend
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/lu needs a square matrix, got {m}x{n}")
        self.n = int(n)
        self._h = Handoff(A, int32=True)
        self.symmetric_pattern = self._h.structurally_symmetric()
        # Symmetric mode (pivots from the diagonal, ordering on A^T + A) needs a diagonal to pivot
        # on: with structural zeros there (KKT / saddle-point systems, graphs) it pivots off the
        # diagonal and the fill explodes (hangGlider_2: 137 ms and 13x the factor entries of
        # COLAMD's 6.6 ms); such patterns get COLAMD and partial pivoting
        sym_mode = self.symmetric_pattern and self._h.full_diagonal()
        bo0 = options.get("backend_options") or {}
        self.splu_options = ordering_options(sym_mode, bo0)
        #: symmetric mode chosen from the pattern alone: the first values confirm it or switch the
        #: plan to COLAMD with partial pivoting (a weak diagonal; :meth:`_confirm_mode`)
        self._mode_open = bool(sym_mode) and not any(k in bo0 for k in ("permc_spec", "diag_pivot_thresh", "symmetric_mode"))
        self._bo = bo0
        #: numeric factorizations run so far (one per value-batch member per set_values)
        self.factorizations = 0
        self._lus: list[Any] | None = None
        self._transposed = self._h.kind == "csr"  # factors hold A^T (CSR buffers read as CSC)
        #: check U's diagonal right after factoring (backend_options check_pivots=True); by default
        #: it is checked only when a solve amplifies b by more than 1 / (n eps) (reading U costs a
        #: copy of it: 6-40 % of the factorization time on 2-D Poisson 512²)
        self.eager_pivot_check = bool((options.get("backend_options") or {}).get("check_pivots", False))
        bo = options.get("backend_options") or {}
        #: reuse the first factorization's ordering (symmetric mode only; see the module docstring)
        self.reuse_ordering = (bool(bo.get("reuse_ordering", True)) and self.splu_options["options"]["SymmetricMode"]
                               and self.splu_options["permc_spec"] != "NATURAL")
        self._ordering: _Ordering | None = None

    def _confirm_mode(self, data: np.ndarray) -> None:
        """On the first values of a plan in symmetric mode (chosen from the pattern): where more than
        ``SYMMETRIC_MODE_WEAK_MAX`` of the diagonal fails the pivot threshold against its row or column
        (convection-dominated transport), SuperLU would pivot off the diagonal and the fill its
        symmetric ordering planned for explodes (3-D convection-diffusion, 8000 unknowns: 28.8 s
        against 0.58 s with COLAMD): COLAMD with partial pivoting for this plan, decided once."""
        self._mode_open = False
        thr = self.splu_options["diag_pivot_thresh"]
        weak = max(weak_diagonal_fraction(self._h.indptr, self._h.indices, d, self.n, thr) for d in data)
        if weak > SYMMETRIC_MODE_WEAK_MAX:
            self.splu_options = ordering_options(False, self._bo)
            self.reuse_ordering = False
            self._ordering = None
            self.weak_diagonal = weak

    def set_values(self, values: torch.Tensor) -> None:
        """Factor every value-batch member (the previous factors are dropped first)."""
        from scipy.sparse.linalg import splu

        self._lus = None
        data = self._h.values(values)
        if self._mode_open:
            self._confirm_mode(data)
        self._checked: list[bool] = []
        lus = []
        for member, d in enumerate(data):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # SparseEfficiencyWarning cannot happen: mat is CSC
                    if self._ordering is not None:
                        lu = self._ordering.factor(d, self.splu_options)
                    else:
                        mat, _ = self._h.csc(d)
                        lu = splu(mat, **self.splu_options)
                        if self.reuse_ordering:
                            self._ordering = _Ordering(self._h, lu.perm_c)
            except RuntimeError as exc:
                if "singular" in str(exc).lower():
                    raise SingularMatrixError(
                        f"{self.backend}/lu: SuperLU found an exactly zero pivot{_where(member, data.shape[0])}: the "
                        f"matrix is singular (a zero row or column, or dependent rows); check the system (boundary "
                        f"conditions, a missing diagonal) or use a least-squares method"
                    ) from exc
                raise BackendError(f"{self.backend}/lu: splu failed{_where(member, data.shape[0])}: {exc}") from exc
            self.factorizations += 1
            if self.eager_pivot_check:
                self._check_pivots(lu, d, member, data.shape[0])
            lus.append(lu)
        self._lus = lus
        self._scales = [float(np.abs(d).max()) if d.size else 0.0 for d in data]
        self._checked = [self.eager_pivot_check] * len(lus)
        self._data = data

    def _check_pivots(self, lu: Any, data: np.ndarray, member: int, members: int) -> None:
        if self.n == 0:
            return
        diag = np.abs(lu.U.diagonal())
        scale = float(np.abs(data).max()) if data.size else 0.0
        # only an exactly zero (or non-finite) pivot is called singular: a pivot that is merely small
        # relative to max |A| is what a badly scaled, nonsingular matrix gives (rows in other units);
        # such answers are judged by the core's residual and backward-error check, which refines
        # them or hands over to another method (autograd/fallback.py)
        small = np.flatnonzero((diag == 0) | ~np.isfinite(diag)) if scale > 0 else np.arange(self.n)
        if small.size:
            k = int(small[0])
            # Pivot k sits in column perm_c^-1 ... of the factored matrix: column perm_c == k.
            col = int(np.flatnonzero(lu.perm_c == k)[0]) if lu.perm_c.size else k
            what = "row" if self._transposed else "column"
            raise SingularMatrixError(
                f"{self.backend}/lu: the matrix is singular to working precision{_where(member, members)}: pivot {k} "
                f"(at {what} {col} of A) is {diag[k]:.3g} (max |A| = {scale:.3g}); check the "
                f"system (a zero row, missing boundary conditions) or use a least-squares method",
                row=col,
            )

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``) from the kept factors."""
        if self._lus is None:
            raise RuntimeError(f"{self.backend}/lu: solve() before set_values()")
        n = self.n
        Bn = numpy_view(B).reshape(-1, n, B.shape[-1])
        lus = self._lus
        if len(lus) not in (1, Bn.shape[0]):
            raise InputError(f"{self.backend}/lu: B has {Bn.shape[0]} batch members for {len(lus)} matrices; "
                             f"B must be (*batch, n, k) with A's value batch")
        X = np.empty(Bn.shape, dtype=Bn.dtype)
        for i in range(Bn.shape[0]):
            j = i if len(lus) > 1 else 0
            X[i] = self._solve_one(lus[j], Bn[i], adjoint)
            if not self._checked[j] and self._suspicious(X[i], Bn[i], j):
                self._check_pivots(lus[j], self._data[j], j, len(lus))  # raises SingularMatrixError
                self._checked[j] = True
        kind = "adjoint " if adjoint else ""
        note = f"SuperLU {kind}solve ({self.splu_options['permc_spec']}, {len(lus)} factorization(s) kept)"
        return torch.from_numpy(X).reshape(B.shape), IterationResult(0, math.nan, True, Status.DIRECT, note)

    def _suspicious(self, x: np.ndarray, b: np.ndarray, member: int) -> bool:
        """Whether ``x`` is non-finite or larger than a well-posed solve can give: ||x|| max|A| beyond
        ||b|| / (n eps), the amplification of a pivot below n * eps * max|A|."""
        if not np.isfinite(x).all():
            return bool(np.isfinite(b).all() and np.isfinite(self._scales[member]))
        eps = np.finfo(x.dtype).eps
        bmax = float(np.abs(b).max()) if b.size else 0.0
        return float(np.abs(x).max(initial=0.0)) * self._scales[member] * self.n * eps > bmax > 0

    def _solve_one(self, lu: Any, b: np.ndarray, adjoint: bool) -> np.ndarray:
        complex_ = np.iscomplexobj(b)
        if not self._transposed:  # factors of A
            return lu.solve(b, trans=("H" if complex_ else "T") if adjoint else "N")
        # factors of F = A^T:  A x = b  <=>  F^T x = b;   A^H x = b  <=>  conj(F) x = b  <=>  F conj(x) = conj(b)
        if not adjoint:
            return lu.solve(b, trans="T")
        if complex_:
            return np.conj(lu.solve(np.conj(b), trans="N"))
        return lu.solve(b, trans="N")

    def factor_nnz(self) -> int:
        """Stored entries of L + U over the value batch (what the fill-in model estimates)."""
        return sum(int(lu.L.nnz + lu.U.nnz) for lu in (self._lus or ()))

    def __repr__(self) -> str:
        state = f"{len(self._lus)} factorization(s)" if self._lus is not None else "no values yet"
        return f"SuperLUPlan(n={self.n}, {self.splu_options['permc_spec']}, {state})"


class _Ordering:
    """A symmetric fill-reducing ordering kept from one factorization, for the next ones.

    With ``q = argsort(perm_c)`` the permuted matrix is ``B = P F P^T``, ``B[i, j] = F[q[i], q[j]]``
    (``F`` the factored CSC matrix: ``A``, or ``A^T`` for CSR buffers). Its CSC pattern and the
    gather from ``F``'s data to ``B``'s are pattern work, done here once. SuperLU factors ``B``
    with the natural ordering (symmetric mode, the caller's pivot threshold): the pivots and fill
    of the original ordering, without recomputing it."""

    def __init__(self, h: Handoff, perm_c: np.ndarray) -> None:
        import scipy.sparse as sp

        n = h.shape[0]
        self.q = np.argsort(perm_c).astype(np.intp)
        ids = np.arange(1, h.nnz + 1, dtype=np.int64)  # 1-based: no slot is an explicit zero
        F, _ = h.csc(ids)
        B = sp.csc_array(F[self.q][:, self.q])
        B.sort_indices()
        if B.nnz != h.nnz:  # cannot happen for a permutation; guard the gather anyway
            raise BackendError(f"SuperLU ordering reuse: the permuted pattern has {B.nnz} entries, expected {h.nnz}")
        self.gather = (B.data - 1).astype(np.intp)
        self.indptr = B.indptr.astype(np.int32)
        self.indices = B.indices.astype(np.int32)
        self.n = n

    def factor(self, data: np.ndarray, splu_options: Mapping[str, Any]) -> "_PermutedLU":
        import scipy.sparse as sp
        from scipy.sparse.linalg import splu

        B = sp.csc_array((data[self.gather], self.indices, self.indptr), shape=(self.n, self.n), copy=False)
        B.has_canonical_format = True
        opts = dict(splu_options)
        opts["permc_spec"] = "NATURAL"
        return _PermutedLU(splu(B, **opts), self.q)


class _PermutedLU:
    """SuperLU factors of ``B = P F P^T``, answering for ``F``: ``F x = b`` iff ``B (P x) = P b``
    (and the same for ``F^T``, ``F^H``: P is a real permutation)."""

    def __init__(self, lu: Any, q: np.ndarray) -> None:
        self._lu = lu
        self._q = q

    # SuperLU builds L and U as new SciPy arrays on every access: read them only when asked.
    @property
    def L(self) -> Any:
        return self._lu.L

    @property
    def U(self) -> Any:
        return self._lu.U

    @property
    def perm_r(self) -> np.ndarray:
        return self._lu.perm_r

    @property
    def perm_c(self) -> np.ndarray:
        """The column permutation over F's columns (B's column j is F's column q[j])."""
        out = np.empty_like(self._lu.perm_c)
        out[self._q] = self._lu.perm_c
        return out

    def solve(self, b: np.ndarray, trans: str = "N") -> np.ndarray:
        y = self._lu.solve(np.ascontiguousarray(b[self._q]), trans=trans)
        x = np.empty_like(y)
        x[self._q] = y
        return x


def _where(member: int, members: int) -> str:
    return f" (value-batch member {member})" if members > 1 else ""
