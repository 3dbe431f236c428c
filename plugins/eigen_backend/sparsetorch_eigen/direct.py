"""Direct plans: Eigen's SimplicialLLT ("cholesky"), SimplicialLDLT ("ldlt"), SparseLU ("lu") and
SparseQR ("qr"), for the ops ``solve``, ``logdet`` and ``lstsq``.

Phases: ``__init__`` hands the pattern over (zero-copy maps; int64 indices narrowed once) and
runs Eigen's ``analyzePattern`` (fill-reducing ordering, elimination tree, symbolic structure)
once per value-batch member; ``set_values`` runs ``factorize`` only, on the new values, read in
place. Solves reuse the factors for any number of right-hand sides, and the adjoint solve of the
backward pass comes from the same factors:

- Cholesky / LDL^T (Hermitian A): ``A^H = A``, the same solve.
- LU: SparseLU's ``adjoint().solve()`` on CSC input; CSR buffers are the CSC of ``A^T``, so there
  the factors are of ``F = A^T``: ``A x = b`` is SparseLU's ``transpose().solve()`` and
  ``A^H x = b`` is ``F conj(x) = conj(b)`` (a plain solve).
- QR: ``A P = Q R``; forward ``x = P R^-1 Q^H b``, adjoint ``x = Q R^-H P^T b``; rank-deficient or
  wide A get the minimum-norm solution through a second QR of ``R[:r, :]^H`` (both directions).

Numeric failures become the library's errors in ``set_values`` (solve and lstsq) with the
failing condition: a zero pivot (SingularMatrixError), a non-positive Cholesky pivot
(IndefiniteMatrixError), a pivot below ``n eps max|A|`` (SingularMatrixError, "to working
precision"). A logdet plan never raises for a singular matrix: its slogdet is ``(0, -inf)``, and
only a solve on it raises. Complex values given to Cholesky / LDL^T (which read one triangle and take
the other as its conjugate transpose) are checked to be Hermitian before they are factored: a
complex symmetric A, or an ``spd`` / ``hermitian`` tag its values contradict, raises
NotSymmetricError naming ``method='lu'`` (it gave a wrong determinant, gradient and solution).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from sparsetorch import (BackendError, IndefiniteMatrixError, InputError, IterationResult, NotSymmetricError,
                         SingularMatrixError, SparseTensor, Status)
from sparsetorch.backend import SYMMETRIC_MODE_WEAK_MAX, weak_diagonal_fraction

from . import _lib
from ._handoff import Handoff, TransposeMap, full_diagonal, plain, structurally_symmetric

__all__ = ["DirectPlan", "DIRECT_METHODS", "lu_settings"]

DIRECT_METHODS = ("cholesky", "ldlt", "lu", "qr")
_NAMES = {"cholesky": "SimplicialLLT", "ldlt": "SimplicialLDLT", "lu": "SparseLU", "qr": "SparseQR"}
_ORDERINGS = ("colamd", "amd", "natural")  # amd: on A^T + A


def lu_settings(symmetric_pattern: bool, bo: Mapping[str, Any]) -> tuple[str, float, bool]:
    """(ordering, diagonal pivot threshold, symmetric mode) of SparseLU.

    A structurally symmetric pattern with its whole diagonal stored gets AMD on ``A^T + A`` with
    SparseLU's symmetric mode and a
    diagonal pivot threshold of 0.1 (as SuperLU's symmetric mode); others COLAMD with partial
    pivoting (threshold 1). ``backend_options`` ``ordering``, ``pivot_threshold`` and
    ``symmetric_mode`` override. Without them the plan's first values confirm the symmetric mode
    or switch it to COLAMD (a diagonal weak against its rows or columns: ``DirectPlan._confirm_mode``)."""
    ordering = bo.get("ordering") or ("amd" if symmetric_pattern else "colamd")
    if ordering not in _ORDERINGS:
        raise InputError(f"backend_options ordering={ordering!r} is not one of {_ORDERINGS}")
    thr = bo.get("pivot_threshold")
    thr = (0.1 if symmetric_pattern else 1.0) if thr is None else float(thr)
    if not 0.0 <= thr <= 1.0:
        raise InputError(f"backend_options pivot_threshold={thr} must be in [0, 1]")
    sym = bo.get("symmetric_mode")
    sym = symmetric_pattern if sym is None else bool(sym)
    return ordering, thr, sym


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.empty((), dtype=dtype).real.dtype


def _where(member: int, members: int) -> str:
    return f" (value-batch member {member})" if members > 1 else ""


class DirectPlan:
    """One Eigen factorization per value-batch member, on a pattern analysed once."""

    preconditioner = None

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], *, backend: str = "eigen",
                 op: str = "solve", properties: frozenset[str] | None = None) -> None:
        if method not in DIRECT_METHODS:
            raise InputError(f"{backend}: unknown direct method {method!r}; known: {DIRECT_METHODS}")
        self.backend, self.method, self.op = backend, method, op
        m, n = A.format_shape
        if method != "qr" and m != n:
            raise InputError(f"{backend}/{method} needs a square matrix, got {m}x{n}")
        if op != "lstsq" and m != n:
            raise InputError(f"{backend}/{method} ({op}) needs a square matrix, got {m}x{n}")
        #: a wide A (least squares, m < n) is factored as A^H, tall: SparseQR of the wide A itself and of its
        #: R's transpose took 10 s at 50 x 20000 (a QR of A^H, 0.05 s); its solves swap directions
        self.wide = method == "qr" and op == "lstsq" and m < n
        if self.wide:
            A, m, n = A.T, n, m
        self.m, self.n = int(m), int(n)
        self.dtype = A.dtype
        self._h = Handoff(A, int32=True, backend=backend)
        bo = dict(options.get("backend_options") or {})
        self.symmetric_pattern = structurally_symmetric(self._h) if method == "lu" else None
        # the symmetric ordering and mode pivot on the diagonal: with structural zeros there
        # (saddle-point / KKT systems, graphs without self-loops) the pivots leave it and the fill
        # explodes (hangGlider_2: 39 ms against 15 ms for SuperLU with COLAMD): such patterns get
        # COLAMD and partial pivoting, as the scipy backend does
        sym_settings = bool(self.symmetric_pattern) and full_diagonal(self._h)
        ordering, thr, sym = lu_settings(sym_settings, bo) if method == "lu" else ("colamd", -1.0, False)
        qr_thr = bo.get("qr_threshold")
        self.settings = {"ordering": ordering, "pivot_threshold": thr, "symmetric_mode": sym,
                         "qr_threshold": None if qr_thr is None else float(qr_thr)}
        #: check pivots against n eps max|A| after each factorization (solve plans; off for logdet)
        self.pivot_check = bool(bo.get("check_pivots", op != "logdet"))
        #: symmetric mode chosen from the pattern alone (no backend_options said so): the first values
        #: confirm it, or switch the plan to COLAMD with partial pivoting (a weak diagonal; set_values)
        self._mode_open = method == "lu" and sym and not any(k in bo for k in ("ordering", "pivot_threshold", "symmetric_mode"))
        #: A's tags as the request had them (named when the values contradict them)
        self.properties = frozenset(properties or ())
        #: complex values of a method that reads one triangle and assumes A^H = A: each value set is
        #: checked to be Hermitian before it is factored (a complex symmetric A, or a tag the values
        #: contradict, gave a wrong determinant and gradient without an error; session 27's sweep)
        self._transpose = TransposeMap(self._h) if method in ("cholesky", "ldlt") and A.dtype.is_complex else None
        self._analyse()
        self._values: torch.Tensor | None = None
        self._failures: list[Exception | None] = []
        #: numeric factorizations run so far (one per value-batch member per set_values)
        self.factorizations = 0

    def _analyse(self) -> None:
        """The Eigen object for these settings, with the pattern analysed (ordering, symbolic structure)."""
        h, st_ = self._h, self.settings
        qr_thr = st_["qr_threshold"]
        self._factor = _lib.Direct(
            self.dtype, self.method, self.m, self.n, h.indptr.data_ptr(), h.indices.data_ptr(), h.nnz, h.csr, h.members,
            st_["ordering"], st_["pivot_threshold"], st_["symmetric_mode"], -1.0 if qr_thr is None else float(qr_thr))

    def _confirm_mode(self, data: torch.Tensor) -> None:
        """On the first values of a plan in symmetric mode (chosen from the pattern): where more than
        ``SYMMETRIC_MODE_WEAK_MAX`` of the diagonal fails the pivot threshold against its row or column
        (convection-dominated transport), the pivots would leave the diagonal and the planned fill
        explode (3-D convection-diffusion, 8000 unknowns: 4.1 s against 0.9 s): the pattern is analysed
        again for COLAMD with partial pivoting, once."""
        self._mode_open = False
        h = self._h
        ip, ix = h.indptr.numpy(), h.indices.numpy()
        weak = max(weak_diagonal_fraction(ip, ix, d.numpy(), self.n, self.settings["pivot_threshold"]) for d in data)
        if weak > SYMMETRIC_MODE_WEAK_MAX:
            self.settings.update(ordering="colamd", pivot_threshold=1.0, symmetric_mode=False,
                                 weak_diagonal=round(weak, 3))
            self._analyse()

    # Numeric phase ---------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """``factorize`` every value-batch member on the analysed pattern (values read in place)."""
        self._values = None
        data = self._h.values(values)
        if self.wide and data.is_complex():
            data = torch.conj_physical(data)  # the values of A^H (A's transpose is a view: the same slots)
        if data.dtype != self.dtype:
            raise InputError(f"{self.backend}/{self.method}: values are {data.dtype}, the plan was built for {self.dtype}")
        if self._transpose is not None:
            self._check_hermitian(data)
        if self._mode_open:
            self._confirm_mode(data)
        _lib.call(self._factor.factorize, data.data_ptr())
        self.factorizations += data.shape[0]
        failures: list[Exception | None] = []
        lib = _lib.lib()
        for i in range(data.shape[0]):
            code, message, where = self._factor.info(i)
            exc: Exception | None = None
            if code == lib.SINGULAR:
                at, row = self._singular_where(data[i], where)
                if self.method == "ldlt" and row is None:
                    # LDL^T without pivoting also meets a zero pivot on a nonsingular symmetric indefinite matrix (a
                    # shifted Laplacian of condition 1e3 was called singular; session 32's sweep): say both
                    why = (f"the matrix is singular ({at}), or symmetric indefinite in an order where LDL^T without "
                           f"pivoting breaks down; method='lu' (partial pivoting) tells the two apart")
                else:
                    why = (f"the matrix is singular ({at}); check the system (boundary conditions, a missing diagonal) "
                           f"or use least squares (lstsq)")
                exc = SingularMatrixError(f"{self.backend}/{self.method}: Eigen's {_NAMES[self.method]} found an exactly "
                                          f"zero pivot{_where(i, data.shape[0])}: {why}", row=row)
            elif code == lib.INDEFINITE:
                exc = IndefiniteMatrixError(
                    f"{self.backend}/cholesky: Eigen's SimplicialLLT met a pivot <= 0{_where(i, data.shape[0])}: the matrix "
                    f"is not positive definite (symmetric positive definite was detected or passed as properties='spd'); "
                    f"use method='ldlt' (symmetric indefinite) or 'lu'")
            elif code != lib.OK:
                exc = BackendError(f"{self.backend}/{self.method}: Eigen's {_NAMES[self.method]} failed"
                                   f"{_where(i, data.shape[0])}: {message}")
            elif self.pivot_check and self.method in ("lu", "ldlt"):
                exc = self._tiny_pivot(i, data[i], data.shape[0])
            elif self.method == "qr" and self.op == "solve" and int(self._factor.rank(i)) < self.n:
                r = int(self._factor.rank(i))
                exc = SingularMatrixError(
                    f"{self.backend}/qr: Eigen's SparseQR found rank {r} < n = {self.n}{_where(i, data.shape[0])}: the "
                    f"matrix is singular to working precision; use lstsq for a least-squares (minimum-norm) solution",
                    row=r)
            if exc is not None and not (self.op == "logdet" and isinstance(exc, SingularMatrixError)):
                raise exc  # a logdet plan keeps singular members: slogdet (0, -inf), solves raise
            failures.append(exc)
        self._failures = failures
        self._values = data

    def _check_hermitian(self, data: torch.Tensor) -> None:
        """Raise :class:`NotSymmetricError` when complex values are not Hermitian (SimplicialLLT and
        SimplicialLDLT would factor another matrix: the triangle they read and its conjugate transpose)."""
        tm = self._transpose
        found = tm.defect(data) if tm is not None else None
        if tm is None or found is None:
            return
        member, slot, complex_symmetric = found
        i, j = int(tm.rows[slot]), int(tm.cols[slot])
        a = complex(data[member, slot])
        b = complex(data[member, tm.slot[slot]]) if bool(tm.found[slot]) else 0j
        what = ("A is complex symmetric (A == A^T), which is not Hermitian for complex values"
                if complex_symmetric else "A is not Hermitian")
        tags = [t for t in ("spd", "hermitian") if t in self.properties]  # spd implies the hermitian tag
        if tags:
            said = (f"; properties={tags[0]!r} says A is Hermitian{' positive definite' if tags[0] == 'spd' else ''}, its "
                    f"values say otherwise")
        elif "symmetric" in self.properties:
            said = "; properties='symmetric' on complex values says A == A^T, not A == A^H"
        else:
            said = ""
        retag = "; tag a complex symmetric A properties='symmetric', not spd / hermitian" if complex_symmetric and tags else ""
        raise NotSymmetricError(
            f"{self.backend}/{self.method}: Eigen's {_NAMES[self.method]} needs a Hermitian matrix (A == A^H: it reads one "
            f"triangle and takes the other as its conjugate transpose) and {what}: A[{i}, {j}] = {a:.6g} but "
            f"conj(A[{j}, {i}]) = {b.conjugate():.6g}{_where(member, data.shape[0])}{said}. Use method='lu' (or pass no "
            f"method){retag}")

    def _zero_line(self, data: torch.Tensor) -> tuple[str, int] | None:
        """The first column of A whose stored values are all zero (or that stores none), else the first such
        row: ``("column" | "row", index)``, A's own 0-based index; None when every row and column has a
        nonzero."""
        h = self._h
        nnz = int(data.shape[-1])
        outer = torch.repeat_interleave(torch.arange(self.n), (h.indptr[1:] - h.indptr[:-1]).to(torch.int64))
        inner = h.indices.to(torch.int64)
        rows, cols = (outer, inner) if h.csr else (inner, outer)
        mag = data.abs().to(torch.float64) if nnz else torch.zeros(0, dtype=torch.float64)
        for kind, lines in (("column", cols), ("row", rows)):
            sums = torch.zeros(self.n, dtype=torch.float64).index_add_(0, lines, mag)
            zero = torch.nonzero(sums == 0)
            if zero.numel():
                return kind, int(zero[0, 0])
        return None

    def _singular_where(self, data: torch.Tensor, where: int | None) -> tuple[str, int | None]:
        """What a zero pivot of SparseLU says about A, as the user indexes it, and the index for
        :attr:`SingularMatrixError.row` (None where none is known). A zero row or column of A is named first
        (the common cause, whatever the factored order). Else Eigen's index (1-based, in the fill-reducing
        column order of the matrix factored, mapped back by the extension to that matrix's 0-based column):
        A's column for CSC buffers, A's row for CSR ones (which are factored as A^T), one that is a combination
        of the columns (rows) eliminated before it. Until session 29 Eigen's raw index was reported ("zero pivot
        at column 1600" for n = 1600, the zero column being 7)."""
        line = self._zero_line(data)
        if line is not None:
            return f"{line[0]} {line[1]} of A is zero", line[1]
        if self.method == "lu" and where is not None and 0 <= where < self.n:
            kind = "row" if self._h.csr else "column"
            return (f"{kind} {where} of A is, to rounding, a combination of the {kind}s eliminated before it in "
                    f"the fill-reducing order"), int(where)
        return "a zero row or column, or dependent rows", None

    def _tiny_pivot(self, member: int, data: torch.Tensor, members: int) -> Exception | None:
        lo, hi, at = self._factor.pivot_range(member)
        if self.n == 0:
            return None
        scale = float(data.abs().max()) if data.numel() else 0.0
        # exactly zero (or non-finite) pivots only: a small pivot relative to max |A| is what badly
        # scaled, nonsingular matrices give; the core's residual check judges those answers
        if lo == 0.0 or not math.isfinite(lo) or scale == 0.0:
            # the extension maps the pivot back to the input's index (Eigen's is in the fill-reducing order):
            # LU, the factored matrix's column (A's row for CSR buffers, factored as A^T); Cholesky / LDL^T, A's
            # row and column
            ok = at is not None and 0 <= int(at) < self.n
            kind = ("row" if self._h.csr else "column") if self.method == "lu" else "row and column"
            which = f"the pivot of A's {kind} {int(at)}" if ok else "a pivot"
            return SingularMatrixError(
                f"{self.backend}/{self.method}: the matrix is singular to working precision{_where(member, members)}: "
                f"{which} of Eigen's {_NAMES[self.method]} is {lo:.3g} (max |A| = {scale:.3g}) "
                f"(largest pivot {hi:.3g}); check the system (a zero row, missing boundary conditions) or use lstsq",
                row=int(at) if ok else None)
        return None

    def _ready(self, member: int) -> None:
        if self._values is None:
            raise RuntimeError(f"{self.backend}/{self.method}: solve() before set_values()")
        exc = self._failures[member] if member < len(self._failures) else None
        if exc is not None:
            raise SingularMatrixError(f"{exc} (no solve on a singular factorization: its determinant is 0)",
                                      row=getattr(exc, "row", None))

    # Solves ------------------------------------------------------------------------------------------
    def _run(self, fn: Any, B: torch.Tensor, rows_in: int, rows_out: int, adjoint: bool) -> torch.Tensor:
        k = B.shape[-1]
        Bt = plain(B.to(self.dtype).reshape(math.prod(B.shape[:-2]), rows_in, k).transpose(-1, -2))  # (members, k, rows) = column-major
        members = self._h.members
        if Bt.shape[0] not in (1, members) and members != 1:
            raise InputError(f"{self.backend}/{self.method}: B has {Bt.shape[0]} batch members for {members} matrices; "
                             f"B must be (*batch, rows, k) with A's value batch")
        X = torch.empty((Bt.shape[0], k, rows_out), dtype=self.dtype)
        for i in range(Bt.shape[0]):
            j = i if members > 1 else 0
            self._ready(j)
            _lib.call(fn, j, Bt[i].data_ptr(), X[i].data_ptr(), k, adjoint)
        return X.transpose(-1, -2).reshape(*B.shape[:-2], rows_out, k)

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``), B ``(*batch, n, k)``."""
        if self.m != self.n:
            raise InputError(f"{self.backend}/{self.method}: solve needs a square matrix, got {self.m}x{self.n}")
        X = self._run(self._factor.solve, B, self.n, self.n, adjoint)
        what = "adjoint solve" if adjoint else "solve"
        return X, IterationResult(0, math.nan, True, Status.DIRECT, f"Eigen {_NAMES[self.method]} {what} from kept factors")

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """Minimum-norm least-squares ``X`` of ``A X = B`` (``A^H X = B`` when ``adjoint``), QR only."""
        if self.method != "qr":
            raise InputError(f"{self.backend}/{self.method}: lstsq needs the qr method")
        damp = float((options or {}).get("damp") or 0.0)
        if damp != 0.0:
            raise InputError(f"{self.backend}/qr: damp={damp} is not supported by the QR plan (it factors A itself); use "
                             f"method='lsqr'")
        if self.wide:  # factored as F = A^H: A's least squares are F's adjoint ones, and the other way round
            adjoint = not adjoint
        rows_in, rows_out = (self.n, self.m) if adjoint else (self.m, self.n)
        X = self._run(self._factor.lstsq, B, rows_in, rows_out, adjoint)
        ranks = [int(self._factor.rank(i)) for i in range(self._h.members)]
        note = f"Eigen SparseQR least squares (rank {min(ranks)} of min(m, n) = {min(self.m, self.n)})"
        return X, IterationResult(0, math.nan, True, Status.DIRECT, note)

    def slogdet(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sign, logabsdet)`` of each value-batch member, from the factors (log space)."""
        if self._values is None:
            raise RuntimeError(f"{self.backend}/{self.method}: slogdet() before set_values()")
        if self.method == "qr":
            raise InputError(f"{self.backend}/qr: no slogdet from a QR factorization; use cholesky, ldlt or lu")
        signs, logs = [], []
        for i in range(self._h.members):
            exc = self._failures[i]
            if isinstance(exc, SingularMatrixError):
                signs.append(0.0)
                logs.append(-math.inf)
                continue
            s, la = self._factor.slogdet(i)
            signs.append(s)
            logs.append(la)
        batch = self._h.batch_shape
        sign = torch.tensor(signs, dtype=self.dtype).reshape(batch)
        logabs = torch.tensor(logs, dtype=_real_dtype(self.dtype)).reshape(batch)
        return sign, logabs

    def factor_nnz(self) -> int:
        """Stored entries of the factors over the value batch."""
        return sum(int(self._factor.factor_nnz(i)) for i in range(self._h.members))

    def __repr__(self) -> str:
        state = "factored" if self._values is not None else "no values yet"
        return f"DirectPlan({_NAMES[self.method]}, {self.m}x{self.n}, {self._h.kind}, {state})"
